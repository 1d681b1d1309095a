//! A tiny HTTP CONNECT proxy on loopback, for tests and simulations of `microvmProxy`.
//!
//! It answers `CONNECT host:port` with `200 Connection Established` and then copies bytes both
//! ways; anything else gets `405`. It counts the tunnels it opened, so tests can tell that traffic
//! really went through it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A running CONNECT proxy. Stops when dropped.
pub struct ConnectProxy {
    address: SocketAddr,
    tunnels: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for ConnectProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectProxy")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl ConnectProxy {
    /// Starts a proxy on `bind` (`127.0.0.1:0` picks a free port).
    pub async fn start(bind: SocketAddr) -> std::io::Result<ConnectProxy> {
        let listener = TcpListener::bind(bind).await?;
        let address = listener.local_addr()?;
        let tunnels = Arc::new(AtomicU64::new(0));
        let counter = tunnels.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    // Typically out of file descriptors: back off instead of spinning.
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                };
                let counter = counter.clone();
                tokio::spawn(async move {
                    if let Err(err) = serve(client, &counter).await {
                        tracing::debug!(error = %err, "connect proxy: tunnel ended with an error");
                    }
                });
            }
        });
        Ok(ConnectProxy {
            address,
            tunnels,
            task,
        })
    }

    /// `host:port` of the proxy.
    pub fn endpoint(&self) -> String {
        self.address.to_string()
    }

    /// How many tunnels were opened so far.
    pub fn tunnels(&self) -> u64 {
        self.tunnels.load(Ordering::Relaxed)
    }
}

impl Drop for ConnectProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(mut client: TcpStream, tunnels: &AtomicU64) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(256);
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 8 * 1024 || client.read(&mut byte).await? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    let mut request_line = head.lines().next().unwrap_or_default().split_whitespace();
    let (method, target) = (
        request_line.next().unwrap_or_default(),
        request_line.next().unwrap_or_default(),
    );
    if method != "CONNECT" || target.is_empty() {
        client
            .write_all(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            .await?;
        return Ok(());
    }
    let mut upstream = match TcpStream::connect(target).await {
        Ok(upstream) => upstream,
        Err(_) => {
            client
                .write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                .await?;
            return Ok(());
        }
    };
    let _ = upstream.set_nodelay(true);
    let _ = client.set_nodelay(true);
    client
        .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        .await?;
    tunnels.fetch_add(1, Ordering::Relaxed);
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}
