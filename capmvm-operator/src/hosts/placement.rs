//! The placement turn: one placement decision at a time reads every host's allocation (listed
//! microVMs plus placements not listed yet), decides, and reserves the host it chose.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use capmvm_reconcile::HostFacts;

use super::reservations::HostReservations;
use super::{Hosts, ListedVms, listed_of};

/// A host chosen for a machine, reserved at the moment of choosing (see [`Hosts::place`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The host's canonical endpoint: capacity is physical, so reservations are per endpoint.
    pub endpoint: String,
    /// The uid the machine's microVM will carry (its origin uid).
    pub machine_uid: String,
    /// vCPUs asked for.
    pub vcpu: i64,
    /// Memory asked for, in MiB.
    pub memory_mb: i64,
}

/// vCPUs and MiB allocated on a host: what its last answered list showed plus its placements not
/// listed yet. A listed microVM is counted by the list; its reservation is kept a little longer in
/// case a list that raced the create publishes a snapshot without it.
fn allocated(
    listed: &Arc<ListedVms>,
    reservations: Option<&mut HostReservations>,
    now: Instant,
) -> (i64, i64) {
    let (v, m) = reservations.map_or((0, 0), |host| host.unlisted(listed, now));
    (listed.vcpu + v, listed.memory_mb + m)
}

impl Hosts {
    /// vCPUs and MiB allocated on `endpoint`: the microVMs its last answered list showed (under any
    /// credentials that could list it: capacity is physical, and only numbers leave this function)
    /// plus the placements not listed yet.
    pub fn allocation(&self, endpoint: &str) -> (i64, i64) {
        let listed: Arc<ListedVms> = self
            .entries
            .lock()
            .ok()
            .and_then(|entries| entries.get(endpoint).map(listed_of))
            .unwrap_or_default();
        let mut reservations = self.reservations.lock().ok();
        allocated(
            &listed,
            reservations.as_mut().and_then(|r| r.get_mut(endpoint)),
            Instant::now(),
        )
    }

    /// What [`Hosts::allocation`] says of each host in `facts`, written into it, under one look at
    /// the observers and one at the reservations: a placement reads every host of its pool.
    pub fn fill_allocation(&self, facts: &mut BTreeMap<String, HostFacts>) {
        let listed: Vec<Arc<ListedVms>> = match self.entries.lock() {
            Ok(entries) => facts
                .keys()
                .map(|endpoint| entries.get(endpoint).map(listed_of).unwrap_or_default())
                .collect(),
            Err(_) => facts.keys().map(|_| Arc::default()).collect(),
        };
        let now = Instant::now();
        let mut reservations = self.reservations.lock().ok();
        for ((endpoint, fact), listed) in facts.iter_mut().zip(listed) {
            let host = reservations.as_mut().and_then(|r| r.get_mut(endpoint));
            (fact.allocated_vcpu, fact.allocated_memory_mb) = allocated(&listed, host, now);
        }
    }

    /// Runs one placement decision at a time: `decide` reads the hosts' allocation (through
    /// [`Hosts::fill_allocation`]), decides, and returns its outcome with the host it chose, which is reserved
    /// before the next placement decides. Concurrent reconciles therefore see each other's choices,
    /// and a burst spreads over equal hosts exactly as a slow trickle would. `decide` must be quick
    /// and must not block (it runs under a lock).
    pub fn place<T>(&self, decide: impl FnOnce() -> (T, Option<Claim>)) -> T {
        let _turn = self
            .placing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (outcome, claim) = decide();
        if let Some(c) = claim {
            self.reserve(&c.endpoint, &c.machine_uid, c.vcpu, c.memory_mb);
        }
        outcome
    }

    /// Drops the reservation of `machine_uid` on `endpoint`: the placement was not recorded after all
    /// (the write failed), or nothing will be created there for now (the host refused the spec).
    pub fn release_reservation(&self, endpoint: &str, machine_uid: &str) {
        if let Ok(mut reservations) = self.reservations.lock()
            && let Some(host) = reservations.get_mut(endpoint)
        {
            host.release(machine_uid);
        }
    }

    /// Counts a machine just placed on `endpoint` towards its allocation until its microVM shows up.
    pub fn reserve(&self, endpoint: &str, machine_uid: &str, vcpu: i64, memory_mb: i64) {
        if let Ok(mut reservations) = self.reservations.lock() {
            reservations
                .entry(endpoint.to_string())
                .or_default()
                .reserve(machine_uid, vcpu, memory_mb, Instant::now());
        }
    }
}
