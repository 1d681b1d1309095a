//! The conversion webhook: HTTPS `POST /convert`, taking an `apiextensions.k8s.io/v1`
//! `ConversionReview` and answering it with each object converted by `capmvm_api::conversion`.
//!
//! The API server calls it (through the `capmvm-webhook-service` Service, with the CA cert-manager
//! injects into the CRDs) whenever an object is read or written at a version other than the one it is
//! stored at: v1alpha1 (the Go provider's) and v1alpha2. Every replica serves it, leader or not.
//!
//! The serving certificate is read from `--webhook-cert-dir` (`tls.crt`, `tls.key`) and read again
//! when the files change, so cert-manager's renewals need no restart.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use kube::core::conversion::{ConversionRequest, ConversionResponse, ConversionReview};
use kube::core::response::Status;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

/// Where CAPI providers (controller-runtime) read the webhook's certificate by default.
pub const DEFAULT_CERT_DIR: &str = "/tmp/k8s-webhook-server/serving-certs";
/// The certificate file in the cert dir.
pub const CERT_FILE: &str = "tls.crt";
/// The key file in the cert dir.
pub const KEY_FILE: &str = "tls.key";
/// The path the CRDs' conversion stanza names.
pub const CONVERT_PATH: &str = capmvm_api::webhook::CONVERT_PATH;
/// How often the certificate files are checked for a renewal.
pub const CERT_RECHECK: Duration = Duration::from_secs(10);
/// The largest `ConversionReview` accepted: a list of every MicrovmMachine arrives in one.
pub const MAX_REVIEW_BYTES: usize = 256 * 1024 * 1024;
/// How long a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the webhook cannot serve.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// The certificate or key file is missing or unreadable.
    #[error(
        "reading {path}: {source}; put the webhook's serving certificate there as {CERT_FILE} and {KEY_FILE} (the Deployment mounts cert-manager's Secret capmvm-webhook-service-cert), or pass --webhook-port=0 to run without the conversion webhook"
    )]
    Read {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The files do not hold a usable certificate and key.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The port could not be bound.
    #[error(
        "listening on port {port} for the conversion webhook: {source}; choose another --webhook-port"
    )]
    Bind {
        /// The port.
        port: u16,
        /// What failed.
        source: std::io::Error,
    },
}

/// The webhook's serving certificate, swapped when its files change.
#[derive(Debug)]
pub struct CertStore {
    dir: PathBuf,
    current: RwLock<Loaded>,
}

/// When the certificate and key files were last modified: a renewal changes them.
type Stamp = Option<(SystemTime, SystemTime)>;

#[derive(Debug)]
struct Loaded {
    key: Arc<CertifiedKey>,
    stamp: Stamp,
}

impl CertStore {
    /// Reads `tls.crt` and `tls.key` from `dir`.
    pub fn load(dir: &Path) -> Result<CertStore, WebhookError> {
        let (key, stamp) = read_pair(dir)?;
        Ok(CertStore {
            dir: dir.to_path_buf(),
            current: RwLock::new(Loaded { key, stamp }),
        })
    }

    /// Whether both files exist in `dir`.
    pub fn present_in(dir: &Path) -> bool {
        dir.join(CERT_FILE).is_file() && dir.join(KEY_FILE).is_file()
    }

    /// Reads the files again if they changed since the last read; keeps the current certificate
    /// (and says why) when the new files are unusable, as during a half-written renewal.
    pub fn refresh(&self) -> Result<bool, WebhookError> {
        let stamp = stamps(&self.dir);
        if stamp.is_some() && stamp == self.read().stamp {
            return Ok(false);
        }
        let (key, stamp) = read_pair(&self.dir)?;
        let mut current = self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *current = Loaded { key, stamp };
        Ok(true)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Loaded> {
        // A poisoned lock only means a panic mid-swap elsewhere; the value is whole either way.
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.read().key.clone())
    }
}

fn stamps(dir: &Path) -> Stamp {
    let modified = |f: &str| {
        std::fs::metadata(dir.join(f))
            .and_then(|m| m.modified())
            .ok()
    };
    Some((modified(CERT_FILE)?, modified(KEY_FILE)?))
}

fn read_pair(dir: &Path) -> Result<(Arc<CertifiedKey>, Stamp), WebhookError> {
    // The stamps first: a renewal landing between the two reads is picked up on the next check.
    let stamp = stamps(dir);
    let read = |file: &str| {
        let path = dir.join(file);
        std::fs::read(&path).map_err(|source| WebhookError::Read { path, source })
    };
    let (cert_pem, key_pem) = (read(CERT_FILE)?, read(KEY_FILE)?);
    let invalid = |file: &str, message: String| WebhookError::Invalid {
        path: dir.join(file),
        message,
    };
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(CERT_FILE, format!("not a PEM certificate chain: {e}")))?;
    if chain.is_empty() {
        return Err(invalid(CERT_FILE, "holds no PEM certificate".to_string()));
    }
    // Never the key's bytes in a message: only that it is not one.
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|_| invalid(KEY_FILE, "holds no PEM private key".to_string()))?;
    let provider = rustls::crypto::ring::default_provider();
    let certified = CertifiedKey::from_der(chain, key, &provider).map_err(|e| {
        invalid(
            KEY_FILE,
            format!("is not the key of the certificate in {CERT_FILE}: {e}"),
        )
    })?;
    Ok((Arc::new(certified), stamp))
}

