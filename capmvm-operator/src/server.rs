//! HTTP endpoints: `/healthz` and `/readyz` on the health address, `/metrics` on the diagnostics address.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::net::TcpListener;

use crate::metrics::Metrics;

/// Whether the operator is ready, and why not: `/readyz` answers from it.
///
/// Ready means the controllers run (every watch cache has its first list), or, with leader election,
/// standing by as a healthy candidate. A leader whose caches are still syncing is not ready.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<Mutex<State>>);

#[derive(Debug, Default)]
struct State {
    phase: Phase,
    caches: BTreeMap<String, CacheSync>,
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

/// One watch cache's progress towards its first full list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheSync {
    /// The first list completed.
    pub synced: bool,
    /// The last error of its watch, if any.
    pub last_error: Option<String>,
}

impl Readiness {
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

    /// A watch cache for `kind` started.
    pub fn cache_started(&self, kind: &str) {
        self.with(|s| {
            s.caches.entry(kind.to_string()).or_default();
        });
    }

    /// The cache for `kind` has its first full list.
    pub fn cache_synced(&self, kind: &str) {
        self.with(|s| s.caches.entry(kind.to_string()).or_default().synced = true);
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

    /// `Ok` with a note when ready, else why not.
    pub fn check(&self) -> Result<&'static str, String> {
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
        match phase {
            Phase::Running => Ok("ok"),
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
