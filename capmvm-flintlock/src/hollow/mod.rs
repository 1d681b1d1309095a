//! The hollow flintlock host: a simulated flintlockd (kubemark-style) that serves flintlock's gRPC
//! service over real TCP, keeps microVM records in memory and moves them through flintlock's
//! states on timers instead of running VMMs.
//!
//! What it reproduces (see `docs/hollow-host.md` for the list of deviations): flintlock's
//! validation and error texts and codes, ULID uids, defaults, `instance_id` injection, the `eth0`
//! metadata interface (Firecracker), PENDING → CREATED after a provisioning time, linear retry
//! backoff and FAILED after the retry budget, DELETING then removal, basic auth and TLS/mTLS.
//!
//! What tests get on top, through [`HostControl`]: failure injection, unreachability, latency,
//! hanging deletes, a capacity limit, a time scale for flintlock's backoff, call counters.

mod lifecycle;
mod metadata;
mod net;
pub mod pki;
pub mod proxy;
mod service;
mod ulid;
mod validate;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::client::Method;
use crate::proto::types as pb;
use crate::secret::{SecretBytes, SecretString};
use crate::types::{Microvm, MicrovmState};

pub use ulid::is_ulid;

/// The server side of TLS, as flintlockd's `--tls-cert`, `--tls-key`, `--tls-client-ca` and
/// `--tls-client-validate`.
#[derive(Clone, Debug)]
pub struct ServerTls {
    /// The host's certificate chain (PEM).
    pub cert_pem: Vec<u8>,
    /// The host's private key (PEM).
    pub key_pem: SecretBytes,
    /// CA bundle for client certificates (PEM).
    pub client_ca_pem: Option<Vec<u8>>,
    /// Require and verify client certificates. Like flintlockd, a client CA without this flag
    /// requests no client certificate at all.
    pub require_client_cert: bool,
}

/// Total resources of a host; creates beyond them end FAILED.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Virtual CPUs.
    pub vcpu: i64,
    /// Memory in MiB.
    pub memory_mb: i64,
}

/// How a hollow host behaves.
#[derive(Clone, Debug)]
pub struct HollowConfig {
    /// Where to listen; port 0 picks a free port. Default `127.0.0.1:0`.
    pub bind: SocketAddr,
    /// flintlockd `--basic-auth-token`: when set, every call needs `authorization: Basic
    /// base64(token)`.
    pub basic_auth_token: Option<SecretString>,
    /// TLS; `None` is flintlockd `--insecure`.
    pub tls: Option<ServerTls>,
    /// Wall-clock time from create to CREATED (not scaled). Default 1 s.
    pub provision_time: Duration,
    /// Time from DELETING to removal, before scaling. Default 1 s.
    pub delete_time: Duration,
    /// Multiplies flintlock's own intervals (the retry backoff and the delete time): 0.001 makes
    /// the 20 s backoff 20 ms. Default 1.0. [`HostControl::set_time_scale`] changes it later.
    pub time_scale: f64,
    /// Resource limit; `None` is unlimited. Default unlimited.
    pub capacity: Option<Capacity>,
    /// flintlockd `--default-provider`. Default `firecracker`.
    pub default_provider: String,
    /// flintlockd `--maximum-retry`. Default 10.
    pub max_retry: i32,
    /// flintlock's backoff base (20 s), before scaling: attempt n waits n × this.
    pub backoff_base: Duration,
    /// Added before answering every call. Default none.
    pub latency: Duration,
    /// `false`: image pulls fail as on a machine that cannot reach the registry (flintlockd's
    /// containerd resolving `ghcr.io` with no network), so every provisioning attempt fails and
    /// the microVM stays PENDING, counting `retry` up, until FAILED. Default `true`.
    pub registry_reachable: bool,
}

impl Default for HollowConfig {
    fn default() -> Self {
        HollowConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            basic_auth_token: None,
            tls: None,
            provision_time: Duration::from_secs(1),
            delete_time: Duration::from_secs(1),
            time_scale: 1.0,
            capacity: None,
            default_provider: "firecracker".to_owned(),
            max_retry: 10,
            backoff_base: Duration::from_secs(20),
            latency: Duration::ZERO,
            registry_reachable: true,
        }
    }
}

