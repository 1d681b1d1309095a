//! The flintlock client: a pool with one gRPC channel per host configuration, and cheap per-host
//! handles that make the calls.
//!
//! Each channel dials through our own connector: TCP (optionally through an HTTP CONNECT proxy),
//! then TLS 1.3 with rustls/ring when TLS material is given. Doing TLS ourselves (instead of tonic's
//! TLS feature) fixes the protocol version and the server name, and keeps the crate independent of
//! which tonic TLS features other crates in a build enable. The channel therefore always uses an
//! `http://` URI; the `:scheme` pseudo-header reads `http` even over TLS, which gRPC servers
//! (flintlock's grpc-go included) ignore.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures::Stream;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::transport::{Channel, Endpoint};

use crate::error::{Error, ErrorKind};
use crate::proto::services as svc;
use crate::proto::services::micro_vm_client::MicroVmClient;
use crate::secret::{SecretBytes, SecretString};
use crate::types::{Microvm, MicrovmSpec, microvm_from_response};

mod connect;
use connect::{Authority, Connector, parse_proxy, tls_connector};

/// Everything needed to reach one flintlock host. Two equal configurations share one channel; any
/// difference (a rotated token or certificate included) gives a new one.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct HostConfig {
    /// `host:port` of flintlockd's gRPC listener; IPv6 literals as `[addr]:port`.
    pub endpoint: String,
    /// TLS material; `None` means plaintext (flintlockd `--insecure`).
    pub tls: Option<TlsMaterial>,
    /// The `--basic-auth-token` of the host. An empty token is treated as no token.
    pub basic_auth_token: Option<SecretString>,
    /// An HTTP CONNECT proxy to tunnel through: `host:port` or `http://host:port`.
    pub proxy: Option<String>,
}

impl HostConfig {
    /// A plaintext, unauthenticated, direct configuration for `endpoint`.
    pub fn new(endpoint: impl Into<String>) -> Self {
        HostConfig {
            endpoint: endpoint.into(),
            tls: None,
            basic_auth_token: None,
            proxy: None,
        }
    }
}

/// PEM-encoded TLS material, as found in a Secret (`ca.crt`, `tls.crt`, `tls.key`).
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct TlsMaterial {
    /// The CA bundle that signed the host's certificate (`ca.crt`). Required when TLS is used:
    /// flintlock hosts carry private CAs, and no system roots are consulted.
    pub ca_pem: Option<Vec<u8>>,
    /// The client certificate chain for mTLS (`tls.crt`).
    pub client_cert_pem: Option<Vec<u8>>,
    /// The client certificate's private key (`tls.key`).
    pub client_key_pem: Option<SecretBytes>,
}

impl fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsMaterial")
            .field(
                "ca_pem",
                &self
                    .ca_pem
                    .as_ref()
                    .map(|pem| format!("<{} bytes>", pem.len())),
            )
            .field(
                "client_cert_pem",
                &self
                    .client_cert_pem
                    .as_ref()
                    .map(|pem| format!("<{} bytes>", pem.len())),
            )
            .field("client_key_pem", &self.client_key_pem)
            .finish()
    }
}

/// The flintlock RPCs, for observers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// `CreateMicroVM`.
    Create,
    /// `GetMicroVM`.
    Get,
    /// `ListMicroVMs`.
    List,
    /// `ListMicroVMsStream`.
    ListStream,
    /// `DeleteMicroVM`.
    Delete,
}

impl Method {
    /// The RPC's name in the flintlock service.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Create => "CreateMicroVM",
            Method::Get => "GetMicroVM",
            Method::List => "ListMicroVMs",
            Method::ListStream => "ListMicroVMsStream",
            Method::Delete => "DeleteMicroVM",
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Told about every call a pool's clients make (for metrics), without wrapping the calls.
pub trait CallObserver: Send + Sync {
    /// One call to `endpoint` finished: `outcome` is `Ok` or the error's kind. For
    /// [`Method::ListStream`] this is the opening of the stream.
    fn observe(
        &self,
        endpoint: &str,
        method: Method,
        outcome: Result<(), ErrorKind>,
        elapsed: Duration,
    );
}

/// Pool settings.
#[derive(Clone)]
pub struct PoolOptions {
    /// Limit for TCP connect + proxy tunnel + TLS handshake. Default 5 s.
    pub connect_timeout: Duration,
    /// Default deadline of each call (sent to the host as `grpc-timeout` and enforced locally).
    /// Default 10 s.
    pub call_timeout: Duration,
    /// A channel not used for this long is dropped from the pool (its connection closes once no
    /// handle uses it), by a background sweep: no further use of the pool is needed. Default
    /// 5 min.
    pub idle_timeout: Duration,
    /// Largest response accepted. Default 64 MiB: a `list` of a full host carries every microVM's
    /// cloud-init payload (1000 microVMs with 5 KiB of metadata are 5 MiB, over gRPC's usual 4 MiB).
    pub max_response_size: usize,
    /// Told about every call.
    pub observer: Option<Arc<dyn CallObserver>>,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            connect_timeout: Duration::from_secs(5),
            call_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            max_response_size: 64 * 1024 * 1024,
            observer: None,
        }
    }
}

