//! Read-only views of CAPI core `cluster.x-k8s.io/v1beta2` Cluster and Machine.
//!
//! Only the fields an infrastructure provider reads are modelled (capi-contract.md 2.2, 3.3); unknown
//! fields are ignored on read. These types are never written back to the API server by the provider, so
//! dropping unknown fields here loses nothing. `schema = "disabled"`: CAPI owns these CRDs.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

use crate::cluster::{ApiEndpoint, FailureDomain};

/// The API group of CAPI core.
pub const CAPI_GROUP: &str = "cluster.x-k8s.io";

/// `Cluster.spec` (v1beta2), the fields a provider reads.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "Cluster",
    plural = "clusters",
    namespaced,
    status = "ClusterStatus",
    derive = "PartialEq",
    derive = "Default",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    /// Pauses reconciliation of the Cluster and every object of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// The control-plane endpoint, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,
    /// The InfraCluster (our MicrovmCluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_ref: Option<ContractVersionedObjectReference>,
    /// The control-plane object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_ref: Option<ContractVersionedObjectReference>,
}

/// `Cluster.status` (v1beta2), the fields a provider reads.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// Initialization milestones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<ClusterInitialization>,
    /// Failure domains copied from the InfraCluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failure_domains: Vec<FailureDomain>,
    /// Conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Phase (informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
}

/// `Cluster.status.initialization`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterInitialization {
    /// The InfraCluster reported provisioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_provisioned: Option<bool>,
    /// The control plane is initialized.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_initialized: Option<bool>,
}

/// A v1beta2 reference: `{apiGroup, kind, name}` in the referrer's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ContractVersionedObjectReference {
    /// API group of the referent.
    #[serde(default)]
    pub api_group: String,
    /// Kind of the referent.
    #[serde(default)]
    pub kind: String,
    /// Name of the referent.
    #[serde(default)]
    pub name: String,
}

/// `Machine.spec` (v1beta2), the fields a provider reads.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "Machine",
    plural = "machines",
    namespaced,
    status = "MachineStatus",
    derive = "PartialEq",
    derive = "Default",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct MachineSpec {
    /// Name of the owning Cluster.
    #[serde(default)]
    pub cluster_name: String,
    /// Bootstrap configuration and data.
    #[serde(default)]
    pub bootstrap: Bootstrap,
    /// The InfraMachine (our MicrovmMachine).
    #[serde(default)]
    pub infrastructure_ref: ContractVersionedObjectReference,
    /// Desired Kubernetes version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The failure domain the machine must be placed in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain: Option<String>,
    /// Copied by CAPI from the InfraMachine.
    #[serde(
        rename = "providerID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    /// Node drain, volume detach and deletion timeouts (informational for a provider).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion: Option<MachineDeletion>,
}

/// `Machine.spec.deletion` (v1beta2): timeouts in seconds.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MachineDeletion {
    /// How long CAPI drains the Node before deleting the machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_drain_timeout_seconds: Option<i64>,
    /// How long CAPI waits for volumes to detach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_volume_detach_timeout_seconds: Option<i64>,
    /// How long CAPI tries to delete the Node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_deletion_timeout_seconds: Option<i64>,
}

/// `Machine.spec.bootstrap`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Bootstrap {
    /// The BootstrapConfig.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_ref: Option<ContractVersionedObjectReference>,
    /// Name of the Secret (same namespace) holding the bootstrap data under key `value`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_secret_name: Option<String>,
}

/// `Machine.status` (v1beta2), the fields a provider reads.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineStatus {
    /// Initialization milestones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<MachineInitialization>,
    /// Phase (informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Failure domain the machine landed in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain: Option<String>,
    /// Node reference (`{name}`), once the node registered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_ref: Option<BTreeMap<String, String>>,
    /// Addresses CAPI copied from the InfraMachine.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<crate::MachineAddress>,
    /// The Node's system info (architecture, kubelet version, ...), once it registered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_info: Option<BTreeMap<String, String>>,
}

