//! The two servers the contract suite runs against: the hollow host, and the real flintlockd (on a
//! containerd of its own) that `capmvm-upstream` starts from the binary `hack/upstream.sh build`
//! made. Each test starts a fresh server of either kind with the options it needs, as flintlockd's
//! flags would set them.
//!
//! No microVM can boot here (nested KVM without hardware virtualisation, no device-mapper), and
//! no image can be pulled (no network): the real server keeps every microVM PENDING, failing each
//! attempt and counting `retry` up. The hollow host is set up the same way
//! (`registry_reachable: false`, flintlock's own 20 s backoff unscaled), so both answer alike.

use std::path::PathBuf;
use std::time::Duration;

use capmvm_flintlock::hollow::pki::TestPki;
use capmvm_flintlock::hollow::{HollowConfig, HollowHandle, HollowHost};
use capmvm_flintlock::{ClientPool, FlintlockClient, HostConfig, PoolOptions, SecretString};
use capmvm_upstream::flintlock::{ContainerdTools, FlintlockdTls};
use capmvm_upstream::{Binaries, Flintlockd, FlintlockdOptions};

/// Declares contract tests that run on both servers: for each `async fn name(backend: Backend)` it
/// makes `hollow::name` and `real::name` (skipped locally when flintlockd or containerd is missing,
/// a failure under CI).
#[macro_export]
macro_rules! on_both_servers {
    ($($test:ident),* $(,)?) => {
        /// The contract tests on the hollow host.
        mod hollow {
            $(
                #[tokio::test]
                async fn $test() {
                    super::$test($crate::servers::Backend::Hollow).await
                }
            )*
        }
        /// The same tests on the real flintlockd.
        mod real {
            $(
                #[tokio::test]
                async fn $test() {
                    let Some(backend) = $crate::servers::Backend::real(stringify!($test)) else {
                        return;
                    };
                    super::$test(backend).await
                }
            )*
        }
        /// The names of the tests that run on both servers (the README's count).
        #[allow(dead_code)]
        pub(crate) const ON_BOTH_SERVERS: &[&str] = &[$(stringify!($test)),*];
    };
}

/// How flintlockd serves TLS (its `--tls-*` flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tls {
    /// `--tls-cert`, `--tls-key`.
    ServerOnly,
    /// ... and `--tls-client-ca` without `--tls-client-validate`.
    ClientCaOnly,
    /// ... and `--tls-client-ca --tls-client-validate`: mTLS.
    ClientValidated,
}

/// What a test asks of its server: flintlockd's flags.
#[derive(Clone, Debug, Default)]
pub(crate) struct Options {
    /// `--basic-auth-token`.
    pub(crate) token: Option<&'static str>,
    /// TLS (`None`: `--insecure`).
    pub(crate) tls: Option<Tls>,
    /// `--maximum-retry` (flintlock's default is 10).
    pub(crate) maximum_retry: Option<u32>,
}

/// Which server a test runs on.
pub(crate) enum Backend {
    /// The hollow host.
    Hollow,
    /// The real flintlockd.
    Real {
        test: &'static str,
        binaries: Binaries,
        tools: ContainerdTools,
    },
}

impl Backend {
    /// The real server, when flintlockd and containerd are there (else skipped, or failing in CI).
    pub(crate) fn real(test: &'static str) -> Option<Backend> {
        let (binaries, tools) = capmvm_upstream::flintlock::for_test(test)?;
        Some(Backend::Real {
            test,
            binaries,
            tools,
        })
    }

