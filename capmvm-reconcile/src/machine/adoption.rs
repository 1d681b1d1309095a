//! Machines another provider placed: the Go provider's, after a move to this one.
//!
//! This provider records the host of every machine it places, in the host annotation, in the same
//! write that adds the finalizer and before anything exists on a host. A machine without that
//! annotation was placed by someone else:
//!
//! - with a providerID (`microvm://<host endpoint>/<uid>`, the Go provider's form when the failure
//!   domain is the endpoint): its microVM is adopted as it is. The providerID is never rewritten
//!   (the Node's cannot change), nothing is created or deleted, and once the microVM is found the
//!   host is recorded and a `MicrovmAdopted` event says so;
//! - without one, but with the finalizer both providers use: the other provider stopped in the
//!   middle of a create. A microVM it made carries nothing this provider recognises (the Go provider
//!   put no uid of ours in its meta-data), so creating one could make a second, and releasing the
//!   finalizer could leak one. Nothing happens until a person looks at the hosts (the condition's
//!   message says what to do).
//!
//! The previous provider's own conditions (`MicrovmReady`, `LoadBalancerAvailable`) are dropped from
//! the status: nothing updates them any more.

use capmvm_api::conditions::reasons;
use capmvm_api::keys::{ABANDON_MICROVM_ANNOTATION, HOST_ANNOTATION, MACHINE_FINALIZER};
use capmvm_api::v1alpha1::conditions as go;
use capmvm_api::{HostEndpoint, MicrovmMachine};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;

use super::Decision;
use crate::observe::ObservedVm;
use crate::plan::{EventKind, reasons as events};

/// Who placed a machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provenance {
    /// This provider placed it (its host is recorded), or nobody did yet.
    Ours,
    /// Another provider placed it and set its providerID: adopted as it is.
    Adopted,
    /// Another provider began to provision it (the finalizer, no providerID) and did not finish.
    Unfinished,
}

/// Who placed `machine`.
pub fn provenance(machine: &MicrovmMachine) -> Provenance {
    let recorded = machine.annotations().contains_key(HOST_ANNOTATION);
    let finalized = machine.finalizers().iter().any(|f| f == MACHINE_FINALIZER);
    match (recorded, machine.spec.provider_id.is_some(), finalized) {
        (true, _, _) => Provenance::Ours,
        (false, true, _) => Provenance::Adopted,
        (false, false, true) => Provenance::Unfinished,
        (false, false, false) => Provenance::Ours,
    }
}

/// The previous provider's condition types, which nothing updates after the move.
pub const PREVIOUS_PROVIDER_CONDITIONS: [&str; 2] =
    [go::MICROVM_READY, go::LOAD_BALANCER_AVAILABLE];

/// Drops the previous provider's conditions from `conditions`.
pub fn drop_previous_provider_conditions(conditions: &mut Vec<Condition>) {
    conditions.retain(|c| !PREVIOUS_PROVIDER_CONDITIONS.contains(&c.type_.as_str()));
}

impl Decision<'_> {
    /// An adopted machine's microVM was found: record the host, once, and say so.
    pub(super) fn record_adoption(&mut self, host: &HostEndpoint, vm: &ObservedVm) {
        if provenance(self.machine) != Provenance::Adopted {
            return;
        }
        self.plan.record_adoption = Some(host.clone());
        let provider_id = self.machine.spec.provider_id.as_deref().unwrap_or_default();
        self.event(
            EventKind::Normal,
            events::MICROVM_ADOPTED,
            "Adopt",
            format!(
                "adopted microVM {} on host {host}, created by the previous provider; providerID {provider_id} is kept",
                vm.uid
            ),
        );
    }

    /// What an unfinished machine of another provider says it waits for, creating or deleting.
    pub(super) fn unfinished_message(&self, deleting: bool) -> String {
        let ns = self.machine.namespace().unwrap_or_default();
        let name = self.machine.name_any();
        let then = if deleting {
            format!(
                "delete that microVM from its host, or if there is none, annotate this MicrovmMachine {ABANDON_MICROVM_ANNOTATION}=true to release it"
            )
        } else {
            format!(
                "set spec.providerID to microvm://<host endpoint>/<its uid> to adopt it; if there is none, remove the finalizer {MACHINE_FINALIZER} and this provider creates one"
            )
        };
        format!(
            "the previous provider began to create this machine's microVM and stopped before recording it (finalizer, no providerID); a microVM it made cannot be recognised, so none is {} until you check the hosts for a microVM named {ns}/{name}: if there is one, {then}",
            if deleting { "deleted" } else { "created" }
        )
    }

    /// Stops, reporting an unfinished machine of another provider.
    pub(super) fn report_unfinished(&mut self, deleting: bool) {
        let message = self.unfinished_message(deleting);
        self.not_ready(reasons::UNFINISHED_BY_PREVIOUS_PROVIDER, message);
    }
}
