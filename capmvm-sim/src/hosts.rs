//! `capmvm-sim hosts`: serves N hollow flintlock hosts on loopback until interrupted.
//!
//! ```text
//! capmvm-sim hosts --count 3 --base-port 9090 [--token T] [--tls-dir D] [--provision-ms 1000]
//! ```
//!
//! prints one endpoint per line (`127.0.0.1:9090`, `127.0.0.1:9091`, ...) on stdout; with
//! `--base-port 0` every host gets its own free port and the lines show the ports bound. With
//! `--tls-dir`, the hosts serve TLS 1.3 with the PEM files of that directory (`ca.crt`,
//! `server.crt`, `server.key`, `client.crt`, `client.key`), generating them first if the directory
//! is missing or empty, and require client certificates signed by `ca.crt` unless
//! `--tls-no-client-auth` is given. [`start_hosts`] does the same for programs embedding the kit.

use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use capmvm_flintlock::SecretString;
use capmvm_flintlock::hollow::pki::{self, TestPki};
use capmvm_flintlock::hollow::{Capacity, HollowConfig, HollowError, HollowHandle, HollowHost};

/// Options of `capmvm-sim hosts`.
#[derive(Debug, Clone, clap::Args)]
pub struct HostsArgs {
    /// How many hosts to serve.
    #[arg(long, default_value_t = 1)]
    pub count: u16,
    /// Port of the first host; host i listens on base-port + i. 0: every host on a free port
    /// (the printed endpoints show which).
    #[arg(long, default_value_t = 9090)]
    pub base_port: u16,
    /// flintlockd's --basic-auth-token for every host.
    // A `SecretString`, so the derived `Debug` of these arguments prints `<redacted>`.
    #[arg(long, env = "CAPMVM_SIM_TOKEN", hide_env_values = true)]
    pub token: Option<SecretString>,
    /// Serve TLS with the PEM files in this directory (generated if missing or empty).
    #[arg(long)]
    pub tls_dir: Option<PathBuf>,
    /// With --tls-dir: do not request client certificates (TLS without mTLS).
    #[arg(long, requires = "tls_dir")]
    pub tls_no_client_auth: bool,
    /// Milliseconds from create to CREATED.
    #[arg(long, default_value_t = 1000)]
    pub provision_ms: u64,
    /// Multiplies flintlock's own intervals (20 s retry backoff, delete time); 0.01 = 100x faster.
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// vCPUs per host (unlimited if unset).
    #[arg(long)]
    pub capacity_vcpu: Option<i64>,
    /// MiB of memory per host (unlimited if unset).
    #[arg(long)]
    pub capacity_memory_mb: Option<i64>,
}

/// Serving the hosts failed.
#[derive(Debug, thiserror::Error)]
pub enum HostsError {
    /// The arguments do not describe a set of hosts.
    #[error("{0}")]
    Usage(String),
    /// The TLS directory could not be used.
    #[error("TLS directory: {0}")]
    Pki(#[from] pki::PkiError),
    /// A host could not start.
    #[error("hollow host: {0}")]
    Host(#[from] HollowError),
    /// Writing the endpoints or waiting for Ctrl-C failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// `capmvm-sim hosts`: starts the hosts, prints their endpoints, serves until Ctrl-C.
pub fn main(args: HostsArgs) -> Result<(), HostsError> {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .try_init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let hosts = start_hosts(&args).await?;
        let mut stdout = std::io::stdout().lock();
        for host in &hosts {
            writeln!(stdout, "{}", host.endpoint())?;
        }
        stdout.flush()?;
        drop(stdout);
        tokio::signal::ctrl_c().await?;
        for host in hosts {
            host.shutdown().await;
        }
        Ok::<(), HostsError>(())
    })
}

/// Starts the hosts `args` describes, on `127.0.0.1:base_port ..` (each on a free port when
/// `base_port` is 0; [`HollowHandle::endpoint`] tells which).
pub async fn start_hosts(args: &HostsArgs) -> Result<Vec<HollowHandle>, HostsError> {
    if args.count == 0 {
        return Err(HostsError::Usage("--count must be at least 1".into()));
    }
    if args.base_port != 0
        && u32::from(args.base_port) + u32::from(args.count) - 1 > u32::from(u16::MAX)
    {
        return Err(HostsError::Usage(format!(
            "--base-port {} with --count {} runs past port 65535",
            args.base_port, args.count
        )));
    }
    if !args.time_scale.is_finite() || args.time_scale < 0.0 {
        return Err(HostsError::Usage(
            "--time-scale must be a number >= 0".into(),
        ));
    }
    let capacity = match (args.capacity_vcpu, args.capacity_memory_mb) {
        (None, None) => None,
        (vcpu, memory_mb) => Some(Capacity {
            vcpu: vcpu.unwrap_or(i64::MAX),
            memory_mb: memory_mb.unwrap_or(i64::MAX),
        }),
    };
    let tls = match &args.tls_dir {
        Some(dir) => Some(load_or_generate_pki(dir)?.server_tls(!args.tls_no_client_auth)),
        None => None,
    };
    let mut hosts = Vec::with_capacity(usize::from(args.count));
    for i in 0..args.count {
        // Port 0 is "any free port", not the first of a range: base_port + i would put the second
        // host on port 1.
        let port = if args.base_port == 0 {
            0
        } else {
            args.base_port + i
        };
        let config = HollowConfig {
            bind: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            basic_auth_token: args.token.clone(),
            tls: tls.clone(),
            provision_time: Duration::from_millis(args.provision_ms),
            time_scale: args.time_scale,
            capacity,
            ..HollowConfig::default()
        };
        hosts.push(HollowHost::start(config).await?);
    }
    Ok(hosts)
}

/// Reads the PEM files of `dir`, or generates them when the directory is missing or empty.
pub fn load_or_generate_pki(dir: &Path) -> Result<TestPki, HostsError> {
    if TestPki::exists_in(dir) {
        return Ok(TestPki::read_from(dir)?);
    }
    let empty = match std::fs::read_dir(dir) {
        Ok(mut entries) => entries.next().is_none(),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => true,
        Err(err) => return Err(err.into()),
    };
    if !empty {
        return Err(HostsError::Usage(format!(
            "{} is neither empty nor a complete set of {}",
            dir.display(),
            pki::FILES.join(", ")
        )));
    }
    let generated = TestPki::generate()?;
    generated.write_to(dir)?;
    eprintln!(
        "generated a test PKI in {} ({}); a capmvm TLS Secret takes ca.crt, tls.crt=client.crt, tls.key=client.key",
        dir.display(),
        pki::FILES.join(", ")
    );
    Ok(generated)
}

#[cfg(test)]
mod tests {
    use super::*;
    use capmvm_flintlock::{ClientPool, HostConfig, PoolOptions};