/// Starting a hollow host failed.
#[derive(Debug, thiserror::Error)]
pub enum HollowError {
    /// The address could not be bound (or re-bound after being unreachable).
    #[error("binding {address}: {source}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// The TLS material is unusable.
    #[error("TLS: {0}")]
    Tls(String),
    /// The configuration is inconsistent.
    #[error("configuration: {0}")]
    Config(String),
}

fn check_time_scale(time_scale: f64) -> Result<(), HollowError> {
    if !time_scale.is_finite() || time_scale < 0.0 {
        return Err(HollowError::Config(format!(
            "time scale must be a finite number >= 0, not {time_scale}"
        )));
    }
    Ok(())
}

/// Starts hollow hosts.
#[derive(Debug)]
pub struct HollowHost;

impl HollowHost {
    /// Binds, starts serving and returns the handle. Must run inside a Tokio runtime.
    pub async fn start(config: HollowConfig) -> Result<HollowHandle, HollowError> {
        check_time_scale(config.time_scale)?;
        if !service::PROVIDERS
            .iter()
            .any(|(name, _)| *name == config.default_provider)
        {
            return Err(HollowError::Config(format!(
                "unknown default provider {:?}",
                config.default_provider
            )));
        }
        let tls = config.tls.as_ref().map(net::tls_acceptor).transpose()?;
        let (listener, connections) = net::Listener::bind(config.bind, tls).await?;
        let address = listener.address();
        let (hang, _) = tokio::sync::watch::channel(false);
        let stopped = CancellationToken::new();
        let host = Arc::new(Host {
            endpoint: address.to_string(),
            state: Mutex::new(State {
                vms: BTreeMap::new(),
                ulids: ulid::UlidGenerator::new(),
                latency: config.latency,
                create_latency: Duration::ZERO,
                provision_time: config.provision_time,
                capacity: config.capacity,
                doomed_creates: 0,
                failing_attempts: 0,
                refused_images: std::collections::BTreeSet::new(),
            }),
            time_scale: AtomicU64::new(config.time_scale.to_bits()),
            config,
            counters: CallCounters::default(),
            listener: tokio::sync::Mutex::new(listener),
            stopped: stopped.clone(),
            hang,
        });
        let incoming = futures::stream::unfold(connections, |mut connections| async move {
            connections
                .recv()
                .await
                .map(|connection| (Ok::<_, std::io::Error>(connection), connections))
        });
        let server = tonic::transport::Server::builder().add_service(
            crate::proto::services::micro_vm_server::MicroVmServer::new(service::Service::new(
                host.clone(),
            )),
        );
        let shutdown = stopped.clone();
        let task = tokio::spawn(async move {
            if let Err(err) = server
                .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
                .await
            {
                tracing::warn!(error = %err, "hollow host: server ended with an error");
            }
        });
        tracing::info!(endpoint = %host.endpoint, tls = host.config.tls.is_some(), "hollow flintlock host listening");
        Ok(HollowHandle {
            control: HostControl { host },
            server: task,
        })
    }
}

/// A running hollow host. Dropping it stops the host (like [`shutdown`](Self::shutdown), without
/// waiting).
#[derive(Debug)]
pub struct HollowHandle {
    control: HostControl,
    server: JoinHandle<()>,
}

impl HollowHandle {
    /// `127.0.0.1:port`: what a client's `HostConfig::endpoint` should be.
    pub fn endpoint(&self) -> String {
        self.control.host.endpoint.clone()
    }

    /// The control API (cloneable, usable after the handle is gone until the host stops).
    pub fn control(&self) -> HostControl {
        self.control.clone()
    }

    /// Stops serving: closes the listener, drops connections, ends the lifecycle timers.
    pub async fn shutdown(self) {
        self.control.host.stopped.cancel();
        self.control.host.listener.lock().await.close().await;
        // Drop runs too; the server task ends on the cancelled token.
    }
}

