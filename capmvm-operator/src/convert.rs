//! The one place the engine's microVM request becomes the flintlock client's, and the client's error
//! kinds the engine's (the engine cannot depend on the gRPC crate). The types mirror each other
//! field for field, variant for variant.

use capmvm_flintlock as fl;
use capmvm_reconcile::host_call::HostErrorKind;
use capmvm_reconcile::microvm as engine;

/// The client's spec for the engine's request.
pub fn to_flintlock(spec: &engine::MicrovmSpec) -> fl::MicrovmSpec {
    fl::MicrovmSpec {
        id: spec.id.clone(),
        namespace: spec.namespace.clone(),
        labels: spec.labels.clone(),
        vcpu: spec.vcpu,
        memory_mb: spec.memory_mb,
        kernel: fl::Kernel {
            image: spec.kernel.image.clone(),
            filename: spec.kernel.filename.clone(),
            cmdline: spec.kernel.cmdline.clone(),
            add_network_config: spec.kernel.add_network_config,
        },
        initrd: spec.initrd.as_ref().map(|i| fl::Initrd {
            image: i.image.clone(),
            filename: i.filename.clone(),
        }),
        root_volume: spec.root_volume.as_ref().map(volume),
        additional_volumes: spec.additional_volumes.iter().map(volume).collect(),
        interfaces: spec
            .interfaces
            .iter()
            .map(|nic| fl::NetworkInterface {
                device_id: nic.device_id.clone(),
                iface_type: match nic.iface_type {
                    engine::IfaceType::Tap => fl::IfaceType::Tap,
                    engine::IfaceType::Macvtap => fl::IfaceType::Macvtap,
                },
                guest_mac: nic.guest_mac.clone(),
                address: nic.address.as_ref().map(|a| fl::StaticAddress {
                    address: a.address.clone(),
                    gateway: a.gateway.clone(),
                    nameservers: a.nameservers.clone(),
                }),
            })
            .collect(),
        metadata: spec.metadata.clone(),
        uid: None,
        provider: spec.provider.clone(),
        allow_guest_agent: false,
    }
}

fn volume(v: &engine::Volume) -> fl::Volume {
    fl::Volume {
        id: v.id.clone(),
        is_read_only: v.is_read_only,
        mount_point: v.mount_point.clone(),
        source: fl::VolumeSource {
            container_source: v.source.container_source.clone(),
            virtiofs_source: v.source.virtiofs_source.clone(),
        },
        partition_id: None,
        size_in_mb: None,
    }
}

/// The engine's name for the client's error kind (what it amounts to is the engine's judgement).
pub fn host_error_kind(kind: fl::ErrorKind) -> HostErrorKind {
    match kind {
        fl::ErrorKind::NotFound => HostErrorKind::NotFound,
        fl::ErrorKind::Unauthenticated => HostErrorKind::Unauthenticated,
        fl::ErrorKind::InvalidArgument => HostErrorKind::InvalidArgument,
        fl::ErrorKind::Unavailable => HostErrorKind::Unavailable,
        fl::ErrorKind::DeadlineExceeded => HostErrorKind::DeadlineExceeded,
        fl::ErrorKind::InvalidConfig => HostErrorKind::InvalidConfig,
        fl::ErrorKind::Other => HostErrorKind::Other,
    }
}
