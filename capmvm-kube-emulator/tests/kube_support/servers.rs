//! The two servers the contract suite runs against: the emulator, and the real kube-apiserver (with its
//! own etcd) that `capmvm-upstream` starts from the binaries `hack/upstream.sh build` made. Each test
//! gets a fresh server of either kind, so a test sees only its own objects and CRDs on both.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use capmvm_kube_emulator::{Emulator, EmulatorHandle, EmulatorOptions};
use capmvm_upstream::tools::Kubectl;
use capmvm_upstream::{
    ApiServerOptions, Binaries, ControlPlaneComponent, Etcd, KubeApiServer, ScratchDir,
};
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::Api;

/// Declares the contract tests that run on both servers: for each `async fn name(server: Server)` it
/// makes `emulator::name` (a fresh emulator) and `real::name` (a fresh kube-apiserver, skipped locally
/// when the upstream binaries are not built, a failure under CI).
#[macro_export]
macro_rules! on_both_servers {
    ($($test:ident),* $(,)?) => {
        /// The contract tests on the emulator.
        mod emulator {
            $(
                #[tokio::test]
                async fn $test() {
                    super::$test($crate::kube_support::servers::Server::emulator().await).await
                }
            )*
        }
        /// The same tests on the real kube-apiserver.
        mod real {
            $(
                #[tokio::test]
                async fn $test() {
                    let Some(server) =
                        $crate::kube_support::servers::Server::real(stringify!($test)).await
                    else {
                        return;
                    };
                    super::$test(server).await
                }
            )*
        }
        /// The names of the tests that run on both servers (the README's count).
        #[allow(dead_code)]
        const ON_BOTH_SERVERS: &[&str] = &[$(stringify!($test)),*];
    };
}

/// A server for one test.
pub struct Server {
    client: Client,
    kind: Kind,
    /// Scratch space of the test (kubeconfigs for kubectl), removed with the server.
    scratch: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

enum Kind {
    Emulator(EmulatorHandle),
    Real(Box<Real>),
}

/// A kube-apiserver with its own etcd, in a directory removed when the test ends.
struct Real {
    // Dropped in this order: the controllers, the API server, then etcd (each kills its process).
    controllers: Mutex<Option<ControlPlaneComponent>>,
    api: KubeApiServer,
    etcd: Etcd,
    binaries: Binaries,
    /// Last: removed once the processes writing into it are gone.
    _dir: ScratchDir,
}

impl Server {
    /// A fresh emulator with default options.
    pub async fn emulator() -> Server {
        Self::emulator_with(EmulatorOptions::default()).await
    }

    /// A fresh emulator.
    pub async fn emulator_with(options: EmulatorOptions) -> Server {
        let emulator = Emulator::start(options).await.expect("emulator starts");
        let client = emulator.client().expect("client");
        Server {
            client,
            kind: Kind::Emulator(emulator),
            scratch: scratch_dir("emulator"),
        }
    }