/// Answers one `ConversionReview` body: 400 when it is not one, else a review whose response holds
/// every object converted in order, or a failure naming each object that could not be.
pub fn review(body: &[u8]) -> (StatusCode, Vec<u8>) {
    let review: ConversionReview = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("the body is not an apiextensions.k8s.io/v1 ConversionReview: {e}")
                    .into_bytes(),
            );
        }
    };
    let response = match ConversionRequest::from_review(review) {
        Ok(request) => convert_request(request),
        Err(_) => ConversionResponse::invalid(Status::failure(
            "the ConversionReview has no request",
            "BadRequest",
        )),
    };
    match serde_json::to_vec(&response.into_review()) {
        Ok(bytes) => (StatusCode::OK, bytes),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("serializing the ConversionReview: {e}").into_bytes(),
        ),
    }
}

fn convert_request(request: ConversionRequest) -> ConversionResponse {
    let desired = request.desired_api_version.clone();
    let objects = request.objects.clone();
    let uid = request.uid.clone();
    let count = objects.len();
    let mut converted = Vec::with_capacity(count);
    let mut errors = Vec::new();
    for (i, object) in objects.into_iter().enumerate() {
        match capmvm_api::conversion::convert_object(object, &desired) {
            Ok(o) => converted.push(o),
            Err(e) => errors.push(format!("object {i}: {e}")),
        }
    }
    let response = ConversionResponse::for_request(request);
    if errors.is_empty() {
        debug!(%uid, objects = count, to = %desired, "converted");
        response.success(converted)
    } else {
        let message = errors.join("; ");
        warn!(%uid, objects = count, to = %desired, failed = errors.len(), error = %message, "conversion refused");
        response.failure(Status::failure(&message, "ConversionFailed"))
    }
}

/// The webhook's routes: `POST /convert`.
pub fn router() -> Router {
    Router::new()
        .route(
            CONVERT_PATH,
            post(|body: Bytes| async move {
                let (status, bytes) = review(&body);
                let content_type = if status == StatusCode::OK {
                    "application/json"
                } else {
                    "text/plain; charset=utf-8"
                };
                let response: Response = (
                    status,
                    [(axum::http::header::CONTENT_TYPE, content_type)],
                    bytes,
                )
                    .into_response();
                response
            }),
        )
        .layer(DefaultBodyLimit::max(MAX_REVIEW_BYTES))
}

/// A bound webhook server, ready to [`Webhook::serve`].
pub struct Webhook {
    listener: TcpListener,
    certs: Arc<CertStore>,
}

impl Webhook {
    /// What `--webhook-port` and `--webhook-cert-dir` ask for: `None` when the port is 0, or when
    /// no certificate is in the default directory (out of a cluster, nothing calls it anyway).
    /// Binds the port, so a clash is reported at start.
    pub async fn from_flags(
        port: u16,
        cert_dir: Option<&Path>,
    ) -> Result<Option<Webhook>, WebhookError> {
        if port == 0 {
            info!("conversion webhook disabled (--webhook-port=0): v1alpha1 is not served");
            return Ok(None);
        }
        let dir = match cert_dir {
            Some(dir) => dir.to_path_buf(),
            None => {
                let dir = PathBuf::from(DEFAULT_CERT_DIR);
                if !CertStore::present_in(&dir) {
                    warn!(
                        dir = %dir.display(),
                        "conversion webhook not served: no {CERT_FILE} and {KEY_FILE} in the default --webhook-cert-dir; the API server cannot serve v1alpha1 through this process"
                    );
                    return Ok(None);
                }
                dir
            }
        };
        let certs = Arc::new(CertStore::load(&dir)?);
        let listener = bind(port).await?;
        Ok(Some(Webhook { listener, certs }))
    }

