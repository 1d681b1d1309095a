//! MicrovmMachine: `v1alpha1` <-> `v1alpha2`.

use std::collections::BTreeMap;

use super::cluster::{key_down, key_up};
use super::{
    ConversionError, conditions, convert_object_with_status, initialization_up, non_empty,
    ready_down,
};
use crate::machine::{
    IfaceType, Initrd, Kernel, MicrovmMachine, MicrovmMachineSpec, MicrovmMachineStatus,
    NetworkInterface, VmState, VmmProvider, Volume,
};
use crate::v1alpha1::{self, vm_states};

/// A `v1alpha1` MicrovmMachine at `v1alpha2`.
pub fn machine_to_v1alpha2(
    old: &v1alpha1::MicrovmMachine,
) -> Result<MicrovmMachine, ConversionError> {
    convert_object_with_status(old, spec_up, spec_down, status_up, status_down)
}

/// A `v1alpha2` MicrovmMachine at `v1alpha1`.
pub fn machine_to_v1alpha1(
    new: &MicrovmMachine,
) -> Result<v1alpha1::MicrovmMachine, ConversionError> {
    convert_object_with_status(
        new,
        |s, _| spec_down(s),
        |s| spec_up(s, None),
        status_down,
        status_up,
    )
}

/// `kept` is the `v1alpha2` spec this machine had when it was read at `v1alpha1` and then changed:
/// an interface of the same name and address keeps its gateway and nameservers.
pub(super) fn spec_up(
    old: &v1alpha1::MicrovmMachineSpec,
    kept: Option<&MicrovmMachineSpec>,
) -> MicrovmMachineSpec {
    let kept_nics: BTreeMap<&str, &NetworkInterface> = kept
        .map(|k| {
            k.network_interfaces
                .iter()
                .map(|n| (n.guest_device_name.as_str(), n))
                .collect()
        })
        .unwrap_or_default();
    MicrovmMachineSpec {
        provider: provider_up(&old.provider),
        vcpu: old.vcpu,
        memory_mb: old.memory_mb,
        root_volume: volume_up(&old.root_volume),
        volumes: old.volumes.iter().map(volume_up).collect(),
        kernel: Kernel {
            image: old.kernel.image.clone(),
            filename: old.kernel.filename.clone(),
        },
        kernel_cmdline: old.kernel_cmdline.clone(),
        initrd: old.initrd.as_ref().map(|i| Initrd {
            image: i.image.clone(),
            filename: non_empty(&i.filename),
        }),
        network_interfaces: old
            .network_interfaces
            .iter()
            .map(|n| nic_up(n, kept_nics.get(n.guest_device_name.as_str()).copied()))
            .collect(),
        labels: old.labels.clone(),
        ssh_public_keys: old.ssh_public_keys.iter().map(key_up).collect(),
        // v1alpha1 has no host selection: a spec edited there keeps the selector it had.
        host_selector: kept.and_then(|k| k.host_selector.clone()),
        provider_id: old.provider_id.clone(),
    }
}

/// `v1alpha2` names the providers flintlock has; another name (which flintlock would refuse) has no
/// `v1alpha2` form and is kept in the annotation.
fn provider_up(name: &str) -> Option<VmmProvider> {
    [VmmProvider::Firecracker, VmmProvider::Cloudhypervisor]
        .into_iter()
        .find(|p| p.as_str() == name)
}

fn volume_up(old: &v1alpha1::Volume) -> Volume {
    Volume {
        id: old.id.clone(),
        image: non_empty(&old.image),
        read_only: old.read_only,
        mount_point: non_empty(&old.mount_point),
        virtiofs_path: non_empty(&old.virtiofs_path),
    }
}

