//! MicrovmCluster: the infrastructure of one CAPI Cluster: which flintlock hosts its machines may use.

// Repeated `printcolumn(type_ = ..)` arguments of the kube derive are not duplicates.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::schema;

/// Desired state of a MicrovmCluster.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha2",
    kind = "MicrovmCluster",
    plural = "microvmclusters",
    namespaced,
    status = "MicrovmClusterStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "mvmc",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha2"),
    doc = "MicrovmCluster is the infrastructure of a Cluster API Cluster whose machines are microVMs on flintlock hosts.",
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels.cluster\\.x-k8s\\.io/cluster-name",
        description = "Cluster to which this MicrovmCluster belongs"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Ready condition"
    ),
    printcolumn(
        name = "Endpoint",
        type_ = "string",
        json_path = ".spec.controlPlaneEndpoint.host",
        description = "Control-plane endpoint host"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MicrovmClusterSpec {
    /// The endpoint of the workload cluster's API server (usually a VIP served by kube-vip). Needed here
    /// only when the Cluster itself does not set `spec.controlPlaneEndpoint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,

    /// SSH users and keys for every machine of the cluster. A machine's own `sshPublicKeys` replace these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ssh_public_keys: Vec<SshPublicKey>,

    /// Where the cluster's microVMs may run.
    pub placement: Placement,

    /// An HTTP CONNECT proxy through which every flintlock host is reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub microvm_proxy: Option<Proxy>,

    /// Name of a Secret in this namespace holding `tls.crt`, `tls.key` (client certificate for mTLS) and
    /// `ca.crt` (CA of the hosts' server certificates). Without it, hosts are dialled in plaintext.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub tls_secret_ref: Option<String>,
}

/// Host and port of an API server. At least one field is set when the object is present.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[schemars(extend("minProperties" = 1))]
pub struct ApiEndpoint {
    /// DNS name or IP address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub host: Option<String>,
    /// TCP port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
}

impl ApiEndpoint {
    /// True when both host and port are set, the shape CAPI treats as a valid endpoint.
    pub fn is_complete(&self) -> bool {
        self.host.as_deref().is_some_and(|h| !h.is_empty()) && self.port.is_some_and(|p| p > 0)
    }
}

/// An SSH user and the public keys allowed to log in as that user.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SshPublicKey {
    /// Login name.
    #[schemars(length(min = 1))]
    pub user: String,
    /// Public keys in OpenSSH `authorized_keys` format.
    #[schemars(length(min = 1))]
    pub authorized_keys: Vec<String>,
}

/// Placement of the cluster's microVMs.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// A fixed list of flintlock hosts. Required: it is the only placement this provider offers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub static_pool: Option<StaticPoolPlacement>,
}

/// A fixed list of flintlock hosts.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StaticPoolPlacement {
    /// The hosts. Names and endpoints are unique.
    #[schemars(length(min = 1))]
    pub hosts: Vec<MicrovmHost>,

    /// Name of a Secret in this namespace with one basic-auth token per host, under the key of the
    /// host's address without port (an IPv6 address with each `:` written as `-`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub basic_auth_secret: Option<String>,
}

/// One flintlock host.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MicrovmHost {
    /// A name for the host, used in messages and, when `failureDomain` is unset, as its failure domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub name: Option<String>,

    /// The flintlock gRPC endpoint, `host:port` (IPv6 as `[addr]:port`).
    // The shape is checked at admission, so a typo is refused by `kubectl apply` naming the host;
    // the finer rules (port range, canonical form, uniqueness) are `validation`'s.
    #[schemars(length(min = 1, max = 256), pattern(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*):[0-9]{1,5}$"))]
    pub endpoint: String,

    /// Whether control-plane machines may be placed on this host.
    #[serde(default = "schema::default_true")]
    pub controlplane_allowed: bool,

    /// The CAPI failure domain this host belongs to. Hosts sharing a value form one domain; a host
    /// without it is its own domain, named by `name`, else by `endpoint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub failure_domain: Option<String>,

    /// Labels of the host (`disk: nvme`, `rack: r1`), matched by machines' `hostSelector`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,

    /// Maintenance of the host. `Cordon`: no new microVM is placed on it, those there keep running.
    /// `Evacuate`: cordoned, and its microVMs are replaced elsewhere: a pool replaces its instances
    /// within its rolling-update limits; a MachineDeployment's machines report `Ready=False`
    /// (`HostEvacuating`), which CAPI mirrors as the Machine's `InfrastructureReady`, for a
    /// MachineHealthCheck to remediate (see docs/host-maintenance.md). Unset: in service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<HostMaintenance>,
}

