//! The order in which instances go: the autoscaler's (or a person's) pick first, then instances that
//! are not ready, then outdated ones, then by the pool's `deletePolicy`.

use std::cmp::Ordering;

use capmvm_api::DeletePolicy;

use super::naming::fnv1a64;
use super::observe::{InstanceHealth, ObservedInstance};

/// An instance as the decision classifies it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Candidate<'a> {
    pub(super) instance: &'a ObservedInstance,
    /// Made from the current template.
    pub(super) up_to_date: bool,
    /// On a host being evacuated: replaced like an outdated instance.
    pub(super) evacuating: bool,
}

impl Candidate<'_> {
    /// Available for the roll's budget: its microVM runs and its Node registered.
    pub(super) fn ready(&self) -> bool {
        self.instance.health == InstanceHealth::Ready
            && self.instance.machine.as_ref().is_some_and(|m| m.joined)
    }

    pub(super) fn has_machine(&self) -> bool {
        self.instance.machine.is_some()
    }

    fn delete_requested(&self) -> bool {
        self.instance
            .machine
            .as_ref()
            .is_some_and(|m| m.delete_requested)
    }
}

/// Sorts `candidates` so the first should go first.
pub(super) fn sort_victims(candidates: &mut [Candidate<'_>], policy: DeletePolicy) {
    candidates.sort_by(|a, b| victim_order(a, b, policy));
}

fn victim_order(a: &Candidate<'_>, b: &Candidate<'_>, policy: DeletePolicy) -> Ordering {
    // `false` sorts first: requested, not ready, outdated go before the rest.
    (!a.delete_requested())
        .cmp(&!b.delete_requested())
        .then(a.ready().cmp(&b.ready()))
        .then((a.up_to_date && !a.evacuating).cmp(&(b.up_to_date && !b.evacuating)))
        .then_with(|| {
            let (a, b) = (a.instance, b.instance);
            match policy {
                DeletePolicy::Oldest => a.created.cmp(&b.created),
                DeletePolicy::Newest => b.created.cmp(&a.created),
                // Stable (the engine is pure) but unrelated to age or name order.
                DeletePolicy::Random => {
                    fnv1a64(&[a.name.as_bytes()]).cmp(&fnv1a64(&[b.name.as_bytes()]))
                }
            }
        })
        .then_with(|| a.instance.name.cmp(&b.instance.name))
}
