//! The controllers and what they share: the error type, the wrapper every reconcile runs in
//! ([`wrap`]), the error policy and event publishing.

pub mod cluster;
pub mod machine;
pub mod pool;
pub mod template;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use capmvm_reconcile::Requeue;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use tracing::{debug, warn};

use crate::context::Ctx;
use crate::metrics::ReconcileResult;

/// Why a reconcile failed; it is retried with per-object backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed (a 409 Conflict means a newer version exists: read it and retry).
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A flintlock call failed; the message is safe to show (no secrets).
    #[error("{0}")]
    HostCall(String),
}

impl Error {
    /// A short, stable name for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Kube(e) if crate::patch::is_conflict(e) => "conflict",
            Self::Kube(_) => "kube",
            Self::HostCall(_) => "host_call",
        }
    }

    /// Whether the object changed since it was read (see [`crate::patch::is_conflict`]).
    pub fn is_conflict(&self) -> bool {
        self.kind() == "conflict"
    }
}

/// How soon an object whose write lost to another writer is reconciled again: the cache shows the
/// newer version within moments; an expected conflict earns no backoff.
const CONFLICT_RETRY: Duration = Duration::from_millis(200);

/// How soon to look again when the caches still hold a version our own writes replaced.
const STALE_CACHE_RETRY: Duration = Duration::from_millis(200);

/// How a reconcile ended, for the wrapper to map to an action.
#[derive(Debug)]
pub enum Outcome {
    /// The engine's last plan says when to decide again.
    Requeue(Requeue),
    /// The object is gone (its finalizer was the last thing holding it).
    Gone,
}

/// What one reconcile hands back to the wrapper: how it ended, and the versions the object went
/// through (the one read first, then each our writes produced).
pub struct Reconciled {
    /// How it ended.
    pub result: Result<Outcome, Error>,
    /// The versions, for [`crate::memory::OwnWrites`].
    pub versions: Vec<String>,
}

/// The one wrapper around every controller's reconcile: skips a version our own writes already
/// replaced (or one `behind` says the caches have not caught up with), records the versions our
/// writes produced, maps the engine's requeue to an action (a host call worth retrying to the
/// object's backoff), resets the backoff on success, and records the reconcile's metrics.
pub async fn wrap<K, Fut>(
    controller: &'static str,
    obj: Arc<K>,
    ctx: Arc<Ctx>,
    behind: impl FnOnce(&K, &Ctx) -> bool,
    body: impl FnOnce(K, Arc<Ctx>) -> Fut,
) -> Result<Action, Error>
where
    K: Resource<DynamicType = ()> + Clone,
    Fut: Future<Output = Reconciled>,
{
    let started = Instant::now();
    let key = key(obj.as_ref());
    let version = obj.resource_version().unwrap_or_default();
    if ctx.writes.is_stale(&key, &version) || behind(obj.as_ref(), &ctx) {
        // Deciding on a version our own writes replaced would only earn a 409. The wake that brought
        // us here may carry news the object does not (a host became reachable), so look again as
        // soon as the cache has caught up rather than drop it.
        debug!(object = %key, "the caches are behind our last writes; retrying shortly");
        return Ok(Action::requeue(STALE_CACHE_RETRY));
    }
    let reconciled = body(obj.as_ref().clone(), ctx.clone()).await;
    ctx.writes.record(&key, &reconciled.versions);
    let (action, label) = match reconciled.result {
        Ok(Outcome::Gone) => (Ok(Action::await_change()), ReconcileResult::Success),
        // No timer of its own: a change wakes it, and `watch::resync` at least once per
        // `--sync-period` once past its first steps.
        Ok(Outcome::Requeue(Requeue::Await)) => {
            (Ok(Action::await_change()), ReconcileResult::Success)
        }
        Ok(Outcome::Requeue(Requeue::Immediately)) => (
            Ok(Action::requeue(Duration::ZERO)),
            ReconcileResult::RequeueAfter,
        ),
        Ok(Outcome::Requeue(Requeue::After(d))) => (
            Ok(Action::requeue(d.min(ctx.sync_period))),
            ReconcileResult::RequeueAfter,
        ),
        Ok(Outcome::Requeue(Requeue::Backoff)) => {
            let delay = ctx.backoff.next(&key);
            warn!(object = %key, retry_in = ?delay, "a host call failed; retrying with backoff");
            (Ok(Action::requeue(delay)), ReconcileResult::Error)
        }
        Err(e) => (Err(e), ReconcileResult::Error),
    };
    if label != ReconcileResult::Error {
        ctx.backoff.reset(&key);
    }
    ctx.metrics.reconciled(controller, label, started.elapsed());
    action
}

/// Retries a failed object after its exponential backoff (never a hot loop).
pub fn error_policy<K: Resource<DynamicType = ()>>(
    obj: Arc<K>,
    error: &Error,
    ctx: Arc<Ctx>,
) -> Action {
    if error.is_conflict() {
        debug!(object = %key(obj.as_ref()), "write conflict; retrying on the newer version");
        return Action::requeue(CONFLICT_RETRY);
    }
    let delay = ctx.backoff.next(&key(obj.as_ref()));
    warn!(object = %key(obj.as_ref()), kind = error.kind(), error = %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

pub use crate::memory::key;

/// Publishes an engine event on `obj`. A failure to record an event is logged, never fatal.
pub async fn publish<K>(ctx: &Ctx, obj: &K, event: &capmvm_reconcile::Event)
where
    K: Resource<DynamicType = ()>,
{
    let ev = crate::events::EventSpec {
        type_: match event.kind {
            capmvm_reconcile::EventKind::Normal => "Normal",
            capmvm_reconcile::EventKind::Warning => "Warning",
        },
        reason: event.reason.to_string(),
        note: event.note.clone(),
        action: event.action.to_string(),
    };
    if let Err(e) = ctx.recorder.publish(&ev, &obj.object_ref(&())).await {
        debug!(object = %obj.name_any(), error = %e, "could not publish event");
    }
}

/// Notes `obj`'s version in `versions` if our write changed it.
pub fn note_version<K: Resource>(versions: &mut Vec<String>, obj: &K) {
    let version = obj.meta().resource_version.clone().unwrap_or_default();
    if versions.last() != Some(&version) {
        versions.push(version);
    }
}
