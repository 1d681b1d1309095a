//! MicrovmMachineTemplate: the shape CAPI clones MicrovmMachines from (MachineDeployments, control planes).

// Repeated `printcolumn(type_ = ..)` arguments of the kube derive are not duplicates.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::machine::MicrovmMachineSpec;

/// Desired state of a MicrovmMachineTemplate.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha2",
    kind = "MicrovmMachineTemplate",
    plural = "microvmmachinetemplates",
    namespaced,
    status = "MicrovmMachineTemplateStatus",
    derive = "PartialEq",
    shortname = "mvmmt",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha2"),
    doc = "MicrovmMachineTemplate is the template Cluster API clones MicrovmMachines from.",
    printcolumn(
        name = "CPU",
        type_ = "integer",
        json_path = ".spec.template.spec.vcpu",
        description = "vCPUs of each machine"
    ),
    printcolumn(
        name = "Memory",
        type_ = "integer",
        json_path = ".spec.template.spec.memoryMb",
        description = "Memory of each machine in MiB"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct MicrovmMachineTemplateSpec {
    /// What every cloned MicrovmMachine gets. Immutable, as Cluster API's templates are: Machines
    /// already cloned would no longer match it, so a change is a new template that the
    /// MachineDeployment or control plane is pointed at (which rolls the Machines).
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self == oldSelf",
        "message": "spec.template is immutable: create a new MicrovmMachineTemplate and point the owner at it"
    }]))]
    pub template: MicrovmMachineTemplateResource,
}

/// Metadata and spec of the MicrovmMachines cloned from a template.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct MicrovmMachineTemplateResource {
    /// Labels and annotations copied onto each clone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMeta>,
    /// The spec of each clone.
    pub spec: MicrovmMachineSpec,
}

/// Labels and annotations of a template (CAPI ObjectMeta; omitted when empty).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[schemars(extend("minProperties" = 1))]
pub struct TemplateMeta {
    /// Labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// Observed state of a template: what a machine from it offers, for cluster-autoscaler's scale from zero.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MicrovmMachineTemplateStatus {
    /// Resources of one machine, every value a string (`cpu: "2"`, `memory: "2048Mi"`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capacity: BTreeMap<String, String>,
    /// Architecture and operating system of the nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_info: Option<NodeInfo>,
}

/// Node facts for cluster-autoscaler.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1))]
pub struct NodeInfo {
    /// CPU architecture (`kubernetes.io/arch`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["amd64", "arm64", "s390x", "ppc64le"]))]
    pub architecture: Option<String>,
    /// Operating system (`kubernetes.io/os`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operating_system: Option<String>,
}
