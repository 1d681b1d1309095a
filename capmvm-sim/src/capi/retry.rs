//! When the stand-in retries a failed reconcile: as controller-runtime's default rate limiter, which
//! CAPI's controllers use. 5 ms after an object's first failure, doubling with each consecutive one,
//! at most 1000 s; a success forgets the object's failures. A fixed delay misstates CAPI's pace: a
//! MachineSet's generated Machine name that collides (5 characters, as CAPI's; a 10 000-replica
//! MachineDeployment meets a few) holds up its creates for 5 ms in CAPI, and held them up for 500 ms
//! here.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use kube::Resource;

/// Consecutive failed reconciles, per object.
#[derive(Debug, Default)]
pub(crate) struct Failures(Mutex<HashMap<String, u32>>);

impl Failures {
    /// Records a failed reconcile of `obj`; returns how long to wait before the next.
    pub(crate) fn failed<K: Resource<DynamicType = ()>>(&self, obj: &K) -> Duration {
        let mut failures = self.lock();
        let count = failures.entry(key(obj)).or_insert(0);
        *count = count.saturating_add(1);
        delay(*count)
    }

    /// Forgets the failures of `obj` after a reconcile succeeded.
    pub(crate) fn succeeded<K: Resource<DynamicType = ()>>(&self, obj: &K) {
        let mut failures = self.lock();
        if !failures.is_empty() {
            failures.remove(&key(obj));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn key<K: Resource<DynamicType = ()>>(obj: &K) -> String {
    format!(
        "{}/{}/{}",
        K::kind(&()),
        obj.meta().namespace.as_deref().unwrap_or_default(),
        obj.meta().name.as_deref().unwrap_or_default()
    )
}

/// 5 ms × 2^(failures − 1), at most 1000 s.
fn delay(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(30);
    Duration::from_millis(5u64 << doublings).min(Duration::from_secs(1000))
}

#[cfg(test)]
mod tests {
    use super::*;
    use capmvm_api::capi::Machine;

    fn machine(name: &str) -> Machine {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Machine",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"clusterName": "c", "bootstrap": {}, "infrastructureRef": {}},
        }))
        .unwrap_or_else(|e| panic!("a Machine: {e}"))
    }

    #[test]
    fn backoff_doubles_per_object_from_five_ms_to_1000_s_and_a_success_resets_it() {
        let failures = Failures::default();
        let (a, b) = (machine("a"), machine("b"));
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
    }
}
