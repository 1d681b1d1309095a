//! Deciding for one MicrovmMachine.
//!
//! Gates, in order (each waiting gate has its own reason on `Ready`): owner Machine, Cluster, paused,
//! Cluster infrastructure provisioned; then, for a machine without microVM, a valid spec and the
//! bootstrap data. The finalizer is not a gate of its own: it is added in the same conditional write
//! that records the host, before the first create (nothing exists on a host before that, and one write
//! does both). Then the machine either observes its microVM (it has a providerID), or creates one
//! exactly once:
//!
//! 1. choose a host and record it, with the machine's origin uid, in annotations (written before any
//!    create, and re-asserted before every create by a compare-and-swap: a write conditional on the
//!    resourceVersion that also counts the placement attempt, so it always changes the object);
//! 2. ask the recorded host, freshly, for microVMs with this namespace/name that carry the machine's
//!    origin uid in their meta-data; adopt the oldest (ULIDs sort by creation) and delete extra ones;
//!    a same-name microVM that is not ours (unreadable or another uid) blocks creation instead;
//! 3. only if there is none, create one, then adopt it (step 2) to set the providerID. A create the
//!    host refuses as invalid is not sent again until the spec's generation changes.
//!
//! A crash anywhere in between ends in step 2 on the next pass, never in a second microVM; so does a
//! `clusterctl move` (a new uid, the same annotations). A machine with a providerID is never created
//! again: a vanished microVM is reported, not replaced.
//!
//! A machine another provider placed (the Go provider's, after a move) is adopted as it is, or, if
//! that provider stopped in the middle of a create, left alone until a person decides: see
//! [`adoption`].

use capmvm_api::capi::{Machine, MachinePool};
use capmvm_api::conditions::{reasons, types};
use capmvm_api::keys::{
    CLUSTER_NAME_LABEL, MACHINE_FINALIZER, POOL_FAILURE_DOMAIN_ANNOTATION, POOL_NAME_LABEL,
};
use capmvm_api::{
    GROUP, HostEndpoint, Initialization, MicrovmCluster, MicrovmMachine, MicrovmMachineStatus,
    ProviderId, VmState as ApiVmState, validation,
};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use std::time::Duration;

mod adoption;
mod deletion;
mod record;
mod report;

pub use adoption::{
    PREVIOUS_PROVIDER_CONDITIONS, Provenance, drop_previous_provider_conditions, provenance,
};

use record::{annotated_host, claim_value};
pub use record::{origin_uid, placement_attempts, placement_claim, provider_id, recorded_host};
use report::{addresses, failure_domain_of, starting_message};

use crate::cloudinit::{self, CloudInit};
use crate::conditions::{self, Status};
use crate::gates::{self, Gate, Gates};
pub use crate::host_call::{
    HostCallFailure, HostCallVerdict, record_host_call_failure, spec_rejected_at_this_generation,
};
use crate::microvm;
use crate::observe::{BootstrapData, HostLookup, ObservedMachine, ObservedVm, VmState};
use crate::placement::{self, Request};
use crate::plan::{Effect, Event, EventKind, Plan, Requeue, reasons as events};

/// How long to wait before looking again at a microVM that is still pending or being deleted, as a
/// safety net behind the host observer, which wakes the machine when its microVM changes.
pub const PENDING_RECHECK: Duration = Duration::from_secs(60);

/// How long a brand-new MicrovmMachine may wait on CAPI (owner, Cluster, bootstrap data) before the
/// wait is reported on `Ready`.
pub const CAPI_SETTLE_GRACE: Duration = Duration::from_secs(10);

/// How long to wait before looking again at missing credentials (Secrets are not watched).
pub const CREDENTIALS_RECHECK: Duration = Duration::from_secs(10);

/// How long after another operator process claimed a placement a create of its may still reach the
/// host: the flintlock client's connect timeout (5 s) and call deadline (10 s), with a margin. Until
/// then a process that finds no microVM waits instead of creating a second one.
pub const CREATE_CLAIM_TTL: Duration = Duration::from_secs(20);

