//! The CAPI CRDs the emulator serves for the stand-in: Cluster, Machine and MachineDeployment in
//! `cluster.x-k8s.io/v1beta2`. Their schemas keep every field (`x-kubernetes-preserve-unknown-fields`):
//! CAPI's real schemas are large and this stand-in only reads a few fields.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResource;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// `MachineDeployment.spec` (v1beta2), the fields the stand-in uses.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "MachineDeployment",
    plural = "machinedeployments",
    namespaced,
    status = "serde_json::Value",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct MachineDeploymentSpec {
    /// The Cluster.
    #[serde(default)]
    pub cluster_name: String,
    /// Desired Machines.
    #[serde(default)]
    pub replicas: Option<i32>,
    /// What each Machine gets.
    #[serde(default)]
    pub template: MachineTemplateSpec,
}

/// `MachineDeployment.spec.template`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct MachineTemplateSpec {
    /// Labels and annotations of the Machines.
    #[serde(default)]
    pub metadata: TemplateMetadata,
    /// The Machine spec (kept as JSON: clusterName, bootstrap, infrastructureRef, version...).
    #[serde(default)]
    pub spec: serde_json::Value,
}

/// Labels and annotations.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct TemplateMetadata {
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// The three CAPI CRDs.
pub fn crds() -> Vec<CustomResourceDefinition> {
    [
        ("Cluster", "clusters", "cl", vec![("Phase", ".status.phase"), ("Paused", ".spec.paused")]),
        ("Machine", "machines", "ma", vec![("Cluster", ".spec.clusterName"), ("ProviderID", ".spec.providerID"), ("Phase", ".status.phase")]),
        ("MachineDeployment", "machinedeployments", "md", vec![("Cluster", ".spec.clusterName"), ("Replicas", ".spec.replicas"), ("Ready", ".status.readyReplicas")]),
    ]
    .into_iter()
    .map(|(kind, plural, short, columns)| {
        let mut printer: Vec<serde_json::Value> = columns
            .into_iter()
            .map(|(name, path)| json!({"name": name, "type": "string", "jsonPath": path}))
            .collect();
        printer.push(json!({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}));
        let crd = json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.cluster.x-k8s.io")},
            "spec": {
                "group": "cluster.x-k8s.io",
                "names": {
                    "kind": kind,
                    "listKind": format!("{kind}List"),
                    "plural": plural,
                    "singular": kind.to_lowercase(),
                    "shortNames": [short],
                    "categories": ["cluster-api"],
                },
                "scope": "Namespaced",
                "versions": [{
                    "name": "v1beta2",
                    "served": true,
                    "storage": true,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": printer,
                    "schema": {"openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        },
                    }},
                }],
            },
        });
        // A literal known to match the CRD type.
        serde_json::from_value(crd).unwrap_or_default()
    })
    .collect()
}
