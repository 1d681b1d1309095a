//! Plans: what the engine decided, as data, for the operator to carry out.

use std::time::Duration;

use capmvm_api::{HostEndpoint, MicrovmClusterStatus, MicrovmMachineStatus};

use crate::microvm::MicrovmSpec;

/// What to do for one MicrovmMachine. The operator carries the fields out in declaration order,
/// stopping at the first failure, so the executor reads top to bottom like the plan:
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MachinePlan {
    /// 1. Add the finalizer, in one metadata write with [`Self::record_host`], conditional on the
    ///    resourceVersion the observation was read at: a decision made from a stale read cannot
    ///    reach a host.
    pub add_finalizer: bool,
    /// 1. (the same write) Record the chosen host before the microVM is created there.
    pub record_host: Option<HostRecord>,
    /// 1. (the same write) Record that a machine another provider placed (its providerID set, no
    ///    host recorded by us) is now ours: its providerID's host in the host annotation. Nothing
    ///    else changes: the microVM and the providerID stay as they are.
    pub record_adoption: Option<HostEndpoint>,
    /// 2. Set `spec.providerID` (a spec write, conditional on the version read: the generation
    ///    moves by one, which the conditions of [`Self::status`] already name).
    pub provider_id: Option<String>,
    /// 3. Write the status, if it differs from the object's.
    pub status: Option<MicrovmMachineStatus>,
    /// 4. Call the host, in this order. A failed call ends the plan; the failure is part of the next
    ///    observation ([`crate::observe::ObservedMachine::failed_host_call`]).
    pub host_calls: Vec<HostCall>,
    /// 5. Record these events on the object (after the host calls, so they record done work).
    pub events: Vec<Event>,
    /// 6. Remove the finalizer: the microVM is gone (or was never created, or is abandoned). Never
    ///    in the same plan as a host call.
    pub remove_finalizer: bool,
    /// When to decide again.
    pub requeue: Requeue,
}

impl MachinePlan {
    /// Whether the plan changes nothing but, perhaps, the status.
    pub fn has_no_effects(&self) -> bool {
        !self.add_finalizer
            && self.record_host.is_none()
            && self.record_adoption.is_none()
            && self.provider_id.is_none()
            && self.host_calls.is_empty()
            && self.events.is_empty()
            && !self.remove_finalizer
    }

    /// The microVMs this plan creates: where, and what.
    pub fn creates(&self) -> impl Iterator<Item = (&HostEndpoint, &MicrovmSpec)> {
        self.host_calls.iter().filter_map(|c| match c {
            HostCall::Create { host, spec } => Some((host, spec.as_ref())),
            HostCall::Delete { .. } => None,
        })
    }

    /// The microVMs this plan deletes: where, and flintlock's uid.
    pub fn deletes(&self) -> impl Iterator<Item = (&HostEndpoint, &str)> {
        self.host_calls.iter().filter_map(|c| match c {
            HostCall::Delete { host, uid } => Some((host, uid.as_str())),
            HostCall::Create { .. } => None,
        })
    }
}

/// The host recorded before a create, with the machine's origin uid, in annotations: a recreated
/// object (`clusterctl move`) still finds its microVM.
///
/// The write also sets the placement-attempt annotation to `attempt`, one more than the value the
/// decision read, so it always changes the object: with the resourceVersion test it is a
/// compare-and-swap that two writers deciding from the same version cannot both pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostRecord {
    /// The chosen host.
    pub host: HostEndpoint,
    /// The uid the microVM will carry in meta-data.
    pub origin_uid: String,
    /// The placement attempt this create is (1 for the first).
    pub attempt: u64,
    /// Who makes this attempt and when: the placement-claim annotation's value.
    pub claim: String,
}

/// One call to a flintlock host.
#[derive(Clone, Debug, PartialEq)]
pub enum HostCall {
    /// Create a microVM. The host is recorded first ([`MachinePlan::record_host`]).
    Create {
        /// Where.
        host: HostEndpoint,
        /// What.
        spec: Box<MicrovmSpec>,
    },
    /// Delete a microVM.
    Delete {
        /// Where.
        host: HostEndpoint,
        /// Flintlock's uid.
        uid: String,
    },
}

/// What to do for one MicrovmCluster, in the order the operator carries it out:
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterPlan {
    /// 1. Add the cluster's finalizer.
    pub add_finalizer: bool,
    /// 2. Add the credentials finalizer to these Secrets the cluster names, so they outlive the
    ///    cluster's machines (a namespace deletion removes everything at once).
    pub protect_secrets: Vec<String>,
    /// 3. Write the status; `None` leaves it alone (an externally managed object).
    pub status: Option<MicrovmClusterStatus>,
    /// 4. Record these events on the object.
    pub events: Vec<Event>,
    /// 5. Remove the credentials finalizer from these Secrets: no MicrovmCluster needs them.
    pub release_secrets: Vec<String>,
    /// 6. Remove the cluster's finalizer: its machines are gone.
    pub remove_finalizer: bool,
    /// When to decide again.
    pub requeue: Requeue,
}