/// `maintenance` of a host.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum HostMaintenance {
    /// No new microVM is placed on the host; those there keep running.
    Cordon,
    /// Cordoned, and its microVMs are replaced elsewhere.
    Evacuate,
}

impl MicrovmHost {
    /// The name of the CAPI failure domain this host belongs to.
    pub fn failure_domain_name(&self) -> &str {
        self.failure_domain
            .as_deref()
            .or(self.name.as_deref())
            .unwrap_or(&self.endpoint)
    }

    /// How the host is named in messages: its name, else its endpoint.
    pub fn display_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.endpoint)
    }

    /// Whether new microVMs may be placed here (not cordoned, not evacuating).
    pub fn schedulable(&self) -> bool {
        self.maintenance.is_none()
    }

    /// Whether the host's microVMs are to be replaced elsewhere.
    pub fn evacuating(&self) -> bool {
        self.maintenance == Some(HostMaintenance::Evacuate)
    }

    /// A host at `endpoint`, named, in its own failure domain, control planes allowed, no labels,
    /// in service.
    pub fn new(name: Option<&str>, endpoint: &str) -> Self {
        Self {
            name: name.map(str::to_string),
            endpoint: endpoint.to_string(),
            controlplane_allowed: true,
            failure_domain: None,
            labels: BTreeMap::new(),
            maintenance: None,
        }
    }
}

/// An HTTP CONNECT proxy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct Proxy {
    /// The proxy's `host:port` (an `http://` prefix is accepted).
    #[schemars(length(min = 1))]
    pub endpoint: String,
}

/// Observed state of a MicrovmCluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MicrovmClusterStatus {
    /// Set once the infrastructure is ready (CAPI v1beta2 contract).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Initialization>,

    /// The failure domains machines may be placed in: one per group of hosts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub failure_domains: Vec<FailureDomain>,

    /// Every host of the static pool: its state and how many of the cluster's microVMs it runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1000))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["endpoint"]))]
    pub hosts: Vec<HostStatus>,

    /// Conditions: Ready, Paused, HostsReachable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// One host as the provider last saw it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostStatus {
    /// The host's name, else its endpoint.
    #[schemars(length(max = 256))]
    pub name: String,
    /// Its endpoint.
    #[schemars(length(max = 256))]
    pub endpoint: String,
    /// `Ready` (answers, takes new microVMs), `Cordoned`, `Evacuating`, `Unreachable` (does not
    /// answer, refuses the credentials, or they are missing) or `Unknown` (not observed yet).
    /// Maintenance wins over reachability: a cordoned host that does not answer is `Cordoned`.
    pub state: HostState,
    /// Why it is unreachable, when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub reason: Option<String>,
    /// The cluster's microVMs on the host (as last listed; deleting ones included).
    pub microvms: i32,
}

/// `status.hosts[].state`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum HostState {
    /// Answers and takes new microVMs.
    Ready,
    /// Takes no new microVM.
    Cordoned,
    /// Takes no new microVM; its microVMs are being replaced elsewhere.
    Evacuating,
    /// Does not answer, or cannot be called (credentials refused or missing).
    Unreachable,
    /// Not observed yet.
    #[default]
    Unknown,
}

/// The CAPI v1beta2 initialization block.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[schemars(extend("minProperties" = 1))]
pub struct Initialization {
    /// True once provisioning completed; never set back to false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioned: Option<bool>,
}

/// One CAPI failure domain.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureDomain {
    /// Name, unique in the list.
    #[schemars(length(min = 1, max = 256))]
    pub name: String,
    /// Whether control-plane machines may be placed here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<bool>,
    /// Free-form attributes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, String>,
}