/// How long to wait when the operator has not gathered something the decision needs.
pub const NOT_OBSERVED_RECHECK: Duration = Duration::from_secs(5);

/// Whether the recorded host's answer must be fresh rather than cached: true while the machine has no
/// providerID, because that answer decides whether a microVM is created (or a finalizer released).
pub fn wants_fresh_lookup(machine: &MicrovmMachine) -> bool {
    machine.spec.provider_id.is_none()
}

/// Whether the decision reads the facts of every host of the pool (to choose one) rather than only
/// the recorded host's: only when it may place the machine now, that is no host is recorded yet, it
/// is not being deleted and the gates before placement (owner, Cluster, MicrovmCluster, pause) are
/// open in `obs` (gathered without hosts). Gathering a whole pool for every reconcile of a placed
/// machine, or of one still waiting for its owner, cost O(hosts) each for nothing.
pub fn wants_pool_facts(obs: &ObservedMachine) -> bool {
    let machine = &obs.machine;
    if recorded_host(machine).is_some()
        || machine.spec.provider_id.is_some()
        || machine.metadata.deletion_timestamp.is_some()
        || provenance(machine) == Provenance::Unfinished
    {
        return false;
    }
    let paused = gates::paused(machine.annotations(), obs.cluster.as_ref());
    let cluster_name = cluster_name(obs);
    let owner_wait = owner_wait(obs);
    matches!(
        gates(obs, &owner_wait, &cluster_name, paused.as_deref()).check(),
        Gate::Open { .. }
    )
}

/// What the gates see of a machine.
fn gates<'a>(
    obs: &'a ObservedMachine,
    owner_wait: &'a str,
    cluster_name: &'a str,
    paused: Option<&'a str>,
) -> Gates<'a> {
    Gates {
        // A pool's instance is placed only once core's Machine owns it, as CAPD's DockerMachine
        // waits: core adopts a new instance (an ownerReference write) moments after the pool
        // creates it, and a placement decided before would lose its compare-and-swap to that write.
        // Once placed, its MachinePool speaks for it until core's Machine shows.
        has_owner: obs.owner.is_some()
            || (instance_pool(&obs.machine).is_some()
                && obs.machine_pool.is_some()
                && recorded_host(&obs.machine).is_some()),
        owner_wait,
        cluster_name,
        cluster: obs.cluster.as_ref(),
        infra_cluster: obs.infra_cluster.as_deref(),
        paused,
    }
}

/// What a machine without its owner says it waits for.
fn owner_wait(obs: &ObservedMachine) -> String {
    match (instance_pool(&obs.machine), &obs.machine_pool) {
        (Some(pool), None) => {
            format!("waiting for the Cluster API MachinePool that owns MicrovmMachinePool {pool:?}")
        }
        (Some(_), Some(mp)) => format!(
            "waiting for Cluster API to create the Machine of this instance of MachinePool {:?}",
            mp.metadata.name.as_deref().unwrap_or_default()
        ),
        (None, _) => "waiting for a Cluster API Machine to own this MicrovmMachine".to_string(),
    }
}

/// The machine's cluster: its cluster-name label, else its owner's.
fn cluster_name(obs: &ObservedMachine) -> String {
    obs.machine
        .labels()
        .get(CLUSTER_NAME_LABEL)
        .cloned()
        .or_else(|| obs.owner.as_ref().map(|o| o.spec.cluster_name.clone()))
        .or_else(|| {
            obs.machine_pool
                .as_ref()
                .map(|p| p.spec.cluster_name.clone())
        })
        .unwrap_or_default()
}

/// The bootstrap Secret the operator should read for this machine, if any: only while a microVM may
/// still be created (no providerID, not deleting). For a pool's instance it is always the
/// MachinePool's (core gives MachinePool Machines an empty `dataSecretName`).
pub fn wants_bootstrap_data<'a>(
    machine: &MicrovmMachine,
    owner: Option<&'a Machine>,
    machine_pool: Option<&'a MachinePool>,
) -> Option<&'a str> {
    if machine.metadata.deletion_timestamp.is_some() || machine.spec.provider_id.is_some() {
        return None;
    }
    bootstrap_secret_name(machine, owner, machine_pool)
}

