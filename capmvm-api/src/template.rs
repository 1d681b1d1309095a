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
    /// MachineDeployment or control plane is pointed at (which rolls the Machines). Enforced by the
    /// ValidatingAdmissionPolicy `capmvm-template-immutability`, which lets Cluster API's topology
    /// controller dry-run a change.
    pub template: MicrovmMachineTemplateResource,
}

/// Name of the ValidatingAdmissionPolicy (and its binding) in the install manifests that refuses a
/// change of `spec.template` on every template kind of [`IMMUTABLE_TEMPLATES`].
///
/// Not a CRD rule (`self == oldSelf`), which is what this was: Cluster API's topology controller
/// (ClusterClass) compares a template with what it wants by a server-side-apply dry run of the
/// changed template, marked with [`TOPOLOGY_DRY_RUN_ANNOTATION`], and rotates to a new template
/// only if that dry run succeeds. A CRD rule cannot read annotations nor tell a dry run, so it
/// refused the dry run and no topology-managed MachineDeployment could ever roll. CAPI's contract
/// asks templates to let exactly those dry runs through; an admission policy sees `request.dryRun`
/// and the annotations.
pub const IMMUTABILITY_POLICY: &str = "capmvm-template-immutability";

/// The resources (plurals) whose `spec.template` is immutable.
pub const IMMUTABLE_TEMPLATES: &[&str] = &[
    "microvmclustertemplates",
    "microvmmachinetemplates",
    "microvmmachinepooltemplates",
];

/// The annotation CAPI's topology controller puts on the objects of its dry runs.
pub const TOPOLOGY_DRY_RUN_ANNOTATION: &str = "topology.cluster.x-k8s.io/dry-run";

/// The policy's CEL expression: `spec.template` unchanged, or a dry run of the topology controller.
pub const IMMUTABILITY_RULE: &str = "object.spec.template == oldObject.spec.template || (request.dryRun == true && has(object.metadata.annotations) && 'topology.cluster.x-k8s.io/dry-run' in object.metadata.annotations)";

/// What the policy answers when it refuses a change.
pub const IMMUTABILITY_MESSAGE_EXPRESSION: &str = "'spec.template of ' + object.kind + ' ' + object.metadata.name + ' is immutable: create a new template and point its owner (MachineDeployment, control plane, ClusterClass) at it'";

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
