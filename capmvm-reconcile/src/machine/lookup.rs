//! How the operator asks the recorded host about a machine's microVMs: freshly while the machine
//! has no providerID, else from the host observer's last list, confirmed by a direct Get where that
//! list may be behind. The engine says which, and what the answers mean; the operator only asks.

use capmvm_api::{MicrovmMachine, VmState as ApiVmState};

use super::provider_id;
use crate::host_call::HostErrorKind;
use crate::observe::{HostLookup, ObservedVm, VmState};

/// Whether the recorded host's answer must be fresh rather than cached: true while the machine has no
/// providerID, because that answer decides whether a microVM is created (or a finalizer released).
pub fn wants_fresh_lookup(machine: &MicrovmMachine) -> bool {
    machine.spec.provider_id.is_none()
}

/// Whether `vm`, in a host's list, concerns `machine`: it has the machine's namespace and name, or
/// it is the microVM its providerID names (an adopted one may carry another name). To pick a
/// machine's microVMs out of a whole list, [`MachineVms`] reads the machine once.
pub fn concerns(machine: &MicrovmMachine, vm: &ObservedVm) -> bool {
    MachineVms::of(machine).contains(vm)
}

/// A machine's keys in a host's list, read once: a host lists every microVM it runs (a hundred
/// and more), and reading them per microVM cloned the machine's name and namespace and parsed its
/// providerID each time (about 3 % of the operator's CPU at 30 000 machines over 300 hosts).
pub struct MachineVms<'a> {
    namespace: Option<&'a str>,
    name: &'a str,
    provider_uid: Option<String>,
}

impl<'a> MachineVms<'a> {
    /// The keys of `machine`'s microVMs.
    pub fn of(machine: &'a MicrovmMachine) -> Self {
        let meta = &machine.metadata;
        MachineVms {
            namespace: meta.namespace.as_deref(),
            name: meta
                .name
                .as_deref()
                .or(meta.generate_name.as_deref())
                .unwrap_or_default(),
            provider_uid: provider_id(machine).map(|p| p.uid),
        }
    }

    /// Whether `vm` is one of the machine's: see [`concerns`].
    pub fn contains(&self, vm: &ObservedVm) -> bool {
        let named = Some(vm.namespace.as_str()) == self.namespace && vm.name == self.name;
        named || self.provider_uid.as_deref() == Some(vm.uid.as_str())
    }
}

/// Whether a machine with a providerID reads its microVM from the host directly (a Get) rather
/// than from the host observer's last list, `listed` being the state that list shows for the
/// providerID's microVM (`None`: absent, or no list yet). A list may predate what the machine
/// knows: a microVM missing from it may just have been created (by this process, or another one
/// before a restart), and one still starting in it may be running already by what the status
/// records (another replica saw it). Either would set the status back on a stale list.
pub fn wants_direct_get(machine: &MicrovmMachine, listed: Option<VmState>) -> bool {
    let recorded_running =
        machine.status.as_ref().and_then(|s| s.vm_state) == Some(ApiVmState::Running);
    listed.is_none() || (recorded_running && listed == Some(VmState::Pending))
}

/// The recorded host's answer once a direct Get of microVM `uid` (the providerID's) confirmed or
/// corrected `listed`: the microVM as the Get returned it, or absent when the host has no such
/// microVM (NotFound); any other error means the host did not answer. `message` is safe to show.
pub fn after_direct_get(
    mut listed: Vec<ObservedVm>,
    uid: &str,
    answer: Result<ObservedVm, (HostErrorKind, String)>,
) -> HostLookup {
    match answer {
        Ok(vm) => {
            listed.retain(|v| v.uid != uid);
            listed.push(vm);
        }
        Err((HostErrorKind::NotFound, _)) => listed.retain(|v| v.uid != uid),
        Err((_, message)) => return HostLookup::Unreachable(message),
    }
    HostLookup::Answered { vms: listed }
}
