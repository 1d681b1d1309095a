//! The normal path of a machine once its gates are open: a machine with a providerID follows its
//! microVM; one without is placed, created exactly once and adopted.

use capmvm_api::conditions::{reasons, types};
use capmvm_api::{
    HostEndpoint, Initialization, MicrovmCluster, ProviderId, VmState as ApiVmState, validation,
};
use kube::ResourceExt;

use super::evacuation::{self, Turn, evacuating_host};
use super::record::{annotated_host, claim_value};
use super::report::{addresses, failure_domain_of, starting_message};
use super::{
    CREDENTIALS_RECHECK, Decision, EVACUATION_TURN_RECHECK, NOT_OBSERVED_RECHECK, PENDING_RECHECK,
    Provenance, bootstrap_secret_name, instance_pool, origin_uid, placement_attempts, provenance,
    provider_id,
};
use crate::cloudinit::{self, CloudInit};
use crate::conditions::Status;
use crate::host_call::spec_rejected_at_this_generation;
use crate::microvm;
use crate::observe::{BootstrapData, HostLookup, ObservedVm, Sensitive, VmState};
use crate::placement::{self, Request};
use crate::plan::{EventKind, HostCall, HostRecord, Requeue, reasons as events};
use crate::preamble::Waiting;

impl Decision<'_> {
    // --- the machine has a providerID: observe its microVM ---

    pub(super) fn observe_existing(&mut self, infra: &MicrovmCluster) -> Requeue {
        let Some(pid) = provider_id(self.machine) else {
            let raw = self.machine.spec.provider_id.clone().unwrap_or_default();
            self.not_ready(
                reasons::INVALID_SPEC,
                format!("spec.providerID {raw:?} is not a microvm:// providerID"),
            );
            return Requeue::Await;
        };
        if self.missing_credentials(&pid.host) {
            return Requeue::After(CREDENTIALS_RECHECK);
        }
        match &self.obs.recorded_host {
            HostLookup::NotAsked => Requeue::After(NOT_OBSERVED_RECHECK),
            HostLookup::Unreachable(why) => {
                self.status.vm_state = Some(ApiVmState::Unknown);
                self.not_ready(
                    reasons::HOST_UNREACHABLE,
                    format!("host {} is unreachable: {why}", pid.host),
                );
                Requeue::Await
            }
            HostLookup::Answered { vms } => {
                let Some(vm) = vms.iter().find(|v| v.uid == pid.uid) else {
                    self.status.vm_state = Some(ApiVmState::Unknown);
                    self.not_ready(
                        reasons::MICROVM_NOT_FOUND,
                        format!(
                            "microVM {} no longer exists on host {}; it is not re-created: delete the Machine to replace it",
                            pid.uid, pid.host
                        ),
                    );
                    return Requeue::Await;
                };
                self.delete_duplicates(&pid.host, vms, Some(&pid.uid));
                self.record_adoption(&pid.host, vm);
                self.follow_state(infra, &pid.host, vm)
            }
        }
    }

    // --- no providerID: place, create exactly once, adopt ---

    pub(super) fn create_or_adopt(
        &mut self,
        infra: &MicrovmCluster,
        cluster_name: &str,
    ) -> Requeue {
        if provenance(self.machine) == Provenance::Unfinished {
            // A change of the machine (a providerID, the finalizer gone) wakes it.
            self.report_unfinished(false);
            return Requeue::Await;
        }
        let Some(machine_uid) = origin_uid(self.machine) else {
            // The API server always sets a uid; without one no microVM could be recognised as ours.
            self.not_ready(
                reasons::INVALID_SPEC,
                "metadata.uid is empty: a microVM is created only for an object the API server stored",
            );
            return Requeue::Await;
        };
        let recorded = annotated_host(self.machine);

        // A microVM already on the recorded host is adopted, whatever else is missing: the bootstrap
        // data matters only for creating one.
        if let Some(host) = &recorded {
            self.status.host = Some(host.to_string());
            if self.missing_credentials(host) {
                return Requeue::After(CREDENTIALS_RECHECK);
            }
            match &self.obs.recorded_host {
                HostLookup::NotAsked => {
                    self.not_ready(
                        reasons::MICROVM_PENDING,
                        format!("waiting to list the microVMs of host {host}"),
                    );
                    return Requeue::After(NOT_OBSERVED_RECHECK);
                }
                HostLookup::Unreachable(why) => {
                    self.not_ready(
                        reasons::HOST_UNREACHABLE,
                        format!(
                            "host {host} is unreachable: {why}; the microVM is created when it answers"
                        ),
                    );
                    return Requeue::Await;
                }
                HostLookup::Answered { vms } => {
                    // Adopt the oldest microVM of ours that is not being deleted: one in DELETING
                    // would pin the providerID to a microVM about to vanish.
                    let mut ours = self.ours(vms);
                    ours.sort_by(|a, b| a.uid.cmp(&b.uid));
                    if let Some(oldest) = ours.iter().find(|v| v.state != VmState::Deleting) {
                        self.plan.provider_id =
                            Some(ProviderId::new(host.clone(), oldest.uid.clone()).to_string());
                        self.delete_duplicates(host, vms, Some(&oldest.uid));
                        return self.follow_state(infra, host, oldest);
                    }
                    if !ours.is_empty() {
                        let uids: Vec<&str> = ours.iter().map(|v| v.uid.as_str()).collect();
                        self.status.vm_state = Some(ApiVmState::Deleting);
                        self.not_ready(
                            reasons::MICROVM_DELETING,
                            format!(
                                "waiting for host {host} to finish deleting microVM {} before creating a new one",
                                uids.join(", ")
                            ),
                        );
                        return Requeue::After(PENDING_RECHECK);
                    }
                    if let Some(message) = self.unknown_microvms(host, vms) {
                        self.not_ready(reasons::UNKNOWN_MICROVM_ON_HOST, message);
                        // Foreign microVMs wake nobody when they go: look again now and then.
                        return Requeue::After(PENDING_RECHECK);
                    }
                }
            }
        }

        // Validation guards creating only: a microVM that already exists was adopted above, whatever
        // the spec says now (an edit after create is reported on MicrovmUpToDate).
        if let Err(errors) = validation::validate_machine(self.machine) {
            self.not_ready(reasons::INVALID_SPEC, errors.to_string());
            return Requeue::Await;
        }
        // The host refused this spec: sending it again cannot succeed. The condition (and its event,
        // published once) stays until the spec's generation changes.
        if spec_rejected_at_this_generation(self.machine) {
            return Requeue::Await;
        }

        let Some(secret) = bootstrap_secret_name(
            self.machine,
            self.obs.owner.as_ref(),
            self.obs.machine_pool.as_ref(),
        ) else {
            let whose = if instance_pool(self.machine).is_some() {
                "the MachinePool has no bootstrap data secret yet (spec.template.spec.bootstrap.dataSecretName)"
            } else {
                "the Machine has no bootstrap data secret yet"
            };
            return self.wait_for_capi(Waiting {
                reason: reasons::WAITING_FOR_BOOTSTRAP_DATA,
                message: whose.to_string(),
            });
        };
        let user_data = match &self.obs.bootstrap {
            BootstrapData::NotAsked => {
                self.not_ready(
                    reasons::WAITING_FOR_BOOTSTRAP_DATA,
                    format!("bootstrap Secret {secret:?} not read yet"),
                );
                return Requeue::After(NOT_OBSERVED_RECHECK);
            }
            BootstrapData::SecretNotFound => {
                return self.wait_for_capi(Waiting {
                    reason: reasons::WAITING_FOR_BOOTSTRAP_DATA,
                    message: format!("bootstrap Secret {secret:?} not found"),
                });
            }
            BootstrapData::Found { value: None, .. } => {
                self.not_ready(
                    reasons::WAITING_FOR_BOOTSTRAP_DATA,
                    format!("bootstrap Secret {secret:?} has no key \"value\""),
                );
                return Requeue::Await;
            }
            BootstrapData::Found {
                format: Some(f), ..
            } if f != "cloud-config" => {
                self.not_ready(
                    reasons::INVALID_BOOTSTRAP_FORMAT,
                    format!(
                        "bootstrap Secret {secret:?} has format {f:?}; flintlock delivers only cloud-config (set the bootstrap provider's format to cloud-config)"
                    ),
                );
                return Requeue::Await;
            }
            BootstrapData::Found { value: Some(v), .. } => v,
        };

        if let Some(host) = recorded {
            // The fresh answer above showed no microVM of ours there; but another process's create
            // may still be on its way.
            if let Some((left, _)) = self.claimed_elsewhere() {
                // Short and transient: not worth a status write (that would also make the other
                // process's providerID write conflict).
                self.quiet = true;
                return Requeue::After(left);
            }
            return self.create(&host, machine_uid, user_data, cluster_name, infra);
        }
        // Nothing was recorded, so nothing was created: choose a host and create right away (the
        // create records the host first).
        let Some(pool) = &infra.spec.placement.static_pool else {
            self.not_ready(
                reasons::NO_ELIGIBLE_HOST,
                "the MicrovmCluster has no placement.staticPool",
            );
            return Requeue::Await;
        };
        let key = format!(
            "{}/{}",
            self.machine.namespace().unwrap_or_default(),
            self.machine.name_any()
        );
        let request = Request {
            machine_key: &key,
            failure_domain: self.failure_domain(),
            control_plane: self.obs.owner.as_ref().is_some_and(|o| o.control_plane),
            host_selector: self.machine.spec.host_selector.as_ref(),
        };
        match placement::choose(pool, &self.obs.hosts, &request) {
            // Waits for a host or a label to be added: the MicrovmCluster's new generation wakes it.
            Err(no_host) if no_host.no_matching_host => {
                self.not_ready(reasons::NO_MATCHING_HOST, no_host.message);
                Requeue::Await
            }
            Err(no_host) if no_host.only_credentials => {
                self.not_ready(reasons::MISSING_CREDENTIALS, no_host.message);
                // No watch fires when a Secret appears: look again soon.
                Requeue::After(CREDENTIALS_RECHECK)
            }
            Err(no_host) => {
                self.not_ready(reasons::NO_ELIGIBLE_HOST, no_host.message);
                Requeue::Await
            }
            Ok(chosen) => self.create(&chosen.host, machine_uid, user_data, cluster_name, infra),
        }
    }

    /// Creates a microVM on `host`. The plan first (re)records the host and origin uid, and counts
    /// one more placement attempt, in one write conditional on the resourceVersion this decision
    /// read, also when host and uid are recorded already: every create is then preceded by a write
    /// that always changes the object and fails on a stale read (one that misses a providerID, or
    /// another writer's attempt), so no decision made from a stale read reaches a host and two
    /// writers deciding from the same version cannot both create.
    pub(super) fn create(
        &mut self,
        host: &HostEndpoint,
        machine_uid: &str,
        user_data: &Sensitive,
        cluster_name: &str,
        infra: &MicrovmCluster,
    ) -> Requeue {
        if self.missing_credentials(host) {
            return Requeue::After(CREDENTIALS_RECHECK);
        }
        // Never the value read, so the write always makes a new resourceVersion (wrapping is
        // academic, but must not land on the same value either).
        let attempt = placement_attempts(self.machine).wrapping_add(1).max(1);
        self.plan.record_host = Some(HostRecord {
            host: host.clone(),
            origin_uid: machine_uid.to_string(),
            attempt,
            claim: claim_value(&self.obs.operator, self.now),
        });
        let keys = if self.machine.spec.ssh_public_keys.is_empty() {
            &infra.spec.ssh_public_keys
        } else {
            &self.machine.spec.ssh_public_keys
        };
        let hostname = self.machine.name_any();
        let vm_host = host.to_string();
        let metadata = match cloudinit::metadata(&CloudInit {
            hostname: &hostname,
            machine_uid,
            cluster_name,
            vm_host: &vm_host,
            ssh_public_keys: keys,
            user_data: user_data.expose(),
        }) {
            Ok(m) => m,
            Err(e) => {
                self.not_ready(
                    reasons::INVALID_SPEC,
                    format!("cannot render cloud-init meta-data: {e}"),
                );
                return Requeue::Await;
            }
        };
        let spec = microvm::build_spec(self.machine, cluster_name, metadata);
        self.ensure_finalizer();
        self.plan.host_calls.push(HostCall::Create {
            host: host.clone(),
            spec: Box::new(spec),
        });
        // Events are published after the host calls succeed, so this one records a done create.
        // A pool's instances are announced by the pool's `InstancesCreated` event and show their
        // host in status: an Event each would be one more write per instance, and a flood of
        // Events when an autoscaler grows a pool.
        if instance_pool(self.machine).is_none() {
            self.event(
                EventKind::Normal,
                events::MICROVM_CREATED,
                "Create",
                format!("created a microVM on host {host}"),
            );
        }
        // The status is written once the created microVM is adopted, right after, together with
        // the providerID's new generation: one status write instead of two.
        self.quiet = true;
        Requeue::Immediately
    }

    /// Follows the state of the machine's microVM into the status.
    pub(super) fn follow_state(
        &mut self,
        infra: &MicrovmCluster,
        host: &HostEndpoint,
        vm: &ObservedVm,
    ) -> Requeue {
        // A machine with a microVM keeps the finalizer (restored if someone removed it).
        self.ensure_finalizer();
        self.compare_running_spec(host, vm);
        self.status.host = Some(host.to_string());
        if self.status.failure_domain.is_none() {
            self.status.failure_domain = failure_domain_of(infra, host);
        }
        self.status.addresses = addresses(self.machine);
        match vm.state {
            VmState::Pending => {
                let grace = self.unreported_youth_left().max(self.start_grace_left());
                if let Some(left) = grace {
                    // A microVM that starts within the settle grace, or soon after its placement,
                    // goes straight to Ready: a pending state is reported only if it lasts.
                    self.quiet = true;
                    return Requeue::After(left);
                }
                self.status.vm_state = Some(ApiVmState::Pending);
                self.not_ready(reasons::MICROVM_PENDING, starting_message(host, vm.retry));
                Requeue::After(PENDING_RECHECK)
            }
            VmState::Created => {
                self.status.vm_state = Some(ApiVmState::Running);
                self.status.initialization = Some(Initialization {
                    provisioned: Some(true),
                });
                // A pool replaces its own instances within its rolling-update limits; any other
                // machine says so on Ready when its turn comes, which CAPI mirrors as the Machine's
                // InfrastructureReady for a MachineHealthCheck to remediate. The microVM runs on.
                let evacuating =
                    evacuating_host(infra, host).filter(|_| instance_pool(self.machine).is_none());
                let Some(name) = evacuating else {
                    self.condition(types::READY, Status::True, reasons::READY, "");
                    return Requeue::Await;
                };
                match evacuation::turn(self.machine, infra, self.obs.evacuation.as_ref()) {
                    Turn::Now => {
                        self.not_ready(
                            reasons::HOST_EVACUATING,
                            format!(
                                "host {name} ({host}) is being evacuated; microVM {} keeps running until Cluster API replaces this Machine (a MachineHealthCheck with unhealthyMachineConditions InfrastructureReady=False remediates it)",
                                vm.uid
                            ),
                        );
                        Requeue::Await
                    }
                    Turn::Waiting(why) => {
                        self.condition(
                            types::READY,
                            Status::True,
                            reasons::READY,
                            format!(
                                "host {name} ({host}) is being evacuated; this machine waits its turn: {why}"
                            ),
                        );
                        Requeue::After(EVACUATION_TURN_RECHECK)
                    }
                }
            }
            VmState::Failed => {
                self.status.vm_state = Some(ApiVmState::Failed);
                self.not_ready(
                    reasons::MICROVM_PROVISION_FAILED,
                    format!(
                        "flintlock gave up on microVM {} on host {host} after {} retries; delete the Machine to replace it",
                        vm.uid, vm.retry
                    ),
                );
                Requeue::Await
            }
            VmState::Deleting => {
                self.status.vm_state = Some(ApiVmState::Deleting);
                self.not_ready(
                    reasons::MICROVM_DELETING,
                    format!("microVM {} is being deleted on host {host}", vm.uid),
                );
                Requeue::After(PENDING_RECHECK)
            }
            VmState::Unknown(n) => {
                self.status.vm_state = Some(ApiVmState::Unknown);
                self.not_ready(
                    reasons::MICROVM_UNKNOWN_STATE,
                    format!(
                        "host {host} reports microVM {} in unknown state {n}",
                        vm.uid
                    ),
                );
                Requeue::After(PENDING_RECHECK)
            }
        }
    }
}
