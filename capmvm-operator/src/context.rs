//! What every reconcile shares: the client, caches, hosts, credentials, recorder, metrics, backoff.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::runtime::events::Recorder;

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
    pub recorder: Recorder,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// Per-object error backoff.
    pub backoff: Backoff,
    /// Resync period: reconcile every object at least this often.
    pub sync_period: Duration,
    /// Test-only crash points.
    pub fault: Fault,
}

/// Per-object exponential backoff after errors: 1 s, 2 s, 4 s ... up to 5 min; reset on success.
#[derive(Default)]
pub struct Backoff(Mutex<HashMap<String, u32>>);

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
        let n = failures.entry(key.to_string()).or_insert(0);
        let delay = BACKOFF_MIN
            .saturating_mul(2u32.saturating_pow(*n))
            .min(BACKOFF_MAX);
        *n = n.saturating_add(1);
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
    fn backoff_doubles_caps_and_resets() {
        let b = Backoff::default();
        let delays: Vec<u64> = (0..12).map(|_| b.next("a").as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
        assert_eq!(b.next("other").as_secs(), 1, "per object");
        b.reset("a");
        assert_eq!(b.next("a").as_secs(), 1);
    }
}