/// `Machine.status.initialization`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MachineInitialization {
    /// The InfraMachine reported provisioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_provisioned: Option<bool>,
    /// The bootstrap data secret exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_data_secret_created: Option<bool>,
}

impl Machine {
    /// Whether CAPI marks this Machine as a control-plane machine.
    pub fn is_control_plane(&self) -> bool {
        self.metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(crate::keys::CONTROL_PLANE_LABEL))
    }
}

impl Cluster {
    /// Whether `spec.paused` is set.
    pub fn is_paused(&self) -> bool {
        self.spec.paused.unwrap_or(false)
    }

    /// Whether CAPI marked the cluster's infrastructure provisioned.
    pub fn infrastructure_provisioned(&self) -> bool {
        self.status
            .as_ref()
            .and_then(|s| s.initialization.as_ref())
            .and_then(|i| i.infrastructure_provisioned)
            .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Objects as CAPI v1.11+ serves them, with fields these views do not model.
    #[test]
    fn real_v1beta2_objects_read_with_unknown_fields_ignored() {
        let cluster: Cluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Cluster",
            "metadata": {"name": "demo", "namespace": "default", "uid": "u1"},
            "spec": {
                "clusterNetwork": {"pods": {"cidrBlocks": ["172.25.0.0/16"]}},
                "controlPlaneEndpoint": {"host": "10.0.0.100", "port": 6443},
                "controlPlaneRef": {"apiGroup": "controlplane.cluster.x-k8s.io", "kind": "KubeadmControlPlane", "name": "demo-cp"},
                "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "MicrovmCluster", "name": "demo"},
                "paused": true
            },
            "status": {
                "initialization": {"infrastructureProvisioned": true, "controlPlaneInitialized": false},
                "failureDomains": [{"name": "r1", "controlPlane": true, "attributes": {"rack": "1"}}],
                "conditions": [{"type": "Available", "status": "False", "reason": "NotAvailable", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                "controlPlane": {"desiredReplicas": 1},
                "phase": "Provisioned",
                "observedGeneration": 3
            }
        }))
        .unwrap();
        assert!(cluster.is_paused() && cluster.infrastructure_provisioned());
        assert_eq!(
            cluster.spec.infrastructure_ref.unwrap().kind,
            "MicrovmCluster"
        );

        let machine: Machine = serde_json::from_value(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Machine",
            "metadata": {"name": "m1", "namespace": "default", "labels": {"cluster.x-k8s.io/control-plane": ""}},
            "spec": {
                "clusterName": "demo",
                "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfig", "name": "m1"}, "dataSecretName": "m1"},
                "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "MicrovmMachine", "name": "m1"},
                "version": "v1.33.0",
                "failureDomain": "r1",
                "providerID": "microvm://10.0.0.1:9090/01KE75BHT9H6D7V5YG0KYGRXX2",
                "deletion": {"nodeDrainTimeoutSeconds": 60},
                "readinessGates": [{"conditionType": "X"}]
            },
            "status": {
                "initialization": {"infrastructureProvisioned": true, "bootstrapDataSecretCreated": true},
                "nodeRef": {"name": "m1"},
                "addresses": [{"type": "InternalIP", "address": "10.0.0.50"}],
                "nodeInfo": {"architecture": "amd64", "kubeletVersion": "v1.33.0"},
                "phase": "Running",
                "deprecated": {"v1beta1": {"failureReason": null}}
            }
        }))
        .unwrap();
        assert!(machine.is_control_plane());
        assert_eq!(
            machine.spec.bootstrap.data_secret_name.as_deref(),
            Some("m1")
        );
        assert_eq!(machine.spec.failure_domain.as_deref(), Some("r1"));
        assert_eq!(
            machine.spec.deletion.unwrap().node_drain_timeout_seconds,
            Some(60)
        );
        let status = machine.status.unwrap();
        assert_eq!(status.node_ref.unwrap()["name"], "m1");
        assert_eq!(status.addresses[0].address, "10.0.0.50");
    }
}
