//! The microVM to ask a host for, and how a MicrovmMachine maps to it (the Go provider's mapping, B2.8).
//!
//! The types mirror flintlock's domain types field for field, so the operator's conversion to the
//! client's types is a plain copy; this crate cannot depend on the gRPC crate.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use capmvm_api::{
    IfaceType as ApiIfaceType, MicrovmMachine, NetworkInterface as ApiInterface,
    Volume as ApiVolume,
};
use ipnet::IpNet;
use kube::ResourceExt;

/// A microVM to create.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct MicrovmSpec {
    /// Name: the MicrovmMachine's name.
    pub id: String,
    /// Namespace: the MicrovmMachine's namespace.
    pub namespace: String,
    /// Labels (flintlock drops them today).
    pub labels: BTreeMap<String, String>,
    /// vCPUs.
    pub vcpu: i32,
    /// Memory in MiB.
    pub memory_mb: i32,
    /// Kernel.
    pub kernel: Kernel,
    /// Initial ramdisk.
    pub initrd: Option<Initrd>,
    /// Root volume.
    pub root_volume: Option<Volume>,
    /// Additional volumes.
    pub additional_volumes: Vec<Volume>,
    /// Network interfaces.
    pub interfaces: Vec<NetworkInterface>,
    /// cloud-init documents, base64-encoded; user-data holds bootstrap secrets.
    pub metadata: BTreeMap<String, String>,
    /// VMM provider; `None` is the host's default.
    pub provider: Option<String>,
}

impl fmt::Debug for MicrovmSpec {
    // Metadata carries bootstrap data: print its keys and sizes only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let metadata: BTreeMap<&str, String> = self
            .metadata
            .iter()
            .map(|(k, v)| (k.as_str(), format!("<{} bytes>", v.len())))
            .collect();
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
            .field("metadata", &metadata)
            .field("provider", &self.provider)
            .finish()
    }
}

/// Kernel of a microVM.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Kernel {
    /// Container image.
    pub image: String,
    /// File in the image.
    pub filename: Option<String>,
    /// Extra command-line arguments.
    pub cmdline: BTreeMap<String, String>,
    /// Let flintlock generate the guest network config (the Go provider always sets it).
    pub add_network_config: bool,
}

/// Initial ramdisk.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Initrd {
    /// Container image.
    pub image: String,
    /// File in the image.
    pub filename: Option<String>,
}

/// A volume.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Volume {
    /// Id.
    pub id: String,
    /// Read-only.
    pub is_read_only: bool,
    /// Guest mount point (cloud-init mounts it).
    pub mount_point: Option<String>,
    /// Where the content comes from.
    pub source: VolumeSource,
}

/// Source of a volume.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct VolumeSource {
    /// Container image.
    pub container_source: Option<String>,
    /// Host path shared with virtiofs.
    pub virtiofs_source: Option<String>,
}

/// A network interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkInterface {
    /// Guest device name.
    pub device_id: String,
    /// Host-side type.
    pub iface_type: IfaceType,
    /// Guest MAC.
    pub guest_mac: Option<String>,
    /// Static address.
    pub address: Option<StaticAddress>,
}

/// Host-side interface type (flintlock's enum: MACVTAP = 0, TAP = 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IfaceType {
    /// macvtap.
    Macvtap,
    /// tap.
    Tap,
}

/// A static address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaticAddress {
    /// CIDR.
    pub address: String,
    /// Gateway as CIDR (flintlock validates it as one).
    pub gateway: Option<String>,
    /// DNS servers.
    pub nameservers: Vec<String>,
}

/// Maps a (valid) MicrovmMachine to the microVM to create, with the given cloud-init metadata.
///
/// Differences from the Go provider: a missing guest MAC is derived from the machine's origin uid and the
/// interface index (stable across retries, instead of random per call), `cluster-name` is added to a
/// copy of the labels (the object is not mutated), and gateway and nameservers are passed on.
pub fn build_spec(
    machine: &MicrovmMachine,
    cluster_name: &str,
    metadata: BTreeMap<String, String>,
) -> MicrovmSpec {
    let spec = &machine.spec;
    let uid = crate::machine::origin_uid(machine).unwrap_or_default();
    let mut labels = spec.labels.clone();
    labels.insert(
        capmvm_api::keys::MICROVM_CLUSTER_NAME_LABEL.to_string(),
        cluster_name.to_string(),
    );
    MicrovmSpec {
        id: machine.name_any(),
        namespace: machine.namespace().unwrap_or_default(),
        labels,
        // Validation bounds both to flintlock's ranges, far inside i32.
        vcpu: i32::try_from(spec.vcpu).unwrap_or(i32::MAX),
        memory_mb: i32::try_from(spec.memory_mb).unwrap_or(i32::MAX),
        kernel: Kernel {
            image: spec.kernel.image.clone(),
            filename: Some(spec.kernel.filename.clone()),
            cmdline: spec.kernel_cmdline.clone(),
            add_network_config: true,
        },
        initrd: spec.initrd.as_ref().map(|i| Initrd {
            image: i.image.clone(),
            filename: i.filename.clone(),
        }),
        root_volume: Some(volume(&spec.root_volume)),
        additional_volumes: spec.volumes.iter().map(volume).collect(),
        interfaces: spec
            .network_interfaces
            .iter()
            .enumerate()
            .map(|(i, nic)| interface(nic, uid, i))
            .collect(),
        metadata,
        provider: spec.provider.map(|p| p.as_str().to_string()),
    }
}