    /// A webhook on an already bound listener with a loaded certificate (tests).
    pub fn new(listener: TcpListener, certs: Arc<CertStore>) -> Webhook {
        Webhook { listener, certs }
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until dropped: each connection's TLS handshake and requests in a task of its own;
    /// the certificate files are checked for renewals every [`CERT_RECHECK`].
    pub async fn serve(self) {
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions();
        let mut config = match config {
            Ok(c) => c
                .with_no_client_auth()
                .with_cert_resolver(self.certs.clone()),
            Err(e) => {
                warn!(error = %e, "conversion webhook: no TLS configuration; not serving");
                return;
            }
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let service = TowerToHyperService::new(router());
        let refresh = {
            let certs = self.certs.clone();
            async move {
                let mut tick = tokio::time::interval(CERT_RECHECK);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    match certs.refresh() {
                        Ok(true) => info!("conversion webhook: serving certificate renewed"),
                        Ok(false) => {}
                        Err(e) => {
                            warn!(error = %e, "conversion webhook: keeping the current certificate")
                        }
                    }
                }
            }
        };
        if let Ok(addr) = self.listener.local_addr() {
            info!(%addr, path = CONVERT_PATH, "conversion webhook serving");
        }
        let accept = async {
            loop {
                let (stream, peer) = match self.listener.accept().await {
                    Ok(s) => s,
                    Err(e) => {
                        warn!(error = %e, "conversion webhook: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let acceptor = acceptor.clone();
                let service = service.clone();
                tokio::spawn(async move {
                    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream))
                        .await
                    {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(e)) => {
                            debug!(%peer, error = %e, "conversion webhook: TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            debug!(%peer, "conversion webhook: TLS handshake timed out");
                            return;
                        }
                    };
                    let served = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                    if let Err(e) = served {
                        debug!(%peer, error = %e, "conversion webhook: connection ended");
                    }
                });
            }
        };
        tokio::join!(accept, refresh);
    }
}

/// Binds `port` on every address, IPv6 and IPv4 where the host has both.
async fn bind(port: u16) -> Result<TcpListener, WebhookError> {
    match TcpListener::bind((Ipv6Addr::UNSPECIFIED, port)).await {
        Ok(l) => Ok(l),
        Err(_) => TcpListener::bind((Ipv4Addr::UNSPECIFIED, port))
            .await
            .map_err(|source| WebhookError::Bind { port, source }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::{Value, json};

    fn review_of(objects: Vec<Value>, desired: &str) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "ConversionReview",
            "request": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "desiredAPIVersion": desired, "objects": objects},
        }))
        .unwrap()
    }

    fn machine(version: &str, name: &str) -> Value {
        json!({
            "apiVersion": format!("infrastructure.cluster.x-k8s.io/{version}"),
            "kind": "MicrovmMachine",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"vcpu": 2, "memoryMb": 2048, "rootVolume": {"id": "root", "image": "os"},
                     "kernel": {"image": "k", "filename": "boot/vmlinux"},
                     "networkInterfaces": [{"guestDeviceName": "eth1", "type": "tap"}]},
        })
    }

    #[test]
    fn every_object_is_converted_in_order_and_the_uid_echoed() {
        let (status, body) = review(&review_of(
            vec![machine("v1alpha1", "a"), machine("v1alpha1", "b")],
            "infrastructure.cluster.x-k8s.io/v1alpha2",
        ));
        assert_eq!(status, StatusCode::OK);
        let answer: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(answer["kind"], "ConversionReview");
        assert_eq!(answer["apiVersion"], "apiextensions.k8s.io/v1");
        let response = &answer["response"];
        assert_eq!(response["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(response["result"]["status"], "Success");
        let objects = response["convertedObjects"].as_array().unwrap();
        assert_eq!(objects.len(), 2);
        assert_eq!(objects[0]["metadata"]["name"], "a");
        assert_eq!(objects[1]["metadata"]["name"], "b");
        assert_eq!(
            objects[0]["apiVersion"],
            "infrastructure.cluster.x-k8s.io/v1alpha2"
        );
    }

    #[test]
    fn a_bad_object_fails_the_review_naming_it_and_its_field() {
        let mut bad = machine("v1alpha1", "broken");
        bad["spec"]["networkInterfaces"][0]["type"] = json!("bridge");
        let (status, body) = review(&review_of(
            vec![machine("v1alpha1", "fine"), bad],
            "infrastructure.cluster.x-k8s.io/v1alpha2",
        ));
        assert_eq!(status, StatusCode::OK);
        let answer: Value = serde_json::from_slice(&body).unwrap();
        let result = &answer["response"]["result"];
        assert_eq!(result["status"], "Failure");
        let message = result["message"].as_str().unwrap();
        assert!(message.contains("object 1"), "{message}");
        assert!(
            message.contains("MicrovmMachine default/broken"),
            "{message}"
        );
        assert!(
            message.contains("spec.networkInterfaces[0].type"),
            "{message}"
        );
        assert_eq!(
            answer["response"]["uid"],
            "705ab4f5-6393-11e8-b7cc-42010a800002"
        );
    }

    #[test]
    fn garbage_is_a_400_never_a_panic() {
        for body in [&b"{"[..], b"null", b"[]", b"{\"kind\": 5}"] {
            let (status, text) = review(body);
            assert_eq!(status, StatusCode::BAD_REQUEST, "{body:?}");
            assert!(
                String::from_utf8_lossy(&text).contains("ConversionReview"),
                "{body:?}"
            );
        }
        // A review without a request is answered (with a failure), as the API server expects.
        let (status, body) =
            review(br#"{"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview"}"#);
        assert_eq!(status, StatusCode::OK);
        let answer: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(answer["response"]["result"]["status"], "Failure");
    }
}
