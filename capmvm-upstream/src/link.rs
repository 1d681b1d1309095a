//! A loopback TCP link that can be cut: the network between two processes, for partition faults.
//!
//! A client is pointed at [`Link::address`] instead of the server; the link forwards bytes both ways
//! until it is [`Link::cut`]. A cut models a partition, not a crash: established connections stop
//! carrying bytes (nothing is closed, so the client only learns from its own timeouts, as it would
//! when packets are dropped), and new connections are accepted but never forwarded. With
//! [`Cut::Refuse`] the link instead closes every connection at once, the way a host that rebooted
//! answers. [`Link::heal`] forwards again; connections frozen by a blackhole cut are dropped then,
//! as a real network's would have timed out, so clients reconnect.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What a cut link does to the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Packets are dropped: connections hang, new ones are accepted and then hang.
    Blackhole,
    /// Connections are closed, new ones closed as soon as accepted.
    Refuse,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Open,
    Cut(Cut),
}

/// A running link on loopback. Stops (closing everything) when dropped.
pub struct Link {
    address: SocketAddr,
    target: SocketAddr,
    state: watch::Sender<State>,
    connections: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("address", &self.address)
            .field("target", &self.target)
            .field("state", &*self.state.borrow())
            .finish_non_exhaustive()
    }
}

impl Link {
    /// Starts a link on a free loopback port, forwarding to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Link> {
        Link::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), target).await
    }

    /// Starts a link listening on `bind`, forwarding to `target`.
    pub async fn start_on(bind: SocketAddr, target: SocketAddr) -> std::io::Result<Link> {
        let listener = TcpListener::bind(bind).await?;
        let address = listener.local_addr()?;
        let (state, watching) = watch::channel(State::Open);
        let connections = Arc::new(AtomicU64::new(0));
        let counter = connections.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    // Typically out of file descriptors: back off instead of spinning.
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                };
                counter.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(carry(client, target, watching.clone()));
            }
        });
        Ok(Link {
            address,
            target,
            state,
            connections,
            task,
        })
    }

    /// Where clients connect.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Where the link forwards to.
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// Connections accepted so far (those a cut swallowed included).
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// Whether the link is cut now.
    pub fn is_cut(&self) -> bool {
        *self.state.borrow() != State::Open
    }

    /// Cuts the link.
    pub fn cut(&self, how: Cut) {
        self.state.send_replace(State::Cut(how));
    }

    /// Forwards again.
    pub fn heal(&self) {
        self.state.send_replace(State::Open);
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.task.abort();
        // Every connection's task watches the state; a closed channel ends them.
        self.state.send_replace(State::Cut(Cut::Refuse));
    }
}

/// One client connection: waits while the link is blackholed, forwards while it is open, and ends when
/// it is refused, healed after a blackhole (the connection would have timed out) or dropped.
async fn carry(mut client: TcpStream, target: SocketAddr, mut state: watch::Receiver<State>) {
    // A connection accepted during a blackhole hangs until the link changes, then closes.
    let initial = *state.borrow_and_update();
    match initial {
        State::Cut(Cut::Refuse) => return,
        State::Cut(Cut::Blackhole) => {
            let _ = state.changed().await;
            return;
        }
        State::Open => {}
    }
    let Ok(mut server) = TcpStream::connect(target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.split();
    let (mut server_read, mut server_write) = server.split();
    let mut up = [0u8; 16 * 1024];
    let mut down = [0u8; 16 * 1024];
    loop {
        tokio::select! {
            changed = state.changed() => {
                if changed.is_err() {
                    return;
                }
                let now = *state.borrow_and_update();
                match now {
                    State::Open => {}
                    State::Cut(Cut::Refuse) => return,
                    State::Cut(Cut::Blackhole) => {
                        // Frozen: nothing moves until the link changes again; then the connection is
                        // gone, as a real one would be after its peers' timeouts.
                        let _ = state.changed().await;
                        return;
                    }
                }
            }
            read = client_read.read(&mut up) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => if server_write.write_all(&up[..n]).await.is_err() { return },
            },
            read = server_read.read(&mut down) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => if client_write.write_all(&down[..n]).await.is_err() { return },
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = socket.read(&mut buf).await {
                        if n == 0 || socket.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        address
    }

    async fn round_trip(stream: &mut TcpStream, text: &[u8]) -> Option<Vec<u8>> {
        stream.write_all(text).await.ok()?;
        let mut buf = vec![0u8; text.len()];
        match tokio::time::timeout(Duration::from_millis(300), stream.read_exact(&mut buf)).await {
            Ok(Ok(_)) => Some(buf),
            _ => None,
        }
    }

    #[tokio::test]
    async fn forwards_freezes_on_a_blackhole_and_forwards_again_after_heal() {
        let link = Link::start(echo_server().await).await.unwrap();
        let mut before = TcpStream::connect(link.address()).await.unwrap();
        assert_eq!(
            round_trip(&mut before, b"one").await.as_deref(),
            Some(&b"one"[..])
        );

        link.cut(Cut::Blackhole);
        assert!(link.is_cut());
        assert_eq!(
            round_trip(&mut before, b"two").await,
            None,
            "a blackholed connection carries nothing"
        );
        let mut during = TcpStream::connect(link.address()).await.unwrap();
        assert_eq!(
            round_trip(&mut during, b"three").await,
            None,
            "a new one is accepted and hangs"
        );

        link.heal();
        let mut after = TcpStream::connect(link.address()).await.unwrap();
        assert_eq!(
            round_trip(&mut after, b"four").await.as_deref(),
            Some(&b"four"[..])
        );
        assert_eq!(link.connections(), 3);
    }

    #[tokio::test]
    async fn a_refusing_cut_closes_connections_at_once() {
        let link = Link::start(echo_server().await).await.unwrap();
        let mut before = TcpStream::connect(link.address()).await.unwrap();
        assert!(round_trip(&mut before, b"one").await.is_some());
        link.cut(Cut::Refuse);
        let mut buf = [0u8; 8];
        let read = tokio::time::timeout(Duration::from_secs(2), before.read(&mut buf)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "closed, not hanging: {read:?}"
        );
        let mut during = TcpStream::connect(link.address()).await.unwrap();
        let read = tokio::time::timeout(Duration::from_secs(2), during.read(&mut buf)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "closed on accept: {read:?}"
        );
    }
}
