//! MicrovmMachinePool: the infrastructure of one CAPI MachinePool, a set of microVMs over the cluster's
//! hosts. Each instance is a MicrovmMachine (a MachinePool Machine's infrastructure); the pool decides
//! how many exist and which go, the machine engine creates and deletes their microVMs.

// Repeated `printcolumn(type_ = ..)` arguments of the kube derive are not duplicates.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::cluster::Initialization;
use crate::machine::MicrovmMachineSpec;
use crate::template::NodeInfo;

/// The kind of a pool's instances, as `status.infrastructureMachineKind` names it.
pub const INSTANCE_KIND: &str = "MicrovmMachine";

/// `maxSurge` when unset: one instance above the desired count.
pub const DEFAULT_MAX_SURGE: i32 = 1;
/// `maxUnavailable` when unset: never fewer ready instances than desired.
pub const DEFAULT_MAX_UNAVAILABLE: i32 = 0;

/// Desired state of a MicrovmMachinePool.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha2",
    kind = "MicrovmMachinePool",
    plural = "microvmmachinepools",
    namespaced,
    status = "MicrovmMachinePoolStatus",
    derive = "PartialEq",
    shortname = "mvmmp",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha2"),
    doc = "MicrovmMachinePool is the infrastructure of one Cluster API MachinePool: microVMs on flintlock hosts, one MicrovmMachine each.",
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels.cluster\\.x-k8s\\.io/cluster-name",
        description = "Cluster to which this MicrovmMachinePool belongs"
    ),
    printcolumn(
        name = "Replicas",
        type_ = "integer",
        json_path = ".status.replicas",
        description = "Instances that exist, deleting ones included"
    ),
    printcolumn(
        name = "Ready",
        type_ = "integer",
        json_path = ".status.readyReplicas",
        description = "Instances whose microVM runs"
    ),
    printcolumn(
        name = "Up-to-date",
        type_ = "integer",
        json_path = ".status.upToDateReplicas",
        description = "Instances made from the current template"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MicrovmMachinePoolSpec {
    /// The spec every instance gets: a MicrovmMachine spec without `providerID`. A change rolls the
    /// pool (the whole spec is compared); a change of bootstrap data alone does not.
    #[schemars(transform = without_provider_id)]
    pub template: MicrovmMachineSpec,

    /// How instances are replaced when the template changes, and which go first on scale down.
    #[serde(default)]
    pub strategy: PoolStrategy,

    /// Set by the provider: the providerIDs of the instances that exist (deleting ones included), sorted.
    #[serde(
        rename = "providerIDList",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(length(max = 10000), extend("x-kubernetes-list-type" = "atomic"))]
    pub provider_id_list: Vec<String>,

    /// The pool's own id (optional; not used by Cluster API).
    #[serde(
        rename = "providerID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(min = 1, max = 512))]
    pub provider_id: Option<String>,
}

/// Drops `providerID` from the template's schema: it is per instance, never part of a template.
fn without_provider_id(schema: &mut schemars::Schema) {
    if let Some(props) = schema.get_mut("properties").and_then(|p| p.as_object_mut()) {
        props.remove("providerID");
    }
}

/// `spec.strategy`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolStrategy {
    /// The only strategy: replace outdated instances a few at a time.
    #[serde(rename = "type", default)]
    pub strategy_type: PoolStrategyType,
    /// Limits of a rolling update, and the scale-down order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<RollingUpdate>,
}

/// `spec.strategy.type`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PoolStrategyType {
    /// Replace outdated instances within `maxSurge` / `maxUnavailable`.
    #[default]
    RollingUpdate,
}

/// `spec.strategy.rollingUpdate`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RollingUpdate {
    /// Instances allowed above the desired count (an integer, or a percentage of it rounded up).
    /// Default 1. Instances being deleted count until they are gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_surge: Option<IntOrString>,
    /// Ready instances allowed below the desired count (an integer, or a percentage of it rounded
    /// down). Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
    /// Which instances go first once the autoscaler's choices and broken and outdated instances are
    /// gone. Default `Oldest`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_policy: Option<DeletePolicy>,
}

/// `spec.strategy.rollingUpdate.deletePolicy`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum DeletePolicy {
    /// The oldest instances go first.
    #[default]
    Oldest,
    /// The newest instances go first.
    Newest,
    /// A stable pseudo-random order (by a hash of the instance's name).
    Random,
}

/// Why an int-or-percent limit cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// A negative integer.
    #[error("{0} is negative; use 0 or more")]
    Negative(i32),
    /// A string that is not `N%` with N from 0 to 100.
    #[error("{0:?} is not a percentage; write an integer, or a percentage such as \"25%\"")]
    NotPercent(String),
}

