//! HTTP endpoints: `/healthz` and `/readyz` on the health address, `/metrics` on the diagnostics address.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::net::TcpListener;

use crate::metrics::Metrics;

/// Whether the operator is ready, and why not: `/readyz` answers from it.
///
/// Ready means the controllers run (every watch cache has its first list, and none has gone
/// without a successful list, watch or event for longer than the staleness bound), or, with leader
/// election, standing by as a healthy candidate. A leader whose caches are still syncing is not
/// ready; neither is one whose watch keeps failing after its first list (a CRD removed, RBAC taken
/// away): its caches are stale, and it says which until the watch succeeds again.
#[derive(Clone, Debug)]
pub struct Readiness(Arc<Mutex<State>>);

impl Default for Readiness {
    fn default() -> Self {
        Self::new(DEFAULT_STALE_AFTER)
    }
}

/// Staleness bound of [`Readiness::default`]: twice the default `--watch-timeout`.
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(120);

#[derive(Debug)]
struct State {
    phase: Phase,
    caches: BTreeMap<String, CacheSync>,
    /// Kind of each cache by the collection it lists and watches (`group/plural`).
    routes: HashMap<String, String>,
    stale_after: Duration,
    /// Why start-up is held (the API server does not answer discovery), while it retries.
    held: Option<String>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Phase {
    /// Checking the API, waiting for caches.
    #[default]
    Starting,
    /// A leader-election candidate without the lease.
    Standby,
    /// Controllers running.
    Running,
}

/// One watch cache's progress towards its first full list, and since.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheSync {
    /// The first list completed.
    pub synced: bool,
    /// The last error of its watch, if any.
    pub last_error: Option<String>,
    /// When the API server last answered its list or watch, or it last had an event.
    pub last_contact: Option<Instant>,
}

impl Readiness {
    /// Readiness whose caches are stale after `stale_after` without a successful list, watch or
    /// event (the operator uses twice its watch timeout: a healthy watch is renewed once per timeout,
    /// even when nothing changes).
    pub fn new(stale_after: Duration) -> Self {
        Self(Arc::new(Mutex::new(State {
            phase: Phase::default(),
            caches: BTreeMap::new(),
            routes: HashMap::new(),
            stale_after,
            held: None,
        })))
    }

    /// Marks ready: the controllers run.
    pub fn set_ready(&self) {
        self.with(|s| s.phase = Phase::Running);
    }

    /// A leader-election candidate standing by: ready (a healthy standby).
    pub fn set_standby(&self) {
        self.with(|s| s.phase = Phase::Standby);
    }

    /// Leadership acquired: not ready until the caches sync and the controllers run.
    pub fn set_leading(&self) {
        self.with(|s| s.phase = Phase::Starting);
    }

    /// Start-up is held for `why` (retrying), or no longer (`None`).
    pub fn set_held(&self, why: Option<String>) {
        self.with(|s| s.held = why);
    }

    /// A watch cache for `kind` started; it lists and watches the collection `route`
    /// (`group/plural`, the core group empty).
    pub fn cache_started(&self, kind: &str, route: &str) {
        self.with(|s| {
            s.caches.entry(kind.to_string()).or_default();
            s.routes.insert(route.to_string(), kind.to_string());
        });
    }

    /// The cache for `kind` has its first full list (or a new one).
    pub fn cache_synced(&self, kind: &str) {
        let now = Instant::now();
        self.with(|s| {
            let cache = s.caches.entry(kind.to_string()).or_default();
            cache.synced = true;
            cache.last_contact = Some(now);
        });
    }

    /// The watch for `kind` delivered an event.
    pub fn cache_contact(&self, kind: &str) {
        let now = Instant::now();
        self.with(|s| {
            if let Some(cache) = s.caches.get_mut(kind) {
                cache.last_contact = Some(now);
            }
        });
    }

    /// The API server answered a list or watch of collection `route` (`group/plural`) with success:
    /// its cache is in contact, even when nothing changes.
    pub fn collection_answered(&self, route: &str) {
        let now = Instant::now();
        self.with(|s| {
            if let Some(kind) = s.routes.get(route).cloned()
                && let Some(cache) = s.caches.get_mut(&kind)
            {
                cache.last_contact = Some(now);
            }
        });
    }

    /// The watch for `kind` failed with `error`; returns the cache's state before the error.
    pub fn cache_error(&self, kind: &str, error: String) -> CacheSync {
        self.with(|s| {
            let cache = s.caches.entry(kind.to_string()).or_default();
            let before = cache.clone();
            cache.last_error = Some(error);
            before
        })
    }

    /// The caches without their first list, by kind.
    pub fn unsynced(&self) -> Vec<(String, CacheSync)> {
        self.with(|s| {
            s.caches
                .iter()
                .filter(|(_, c)| !c.synced)
                .map(|(k, c)| (k.clone(), c.clone()))
                .collect()
        })
    }

