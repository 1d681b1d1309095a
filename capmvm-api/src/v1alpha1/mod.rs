//! `v1alpha1`: the API of the Go provider (`cluster-api-provider-microvm` v0.10), served beside
//! `v1alpha2` so its users' objects, manifests and scripts keep working after they move to us.
//!
//! The types follow the Go provider's field by field, with its JSON shape (which fields are always
//! written, which are left out when empty) and its schema (required fields, defaults, bounds), so an
//! object it stored reads back unchanged. They implement CAPI's v1beta1 contract (`status.ready`,
//! failure domains as a map, v1beta1 conditions with a severity). Nothing in this provider reads or
//! writes them but the conversion webhook ([`crate::conversion`]): `v1alpha2` is the storage version.
//!
//! [`crds`] renders the CRDs as the Go provider installed them (this version alone, with the v1beta1
//! contract label), for reproducing its installation in tests and migration rehearsals.

pub mod cluster;
pub mod machine;
pub mod template;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use cluster::{
    ApiEndpoint, FailureDomainSpec, MicrovmCluster, MicrovmClusterSpec, MicrovmClusterStatus,
    MicrovmHost, Placement, Proxy, StaticPoolPlacement,
};
pub use machine::{
    ContainerFileSource, IfaceType, MicrovmMachine, MicrovmMachineSpec, MicrovmMachineStatus,
    NetworkInterface, Volume,
};
pub use template::{
    MicrovmMachineTemplate, MicrovmMachineTemplateResource, MicrovmMachineTemplateSpec,
    TemplateObjectMeta,
};

/// This API version.
pub const VERSION: &str = "v1alpha1";

/// The CAPI contract the Go provider's CRDs declared, and the label that says so.
pub const CONTRACT_LABEL: (&str, &str) = ("cluster.x-k8s.io/v1beta1", VERSION);

/// The Go provider's values of `status.vmState` (a free string in its schema).
pub mod vm_states {
    /// The microVM was asked for and has not started.
    pub const PENDING: &str = "pending";
    /// The microVM runs.
    pub const RUNNING: &str = "running";
    /// Flintlock gave up on the microVM.
    pub const FAILED: &str = "failed";
    /// Declared by the Go provider, never written by it.
    pub const DELETED: &str = "deleted";
    /// A state the Go provider did not know.
    pub const UNKNOWN: &str = "unknown";
    /// Not the Go provider's: how `v1alpha2`'s `deleting` reads at `v1alpha1`.
    pub const DELETING: &str = "deleting";
}

/// The Go provider's condition types and reasons (its `condition_consts.go`, CAPI v1beta1 style).
pub mod conditions {
    /// MicrovmCluster: the control plane answers (the Go provider lists the workload cluster's Nodes).
    pub const LOAD_BALANCER_AVAILABLE: &str = "LoadBalancerAvailable";
    /// MicrovmMachine: the microVM is created and running.
    pub const MICROVM_READY: &str = "MicrovmReady";
    /// The summary condition CAPI's v1beta1 helpers compute over the others.
    pub const READY: &str = "Ready";
    /// Reason of `LoadBalancerAvailable=False` until a Node registers.
    pub const LOAD_BALANCER_NOT_AVAILABLE: &str = "LoadBalancerNotAvailable";
    /// Reason of `MicrovmReady=False` while the microVM is pending.
    pub const MICROVM_PENDING: &str = "MicrovmPending";
    /// Reason of `MicrovmReady=False` while the microVM is deleted.
    pub const MICROVM_DELETING: &str = "MicrovmDeleting";
    /// Reason of `MicrovmReady=False` while the Cluster's infrastructure is not ready.
    pub const WAITING_FOR_CLUSTER_INFRA: &str = "WaitingForClusterInfra";
    /// Reason of `MicrovmReady=False` while the Machine has no bootstrap data (misspelt as the Go
    /// provider spells it).
    pub const WAITING_FOR_BOOTSTRAP_DATA: &str = "WaitingForBoostrapData";
    /// Severity of a `False` condition that needs no attention.
    pub const SEVERITY_INFO: &str = "Info";
}

/// A CAPI v1beta1 condition: the shape of the Go provider's `status.conditions`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Type, in CamelCase.
    #[serde(rename = "type")]
    #[schemars(length(min = 1, max = 256))]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// For a `False` condition: `Error`, `Warning` or `Info`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 32))]
    pub severity: String,
    /// When the status last changed.
    pub last_transition_time: Time,
    /// Why, in CamelCase.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(min = 1, max = 256))]
    pub reason: String,
    /// Details for people.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(min = 1, max = 10240))]
    pub message: String,
}

/// SSH users and their keys (the Go provider's `SSHPublicKey`; both fields required by its schema,
/// left out of its JSON when empty).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = require_user_and_keys)]
pub struct SshPublicKey {
    /// Login name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub user: String,
    /// Public keys in OpenSSH `authorized_keys` format.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub authorized_keys: Vec<String>,
}

fn require_user_and_keys(schema: &mut schemars::Schema) {
    require(schema, &["authorizedKeys", "user"]);
}

/// Adds `names` to a schema's `required` list (for fields the Go schema requires that its JSON
/// nevertheless leaves out when empty, which serde can only express as defaulted).
pub(crate) fn require(schema: &mut schemars::Schema, names: &[&str]) {
    let mut required: Vec<String> = schema
        .get("required")
        .and_then(|r| r.as_array())
        .map(|r| {
            r.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    for name in names {
        if !required.iter().any(|r| r == name) {
            required.push((*name).to_string());
        }
    }
    required.sort();
    schema.insert("required".to_string(), serde_json::Value::from(required));
}

/// Removes the `default` schemars derives from a serde default: the Go schema has none there, and a
/// default in the CRD would make the API server write one.
pub(crate) fn no_default(schema: &mut schemars::Schema) {
    schema.remove("default");
}

/// The CRDs as the Go provider installed them: `v1alpha1` alone, its storage version, labelled with
/// the v1beta1 contract, without conversion. For reproducing its installation; ours is
/// [`crate::crds`].
pub fn crds() -> Vec<CustomResourceDefinition> {
    use kube::CustomResourceExt;
    let mut crds = vec![
        MicrovmCluster::crd(),
        MicrovmMachine::crd(),
        MicrovmMachineTemplate::crd(),
    ];
    for crd in &mut crds {
        crd.metadata
            .labels
            .get_or_insert_default()
            .insert(CONTRACT_LABEL.0.to_string(), CONTRACT_LABEL.1.to_string());
    }
    crds
}
