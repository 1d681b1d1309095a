//! What a MicrovmMachine records about its placement and its microVM: the providerID, and the
//! annotations written before every create (host, origin uid, placement attempt and claim).

use capmvm_api::keys::{
    HOST_ANNOTATION, ORIGIN_UID_ANNOTATION, PLACEMENT_ATTEMPT_ANNOTATION,
    PLACEMENT_CLAIM_ANNOTATION,
};
use capmvm_api::{HostEndpoint, MicrovmMachine, ProviderId};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

/// The host this machine's microVM lives on or is to be created on: the providerID's host, else the
/// host annotation. The operator asks this host for the machine's microVMs.
pub fn recorded_host(machine: &MicrovmMachine) -> Option<HostEndpoint> {
    provider_id(machine)
        .map(|p| p.host)
        .or_else(|| annotated_host(machine))
}

/// The host recorded in the host annotation at placement.
pub(super) fn annotated_host(machine: &MicrovmMachine) -> Option<HostEndpoint> {
    machine
        .annotations()
        .get(HOST_ANNOTATION)
        .and_then(|h| h.parse().ok())
}

/// The uid this machine's microVMs carry in meta-data: the origin-uid annotation, written when the
/// host was recorded, else the object's own uid. They differ once the object was recreated with its
/// annotations (`clusterctl move`, a restore from backup).
pub fn origin_uid(machine: &MicrovmMachine) -> Option<&str> {
    machine
        .annotations()
        .get(ORIGIN_UID_ANNOTATION)
        .map(String::as_str)
        .filter(|u| !u.is_empty())
        .or(machine.metadata.uid.as_deref())
}

/// How many placement attempts (record-host writes before a create) the machine has made: the
/// placement-attempt annotation, 0 when unset or unreadable (the next write replaces it either way).
pub fn placement_attempts(machine: &MicrovmMachine) -> u64 {
    machine
        .annotations()
        .get(PLACEMENT_ATTEMPT_ANNOTATION)
        .and_then(|a| a.parse().ok())
        .unwrap_or(0)
}

/// The last placement claim: when, and by which operator process. `None` if unset or unreadable.
pub fn placement_claim(machine: &MicrovmMachine) -> Option<(Timestamp, &str)> {
    let (at, by) = machine
        .annotations()
        .get(PLACEMENT_CLAIM_ANNOTATION)?
        .split_once(' ')?;
    Some((at.parse().ok()?, by))
}

/// The machine's placement claim (the annotation's value) if another operator process made it and
/// the machine has no providerID: only then may a create of another process still be on its way to
/// the host, which this process waits out before creating a microVM itself or releasing a deleted
/// machine's finalizer ([`super::CREATE_CLAIM_TTL`]). `operator`'s own claim is over when it decides
/// again (reconciles of one object do not overlap in a process); a machine with a providerID has
/// the microVM its claim created. The operator times how long it has seen this value
/// ([`crate::observe::ObservedMachine::claim_seen_for`]).
pub fn foreign_claim<'m>(machine: &'m MicrovmMachine, operator: &str) -> Option<&'m str> {
    if machine.spec.provider_id.is_some() {
        return None;
    }
    let (_, by) = placement_claim(machine)?;
    if by == operator {
        return None;
    }
    machine
        .annotations()
        .get(PLACEMENT_CLAIM_ANNOTATION)
        .map(String::as_str)
}

/// The placement-claim annotation's value for `operator` at `now`.
pub(super) fn claim_value(operator: &str, now: Timestamp) -> String {
    format!("{now} {operator}")
}

/// The parsed providerID, if set and valid.
pub fn provider_id(machine: &MicrovmMachine) -> Option<ProviderId> {
    machine
        .spec
        .provider_id
        .as_deref()
        .and_then(|p| p.parse().ok())
}
