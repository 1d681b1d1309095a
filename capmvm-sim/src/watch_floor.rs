//! `capmvm-sim watch-floor --kubeconfig K`: the operator's watches alone, for `bench --watch-floor`.
//!
//! It runs the operator's own watch layer (`capmvm_operator::watch::start`: the same watches,
//! decoding, caches, trims, fingerprints and mappers) with no controller behind it: the wake-ups the
//! mappers send are counted and dropped. No reconcile, no host poll, no write. Run beside the
//! operator on the same server, its CPU is what receiving the server's changes costs before the
//! operator decides or does anything: the floor under the operator's CPU per machine.

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
    /// Where to write the wake-up counts, rewritten every second (`machine N`, `cluster N`,
    /// `pool N`, one a line).
    #[arg(long)]
    pub counts: Option<PathBuf>,
    /// The operator's `--watch-timeout`, in seconds.
    #[arg(long, default_value_t = 60)]
    pub watch_timeout_secs: u64,
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

/// Parses the counts `watch-floor --counts` wrote: `(machine, cluster, pool)`.
pub fn parse_counts(text: &str) -> Option<(u64, u64, u64)> {
    let get = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
    };
    Some((get("machine ")?, get("cluster ")?, get("pool ")?))
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
    let scope = Scope {
        watch_timeout: Duration::from_secs(args.watch_timeout_secs),
        ..Scope::default()
    };
    let (machine_tx, machine_rx) = tokio::sync::mpsc::unbounded_channel();
    let (cluster_tx, cluster_rx) = tokio::sync::mpsc::unbounded_channel();
    let (pool_tx, pool_rx) = tokio::sync::mpsc::unbounded_channel();
    let triggers = Triggers {
        machine: machine_tx,
        cluster: cluster_tx,
        pool: pool_tx,
    };
    let wakes = Arc::new(Wakes::default());
    tokio::spawn(drain(machine_rx, wakes.clone(), |w| &w.machine));
    tokio::spawn(drain(cluster_rx, wakes.clone(), |w| &w.cluster));
    tokio::spawn(drain(pool_rx, wakes.clone(), |w| &w.pool));
    // The operator's own watch client, reporting to a readiness nobody reads.
    let (_stores, _tasks) = watch::start(
        &watch::reporting_answers(client, scope.readiness.clone()),
        &scope,
        &triggers,
        Arc::new(OwnWrites::default()),
    );
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if let Some(path) = &args.counts {
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, wakes.render())
                .and_then(|()| std::fs::rename(&tmp, path))
                .with_context(|| format!("writing {}", path.display()))?;
        }
    }
}

/// `watch-floor` running beside the operator, killed when dropped.
pub struct FloorProcess {
    child: tokio::process::Child,
    counts: PathBuf,
}

impl FloorProcess {
    /// Starts `exe watch-floor` with `kubeconfig`, its counts and output in `dir`.
    pub fn spawn(
        exe: &std::path::Path,
        kubeconfig: &std::path::Path,
        dir: &std::path::Path,
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

    /// The wake-ups counted so far: `(machine, cluster, pool)`.
    pub fn wakes(&self) -> Option<(u64, u64, u64)> {
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
        assert_eq!(parse_counts(&wakes.render()), Some((7, 0, 2)));
        assert_eq!(parse_counts("machine 1\n"), None);
    }
}
