//! The controllers and what they share: the error type, error policy and event publishing.

pub mod cluster;
pub mod machine;
pub mod pool;
pub mod template;

use std::sync::Arc;

use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use tracing::{debug, warn};

use crate::context::Ctx;

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
const CONFLICT_RETRY: std::time::Duration = std::time::Duration::from_millis(200);

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

/// `Kind/namespace/name` of an object: a MicrovmCluster and a MicrovmMachineTemplate may share a name.
pub fn key<K: Resource<DynamicType = ()>>(obj: &K) -> String {
    format!(
        "{}/{}/{}",
        K::kind(&()),
        obj.meta().namespace.as_deref().unwrap_or_default(),
        obj.meta().name.as_deref().unwrap_or_default()
    )
}

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