fn nic_up(old: &v1alpha1::NetworkInterface, kept: Option<&NetworkInterface>) -> NetworkInterface {
    let address = non_empty(&old.address);
    // A gateway and nameservers belong to the static address they were written for.
    let kept = kept.filter(|k| k.address == address);
    NetworkInterface {
        guest_device_name: old.guest_device_name.clone(),
        guest_mac: non_empty(&old.guest_mac),
        iface_type: match old.iface_type {
            v1alpha1::IfaceType::Macvtap => IfaceType::Macvtap,
            v1alpha1::IfaceType::Tap => IfaceType::Tap,
        },
        address,
        gateway: kept.and_then(|k| k.gateway.clone()),
        nameservers: kept.map(|k| k.nameservers.clone()).unwrap_or_default(),
    }
}

pub(super) fn spec_down(new: &MicrovmMachineSpec) -> v1alpha1::MicrovmMachineSpec {
    v1alpha1::MicrovmMachineSpec {
        provider: new
            .provider
            .map(|p| p.as_str().to_string())
            .unwrap_or_default(),
        vcpu: new.vcpu,
        memory_mb: new.memory_mb,
        root_volume: volume_down(&new.root_volume),
        volumes: new.volumes.iter().map(volume_down).collect(),
        kernel: v1alpha1::ContainerFileSource {
            image: new.kernel.image.clone(),
            filename: new.kernel.filename.clone(),
        },
        kernel_cmdline: new.kernel_cmdline.clone(),
        initrd: new.initrd.as_ref().map(|i| v1alpha1::ContainerFileSource {
            image: i.image.clone(),
            filename: i.filename.clone().unwrap_or_default(),
        }),
        network_interfaces: new
            .network_interfaces
            .iter()
            .map(|n| v1alpha1::NetworkInterface {
                guest_device_name: n.guest_device_name.clone(),
                guest_mac: n.guest_mac.clone().unwrap_or_default(),
                iface_type: match n.iface_type {
                    IfaceType::Macvtap => v1alpha1::IfaceType::Macvtap,
                    IfaceType::Tap => v1alpha1::IfaceType::Tap,
                },
                address: n.address.clone().unwrap_or_default(),
            })
            .collect(),
        labels: new.labels.clone(),
        ssh_public_keys: new.ssh_public_keys.iter().map(key_down).collect(),
        provider_id: new.provider_id.clone(),
    }
}

fn volume_down(new: &Volume) -> v1alpha1::Volume {
    v1alpha1::Volume {
        id: new.id.clone(),
        image: new.image.clone().unwrap_or_default(),
        read_only: new.read_only,
        mount_point: new.mount_point.clone().unwrap_or_default(),
        virtiofs_path: new.virtiofs_path.clone().unwrap_or_default(),
    }
}

fn status_up(old: &v1alpha1::MicrovmMachineStatus) -> MicrovmMachineStatus {
    MicrovmMachineStatus {
        initialization: initialization_up(old.ready),
        vm_state: old.vm_state.as_deref().and_then(|s| match s {
            vm_states::PENDING => Some(VmState::Pending),
            vm_states::RUNNING => Some(VmState::Running),
            vm_states::FAILED => Some(VmState::Failed),
            vm_states::DELETING => Some(VmState::Deleting),
            vm_states::UNKNOWN => Some(VmState::Unknown),
            // `deleted` (never written by the Go provider) and other text: kept in the annotation.
            _ => None,
        }),
        host: None,
        failure_domain: None,
        addresses: old.addresses.clone(),
        conditions: conditions::up(&old.conditions),
    }
}

fn status_down(new: &MicrovmMachineStatus) -> v1alpha1::MicrovmMachineStatus {
    v1alpha1::MicrovmMachineStatus {
        ready: ready_down(new.initialization.as_ref()),
        vm_state: new.vm_state.map(|s| {
            match s {
                VmState::Pending => vm_states::PENDING,
                VmState::Running => vm_states::RUNNING,
                VmState::Failed => vm_states::FAILED,
                VmState::Deleting => vm_states::DELETING,
                VmState::Unknown => vm_states::UNKNOWN,
            }
            .to_string()
        }),
        addresses: new.addresses.clone(),
        failure_reason: None,
        failure_message: None,
        conditions: conditions::down(&new.conditions),
    }
}
