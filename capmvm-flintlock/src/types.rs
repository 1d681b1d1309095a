//! Domain types for microVMs, and the only place that converts them to and from the generated
//! protobuf types.
//!
//! Field meaning follows flintlock (`flintlock-and-reference.md` A1.2, A2.6): on the way back the
//! host drops `labels`, `provider`, timestamps and volume `mount_point`, defaults `namespace`,
//! `vcpu` and `memory_mb`, sets `uid`, injects `instance_id` into `meta-data` and (Firecracker)
//! prepends an `eth0` interface.

use std::collections::BTreeMap;
use std::fmt;

use crate::error::Error;
use crate::proto::types as pb;

/// What to create: one microVM's specification.
///
/// `Debug` prints the keys of [`metadata`](Self::metadata) with their byte lengths only: the values
/// carry cloud-init user-data, which holds bootstrap secrets.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct MicrovmSpec {
    /// The microVM's name (flintlock `id`); required by flintlock.
    pub id: String,
    /// The flintlock namespace; empty means `default` on the host.
    pub namespace: String,
    /// Labels. Flintlock accepts and drops them (they never come back).
    pub labels: BTreeMap<String, String>,
    /// Virtual CPUs; 0 means the host default (2). Flintlock accepts 1 to 64.
    pub vcpu: i32,
    /// Memory in MiB; 0 means the host default (1024). Flintlock accepts 1024 to 32768.
    pub memory_mb: i32,
    /// The kernel to boot.
    pub kernel: Kernel,
    /// An optional initial ramdisk.
    pub initrd: Option<Initrd>,
    /// The root volume. Flintlock requires a root volume or an initrd.
    pub root_volume: Option<Volume>,
    /// Further volumes.
    pub additional_volumes: Vec<Volume>,
    /// Network interfaces; flintlock requires at least one.
    pub interfaces: Vec<NetworkInterface>,
    /// Metadata served to the guest: keys such as `meta-data`, `user-data`, `vendor-data`, values
    /// base64-encoded documents. Secret: never logged.
    pub metadata: BTreeMap<String, String>,
    /// The host-generated identifier (a 26-character ULID). Ignored on create; always set on
    /// microVMs returned by the host.
    pub uid: Option<String>,
    /// The provider (`firecracker`, `cloudhypervisor`); `None` means the host's default. Not echoed.
    pub provider: Option<String>,
    /// Attach a vsock device for the in-guest agent (needs provider capability `vsock`).
    pub allow_guest_agent: bool,
}

impl fmt::Debug for MicrovmSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Length(usize);
        impl fmt::Debug for Length {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "<{} bytes>", self.0)
            }
        }
        struct RedactedMetadata<'a>(&'a BTreeMap<String, String>);
        impl fmt::Debug for RedactedMetadata<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_map()
                    .entries(self.0.iter().map(|(key, value)| (key, Length(value.len()))))
                    .finish()
            }
        }
        f.debug_struct("MicrovmSpec")
            .field("id", &self.id)
            .field("namespace", &self.namespace)
            .field("labels", &self.labels)
            .field("vcpu", &self.vcpu)
            .field("memory_mb", &self.memory_mb)
            .field("kernel", &self.kernel)
            .field("initrd", &self.initrd)
            .field("root_volume", &self.root_volume)
            .field("additional_volumes", &self.additional_volumes)
            .field("interfaces", &self.interfaces)
            .field("metadata", &RedactedMetadata(&self.metadata))
            .field("uid", &self.uid)
            .field("provider", &self.provider)
            .field("allow_guest_agent", &self.allow_guest_agent)
            .finish()
    }
}

/// The kernel: a file inside a container image.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Kernel {
    /// The container image holding the kernel.
    pub image: String,
    /// The kernel's path inside the image (flintlock requires it when `image` is set).
    pub filename: Option<String>,
    /// Kernel command-line entries (an empty value is a bare flag).
    pub cmdline: BTreeMap<String, String>,
    /// Let the host generate the guest's network configuration.
    pub add_network_config: bool,
}

/// An initial ramdisk: a file inside a container image.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Initrd {
    /// The container image holding the initrd.
    pub image: String,
    /// The initrd's path inside the image (flintlock applies no default).
    pub filename: Option<String>,
}

