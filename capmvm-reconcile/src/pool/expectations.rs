//! A pool's expectations: what its last reconcile created and deleted, until the operator's caches
//! show it. A decision from a cache that misses an instance just created would create another under
//! a new name, and one that still shows a Machine just deleted as live would delete another.

use std::time::Duration;

/// How long a pool waits for its caches to show its own creates and deletes before deciding anyway
/// (a watch that lost an event relists well within this).
pub const EXPECTATION_TTL: Duration = Duration::from_secs(30);

/// A Machine the pool deleted, as the operator's Machine cache shows it now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CachedMachine {
    /// Not in the cache: gone.
    Absent,
    /// In the cache with a deletion timestamp.
    Deleting,
    /// In the cache, not being deleted: the cache has not seen the delete yet.
    Live,
}

/// What the caches show of what the pool's last reconcile did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExpectationsSeen {
    /// How long ago that reconcile recorded them.
    pub age: Duration,
    /// Each instance it created, and whether the instance cache holds it.
    pub created: Vec<(String, bool)>,
    /// Each Machine it deleted, as the Machine cache shows it.
    pub deleted: Vec<(String, CachedMachine)>,
}

/// Whether the pool must wait for its caches before deciding: some instance it created is not
/// cached yet, or some Machine it deleted still looks live, and the expectations are younger than
/// [`EXPECTATION_TTL`]. When this says no, the expectations are met (or given up on) and are
/// forgotten: later decisions are not held.
pub fn caches_behind(seen: &ExpectationsSeen) -> bool {
    let met = seen.created.iter().all(|(_, cached)| *cached)
        && seen
            .deleted
            .iter()
            .all(|(_, m)| matches!(m, CachedMachine::Absent | CachedMachine::Deleting));
    !met && seen.age <= EXPECTATION_TTL
}