impl fmt::Debug for PoolOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolOptions")
            .field("connect_timeout", &self.connect_timeout)
            .field("call_timeout", &self.call_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("max_response_size", &self.max_response_size)
            .field("observer", &self.observer.is_some())
            .finish()
    }
}

/// One shared gRPC channel per [`HostConfig`]. Cheap to clone; clones share the channels.
#[derive(Clone)]
pub struct ClientPool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    options: PoolOptions,
    epoch: Instant,
    channels: Mutex<Channels>,
}

struct Channels {
    by_host: HashMap<HostConfig, PooledChannel>,
    /// Held while a sweeper task runs; the task holds the receiver. Dropping the pool drops the
    /// sender, which ends the task at once instead of at its next wake-up. A task that ended any
    /// other way (its runtime shut down) shows as a closed sender, so a new one is started.
    sweeper: Option<tokio::sync::oneshot::Sender<()>>,
}

/// The shortest pause between two sweeps: a tiny idle timeout must not turn the sweeper into a
/// busy loop.
const MIN_SWEEP_INTERVAL: Duration = Duration::from_millis(100);

/// The longest `grpc-timeout` tonic can encode (8 digits of hours); tonic panics beyond it, so a
/// longer call timeout is sent as this (about 11,000 years: no deadline in practice).
const MAX_GRPC_TIMEOUT: Duration = Duration::from_secs(99_999_999 * 3600);

#[derive(Clone)]
struct PooledChannel {
    channel: Channel,
    auth: Option<AsciiMetadataValue>,
    /// Milliseconds since the pool's epoch of the last call (or hand-out).
    last_used: Arc<AtomicU64>,
}

impl fmt::Debug for ClientPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientPool")
            .field("options", &self.inner.options)
            .field("channels", &self.channel_count())
            .finish()
    }
}

impl ClientPool {
    /// An empty pool.
    pub fn new(options: PoolOptions) -> Self {
        ClientPool {
            inner: Arc::new(PoolInner {
                options,
                epoch: Instant::now(),
                channels: Mutex::new(Channels {
                    by_host: HashMap::new(),
                    sweeper: None,
                }),
            }),
        }
    }

    /// A client for `host` on the pool's channel for that configuration, created on first use.
    /// Nothing is dialled here: the channel connects on its first call and reconnects after
    /// failures. Fails with [`ErrorKind::InvalidConfig`] for an unusable configuration, or when
    /// called outside a Tokio runtime.
    ///
    /// While the pool holds channels, a background task on the current runtime drops those idle
    /// for longer than [`PoolOptions::idle_timeout`]; it ends when the pool is empty or dropped.
    pub fn client(&self, host: &HostConfig) -> Result<FlintlockClient, Error> {
        let now = self.now_millis();
        let pooled = {
            let mut channels = self.lock_channels();
            self.evict_idle_locked(&mut channels.by_host, now);
            let pooled = match channels.by_host.get(host) {
                Some(pooled) => pooled.clone(),
                None => {
                    let pooled = self.open(host, now)?;
                    channels.by_host.insert(host.clone(), pooled.clone());
                    tracing::debug!(endpoint = %host.endpoint, channels = channels.by_host.len(), "opened flintlock channel");
                    pooled
                }
            };
            self.ensure_sweeper_locked(&mut channels);
            pooled
        };
        pooled.last_used.store(now, Ordering::Relaxed);
        let options = &self.inner.options;
        Ok(FlintlockClient {
            endpoint: Arc::from(host.endpoint.as_str()),
            grpc: MicroVmClient::new(pooled.channel)
                .max_decoding_message_size(options.max_response_size),
            auth: pooled.auth,
            call_timeout: options.call_timeout,
            observer: options.observer.clone(),
            pool_epoch: self.inner.epoch,
            last_used: pooled.last_used,
        })
    }

