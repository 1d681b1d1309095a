//! A stand-in for the CAPI controllers a provider relies on (capi-contract.md 2.2, 3.2, 3.4, 3.6),
//! speaking CAPI v1beta2 as CAPI v1.14 does (its CRDs, see `crds`; its webhooks' defaulting, see
//! `admission`):
//!
//! - **Cluster**: sets its ownerReference and `cluster-name` label on the MicrovmCluster and the
//!   KubeadmControlPlane, reads `status.initialization.provisioned`, copies failure domains and the
//!   endpoint, sets `infrastructureProvisioned` and `controlPlaneInitialized`; on deletion removes its
//!   MachineDeployments, control plane and Machines, then the MicrovmCluster, then itself.
//! - **MachineDeployment** (the replica set): creates Machines, each with a MicrovmMachine cloned from
//!   the MicrovmMachineTemplate and a KubeadmConfig from the KubeadmConfigTemplate (`clone`); scales
//!   up and down.
//! - **KubeadmControlPlane** (`kcp`): control-plane Machines the same way, from
//!   `spec.machineTemplate` and `spec.kubeadmConfigSpec`; scales; reports replicas and initialization.
//! - **KubeadmConfig** (`bootstrap`, CABPK's role): renders the cloud-config into the bootstrap Secret.
//! - **Machine**: adopts its MicrovmMachine and KubeadmConfig, copies the bootstrap Secret's name,
//!   providerID, addresses, failure domain and provisioned; deletes in CAPI's order (infra machine
//!   first, wait, then release the Machine).
//!
//! - **Workload clusters** ([`workload`]): an API emulator per Cluster and its `<cluster>-kubeconfig`
//!   Secret; **hollow kubelets** ([`kubelet`]) register the Nodes; the Machine controller matches
//!   them by providerID and a **MachineHealthCheck** remediates unhealthy ones ([`nodes`]).
//!
//! - **MachinePool** ([`machinepool`], capi-contract 5.2 to 5.6): owns its bootstrap config and
//!   InfraMachinePool, copies their readiness, `providerIDList` and replicas, creates MachinePool
//!   Machines for the provider's instances, counts Nodes and deletes retired ones.
//!
//! No MachineSets (a MachineDeployment makes its Machines itself) and no rollouts.

pub mod admission;
pub mod bootstrap;
mod clone;
mod controllers;
mod crds;
mod informers;
pub mod kcp;
pub mod kubelet;
pub mod machinepool;
mod machinepool_machines;
pub mod nodes;
mod retry;
pub mod workload;

pub use controllers::{
    DEFAULT_TOKEN_ROTATION, StandIn, StandInOptions, StandInPlays, run, run_with, run_with_options,
};
pub use crds::{
    CAPI_CRDS_VERSION, CrdError, LabelSelector, MachineDeployment, MachineDeploymentSpec, TOUCHED,
    capi_crds, crds, parse_touched, read_crds, real_crds_dir, real_crds_dir_or_skip, schema_at,
    under_ci, v1beta2_schema,
};

/// Finalizer CAPI puts on Clusters.
pub const CLUSTER_FINALIZER: &str = "cluster.cluster.x-k8s.io";
/// Finalizer CAPI puts on Machines.
pub const MACHINE_FINALIZER: &str = "machine.cluster.x-k8s.io";
/// Label CAPI puts on a MachineDeployment's Machines.
pub const DEPLOYMENT_NAME_LABEL: &str = "cluster.x-k8s.io/deployment-name";
/// Annotation that makes a Machine the first to go on scale-down.
pub const DELETE_MACHINE_ANNOTATION: &str = "cluster.x-k8s.io/delete-machine";