    /// A fresh kube-apiserver on a fresh etcd, once its built-in namespaces exist; `None` (the test
    /// skipped) when the upstream binaries are not built, outside CI.
    pub async fn real(test: &str) -> Option<Server> {
        let binaries = Binaries::for_test(test, &["etcd", "kube-apiserver"])?;
        // Removed even when a start below fails.
        let scratch =
            ScratchDir::create(&format!("capmvm-contract-{test}")).expect("test directory");
        let dir = scratch.path();
        let etcd = Etcd::start(&binaries, dir).await.expect("etcd starts");
        let mut options = ApiServerOptions::new("contract", dir, &etcd.url());
        options.audit = false;
        let api = KubeApiServer::start(&binaries, options)
            .await
            .expect("kube-apiserver starts");
        let client = api.client().await.expect("client of the API server");
        // The system namespaces controller creates these just after the server is ready.
        let namespaces: Api<Namespace> = Api::all(client.clone());
        for _ in 0..300 {
            let mut have = 0;
            for ns in ["default", "kube-system", "kube-public"] {
                if namespaces.get_opt(ns).await.ok().flatten().is_some() {
                    have += 1;
                }
            }
            if have == 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Some(Server {
            client,
            scratch: scratch_dir(test),
            kind: Kind::Real(Box::new(Real {
                controllers: Mutex::new(None),
                api,
                etcd,
                binaries,
                _dir: scratch,
            })),
        })
    }

    /// A client of the server (retrying as kube-rs does by default).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Whether this is the real kube-apiserver.
    pub fn is_real(&self) -> bool {
        matches!(self.kind, Kind::Real(_))
    }

    /// The emulator, for what only it has (request counters, statistics).
    pub fn emulator_handle(&self) -> Option<&EmulatorHandle> {
        match &self.kind {
            Kind::Emulator(e) => Some(e),
            Kind::Real(_) => None,
        }
    }

    /// A client that does not retry 429/503/504 answers (kube-rs does by default), to see what the
    /// server says.
    pub async fn client_without_retries(&self) -> Client {
        let mut config = match &self.kind {
            Kind::Emulator(e) => kube::Config::new(e.base_url().parse().expect("url")),
            Kind::Real(r) => {
                let kubeconfig =
                    kube::config::Kubeconfig::read_from(r.api.kubeconfig()).expect("kubeconfig");
                kube::Config::from_custom_kubeconfig(
                    kubeconfig,
                    &kube::config::KubeConfigOptions::default(),
                )
                .await
                .expect("config")
            }
        };
        config.default_retry = false;
        Client::try_from(config).expect("client")
    }

    /// The pinned kubectl (from the upstream binaries), talking to this server; `None` (the test
    /// skipped) when it is not built, outside CI.
    pub fn kubectl(&self, test: &str) -> Option<Kubectl> {
        let binaries = Binaries::for_test(test, &["kubectl"])?;
        std::fs::create_dir_all(&self.scratch).expect("scratch directory");
        let kubeconfig = self.kubeconfig(&self.scratch);
        Some(Kubectl::new(&binaries, &kubeconfig).expect("kubectl"))
    }

    /// A kubeconfig for kubectl (written under `dir` for the emulator).
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        match &self.kind {
            Kind::Emulator(e) => {
                let path = dir.join("kubeconfig");
                e.write_kubeconfig(&path).expect("kubeconfig");
                path
            }
            Kind::Real(r) => r.api.kubeconfig().to_path_buf(),
        }
    }

    /// Forgets the history up to now, as etcd's compaction does (on the real server, etcd's own).
    pub async fn compact(&self) {
        match &self.kind {
            Kind::Emulator(e) => e.compact(),
            Kind::Real(r) => {
                let url = r.etcd.url();
                let range =
                    etcd_post(&url, "/v3/kv/range", &serde_json::json!({"key": "AA=="})).await;
                let revision = range["header"]["revision"].clone();
                etcd_post(
                    &url,
                    "/v3/kv/compaction",
                    &serde_json::json!({"revision": revision, "physical": true}),
                )
                .await;
            }
        }
    }

    /// The controllers that act on deletions: the garbage collector and the namespace controller.
    /// The emulator runs both itself; the real server needs kube-controller-manager, started here
    /// (after the test's CRDs exist, so its garbage collector watches their objects from the start
    /// rather than after its 30-second discovery period).
    pub async fn start_controllers(&self) {
        let Kind::Real(r) = &self.kind else {
            return;
        };
        let kcm = ControlPlaneComponent::controller_manager(
            &r.binaries,
            &r.api,
            "garbage-collector-controller,namespace-controller",
            &[],
        )
        .await
        .expect("kube-controller-manager starts");
        *r.controllers.lock().expect("lock") = Some(kcm);
    }
}

/// `POST path` with a JSON body to etcd's HTTP gateway; the answer's JSON.
async fn etcd_post(url: &str, path: &str, body: &serde_json::Value) -> serde_json::Value {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let host = url.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(host).await.expect("etcd");
    let body = body.to_string();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.expect("read");
    let json = answer.split("\r\n\r\n").nth(1).unwrap_or("");
    // A chunked answer carries its JSON between the chunk sizes.
    let start = json.find('{').unwrap_or(0);
    let end = json.rfind('}').map_or(json.len(), |e| e + 1);
    serde_json::from_str(&json[start..end]).unwrap_or_else(|e| panic!("etcd {path}: {e}: {answer}"))
}

fn scratch_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "capmvm-contract-scratch-{}-{name}-{}",
        std::process::id(),
        unique()
    ))
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}
