//! A pool's plan: its steps are fields, in the order the operator carries them out.

use std::collections::BTreeMap;

use capmvm_api::{MicrovmMachinePoolStatus, MicrovmMachineSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::plan::{Event, Requeue};

/// What to do for one MicrovmMachinePool. The operator carries the fields out in declaration order,
/// stopping at the first failure (the next decision starts from what then exists):
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolPlan {
    /// 1. Add the pool's finalizer (before any instance exists, so deleting the pool waits for them).
    pub add_finalizer: bool,
    /// 2. Create these instances (MicrovmMachines, with a non-controller ownerReference to the pool).
    pub create_instances: Vec<NewInstance>,
    /// 2b. Copy `cluster.x-k8s.io/delete-machine` from these instances' Machines onto them (set, or
    ///     cleared once the Machine no longer carries it), as the contract asks of pool providers.
    pub mark_instances: Vec<InstanceMark>,
    /// 3. Delete these Machines (core drains each, then deletes its instance, whose microVM the
    ///    machine engine deletes).
    pub delete_machines: Vec<MachineDeletion>,
    /// 4. Delete these instances directly: only while the pool is deleted, and only those whose
    ///    Machine never appeared (there is nothing to drain).
    pub delete_instances: Vec<String>,
    /// 5. Write `spec.providerIDList` when it changed (sorted; every instance that still exists).
    pub provider_id_list: Option<Vec<String>>,
    /// 6. Write the status (the operator writes only a difference).
    pub status: Option<MicrovmMachinePoolStatus>,
    /// 7. Record these events on the pool.
    pub events: Vec<Event>,
    /// 8. Remove the finalizer: the pool is deleted and none of its instances exists.
    pub remove_finalizer: bool,
    /// When to decide again.
    pub requeue: Requeue,
}

/// One write of a [`PoolPlan`] to an instance or a Machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolWrite {
    /// Step 2: create an instance.
    CreateInstance,
    /// Step 2b: set or clear an instance's delete mark.
    MarkInstance,
    /// Step 3: delete a Machine.
    DeleteMachine,
    /// Step 4: delete an instance.
    DeleteInstance,
}

/// Whether `write` counts as done when the API server answers that its object does not exist
/// (404): a delete, or a delete mark, of an object already gone (deleted meanwhile by core, a
/// person, or our own earlier write whose answer was lost) is what it was for, and the plan goes
/// on. A create never finds its object missing: a 404 there (its namespace is gone) fails the step.
pub fn done_when_gone(write: PoolWrite) -> bool {
    match write {
        PoolWrite::MarkInstance | PoolWrite::DeleteMachine | PoolWrite::DeleteInstance => true,
        PoolWrite::CreateInstance => false,
    }
}

/// An instance to create.
#[derive(Clone, Debug, PartialEq)]
pub struct NewInstance {
    /// Its ownerReference to the pool: not the controller (core makes the instance's Machine that).
    pub owner: OwnerReference,
    /// Its name (core creates its Machine with the same name).
    pub name: String,
    /// `cluster.x-k8s.io/pool-name` and `cluster.x-k8s.io/cluster-name`.
    pub labels: BTreeMap<String, String>,
    /// The template hash and the chosen failure domain.
    pub annotations: BTreeMap<String, String>,
    /// The pool's template.
    pub spec: MicrovmMachineSpec,
}

/// The delete-machine annotation an instance must carry, as its Machine does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceMark {
    /// The instance's name.
    pub instance: String,
    /// Set it (`true`) or remove it (`false`).
    pub delete_requested: bool,
}

/// A Machine to delete, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineDeletion {
    /// The Machine's name (its instance's name).
    pub machine: String,
    /// Why it goes.
    pub reason: DeletionReason,
}

/// Why an instance's Machine is deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeletionReason {
    /// Its microVM failed (FAILED is terminal).
    Failed,
    /// Its microVM vanished from its host.
    Vanished,
    /// A MachineHealthCheck marked its Machine `OwnerRemediated=False`.
    Remediated,
    /// More instances exist than desired.
    ScaleDown,
    /// It was made from an older template.
    Outdated,
    /// Its host is being evacuated (`maintenance: Evacuate`).
    HostEvacuating,
    /// The pool is being deleted.
    PoolDeleted,
}

impl DeletionReason {
    /// How a message says it.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Failed => "its microVM failed",
            Self::Vanished => "its microVM vanished",
            Self::Remediated => "a MachineHealthCheck asked for its remediation",
            Self::ScaleDown => "scale down",
            Self::Outdated => "made from an older template",
            Self::HostEvacuating => "its host is being evacuated",
            Self::PoolDeleted => "the pool is being deleted",
        }
    }
}

/// Event reasons of a pool.
pub mod events {
    /// Instances were created.
    pub const INSTANCES_CREATED: &str = "InstancesCreated";
    /// Machines were deleted to scale down or roll.
    pub const MACHINES_DELETED: &str = "MachinesDeleted";
    /// Machines of broken instances were deleted to replace them.
    pub const INSTANCES_REPLACED: &str = "InstancesReplaced";
}
