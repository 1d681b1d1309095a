//! `capmvm-kube-emulator`: serves the Kubernetes API emulator on loopback and writes a kubeconfig,
//! until Ctrl-C or SIGTERM.

use clap::Parser;
use tracing_subscriber::EnvFilter;

/// Serve an in-process Kubernetes API server (plain HTTP on loopback) for kubectl, kube-rs and
/// controllers under test.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(flatten)]
    kube: capmvm_kube_emulator::KubeArgs,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(capmvm_kube_emulator::run(cli.kube))?;
    Ok(())
}
