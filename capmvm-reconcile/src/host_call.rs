//! What follows a failed host call: the `Ready` condition users see, the Warning event, and whether
//! the operator retries with backoff or waits for the spec to change.

use capmvm_api::conditions::{reasons, types};
use capmvm_api::keys::ABANDON_MICROVM_ANNOTATION;
use capmvm_api::{MicrovmMachine, MicrovmMachineStatus};
use k8s_openapi::jiff::Timestamp;

use crate::conditions::{self, Status};
use crate::plan::{Event, EventKind, HostCall, reasons as events};

/// How a host call failed, as far as what follows is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostCallFailure {
    /// The host could not be reached, or did not answer in time.
    Unreachable,
    /// The host refused the request itself (flintlock's InvalidArgument or a spec validation error):
    /// sending the same request again cannot succeed.
    Refused,
    /// Anything else: worth retrying.
    Failed,
}

/// How a call to a flintlock host ended in error, as the flintlock client reports it (its
/// `ErrorKind`, variant for variant: the engine cannot depend on the gRPC crate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostErrorKind {
    /// The host has no such microVM.
    NotFound,
    /// The host refused the credentials.
    Unauthenticated,
    /// The host refused the request itself (flintlock's InvalidArgument or a spec validation error).
    InvalidArgument,
    /// The host could not be reached, or the connection broke.
    Unavailable,
    /// The call did not finish within its deadline.
    DeadlineExceeded,
    /// The host configuration is unusable (nothing was sent).
    InvalidConfig,
    /// Anything else.
    Other,
}

/// What a host call that ended in error amounts to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallOutcome {
    /// What the call was for holds anyway: the plan goes on as if it had succeeded.
    Done,
    /// It failed: the rest of the plan is dropped and the failure is the next observation
    /// ([`crate::observe::ObservedMachine::failed_host_call`]).
    Failed(HostCallFailure),
}

/// Judges a host call of a plan that ended in error `kind`. A delete the host answers with
/// NotFound is done: the microVM is gone, which is what the delete was for (a second delete after
/// a lost answer, or a microVM another process deleted meanwhile). Otherwise the kind decides what
/// follows ([`record_host_call_failure`]): the host not answering (unreachable, or no answer within
/// the deadline) is retried with backoff and reported as unreachable; a request the host refuses is
/// final for a create's spec; anything else is retried with backoff.
pub fn judge_host_error(call: &HostCall, kind: HostErrorKind) -> CallOutcome {
    match (call, kind) {
        (HostCall::Delete { .. }, HostErrorKind::NotFound) => CallOutcome::Done,
        (_, HostErrorKind::Unavailable | HostErrorKind::DeadlineExceeded) => {
            CallOutcome::Failed(HostCallFailure::Unreachable)
        }
        (_, HostErrorKind::InvalidArgument) => CallOutcome::Failed(HostCallFailure::Refused),
        (
            _,
            HostErrorKind::NotFound
            | HostErrorKind::Unauthenticated
            | HostErrorKind::InvalidConfig
            | HostErrorKind::Other,
        ) => CallOutcome::Failed(HostCallFailure::Failed),
    }
}

/// What the operator does after a failed host call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostCallVerdict {
    /// Retry with backoff (`true`), or wait for a change of the object (`false`): a create the host
    /// refused is final until the spec's generation changes.
    pub retry_with_backoff: bool,
    /// The Warning event to publish.
    pub event: Event,
}

/// Marks the `Ready` condition of `machine` after the host call `failed` of a plan failed, and says
/// what follows. `message` must be safe to show. A machine being deleted gets the same advice as
/// when its host is seen unreachable. A create the host refused is final for this generation of the
/// spec: `Ready=False` with reason `MicrovmSpecRejected` and the host's message, no retry until the
/// spec changes (see [`spec_rejected_at_this_generation`]).
pub fn record_host_call_failure(
    machine: &MicrovmMachine,
    status: &mut MicrovmMachineStatus,
    failed: &HostCall,
    failure: HostCallFailure,
    message: &str,
    now: Timestamp,
) -> HostCallVerdict {
    let deleting = machine.metadata.deletion_timestamp.is_some();
    let create = matches!(failed, HostCall::Create { .. });
    let (reason, message, retry, event) = match (failure, deleting) {
        (HostCallFailure::Refused, false) if create => (
            reasons::MICROVM_SPEC_REJECTED,
            format!(
                "{message}; the host refuses this spec, so it is not sent again until the MicrovmMachine spec changes (fix it, or roll the MachineDeployment to a corrected MicrovmMachineTemplate)"
            ),
            false,
            events::MICROVM_SPEC_REJECTED,
        ),
        (HostCallFailure::Unreachable, true) => (
            reasons::HOST_UNREACHABLE,
            deletion_blocked(message),
            true,
            events::HOST_CALL_FAILED,
        ),
        (HostCallFailure::Unreachable, false) => (
            reasons::HOST_UNREACHABLE,
            message.to_string(),
            true,
            events::HOST_CALL_FAILED,
        ),
        (_, true) => (
            reasons::DELETING,
            message.to_string(),
            true,
            events::HOST_CALL_FAILED,
        ),
        (_, false) => (
            reasons::MICROVM_CREATE_FAILED,
            message.to_string(),
            true,
            events::HOST_CALL_FAILED,
        ),
    };
    conditions::set(
        &mut status.conditions,
        types::READY,
        Status::False,
        reason,
        message.clone(),
        machine.metadata.generation,
        now,
    );
    HostCallVerdict {
        retry_with_backoff: retry,
        event: Event {
            kind: EventKind::Warning,
            reason: event,
            action: if create { "Create" } else { "Reconcile" },
            note: message,
        },
    }
}

/// Whether the host refused a create of the spec at the machine's current generation: then no
/// create is sent until the generation changes.
pub fn spec_rejected_at_this_generation(machine: &MicrovmMachine) -> bool {
    machine
        .status
        .as_ref()
        .and_then(|s| conditions::get(&s.conditions, types::READY))
        .is_some_and(|c| {
            c.reason == reasons::MICROVM_SPEC_REJECTED
                && c.observed_generation == machine.metadata.generation
        })
}

/// What a machine whose host does not answer says while it is deleted.
pub(crate) fn deletion_blocked(why: &str) -> String {
    format!(
        "cannot delete the microVM: {why}; the finalizer stays until the host answers. If the host is gone for good, annotate {ABANDON_MICROVM_ANNOTATION}=true to release it"
    )
}
