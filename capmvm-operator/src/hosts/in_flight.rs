//! A host's microVMs in flight (pending or deleting), and when to ask the host about each.
//!
//! While any is in flight the observer asks the host about them alone (a Get each) at the busy
//! interval, instead of listing the whole host. A microVM this operator just created is not asked
//! about before the host is likely to have started it: each host's create time is learned from the
//! creates it settled, and the first Get waits for most of it. Asking every second from the create on
//! cost one Get per second of provisioning per machine, almost all of them answered PENDING.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use capmvm_reconcile::VmState;

/// How long a microVM this operator created or deleted stays in flight without a list showing it:
/// the list may have raced the call.
pub(super) const BUSY_AFTER_CALL: Duration = Duration::from_secs(5);

/// The share of the learned create time waited before the first Get of a new microVM. Below one, so
/// that a host getting faster is noticed: a create asked about early and found settled teaches a
/// shorter time.
const FIRST_ASK_SHARE: f64 = 0.75;

/// Weight of the newest settled create in the learned create time.
const LEARNING_RATE: f64 = 0.2;

/// What put a microVM in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    /// A list showed it pending or deleting.
    Listed,
    /// This operator created it at that instant.
    Created(Instant),
    /// This operator deleted it at that instant.
    Deleted(Instant),
}

impl Cause {
    fn called_at(self) -> Option<Instant> {
        match self {
            Cause::Listed => None,
            Cause::Created(at) | Cause::Deleted(at) => Some(at),
        }
    }
}

/// The microVMs of one host in flight, by uid.
#[derive(Debug, Default)]
pub(super) struct InFlight {
    vms: HashMap<String, Cause>,
    /// How long this host takes from a create call to a settled microVM, as observed (moving
    /// average); `None` until a create of this operator settled here.
    create_time: Option<Duration>,
}

impl InFlight {
    pub(super) fn is_empty(&self) -> bool {
        self.vms.is_empty()
    }

    /// This operator just created `uid` here.
    pub(super) fn created(&mut self, uid: &str, now: Instant) {
        self.vms.insert(uid.to_string(), Cause::Created(now));
    }

    /// This operator just asked for `uid`'s deletion here.
    pub(super) fn deleted(&mut self, uid: &str, now: Instant) {
        self.vms.insert(uid.to_string(), Cause::Deleted(now));
    }

    /// The microVMs to ask the host about at `now`: every one but those created here too recently
    /// for the host to have started them.
    pub(super) fn due(&self, now: Instant) -> Vec<String> {
        let wait = self
            .create_time
            .map_or(Duration::ZERO, |t| t.mul_f64(FIRST_ASK_SHARE));
        self.vms
            .iter()
            .filter(|(_, cause)| match cause {
                Cause::Created(at) => now.saturating_duration_since(*at) >= wait,
                Cause::Listed | Cause::Deleted(_) => true,
            })
            .map(|(uid, _)| uid.clone())
            .collect()
    }

    /// The host answered about `uid` at `now`: a settled microVM (or a gone one) leaves the set, and
    /// a settled create of this operator teaches the host's create time.
    pub(super) fn answered(&mut self, uid: &str, settled: bool, now: Instant) {
        if !settled {
            return;
        }
        if let Some(Cause::Created(at)) = self.vms.remove(uid) {
            let took = now.saturating_duration_since(at);
            self.create_time = Some(match self.create_time {
                None => took,
                Some(t) => t.mul_f64(1.0 - LEARNING_RATE) + took.mul_f64(LEARNING_RATE),
            });
        }
    }