impl ClusterPlan {
    /// Whether the plan changes nothing but, perhaps, the status.
    pub fn has_no_effects(&self) -> bool {
        !self.add_finalizer
            && self.protect_secrets.is_empty()
            && self.events.is_empty()
            && self.release_secrets.is_empty()
            && !self.remove_finalizer
    }
}

/// When to decide again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Requeue {
    /// When something watched changes (the object, its owners, its host's microVMs).
    #[default]
    Await,
    /// At once, after carrying out this plan and observing again: a multi-step action is under way
    /// (record the host, then create, then adopt the created microVM).
    Immediately,
    /// After a delay, as a safety net where no watch would wake us.
    After(Duration),
    /// After the object's exponential backoff: a host call failed in a way worth retrying.
    Backoff,
}

/// An event on the reconciled object (events.k8s.io/v1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Normal or Warning.
    pub kind: EventKind,
    /// CamelCase reason, one of [`reasons`].
    pub reason: &'static str,
    /// What was done, CamelCase (events.k8s.io `action`).
    pub action: &'static str,
    /// Human-readable note; never holds secrets.
    pub note: String,
}

/// Event type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// Expected transitions.
    Normal,
    /// Something an operator should look at.
    Warning,
}

/// Event reasons.
pub mod reasons {
    /// A microVM was asked for.
    pub const MICROVM_CREATED: &str = "MicrovmCreated";
    /// A microVM another provider created, with its providerID, is now this provider's.
    pub const MICROVM_ADOPTED: &str = "MicrovmAdopted";
    /// The microVM reached CREATED.
    pub const MICROVM_READY: &str = "MicrovmReady";
    /// Flintlock gave up on the microVM.
    pub const MICROVM_FAILED: &str = "MicrovmFailed";
    /// The microVM vanished from its host.
    pub const MICROVM_NOT_FOUND: &str = "MicrovmNotFound";
    /// A microVM deletion was asked for.
    pub const MICROVM_DELETING: &str = "MicrovmDeleting";
    /// The microVM is gone and the finalizer released.
    pub const MICROVM_DELETED: &str = "MicrovmDeleted";
    /// The finalizer was released without confirming the microVM is gone (abandon annotation).
    pub const MICROVM_ABANDONED: &str = "MicrovmAbandoned";
    /// A second microVM carrying this machine's uid was found and is being deleted.
    pub const DUPLICATE_MICROVM: &str = "DuplicateMicrovm";
    /// The spec is invalid.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// The host stopped answering.
    pub const HOST_UNREACHABLE: &str = "HostUnreachable";
    /// A host call failed.
    pub const HOST_CALL_FAILED: &str = "HostCallFailed";
    /// The host refused to create a microVM of this spec; not retried until the spec changes.
    pub const MICROVM_SPEC_REJECTED: &str = "MicrovmSpecRejected";
    /// The recorded host has a same-name microVM that is not this machine's; creation waits.
    pub const UNKNOWN_MICROVM_ON_HOST: &str = "UnknownMicrovmOnHost";
    /// Another provider stopped in the middle of creating this machine's microVM; nothing is done
    /// until a person checks the hosts.
    pub const UNFINISHED_BY_PREVIOUS_PROVIDER: &str = "UnfinishedByPreviousProvider";
    /// The spec was edited after the microVM was created; the edit cannot be applied.
    pub const SPEC_CHANGE_NOT_APPLIED: &str = "SpecChangeNotApplied";
    /// Basic-auth tokens go to hosts without TLS.
    pub const INSECURE_TRANSPORT: &str = "InsecureTransport";
    /// A Secret or key the MicrovmCluster names for host credentials is missing.
    pub const MISSING_CREDENTIALS: &str = "MissingCredentials";
    /// A host refused the MicrovmCluster's credentials.
    pub const HOST_AUTHENTICATION_FAILED: &str = "HostAuthenticationFailed";
    /// A microVM on the cluster's hosts carries the uid of a machine that no longer exists.
    pub const ORPHANED_MICROVM: &str = "OrphanedMicrovm";
    /// The MicrovmCluster waits for its machines before it goes.
    pub const WAITING_FOR_MACHINES: &str = "WaitingForMachines";
    /// A cluster-level problem was resolved.
    pub const CLUSTER_RECOVERED: &str = "ClusterReady";
}
