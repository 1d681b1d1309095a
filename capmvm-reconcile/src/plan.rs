//! Plans: what the engine decided, as data, for the operator to carry out.

use std::time::Duration;

use capmvm_api::HostEndpoint;

use crate::microvm::MicrovmSpec;

/// A decision: effects to carry out, the status to write, and when to look again.
///
/// The operator carries a plan out in this order, stopping at the first failure:
/// 1. [`Effect::AddFinalizer`] and [`Effect::RecordHost`] (or [`Effect::RecordAdoption`]), in one
///    metadata write conditional on the
///    resourceVersion the observation was read at, so a decision made from a stale read cannot reach
///    a host;
/// 2. [`Effect::SetProviderId`] (a spec write);
/// 3. the `status`, if it differs from the object's (its conditions' observedGeneration follows the
///    generation a spec write just gave);
/// 4. host calls: [`Effect::CreateMicrovm`], [`Effect::DeleteMicrovm`];
/// 5. [`Effect::Event`]s;
/// 6. [`Effect::RemoveFinalizer`] (never in the same plan as a host call).
///
/// A MicrovmCluster's plan: [`Effect::AddFinalizer`] and [`Effect::ProtectSecret`]s, the status,
/// events, then [`Effect::ReleaseSecret`]s and [`Effect::RemoveFinalizer`] last.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan<S> {
    /// Effects, in the order above.
    pub effects: Vec<Effect>,
    /// The desired status; `None` leaves the status alone (for example, an externally managed object).
    pub status: Option<S>,
    /// When to decide again.
    pub requeue: Requeue,
}

impl<S> Plan<S> {
    /// The host calls of this plan.
    pub fn host_calls(&self) -> impl Iterator<Item = &Effect> {
        self.effects.iter().filter(|e| {
            matches!(
                e,
                Effect::CreateMicrovm { .. } | Effect::DeleteMicrovm { .. }
            )
        })
    }

    /// The events of this plan.
    pub fn events(&self) -> impl Iterator<Item = &Event> {
        self.effects.iter().filter_map(|e| match e {
            Effect::Event(ev) => Some(ev),
            _ => None,
        })
    }
}

/// One thing to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Add the object's finalizer.
    AddFinalizer,
    /// Remove the object's finalizer: a MicrovmMachine's microVM is gone (or was never created, or
    /// abandoned); a MicrovmCluster's machines are gone.
    RemoveFinalizer,
    /// Record the chosen host and the machine's origin uid in their annotations (before the microVM
    /// is created there), so a recreated object (`clusterctl move`) still finds its microVM.
    ///
    /// The write also sets the placement-attempt annotation to `attempt`, one more than the value
    /// the decision read, so it always changes the object: with the resourceVersion test it is a
    /// compare-and-swap that two writers deciding from the same version cannot both pass.
    RecordHost {
        /// The chosen host.
        host: HostEndpoint,
        /// The uid the microVM will carry in meta-data.
        origin_uid: String,
        /// The placement attempt this create is (1 for the first).
        attempt: u64,
        /// Who makes this attempt and when: the placement-claim annotation's value.
        claim: String,
    },
    /// Record that a machine another provider placed (its providerID set, no host recorded by us)
    /// is now ours: its providerID's host in the host annotation, written with the finalizer in
    /// the metadata write. Nothing else changes: the microVM and the providerID stay as they are.
    RecordAdoption {
        /// The host of the machine's providerID.
        host: HostEndpoint,
    },
    /// Set `spec.providerID`.
    SetProviderId(String),
    /// Create a microVM on a host. The host is recorded first ([`Effect::RecordHost`]).
    CreateMicrovm {
        /// Where.
        host: HostEndpoint,
        /// What.
        spec: Box<MicrovmSpec>,
    },
    /// Delete a microVM from a host.
    DeleteMicrovm {
        /// Where.
        host: HostEndpoint,
        /// Flintlock's uid.
        uid: String,
    },
    /// Record an event on the object.
    Event(Event),
    /// Add the credentials finalizer to a Secret the MicrovmCluster names, so it outlives the cluster's
    /// machines (a namespace deletion removes everything at once).
    ProtectSecret(String),
    /// Remove the credentials finalizer from a Secret: no MicrovmCluster needs it any more.
    ReleaseSecret(String),
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