/// Resolves an int-or-percent limit against `desired`: a percentage rounds up or down as asked.
pub fn resolve_limit(
    value: Option<&IntOrString>,
    default: i32,
    desired: i32,
    round_up: bool,
) -> Result<i32, LimitError> {
    match value {
        None => Ok(default),
        Some(IntOrString::Int(n)) if *n < 0 => Err(LimitError::Negative(*n)),
        Some(IntOrString::Int(n)) => Ok(*n),
        Some(IntOrString::String(s)) => {
            let percent = s
                .strip_suffix('%')
                .and_then(|p| p.parse::<u8>().ok())
                .filter(|p| *p <= 100)
                .ok_or_else(|| LimitError::NotPercent(s.clone()))?;
            let scaled = i64::from(desired.max(0)) * i64::from(percent);
            let resolved = if round_up {
                (scaled + 99) / 100
            } else {
                scaled / 100
            };
            Ok(i32::try_from(resolved).unwrap_or(i32::MAX))
        }
    }
}

impl PoolStrategy {
    /// `maxSurge` against `desired` (a percentage rounds up).
    pub fn max_surge(&self, desired: i32) -> Result<i32, LimitError> {
        let value = self
            .rolling_update
            .as_ref()
            .and_then(|r| r.max_surge.as_ref());
        resolve_limit(value, DEFAULT_MAX_SURGE, desired, true)
    }

    /// `maxUnavailable` against `desired` (a percentage rounds down).
    pub fn max_unavailable(&self, desired: i32) -> Result<i32, LimitError> {
        let value = self
            .rolling_update
            .as_ref()
            .and_then(|r| r.max_unavailable.as_ref());
        resolve_limit(value, DEFAULT_MAX_UNAVAILABLE, desired, false)
    }

    /// `deletePolicy`, defaulted.
    pub fn delete_policy(&self) -> DeletePolicy {
        self.rolling_update
            .as_ref()
            .and_then(|r| r.delete_policy)
            .unwrap_or_default()
    }
}

/// Observed state of a MicrovmMachinePool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MicrovmMachinePoolStatus {
    /// True once the pool first had its desired ready instances; stays true while it scales or rolls
    /// (Cluster API v1.14 reads only this, and stops copying the providerIDList while it is false).
    #[serde(default, skip_serializing_if = "crate::schema::is_false")]
    pub ready: bool,

    /// The v1beta2 contract's form of `ready`; set together with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Initialization>,

    /// Instances that exist, deleting ones included.
    #[serde(default)]
    pub replicas: i32,

    /// Instances whose microVM runs, not being deleted.
    #[serde(default)]
    pub ready_replicas: i32,

    /// Instances made from the current template, not being deleted.
    #[serde(default)]
    pub up_to_date_replicas: i32,

    /// The kind of the instances (`MicrovmMachine`): Cluster API creates a Machine for each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_machine_kind: Option<String>,

    /// Resources of one instance, for cluster-autoscaler's scale from zero (`cpu`, `memory`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capacity: BTreeMap<String, String>,

    /// Architecture and operating system of the instances' nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_info: Option<NodeInfo>,

    /// Conditions: Ready, Paused, ScalingUp, ScalingDown, RollingOut, Remediating.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// CAPI's `MustFormatValue`: `value` if it is a valid label value, else `hash_<base64url(FNV-1a-32)>_z`.
/// The `cluster.x-k8s.io/pool-name` label of a pool's instances is this of the MachinePool's name.
pub fn must_format_label_value(value: &str) -> String {
    use base64::Engine;
    let valid = value.len() <= 63
        && (value.is_empty()
            || (value.starts_with(|c: char| c.is_ascii_alphanumeric())
                && value.ends_with(|c: char| c.is_ascii_alphanumeric())
                && value
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))));
    if valid {
        return value.to_string();
    }
    let mut hash: u32 = 0x811c_9dc5;
    for byte in value.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    format!(
        "hash_{}_z",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(hash.to_be_bytes())
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn limits_default_and_round_like_deployments() {
        let strategy = PoolStrategy::default();
        assert_eq!(strategy.max_surge(10), Ok(1));
        assert_eq!(strategy.max_unavailable(10), Ok(0));
        let pct = |s: &str| Some(IntOrString::String(s.to_string()));
        assert_eq!(resolve_limit(pct("25%").as_ref(), 1, 10, true), Ok(3));
        assert_eq!(resolve_limit(pct("25%").as_ref(), 0, 10, false), Ok(2));
        assert_eq!(
            resolve_limit(pct("25").as_ref(), 0, 10, false),
            Err(LimitError::NotPercent("25".into()))
        );
        assert_eq!(
            resolve_limit(Some(&IntOrString::Int(-1)), 0, 10, false),
            Err(LimitError::Negative(-1))
        );
    }

    #[test]
    fn label_values_are_formatted_as_capi_does() {
        assert_eq!(must_format_label_value("workers"), "workers");
        let long = "a".repeat(64);
        let formatted = must_format_label_value(&long);
        assert!(formatted.starts_with("hash_") && formatted.ends_with("_z"));
        assert!(formatted.len() <= 63);
        assert_eq!(formatted, must_format_label_value(&long), "stable");
    }

    #[test]
    fn the_template_schema_has_no_provider_id() {
        use kube::CustomResourceExt;
        let crd = serde_json::to_value(MicrovmMachinePool::crd()).unwrap();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let template = &spec["properties"]["template"]["properties"];
        assert!(template["vcpu"].is_object(), "{spec}");
        assert!(template.get("providerID").is_none());
        assert!(spec["properties"]["providerID"].is_object());
    }
}