impl Drop for HollowHandle {
    fn drop(&mut self) {
        self.control.host.stopped.cancel();
        if let Ok(mut listener) = self.control.host.listener.try_lock() {
            listener.kill();
        }
        self.server.abort();
    }
}

/// Calls answered by a host, by method (counted on arrival, refused ones included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// `CreateMicroVM` calls.
    pub create: u64,
    /// `GetMicroVM` calls.
    pub get: u64,
    /// `ListMicroVMs` calls.
    pub list: u64,
    /// `ListMicroVMsStream` calls.
    pub list_stream: u64,
    /// `DeleteMicroVM` calls.
    pub delete: u64,
}

impl Counters {
    /// All calls.
    pub fn total(&self) -> u64 {
        self.create + self.get + self.list + self.list_stream + self.delete
    }

    /// The count for one method.
    pub fn of(&self, method: Method) -> u64 {
        match method {
            Method::Create => self.create,
            Method::Get => self.get,
            Method::List => self.list,
            Method::ListStream => self.list_stream,
            Method::Delete => self.delete,
        }
    }
}

#[derive(Default)]
struct CallCounters([AtomicU64; 5]);

impl CallCounters {
    fn index(method: Method) -> usize {
        match method {
            Method::Create => 0,
            Method::Get => 1,
            Method::List => 2,
            Method::ListStream => 3,
            Method::Delete => 4,
        }
    }

    fn add(&self, method: Method) {
        self.0[Self::index(method)].fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> Counters {
        let get = |method| self.0[Self::index(method)].load(Ordering::Relaxed);
        Counters {
            create: get(Method::Create),
            get: get(Method::Get),
            list: get(Method::List),
            list_stream: get(Method::ListStream),
            delete: get(Method::Delete),
        }
    }

    fn reset(&self) {
        for counter in &self.0 {
            counter.store(0, Ordering::Relaxed);
        }
    }
}

/// What the host holds about one microVM (a snapshot for tests).
#[derive(Clone, Debug)]
pub struct VmSnapshot {
    /// The record as the API returns it.
    pub microvm: Microvm,
    /// The provider it was created with.
    pub provider: String,
    /// Why the last attempt failed (flintlock has no such field; the hollow host keeps it for
    /// tests and logs).
    pub last_failure: Option<String>,
}

impl VmSnapshot {
    /// The uid.
    pub fn uid(&self) -> &str {
        self.microvm.uid()
    }

    /// The state.
    pub fn state(&self) -> MicrovmState {
        self.microvm.status.state
    }
}

/// Drives a hollow host from a test: fault switches, capacity, timing, counters and a view of the
/// stored microVMs. Cheap to clone.
#[derive(Clone)]
pub struct HostControl {
    host: Arc<Host>,
}

impl std::fmt::Debug for HostControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostControl")
            .field("endpoint", &self.host.endpoint)
            .finish_non_exhaustive()
    }
}

impl HostControl {
    /// The host's `host:port`.
    pub fn endpoint(&self) -> &str {
        &self.host.endpoint
    }

    /// The next `n` microVMs created fail every attempt and end FAILED after the retry budget.
    pub fn fail_next_creates(&self, n: u32) {
        self.host.state().doomed_creates = n;
    }

    /// Creates whose kernel image is `image` are refused as flintlock's `imageURI` check refuses an
    /// image, with its text: a host whose checks are stricter than the provider's own validation (a
    /// newer flintlock). `false` accepts it again.
    pub fn refuse_kernel_image(&self, image: &str, refuse: bool) {
        let mut state = self.host.state();
        if refuse {
            state.refused_images.insert(image.to_string());
        } else {
            state.refused_images.remove(image);
        }
    }

    /// The next `n` provisioning attempts (of any microVM) fail once each; the microVMs retry
    /// after flintlock's backoff.
    pub fn fail_next_attempts(&self, n: u32) {
        self.host.state().failing_attempts = n;
    }

