//! What the operator remembers between reconciles, per object: the versions its own writes went
//! through, the error backoff, a pool's creates and deletes until the caches show them, when a pool's
//! status was last written, and when another process's placement claim was first seen. Nothing here
//! decides: each is a fact the next observation or the controller wrapper reads.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::Resource;

/// `Kind/namespace/name` of an object: a MicrovmCluster and a MicrovmMachineTemplate may share a name.
pub fn key<K: Resource<DynamicType = ()>>(obj: &K) -> String {
    format!(
        "{}/{}/{}",
        K::kind(&()),
        obj.meta().namespace.as_deref().unwrap_or_default(),
        obj.meta().name.as_deref().unwrap_or_default()
    )
}

/// 128 bits of an identifier (a uid, a name), SipHash and FNV-1a side by side: what per-object
/// tables key by instead of a copy of the identifier, whose allocation was most of each entry.
/// Two identifiers meeting on 128 bits is not a risk at any size a cluster reaches.
pub fn id_key(id: &str) -> u128 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    id.hash(&mut h);
    let fnv = capmvm_reconcile::microvm::fnv1a64_extend(
        capmvm_reconcile::microvm::FNV1A64_OFFSET,
        id.as_bytes(),
    );
    (u128::from(h.finish()) << 64) | u128::from(fnv)
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
    by_key: HashMap<String, OwnWrite>,
    /// When expired records were last dropped: at most once per [`OWN_WRITES_PRUNE`], since a scan
    /// of every record on every write made M writes cost O(M²).
    pruned_at: Option<Instant>,
}

/// One object's record: when it was written, the versions, and when the cache first showed the
/// last of them.
struct OwnWrite {
    at: Instant,
    versions: Vec<String>,
    caught_up: Option<Instant>,
}

/// How long a record is kept while the cache has not shown its last version (objects deleted
/// meanwhile must not be remembered forever).
const OWN_WRITES_TTL: Duration = Duration::from_secs(600);

/// How long a record is kept once the cache showed its last version: a reconcile that read the
/// object just before may still ask whether its version is stale. Kept until the TTL instead, every
/// object written in the last ten minutes held one (about 7 MiB at 30 000 machines); dropped at
/// once, such reconciles went on to write and met a 409 (33 in 1 000 machines).
const OWN_WRITES_CAUGHT_UP_KEEP: Duration = Duration::from_secs(10);

/// How often expired records are dropped (they live up to their limit + this).
const OWN_WRITES_PRUNE: Duration = Duration::from_secs(10);

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
                log.by_key.retain(|_, w| match w.caught_up {
                    Some(at) => now.duration_since(at) < OWN_WRITES_CAUGHT_UP_KEEP,
                    None => now.duration_since(w.at) < OWN_WRITES_TTL,
                });
                log.pruned_at = Some(now);
            }
            log.by_key.insert(
                key.to_string(),
                OwnWrite {
                    at: now,
                    versions: versions.to_vec(),
                    caught_up: None,
                },
            );
        }
    }

    /// Whether `version` of `key` is one our own writes already replaced (the cache is behind). A
    /// write that changed nothing leaves the version as it was (the API server neither bumps it
    /// nor sends an event): that version is still current, never stale, or the object would wait
    /// for a cache update that never comes (seen on the real kube-apiserver: a pool stuck mid-roll).
    pub fn is_stale(&self, key: &str, version: &str) -> bool {
        self.0.lock().is_ok_and(|log| {
            log.by_key
                .get(key)
                .is_some_and(|OwnWrite { versions: v, .. }| {
                    v.last().is_some_and(|last| last != version)
                        && v[..v.len() - 1].iter().any(|x| x == version)
                })
        })
    }

    /// Notes that the watch cache received `version` of `key`, and answers whether one of our own
    /// writes produced it. Once that is the last version our writes produced, the cache has caught
    /// up (a watch never goes back), and the record goes [`OWN_WRITES_CAUGHT_UP_KEEP`] later. Only
    /// the MicrovmMachine watch notes (the other kinds' records are few and keep their TTL), and a
    /// record written after its event arrived keeps its TTL too.
    pub fn note_cached(&self, key: &str, version: &str) -> bool {
        let Ok(mut log) = self.0.lock() else {
            return false;
        };
        let Some(write) = log.by_key.get_mut(key) else {
            return false;
        };
        let own = write.versions[1..].iter().any(|x| x == version);
        if write.caught_up.is_none() && write.versions.last().is_some_and(|last| last == version) {
            write.caught_up = Some(Instant::now());
        }
        own
    }

    /// How many objects' writes are remembered.
    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.0.lock().map_or(0, |log| log.by_key.len())
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

/// What the last reconcile of each pool created and deleted, until the caches show it: kept here,
/// judged by the engine (`capmvm_reconcile::pool::caches_behind`), forgotten once met or given up on.
#[derive(Default)]
pub struct Expectations(Mutex<HashMap<String, Expected>>);

struct Expected {
    at: Instant,
    /// Instances created: must appear in the instance cache.
    created: BTreeSet<String>,
    /// Machines deleted: must show as deleting, or be gone, in the Machine cache.
    deleted: BTreeSet<String>,
}

/// What a pool's last reconcile created and deleted, and how long ago.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Expecting {
    pub(crate) age: Duration,
    pub(crate) created: BTreeSet<String>,
    pub(crate) deleted: BTreeSet<String>,
}

impl Expectations {
    pub(crate) fn expect(&self, key: &str, created: BTreeSet<String>, deleted: BTreeSet<String>) {
        if created.is_empty() && deleted.is_empty() {
            return;
        }
        if let Ok(mut map) = self.0.lock() {
            map.insert(
                key.to_string(),
                Expected {
                    at: Instant::now(),
                    created,
                    deleted,
                },
            );
        }
    }

