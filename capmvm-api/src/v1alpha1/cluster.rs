//! The Go provider's MicrovmCluster (`v1alpha1`).

// Repeated `printcolumn(type_ = ..)` arguments of the kube derive are not duplicates.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Condition, SshPublicKey, no_default, require};
use crate::schema;

/// Desired state of a `v1alpha1` MicrovmCluster.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "MicrovmCluster",
    plural = "microvmclusters",
    namespaced,
    status = "MicrovmClusterStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "mvmc",
    category = "cluster-api",
    doc = "MicrovmCluster at v1alpha1, the Go provider's version: the flintlock hosts a cluster's machines may use.",
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels.cluster\\.x-k8s\\.io/cluster-name",
        description = "Cluster to which this MicrovmCluster belongs"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.ready",
        description = "Whether the cluster's infrastructure is ready"
    ),
    printcolumn(
        name = "ControlPlaneEndpoint",
        type_ = "string",
        json_path = ".spec.controlPlaneEndpoint[0]",
        description = "Control-plane endpoint",
        priority = 1
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MicrovmClusterSpec {
    /// The workload cluster's API endpoint. Always written (empty host and port 0 when unset).
    #[serde(default)]
    #[schemars(transform = no_default)]
    pub control_plane_endpoint: ApiEndpoint,

    /// SSH users and keys for every machine of the cluster, unless a machine has its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ssh_public_keys: Vec<SshPublicKey>,

    /// Where the cluster's microVMs are placed.
    pub placement: Placement,

    /// An HTTP CONNECT proxy for the flintlock hosts' gRPC API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub microvm_proxy: Option<Proxy>,

    /// Name of a Secret in this namespace with `tls.crt`, `tls.key` and `ca.crt` for mTLS to the hosts.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tls_secret_ref: String,
}

/// CAPI v1beta1's APIEndpoint: both fields always written.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ApiEndpoint {
    /// DNS name or IP address; empty when unset.
    #[schemars(length(max = 512))]
    pub host: String,
    /// TCP port; 0 when unset.
    pub port: i32,
}

/// Placement of the microVMs.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// A fixed list of hosts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub static_pool: Option<StaticPoolPlacement>,
}

/// A fixed list of flintlock hosts.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StaticPoolPlacement {
    /// The hosts; each is a CAPI failure domain named by its endpoint.
    #[schemars(length(min = 1))]
    pub hosts: Vec<MicrovmHost>,
    /// Name of a Secret with one basic-auth token per host, keyed by the host without its port.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub basic_auth_secret: String,
}

/// One flintlock host.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = require_controlplane_allowed)]
pub struct MicrovmHost {
    /// An optional name, for people: the host's failure domain is its endpoint all the same.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The flintlock gRPC endpoint, `host:port`.
    pub endpoint: String,
    /// Whether control-plane machines may run here.
    #[serde(default = "schema::default_true")]
    pub controlplane_allowed: bool,
}

fn require_controlplane_allowed(schema: &mut schemars::Schema) {
    require(schema, &["controlplaneAllowed"]);
}

/// An HTTP CONNECT proxy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct Proxy {
    /// The proxy's address.
    pub endpoint: String,
}

/// Observed state of a `v1alpha1` MicrovmCluster (CAPI's v1beta1 contract).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MicrovmClusterStatus {
    /// True once the infrastructure is ready. Always written.
    #[serde(default)]
    pub ready: bool,
    /// CAPI v1beta1 conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Failure domains by name (the v1beta1 contract's map).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub failure_domains: BTreeMap<String, FailureDomainSpec>,
}

/// One failure domain of the v1beta1 map.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureDomainSpec {
    /// Whether control-plane machines may be placed here.
    #[serde(default, skip_serializing_if = "schema::is_false")]
    #[schemars(transform = no_default)]
    pub control_plane: bool,
    /// Free-form attributes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, String>,
}