    /// After a whole list, given each listed microVM's state: the microVMs it shows pending or
    /// deleting are in flight; one it shows settled is not; one it does not show stays only if this
    /// operator created or deleted it moments ago (the list may have raced the call).
    pub(super) fn listed<'a>(
        &mut self,
        listed: impl IntoIterator<Item = (&'a str, VmState)>,
        now: Instant,
    ) {
        let listed: HashMap<&str, VmState> = listed.into_iter().collect();
        self.vms
            .retain(|uid, cause| match listed.get(uid.as_str()) {
                Some(state) => is_in_flight(*state),
                None => cause
                    .called_at()
                    .is_some_and(|t| now.saturating_duration_since(t) < BUSY_AFTER_CALL),
            });
        for (uid, state) in listed {
            if is_in_flight(state) {
                self.vms.entry(uid.to_string()).or_insert(Cause::Listed);
            }
        }
    }
}

/// Whether a microVM in `state` is still on its way somewhere.
pub(super) fn is_in_flight(state: VmState) -> bool {
    matches!(state, VmState::Pending | VmState::Deleting)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    /// With nothing learned, a new microVM is asked about at once; once creates on this host are
    /// seen to take about 4 s, a new one is first asked about after 3 s.
    #[test]
    fn a_new_microvm_is_first_asked_about_once_the_host_is_likely_done() {
        let t0 = Instant::now();
        let mut f = InFlight::default();
        f.created("a", t0);
        assert_eq!(f.due(t0), ["a"]);
        f.answered("a", false, t0 + SECOND);
        assert_eq!(f.due(t0 + SECOND), ["a"], "pending: still asked");
        f.answered("a", true, t0 + 4 * SECOND);
        assert!(f.is_empty());

        let t1 = t0 + 10 * SECOND;
        f.created("b", t1);
        assert!(f.due(t1 + 2 * SECOND).is_empty(), "too early to ask");
        assert_eq!(f.due(t1 + 3 * SECOND), ["b"]);
    }

    /// A host that gets faster is noticed: creates asked about early and found settled shorten the
    /// wait, one at a time.
    #[test]
    fn the_learned_time_follows_a_faster_host() {
        let t0 = Instant::now();
        let mut f = InFlight::default();
        f.created("a", t0);
        f.answered("a", true, t0 + 8 * SECOND);
        let mut at = t0;
        for i in 0..40 {
            at += 20 * SECOND;
            let uid = format!("vm-{i}");
            f.created(&uid, at);
            // The host now takes 1 s: found settled at the first ask.
            let first = (0..=8 * 4)
                .map(|q| at + SECOND / 4 * q)
                .find(|t| !f.due(*t).is_empty())
                .unwrap_or(at);
            f.answered(&uid, true, first);
        }
        let wait = f.create_time.map(|t| t.mul_f64(FIRST_ASK_SHARE));
        assert!(
            wait.is_some_and(|w| w < 2 * SECOND),
            "still waiting {wait:?}"
        );
    }

    /// Deletes and microVMs a list showed in flight are asked about at once, and teach nothing.
    #[test]
    fn deletes_and_listed_microvms_are_asked_about_at_once() {
        let t0 = Instant::now();
        let mut f = InFlight::default();
        f.created("a", t0);
        f.answered("a", true, t0 + 4 * SECOND);
        let t1 = t0 + 10 * SECOND;
        f.deleted("d", t1);
        f.listed([("l", VmState::Pending), ("x", VmState::Created)], t1);
        let mut due = f.due(t1);
        due.sort();
        assert_eq!(due, ["d", "l"]);
        f.answered("d", true, t1 + 9 * SECOND);
        assert_eq!(f.create_time, Some(4 * SECOND));
    }

    /// A list that does not show a microVM this operator created moments ago keeps it in flight (the
    /// list may have raced the create); one created long ago and not listed is gone.
    #[test]
    fn a_list_racing_a_create_keeps_it_in_flight() {
        let t0 = Instant::now();
        let mut f = InFlight::default();
        f.created("new", t0 + 9 * SECOND);
        f.created("old", t0);
        f.listed([], t0 + 10 * SECOND);
        assert_eq!(f.due(t0 + 10 * SECOND), ["new"]);
    }
}
