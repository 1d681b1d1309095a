//! The Go provider's MicrovmMachineTemplate (`v1alpha1`): no status.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::machine::MicrovmMachineSpec;

/// Desired state of a `v1alpha1` MicrovmMachineTemplate.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "MicrovmMachineTemplate",
    plural = "microvmmachinetemplates",
    namespaced,
    derive = "PartialEq",
    shortname = "mvmmt",
    category = "cluster-api",
    doc = "MicrovmMachineTemplate at v1alpha1, the Go provider's version: what MicrovmMachines are cloned from."
)]
pub struct MicrovmMachineTemplateSpec {
    /// What every cloned MicrovmMachine gets.
    pub template: MicrovmMachineTemplateResource,
}

/// Metadata and spec of the clones. `metadata` is always written, `{}` when empty.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct MicrovmMachineTemplateResource {
    /// Labels and annotations of each clone.
    #[serde(default)]
    #[schemars(transform = super::no_default)]
    pub metadata: TemplateObjectMeta,
    /// The spec of each clone.
    pub spec: MicrovmMachineSpec,
}

/// CAPI v1beta1's ObjectMeta: labels and annotations.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct TemplateObjectMeta {
    /// Labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}