    fn args() -> HostsArgs {
        HostsArgs {
            count: 2,
            base_port: 0,
            token: Some(SecretString::new("t0ken")),
            tls_dir: None,
            tls_no_client_auth: false,
            provision_ms: 10,
            time_scale: 0.001,
            capacity_vcpu: None,
            capacity_memory_mb: None,
        }
    }

    #[tokio::test]
    async fn serves_mtls_hosts_from_a_generated_tls_dir() {
        let dir = std::env::temp_dir().join(format!("capmvm-sim-hosts-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let free_port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let args = HostsArgs {
            count: 1,
            base_port: free_port,
            tls_dir: Some(dir.clone()),
            ..args()
        };
        let hosts = start_hosts(&args).await.unwrap();
        assert_eq!(hosts[0].endpoint(), format!("127.0.0.1:{free_port}"));
        assert!(TestPki::exists_in(&dir));

        // A client using the files as an operator would (ca.crt, tls.crt, tls.key) gets in.
        let pki = TestPki::read_from(&dir).unwrap();
        let pool = ClientPool::new(PoolOptions::default());
        let host = HostConfig {
            tls: Some(pki.client_tls(true)),
            basic_auth_token: Some(SecretString::new("t0ken")),
            ..HostConfig::new(hosts[0].endpoint())
        };
        assert!(
            pool.client(&host)
                .unwrap()
                .list("", None)
                .await
                .unwrap()
                .is_empty()
        );

        // A second start reuses the files instead of generating new ones.
        drop(hosts);
        let again = load_or_generate_pki(&dir).unwrap();
        assert_eq!(again.ca_cert_pem, pki.ca_cert_pem);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn base_port_0_puts_every_host_on_its_own_free_port() {
        let hosts = start_hosts(&HostsArgs {
            count: 3,
            base_port: 0,
            ..args()
        })
        .await
        .unwrap();
        let endpoints: Vec<String> = hosts.iter().map(HollowHandle::endpoint).collect();
        let ports: std::collections::BTreeSet<u16> = endpoints
            .iter()
            .map(|endpoint| endpoint.rsplit_once(':').unwrap().1.parse().unwrap())
            .collect();
        assert_eq!(ports.len(), 3, "three distinct ports: {endpoints:?}");
        assert!(
            !ports.contains(&0),
            "the endpoints show the bound ports: {endpoints:?}"
        );
        // Each printed endpoint is a host that answers.
        let pool = ClientPool::new(PoolOptions::default());
        for endpoint in &endpoints {
            let host = HostConfig {
                basic_auth_token: Some(SecretString::new("t0ken")),
                ..HostConfig::new(endpoint.clone())
            };
            assert!(
                pool.client(&host)
                    .unwrap()
                    .list("", None)
                    .await
                    .unwrap()
                    .is_empty()
            );
        }
    }

    #[test]
    fn the_token_never_shows_in_debug_output() {
        #[derive(clap::Parser, Debug)]
        struct Cli {
            #[command(flatten)]
            hosts: HostsArgs,
        }
        use clap::Parser as _;
        let cli =
            Cli::try_parse_from(["hosts", "--count", "2", "--token", "s3cret-t0ken"]).unwrap();
        assert_eq!(
            cli.hosts.token.as_ref().map(SecretString::expose),
            Some("s3cret-t0ken")
        );
        let debug = format!("{cli:?} {:?}", cli.hosts);
        assert!(!debug.contains("s3cret-t0ken"), "{debug}");
        assert!(debug.contains("<redacted>"), "{debug}");
    }

    #[tokio::test]
    async fn refuses_impossible_arguments() {
        let err = start_hosts(&HostsArgs { count: 0, ..args() })
            .await
            .unwrap_err();
        assert!(matches!(err, HostsError::Usage(_)));
        let err = start_hosts(&HostsArgs {
            base_port: 65535,
            count: 2,
            ..args()
        })
        .await
        .unwrap_err();
        assert!(err.to_string().contains("65535"), "{err}");
        let dir =
            std::env::temp_dir().join(format!("capmvm-sim-hosts-partial-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("ca.crt"), "x").unwrap();
        let err = load_or_generate_pki(&dir).unwrap_err();
        assert!(
            matches!(err, HostsError::Usage(_)),
            "a partial directory is not overwritten"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
