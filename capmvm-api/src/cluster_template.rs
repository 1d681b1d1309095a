//! MicrovmClusterTemplate: what a ClusterClass's topology controller clones a MicrovmCluster from
//! (CAPI's InfraClusterTemplate contract).

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::cluster::MicrovmClusterSpec;
use crate::template::TemplateMeta;

/// Desired state of a MicrovmClusterTemplate.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha2",
    kind = "MicrovmClusterTemplate",
    plural = "microvmclustertemplates",
    namespaced,
    derive = "PartialEq",
    shortname = "mvmct",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha2"),
    doc = "MicrovmClusterTemplate is the template a ClusterClass clones MicrovmClusters from.",
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct MicrovmClusterTemplateSpec {
    /// What every cloned MicrovmCluster gets. Immutable, as Cluster API's templates are (the
    /// ValidatingAdmissionPolicy `capmvm-template-immutability`): a change is a new template the
    /// ClusterClass is pointed at.
    pub template: MicrovmClusterTemplateResource,
}

/// Metadata and spec of the MicrovmClusters cloned from a template.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct MicrovmClusterTemplateResource {
    /// Labels and annotations copied onto each clone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMeta>,
    /// The spec of each clone. A ClusterClass usually leaves the per-cluster parts (hosts,
    /// control-plane endpoint, SSH keys, credentials) to its patches.
    pub spec: MicrovmClusterSpec,
}