/// A volume attached to the microVM.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Volume {
    /// The volume's identifier (unique within the microVM).
    pub id: String,
    /// Attach read-only.
    pub is_read_only: bool,
    /// Where cloud-init mounts an additional volume in the guest. Input only: never echoed.
    pub mount_point: Option<String>,
    /// Where the volume's content comes from.
    pub source: VolumeSource,
    /// The partition UUID to boot from.
    pub partition_id: Option<String>,
    /// Resize the volume to this many MiB.
    pub size_in_mb: Option<i32>,
}

/// Where a volume's content comes from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeSource {
    /// A container image.
    pub container_source: Option<String>,
    /// A host path shared with virtiofs (Cloud Hypervisor only).
    pub virtiofs_source: Option<String>,
}

/// A network interface of the guest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetworkInterface {
    /// The guest device name (`eth1`, ...). Flintlock reserves `eth0` for its metadata interface in
    /// Firecracker mode.
    pub device_id: String,
    /// The host-side interface type.
    pub iface_type: IfaceType,
    /// The guest MAC address; `None` lets the host choose.
    pub guest_mac: Option<String>,
    /// A static address; `None` means DHCP.
    pub address: Option<StaticAddress>,
}

/// The host-side interface type.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum IfaceType {
    /// A macvtap interface (Cloud Hypervisor only; Firecracker rejects it).
    Macvtap,
    /// A tap interface. The default here, because flintlock's default provider rejects macvtap (the
    /// wire's zero value).
    #[default]
    Tap,
    /// A value this client does not know (a newer flintlock).
    Unknown(i32),
}

/// A static address of a guest interface.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StaticAddress {
    /// The address in CIDR notation (`10.0.0.5/24`).
    pub address: String,
    /// The default gateway, also in CIDR notation (flintlock validates it as a CIDR).
    pub gateway: Option<String>,
    /// DNS servers (IP addresses).
    pub nameservers: Vec<String>,
}

/// A microVM as stored on the host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Microvm {
    /// The record's revision: 1 after create, +1 on each change.
    pub version: i32,
    /// The stored spec (with the host's defaults and additions).
    pub spec: MicrovmSpec,
    /// What the host last recorded about it.
    pub status: MicrovmStatus,
}

impl Microvm {
    /// The host-generated identifier (empty if the host sent none, which flintlock never does).
    pub fn uid(&self) -> &str {
        self.spec.uid.as_deref().unwrap_or_default()
    }
}

/// The host's record of a microVM's progress.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MicrovmStatus {
    /// The lifecycle state.
    pub state: MicrovmState,
    /// Failed reconcile attempts since the last success (FAILED once it exceeds the host's limit).
    pub retry: i32,
    /// The host path of the guest-agent vsock socket; empty unless the guest agent is allowed.
    pub vsock_path: String,
    /// Volume mounts by volume id.
    pub volumes: BTreeMap<String, VolumeStatus>,
    /// Where the kernel image is mounted on the host.
    pub kernel_mount: Option<Mount>,
    /// Where the initrd image is mounted on the host.
    pub initrd_mount: Option<Mount>,
    /// Host-side interfaces by guest device name.
    pub network_interfaces: BTreeMap<String, NetworkInterfaceStatus>,
}

/// A microVM's lifecycle state as flintlock records it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum MicrovmState {
    /// Accepted; being (re)created, possibly after failed attempts.
    #[default]
    Pending,
    /// The VMM process was started (not necessarily booted).
    Created,
    /// Gave up after too many failed attempts. Terminal.
    Failed,
    /// Being deleted; disappears when done.
    Deleting,
    /// A value this client does not know (a newer flintlock).
    Unknown(i32),
}

/// A volume's mount on the host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeStatus {
    /// The mount, if the host recorded one.
    pub mount: Option<Mount>,
}

/// A mount on the host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mount {
    /// Block device or directory.
    pub mount_type: MountType,
    /// The device path or directory.
    pub source: String,
}

/// The kind of a host mount.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum MountType {
    /// A block device (devmapper snapshots).
    #[default]
    Dev,
    /// A directory on the host (`native` snapshotter).
    Hostpath,
    /// A value this client does not know.
    Unknown(i32),
}

/// A host-side network interface.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetworkInterfaceStatus {
    /// The host device name (`fltap...`, `flvtap...`).
    pub host_device_name: String,
    /// The host interface index.
    pub index: i32,
    /// The host interface's MAC address.
    pub mac_address: String,
}

