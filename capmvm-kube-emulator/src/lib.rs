//! An in-process Kubernetes API server for tests and simulations (a Rust counterpart of envtest).
//!
//! It serves plain HTTP on loopback, and `kubectl`, kube-rs and controllers under test talk to it as
//! they would to a real kube-apiserver: discovery, CustomResourceDefinitions served as soon as they are
//! created, one global resourceVersion, optimistic concurrency, `generation`, the status subresource,
//! merge / JSON / strategic merge patches, server-side apply, schema validation (CEL rules included)
//! with defaulting and pruning, finalizers, owner-reference garbage collection, label and field
//! selectors, consistent pagination, watches with bookmarks and 410 Gone, Table output, access reviews
//! and `Status` errors. The crate's README lists what is
//! supported and what is answered as unsupported.
//!
//! ```no_run
//! # async fn demo() -> Result<(), capmvm_kube_emulator::Error> {
//! use capmvm_kube_emulator::{Emulator, EmulatorOptions};
//!
//! let emulator = Emulator::start(EmulatorOptions::default()).await?;
//! let client = emulator.client()?;
//! emulator.write_kubeconfig("/tmp/kubeconfig")?;
//! # drop(client);
//! emulator.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! Module map: `server` (HTTP routing, negotiation, watch streams) → `ops` (the API verbs and the
//! garbage collector) → `store` (objects, revisions, history, watchers); `registry` and `builtin` (what
//! is served), `schema` (structural schemas) and `cel` (their CEL rules), `patch`, `admission` (in-process defaulting and validation per kind), `apply` (server-side apply and field ownership), `reviews` (access reviews), `scale` (the scale subresource),
//! `protobuf` (request bodies of `kubectl create namespace|secret|configmap`), `selector`, `jsonpath`
//! and `table` (printer columns), `discovery` (discovery and OpenAPI documents), `counters`, `faults` (faults on demand), `cli`
//! (the command: this crate's binary, and `capmvm-sim kube`).

mod admission;
mod apply;
mod background;
mod builtin;
mod cel;
mod cli;
mod counters;
mod discovery;
mod error;
mod faults;
mod jsonpath;
mod meta;
mod node;
mod ops;
mod patch;
mod protobuf;
mod registry;
mod reviews;
mod scale;
mod schema;
mod selector;
mod server;
mod store;
mod table;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub use admission::{Admission, AdmissionHook, Operation};
pub use cli::{KubeArgs, run};
pub use counters::{CounterSnapshot, OTHER_AGENTS, Verb};
pub use error::Error;
pub use faults::{DEFAULT_FAULT_SEED, FaultCounts, FaultKind, FaultRule, FaultRuleError, Faults};

/// How to start the emulator.
#[derive(Debug, Clone)]
pub struct EmulatorOptions {
    /// Address to listen on; port 0 picks a free port. Plain HTTP: keep it on loopback.
    pub bind: SocketAddr,
    /// Changes kept for watches and pagination; a watch from an older resourceVersion gets 410 Gone.
    pub history_limit: usize,
    /// Events buffered per watcher; a watcher that falls this far behind is closed (the client re-watches).
    pub watch_buffer: usize,
    /// How often watchers that asked for bookmarks get one.
    pub bookmark_interval: Duration,
    /// How long a watch lasts when the client does not say (`timeoutSeconds`).
    pub default_watch_timeout: Duration,
    /// Whether every write records its fields under its manager in `metadata.managedFields`
    /// (operation `Update`), as a real server does (the default). Off, only server-side apply records
    /// (and checks) ownership: for simulations at scale whose clients never apply, where every watcher
    /// decoding the entries of every change is most of their cost; the emulator then differs from a
    /// real server in exactly that.
    pub managed_fields: bool,
}

impl Default for EmulatorOptions {
    fn default() -> Self {
        Self {
            bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            history_limit: 10_000,
            watch_buffer: 1_000,
            bookmark_interval: Duration::from_secs(60),
            default_watch_timeout: Duration::from_secs(1800),
            managed_fields: true,
        }
    }
}

