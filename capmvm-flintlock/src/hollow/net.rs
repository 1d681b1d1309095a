//! The hollow host's listener: accepts TCP (and TLS) connections and hands them to the gRPC server,
//! and can make the host unreachable (listener closed, every open connection dropped) and
//! reachable again on the same address.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::{HollowError, ServerTls};

/// A connection the gRPC server reads from, cut off when its listening period ends.
pub(crate) struct Connection {
    io: Box<dyn Io>,
    killed: Pin<Box<WaitForCancellationFutureOwned>>,
    peer: SocketAddr,
}

trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

impl Connection {
    fn check(&mut self, cx: &mut Context<'_>) -> Result<(), io::Error> {
        match self.killed.as_mut().poll(cx) {
            Poll::Ready(()) => Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "hollow host made unreachable",
            )),
            Poll::Pending => Ok(()),
        }
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Connection {
    type ConnectInfo = SocketAddr;

    fn connect_info(&self) -> SocketAddr {
        self.peer
    }
}

/// Builds flintlockd's TLS setup: TLS 1.3 only; client certificates verified against the client
/// CA only when required (flintlockd `--tls-client-validate`), not requested otherwise.
pub(crate) fn tls_acceptor(tls: &ServerTls) -> Result<tokio_rustls::TlsAcceptor, HollowError> {
    let bad = |what: &str, err: &dyn std::fmt::Display| HollowError::Tls(format!("{what}: {err}"));
    let chain = CertificateDer::pem_slice_iter(&tls.cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad("server certificate", &e))?;
    if chain.is_empty() {
        return Err(HollowError::Tls(
            "server certificate: no PEM certificate found".into(),
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(tls.key_pem.expose())
        .map_err(|_| HollowError::Tls("server key: not a PEM private key".into()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| bad("TLS", &e))?;
    let builder = if tls.require_client_cert {
        let ca = tls.client_ca_pem.as_deref().ok_or_else(|| {
            HollowError::Tls("client certificates are required but no client CA was given".into())
        })?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca) {
            roots
                .add(cert.map_err(|e| bad("client CA", &e))?)
                .map_err(|e| bad("client CA", &e))?;
        }
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| bad("client CA", &e))?;
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| bad("server certificate and key", &e))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// The listening side: one "period" per stretch of reachability.
pub(crate) struct Listener {
    address: SocketAddr,
    tls: Option<tokio_rustls::TlsAcceptor>,
    connections: mpsc::Sender<Connection>,
    period: Option<Period>,
}

struct Period {
    /// Cancelled when the period ends: stops accepting and kills its connections.
    token: CancellationToken,
    accept: JoinHandle<()>,
}

impl Listener {
    /// Binds `address` and starts accepting. Returns the listener and the stream of connections.
    pub(crate) async fn bind(
        address: SocketAddr,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> Result<(Listener, mpsc::Receiver<Connection>), HollowError> {
        let (connections, receiver) = mpsc::channel(64);
        let socket = TcpListener::bind(address)
            .await
            .map_err(|source| HollowError::Bind { address, source })?;
        let address = socket
            .local_addr()
            .map_err(|source| HollowError::Bind { address, source })?;
        let mut listener = Listener {
            address,
            tls,
            connections,
            period: None,
        };
        listener.start_period(socket);
        Ok((listener, receiver))
    }

    pub(crate) fn address(&self) -> SocketAddr {
        self.address
    }

    pub(crate) fn is_listening(&self) -> bool {
        self.period.is_some()
    }

    /// Closes the listening socket and drops every open connection. Returns once the socket is
    /// closed.
    pub(crate) async fn close(&mut self) {
        if let Some(period) = self.period.take() {
            period.token.cancel();
            // The accept task owns the socket; it is closed when the task ends.
            let _ = period.accept.await;
        }
    }

    /// Like [`close`](Self::close) without waiting for the socket to close (for `Drop`).
    pub(crate) fn kill(&mut self) {
        if let Some(period) = self.period.take() {
            period.token.cancel();
        }
    }

    /// Listens again on the same address.
    pub(crate) async fn reopen(&mut self) -> Result<(), HollowError> {
        if self.period.is_some() {
            return Ok(());
        }
        let address = self.address;
        let socket = TcpListener::bind(address)
            .await
            .map_err(|source| HollowError::Bind { address, source })?;
        self.start_period(socket);
        Ok(())
    }

    /// Serves with `tls` from now on. A listening host closes its socket and every connection and
    /// listens again, as flintlockd restarted with new certificate files would: clients reconnect
    /// and meet the new certificate.
    pub(crate) async fn replace_tls(
        &mut self,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> Result<(), HollowError> {
        self.tls = tls;
        if self.period.is_some() {
            self.close().await;
            self.reopen().await?;
        }
        Ok(())
    }

    fn start_period(&mut self, socket: TcpListener) {
        let token = CancellationToken::new();
        let accept = tokio::spawn(accept_loop(
            socket,
            self.tls.clone(),
            self.connections.clone(),
            token.clone(),
        ));
        self.period = Some(Period { token, accept });
    }
}

async fn accept_loop(
    socket: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    connections: mpsc::Sender<Connection>,
    token: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            () = token.cancelled() => return,
            accepted = socket.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                // Typically out of file descriptors: back off instead of spinning.
                tracing::warn!(error = %err, "hollow host: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let tls = tls.clone();
        let connections = connections.clone();
        let token = token.clone();
        // The TLS handshake runs apart from the accept loop so a slow or bad client holds up no one.
        tokio::spawn(async move {
            let io = match handshake(stream, tls).await {
                Ok(io) => io,
                Err(err) => {
                    tracing::debug!(%peer, error = %err, "hollow host: TLS handshake failed");
                    return;
                }
            };
            let killed = Box::pin(token.cancelled_owned());
            let _ = connections.send(Connection { io, killed, peer }).await;
        });
    }
}

async fn handshake(
    stream: TcpStream,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> io::Result<Box<dyn Io>> {
    match tls {
        None => Ok(Box::new(stream)),
        Some(acceptor) => {
            match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream)).await {
                Ok(Ok(tls)) => Ok(Box::new(tls)),
                Ok(Err(err)) => Err(err),
                Err(_) => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "TLS handshake took longer than 10s",
                )),
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.kill();
    }
}