    /// `false`: close the listener and drop every open connection, so clients see Unavailable.
    /// `true`: listen again on the same address. Returns once done.
    pub async fn set_reachable(&self, reachable: bool) -> Result<(), HollowError> {
        let mut listener = self.host.listener.lock().await;
        if reachable {
            listener.reopen().await?;
        } else {
            listener.close().await;
        }
        tracing::info!(endpoint = %self.host.endpoint, reachable, "hollow host reachability changed");
        Ok(())
    }

    /// Serves `tls` (`None`: plain, flintlockd `--insecure`) from now on, as flintlockd restarted
    /// with rotated certificate files: open connections are closed, the microVMs stay. An unusable
    /// certificate or key is refused and the host keeps serving the old ones.
    pub async fn set_tls(&self, tls: Option<ServerTls>) -> Result<(), HollowError> {
        let acceptor = tls.as_ref().map(net::tls_acceptor).transpose()?;
        self.host
            .listener
            .lock()
            .await
            .replace_tls(acceptor)
            .await?;
        tracing::info!(endpoint = %self.host.endpoint, tls = tls.is_some(), "hollow host serves a new certificate");
        Ok(())
    }

    /// Whether the host is listening.
    pub async fn is_reachable(&self) -> bool {
        self.host.listener.lock().await.is_listening()
    }

    /// Delay added before answering every call.
    pub fn set_latency(&self, latency: Duration) {
        self.host.state().latency = latency;
    }

    /// Delay added before a create is carried out (after any [`HostControl::set_latency`]): the
    /// microVM shows in lists only once it passed, as a create still on its way to a busy host.
    pub fn set_create_latency(&self, latency: Duration) {
        self.host.state().create_latency = latency;
    }

    /// `true`: deletes stay DELETING (flintlock's delete that keeps failing); `false`: held
    /// deletes complete.
    pub fn hang_deletes(&self, hang: bool) {
        self.host.hang.send_replace(hang);
    }

    /// Changes the resource limit (`None` = unlimited). Applies to attempts from now on.
    pub fn set_capacity(&self, capacity: Option<Capacity>) {
        self.host.state().capacity = capacity;
    }

    /// Changes the time from create to CREATED for microVMs created from now on.
    pub fn set_provision_time(&self, provision_time: Duration) {
        self.host.state().provision_time = provision_time;
    }

    /// Changes the time scale ([`HollowConfig::time_scale`]) for every wait that starts from now
    /// on: retry backoffs after later failed attempts and delete times of later deletes. Waits
    /// already under way keep their length. Refuses a scale that is negative or not finite.
    pub fn set_time_scale(&self, time_scale: f64) -> Result<(), HollowError> {
        check_time_scale(time_scale)?;
        self.host
            .time_scale
            .store(time_scale.to_bits(), Ordering::Relaxed);
        tracing::info!(endpoint = %self.host.endpoint, time_scale, "hollow host time scale changed");
        Ok(())
    }

    /// The current time scale.
    pub fn time_scale(&self) -> f64 {
        self.host.time_scale()
    }

    /// Calls answered so far, by method.
    pub fn counters(&self) -> Counters {
        self.host.counters.snapshot()
    }

    /// Sets every counter back to zero.
    pub fn reset_counters(&self) {
        self.host.counters.reset();
    }

    /// Every stored microVM, in uid (creation) order.
    pub fn vms(&self) -> Vec<VmSnapshot> {
        self.host.state().vms.values().map(Vm::snapshot).collect()
    }

    /// Every stored microVM's uid and state, in uid (creation) order: what a poller reads to find
    /// the few it needs whole ([`HostControl::vm`]) without copying every record's spec.
    pub fn vm_states(&self) -> Vec<(String, MicrovmState)> {
        self.host
            .state()
            .vms
            .iter()
            .map(|(uid, vm)| (uid.clone(), vm.state()))
            .collect()
    }

    /// One stored microVM.
    pub fn vm(&self, uid: &str) -> Option<VmSnapshot> {
        self.host.state().vms.get(uid).map(Vm::snapshot)
    }

    /// vCPU and MiB held by CREATED microVMs (and DELETING ones that were created).
    pub fn used(&self) -> Capacity {
        self.host.state().used()
    }