impl EmulatorOptions {
    /// Listens on this loopback port (0 = any free port).
    #[must_use]
    pub fn port(mut self, port: u16) -> Self {
        self.bind.set_port(port);
        self
    }

    /// Sets the history limit.
    #[must_use]
    pub fn history_limit(mut self, limit: usize) -> Self {
        self.history_limit = limit;
        self
    }

    /// Sets the per-watch buffer limit.
    #[must_use]
    pub fn watch_buffer(mut self, events: usize) -> Self {
        self.watch_buffer = events;
        self
    }

    /// Records (or not) every write's fields in `metadata.managedFields` (see the field).
    #[must_use]
    pub fn managed_fields(mut self, on: bool) -> Self {
        self.managed_fields = on;
        self
    }

    /// Sets the bookmark interval.
    #[must_use]
    pub fn bookmark_interval(mut self, every: Duration) -> Self {
        self.bookmark_interval = every;
        self
    }
}

/// The emulator.
#[derive(Debug)]
pub struct Emulator;

impl Emulator {
    /// Binds and starts serving in the current tokio runtime.
    pub async fn start(options: EmulatorOptions) -> Result<EmulatorHandle, Error> {
        if options.history_limit == 0 || options.watch_buffer == 0 {
            return Err(Error::Options(
                "history_limit and watch_buffer must be at least 1".into(),
            ));
        }
        if options.bookmark_interval.is_zero() {
            return Err(Error::Options("bookmark_interval must not be zero".into()));
        }
        let listener = tokio::net::TcpListener::bind(options.bind)
            .await
            .map_err(|source| Error::Bind {
                addr: options.bind,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| Error::Io {
            what: "reading the bound address".into(),
            source,
        })?;
        let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
        let shared = Arc::new(ops::Shared::new(
            store::Store::new(options.history_limit, options.watch_buffer),
            options.default_watch_timeout,
            options.managed_fields,
            shutdown_rx,
        ));
        let app = Arc::new(server::App {
            shared: shared.clone(),
            address: addr.to_string(),
        });
        let served = app.clone();
        let server = tokio::spawn(async move {
            if let Err(e) = server::serve(listener, served).await {
                tracing::error!(error = %e, "the API emulator stopped serving");
            }
        });
        let gc = tokio::spawn(background::gc_worker(shared.clone()));
        let bookmarks = tokio::spawn(background::bookmark_ticker(
            shared.clone(),
            options.bookmark_interval,
        ));
        tracing::info!(%addr, history_limit = options.history_limit, watch_buffer = options.watch_buffer, "Kubernetes API emulator serving");
        Ok(EmulatorHandle {
            addr,
            app,
            shared,
            shutdown_tx,
            tasks: vec![server, gc, bookmarks],
        })
    }
}

/// Store statistics, for benchmarks and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreStats {
    /// The current (global) resourceVersion.
    pub revision: u64,
    /// Objects stored, all resources together.
    pub objects: usize,
    /// Changes kept in the history.
    pub history: usize,
    /// Open watches.
    pub watchers: usize,
    /// Watches closed because they did not keep up.
    pub slow_watchers_closed: u64,
}

/// A running emulator. Dropping it stops serving; [`EmulatorHandle::shutdown`] also waits for that.
#[derive(Debug)]
pub struct EmulatorHandle {
    addr: SocketAddr,
    app: Arc<server::App>,
    shared: Arc<ops::Shared>,
    shutdown_tx: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for ops::Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

impl EmulatorHandle {
    /// The address served.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kube client for the emulator (default namespace `default`).
    pub fn client(&self) -> Result<kube::Client, Error> {
        let url = self.base_url();
        let uri = url.parse().map_err(|e: axum::http::uri::InvalidUri| {
            Error::Options(format!("base URL {url}: {e}"))
        })?;
        let config = kube::Config::new(uri);
        kube::Client::try_from(config).map_err(|e| Error::Client {
            url,
            source: Box::new(e),
        })
    }

