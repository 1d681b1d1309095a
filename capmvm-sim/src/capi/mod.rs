//! A stand-in for the CAPI core controllers a provider relies on (capi-contract.md 2.2, 3.2, 3.4, 3.6):
//!
//! - **Cluster**: sets its ownerReference and `cluster-name` label on the MicrovmCluster, reads
//!   `status.initialization.provisioned`, copies failure domains and the endpoint, sets its own
//!   `infrastructureProvisioned`; on deletion removes its MachineDeployments and Machines, then the
//!   MicrovmCluster, then itself.
//! - **MachineDeployment** (the replica set): clones MicrovmMachines from the MicrovmMachineTemplate
//!   (labels, annotations, ownerRefs as CAPI sets them) and creates Machines; scales up and down.
//! - **Machine**: takes controller ownership of its MicrovmMachine, writes the bootstrap Secret
//!   (`value`, `format: cloud-config`) and `spec.bootstrap.dataSecretName`, copies providerID,
//!   addresses, failure domain and provisioned back; deletes in CAPI's order (infra machine first, wait,
//!   then release the Machine).
//!
//! - **Workload clusters** ([`workload`]): an API emulator per Cluster and its `<cluster>-kubeconfig`
//!   Secret; **hollow kubelets** ([`kubelet`]) register the Nodes; the Machine controller matches
//!   them by providerID and a **MachineHealthCheck** remediates unhealthy ones ([`nodes`]).
//!
//! It is deliberately small: no MachineSets, no KubeadmControlPlane (a control plane is a
//! MachineDeployment whose template carries the control-plane label).

mod controllers;
mod crds;
// Issue 13: workload clusters, hollow kubelets, Machine <-> Node and MachineHealthCheck.
pub mod kubelet;
pub mod nodes;
pub mod workload;

pub use controllers::{StandIn, run, run_with};
pub use crds::{MachineDeployment, MachineDeploymentSpec, crds};

/// Finalizer CAPI puts on Clusters.
pub const CLUSTER_FINALIZER: &str = "cluster.cluster.x-k8s.io";
/// Finalizer CAPI puts on Machines.
pub const MACHINE_FINALIZER: &str = "machine.cluster.x-k8s.io";
/// Label CAPI puts on a MachineDeployment's Machines.
pub const DEPLOYMENT_NAME_LABEL: &str = "cluster.x-k8s.io/deployment-name";
/// Annotation that makes a Machine the first to go on scale-down.
pub const DELETE_MACHINE_ANNOTATION: &str = "cluster.x-k8s.io/delete-machine";