/// The MicrovmMachinePool a machine is an instance of: it carries the `cluster.x-k8s.io/pool-name`
/// label and an ownerReference to a MicrovmMachinePool (the pool made it; core adds its Machine later).
pub fn instance_pool(machine: &MicrovmMachine) -> Option<&str> {
    if !machine.labels().contains_key(POOL_NAME_LABEL) {
        return None;
    }
    machine
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| {
            o.kind == "MicrovmMachinePool"
                && o.api_version.rsplit_once('/').map(|(g, _)| g) == Some(GROUP)
        })
        .map(|o| o.name.as_str())
}

/// Where a machine's bootstrap data comes from: the MachinePool's Secret for a pool's instance (read
/// afresh for every create, so a rotated join token reaches new instances), else its Machine's.
fn bootstrap_secret_name<'a>(
    machine: &MicrovmMachine,
    owner: Option<&'a Machine>,
    machine_pool: Option<&'a MachinePool>,
) -> Option<&'a str> {
    if instance_pool(machine).is_some() {
        return machine_pool
            .and_then(MachinePool::bootstrap_data_secret_name)
            .filter(|s| !s.is_empty());
    }
    owner.and_then(|o| o.spec.bootstrap.data_secret_name.as_deref())
}

/// Decides what to do for one MicrovmMachine.
pub fn decide(obs: &ObservedMachine, now: Timestamp) -> Plan<MicrovmMachineStatus> {
    let mut d = Decision::new(obs, now);
    let requeue = d.run();
    d.finish(requeue)
}

struct Decision<'a> {
    obs: &'a ObservedMachine,
    machine: &'a MicrovmMachine,
    now: Timestamp,
    generation: Option<i64>,
    status: MicrovmMachineStatus,
    effects: Vec<Effect>,
    /// Leave the status unwritten: a brand-new object is still being assembled by CAPI, or the status
    /// is written by the adoption that follows a create.
    quiet: bool,
}

impl<'a> Decision<'a> {
    fn new(obs: &'a ObservedMachine, now: Timestamp) -> Self {
        let machine = &obs.machine;
        Self {
            obs,
            machine,
            now,
            generation: machine.metadata.generation,
            status: machine.status.clone().unwrap_or_default(),
            effects: Vec::new(),
            quiet: false,
        }
    }

    fn run(&mut self) -> Requeue {
        let paused = self.paused();
        match &paused {
            Some(why) => self.condition(types::PAUSED, Status::True, reasons::PAUSED, why.clone()),
            None => self.condition(types::PAUSED, Status::False, reasons::NOT_PAUSED, ""),
        }
        if self.machine.metadata.deletion_timestamp.is_some() {
            if paused.is_some() {
                return Requeue::Await;
            }
            return self.delete();
        }

        let cluster_name = cluster_name(self.obs);
        let owner_wait = owner_wait(self.obs);
        let gates = gates(self.obs, &owner_wait, &cluster_name, paused.as_deref());
        let (cluster, infra) = match gates.check() {
            Gate::Open {
                cluster,
                infra_cluster,
            } => (cluster, infra_cluster),
            Gate::Paused(why) => {
                // A ready machine stays Ready while paused (clusterctl move pauses every cluster).
                if !conditions::is_true(&self.status.conditions, types::READY) {
                    self.not_ready(reasons::PAUSED, why);
                }
                return Requeue::Await;
            }
            Gate::Waiting { reason, message } => return self.wait_for_capi(reason, message),
        };

        if self.machine.spec.provider_id.is_some() {
            return self.observe_existing(infra);
        }
        self.create_or_adopt(infra, &cluster.name_any())
    }

