//! When the stand-in's controllers retry a failed reconcile: as the per-object exponential part of
//! controller-runtime's default rate limiter, which CAPI's controllers use (its overall 10 qps bucket
//! is not modelled). 5 ms after an object's first failure, doubling with each consecutive one, at most
//! 1000 s; a success forgets the object's failures. A fixed delay misstates CAPI's pace: a MachineSet's
//! generated Machine name that collides (5 characters, as CAPI's; a 10 000-replica MachineDeployment
//! meets a few) holds up its creates for 5 ms in CAPI, and held them up for 500 ms here.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::runtime::controller::Action;
use tracing::debug;

use super::controllers::{Ctx, Error};

/// Runs a reconcile and, when it succeeds, forgets the object's failures.
pub(crate) async fn forgetting_failures<K, C, F, Fut>(
    obj: Arc<K>,
    ctx: Arc<C>,
    reconcile: F,
) -> Result<Action, Error>
where
    K: Resource,
    C: AsRef<Ctx>,
    F: FnOnce(Arc<K>, Arc<C>) -> Fut,
    Fut: Future<Output = Result<Action, Error>>,
{
    let result = reconcile(obj.clone(), ctx.clone()).await;
    if result.is_ok() {
        (*ctx).as_ref().failures.succeeded(obj.meta());
    }
    result
}

/// The error policy of every stand-in controller: retries after the object's backoff.
pub(crate) fn error_policy<K: Resource, C: AsRef<Ctx>>(
    obj: Arc<K>,
    error: &Error,
    ctx: Arc<C>,
) -> Action {
    let meta = obj.meta();
    let delay = (*ctx).as_ref().failures.failed(meta);
    debug!(
        error = %error,
        namespace = meta.namespace.as_deref().unwrap_or_default(),
        name = meta.name.as_deref().unwrap_or_default(),
        ?delay,
        "stand-in reconcile failed; retrying"
    );
    Action::requeue(delay)
}

/// Consecutive failed reconciles, per object (by uid: an object created again under the same name
/// starts afresh).
#[derive(Debug, Default)]
pub(crate) struct Failures(Mutex<HashMap<String, u32>>);

impl Failures {
    /// Records a failed reconcile of the object; returns how long to wait before the next.
    pub(crate) fn failed(&self, meta: &ObjectMeta) -> Duration {
        let mut failures = self.lock();
        let count = failures.entry(key(meta)).or_insert(0);
        *count = count.saturating_add(1);
        delay(*count)
    }

    /// Forgets the object's failures after a reconcile succeeded.
    pub(crate) fn succeeded(&self, meta: &ObjectMeta) {
        let mut failures = self.lock();
        if !failures.is_empty() {
            failures.remove(&key(meta));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The object's uid; its namespace and name if it has none (an object read from the API always has one).
fn key(meta: &ObjectMeta) -> String {
    match meta.uid.as_deref() {
        Some(uid) if !uid.is_empty() => uid.to_string(),
        _ => format!(
            "{}/{}",
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        ),
    }
}

/// 5 ms × 2^(failures − 1), at most 1000 s.
fn delay(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(30);
    Duration::from_millis(5u64 << doublings).min(Duration::from_secs(1000))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(name: &str, uid: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some("default".to_string()),
            uid: Some(uid.to_string()),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn backoff_doubles_per_object_from_five_ms_to_1000_s_and_a_success_resets_it() {
        let failures = Failures::default();
        let (a, b) = (object("a", "uid-a"), object("b", "uid-b"));
        let waits: Vec<u128> = (0..4).map(|_| failures.failed(&a).as_millis()).collect();
        assert_eq!(waits, [5, 10, 20, 40]);
        assert_eq!(
            failures.failed(&b),
            Duration::from_millis(5),
            "counted per object"
        );
        failures.succeeded(&a);
        assert_eq!(
            failures.failed(&a),
            Duration::from_millis(5),
            "a success forgets"
        );
        for _ in 0..40 {
            failures.failed(&b);
        }
        assert_eq!(failures.failed(&b), Duration::from_secs(1000), "capped");
        let b_again = object("b", "uid-b2");
        assert_eq!(
            failures.failed(&b_again),
            Duration::from_millis(5),
            "an object created again under the same name starts afresh"
        );
    }
}
