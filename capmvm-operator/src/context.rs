//! What every reconcile shares: the client, caches, hosts, credentials, recorder, metrics, backoff.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::credentials::Credentials;
use crate::fault::Fault;
use crate::hosts::Hosts;
use crate::metrics::Metrics;
use crate::watch::{Scope, Stores};

/// Shared by all reconciles.
pub struct Ctx {
    /// The Kubernetes client.
    pub client: kube::Client,
    /// Namespace and watch filter.
    pub scope: Scope,
    /// Watch caches.
    pub stores: Stores,
    /// Host observers and the channel pool.
    pub hosts: Arc<Hosts>,
    /// Secret-backed host credentials.
    pub credentials: Credentials,
    /// Publishes events.k8s.io/v1 Events.
    pub recorder: crate::events::EventRecorder,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// Per-object error backoff.
    pub backoff: Backoff,
    /// Versions our own writes went through (shared with the watch layer).
    pub writes: Arc<OwnWrites>,
    /// Resync period: reconcile every object at least this often.
    pub sync_period: Duration,
    /// Test-only crash points.
    pub fault: Fault,
    /// What each pool's last reconcile created and deleted, until the caches show it.
    pub pool_expectations: crate::controllers::pool::Expectations,
    /// When this process first saw each machine's placement claim from another process.
    pub claims: crate::controllers::machine::ClaimSightings,
    /// When this process last wrote each pool's status (status writes are coalesced).
    pub pool_status_writes: crate::controllers::pool::StatusWrites,
}

/// The resourceVersions each object went through in our last reconcile that wrote to it: the version
/// read, then each version our writes produced.
///
/// Two uses. A watch event of a version our own write produced wakes nobody: the reconcile that wrote
/// it already acted on it. And a reconcile that reads a version our writes already replaced (the cache
/// is behind) decides nothing: deciding on it would only earn a 409 from the resourceVersion
/// precondition. Versions are compared for equality only (they are opaque), against ones this process
/// saw itself.
#[derive(Default)]
pub struct OwnWrites(Mutex<OwnWriteLog>);

#[derive(Default)]
struct OwnWriteLog {
    by_key: HashMap<String, (Instant, Vec<String>)>,
    /// When expired records were last dropped: at most once per [`OWN_WRITES_PRUNE`], since a scan
    /// of every record on every write made M writes cost O(M²).
    pruned_at: Option<Instant>,
}

/// How long a record is kept (objects deleted meanwhile must not be remembered forever).
const OWN_WRITES_TTL: Duration = Duration::from_secs(600);

/// How often expired records are dropped (they live up to TTL + this).
const OWN_WRITES_PRUNE: Duration = Duration::from_secs(60);

impl OwnWrites {
    /// Records that a reconcile took `key` through `versions` (the one read first, then ours).
    pub fn record(&self, key: &str, versions: &[String]) {
        if versions.len() < 2 {
            return;
        }
        if let Ok(mut log) = self.0.lock() {
            let now = Instant::now();
            if log
                .pruned_at
                .is_none_or(|at| now.duration_since(at) >= OWN_WRITES_PRUNE)
            {
                log.by_key
                    .retain(|_, (at, _)| now.duration_since(*at) < OWN_WRITES_TTL);
                log.pruned_at = Some(now);
            }
            log.by_key.insert(key.to_string(), (now, versions.to_vec()));
        }
    }

    /// Whether `version` of `key` is one our own writes already replaced (the cache is behind). A
    /// write that changed nothing leaves the version as it was (the API server neither bumps it
    /// nor sends an event): that version is still current, never stale, or the object would wait
    /// for a cache update that never comes (seen on the real kube-apiserver: a pool stuck mid-roll).
    pub fn is_stale(&self, key: &str, version: &str) -> bool {
        self.0.lock().is_ok_and(|log| {
            log.by_key.get(key).is_some_and(|(_, v)| {
                v.last().is_some_and(|last| last != version)
                    && v[..v.len() - 1].iter().any(|x| x == version)
            })
        })
    }

    /// Whether `version` of `key` was produced by one of our own writes.
    pub fn is_own(&self, key: &str, version: &str) -> bool {
        self.0.lock().is_ok_and(|log| {
            log.by_key
                .get(key)
                .is_some_and(|(_, v)| v[1..].iter().any(|x| x == version))
        })
    }
}

/// Per-object exponential backoff after errors: 1 s, 2 s, 4 s ... up to 5 min; reset on success.
/// An object that stops failing without a success (it was deleted) is forgotten once its last error
/// is older than [`BACKOFF_FORGET`].
#[derive(Default)]
pub struct Backoff(Mutex<HashMap<String, (u32, Instant)>>);

/// How long after its last error an object's backoff is forgotten (twice the longest delay: a
/// failing object retried at the longest delay is never forgotten).
const BACKOFF_FORGET: Duration = Duration::from_secs(600);

/// First delay after an error.
pub const BACKOFF_MIN: Duration = Duration::from_secs(1);
/// Longest delay after repeated errors.
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);

impl Backoff {
    /// The delay before retrying `key` after one more error.
    pub fn next(&self, key: &str) -> Duration {
        let Ok(mut failures) = self.0.lock() else {
            return BACKOFF_MAX;
        };
        let now = Instant::now();
        failures.retain(|_, (_, last)| now.duration_since(*last) < BACKOFF_FORGET);
        let (n, last) = failures.entry(key.to_string()).or_insert((0, now));
        let delay = BACKOFF_MIN
            .saturating_mul(2u32.saturating_pow(*n))
            .min(BACKOFF_MAX);
        *n = n.saturating_add(1);
        *last = now;
        delay
    }

    /// Forgets `key`'s errors after a success.
    pub fn reset(&self, key: &str) {
        if let Ok(mut failures) = self.0.lock() {
            failures.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_writes_tell_stale_reads_and_own_events() {
        let w = OwnWrites::default();
        // Read at 5, wrote 7 then 9.
        w.record("ns/a", &["5".into(), "7".into(), "9".into()]);
        assert!(w.is_stale("ns/a", "5") && w.is_stale("ns/a", "7"));
        assert!(
            !w.is_stale("ns/a", "9"),
            "the version our last write gave is current"
        );
        assert!(w.is_own("ns/a", "7") && w.is_own("ns/a", "9"));
        assert!(
            !w.is_own("ns/a", "5"),
            "the version read was someone else's"
        );
        assert!(
            !w.is_own("ns/a", "11") && !w.is_stale("ns/a", "11"),
            "a later foreign write"
        );
        assert!(!w.is_stale("ns/b", "1"));
        // A write that changed nothing: the version read is still the current one.
        w.record("ns/d", &["4".into(), "6".into(), "6".into()]);
        assert!(w.is_stale("ns/d", "4"));
        assert!(
            !w.is_stale("ns/d", "6"),
            "a no-op write keeps its version current"
        );
        w.record("ns/e", &["8".into(), "8".into()]);
        assert!(!w.is_stale("ns/e", "8"), "only no-op writes: nothing stale");
        w.record("ns/c", &["3".into()]);
        assert!(
            !w.is_stale("ns/c", "3") && !w.is_own("ns/c", "3"),
            "no write, nothing recorded"
        );
    }

    #[test]
    fn backoff_doubles_caps_and_resets() {
        let b = Backoff::default();
        let delays: Vec<u64> = (0..12).map(|_| b.next("a").as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
        assert_eq!(b.next("other").as_secs(), 1, "per object");
        b.reset("a");
        assert_eq!(b.next("a").as_secs(), 1);
    }
}