// ---------------------------------------------------------------------------------------------------
// Domain -> wire.

impl From<&MicrovmSpec> for pb::MicroVmSpec {
    fn from(spec: &MicrovmSpec) -> Self {
        pb::MicroVmSpec {
            id: spec.id.clone(),
            namespace: spec.namespace.clone(),
            labels: spec.labels.clone(),
            vcpu: spec.vcpu,
            memory_in_mb: spec.memory_mb,
            kernel: Some(pb::Kernel::from(&spec.kernel)),
            initrd: spec.initrd.as_ref().map(pb::Initrd::from),
            root_volume: spec.root_volume.as_ref().map(pb::Volume::from),
            additional_volumes: spec
                .additional_volumes
                .iter()
                .map(pb::Volume::from)
                .collect(),
            interfaces: spec
                .interfaces
                .iter()
                .map(pb::NetworkInterface::from)
                .collect(),
            metadata: spec.metadata.clone(),
            created_at: None,
            updated_at: None,
            deleted_at: None,
            uid: spec.uid.clone(),
            provider: spec.provider.clone(),
            allow_guest_agent: spec.allow_guest_agent,
        }
    }
}

impl From<&Kernel> for pb::Kernel {
    fn from(kernel: &Kernel) -> Self {
        pb::Kernel {
            image: kernel.image.clone(),
            cmdline: kernel.cmdline.clone(),
            filename: kernel.filename.clone(),
            add_network_config: kernel.add_network_config,
        }
    }
}

impl From<&Initrd> for pb::Initrd {
    fn from(initrd: &Initrd) -> Self {
        pb::Initrd {
            image: initrd.image.clone(),
            filename: initrd.filename.clone(),
        }
    }
}

impl From<&Volume> for pb::Volume {
    fn from(volume: &Volume) -> Self {
        pb::Volume {
            id: volume.id.clone(),
            is_read_only: volume.is_read_only,
            mount_point: volume.mount_point.clone(),
            source: Some(pb::VolumeSource {
                container_source: volume.source.container_source.clone(),
                virtiofs_source: volume.source.virtiofs_source.clone(),
            }),
            partition_id: volume.partition_id.clone(),
            size_in_mb: volume.size_in_mb,
        }
    }
}

impl From<&NetworkInterface> for pb::NetworkInterface {
    fn from(iface: &NetworkInterface) -> Self {
        pb::NetworkInterface {
            device_id: iface.device_id.clone(),
            r#type: i32::from(iface.iface_type),
            guest_mac: iface.guest_mac.clone(),
            address: iface.address.as_ref().map(|address| pb::StaticAddress {
                address: address.address.clone(),
                gateway: address.gateway.clone(),
                nameservers: address.nameservers.clone(),
            }),
            overrides: None,
        }
    }
}

impl From<IfaceType> for i32 {
    fn from(iface_type: IfaceType) -> Self {
        match iface_type {
            IfaceType::Macvtap => pb::network_interface::IfaceType::Macvtap as i32,
            IfaceType::Tap => pb::network_interface::IfaceType::Tap as i32,
            IfaceType::Unknown(value) => value,
        }
    }
}

impl From<MicrovmState> for i32 {
    fn from(state: MicrovmState) -> Self {
        use pb::micro_vm_status::MicroVmState as S;
        match state {
            MicrovmState::Pending => S::Pending as i32,
            MicrovmState::Created => S::Created as i32,
            MicrovmState::Failed => S::Failed as i32,
            MicrovmState::Deleting => S::Deleting as i32,
            MicrovmState::Unknown(value) => value,
        }
    }
}

impl From<MountType> for i32 {
    fn from(mount_type: MountType) -> Self {
        match mount_type {
            MountType::Dev => pb::mount::MountType::Dev as i32,
            MountType::Hostpath => pb::mount::MountType::Hostpath as i32,
            MountType::Unknown(value) => value,
        }
    }
}

impl From<&Mount> for pb::Mount {
    fn from(mount: &Mount) -> Self {
        pb::Mount {
            r#type: i32::from(mount.mount_type),
            source: mount.source.clone(),
        }
    }
}