    /// The failure domain the microVM must be placed in: the one the pool chose for its instance,
    /// else the Machine's. An empty one (a v1beta1 `*string` set to "") means none.
    fn failure_domain(&self) -> Option<&'a str> {
        let chosen = if instance_pool(self.machine).is_some() {
            self.machine
                .annotations()
                .get(POOL_FAILURE_DOMAIN_ANNOTATION)
                .map(String::as_str)
        } else {
            self.obs
                .owner
                .as_ref()
                .and_then(|o| o.spec.failure_domain.as_deref())
        };
        chosen.filter(|fd| !fd.is_empty())
    }

    // --- the machine has a providerID: observe its microVM ---

    fn observe_existing(&mut self, infra: &MicrovmCluster) -> Requeue {
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

    fn create_or_adopt(&mut self, infra: &MicrovmCluster, cluster_name: &str) -> Requeue {
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
                        self.effects.push(Effect::SetProviderId(
                            ProviderId::new(host.clone(), oldest.uid.clone()).to_string(),
                        ));
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
            return self.wait_for_capi(reasons::WAITING_FOR_BOOTSTRAP_DATA, whose);
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
                return self.wait_for_capi(
                    reasons::WAITING_FOR_BOOTSTRAP_DATA,
                    format!("bootstrap Secret {secret:?} not found"),
                );
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
            if let Some(left) = self.claimed_elsewhere() {
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
            control_plane: self
                .obs
                .owner
                .as_ref()
                .is_some_and(Machine::is_control_plane),
        };
        match placement::choose(pool, &self.obs.hosts, &request) {
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
    fn create(
        &mut self,
        host: &HostEndpoint,
        machine_uid: &str,
        user_data: &crate::observe::Sensitive,
        cluster_name: &str,
        infra: &MicrovmCluster,
    ) -> Requeue {
        if self.missing_credentials(host) {
            return Requeue::After(CREDENTIALS_RECHECK);
        }
        // Never the value read, so the write always makes a new resourceVersion (wrapping is
        // academic, but must not land on the same value either).
        let attempt = placement_attempts(self.machine).wrapping_add(1).max(1);
        self.effects.push(Effect::RecordHost {
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
        self.effects.push(Effect::CreateMicrovm {
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
    fn follow_state(
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
                if let Some(left) = self.unreported_youth_left() {
                    // A microVM that starts within the settle grace goes straight to Ready: the
                    // pending state of a brand-new machine is reported only if it lasts.
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
                self.condition(types::READY, Status::True, reasons::READY, "");
                Requeue::Await
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

    // --- helpers ---

    fn ensure_finalizer(&mut self) {
        let has = self
            .machine
            .finalizers()
            .iter()
            .any(|f| f == MACHINE_FINALIZER);
        if !has && !self.effects.contains(&Effect::AddFinalizer) {
            self.effects.insert(0, Effect::AddFinalizer);
        }
    }

    /// Reports (and returns true) when the host cannot even be called: a Secret or key is missing.
    fn missing_credentials(&mut self, host: &HostEndpoint) -> bool {
        let problem = self
            .obs
            .hosts
            .get(&host.to_string())
            .and_then(|f| f.credentials_problem.clone());
        match problem {
            Some(problem) => {
                self.not_ready(
                    reasons::MISSING_CREDENTIALS,
                    format!("cannot call host {host}: {problem}"),
                );
                true
            }
            None => false,
        }
    }

    /// The microVMs that carry this machine's origin uid (ours), on the answering host.
    fn ours<'v>(&self, vms: &'v [ObservedVm]) -> Vec<&'v ObservedVm> {
        vms.iter().filter(|v| self.is_ours(v)).collect()
    }

    fn is_ours(&self, vm: &ObservedVm) -> bool {
        let uid = origin_uid(self.machine);
        uid.is_some()
            && vm.machine_uid.as_deref() == uid
            && vm.name == self.machine.name_any()
            && Some(vm.namespace.as_str()) == self.machine.namespace().as_deref()
    }

    /// How long to wait, if another operator process claimed the placement less than
    /// [`CREATE_CLAIM_TTL`] ago: its create may not have reached the host when we listed it. The
    /// claim's age is how long this process has seen it (a process sees a claim only after it was
    /// written, so waiting the TTL from then covers the writer's create), never the difference of
    /// two processes' clocks: replicas whose clocks differ by more than the TTL would both create.
    fn claimed_elsewhere(&self) -> Option<Duration> {
        let (_, by) = placement_claim(self.machine)?;
        if by == self.obs.operator {
            // Our own claim: reconciles of one object do not overlap, so our create is over.
            return None;
        }
        let age = self.obs.claim_seen_for.unwrap_or(Duration::ZERO);
        CREATE_CLAIM_TTL.checked_sub(age).filter(|d| !d.is_zero())
    }

    /// Why creating on `host` must wait, if `vms` (its fresh answer) holds microVMs with this
    /// machine's namespace/name that are not ours and not being deleted: their meta-data carries no
    /// readable origin uid, or another one. Creating next to them could make a second microVM of
    /// this machine (ours, unreadable) or two microVMs of one name; neither is undone by itself.
    fn unknown_microvms(&self, host: &HostEndpoint, vms: &[ObservedVm]) -> Option<String> {
        let name = self.machine.name_any();
        let namespace = self.machine.namespace().unwrap_or_default();
        let mut unknown: Vec<&ObservedVm> = vms
            .iter()
            .filter(|v| {
                v.name == name
                    && v.namespace == namespace
                    && v.state != VmState::Deleting
                    && !self.is_ours(v)
            })
            .collect();
        if unknown.is_empty() {
            return None;
        }
        unknown.sort_by(|a, b| a.uid.cmp(&b.uid));
        let ours = origin_uid(self.machine).unwrap_or_default();
        let each: Vec<String> = unknown
            .iter()
            .map(|v| match &v.machine_uid {
                Some(uid) => format!(
                    "microVM {} carries MicrovmMachine uid {uid} in its meta-data, not this machine's {ours}",
                    v.uid
                ),
                None => format!(
                    "microVM {} has no readable MicrovmMachine uid in its meta-data",
                    v.uid
                ),
            })
            .collect();
        Some(format!(
            "host {host} has a microVM named {namespace}/{name} that is not this machine's ({}); no microVM is created while it exists. Check whether it belongs to another management cluster or to an earlier MicrovmMachine of this name, then delete it from the host, or delete this Machine",
            each.join("; ")
        ))
    }

    /// Deletes microVMs that carry this machine's origin uid but are not the one it keeps.
    fn delete_duplicates(&mut self, host: &HostEndpoint, vms: &[ObservedVm], keep: Option<&str>) {
        let mut extras: Vec<&ObservedVm> = self
            .ours(vms)
            .into_iter()
            .filter(|v| Some(v.uid.as_str()) != keep && v.state != VmState::Deleting)
            .collect();
        extras.sort_by(|a, b| a.uid.cmp(&b.uid));
        for vm in extras {
            self.effects.push(Effect::DeleteMicrovm {
                host: host.clone(),
                uid: vm.uid.clone(),
            });
            self.event(
                EventKind::Warning,
                events::DUPLICATE_MICROVM,
                "Delete",
                format!(
                    "deleting microVM {} on host {host}: a second microVM for this machine ({} is kept)",
                    vm.uid,
                    keep.unwrap_or("none")
                ),
            );
        }
    }

    fn paused(&self) -> Option<String> {
        gates::paused(self.machine.annotations(), self.obs.cluster.as_ref())
    }

    fn condition(&mut self, type_: &str, status: Status, reason: &str, message: impl Into<String>) {
        conditions::set(
            &mut self.status.conditions,
            type_,
            status,
            reason,
            message,
            self.generation,
            self.now,
        );
    }

    fn not_ready(&mut self, reason: &str, message: impl Into<String>) {
        self.condition(types::READY, Status::False, reason, message);
    }

    /// Waits for CAPI (owner, Cluster, infrastructure, bootstrap data). A brand-new object that was
    /// never reported on is left unwritten for [`CAPI_SETTLE_GRACE`]: CAPI assembles it in a burst of
    /// writes, and reporting each passing wait would cost a status write (and a conflict) apiece.
    /// A wait that outlasts the grace is reported with its reason.
    fn wait_for_capi(&mut self, reason: &str, message: impl Into<String>) -> Requeue {
        match self.unreported_youth_left() {
            Some(left) => {
                self.quiet = true;
                Requeue::After(left)
            }
            None => {
                self.not_ready(reason, message);
                Requeue::Await
            }
        }
    }

    /// For a brand-new object whose status was never written: how much of [`CAPI_SETTLE_GRACE`] is
    /// left. Transient states of such an object (waits on CAPI, a microVM still starting) are not
    /// written while it lasts; anything that needs attention is.
    fn unreported_youth_left(&self) -> Option<Duration> {
        if self.machine.status.is_some() {
            return None;
        }
        let created = self.machine.metadata.creation_timestamp.as_ref()?;
        let age = Duration::try_from(self.now.duration_since(created.0)).ok()?;
        CAPI_SETTLE_GRACE.checked_sub(age).filter(|d| !d.is_zero())
    }

    fn event(&mut self, kind: EventKind, reason: &'static str, action: &'static str, note: String) {
        self.effects.push(Effect::Event(Event {
            kind,
            reason,
            action,
            note,
        }));
    }

    fn finish(mut self, requeue: Requeue) -> Plan<MicrovmMachineStatus> {
        if self.quiet {
            return Plan {
                effects: self.effects,
                status: None,
                requeue,
            };
        }
        drop_previous_provider_conditions(&mut self.status.conditions);
        self.transition_events();
        Plan {
            effects: self.effects,
            status: Some(self.status),
            requeue,
        }
    }

    /// Events for `Ready` transitions users should see in `kubectl describe`.
    fn transition_events(&mut self) {
        let before = self.machine.status.as_ref().and_then(|s| {
            conditions::get(&s.conditions, types::READY)
                .map(|c| (c.status.clone(), c.reason.clone()))
        });
        let Some(after) = conditions::get(&self.status.conditions, types::READY) else {
            return;
        };
        if before
            .as_ref()
            .is_some_and(|(s, r)| *s == after.status && *r == after.reason)
        {
            return;
        }
        let (kind, reason) = match after.reason.as_str() {
            // Reaching Ready is on the condition already; an event marks only a recovery from a
            // problem that had its own Warning (a host back, credentials found).
            reasons::READY if before.as_ref().is_some_and(|(_, r)| recovers_from(r)) => {
                (EventKind::Normal, events::MICROVM_READY)
            }
            reasons::MICROVM_PROVISION_FAILED => (EventKind::Warning, events::MICROVM_FAILED),
            reasons::MICROVM_NOT_FOUND => (EventKind::Warning, events::MICROVM_NOT_FOUND),
            reasons::INVALID_SPEC => (EventKind::Warning, events::INVALID_SPEC),
            reasons::HOST_UNREACHABLE => (EventKind::Warning, events::HOST_UNREACHABLE),
            reasons::UNKNOWN_MICROVM_ON_HOST => {
                (EventKind::Warning, events::UNKNOWN_MICROVM_ON_HOST)
            }
            reasons::UNFINISHED_BY_PREVIOUS_PROVIDER => {
                (EventKind::Warning, events::UNFINISHED_BY_PREVIOUS_PROVIDER)
            }
            _ => return,
        };
        let note = if after.message.is_empty() {
            "microVM is running".to_string()
        } else {
            after.message.clone()
        };
        self.event(kind, reason, "Reconcile", note);
    }
}

/// Whether `Ready` becoming True after `reason` is a recovery worth an event.
fn recovers_from(reason: &str) -> bool {
    matches!(
        reason,
        reasons::HOST_UNREACHABLE
            | reasons::MISSING_CREDENTIALS
            | reasons::MICROVM_CREATE_FAILED
            | reasons::MICROVM_NOT_FOUND
            | reasons::MICROVM_SPEC_REJECTED
            | reasons::UNKNOWN_MICROVM_ON_HOST
    )
}