    /// Starts a server with `options`.
    pub(crate) async fn start(&self, options: Options) -> Server {
        let pki = options.tls.map(|_| TestPki::generate().expect("test PKI"));
        let kind = match self {
            Backend::Hollow => {
                let config = HollowConfig {
                    // flintlockd's first attempt starts as soon as the create is saved.
                    provision_time: Duration::from_millis(5),
                    delete_time: Duration::from_millis(10),
                    time_scale: 1.0,
                    max_retry: options.maximum_retry.map_or(10, |r| r as i32),
                    registry_reachable: false,
                    basic_auth_token: options.token.map(SecretString::new),
                    tls: options.tls.zip(pki.as_ref()).map(|(tls, pki)| {
                        let mut server = pki.server_tls(tls == Tls::ClientValidated);
                        if tls == Tls::ServerOnly {
                            server.client_ca_pem = None;
                        }
                        server
                    }),
                    ..HollowConfig::default()
                };
                Kind::Hollow(HollowHost::start(config).await.expect("hollow host starts"))
            }
            Backend::Real {
                test,
                binaries,
                tools,
            } => {
                // Short: containerd's socket paths must stay under 104 bytes.
                let dir = std::env::temp_dir().join(format!(
                    "capmvm-fl-{}-{}",
                    std::process::id(),
                    NEXT_DIR.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                ));
                tracing_dir_note(&dir, test);
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::create_dir_all(&dir).expect("test directory");
                let tls = match (options.tls, &pki) {
                    (Some(tls), Some(pki)) => {
                        let pem = dir.join("pki");
                        pki.write_to(&pem).expect("PEM files");
                        Some(FlintlockdTls {
                            cert: pem.join("server.crt"),
                            key: pem.join("server.key"),
                            client_ca: (tls != Tls::ServerOnly).then(|| pem.join("ca.crt")),
                            validate_client: tls == Tls::ClientValidated,
                        })
                    }
                    _ => None,
                };
                let flintlockd_options = FlintlockdOptions {
                    basic_auth_token: options.token.map(str::to_owned),
                    tls,
                    maximum_retry: options.maximum_retry,
                };
                let real = Flintlockd::start(binaries, tools, &dir, &flintlockd_options)
                    .await
                    .expect("flintlockd starts");
                Kind::Real(Some(Box::new(real)), dir)
            }
        };
        Server {
            kind,
            pki,
            options,
            pool: ClientPool::new(PoolOptions {
                connect_timeout: Duration::from_secs(5),
                call_timeout: Duration::from_secs(10),
                ..PoolOptions::default()
            }),
        }
    }
}

static NEXT_DIR: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Says which test a server's folder belongs to (its logs are there while it runs).
fn tracing_dir_note(dir: &std::path::Path, test: &str) {
    eprintln!("{test}: real flintlockd in {}", dir.display());
}

enum Kind {
    Hollow(HollowHandle),
    Real(Option<Box<Flintlockd>>, PathBuf),
}

/// One server for one test.
pub(crate) struct Server {
    kind: Kind,
    pki: Option<TestPki>,
    options: Options,
    pool: ClientPool,
}

impl Drop for Server {
    fn drop(&mut self) {
        // A test that failed before `stop`: kill the processes, then remove their folder.
        if let Kind::Real(real, dir) = &mut self.kind {
            drop(real.take());
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl Server {
    /// `127.0.0.1:<port>`.
    pub(crate) fn endpoint(&self) -> String {
        match &self.kind {
            Kind::Hollow(host) => host.endpoint(),
            Kind::Real(real, _) => real.as_ref().map(|r| r.endpoint()).unwrap_or_default(),
        }
    }

    /// The test PKI of a TLS server.
    pub(crate) fn pki(&self) -> &TestPki {
        self.pki.as_ref().expect("a server started with TLS")
    }

    /// What a client configured as the server expects needs: its token, and with TLS the CA (and
    /// the client certificate when the server validates clients).
    pub(crate) fn host_config(&self) -> HostConfig {
        HostConfig {
            basic_auth_token: self.options.token.map(SecretString::new),
            tls: self
                .options
                .tls
                .zip(self.pki.as_ref())
                .map(|(tls, pki)| pki.client_tls(tls == Tls::ClientValidated)),
            ..HostConfig::new(self.endpoint())
        }
    }

    /// A client configured as [`Server::host_config`] says.
    pub(crate) fn client(&self) -> FlintlockClient {
        self.client_for(&self.host_config())
    }

    /// A client with another configuration (a wrong token, no TLS ...).
    pub(crate) fn client_for(&self, host: &HostConfig) -> FlintlockClient {
        self.pool.client(host).expect("client")
    }

    /// Stops the server; the real one must leave nothing behind.
    pub(crate) async fn stop(mut self) {
        match &mut self.kind {
            Kind::Hollow(_) => {}
            Kind::Real(real, _) => {
                if let Some(real) = real.take() {
                    let leftovers = real.stop().await.expect("flintlockd stops");
                    assert!(leftovers.is_empty(), "left behind: {leftovers:?}");
                }
            }
        }
    }
}