    /// Drops channels idle for longer than the idle timeout now. Returns how many were dropped.
    /// Not needed for eviction (the pool's background sweep and every [`client`](Self::client)
    /// call do it); useful to release idle connections at a moment of the caller's choosing.
    pub fn evict_idle(&self) -> usize {
        let now = self.now_millis();
        let mut channels = self.lock_channels();
        self.evict_idle_locked(&mut channels.by_host, now)
    }

    /// How many channels the pool holds.
    pub fn channel_count(&self) -> usize {
        self.lock_channels().by_host.len()
    }

    fn lock_channels(&self) -> std::sync::MutexGuard<'_, Channels> {
        // A panic while holding the lock cannot leave the map inconsistent (single inserts and
        // removals), so a poisoned lock is still usable.
        self.inner
            .channels
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn now_millis(&self) -> u64 {
        u64::try_from(self.inner.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn idle_millis(&self) -> u64 {
        u64::try_from(self.inner.options.idle_timeout.as_millis()).unwrap_or(u64::MAX)
    }

    /// Starts the sweeper task if channels need one and none runs. Without a runtime (only
    /// possible if `open` ever stops requiring one) eviction still happens on use.
    fn ensure_sweeper_locked(&self, channels: &mut Channels) {
        let running = channels
            .sweeper
            .as_ref()
            .is_some_and(|sweeper| !sweeper.is_closed());
        if running || channels.by_host.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (stop, stopped) = tokio::sync::oneshot::channel();
        runtime.spawn(sweep(Arc::downgrade(&self.inner), stopped));
        channels.sweeper = Some(stop);
    }

    /// How long until the first channel can be idle for too long (`None`: no channel).
    fn next_expiry(
        &self,
        channels: &HashMap<HostConfig, PooledChannel>,
        now: u64,
    ) -> Option<Duration> {
        let idle = self.idle_millis();
        let oldest = channels
            .values()
            .map(|pooled| pooled.last_used.load(Ordering::Relaxed))
            .min()?;
        // Evicted once strictly more than `idle` has passed, hence the + 1.
        let expiry = oldest.saturating_add(idle).saturating_add(1);
        Some(Duration::from_millis(expiry.saturating_sub(now)).max(MIN_SWEEP_INTERVAL))
    }

    fn evict_idle_locked(
        &self,
        channels: &mut HashMap<HostConfig, PooledChannel>,
        now: u64,
    ) -> usize {
        let idle = self.idle_millis();
        let before = channels.len();
        channels.retain(|host, pooled| {
            let keep = now.saturating_sub(pooled.last_used.load(Ordering::Relaxed)) <= idle;
            if !keep {
                tracing::debug!(endpoint = %host.endpoint, "dropping idle flintlock channel");
            }
            keep
        });
        before - channels.len()
    }

    fn open(&self, host: &HostConfig, now: u64) -> Result<PooledChannel, Error> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::invalid_config(
                "flintlock clients must be created inside a Tokio runtime",
            ));
        }
        let target = Authority::parse(&host.endpoint).map_err(|reason| {
            Error::invalid_config(format!("endpoint {:?}: {reason}", host.endpoint))
        })?;
        let proxy = host
            .proxy
            .as_deref()
            .map(parse_proxy)
            .transpose()
            .map_err(|reason| Error::invalid_config(format!("proxy: {reason}")))?;
        let tls = host
            .tls
            .as_ref()
            .map(|tls| tls_connector(tls, &target))
            .transpose()?;
        let auth = match &host.basic_auth_token {
            Some(token) if !token.is_empty() => Some(basic_auth_header(token)?),
            _ => None,
        };
        let connector = Connector {
            target: Arc::from(target.authority.as_str()),
            proxy: proxy.map(|proxy| Arc::from(proxy.authority.as_str())),
            tls,
            connect_timeout: self.inner.options.connect_timeout,
        };
        let endpoint = Endpoint::from_shared(format!("http://{}", target.authority))
            .map_err(|err| Error::invalid_config(format!("endpoint {:?}: {err}", host.endpoint)))?;
        let channel =
            endpoint.connect_with_connector_lazy(tower::service_fn(move |_: http::Uri| {
                let connector = connector.clone();
                async move { connector.connect().await }
            }));
        Ok(PooledChannel {
            channel,
            auth,
            last_used: Arc::new(AtomicU64::new(now)),
        })
    }
}

