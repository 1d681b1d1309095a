//! `capmvm-sim kube`: serves the emulator until Ctrl-C or SIGTERM.

use std::net::IpAddr;
use std::path::PathBuf;

use super::{Emulator, EmulatorOptions, Error};

/// Arguments of `capmvm-sim kube`.
#[derive(Debug, Clone, clap::Args)]
pub struct KubeArgs {
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 6443)]
    pub port: u16,
    /// Address to listen on. Plain HTTP without authentication: keep it on loopback.
    #[arg(long, default_value = "127.0.0.1")]
    pub address: IpAddr,
    /// Where to write a kubeconfig for kubectl and kube-rs.
    #[arg(long, default_value = "kubeconfig")]
    pub kubeconfig: PathBuf,
    /// Changes kept for watch resumption and pagination (older resourceVersions get 410 Gone).
    #[arg(long, default_value_t = 10_000)]
    pub history_limit: usize,
    /// Events buffered per watch before a slow watcher is closed.
    #[arg(long, default_value_t = 1_000)]
    pub watch_buffer: usize,
}

/// Serves until interrupted, printing the URL and the kubeconfig path.
pub async fn run(args: KubeArgs) -> Result<(), Error> {
    let mut options = EmulatorOptions::default()
        .history_limit(args.history_limit)
        .watch_buffer(args.watch_buffer);
    options.bind = std::net::SocketAddr::new(args.address, args.port);
    let emulator = Emulator::start(options).await?;
    emulator.write_kubeconfig(&args.kubeconfig)?;
    println!("Kubernetes API emulator at {}", emulator.base_url());
    println!("kubeconfig written to {}", args.kubeconfig.display());
    println!(
        "try: kubectl --kubeconfig {} api-resources",
        args.kubeconfig.display()
    );
    wait_for_signal().await?;
    tracing::info!(
        requests = emulator.counters().total(),
        "stopping the Kubernetes API emulator"
    );
    emulator.shutdown().await;
    Ok(())
}

async fn wait_for_signal() -> Result<(), Error> {
    let io = |what: &str, source| Error::Io {
        what: what.to_string(),
        source,
    };
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| io("installing the SIGTERM handler", e))?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r.map_err(|e| io("waiting for Ctrl-C", e)),
            _ = term.recv() => Ok(()),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c()
            .await
            .map_err(|e| io("waiting for Ctrl-C", e))
    }
}
