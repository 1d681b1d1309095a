//! How a machine's microVM is reported: the pending message, addresses, failure domain, and what
//! differs between the spec and what the microVM runs with.

use capmvm_api::conditions::{reasons, types};
use capmvm_api::{
    HostEndpoint, MachineAddress, MachineAddressType, MicrovmCluster, MicrovmMachine,
};
use kube::ResourceExt;

use super::Decision;
use crate::conditions::{self, Status};
use crate::observe::{ObservedVm, RunningSpec};
use crate::plan::{EventKind, reasons as events};

impl Decision<'_> {
    /// Reports on `MicrovmUpToDate` whether the microVM runs with what the spec asks. Flintlock
    /// cannot resize or re-image a microVM, and re-creating it behind CAPI's back would lose the node:
    /// an edit is reported (with a Warning event when first seen), and the way to apply it named.
    pub(super) fn compare_running_spec(&mut self, host: &HostEndpoint, vm: &ObservedVm) {
        let Some(running) = &vm.running else {
            return;
        };
        let changes = spec_changes(self.machine, running);
        if changes.is_empty() {
            self.condition(
                types::MICROVM_UP_TO_DATE,
                Status::True,
                reasons::UP_TO_DATE,
                "",
            );
            return;
        }
        let message = format!(
            "the spec changed after the microVM was created on host {host} and is not applied ({}): a microVM cannot be changed in place; replace the Machine (for example, point its MachineDeployment at a new MicrovmMachineTemplate) to apply it",
            changes.join("; ")
        );
        let seen_before = self
            .machine
            .status
            .as_ref()
            .and_then(|s| conditions::get(&s.conditions, types::MICROVM_UP_TO_DATE))
            .is_some_and(|c| {
                c.reason == reasons::SPEC_CHANGED_AFTER_CREATE && c.message == message
            });
        if !seen_before {
            self.event(
                EventKind::Warning,
                events::SPEC_CHANGE_NOT_APPLIED,
                "Reconcile",
                message.clone(),
            );
        }
        self.condition(
            types::MICROVM_UP_TO_DATE,
            Status::False,
            reasons::SPEC_CHANGED_AFTER_CREATE,
            message,
        );
    }
}

/// The `Ready` message of a pending microVM (no uid: it must not change between create and adoption).
pub(super) fn starting_message(host: &HostEndpoint, retries: i32) -> String {
    if retries > 0 {
        format!(
            "waiting for the microVM on host {host} to start (flintlock retried {retries} times)"
        )
    } else {
        format!("waiting for the microVM on host {host} to start")
    }
}

/// How the spec differs from what the microVM runs with, one phrase per field.
pub(super) fn spec_changes(machine: &MicrovmMachine, running: &RunningSpec) -> Vec<String> {
    let spec = &machine.spec;
    let mut changes = Vec::new();
    if spec.vcpu != running.vcpu {
        changes.push(format!(
            "spec.vcpu is {}, the microVM has {}",
            spec.vcpu, running.vcpu
        ));
    }
    if spec.memory_mb != running.memory_mb {
        changes.push(format!(
            "spec.memoryMb is {}, the microVM has {}",
            spec.memory_mb, running.memory_mb
        ));
    }
    if *spec.kernel.image != *running.kernel_image {
        changes.push(format!(
            "spec.kernel.image is {:?}, the microVM runs {:?}",
            spec.kernel.image, running.kernel_image
        ));
    }
    // Flintlock omits a root volume it was not given; only compare what it echoed.
    if let Some(image) = &running.root_volume_image
        && spec.root_volume.image.as_deref() != Some(&**image)
    {
        changes.push(format!(
            "spec.rootVolume.image is {:?}, the microVM runs {:?}",
            spec.root_volume.image.as_deref().unwrap_or_default(),
            image
        ));
    }
    changes
}

/// The failure domain of `host` in the MicrovmCluster's pool.
pub(super) fn failure_domain_of(infra: &MicrovmCluster, host: &HostEndpoint) -> Option<String> {
    let hosts = &infra.spec.placement.static_pool.as_ref()?.hosts;
    // Endpoints are usually written as their canonical form: compare the text first, and parse each
    // only when none matches (a report runs on every reconcile, over every host of the pool).
    let canonical = host.to_string();
    hosts
        .iter()
        .find(|h| h.endpoint == canonical)
        .or_else(|| {
            hosts
                .iter()
                .find(|h| h.endpoint.parse::<HostEndpoint>().ok().as_ref() == Some(host))
        })
        .map(|h| h.failure_domain_name().to_string())
}

/// The machine's addresses: its hostname and its static addresses.
pub(super) fn addresses(machine: &MicrovmMachine) -> Vec<MachineAddress> {
    let mut out = vec![MachineAddress {
        address_type: MachineAddressType::Hostname,
        address: machine.name_any(),
    }];
    for nic in &machine.spec.network_interfaces {
        if let Some(ip) = nic
            .address
            .as_deref()
            .and_then(|a| a.parse::<ipnet::IpNet>().ok())
            .map(|n| n.addr())
        {
            out.push(MachineAddress {
                address_type: MachineAddressType::InternalIp,
                address: ip.to_string(),
            });
        }
    }
    out
}