    /// What `key`'s last reconcile created and deleted, unless forgotten.
    pub(crate) fn get(&self, key: &str) -> Option<Expecting> {
        let map = self.0.lock().ok()?;
        let expected = map.get(key)?;
        Some(Expecting {
            age: expected.at.elapsed(),
            created: expected.created.clone(),
            deleted: expected.deleted.clone(),
        })
    }

    /// Forgets `key`'s expectations: met, or given up on.
    pub(crate) fn forget(&self, key: &str) {
        if let Ok(mut map) = self.0.lock() {
            map.remove(key);
        }
    }
}

/// When this process last wrote each pool's status, by pool key: the engine holds a status back
/// within [`capmvm_reconcile::pool::STATUS_WRITE_INTERVAL`] of the last write.
#[derive(Default)]
pub struct StatusWrites(Mutex<HashMap<String, Timestamp>>);

impl StatusWrites {
    pub(crate) fn last(&self, key: &str) -> Option<Timestamp> {
        self.0.lock().ok()?.get(key).copied()
    }

    pub(crate) fn wrote(&self, key: &str, at: Timestamp) {
        if let Ok(mut map) = self.0.lock() {
            map.insert(key.to_string(), at);
        }
    }

    pub(crate) fn forget(&self, key: &str) {
        if let Ok(mut map) = self.0.lock() {
            map.remove(key);
        }
    }
}

/// When this process first saw each machine's current placement claim from another process, by
/// its own monotonic clock: how old a claim is to this process, whatever the clocks of the
/// processes say (see `capmvm_reconcile::ObservedMachine::claim_seen_for`).
#[derive(Default)]
pub struct ClaimSightings(Mutex<HashMap<String, (String, Instant)>>);

/// How long a sighting is kept: far beyond the claim TTL, so a machine still waiting is not made
/// to wait again, and bounded, so machines placed or gone since are forgotten.
const CLAIM_SIGHTING_KEPT: Duration = Duration::from_secs(600);

impl ClaimSightings {
    /// How long this process has seen `claim` on machine `key` (zero the first time); forgets the
    /// machine's earlier claim, and the machine when it has none.
    pub fn seen_for(&self, key: &str, claim: Option<&str>) -> Option<Duration> {
        let mut seen = self.0.lock().ok()?;
        let Some(claim) = claim else {
            seen.remove(key);
            return None;
        };
        match seen.get(key) {
            Some((c, at)) if c == claim => Some(at.elapsed()),
            _ => {
                seen.insert(key.to_string(), (claim.to_string(), Instant::now()));
                Some(Duration::ZERO)
            }
        }
    }

    /// Forgets sightings older than [`CLAIM_SIGHTING_KEPT`].
    pub fn prune(&self) {
        if let Ok(mut seen) = self.0.lock() {
            seen.retain(|_, (_, at)| at.elapsed() < CLAIM_SIGHTING_KEPT);
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
        assert!(
            !w.note_cached("ns/a", "5"),
            "the version read was someone else's"
        );
        assert!(w.note_cached("ns/a", "7"));
        assert!(
            w.is_stale("ns/a", "7"),
            "7 is not the last: still remembered"
        );
        assert!(w.note_cached("ns/a", "9"));
        assert!(
            w.is_stale("ns/a", "5"),
            "a reconcile that read the old version just before still learns it is stale"
        );
        assert!(
            !w.note_cached("ns/a", "11") && !w.is_stale("ns/a", "11"),
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
            !w.is_stale("ns/c", "3") && !w.note_cached("ns/c", "3"),
            "no write, nothing recorded"
        );
    }

    /// A record goes soon after the cache showed our last write; one the cache never caught up
    /// with stays until its TTL.
    #[test]
    fn own_writes_are_forgotten_soon_after_the_cache_caught_up() {
        let w = OwnWrites::default();
        w.record("ns/seen", &["1".into(), "2".into()]);
        w.record("ns/unseen", &["1".into(), "2".into()]);
        assert!(w.note_cached("ns/seen", "2"));
        if let Ok(mut log) = w.0.lock() {
            // As if the last prune and the cache's catching up were that long ago.
            let now = Instant::now();
            log.pruned_at = now.checked_sub(OWN_WRITES_PRUNE);
            if let Some(seen) = log.by_key.get_mut("ns/seen") {
                seen.caught_up = now.checked_sub(OWN_WRITES_CAUGHT_UP_KEEP);
            }
        }
        w.record("ns/other", &["1".into(), "2".into()]);
        assert_eq!(
            w.remembered(),
            2,
            "ns/seen forgotten, ns/unseen and ns/other kept"
        );
        assert!(!w.is_stale("ns/seen", "1"));
        assert!(w.is_stale("ns/unseen", "1"));
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

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn a_pool_remembers_its_creates_and_deletes_until_forgotten() {
        let e = Expectations::default();
        e.expect("p", set(&["a", "b"]), set(&["old"]));
        let got = e.get("p").unwrap();
        assert_eq!(
            (got.created, got.deleted),
            (set(&["a", "b"]), set(&["old"]))
        );
        assert!(got.age < Duration::from_secs(5));
        assert!(e.get("other").is_none(), "per pool");
        e.forget("p");
        assert!(e.get("p").is_none());
    }

    #[test]
    fn nothing_done_expects_nothing() {
        let e = Expectations::default();
        e.expect("p", BTreeSet::new(), BTreeSet::new());
        assert!(e.get("p").is_none());
    }
}
