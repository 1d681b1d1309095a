//! What every reconcile shares: the client, caches, hosts, credentials, recorder, metrics, backoff.

use std::sync::Arc;
use std::time::Duration;

use crate::credentials::Credentials;
use crate::fault::Fault;
use crate::hosts::Hosts;
use crate::memory::{Backoff, ClaimSightings, Expectations, OwnWrites, StatusWrites};
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
    pub recorder: crate::events::EventRecorder,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// Per-object error backoff.
    pub backoff: Backoff,
    /// Versions our own writes went through (shared with the watch layer).
    pub writes: Arc<OwnWrites>,
    /// Resync period: reconcile every object at least this often.
    pub sync_period: Duration,
    /// Test-only crash points.
    pub fault: Fault,
    /// What each pool's last reconcile created and deleted, until the caches show it.
    pub pool_expectations: Expectations,
    /// When this process first saw each machine's placement claim from another process.
    pub claims: ClaimSightings,
    /// When this process last wrote each pool's status (status writes are coalesced).
    pub pool_status_writes: StatusWrites,
}