impl From<&MicrovmStatus> for pb::MicroVmStatus {
    fn from(status: &MicrovmStatus) -> Self {
        pb::MicroVmStatus {
            state: i32::from(status.state),
            volumes: status
                .volumes
                .iter()
                .map(|(id, volume)| {
                    (
                        id.clone(),
                        pb::VolumeStatus {
                            mount: volume.mount.as_ref().map(pb::Mount::from),
                        },
                    )
                })
                .collect(),
            kernel_mount: status.kernel_mount.as_ref().map(pb::Mount::from),
            initrd_mount: status.initrd_mount.as_ref().map(pb::Mount::from),
            network_interfaces: status
                .network_interfaces
                .iter()
                .map(|(name, iface)| {
                    (
                        name.clone(),
                        pb::NetworkInterfaceStatus {
                            host_device_name: iface.host_device_name.clone(),
                            index: iface.index,
                            mac_address: iface.mac_address.clone(),
                        },
                    )
                })
                .collect(),
            retry: status.retry,
            vsock_path: status.vsock_path.clone(),
        }
    }
}

impl From<&Microvm> for pb::MicroVm {
    fn from(microvm: &Microvm) -> Self {
        pb::MicroVm {
            version: microvm.version,
            spec: Some(pb::MicroVmSpec::from(&microvm.spec)),
            status: Some(pb::MicroVmStatus::from(&microvm.status)),
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Wire -> domain. Absent optional messages become their defaults, as in flintlock's own converters;
// only a microVM without a spec is refused (it would have no identity).

impl From<i32> for IfaceType {
    fn from(value: i32) -> Self {
        match pb::network_interface::IfaceType::try_from(value) {
            Ok(pb::network_interface::IfaceType::Macvtap) => IfaceType::Macvtap,
            Ok(pb::network_interface::IfaceType::Tap) => IfaceType::Tap,
            Err(_) => IfaceType::Unknown(value),
        }
    }
}

impl From<i32> for MicrovmState {
    fn from(value: i32) -> Self {
        use pb::micro_vm_status::MicroVmState as S;
        match S::try_from(value) {
            Ok(S::Pending) => MicrovmState::Pending,
            Ok(S::Created) => MicrovmState::Created,
            Ok(S::Failed) => MicrovmState::Failed,
            Ok(S::Deleting) => MicrovmState::Deleting,
            Err(_) => MicrovmState::Unknown(value),
        }
    }
}

impl From<i32> for MountType {
    fn from(value: i32) -> Self {
        match pb::mount::MountType::try_from(value) {
            Ok(pb::mount::MountType::Dev) => MountType::Dev,
            Ok(pb::mount::MountType::Hostpath) => MountType::Hostpath,
            Err(_) => MountType::Unknown(value),
        }
    }
}

impl From<pb::Mount> for Mount {
    fn from(mount: pb::Mount) -> Self {
        Mount {
            mount_type: MountType::from(mount.r#type),
            source: mount.source,
        }
    }
}

impl From<pb::Volume> for Volume {
    fn from(volume: pb::Volume) -> Self {
        let source = volume.source.unwrap_or_default();
        Volume {
            id: volume.id,
            is_read_only: volume.is_read_only,
            mount_point: volume.mount_point,
            source: VolumeSource {
                container_source: source.container_source,
                virtiofs_source: source.virtiofs_source,
            },
            partition_id: volume.partition_id,
            size_in_mb: volume.size_in_mb,
        }
    }
}

impl From<pb::NetworkInterface> for NetworkInterface {
    fn from(iface: pb::NetworkInterface) -> Self {
        NetworkInterface {
            device_id: iface.device_id,
            iface_type: IfaceType::from(iface.r#type),
            guest_mac: iface.guest_mac,
            address: iface.address.map(|address| StaticAddress {
                address: address.address,
                gateway: address.gateway,
                nameservers: address.nameservers,
            }),
        }
    }
}

impl From<pb::MicroVmSpec> for MicrovmSpec {
    fn from(spec: pb::MicroVmSpec) -> Self {
        let kernel = spec.kernel.unwrap_or_default();
        MicrovmSpec {
            id: spec.id,
            namespace: spec.namespace,
            labels: spec.labels,
            vcpu: spec.vcpu,
            memory_mb: spec.memory_in_mb,
            kernel: Kernel {
                image: kernel.image,
                filename: kernel.filename,
                cmdline: kernel.cmdline,
                add_network_config: kernel.add_network_config,
            },
            initrd: spec.initrd.map(|initrd| Initrd {
                image: initrd.image,
                filename: initrd.filename,
            }),
            root_volume: spec.root_volume.map(Volume::from),
            additional_volumes: spec
                .additional_volumes
                .into_iter()
                .map(Volume::from)
                .collect(),
            interfaces: spec
                .interfaces
                .into_iter()
                .map(NetworkInterface::from)
                .collect(),
            metadata: spec.metadata,
            uid: spec.uid,
            provider: spec.provider,
            allow_guest_agent: spec.allow_guest_agent,
        }
    }
}

impl From<pb::MicroVmStatus> for MicrovmStatus {
    fn from(status: pb::MicroVmStatus) -> Self {
        MicrovmStatus {
            state: MicrovmState::from(status.state),
            retry: status.retry,
            vsock_path: status.vsock_path,
            volumes: status
                .volumes
                .into_iter()
                .map(|(id, volume)| {
                    (
                        id,
                        VolumeStatus {
                            mount: volume.mount.map(Mount::from),
                        },
                    )
                })
                .collect(),
            kernel_mount: status.kernel_mount.map(Mount::from),
            initrd_mount: status.initrd_mount.map(Mount::from),
            network_interfaces: status
                .network_interfaces
                .into_iter()
                .map(|(name, iface)| {
                    (
                        name,
                        NetworkInterfaceStatus {
                            host_device_name: iface.host_device_name,
                            index: iface.index,
                            mac_address: iface.mac_address,
                        },
                    )
                })
                .collect(),
        }
    }
}

impl TryFrom<pb::MicroVm> for Microvm {
    type Error = Error;

    fn try_from(microvm: pb::MicroVm) -> Result<Self, Error> {
        let spec = microvm
            .spec
            .ok_or_else(|| Error::protocol("the host returned a microvm without a spec"))?;
        Ok(Microvm {
            version: microvm.version,
            spec: MicrovmSpec::from(spec),
            status: microvm.status.map(MicrovmStatus::from).unwrap_or_default(),
        })
    }
}

/// Converts an optional wire microVM (the `microvm` field of a response) into the domain type.
pub(crate) fn microvm_from_response(microvm: Option<pb::MicroVm>) -> Result<Microvm, Error> {
    Microvm::try_from(
        microvm.ok_or_else(|| Error::protocol("the host's response carried no microvm"))?,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full_spec() -> MicrovmSpec {
        MicrovmSpec {
            id: "vm-1".into(),
            namespace: "ns".into(),
            labels: BTreeMap::from([("a".into(), "b".into())]),
            vcpu: 4,
            memory_mb: 2048,
            kernel: Kernel {
                image: "ghcr.io/x/kernel:1".into(),
                filename: Some("boot/vmlinux".into()),
                cmdline: BTreeMap::from([("console".into(), "ttyS0".into())]),
                add_network_config: true,
            },
            initrd: Some(Initrd {
                image: "ghcr.io/x/initrd:1".into(),
                filename: None,
            }),
            root_volume: Some(Volume {
                id: "root".into(),
                is_read_only: false,
                mount_point: None,
                source: VolumeSource {
                    container_source: Some("ghcr.io/x/root:1".into()),
                    virtiofs_source: None,
                },
                partition_id: Some("p".into()),
                size_in_mb: Some(100),
            }),
            additional_volumes: vec![Volume {
                id: "data".into(),
                mount_point: Some("/data".into()),
                ..Volume::default()
            }],
            interfaces: vec![NetworkInterface {
                device_id: "eth1".into(),
                iface_type: IfaceType::Tap,
                guest_mac: Some("aa:bb:cc:dd:ee:ff".into()),
                address: Some(StaticAddress {
                    address: "10.0.0.2/24".into(),
                    gateway: Some("10.0.0.1/24".into()),
                    nameservers: vec!["1.1.1.1".into()],
                }),
            }],
            metadata: BTreeMap::from([("user-data".into(), "c2VjcmV0LXRva2Vu".into())]),
            uid: Some("01KE75BHT9H6D7V5YG0KYGRXX2".into()),
            provider: Some("firecracker".into()),
            allow_guest_agent: true,
        }
    }

    #[test]
    fn spec_round_trips_through_the_wire_types() {
        let spec = full_spec();
        let wire = pb::MicroVmSpec::from(&spec);
        assert_eq!(MicrovmSpec::from(wire), spec);
    }

    #[test]
    fn microvm_round_trips_with_status() {
        let microvm = Microvm {
            version: 2,
            spec: full_spec(),
            status: MicrovmStatus {
                state: MicrovmState::Created,
                retry: 1,
                vsock_path: "/run/x.vsock".into(),
                volumes: BTreeMap::from([(
                    "root".into(),
                    VolumeStatus {
                        mount: Some(Mount {
                            mount_type: MountType::Dev,
                            source: "/dev/x".into(),
                        }),
                    },
                )]),
                kernel_mount: Some(Mount {
                    mount_type: MountType::Hostpath,
                    source: "/k".into(),
                }),
                initrd_mount: None,
                network_interfaces: BTreeMap::from([(
                    "eth1".into(),
                    NetworkInterfaceStatus {
                        host_device_name: "fltap1234567".into(),
                        index: 7,
                        mac_address: "m".into(),
                    },
                )]),
            },
        };
        let wire = pb::MicroVm::from(&microvm);
        assert_eq!(Microvm::try_from(wire).unwrap(), microvm);
    }

    /// Pins field numbers and wire types against flintlock's tables (A1): tag byte = number << 3 |
    /// wire type (0 varint, 2 length-delimited).
    #[test]
    fn wire_encoding_uses_flintlocks_field_numbers() {
        use prost::Message as _;
        let spec = pb::MicroVmSpec {
            id: "a".into(),
            vcpu: 2,
            uid: Some("U".into()),
            allow_guest_agent: true,
            ..Default::default()
        };
        // id=1 (0x0a), vcpu=4 (0x20), uid=15 (0x7a), allow_guest_agent=17 (0x88 0x01).
        assert_eq!(
            spec.encode_to_vec(),
            vec![0x0a, 1, b'a', 0x20, 2, 0x7a, 1, b'U', 0x88, 0x01, 1]
        );
        let iface = pb::NetworkInterface {
            device_id: "e".into(),
            r#type: 1,
            guest_mac: Some("m".into()),
            address: Some(pb::StaticAddress {
                address: "c".into(),
                gateway: Some("g".into()),
                nameservers: vec![],
            }),
            overrides: None,
        };
        // device_id=1, type=2, guest_mac=4 (0x22), address=5 (0x2a) { address=1, gateway=2 }.
        assert_eq!(
            iface.encode_to_vec(),
            vec![
                0x0a, 1, b'e', 0x10, 1, 0x22, 1, b'm', 0x2a, 6, 0x0a, 1, b'c', 0x12, 1, b'g'
            ]
        );
        let volume = pb::Volume {
            size_in_mb: Some(0),
            partition_id: Some(String::new()),
            ..Default::default()
        };
        // Explicit presence: partition_id=5 (0x2a) and size_in_mb=6 (0x30) are sent even when empty.
        assert_eq!(volume.encode_to_vec(), vec![0x2a, 0, 0x30, 0]);
        let status = pb::MicroVmStatus {
            state: 3,
            retry: 1,
            vsock_path: "v".into(),
            ..Default::default()
        };
        // state=1 (0x08), retry=6 (0x30), vsock_path=7 (0x3a).
        assert_eq!(
            status.encode_to_vec(),
            vec![0x08, 3, 0x30, 1, 0x3a, 1, b'v']
        );
        let list = crate::proto::services::ListMicroVMsRequest {
            namespace: "n".into(),
            name: Some(String::new()),
        };
        assert_eq!(list.encode_to_vec(), vec![0x0a, 1, b'n', 0x12, 0]);
    }

    #[test]
    fn unknown_enum_values_are_kept() {
        assert_eq!(MicrovmState::from(9), MicrovmState::Unknown(9));
        assert_eq!(i32::from(MicrovmState::Unknown(9)), 9);
        assert_eq!(IfaceType::from(0), IfaceType::Macvtap);
        assert_eq!(IfaceType::from(1), IfaceType::Tap);
        assert_eq!(IfaceType::from(5), IfaceType::Unknown(5));
    }

    #[test]
    fn microvm_without_spec_is_a_protocol_error() {
        let err = Microvm::try_from(pb::MicroVm::default()).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Other);
        assert!(microvm_from_response(None).is_err());
    }

    #[test]
    fn debug_redacts_metadata_values() {
        let text = format!("{:?}", full_spec());
        assert!(text.contains("\"user-data\": <16 bytes>"), "{text}");
        assert!(!text.contains("c2VjcmV0LXRva2Vu"), "{text}");
    }
}
