//! Read-only views of CAPI core `cluster.x-k8s.io/v1beta2` Cluster, Machine and MachinePool.
//!
//! Only the fields the operator reads are modelled (capi-contract.md 2.2, 3.3); everything else is
//! ignored on read. These views are never written back, so dropping the rest loses nothing.
//!
//! Every modelled field is read leniently: a value of an unexpected shape reads as absent instead of
//! failing the whole object. CAPI copies fields from other objects (a Node's `nodeInfo` gained
//! `swap: {capacity}` in Kubernetes 1.33) and its schemas grow each release; one such object must not
//! stop a watch, whose first list fails as a whole when any item does not deserialize.
//! `schema = "disabled"`: CAPI owns these CRDs.

use kube::CustomResource;
use serde::de::Deserializer;
use serde::{Deserialize, Serialize};

use crate::cluster::ApiEndpoint;

/// The API group of CAPI core.
pub const CAPI_GROUP: &str = "cluster.x-k8s.io";

/// The version of CAPI core's API this provider reads (contract v1beta2).
pub const CAPI_VERSION: &str = "v1beta2";

mod lenient;
use lenient::{Lenient, Shape, lenient, read_shape, view_from_map};

/// Declares a view whose every field is [`Lenient`]: the serde attribute is said once, here.
macro_rules! lenient {
    (
        $(#[$attr:meta])*
        pub struct $name:ident {
            $($(#[$field_attr:meta])* pub $field:ident: $ty:ty,)*
        }
    ) => {
        $(#[$attr])*
        pub struct $name {
            $(
                $(#[$field_attr])*
                #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Lenient::absent")]
                pub $field: $ty,
            )*
        }

        impl Lenient for $name {
            fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Self>, D::Error> {
                read_shape(deserializer)
            }
        }

        impl Shape for $name {
            fn from_map<'de, A: serde::de::MapAccess<'de>>(map: A) -> Result<Option<Self>, A::Error> {
                view_from_map(map)
            }
        }
    };
}

lenient! {
    /// `Cluster.spec` (v1beta2), the fields the operator reads.
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
        pub paused: Option<bool>,
        /// The control-plane endpoint, once known.
        pub control_plane_endpoint: Option<ApiEndpoint>,
        /// The InfraCluster (our MicrovmCluster).
        pub infrastructure_ref: Option<ContractVersionedObjectReference>,
    }
}

lenient! {
    /// `Cluster.status` (v1beta2), the fields the operator reads.
    #[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
    #[serde(rename_all = "camelCase")]
    pub struct ClusterStatus {
        /// Initialization milestones.
        pub initialization: Option<ClusterInitialization>,
    }
}

lenient! {
    /// `Cluster.status.initialization`.
    #[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
    #[serde(rename_all = "camelCase")]
    pub struct ClusterInitialization {
        /// The InfraCluster reported provisioned.
        pub infrastructure_provisioned: Option<bool>,
    }
}

lenient! {
    /// A v1beta2 reference: `{apiGroup, kind, name}` in the referrer's namespace.
    #[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
    #[serde(rename_all = "camelCase")]
    pub struct ContractVersionedObjectReference {
        /// API group of the referent.
        pub api_group: String,
        /// Kind of the referent.
        pub kind: String,
        /// Name of the referent.
        pub name: String,
    }
}

lenient! {
    /// `Machine.spec` (v1beta2): the fields the operator reads, and the two the simulator also reads.
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
        pub cluster_name: String,
        /// Bootstrap data.
        pub bootstrap: Bootstrap,
        /// The InfraMachine (our MicrovmMachine).
        pub infrastructure_ref: ContractVersionedObjectReference,
        /// The failure domain the machine must be placed in.
        pub failure_domain: Option<String>,
        /// Copied by CAPI from the InfraMachine.
        #[serde(rename = "providerID")]
        pub provider_id: Option<String>,
        /// The Kubernetes version the machine runs (read by the simulator's bootstrap provider and
        /// kubelets; the operator does not read it).
        pub version: Option<String>,
    }
}

lenient! {
    /// `Machine.spec.bootstrap`.
    #[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
    #[serde(rename_all = "camelCase")]
    pub struct Bootstrap {
        /// Name of the Secret (same namespace) holding the bootstrap data under key `value`.
        pub data_secret_name: Option<String>,
        /// The bootstrap provider's config (a KubeadmConfig) whose Secret CAPI copies into
        /// `dataSecretName` (read by the simulator's CAPI stand-in; the operator does not read it).
        pub config_ref: Option<ContractVersionedObjectReference>,
    }
}

lenient! {
    /// `Machine.status` (v1beta2): the provisioning milestone (the simulator's CAPI stand-in counts
    /// provisioned Machines with it) and the conditions a pool reads (`OwnerRemediated`).
    #[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
    #[serde(rename_all = "camelCase")]
    pub struct MachineStatus {
        /// Initialization milestones.
        pub initialization: Option<MachineInitialization>,
        /// The Machine's (metav1) conditions: type, status and reason only.
        pub conditions: Vec<MachineCondition>,
        /// The Node core matched to the Machine's providerID, once it registered.
        pub node_ref: Option<MachineNodeReference>,
    }
}

lenient! {
    /// `Machine.status.nodeRef`: the Node of the Machine in its workload cluster.
    #[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
    #[serde(rename_all = "camelCase")]
    pub struct MachineNodeReference {
        /// The Node's name.
        pub name: String,
    }
}

lenient! {
    /// One of `Machine.status.conditions`, the parts a provider reads.
    #[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
    #[serde(rename_all = "camelCase")]
    pub struct MachineCondition {
        /// The condition type, for example `OwnerRemediated`.
        pub r#type: String,
        /// `True`, `False` or `Unknown`.
        pub status: String,
        /// Why, in CamelCase.
        pub reason: String,
    }
}

/// The Machine condition a MachineHealthCheck sets to `False` when the Machine's owner must replace it.
pub const OWNER_REMEDIATED_CONDITION: &str = "OwnerRemediated";

lenient! {
    /// `Machine.status.initialization`.
    #[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
    #[serde(rename_all = "camelCase")]
    pub struct MachineInitialization {
        /// The InfraMachine reported provisioned.
        pub infrastructure_provisioned: Option<bool>,
    }
}

lenient! {
    /// `MachinePool.spec` (v1beta2), the fields a MicrovmMachinePool reads.
    #[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
    #[kube(
        group = "cluster.x-k8s.io",
        version = "v1beta2",
        kind = "MachinePool",
        plural = "machinepools",
        namespaced,
        status = "MachinePoolStatus",
        derive = "PartialEq",
        derive = "Default",
        schema = "disabled"
    )]
    #[serde(rename_all = "camelCase")]
    pub struct MachinePoolSpec {
        /// Name of the owning Cluster.
        pub cluster_name: String,
        /// Desired number of instances (CAPI defaults it to 1; the scale subresource writes it).
        pub replicas: Option<i32>,
        /// Failure domains to spread instances over; empty means all of the cluster's.
        pub failure_domains: Vec<String>,
        /// The Machine template: its bootstrap data is what new instances boot with.
        pub template: MachinePoolTemplate,
    }
}

lenient! {
    /// `MachinePool.spec.template`.
    #[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
    pub struct MachinePoolTemplate {
        /// `spec.template.spec`.
        pub spec: MachinePoolMachineSpec,
    }
}

lenient! {
    /// `MachinePool.spec.template.spec`, the part a pool reads.
    #[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
    #[serde(rename_all = "camelCase")]
    pub struct MachinePoolMachineSpec {
        /// Bootstrap data shared by every instance (one Secret, rewritten when CABPK rotates its token).
        pub bootstrap: Bootstrap,
    }
}

lenient! {
    /// `MachinePool.status` (v1beta2), the fields a pool reads.
    #[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
    #[serde(rename_all = "camelCase")]
    pub struct MachinePoolStatus {
        /// Instances core counted (copied from the MicrovmMachinePool).
        pub replicas: Option<i32>,
        /// Instances whose Node is ready.
        pub ready_replicas: Option<i32>,
        /// Initialization milestones.
        pub initialization: Option<MachineInitialization>,
    }
}

impl MachinePool {
    /// The desired number of instances: `spec.replicas`, or 1 as CAPI defaults it.
    pub fn desired_replicas(&self) -> i32 {
        self.spec.replicas.unwrap_or(1).max(0)
    }

    /// The bootstrap data Secret every new instance boots with, once CAPI set it.
    pub fn bootstrap_data_secret_name(&self) -> Option<&str> {
        self.spec
            .template
            .spec
            .bootstrap
            .data_secret_name
            .as_deref()
    }
}

impl Machine {
    /// Whether the Machine's Node has registered (core set `status.nodeRef`).
    pub fn has_node(&self) -> bool {
        self.status
            .as_ref()
            .and_then(|s| s.node_ref.as_ref())
            .is_some_and(|n| !n.name.is_empty())
    }

    /// Whether a MachineHealthCheck asked the Machine's owner to replace it (`OwnerRemediated=False`):
    /// core leaves the replacement of MachinePool Machines to the pool.
    pub fn owner_remediation_requested(&self) -> bool {
        self.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.r#type == OWNER_REMEDIATED_CONDITION && c.status == "False")
        })
    }

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

    /// Without the CRDs at hand (tests/capi_views.rs generates from them): a Machine as Kubernetes
    /// 1.33 nodes make CAPI write it, and modelled fields of the wrong shape, read as absent.
    #[test]
    fn a_machine_with_node_swap_and_odd_shapes_reads() {
        let machine: Machine = serde_json::from_value(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Machine",
            "metadata": {"name": "m1", "namespace": "default", "labels": {"cluster.x-k8s.io/control-plane": ""}},
            "spec": {
                "clusterName": "demo",
                "bootstrap": {"dataSecretName": "m1"},
                "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "MicrovmMachine", "name": "m1"},
                "failureDomain": ["r1"],
                "providerID": 7
            },
            "status": {
                "nodeInfo": {"architecture": "amd64", "swap": {"capacity": 1_073_741_824_i64}},
                "initialization": "yes"
            }
        }))
        .unwrap();
        assert!(machine.is_control_plane());
        assert_eq!(
            machine.spec.bootstrap.data_secret_name.as_deref(),
            Some("m1")
        );
        assert_eq!(machine.spec.infrastructure_ref.kind, "MicrovmMachine");
        assert_eq!(machine.spec.failure_domain, None);
        assert_eq!(machine.spec.provider_id, None);
        assert_eq!(machine.status.unwrap().initialization, None);
    }

    /// Read from text, as watch events are (the parser, not a JSON tree): each modelled field of
    /// another shape reads as absent and the rest of the object as it is; a list with one item of
    /// another shape reads as absent whole.
    #[test]
    fn odd_shapes_read_from_text_as_absent_and_leave_the_rest() {
        let text = r#"{
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Machine",
            "metadata": {"name": "m1", "namespace": "default"},
            "spec": {
                "clusterName": ["demo"],
                "bootstrap": {"dataSecretName": null, "configRef": {"kind": 3, "name": "c1", "extra": [[{}]]}},
                "infrastructureRef": "MicrovmMachine",
                "providerID": {"nested": {"deep": [1, 2.5, "x", true, null]}},
                "version": "v1.33.0"
            },
            "status": {
                "initialization": {"infrastructureProvisioned": "true"},
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": 7, "message": "a \"quoted\" message", "lastTransitionTime": "2026-11-27T00:00:00Z"},
                    {"type": "OwnerRemediated", "status": "False", "reason": "Remediate"}
                ],
                "nodeRef": {"name": "n1", "uid": "u"}
            }
        }"#;
        let machine: Machine = serde_json::from_str(text).unwrap();
        assert_eq!(machine.spec.cluster_name, "");
        assert_eq!(machine.spec.bootstrap.data_secret_name, None);
        let config = machine.spec.bootstrap.config_ref.as_ref().unwrap();
        assert_eq!((config.kind.as_str(), config.name.as_str()), ("", "c1"));
        assert_eq!(machine.spec.infrastructure_ref, Default::default());
        assert_eq!(machine.spec.provider_id, None);
        assert_eq!(machine.spec.version.as_deref(), Some("v1.33.0"));
        let status = machine.status.as_ref().unwrap();
        assert_eq!(
            status.initialization,
            Some(MachineInitialization {
                infrastructure_provisioned: None
            })
        );
        assert_eq!(status.conditions.len(), 2);
        assert_eq!(status.conditions[0].reason, "");
        assert!(machine.owner_remediation_requested());
        assert!(machine.has_node());

        let one_odd_condition = text.replace(
            r#"{"type": "OwnerRemediated", "status": "False", "reason": "Remediate"}"#,
            r#""OwnerRemediated""#,
        );
        let machine: Machine = serde_json::from_str(&one_odd_condition).unwrap();
        assert!(machine.status.as_ref().unwrap().conditions.is_empty());
        assert!(machine.has_node(), "the fields after the list still read");

        let pool: MachinePool = serde_json::from_str(
            r#"{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachinePool",
                "metadata": {"name": "p"},
                "spec": {"clusterName": "demo", "replicas": 4294967296, "failureDomains": ["a", "b"],
                         "template": {"spec": {"bootstrap": {"dataSecretName": "s"}}}},
                "status": {"replicas": 3, "readyReplicas": -1}}"#,
        )
        .unwrap();
        assert_eq!(pool.spec.replicas, None, "beyond an i32");
        assert_eq!(pool.spec.failure_domains, ["a", "b"]);
        assert_eq!(pool.bootstrap_data_secret_name(), Some("s"));
        assert_eq!(pool.status.as_ref().unwrap().ready_replicas, Some(-1));

        let cluster: Cluster = serde_json::from_str(
            r#"{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "metadata": {"name": "c"},
                "spec": {"paused": "yes", "controlPlaneEndpoint": {"host": "10.0.0.1", "port": "6443"}}}"#,
        )
        .unwrap();
        assert!(!cluster.is_paused());
        assert_eq!(cluster.spec.control_plane_endpoint, None);

        assert!(
            serde_json::from_str::<Machine>(
                r#"{"metadata": {"name": "m"}, "spec": {"clusterName": "#
            )
            .is_err(),
            "malformed JSON is still an error"
        );
    }
}
