//! Deleting a MicrovmMachine: its microVMs on the recorded host first, the finalizer last, and not
//! while another operator process's create may still reach that host.

use capmvm_api::VmState as ApiVmState;
use capmvm_api::conditions::reasons;
use capmvm_api::keys::{ABANDON_MICROVM_ANNOTATION, MACHINE_FINALIZER};
use kube::ResourceExt;

use super::{
    CREATE_CLAIM_TTL, CREDENTIALS_RECHECK, Decision, NOT_OBSERVED_RECHECK, PENDING_RECHECK,
    Provenance, provenance, provider_id, recorded_host,
};
use crate::host_call::deletion_blocked;
use crate::observe::{HostLookup, ObservedVm, VmState};
use crate::plan::{EventKind, HostCall, Requeue, reasons as events};

impl Decision<'_> {
    pub(super) fn reconcile_delete(&mut self) -> Requeue {
        if !self
            .machine
            .finalizers()
            .iter()
            .any(|f| f == MACHINE_FINALIZER)
        {
            return Requeue::Await;
        }
        let abandoned = self
            .machine
            .annotations()
            .get(ABANDON_MICROVM_ANNOTATION)
            .map(String::as_str)
            == Some("true");
        let unfinished = provenance(self.machine) == Provenance::Unfinished;
        if unfinished && !abandoned {
            // The previous provider may have created a microVM we cannot recognise.
            self.report_unfinished(true);
            return Requeue::Await;
        }
        let Some(host) = recorded_host(self.machine) else {
            // Never placed by us; never placed by another provider either, or released by a person.
            self.plan.remove_finalizer = true;
            if unfinished {
                self.event(
                    EventKind::Warning,
                    events::MICROVM_ABANDONED,
                    "Delete",
                    format!(
                        "finalizer released without confirming that no microVM of the previous provider is left ({ABANDON_MICROVM_ANNOTATION}=true)"
                    ),
                );
            }
            return Requeue::Await;
        };
        let pid_uid = provider_id(self.machine)
            .filter(|p| p.host == host)
            .map(|p| p.uid);
        let what = pid_uid
            .as_deref()
            .map_or_else(|| "the microVM".to_string(), |u| format!("microVM {u}"));
        if abandoned {
            self.plan.remove_finalizer = true;
            self.event(
                EventKind::Warning,
                events::MICROVM_ABANDONED,
                "Delete",
                format!(
                    "finalizer released without confirming that {what} on host {host} is gone ({ABANDON_MICROVM_ANNOTATION}=true)"
                ),
            );
            return Requeue::Await;
        }
        if self.missing_credentials(&host) {
            return Requeue::After(CREDENTIALS_RECHECK);
        }
        match &self.obs.recorded_host {
            HostLookup::NotAsked if self.obs.infra_cluster.is_none() => {
                // The MicrovmCluster holds its finalizer while machines exist, so this is one removed
                // by force (or an older provider's): its hosts and credentials are unknown.
                self.not_ready(
                    reasons::DELETING,
                    deletion_blocked(&format!(
                        "the MicrovmCluster of this machine is gone, so host {host} cannot be called with its credentials; restore the MicrovmCluster"
                    )),
                );
                Requeue::After(NOT_OBSERVED_RECHECK)
            }
            HostLookup::NotAsked => {
                self.not_ready(
                    reasons::DELETING,
                    format!("waiting to list the microVMs of host {host}"),
                );
                Requeue::After(NOT_OBSERVED_RECHECK)
            }
            HostLookup::Unreachable(why) => {
                self.not_ready(
                    reasons::HOST_UNREACHABLE,
                    deletion_blocked(&format!("host {host} is unreachable ({why})")),
                );
                Requeue::Await
            }
            HostLookup::Answered { vms } => {
                let mut targets: Vec<&ObservedVm> = vms
                    .iter()
                    .filter(|v| pid_uid.as_deref() == Some(v.uid.as_str()) || self.is_ours(v))
                    .collect();
                targets.sort_by(|a, b| a.uid.cmp(&b.uid));
                targets.dedup_by(|a, b| a.uid == b.uid);
                if targets.is_empty() {
                    // Another process's create may still land after this list: releasing now would
                    // leave its microVM to nobody (reported orphaned, never deleted).
                    if let Some((left, by)) = self.claimed_elsewhere() {
                        self.not_ready(
                            reasons::DELETING,
                            format!(
                                "host {host} lists no microVM of this machine yet, but operator process {by} claimed its placement and its create may still reach the host; the finalizer stays until that create could no longer land ({} s from when this process saw the claim)",
                                CREATE_CLAIM_TTL.as_secs()
                            ),
                        );
                        return Requeue::After(left);
                    }
                    self.plan.remove_finalizer = true;
                    self.event(
                        EventKind::Normal,
                        events::MICROVM_DELETED,
                        "Delete",
                        format!("{what} is gone from host {host}"),
                    );
                    return Requeue::Await;
                }
                self.status.vm_state = Some(ApiVmState::Deleting);
                let uids: Vec<&str> = targets.iter().map(|v| v.uid.as_str()).collect();
                for vm in &targets {
                    if vm.state != VmState::Deleting {
                        self.plan.host_calls.push(HostCall::Delete {
                            host: host.clone(),
                            uid: vm.uid.clone(),
                        });
                        self.event(
                            EventKind::Normal,
                            events::MICROVM_DELETING,
                            "Delete",
                            format!("deleting microVM {} on host {host}", vm.uid),
                        );
                    }
                }
                self.not_ready(
                    reasons::DELETING,
                    format!(
                        "waiting for host {host} to delete microVM {}",
                        uids.join(", ")
                    ),
                );
                Requeue::After(PENDING_RECHECK)
            }
        }
    }
}