    /// The synced caches without a successful list, watch or event for longer than the bound at
    /// `now`, by kind, with how long.
    pub fn stale_at(&self, now: Instant) -> Vec<(String, CacheSync, Duration)> {
        self.with(|s| {
            s.caches
                .iter()
                .filter(|(_, c)| c.synced)
                .filter_map(|(k, c)| {
                    let silent = now.saturating_duration_since(c.last_contact?);
                    (silent > s.stale_after).then(|| (k.clone(), c.clone(), silent))
                })
                .collect()
        })
    }

    /// `Ok` with a note when ready, else why not.
    pub fn check(&self) -> Result<&'static str, String> {
        self.check_at(Instant::now())
    }

    /// [`Readiness::check`] at `now`.
    pub fn check_at(&self, now: Instant) -> Result<&'static str, String> {
        let phase = self.with(|s| s.phase);
        if phase == Phase::Standby {
            return Ok("ok: standing by for the leader lease");
        }
        let unsynced = self.unsynced();
        if !unsynced.is_empty() {
            let caches: Vec<String> = unsynced
                .iter()
                .map(|(kind, c)| match &c.last_error {
                    Some(e) => format!("{kind} (last error: {e})"),
                    None => format!("{kind} (first list in progress)"),
                })
                .collect();
            return Err(format!("watch caches not synced: {}", caches.join("; ")));
        }
        let stale = self.stale_at(now);
        if !stale.is_empty() {
            let caches: Vec<String> = stale
                .iter()
                .map(|(kind, c, silent)| {
                    format!(
                        "{kind} (no successful list, watch or event for {}s; last error: {})",
                        silent.as_secs(),
                        c.last_error.as_deref().unwrap_or("none")
                    )
                })
                .collect();
            return Err(format!(
                "watch caches stale, the controllers work from old data: {}",
                caches.join("; ")
            ));
        }
        match (phase, self.with(|s| s.held.clone())) {
            (Phase::Running, _) => Ok("ok"),
            (_, Some(why)) => Err(format!("starting: {why}")),
            _ => Err("starting: caches not synced yet".to_string()),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        // A poisoned lock only means a panic elsewhere mid-update; the state is still meaningful.
        let mut state = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut state)
    }
}

/// Serves `/healthz` and `/readyz` on `addr` until the future is dropped.
pub async fn serve_health(addr: SocketAddr, readiness: Readiness) -> std::io::Result<()> {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let answer = match readiness.check() {
                    Ok(note) => (StatusCode::OK, note.to_string()),
                    Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
                };
                async move { answer }
            }),
        );
    axum::serve(TcpListener::bind(addr).await?, app).await
}

/// Serves `/metrics` on `addr` until the future is dropped.
pub async fn serve_metrics(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<()> {
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let body = metrics.encode();
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    body,
                )
            }
        }),
    );
    axum::serve(TcpListener::bind(addr).await?, app).await
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUND: Duration = Duration::from_millis(150);

    fn synced(kinds: &[&str]) -> Readiness {
        let r = Readiness::new(BOUND);
        for kind in kinds {
            r.cache_started(kind, &format!("example.com/{}s", kind.to_lowercase()));
            r.cache_synced(kind);
        }
        r.set_ready();
        r
    }

    /// A cache that has gone longer than the bound without a successful list, watch or event makes
    /// the operator unready, naming it and its last error; an answer of its collection or an event
    /// makes it ready again.
    #[test]
    fn a_cache_without_a_successful_answer_for_longer_than_the_bound_is_stale_until_one_comes() {
        let r = synced(&["Machine", "Cluster"]);
        assert_eq!(r.check(), Ok("ok"));
        r.cache_error(
            "Machine",
            "machines.cluster.x-k8s.io is forbidden".to_string(),
        );
        std::thread::sleep(BOUND + Duration::from_millis(50));
        // Cluster's watch was renewed meanwhile; Machine's was refused.
        r.collection_answered("example.com/clusters");
        let why = r.check().unwrap_err();
        assert!(why.contains("watch caches stale"), "{why}");
        assert!(
            why.contains("Machine (no successful list, watch or event for 0s; last error: machines.cluster.x-k8s.io is forbidden)"),
            "{why}"
        );
        assert!(!why.contains("Cluster"), "{why}");
        // The watch is served again: its renewal answers.
        r.collection_answered("example.com/machines");
        assert_eq!(r.check(), Ok("ok"));
        // An event counts as well; answers of a collection no cache watches do not.
        std::thread::sleep(BOUND + Duration::from_millis(50));
        r.cache_contact("Machine");
        r.collection_answered("example.com/others");
        let why = r.check().unwrap_err();
        assert!(why.contains("Cluster") && !why.contains("Machine"), "{why}");
    }

    #[test]
    fn unsynced_caches_are_reported_before_stale_ones_and_a_standby_is_ready() {
        let r = Readiness::new(BOUND);
        r.cache_started("Machine", "cluster.x-k8s.io/machines");
        let why = r.check_at(Instant::now()).unwrap_err();
        assert!(
            why.contains("not synced: Machine (first list in progress)"),
            "{why}"
        );
        r.set_standby();
        assert!(r.check_at(Instant::now() + BOUND * 10).is_ok());
    }
}
