//! MicrovmMachinePoolTemplate: what a ClusterClass's topology controller clones a MachinePool's
//! MicrovmMachinePool from (CAPI's InfraMachinePoolTemplate contract).

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::pool::MicrovmMachinePoolSpec;
use crate::template::TemplateMeta;

/// Desired state of a MicrovmMachinePoolTemplate.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha2",
    kind = "MicrovmMachinePoolTemplate",
    plural = "microvmmachinepooltemplates",
    namespaced,
    derive = "PartialEq",
    shortname = "mvmmpt",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha2"),
    doc = "MicrovmMachinePoolTemplate is the template a ClusterClass clones MicrovmMachinePools from.",
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct MicrovmMachinePoolTemplateSpec {
    /// What every cloned MicrovmMachinePool gets. Immutable, as Cluster API's templates are (the
    /// ValidatingAdmissionPolicy `capmvm-template-immutability`). The topology controller updates
    /// the pool it cloned in place (a change of the pool's `spec.template` rolls its instances).
    pub template: MicrovmMachinePoolTemplateResource,
}

/// Metadata and spec of the MicrovmMachinePools cloned from a template.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct MicrovmMachinePoolTemplateResource {
    /// Labels and annotations copied onto each clone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMeta>,
    /// The spec of each clone (`providerIDList` is the provider's to write, never a template's).
    pub spec: MicrovmMachinePoolSpec,
}
