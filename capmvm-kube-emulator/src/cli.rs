//! The `capmvm-kube-emulator` command (also `capmvm-sim kube`): serves the emulator until Ctrl-C or SIGTERM.

use std::net::IpAddr;
use std::path::PathBuf;

use super::{DEFAULT_FAULT_SEED, Emulator, EmulatorOptions, Error, FaultRule};

/// Arguments of the `capmvm-kube-emulator` command (and of `capmvm-sim kube`).
#[derive(Debug, Clone, clap::Args)]
pub struct KubeArgs {
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 6443)]
    pub port: u16,
    /// Address to listen on. Plain HTTP without authentication, so only loopback addresses are
    /// accepted unless `--insecure-bind-any` is given.
    #[arg(long, default_value = "127.0.0.1")]
    pub address: IpAddr,
    /// Allow a non-loopback `--address`: anyone who can reach it can read and change everything
    /// (Secrets included), with no TLS and no authentication.
    #[arg(long)]
    pub insecure_bind_any: bool,
    /// Where to write a kubeconfig for kubectl and kube-rs.
    #[arg(long, default_value = "kubeconfig")]
    pub kubeconfig: PathBuf,
    /// Changes kept for watch resumption and pagination (older resourceVersions get 410 Gone).
    #[arg(long, default_value_t = 10_000)]
    pub history_limit: usize,
    /// Events buffered per watch before a slow watcher is closed.
    #[arg(long, default_value_t = 1_000)]
    pub watch_buffer: usize,
    /// Fail a share of requests, for resilience tests (repeatable; the first matching rule wins).
    /// `;`-separated `key=value`: `kind` = 500 | 429 | 409 | 504 | slow | cut-watch | 410 (required),
    /// `share` (0..1, default 1), `verbs` (get,list,watch,create,update,patch,delete,deletecollection),
    /// `resources` (plural[.group][/subresource], comma-separated), `agent` (User-Agent prefix),
    /// `retry-after` (429, seconds), `delay` (slow, e.g. 200ms), `after` (cut-watch: events before
    /// the cut), `times` (at most this many). Example:
    /// `--fault 'kind=500;verbs=list,watch;resources=secrets;share=0.05'`.
    /// The counts are printed on exit and served at `/debug/faults`.
    #[arg(long = "fault", value_name = "RULE")]
    pub faults: Vec<FaultRule>,
    /// Seed of the fault rules' random source: the same seed and requests give the same faults.
    #[arg(long, default_value_t = DEFAULT_FAULT_SEED)]
    pub fault_seed: u64,
}

/// Serves until interrupted, printing the URL (with the port chosen for `--port 0`) and the
/// kubeconfig path.
pub async fn run(args: KubeArgs) -> Result<(), Error> {
    check_address(args.address, args.insecure_bind_any)?;
    if !args.address.is_loopback() {
        tracing::warn!(address = %args.address, "the API emulator listens beyond loopback without TLS or authentication");
    }
    let mut options = EmulatorOptions::default()
        .history_limit(args.history_limit)
        .watch_buffer(args.watch_buffer);
    options.bind = std::net::SocketAddr::new(args.address, args.port);
    let stop = signal_handlers()?;
    let emulator = Emulator::start(options).await?;
    let faults = emulator.faults();
    faults.seed(args.fault_seed);
    faults
        .set_rules(args.faults.iter().cloned())
        .map_err(|e| Error::Options(e.to_string()))?;
    for rule in &args.faults {
        println!("fault rule: {rule} (seed {})", args.fault_seed);
    }
    emulator.write_kubeconfig(&args.kubeconfig)?;
    println!("Kubernetes API emulator at {}", emulator.base_url());
    println!("kubeconfig written to {}", args.kubeconfig.display());
    println!(
        "try: kubectl --kubeconfig {} api-resources",
        args.kubeconfig.display()
    );
    stop.await?;
    tracing::info!(
        requests = emulator.counters().total(),
        "stopping the Kubernetes API emulator"
    );
    if !args.faults.is_empty() {
        println!("faults injected:\n{}", faults.counts());
    }
    emulator.shutdown().await;
    Ok(())
}

/// The emulator answers anyone who reaches it, so a non-loopback address needs an explicit opt-in.
fn check_address(address: IpAddr, insecure_bind_any: bool) -> Result<(), Error> {
    if address.is_loopback() || insecure_bind_any {
        return Ok(());
    }
    Err(Error::Options(format!(
        "refusing to listen on {address}: the emulator serves plain HTTP without authentication, so \
         anyone who can reach it can read and change every object; use a loopback address \
         (127.0.0.1 or ::1), or pass --insecure-bind-any to accept that"
    )))
}

/// Installs the Ctrl-C and SIGTERM handlers at once (a signal that comes after the URL is printed
/// but before they are in place would otherwise end the process with its default action) and returns
/// what waits for either.
fn signal_handlers() -> Result<impl std::future::Future<Output = Result<(), Error>>, Error> {
    let io = |what: &str, source| Error::Io {
        what: what.to_string(),
        source,
    };
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term =
            signal(SignalKind::terminate()).map_err(|e| io("installing the SIGTERM handler", e))?;
        let mut int =
            signal(SignalKind::interrupt()).map_err(|e| io("installing the SIGINT handler", e))?;
        Ok(async move {
            tokio::select! {
                _ = int.recv() => Ok(()),
                _ = term.recv() => Ok(()),
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async move {
            tokio::signal::ctrl_c()
                .await
                .map_err(|e| io("waiting for Ctrl-C", e))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        kube: KubeArgs,
    }

    #[test]
    fn fault_flags_parse_and_a_bad_rule_names_its_part() {
        let cli = Cli::try_parse_from([
            "kube",
            "--fault",
            "kind=500;verbs=list,watch;resources=secrets;share=0.05",
            "--fault",
            "kind=429;retry-after=2;agent=capmvm-operator/",
            "--fault-seed",
            "7",
        ])
        .unwrap();
        assert_eq!(cli.kube.faults.len(), 2);
        assert_eq!(cli.kube.fault_seed, 7);
        let e = Cli::try_parse_from(["kube", "--fault", "kind=500;share=half"]).unwrap_err();
        assert!(
            e.to_string().contains("share=\"half\" is not a number"),
            "{e}"
        );
    }

    #[test]
    fn only_loopback_without_the_opt_in() {
        let any: IpAddr = "0.0.0.0".parse().unwrap();
        let lan: IpAddr = "192.168.1.10".parse().unwrap();
        let v6: IpAddr = "::1".parse().unwrap();
        assert!(check_address("127.0.0.1".parse().unwrap(), false).is_ok());
        assert!(check_address(v6, false).is_ok());
        assert!(check_address(any, false).is_err());
        assert!(check_address(lan, false).is_err());
        assert!(check_address(any, true).is_ok());
    }
}
