//! `capmvm-sim watch-floor --kubeconfig K`: the operator's watches alone, for `bench --watch-floor`.
//!
//! It runs the operator's own watch layer (`capmvm_operator::watch::start`: the same watches,
//! decoding, caches, trims, fingerprints and mappers) with no controller behind it: the wake-ups the
//! mappers send are counted and dropped. No reconcile, no host poll, no write. Run beside the
//! operator on the same server, its CPU is what receiving the server's changes costs before the
//! operator decides or does anything: the floor under the operator's CPU per machine.
//!
//! With `--bare`, lower still: the same collections' watches read as text through the same client
//! (kube's, on hyper and rustls), split into lines here and nothing decoded (each line is only
//! scanned for its resourceVersion, to resume from): what the bytes alone cost. It counts each
//! collection's events and bytes.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use capmvm_operator::memory::OwnWrites;
use capmvm_operator::watch::{self, Scope, Triggers};
use tokio::sync::mpsc::UnboundedReceiver;

/// Options of `capmvm-sim watch-floor`.
#[derive(Debug, Clone, clap::Args)]
pub struct WatchFloorArgs {
    /// The kubeconfig to watch with (the operator's, so the same identity and RBAC).
    #[arg(long)]
    pub kubeconfig: PathBuf,
    /// Where to write the counts, rewritten every 200 ms (`machine N`, `cluster N`, `pool N`, one
    /// a line; with `--bare`, a `bare PATH EVENTS BYTES` line per collection).
    #[arg(long)]
    pub counts: Option<PathBuf>,
    /// The operator's `--watch-timeout`, in seconds.
    #[arg(long, default_value_t = 60)]
    pub watch_timeout_secs: u64,
    /// Read the watches as text, decode nothing (see the module's text).
    #[arg(long)]
    pub bare: bool,
}

/// The collections the operator watches (every namespace, as the bench runs it): what `--bare`
/// reads. The Secrets' watch is of their metadata and leaves out Cluster API's own, as the
/// operator's (`type!=cluster.x-k8s.io/secret`).
const WATCHED: [&str; 7] = [
    "/apis/infrastructure.cluster.x-k8s.io/v1alpha2/microvmmachines",
    "/apis/cluster.x-k8s.io/v1beta2/machines",
    "/apis/cluster.x-k8s.io/v1beta2/clusters",
    "/apis/infrastructure.cluster.x-k8s.io/v1alpha2/microvmclusters",
    "/apis/infrastructure.cluster.x-k8s.io/v1alpha2/microvmmachinepools",
    "/apis/cluster.x-k8s.io/v1beta2/machinepools",
    "/api/v1/secrets",
];

/// `--bare`'s counts: events and bytes per collection of [`WATCHED`].
#[derive(Default)]
struct Bare {
    events: [AtomicU64; WATCHED.len()],
    bytes: [AtomicU64; WATCHED.len()],
}

impl Bare {
    fn render(&self) -> String {
        let mut out = String::new();
        for (i, path) in WATCHED.iter().enumerate() {
            out.push_str(&format!(
                "bare {path} {} {}\n",
                self.events[i].load(Ordering::Relaxed),
                self.bytes[i].load(Ordering::Relaxed)
            ));
        }
        out
    }
}

