//! The pure decision engine of capmvm: observed state in, a plan out, as data.
//!
//! No I/O, no async, no clock: the operator gathers an observation ([`observe`]), calls a `decide`
//! function with the current time, and carries out the returned plan ([`plan::MachinePlan`],
//! [`plan::ClusterPlan`], [`pool::PoolPlan`]: steps are fields, in the order they are carried out).
//! The same observation and time always give the same plan. Every engine starts with the same
//! [`preamble`] (pause, then the delete or the normal path, then the gates), and every decision the
//! operator carries out is made here.
//!
//! - [`machine::decide`] for MicrovmMachines: gates, placement, exactly-once creation, deletion.
//! - [`cluster::decide_cluster`] for MicrovmClusters: failure domains, provisioning, host reachability.
//! - [`pool::decide_pool`] for MicrovmMachinePools: scale, roll, repair, over MicrovmMachine instances.
//! - [`template::decide_template`] for MicrovmMachineTemplates: capacity for scale from zero.

pub mod cloudinit;
pub mod cluster;
pub mod conditions;
pub mod host_call;
pub mod machine;
pub mod microvm;
pub mod observe;
pub mod placement;
pub mod plan;
pub mod pool;
pub mod preamble;
pub mod template;

pub use cluster::decide_cluster;
pub use machine::decide;
pub use observe::{
    BootstrapData, ClusterFacts, CredentialSecret, EvacuationGroup, EvacuationPeer, FailedHostCall,
    HostFacts, HostLookup, HostedVm, MachineFacts, MachinePoolFacts, ObservedCluster,
    ObservedMachine, ObservedVm, Reachability, RunningSpec, Sensitive, VmState,
};
pub use plan::{ClusterPlan, Event, EventKind, HostCall, HostRecord, MachinePlan, Requeue};
pub use pool::{PoolPlan, decide_pool};
pub use template::decide_template;
