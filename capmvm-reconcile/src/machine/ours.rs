//! Which microVMs on the recorded host are this machine's: ours carry its origin uid in their
//! meta-data; a same-name one that does not blocks creation; a second one of ours is deleted.

use std::time::Duration;

use capmvm_api::{HostEndpoint, MicrovmMachine};
use kube::ResourceExt;

use super::{CREATE_CLAIM_TTL, Decision, foreign_claim, origin_uid};
use crate::observe::{ObservedVm, VmState};
use crate::plan::{EventKind, HostCall, reasons as events};

/// Whether `vm` is one of `machine`'s: its namespace and name, and the machine's origin uid in its
/// meta-data.
pub(super) fn is_ours(machine: &MicrovmMachine, vm: &ObservedVm) -> bool {
    let uid = origin_uid(machine);
    uid.is_some()
        && vm.machine_uid.as_deref() == uid
        && vm.name == machine.name_any()
        && Some(vm.namespace.as_str()) == machine.namespace().as_deref()
}

impl<'a> Decision<'a> {
    /// The microVMs that carry this machine's origin uid (ours), on the answering host.
    pub(super) fn ours<'v>(&self, vms: &'v [ObservedVm]) -> Vec<&'v ObservedVm> {
        vms.iter().filter(|v| self.is_ours(v)).collect()
    }

    pub(super) fn is_ours(&self, vm: &ObservedVm) -> bool {
        is_ours(self.machine, vm)
    }

    /// How long to wait, and for which process, if another operator process claimed the placement
    /// less than [`CREATE_CLAIM_TTL`] ago ([`foreign_claim`]): its create may not have reached the
    /// host when we listed it. The claim's age is how long this process has seen it (a process sees
    /// a claim only after it was written, so waiting the TTL from then covers the writer's create),
    /// never the difference of two processes' clocks: replicas whose clocks differ by more than the
    /// TTL would both create.
    pub(super) fn claimed_elsewhere(&self) -> Option<(Duration, &'a str)> {
        let claim = foreign_claim(self.machine, &self.obs.operator)?;
        let (_, by) = claim.split_once(' ')?;
        let age = self.obs.claim_seen_for.unwrap_or(Duration::ZERO);
        let left = CREATE_CLAIM_TTL.checked_sub(age).filter(|d| !d.is_zero())?;
        Some((left, by))
    }

    /// Why creating on `host` must wait, if `vms` (its fresh answer) holds microVMs with this
    /// machine's namespace/name that are not ours and not being deleted: their meta-data carries no
    /// readable origin uid, or another one. Creating next to them could make a second microVM of
    /// this machine (ours, unreadable) or two microVMs of one name; neither is undone by itself.
    pub(super) fn unknown_microvms(
        &self,
        host: &HostEndpoint,
        vms: &[ObservedVm],
    ) -> Option<String> {
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
    pub(super) fn delete_duplicates(
        &mut self,
        host: &HostEndpoint,
        vms: &[ObservedVm],
        keep: Option<&str>,
    ) {
        let mut extras: Vec<&ObservedVm> = self
            .ours(vms)
            .into_iter()
            .filter(|v| Some(v.uid.as_str()) != keep && v.state != VmState::Deleting)
            .collect();
        extras.sort_by(|a, b| a.uid.cmp(&b.uid));
        for vm in extras {
            self.plan.host_calls.push(HostCall::Delete {
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
}
