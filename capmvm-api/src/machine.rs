//! MicrovmMachine: one CAPI Machine's microVM on a flintlock host.

// Repeated `printcolumn(type_ = ..)` arguments of the kube derive are not duplicates.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::cluster::{Initialization, SshPublicKey};
use crate::schema;

/// Lowest vCPU count flintlock accepts.
pub const MIN_VCPU: i64 = 1;
/// Highest vCPU count flintlock accepts.
pub const MAX_VCPU: i64 = 64;
/// Lowest memory flintlock accepts, in MiB.
pub const MIN_MEMORY_MB: i64 = 1024;
/// Highest memory flintlock accepts, in MiB.
pub const MAX_MEMORY_MB: i64 = 32768;

/// Desired state of a MicrovmMachine: the microVM's shape. Only `providerID` changes after creation.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha2",
    kind = "MicrovmMachine",
    plural = "microvmmachines",
    namespaced,
    status = "MicrovmMachineStatus",
    derive = "PartialEq",
    shortname = "mvmm",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha2"),
    doc = "MicrovmMachine is the infrastructure of one Cluster API Machine: a microVM on a flintlock host.",
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels.cluster\\.x-k8s\\.io/cluster-name",
        description = "Cluster to which this MicrovmMachine belongs"
    ),
    printcolumn(
        name = "Host",
        type_ = "string",
        json_path = ".status.host",
        description = "Flintlock host of the microVM"
    ),
    printcolumn(
        name = "State",
        type_ = "string",
        json_path = ".status.vmState",
        description = "State of the microVM"
    ),
    printcolumn(
        name = "ProviderID",
        type_ = "string",
        json_path = ".spec.providerID",
        description = "Provider ID"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Ready condition"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MicrovmMachineSpec {
    /// The flintlock VMM provider. Unset means the host's default (flintlock's default is firecracker).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<VmmProvider>,

    /// Number of vCPUs.
    #[schemars(range(min = 1, max = 64))]
    pub vcpu: i64,

    /// Memory in MiB.
    #[schemars(range(min = 1024, max = 32768))]
    pub memory_mb: i64,

    /// The root volume, from a container image.
    pub root_volume: Volume,

    /// Additional volumes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,

    /// The kernel, as a file inside a container image.
    pub kernel: Kernel,

    /// Extra kernel command-line arguments (`key=value`; an empty value gives a bare flag).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kernel_cmdline: BTreeMap<String, String>,

    /// An initial ramdisk, as a file inside a container image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd: Option<Initrd>,

    /// Network interfaces of the guest. Flintlock's Firecracker provider adds `eth0` itself for the
    /// metadata service, so name yours `eth1` and up.
    #[schemars(length(min = 1))]
    pub network_interfaces: Vec<NetworkInterface>,

    /// Labels for the microVM on the host.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,

    /// SSH users and keys for this machine; when set they replace the MicrovmCluster's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ssh_public_keys: Vec<SshPublicKey>,

    /// Only hosts whose `labels` match may run this microVM (a standard label selector). A machine
    /// no usable host matches waits, `Ready=False` with reason `NoMatchingHost`, and is never placed
    /// elsewhere. Unset: any host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_selector: Option<LabelSelector>,

    /// Set by the provider: `microvm://<host endpoint>/<flintlock uid>`.
    #[serde(
        rename = "providerID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(min = 1, max = 512))]
    pub provider_id: Option<String>,
}

/// A flintlock VMM provider.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum VmmProvider {
    /// Firecracker: metadata service (MMDS), no macvtap, no virtiofs.
    Firecracker,
    /// Cloud Hypervisor: macvtap and virtiofs; cloud-init via a `cidata` disk.
    Cloudhypervisor,
}

impl VmmProvider {
    /// The name flintlock knows the provider by.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Firecracker => "firecracker",
            Self::Cloudhypervisor => "cloudhypervisor",
        }
    }
}

/// A volume of the microVM.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    /// Volume id, unique among the machine's volumes.
    #[schemars(length(min = 1))]
    pub id: String,
    /// Container image that holds the volume's content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub image: Option<String>,
    /// Attach read-only.
    #[serde(default, skip_serializing_if = "schema::is_false")]
    pub read_only: bool,
    /// Where cloud-init mounts the volume in the guest (additional volumes only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub mount_point: Option<String>,
    /// A host path shared with virtiofs (Cloud Hypervisor only; additional volumes only; at most one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub virtiofs_path: Option<String>,
}

/// The kernel: a file inside a container image.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct Kernel {
    /// Container image that holds the kernel.
    #[schemars(length(min = 1))]
    pub image: String,
    /// Path of the kernel binary inside the image (flintlock requires it), for example `boot/vmlinux`.
    #[schemars(length(min = 1))]
    pub filename: String,
}

/// An initial ramdisk: a file inside a container image.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct Initrd {
    /// Container image that holds the initrd.
    #[schemars(length(min = 1))]
    pub image: String,
    /// Path of the initrd inside the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub filename: Option<String>,
}

/// A guest network interface.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkInterface {
    /// Device name inside the guest, for example `eth1`.
    #[schemars(length(min = 1, max = 15), pattern(r"^[a-z][a-z0-9_]*$"))]
    pub guest_device_name: String,
    /// MAC address in the guest. When unset the provider derives a stable locally administered one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$"))]
    pub guest_mac: Option<String>,
    /// Interface type on the host. Firecracker supports only `tap`.
    #[serde(rename = "type", default)]
    pub iface_type: IfaceType,
    /// Static address in CIDR form, for example `10.0.0.12/24`. Unset means DHCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Default gateway (an IP, or an IP with prefix) for the static address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// DNS servers for the static address.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
}

/// Host-side interface type.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum IfaceType {
    /// A tap device (every provider).
    #[default]
    Tap,
    /// A macvtap device (Cloud Hypervisor only).
    Macvtap,
}

/// Observed state of a MicrovmMachine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MicrovmMachineStatus {
    /// Set once the microVM reached CREATED (CAPI v1beta2 contract). Never set back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Initialization>,

    /// State of the microVM as its host last reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm_state: Option<VmState>,

    /// Endpoint of the flintlock host chosen for the microVM. Recorded before the microVM is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,

    /// Failure domain the machine landed in (copied by CAPI to `Machine.status.failureDomain`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub failure_domain: Option<String>,

    /// Addresses of the machine.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub addresses: Vec<MachineAddress>,

    /// Conditions: Ready, Paused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// State of a microVM, as shown in `status.vmState`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum VmState {
    /// Asked for; flintlock has not started it yet.
    Pending,
    /// Flintlock started the VMM process (CREATED).
    Running,
    /// Flintlock gave up (FAILED, terminal).
    Failed,
    /// Being deleted.
    Deleting,
    /// Not known (host unreachable, or a state this provider does not know).
    Unknown,
}

/// An address of a machine (CAPI MachineAddress).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct MachineAddress {
    /// Address type.
    #[serde(rename = "type")]
    pub address_type: MachineAddressType,
    /// The address.
    #[schemars(length(min = 1, max = 256))]
    pub address: String,
}

/// Address types of CAPI.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum MachineAddressType {
    /// Host name.
    Hostname,
    /// External IP.
    #[serde(rename = "ExternalIP")]
    ExternalIp,
    /// Internal IP.
    #[serde(rename = "InternalIP")]
    InternalIp,
    /// External DNS name.
    #[serde(rename = "ExternalDNS")]
    ExternalDns,
    /// Internal DNS name.
    #[serde(rename = "InternalDNS")]
    InternalDns,
}
