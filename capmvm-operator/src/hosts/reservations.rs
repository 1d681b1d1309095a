//! Placements on one host that its snapshot does not show yet, and what they add to its allocation.
//!
//! A placement decision reads every pool host's allocation, so reading it must not cost the number of
//! reservations each time: the totals are kept against the snapshot they were counted with and
//! counted again only when that snapshot, the reservations or an expiry change them.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::ListedVms;

/// How long a placement not yet visible on its host counts towards the host's allocation.
pub(super) const RESERVATION_TTL: Duration = Duration::from_secs(300);

/// How long a reservation is kept after its microVM first shows in the host's snapshot (where it is
/// counted instead): a list that was under way when the create returned may still publish a
/// snapshot without it, and the placement must not vanish from the allocation meanwhile.
pub(super) const RESERVATION_SETTLE: Duration = super::in_flight::BUSY_AFTER_CALL;

/// A machine placed on a host, counted towards its allocation until its microVM is listed.
struct Reservation {
    vcpu: i64,
    memory_mb: i64,
    since: Instant,
}

/// The totals of the reservations a snapshot does not show.
struct Counted {
    /// Weak: the count must not keep a replaced snapshot (every microVM of the host) alive. While it
    /// is held, its address is not reused, so a pointer match is that snapshot.
    against: Weak<ListedVms>,
    vcpu: i64,
    memory_mb: i64,
    /// When the first of the counted reservations expires (the totals change then).
    until: Instant,
}

/// The reservations on one host, by machine uid.
#[derive(Default)]
pub(super) struct HostReservations {
    by_uid: HashMap<String, Reservation>,
    /// `None` after a change: counted again at the next read.
    counted: Option<Counted>,
}

impl HostReservations {
    /// Counts a machine just placed here.
    pub(super) fn reserve(&mut self, machine_uid: &str, vcpu: i64, memory_mb: i64, now: Instant) {
        self.by_uid.insert(
            machine_uid.to_string(),
            Reservation {
                vcpu,
                memory_mb,
                since: now,
            },
        );
        self.counted = None;
    }

    /// Stops counting `machine_uid`.
    pub(super) fn release(&mut self, machine_uid: &str) {
        if self.by_uid.remove(machine_uid).is_some() {
            self.counted = None;
        }
    }

    /// vCPUs and MiB of the reservations `listed` does not show. Forgets reservations that expired
    /// or that `listed` has shown for long enough.
    pub(super) fn unlisted(&mut self, listed: &Arc<ListedVms>, now: Instant) -> (i64, i64) {
        if let Some(c) = &self.counted
            && std::ptr::eq(c.against.as_ptr(), Arc::as_ptr(listed))
            && now < c.until
        {
            return (c.vcpu, c.memory_mb);
        }
        self.by_uid.retain(|uid, r| {
            let age = now.saturating_duration_since(r.since);
            age < RESERVATION_TTL && (age < RESERVATION_SETTLE || !listed.carries(uid))
        });
        let (mut vcpu, mut memory_mb) = (0, 0);
        let mut until = now + RESERVATION_TTL;
        for (_, r) in self.by_uid.iter().filter(|(uid, _)| !listed.carries(uid)) {
            vcpu += r.vcpu;
            memory_mb += r.memory_mb;
            until = until.min(r.since + RESERVATION_TTL);
        }
        self.counted = Some(Counted {
            against: Arc::downgrade(listed),
            vcpu,
            memory_mb,
            until,
        });
        (vcpu, memory_mb)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capmvm_reconcile::VmState;

    fn listed(machine_uids: &[&str]) -> Arc<ListedVms> {
        Arc::new(ListedVms::new(
            machine_uids
                .iter()
                .map(|u| super::super::tests::vm(&format!("vm-{u}"), u, VmState::Created))
                .collect(),
        ))
    }

    /// The totals are read from the count while nothing changed, and follow every change that
    /// matters: a new reservation, a release, a snapshot that shows (or again misses) a placement.
    #[test]
    fn totals_follow_reservations_and_snapshots() {
        let t0 = Instant::now();
        let mut host = HostReservations::default();
        let empty = listed(&[]);
        host.reserve("a", 2, 1024, t0);
        assert_eq!(host.unlisted(&empty, t0), (2, 1024));
        host.reserve("b", 1, 512, t0);
        assert_eq!(
            host.unlisted(&empty, t0),
            (3, 1536),
            "a new reservation counts at once"
        );
        host.release("a");
        assert_eq!(
            host.unlisted(&empty, t0),
            (1, 512),
            "a released one no more"
        );

        // Listed: counted by the snapshot, not here; a racing list that misses it counts it again.
        let shows_b = listed(&["b"]);
        assert_eq!(host.unlisted(&shows_b, t0), (0, 0));
        assert_eq!(host.unlisted(&empty, t0 + Duration::from_secs(1)), (1, 512));
        // Shown for longer than the settle time: forgotten, whatever a later snapshot misses.
        assert_eq!(host.unlisted(&shows_b, t0 + RESERVATION_SETTLE), (0, 0));
        assert_eq!(host.unlisted(&empty, t0 + RESERVATION_SETTLE), (0, 0));
    }

    /// An unlisted reservation stops counting when it expires, even if nothing else changes.
    #[test]
    fn an_unlisted_reservation_expires_with_the_same_snapshot() {
        let t0 = Instant::now();
        let mut host = HostReservations::default();
        let empty = listed(&[]);
        host.reserve("a", 2, 1024, t0);
        host.reserve("b", 2, 1024, t0 + Duration::from_secs(10));
        assert_eq!(
            host.unlisted(&empty, t0 + Duration::from_secs(10)),
            (4, 2048)
        );
        assert_eq!(host.unlisted(&empty, t0 + RESERVATION_TTL), (2, 1024));
        assert_eq!(
            host.unlisted(&empty, t0 + RESERVATION_TTL + Duration::from_secs(10)),
            (0, 0)
        );
    }
}
