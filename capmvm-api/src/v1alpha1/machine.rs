//! The Go provider's MicrovmMachine (`v1alpha1`): its `VMSpec` inline, SSH keys and providerID.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

use super::{Condition, SshPublicKey};
use crate::MachineAddress;
use crate::schema;

/// Desired state of a `v1alpha1` MicrovmMachine.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "MicrovmMachine",
    plural = "microvmmachines",
    namespaced,
    status = "MicrovmMachineStatus",
    derive = "PartialEq",
    doc = "MicrovmMachine at v1alpha1, the Go provider's version: one Cluster API Machine's microVM."
)]
#[serde(rename_all = "camelCase")]
pub struct MicrovmMachineSpec {
    /// The flintlock VMM provider's name; empty means the host's default.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub provider: String,

    /// Number of vCPUs.
    #[schemars(range(min = 1))]
    pub vcpu: i64,

    /// Memory in MiB.
    #[schemars(range(min = 1024))]
    pub memory_mb: i64,

    /// The root volume.
    pub root_volume: Volume,

    /// Additional volumes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,

    /// The kernel.
    pub kernel: ContainerFileSource,

    /// Extra kernel command-line arguments.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kernel_cmdline: BTreeMap<String, String>,

    /// An initial ramdisk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd: Option<ContainerFileSource>,

    /// Network interfaces of the guest.
    #[schemars(length(min = 1))]
    pub network_interfaces: Vec<NetworkInterface>,

    /// Labels for the microVM (the Go provider adds `cluster-name` here itself when it creates one).
    /// Its JSON writes `null` for none, which is read as empty.
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub labels: BTreeMap<String, String>,

    /// SSH users and keys for this machine; they replace the MicrovmCluster's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ssh_public_keys: Vec<SshPublicKey>,

    /// `microvm://<failure domain>/<flintlock uid>`, set by the provider.
    #[serde(
        rename = "providerID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
}

fn null_as_empty<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    Ok(Option::<BTreeMap<String, String>>::deserialize(d)?.unwrap_or_default())
}

/// A volume. `image` is always written, empty when unset.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    /// Volume id.
    pub id: String,
    /// Container image holding the volume's content.
    #[serde(default)]
    #[schemars(transform = super::no_default)]
    pub image: String,
    /// Attach read-only.
    #[serde(default, skip_serializing_if = "schema::is_false")]
    #[schemars(extend("default" = false))]
    pub read_only: bool,
    /// Where the guest mounts it (additional volumes only).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mount_point: String,
    /// A host path shared with virtiofs.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub virtiofs_path: String,
}

/// A file inside a container image (kernel, initrd).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ContainerFileSource {
    /// The container image.
    pub image: String,
    /// Path of the file inside the image.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub filename: String,
}

/// A guest network interface.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkInterface {
    /// Device name inside the guest.
    pub guest_device_name: String,
    /// MAC address in the guest; empty lets the provider pick one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub guest_mac: String,
    /// Host-side interface type.
    #[serde(rename = "type")]
    pub iface_type: IfaceType,
    /// Static address in CIDR form; empty means DHCP.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub address: String,
}

/// Host-side interface type (`macvtap` or `tap`, both required to be named: no default).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum IfaceType {
    /// A macvtap device.
    Macvtap,
    /// A tap device.
    Tap,
}

/// Observed state of a `v1alpha1` MicrovmMachine (CAPI's v1beta1 contract).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MicrovmMachineStatus {
    /// True once the microVM runs. Always written.
    #[serde(default)]
    pub ready: bool,
    /// State of the microVM: `pending`, `running`, `failed`, `deleted` or `unknown` (a free string).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm_state: Option<String>,
    /// Addresses of the machine (the Go provider never wrote them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<MachineAddress>,
    /// A terminal problem, for machines (the Go provider never wrote it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    /// A terminal problem, for people (the Go provider never wrote it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_message: Option<String>,
    /// CAPI v1beta1 conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