    /// A kube client that calls the emulator within this process, without a socket: each request
    /// goes through the same handler as over HTTP (routing, admission, faults, counters, watches),
    /// only the TCP connection and HTTP/1 framing are left out. For simulated components that share
    /// the emulator's process (a benchmark's controllers spend much of their time on loopback TCP
    /// otherwise); whatever is under test should use [`EmulatorHandle::client`] or a kubeconfig.
    /// Requests go on being answered after [`EmulatorHandle::shutdown`], except watches, which end.
    pub fn in_process_client(&self) -> kube::Client {
        server::in_process_client(self.app.clone(), None)
    }

    /// [`EmulatorHandle::in_process_client`] whose requests carry `user_agent`, so the request
    /// counters and fault rules tell them apart. A value that is not a valid header is not sent.
    pub fn in_process_client_as(&self, user_agent: &str) -> kube::Client {
        server::in_process_client(
            self.app.clone(),
            axum::http::HeaderValue::from_str(user_agent).ok(),
        )
    }

    /// A kubeconfig (plain HTTP, no credentials) for kubectl and kube-rs.
    pub fn kubeconfig(&self) -> String {
        kubeconfig_for(&self.base_url())
    }

    /// Writes [`EmulatorHandle::kubeconfig`] to a file.
    pub fn write_kubeconfig(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        let path = path.as_ref();
        std::fs::write(path, self.kubeconfig()).map_err(|source| Error::Io {
            what: format!("writing the kubeconfig {}", path.display()),
            source,
        })
    }

    /// Requests served so far, by verb and resource.
    pub fn counters(&self) -> CounterSnapshot {
        self.shared.counters.snapshot()
    }

    /// Request counts of one client: those whose User-Agent has the product of `user_agent` (the part
    /// before `/`, so `my-operator/0.1.0` counts every my-operator version). The first 64
    /// clients seen are counted apart; later ones together under [`OTHER_AGENTS`].
    pub fn counters_of_agent(&self, user_agent: &str) -> CounterSnapshot {
        self.shared.counters.snapshot_of_agent(user_agent)
    }

    /// The fault rules of this emulator (a handle: clone it, set rules at run time, read the counts).
    pub fn faults(&self) -> Faults {
        self.shared.faults.clone()
    }

    /// The in-process admission hooks of this emulator (a handle: register defaulting and validation
    /// per kind, as a real cluster's webhooks do; see [`Admission::register`]).
    pub fn admission(&self) -> Admission {
        self.shared.admission.clone()
    }

    /// Sets every request counter back to zero.
    pub fn reset_counters(&self) {
        self.shared.counters.reset();
    }

    /// Store statistics.
    pub fn stats(&self) -> StoreStats {
        let store = self.shared.lock();
        StoreStats {
            revision: store.rev,
            objects: store.object_count(),
            history: store.history_len(),
            watchers: store.watcher_count(),
            slow_watchers_closed: store.slow_watchers_closed,
        }
    }

    /// Forgets the history of changes up to now, as etcd's compaction does: a watch or a continued
    /// list from an older resourceVersion then gets 410 Gone.
    pub fn compact(&self) {
        self.shared.lock().compact();
    }

    /// Stops serving (open watches end) and waits for the server to finish.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown_tx.send(true);
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
    }
}

impl Drop for EmulatorHandle {
    fn drop(&mut self) {
        let _ = self.shutdown_tx.send(true);
    }
}

/// A kubeconfig for an emulator at `server` (`http://host:port`).
pub fn kubeconfig_for(server: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: kube-emulator\n  cluster:\n    server: {server}\ncontexts:\n- name: kube-emulator\n  context:\n    cluster: kube-emulator\n    user: kube-emulator\n    namespace: default\ncurrent-context: kube-emulator\nusers:\n- name: kube-emulator\n  user: {{}}\npreferences: {{}}\n"
    )
}
