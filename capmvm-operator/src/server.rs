//! HTTP endpoints: `/healthz` and `/readyz` on the health address, `/metrics` on the diagnostics address.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::net::TcpListener;

use crate::metrics::Metrics;

/// Whether the operator is ready: caches synced (and, with leader election, holding the lease or
/// standing by as a healthy candidate).
#[derive(Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Marks ready.
    pub fn set_ready(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    fn is_ready(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Serves `/healthz` and `/readyz` on `addr` until the future is dropped.
pub async fn serve_health(addr: SocketAddr, readiness: Readiness) -> std::io::Result<()> {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let ready = readiness.is_ready();
                async move {
                    if ready {
                        (StatusCode::OK, "ok")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced")
                    }
                }
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
