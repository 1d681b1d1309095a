//! What the operator saw for one MicrovmMachinePool and its instances.

use std::collections::BTreeSet;
use std::sync::Arc;

use capmvm_api::capi::Machine;
use capmvm_api::conditions::{reasons, types};
use capmvm_api::keys::DELETE_MACHINE_ANNOTATION;
use capmvm_api::{MicrovmCluster, MicrovmMachine, MicrovmMachinePool, VmState};
use k8s_openapi::jiff::Timestamp;

use crate::conditions;
use crate::observe::{ClusterFacts, MachinePoolFacts};

/// Everything `decide_pool` decides from.
#[derive(Clone, Debug)]
pub struct ObservedPool {
    /// The MicrovmMachinePool as read.
    pub pool: MicrovmMachinePool,
    /// The MachinePool that owns it (ownerReference kind MachinePool, group cluster.x-k8s.io), if any.
    pub machine_pool: Option<MachinePoolFacts>,
    /// The Cluster named by the `cluster.x-k8s.io/cluster-name` label, if it exists.
    pub cluster: Option<ClusterFacts>,
    /// The Cluster's MicrovmCluster, if it exists (shared with the cache it was read from).
    pub infra_cluster: Option<Arc<MicrovmCluster>>,
    /// Every instance of the pool (MicrovmMachines labelled with its pool name), deleting ones included.
    pub instances: Vec<ObservedInstance>,
    /// Names a new instance must not take: Machines of the MachinePool whose instance is gone but
    /// which are still being deleted (core would mistake a new instance of that name for theirs).
    pub reserved_names: BTreeSet<String>,
    /// When this operator process last wrote the pool's status, if it has: status writes are
    /// coalesced ([`crate::pool::STATUS_WRITE_INTERVAL`]).
    pub last_status_write: Option<Timestamp>,
}

/// One instance (a MicrovmMachine) and its MachinePool Machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedInstance {
    /// The MicrovmMachine's name (its Machine has the same name).
    pub name: String,
    /// Its Machine, once core created it.
    pub machine: Option<InstanceMachine>,
    /// The template hash annotation it was made with (`None` reads as outdated).
    pub template_hash: Option<String>,
    /// What its microVM does.
    pub health: InstanceHealth,
    /// The MicrovmMachine is being deleted.
    pub deleting: bool,
    /// When it was created (ties are broken by name).
    pub created: Timestamp,
    /// Its providerID, once its microVM exists.
    pub provider_id: Option<String>,
    /// The failure domain the pool chose for it.
    pub failure_domain: Option<String>,
    /// The instance itself carries `cluster.x-k8s.io/delete-machine` (copied down from its Machine).
    pub delete_annotated: bool,
    /// The host recorded for its microVM (canonical endpoint), once placed.
    pub host: Option<String>,
}

/// What the pool reads from an instance's Machine: a change of any of it is worth a decision of
/// the pool (the operator wakes the pool when it changes).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct InstanceMachine {
    /// The Machine carries `cluster.x-k8s.io/delete-machine` (cluster-autoscaler's or a person's
    /// pick for the next scale down).
    pub delete_requested: bool,
    /// A MachineHealthCheck set `OwnerRemediated=False` on it: core leaves the replacement to the pool.
    pub owner_remediation_requested: bool,
    /// The Machine is being deleted (draining, then its MicrovmMachine goes).
    pub deleting: bool,
    /// Its Node registered (core set `status.nodeRef`): only then does a running instance count as
    /// available in a roll, as CAPI counts a MachineSet's (a running microVM without its Node
    /// serves no Pod).
    pub joined: bool,
}

impl From<&Machine> for InstanceMachine {
    fn from(machine: &Machine) -> Self {
        Self {
            delete_requested: machine
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(DELETE_MACHINE_ANNOTATION)),
            owner_remediation_requested: machine.owner_remediation_requested(),
            deleting: machine.metadata.deletion_timestamp.is_some(),
            joined: machine.has_node(),
        }
    }
}

/// The state of an instance's microVM, as its MicrovmMachine reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InstanceHealth {
    /// Not placed, pending, or starting.
    Provisioning,
    /// Its microVM runs (`Ready=True`).
    Ready,
    /// Flintlock gave up on its microVM (FAILED is terminal).
    Failed,
    /// Its microVM vanished from its host (it is never re-created in place).
    Vanished,
}

impl InstanceHealth {
    /// Reads an instance's health from its MicrovmMachine status.
    pub fn of(machine: &MicrovmMachine) -> Self {
        let Some(status) = &machine.status else {
            return Self::Provisioning;
        };
        if status.vm_state == Some(VmState::Failed) {
            return Self::Failed;
        }
        match conditions::get(&status.conditions, types::READY) {
            Some(c) if c.reason == reasons::MICROVM_NOT_FOUND => Self::Vanished,
            Some(c) if c.reason == reasons::MICROVM_PROVISION_FAILED => Self::Failed,
            Some(c) if c.status == capmvm_api::conditions::status::TRUE => Self::Ready,
            _ => Self::Provisioning,
        }
    }
}

impl ObservedInstance {
    /// The instance or its Machine is being deleted: it still exists, but is no longer counted.
    pub fn leaving(&self) -> bool {
        self.deleting || self.machine.as_ref().is_some_and(|m| m.deleting)
    }
}