fn volume(v: &ApiVolume) -> Volume {
    Volume {
        id: v.id.clone(),
        is_read_only: v.read_only,
        mount_point: v.mount_point.clone(),
        source: VolumeSource {
            container_source: v.image.clone(),
            virtiofs_source: v.virtiofs_path.clone(),
        },
    }
}

fn interface(nic: &ApiInterface, machine_uid: &str, index: usize) -> NetworkInterface {
    let address = nic.address.as_ref().map(|address| StaticAddress {
        address: address.clone(),
        gateway: nic.gateway.as_deref().map(|gw| gateway_cidr(gw, address)),
        nameservers: nic.nameservers.clone(),
    });
    NetworkInterface {
        device_id: nic.guest_device_name.clone(),
        iface_type: match nic.iface_type {
            ApiIfaceType::Tap => IfaceType::Tap,
            ApiIfaceType::Macvtap => IfaceType::Macvtap,
        },
        guest_mac: Some(
            nic.guest_mac
                .clone()
                .unwrap_or_else(|| derived_mac(machine_uid, index)),
        ),
        address,
    }
}

/// Flintlock validates the gateway as a CIDR and uses its IP part; a plain IP gets the address' prefix.
fn gateway_cidr(gateway: &str, address: &str) -> String {
    match (gateway.parse::<IpAddr>(), address.parse::<IpNet>()) {
        (Ok(ip), Ok(net)) => format!("{ip}/{}", net.prefix_len()),
        _ => gateway.to_string(),
    }
}

/// A locally administered unicast MAC (`02:..`) derived from the machine uid and interface index, so
/// every retry asks for the same MAC and a DHCP lease survives re-creation of the request.
pub fn derived_mac(machine_uid: &str, index: usize) -> String {
    let hash = fnv1a64(format!("{machine_uid}/{index}").as_bytes()).to_be_bytes();
    format!(
        "02:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        hash[0], hash[1], hash[2], hash[3], hash[4]
    )
}

/// FNV-1a, 64 bit: small, stable across platforms and releases (unlike `std`'s hasher).
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    fnv1a64_extend(FNV1A64_OFFSET, bytes)
}

/// FNV-1a's starting state.
pub const FNV1A64_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a of `bytes` continued from `hash`: extending the hash of `a` with `b` gives the hash of `a`
/// followed by `b`, without building that string.
pub fn fnv1a64_extend(mut hash: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_extended_hash_is_the_hash_of_the_concatenation() {
        let joined = fnv1a64(b"default/m1|10.0.0.1:9090");
        let streamed = fnv1a64_extend(
            fnv1a64_extend(fnv1a64(b"default/m1"), b"|"),
            b"10.0.0.1:9090",
        );
        assert_eq!(streamed, joined);
        assert_eq!(fnv1a64(b""), FNV1A64_OFFSET);
    }

    #[test]
    fn derived_macs_are_stable_local_unicast_and_distinct_per_interface() {
        let a = derived_mac("5a1c7e0e-1111-2222-3333-444455556666", 0);
        assert_eq!(a, derived_mac("5a1c7e0e-1111-2222-3333-444455556666", 0));
        assert_ne!(a, derived_mac("5a1c7e0e-1111-2222-3333-444455556666", 1));
        assert_ne!(a, derived_mac("another-uid", 0));
        let first = u8::from_str_radix(&a[..2], 16).unwrap();
        assert_eq!(first & 0b11, 0b10, "locally administered, unicast");
        assert!(capmvm_api::validation::parse_mac(&a).is_some());
    }

    #[test]
    fn gateway_gets_the_address_prefix() {
        assert_eq!(gateway_cidr("10.0.0.1", "10.0.0.12/24"), "10.0.0.1/24");
        assert_eq!(gateway_cidr("10.0.0.1/16", "10.0.0.12/24"), "10.0.0.1/16");
        assert_eq!(gateway_cidr("fd00::1", "fd00::12/64"), "fd00::1/64");
    }
}