    /// Removes a record without going through DELETING (a host that lost its state). Returns
    /// whether it existed.
    pub fn forget(&self, uid: &str) -> bool {
        self.host.state().vms.remove(uid).is_some()
    }
}

/// The shared state of one host.
pub(crate) struct Host {
    config: HollowConfig,
    endpoint: String,
    /// The current time scale (`f64` bits). An atomic rather than a field of `State`: backoffs are
    /// scaled while `State` is locked.
    time_scale: AtomicU64,
    state: Mutex<State>,
    counters: CallCounters,
    listener: tokio::sync::Mutex<net::Listener>,
    /// Cancelled when the host stops: ends the server and the lifecycle timers.
    stopped: CancellationToken,
    /// Whether deletes hang.
    hang: tokio::sync::watch::Sender<bool>,
}

struct State {
    vms: BTreeMap<String, Vm>,
    ulids: ulid::UlidGenerator,
    latency: Duration,
    create_latency: Duration,
    provision_time: Duration,
    capacity: Option<Capacity>,
    doomed_creates: u32,
    failing_attempts: u32,
    refused_images: std::collections::BTreeSet<String>,
}

impl State {
    fn used(&self) -> Capacity {
        let holding = self.vms.values().filter(|vm| vm.holds_resources);
        Capacity {
            vcpu: holding.clone().map(|vm| i64::from(vm.vcpu())).sum(),
            memory_mb: holding.map(|vm| i64::from(vm.memory_mb())).sum(),
        }
    }
}

struct Vm {
    record: pb::MicroVm,
    provider: String,
    /// Every attempt fails (`fail_next_creates`).
    doomed: bool,
    holds_resources: bool,
    last_failure: Option<String>,
    removal_started: bool,
    /// The end of the current retry backoff (flintlock's `status.not_before`): flintlock
    /// reconciles nothing of this microVM before then, its deletion included.
    not_before: Option<tokio::time::Instant>,
    /// When it was last deleted, in Unix seconds (flintlock's `deleted_at`).
    deleted_at: Option<u64>,
}

impl Vm {
    fn spec(&self) -> pb::MicroVmSpec {
        self.record.spec.clone().unwrap_or_default()
    }

    fn vcpu(&self) -> i32 {
        self.record.spec.as_ref().map_or(0, |spec| spec.vcpu)
    }

    fn memory_mb(&self) -> i32 {
        self.record
            .spec
            .as_ref()
            .map_or(0, |spec| spec.memory_in_mb)
    }

    fn status_mut(&mut self) -> &mut pb::MicroVmStatus {
        self.record.status.get_or_insert_with(Default::default)
    }

    fn state(&self) -> MicrovmState {
        MicrovmState::from(self.record.status.as_ref().map_or(0, |status| status.state))
    }

    fn set_state(&mut self, state: MicrovmState) {
        self.status_mut().state = i32::from(state);
    }

    fn snapshot(&self) -> VmSnapshot {
        VmSnapshot {
            // Records are built by the host and always have a spec.
            microvm: Microvm::try_from(self.record.clone()).unwrap_or_default(),
            provider: self.provider.clone(),
            last_failure: self.last_failure.clone(),
        }
    }
}

impl Host {
    fn state(&self) -> MutexGuard<'_, State> {
        // No code path leaves the state half-updated on panic, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn time_scale(&self) -> f64 {
        f64::from_bits(self.time_scale.load(Ordering::Relaxed))
    }

    fn scaled(&self, duration: Duration) -> Duration {
        // Only finite scales >= 0 are stored, so the product is never negative or NaN; a product
        // too large for a Duration waits "forever" (tokio caps sleeps at ~30 years).
        Duration::try_from_secs_f64(duration.as_secs_f64() * self.time_scale())
            .unwrap_or(Duration::MAX)
    }

    /// Sleeps unless the host stops first; returns whether the host still runs.
    async fn sleep(&self, duration: Duration) -> bool {
        tokio::select! {
            () = self.stopped.cancelled() => false,
            () = tokio::time::sleep(duration) => true,
        }
    }
}