/// Reads the watch of `WATCHED[index]` line by line and counts, renewing it when the server ends
/// it; forever. The first watch, without a resourceVersion, starts with every object as added.
async fn read_watch(client: kube::Client, index: usize, counts: Arc<Bare>) {
    use futures::AsyncBufReadExt as _;
    let path = WATCHED[index];
    let mut version: Option<String> = None;
    loop {
        let since = version
            .as_deref()
            .map(|v| format!("&resourceVersion={v}"))
            .unwrap_or_default();
        let selector = if path == "/api/v1/secrets" {
            format!(
                "&fieldSelector=type%21%3D{}",
                capmvm_api::keys::CAPI_SECRET_TYPE.replace('/', "%2F")
            )
        } else {
            String::new()
        };
        let uri = format!(
            "{path}?watch=true&allowWatchBookmarks=true&timeoutSeconds=3600{selector}{since}"
        );
        let mut request = http::Request::get(uri);
        if path == "/api/v1/secrets" {
            request = request.header(
                http::header::ACCEPT,
                "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
            );
        }
        let Ok(request) = request.body(Vec::new()) else {
            return;
        };
        let stream = match client.request_stream(request).await {
            Ok(stream) => stream,
            Err(e) => {
                // Said once a second at most: a refused watch (RBAC) reads as no events otherwise.
                eprintln!("watch-floor: {path}: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let mut stream = std::pin::pin!(stream);
        let mut line = Vec::new();
        let mut delivered = false;
        loop {
            line.clear();
            match stream.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    delivered = true;
                    counts.events[index].fetch_add(1, Ordering::Relaxed);
                    counts.bytes[index].fetch_add(n as u64, Ordering::Relaxed);
                    // Where to resume: the last resourceVersion seen, or from now after an
                    // ERROR event (410 Gone: that version is too old to resume from).
                    if line.starts_with(br#"{"type":"ERROR""#) {
                        version = None;
                    } else if let Some(v) = resource_version(&line) {
                        version = Some(v);
                    }
                }
            }
        }
        if !delivered {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// The first `"resourceVersion":"…"` of a watch event's line (its object's).
fn resource_version(line: &[u8]) -> Option<String> {
    const KEY: &[u8] = b"\"resourceVersion\":\"";
    let at = line.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let len = line[at..].iter().position(|b| *b == b'"')?;
    String::from_utf8(line[at..at + len].to_vec()).ok()
}

/// Wake-ups received, by controller.
#[derive(Default)]
struct Wakes {
    machine: AtomicU64,
    cluster: AtomicU64,
    pool: AtomicU64,
}

impl Wakes {
    fn render(&self) -> String {
        format!(
            "machine {}\ncluster {}\npool {}\n",
            self.machine.load(Ordering::Relaxed),
            self.cluster.load(Ordering::Relaxed),
            self.pool.load(Ordering::Relaxed)
        )
    }
}

/// Counts what `rx` receives into `count` until its senders are gone.
async fn drain<T>(
    mut rx: UnboundedReceiver<T>,
    wakes: Arc<Wakes>,
    count: fn(&Wakes) -> &AtomicU64,
) {
    while rx.recv().await.is_some() {
        count(&wakes).fetch_add(1, Ordering::Relaxed);
    }
}

/// What the floor counted so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counts {
    /// Wake-ups its mappers sent, by controller: (machine, cluster, pool); zeros with `--bare`.
    pub wakes: (u64, u64, u64),
    /// With `--bare`: each collection's path, events and bytes.
    pub bare: Vec<(String, u64, u64)>,
}

impl Counts {
    /// The counts from `before` to `self`.
    pub fn since(&self, before: &Counts) -> Counts {
        let (m, c, p) = self.wakes;
        let (m0, c0, p0) = before.wakes;
        let bare = self
            .bare
            .iter()
            .map(|(path, events, bytes)| {
                let (e0, b0) = before
                    .bare
                    .iter()
                    .find(|(p, _, _)| p == path)
                    .map_or((0, 0), |(_, e, b)| (*e, *b));
                (
                    path.clone(),
                    events.saturating_sub(e0),
                    bytes.saturating_sub(b0),
                )
            })
            .collect();
        Counts {
            wakes: (
                m.saturating_sub(m0),
                c.saturating_sub(c0),
                p.saturating_sub(p0),
            ),
            bare,
        }
    }
}

/// Parses the counts `watch-floor --counts` wrote.
pub fn parse_counts(text: &str) -> Option<Counts> {
    let get = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
    };
    let bare = text
        .lines()
        .filter_map(|l| {
            let mut words = l.strip_prefix("bare ")?.split(' ');
            let path = words.next()?.to_string();
            let events = words.next()?.parse().ok()?;
            let bytes = words.next()?.parse().ok()?;
            Some((path, events, bytes))
        })
        .collect();
    Some(Counts {
        wakes: (get("machine ")?, get("cluster ")?, get("pool ")?),
        bare,
    })
}

/// Runs the watches until the process is killed.
pub async fn run(args: WatchFloorArgs) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let kubeconfig = kube::config::Kubeconfig::read_from(&args.kubeconfig)
        .with_context(|| format!("reading kubeconfig {}", args.kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .with_context(|| format!("loading kubeconfig {}", args.kubeconfig.display()))?;
    let client = kube::Client::try_from(config).context("building the Kubernetes client")?;
    if args.bare {
        let bare = Arc::new(Bare::default());
        for index in 0..WATCHED.len() {
            tokio::spawn(read_watch(client.clone(), index, bare.clone()));
        }
        return write_counts_forever(args.counts.as_deref(), || {
            format!("machine 0\ncluster 0\npool 0\n{}", bare.render())
        })
        .await;
    }
    let scope = Scope {
        watch_timeout: Duration::from_secs(args.watch_timeout_secs),
        ..Scope::default()
    };
    let (triggers, woken) = Triggers::channels();
    let wakes = Arc::new(Wakes::default());
    tokio::spawn(drain(woken.machine, wakes.clone(), |w| &w.machine));
    tokio::spawn(drain(woken.cluster, wakes.clone(), |w| &w.cluster));
    tokio::spawn(drain(woken.pool, wakes.clone(), |w| &w.pool));
    // The operator's own watch client, reporting to a readiness nobody reads.
    let (_stores, _tasks) = watch::start(
        &watch::reporting_answers(client, scope.readiness.clone()),
        &scope,
        &triggers,
        Arc::new(OwnWrites::default()),
    );
    write_counts_forever(args.counts.as_deref(), || wakes.render()).await
}

/// Writes `render()` to `path` at once and every 200 ms after, whole (a reader never sees half),
/// forever: the bench reads it at the clock's start and at all ready.
async fn write_counts_forever(
    path: Option<&std::path::Path>,
    render: impl Fn() -> String,
) -> anyhow::Result<()> {
    loop {
        if let Some(path) = path {
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, render())
                .and_then(|()| std::fs::rename(&tmp, path))
                .with_context(|| format!("writing {}", path.display()))?;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `watch-floor` running beside the operator, killed when dropped.
pub struct FloorProcess {
    child: tokio::process::Child,
    counts: PathBuf,
}

impl FloorProcess {
    /// Starts `exe watch-floor` with `kubeconfig` (and `--bare` if `bare`), its counts and output
    /// in `dir`.
    pub fn spawn(
        exe: &std::path::Path,
        kubeconfig: &std::path::Path,
        dir: &std::path::Path,
        bare: bool,
    ) -> anyhow::Result<Self> {
        let counts = dir.join("watch-floor.counts");
        let log = std::fs::File::create(dir.join("watch-floor.log"))
            .context("creating the watch floor's log")?;
        let mut command = tokio::process::Command::new(exe);
        command
            .arg("watch-floor")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--counts")
            .arg(&counts)
            .args(bare.then_some("--bare"))
            .env_remove("KUBECONFIG")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().context("cloning the log handle")?)
            .stderr(log)
            .kill_on_drop(true);
        capmvm_upstream::process::die_with_parent(&mut command);
        let child = command.spawn().context("starting watch-floor")?;
        Ok(Self { child, counts })
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// What it counted so far.
    pub fn counts(&self) -> Option<Counts> {
        parse_counts(&std::fs::read_to_string(&self.counts).ok()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_read_back_as_written() {
        let wakes = Wakes::default();
        wakes.machine.store(7, Ordering::Relaxed);
        wakes.pool.store(2, Ordering::Relaxed);
        assert_eq!(parse_counts(&wakes.render()).unwrap().wakes, (7, 0, 2));
        assert_eq!(parse_counts("machine 1\n"), None);
        let bare = Bare::default();
        bare.events[1].store(3, Ordering::Relaxed);
        bare.bytes[1].store(4096, Ordering::Relaxed);
        let counts =
            parse_counts(&format!("machine 0\ncluster 0\npool 0\n{}", bare.render())).unwrap();
        assert_eq!(counts.bare.len(), WATCHED.len());
        assert_eq!(counts.bare[1], (WATCHED[1].to_string(), 3, 4096));
        let later = Counts {
            wakes: (9, 1, 2),
            bare: vec![(WATCHED[1].to_string(), 5, 5000)],
        };
        assert_eq!(
            later.since(&counts).bare,
            vec![(WATCHED[1].to_string(), 2, 904)]
        );
    }

    #[test]
    fn the_resource_version_is_the_first_one_of_the_line() {
        let line = br#"{"type":"MODIFIED","object":{"metadata":{"name":"a","resourceVersion":"42"},"spec":{"resourceVersion":"7"}}}"#;
        assert_eq!(resource_version(line).as_deref(), Some("42"));
        assert_eq!(resource_version(b"{}"), None);
    }
}
