//! Prometheus metrics. Reconcile metrics carry controller-runtime's names so existing CAPI dashboards
//! work. Labels are bounded: controller, result, host endpoint, method, code, state, and the
//! MicrovmCluster (`namespace/name`) for cluster-level facts; never a machine's name.

use std::sync::Arc;
use std::time::Duration;

use capmvm_flintlock::{CallObserver, ErrorKind, Method};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileLabels {
    controller: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    host: String,
    method: &'static str,
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HostLabels {
    host: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabels {
    cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HostStateLabels {
    host: String,
    state: &'static str,
}

/// How a reconcile ended, as controller-runtime labels it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReconcileResult {
    /// Done, waiting for changes.
    Success,
    /// Failed.
    Error,
    /// Asked to run again after a delay.
    RequeueAfter,
}

impl ReconcileResult {
    fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Error => "error",
            Self::RequeueAfter => "requeue_after",
        }
    }
}

/// Every metric of the operator.
pub struct Metrics {
    registry: Registry,
    reconcile_total: Family<ReconcileLabels, Counter>,
    reconcile_errors: Family<ControllerLabels, Counter>,
    reconcile_time: Family<ControllerLabels, Histogram>,
    flintlock_calls: Family<CallLabels, Counter>,
    flintlock_call_time: Family<MethodLabels, Histogram>,
    host_reachable: Family<HostLabels, Gauge>,
    microvms: Family<HostStateLabels, Gauge>,
    orphaned_microvms: Family<ClusterLabels, Gauge>,
    host_observer_starts: Family<HostLabels, Counter>,
    watch_events: Family<KindLabels, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// A fresh registry with every metric registered.
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::default();
        let reconcile_total = Family::<ReconcileLabels, Counter>::default();
        registry.register(
            "controller_runtime_reconcile",
            "Total number of reconciliations per controller",
            reconcile_total.clone(),
        );
        let reconcile_errors = Family::<ControllerLabels, Counter>::default();
        registry.register(
            "controller_runtime_reconcile_errors",
            "Total number of reconciliation errors per controller",
            reconcile_errors.clone(),
        );
        let reconcile_time = Family::<ControllerLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 16))
        });
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            reconcile_time.clone(),
        );
        let flintlock_calls = Family::<CallLabels, Counter>::default();
        registry.register(
            "capmvm_flintlock_calls",
            "Flintlock calls by host, method and result code",
            flintlock_calls.clone(),
        );
        let flintlock_call_time = Family::<MethodLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0005, 2.0, 16))
        });
        registry.register(
            "capmvm_flintlock_call_duration_seconds",
            "Duration of flintlock calls by method",
            flintlock_call_time.clone(),
        );
        let host_reachable = Family::<HostLabels, Gauge>::default();
        registry.register(
            "capmvm_host_reachable",
            "Whether the flintlock host answered its last list (1) or not (0)",
            host_reachable.clone(),
        );
        let microvms = Family::<HostStateLabels, Gauge>::default();
        registry.register(
            "capmvm_microvms",
            "MicroVMs on each observed host by state, as of its last list",
            microvms.clone(),
        );
        let orphaned_microvms = Family::<ClusterLabels, Gauge>::default();
        registry.register(
            "capmvm_orphaned_microvms",
            "MicroVMs on a MicrovmCluster's hosts that carry the uid of a MicrovmMachine that no longer exists",
            orphaned_microvms.clone(),
        );
        let host_observer_starts = Family::<HostLabels, Counter>::default();
        registry.register(
            "capmvm_host_observer_starts",
            "Host observers started, by host: one per set of credentials in use; a count that rises while credentials stay the same means observers are stopped and started again",
            host_observer_starts.clone(),
        );
        let watch_events = Family::<KindLabels, Counter>::default();
        registry.register(
            "capmvm_watch_events",
            "Watch events received, by kind (changes and deletions; the items of a list are not counted): what the API server's writers cost the operator before it decides anything",
            watch_events.clone(),
        );
        Arc::new(Self {
            registry,
            reconcile_total,
            reconcile_errors,
            reconcile_time,
            flintlock_calls,
            flintlock_call_time,
            host_reachable,
            microvms,
            orphaned_microvms,
            host_observer_starts,
            watch_events,
        })
    }

    /// The counter of watch events received for `kind`: a watch task increments it per event.
    pub fn watch_events_of(&self, kind: &str) -> Counter {
        self.watch_events
            .get_or_create(&KindLabels {
                kind: kind.to_string(),
            })
            .clone()
    }

    /// Records one reconcile of `controller`.
    pub fn reconciled(&self, controller: &'static str, result: ReconcileResult, elapsed: Duration) {
        self.reconcile_total
            .get_or_create(&ReconcileLabels {
                controller,
                result: result.as_str(),
            })
            .inc();
        if result == ReconcileResult::Error {
            self.reconcile_errors
                .get_or_create(&ControllerLabels { controller })
                .inc();
        }
        self.reconcile_time
            .get_or_create(&ControllerLabels { controller })
            .observe(elapsed.as_secs_f64());
    }

    /// Records a host's reachability and microVM counts by state after a list.
    pub fn host_observed(&self, host: &str, reachable: bool, by_state: &[(&'static str, i64)]) {
        self.host_reachable
            .get_or_create(&HostLabels {
                host: host.to_string(),
            })
            .set(i64::from(reachable));
        for (state, n) in by_state {
            self.microvms
                .get_or_create(&HostStateLabels {
                    host: host.to_string(),
                    state,
                })
                .set(*n);
        }
    }

    /// Records how many microVMs on the hosts of MicrovmCluster `cluster` (`namespace/name`) belong to
    /// no object.
    pub fn orphaned_microvms(&self, cluster: &str, count: usize) {
        self.orphaned_microvms
            .get_or_create(&ClusterLabels {
                cluster: cluster.to_string(),
            })
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// An observer of `host` started (under one set of credentials).
    pub fn host_observer_started(&self, host: &str) {
        self.host_observer_starts
            .get_or_create(&HostLabels {
                host: host.to_string(),
            })
            .inc();
    }

    /// Drops the gauges of a MicrovmCluster that is gone.
    pub fn cluster_forgotten(&self, cluster: &str) {
        self.orphaned_microvms.remove(&ClusterLabels {
            cluster: cluster.to_string(),
        });
    }

    /// Drops the gauges of a host no longer observed.
    pub fn host_forgotten(&self, host: &str) {
        let labels = HostLabels {
            host: host.to_string(),
        };
        self.host_reachable.remove(&labels);
        for state in ["pending", "created", "failed", "deleting", "unknown"] {
            self.microvms.remove(&HostStateLabels {
                host: host.to_string(),
                state,
            });
        }
    }

    /// The metrics in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Encoding into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl CallObserver for Metrics {
    fn observe(
        &self,
        endpoint: &str,
        method: Method,
        outcome: Result<(), ErrorKind>,
        elapsed: Duration,
    ) {
        let code = match outcome {
            Ok(()) => "ok",
            Err(kind) => kind.as_str(),
        };
        let method = method.as_str();
        self.flintlock_calls
            .get_or_create(&CallLabels {
                host: endpoint.to_string(),
                method,
                code,
            })
            .inc();
        self.flintlock_call_time
            .get_or_create(&MethodLabels { method })
            .observe(elapsed.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_controller_runtime() {
        let m = Metrics::new();
        m.reconciled(
            "microvmmachine",
            ReconcileResult::Error,
            Duration::from_millis(3),
        );
        m.observe(
            "10.0.0.1:9090",
            Method::List,
            Err(ErrorKind::Unavailable),
            Duration::from_millis(1),
        );
        m.host_observed("10.0.0.1:9090", true, &[("pending", 2)]);
        let machines = m.watch_events_of("Machine");
        machines.inc();
        machines.inc();
        let text = m.encode();
        for needle in [
            "controller_runtime_reconcile_total{controller=\"microvmmachine\",result=\"error\"} 1",
            "controller_runtime_reconcile_errors_total{controller=\"microvmmachine\"} 1",
            "controller_runtime_reconcile_time_seconds_count{controller=\"microvmmachine\"} 1",
            "capmvm_flintlock_calls_total{host=\"10.0.0.1:9090\",method=\"ListMicroVMs\",code=\"unavailable\"} 1",
            "capmvm_host_reachable{host=\"10.0.0.1:9090\"} 1",
            "capmvm_microvms{host=\"10.0.0.1:9090\",state=\"pending\"} 2",
            "capmvm_watch_events_total{kind=\"Machine\"} 2",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
    }
}