/// The pool's sweeper: drops idle channels when they expire, without callers. It holds only a
/// `Weak` so it never keeps a dropped pool alive; it ends when the pool is dropped (`stop`'s sender
/// goes with it) or holds no channel (the next `client()` starts a new one).
async fn sweep(pool: Weak<PoolInner>, mut stop: tokio::sync::oneshot::Receiver<()>) {
    loop {
        let wait = {
            let Some(inner) = pool.upgrade() else {
                return;
            };
            let pool = ClientPool { inner };
            let now = pool.now_millis();
            let mut channels = pool.lock_channels();
            pool.evict_idle_locked(&mut channels.by_host, now);
            match pool.next_expiry(&channels.by_host, now) {
                Some(wait) => wait,
                None => {
                    // Decided under the lock, so a `client()` that adds a channel afterwards sees
                    // no sweeper and starts one.
                    channels.sweeper = None;
                    return;
                }
            }
        };
        tokio::select! {
            _ = &mut stop => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// `authorization: Basic base64(token)`: flintlock compares the text after the scheme with
/// base64 of its configured token (the raw token, not `user:password`).
fn basic_auth_header(token: &SecretString) -> Result<AsciiMetadataValue, Error> {
    let encoded = base64::engine::general_purpose::STANDARD.encode(token.expose().as_bytes());
    let mut value: AsciiMetadataValue = MetadataValue::try_from(format!("Basic {encoded}"))
        .map_err(|_| Error::invalid_config("the basic-auth token cannot be sent as a header"))?;
    // Keeps the token out of HPACK's dynamic table and out of `Debug` output.
    value.set_sensitive(true);
    Ok(value)
}

/// A handle for calls to one flintlock host over the pool's shared channel. Cheap to clone.
#[derive(Clone)]
pub struct FlintlockClient {
    endpoint: Arc<str>,
    grpc: MicroVmClient<Channel>,
    auth: Option<AsciiMetadataValue>,
    call_timeout: Duration,
    observer: Option<Arc<dyn CallObserver>>,
    pool_epoch: Instant,
    last_used: Arc<AtomicU64>,
}

impl fmt::Debug for FlintlockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlintlockClient")
            .field("endpoint", &self.endpoint)
            .field("basic_auth", &self.auth.is_some())
            .field("call_timeout", &self.call_timeout)
            .finish()
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = T> + Send>>;

impl FlintlockClient {
    /// The host's `host:port`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The same handle with another per-call deadline.
    pub fn with_call_timeout(&self, call_timeout: Duration) -> FlintlockClient {
        FlintlockClient {
            call_timeout,
            ..self.clone()
        }
    }

    /// `CreateMicroVM`: the host stores the spec and answers at once with the record (version 1,
    /// PENDING); creation goes on asynchronously. Creating the same name twice makes two microVMs.
    pub async fn create(&self, spec: MicrovmSpec) -> Result<Microvm, Error> {
        let request = svc::CreateMicroVmRequest {
            microvm: Some(crate::proto::types::MicroVmSpec::from(&spec)),
            metadata: Default::default(),
        };
        let response = self
            .unary(Method::Create, request, |mut grpc, request| async move {
                grpc.create_micro_vm(request).await
            })
            .await?;
        microvm_from_response(response.microvm)
    }

    /// `GetMicroVM` by uid. An unknown uid is [`ErrorKind::NotFound`].
    pub async fn get(&self, uid: &str) -> Result<Microvm, Error> {
        let request = svc::GetMicroVmRequest {
            uid: uid.to_owned(),
        };
        let response = self
            .unary(Method::Get, request, |mut grpc, request| async move {
                grpc.get_micro_vm(request).await
            })
            .await?;
        microvm_from_response(response.microvm)
    }

    /// `ListMicroVMs` in `namespace` (`""` = every namespace), optionally only those named `name`
    /// (several microVMs may share a name).
    pub async fn list(&self, namespace: &str, name: Option<&str>) -> Result<Vec<Microvm>, Error> {
        let request = svc::ListMicroVMsRequest {
            namespace: namespace.to_owned(),
            name: name.map(str::to_owned),
        };
        let response = self
            .unary(Method::List, request, |mut grpc, request| async move {
                grpc.list_micro_v_ms(request).await
            })
            .await?;
        response
            .microvm
            .into_iter()
            .map(Microvm::try_from)
            .collect()
    }

    /// `ListMicroVMsStream`: one item per microVM in `namespace` (required by flintlock), then the
    /// end. A one-shot snapshot, not a watch. The call's deadline covers the whole stream.
    pub async fn list_stream(
        &self,
        namespace: &str,
    ) -> Result<impl Stream<Item = Result<Microvm, Error>> + Send + 'static, Error> {
        let request = svc::ListMicroVMsRequest {
            namespace: namespace.to_owned(),
            name: None,
        };
        let started = Instant::now();
        // A call timeout too long to add to the clock (`Duration::MAX`, ...) is no deadline.
        let deadline = tokio::time::Instant::now().checked_add(self.call_timeout);
        let streaming = self
            .unary(
                Method::ListStream,
                request,
                |mut grpc, request| async move { grpc.list_micro_v_ms_stream(request).await },
            )
            .await?;
        let call_timeout = self.call_timeout;
        let stream: BoxStream<Result<Microvm, Error>> = Box::pin(futures::stream::unfold(
            Some(streaming),
            move |state| async move {
                let mut streaming = state?;
                let next = streaming.message();
                let next = match deadline {
                    Some(deadline) => tokio::time::timeout_at(deadline, next).await,
                    None => Ok(next.await),
                };
                let item = match next {
                    Ok(Ok(Some(message))) => microvm_from_response(message.microvm),
                    Ok(Ok(None)) => return None,
                    Ok(Err(status)) => Err(Error::from(status)),
                    Err(_) => Err(Error::deadline("ListMicroVMsStream", call_timeout)),
                };
                // The stream ends after the first error.
                let next = if item.is_ok() { Some(streaming) } else { None };
                Some((item, next))
            },
        ));
        tracing::trace!(endpoint = %self.endpoint, elapsed = ?started.elapsed(), "stream opened");
        Ok(stream)
    }

    /// `DeleteMicroVM` by uid: the host marks it DELETING and answers; removal goes on
    /// asynchronously. An unknown uid is [`ErrorKind::NotFound`] (flintlock's delete is not
    /// idempotent).
    pub async fn delete(&self, uid: &str) -> Result<(), Error> {
        let request = svc::DeleteMicroVmRequest {
            uid: uid.to_owned(),
        };
        self.unary(Method::Delete, request, |mut grpc, request| async move {
            grpc.delete_micro_vm(request).await
        })
        .await?;
        Ok(())
    }

    /// Runs one call with the deadline and credentials, then tells the observer.
    async fn unary<Req, Resp, Fut>(
        &self,
        method: Method,
        message: Req,
        call: impl FnOnce(MicroVmClient<Channel>, tonic::Request<Req>) -> Fut,
    ) -> Result<Resp, Error>
    where
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        let started = Instant::now();
        self.touch();
        let mut request = tonic::Request::new(message);
        request.set_timeout(self.call_timeout.min(MAX_GRPC_TIMEOUT));
        if let Some(auth) = &self.auth {
            request.metadata_mut().insert("authorization", auth.clone());
        }
        // `tokio::time::timeout` turns a deadline past the clock's range into "never".
        let result =
            match tokio::time::timeout(self.call_timeout, call(self.grpc.clone(), request)).await {
                Ok(Ok(response)) => Ok(response.into_inner()),
                Ok(Err(status)) => Err(Error::from(status)),
                Err(_) => Err(Error::deadline(method.as_str(), self.call_timeout)),
            };
        let elapsed = started.elapsed();
        match &result {
            Ok(_) => {
                tracing::debug!(endpoint = %self.endpoint, method = method.as_str(), ?elapsed, "flintlock call")
            }
            Err(err) => tracing::debug!(
                endpoint = %self.endpoint,
                method = method.as_str(),
                ?elapsed,
                kind = err.kind().as_str(),
                error = %err.message(),
                "flintlock call failed"
            ),
        }
        if let Some(observer) = &self.observer {
            observer.observe(
                &self.endpoint,
                method,
                result.as_ref().map(|_| ()).map_err(Error::kind),
                elapsed,
            );
        }
        result
    }

    fn touch(&self) {
        let now = u64::try_from(self.pool_epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_used.store(now, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_auth_is_base64_of_the_raw_token_and_sensitive() {
        let value = basic_auth_header(&SecretString::new("s3cret")).unwrap();
        assert!(value.is_sensitive());
        assert_eq!(value.to_str().unwrap(), "Basic czNjcmV0");
        assert!(!format!("{value:?}").contains("czNjcmV0"));
    }

    #[test]
    fn host_config_debug_hides_secrets() {
        let host = HostConfig {
            endpoint: "h:1".into(),
            tls: Some(TlsMaterial {
                ca_pem: Some(b"ca".to_vec()),
                client_cert_pem: Some(b"cert".to_vec()),
                client_key_pem: Some(SecretBytes::new(b"PRIVATE-KEY-BYTES".to_vec())),
            }),
            basic_auth_token: Some(SecretString::new("tok3n")),
            proxy: None,
        };
        let text = format!("{host:?}");
        assert!(
            !text.contains("tok3n") && !text.contains("PRIVATE-KEY-BYTES"),
            "{text}"
        );
    }

    #[test]
    fn client_outside_a_runtime_is_an_error_not_a_panic() {
        let pool = ClientPool::new(PoolOptions::default());
        let err = pool.client(&HostConfig::new("127.0.0.1:1")).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    }

    #[tokio::test]
    async fn one_channel_per_configuration() {
        let pool = ClientPool::new(PoolOptions::default());
        let host = HostConfig::new("127.0.0.1:1");
        pool.client(&host).unwrap();
        pool.client(&host).unwrap();
        assert_eq!(pool.channel_count(), 1);
        let rotated = HostConfig {
            basic_auth_token: Some(SecretString::new("new")),
            ..host.clone()
        };
        pool.client(&rotated).unwrap();
        assert_eq!(pool.channel_count(), 2);
    }

    /// Polls `done` (yielding to the runtime) until it holds; false if it never did in `within`.
    async fn eventually(within: Duration, mut done: impl FnMut() -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while tokio::time::Instant::now() < deadline {
            if done() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        done()
    }

    #[tokio::test]
    async fn idle_channels_are_dropped_without_further_use_of_the_pool() {
        let pool = ClientPool::new(PoolOptions {
            idle_timeout: Duration::from_millis(20),
            ..PoolOptions::default()
        });
        pool.client(&HostConfig::new("127.0.0.1:1")).unwrap();
        pool.client(&HostConfig::new("127.0.0.1:2")).unwrap();
        // Only looking: `channel_count` evicts nothing itself.
        assert!(
            eventually(Duration::from_secs(30), || pool.channel_count() == 0).await,
            "{} idle channels still pooled",
            pool.channel_count()
        );

        // The sweeper ended with the last channel; a new channel gets a new one.
        pool.client(&HostConfig::new("127.0.0.1:3")).unwrap();
        assert!(eventually(Duration::from_secs(30), || pool.channel_count() == 0).await);
        assert_eq!(pool.evict_idle(), 0, "nothing left to evict by hand");
    }

    #[tokio::test]
    async fn channels_within_the_idle_timeout_are_kept() {
        let pool = ClientPool::new(PoolOptions::default());
        let client = pool.client(&HostConfig::new("127.0.0.1:1")).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(pool.evict_idle(), 0, "well within the 5 min idle timeout");
        assert_eq!(pool.channel_count(), 1);
        drop(client);
    }

    #[tokio::test]
    async fn dropping_the_pool_ends_its_sweeper_at_once() {
        let metrics = tokio::runtime::Handle::current().metrics();
        let before = metrics.num_alive_tasks();
        // A 5 min idle timeout: a sweeper that only noticed the dropped pool at its next wake-up
        // would outlive this test by minutes.
        let pool = ClientPool::new(PoolOptions::default());
        let client = pool.client(&HostConfig::new("127.0.0.1:1")).unwrap();
        assert!(metrics.num_alive_tasks() > before, "a sweeper runs");
        // Lets the sweeper make its first pass and go to sleep (this test's runtime has one thread).
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(client);
        drop(pool);
        assert!(
            eventually(Duration::from_secs(30), || metrics.num_alive_tasks()
                == before)
            .await,
            "{} tasks left behind",
            metrics.num_alive_tasks() - before
        );
    }

    #[tokio::test]
    async fn bad_configurations_are_refused_up_front() {
        let pool = ClientPool::new(PoolOptions::default());
        let cases = [
            HostConfig::new("no-port"),
            HostConfig {
                proxy: Some("socks5://p:1".into()),
                ..HostConfig::new("h:1")
            },
            HostConfig {
                tls: Some(TlsMaterial::default()),
                ..HostConfig::new("h:1")
            },
            HostConfig {
                tls: Some(TlsMaterial {
                    ca_pem: Some(b"not pem".to_vec()),
                    ..TlsMaterial::default()
                }),
                ..HostConfig::new("h:1")
            },
        ];
        for host in cases {
            let err = pool.client(&host).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{host:?}: {err}");
        }
    }
}
