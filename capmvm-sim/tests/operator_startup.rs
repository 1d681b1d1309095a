//! Start-up of the operator against what a management cluster may hold: a CAPI Machine of a shape the
//! operator does not model, a watch whose list the API server refuses, and no CAPI v1beta2 at all.
//! Every assertion reads what a user would see: machines getting ready, `/readyz`, the exit error.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use capmvm_operator::config::Flags;
use capmvm_sim::kube::{Emulator, EmulatorOptions};
use capmvm_sim::world::{World, WorldOptions, free_port, http_get, wait_for};
use clap::Parser;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

const NS: &str = "default";
const WAIT: Duration = Duration::from_secs(90);
const POLL: Duration = Duration::from_millis(200);

fn options() -> WorldOptions {
    let mut o = WorldOptions::new(
        1,
        Duration::from_millis(300),
        PathBuf::from(env!("CARGO_BIN_EXE_capmvm-sim")),
    );
    o.operator_flags = vec![
        "--host-poll-interval=2s".into(),
        "--host-poll-interval-busy=200ms".into(),
    ];
    o
}

/// Flags of an in-process operator serving `/readyz` on `health`.
fn flags(health: std::net::SocketAddr) -> Flags {
    flags_with(health, &[])
}

fn flags_with(health: std::net::SocketAddr, extra: &[&str]) -> Flags {
    let mut args = vec![
        "capmvm-operator".to_string(),
        format!("--health-addr={health}"),
        "--diagnostics-address=".to_string(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    Flags::parse_from(args)
}

const LEADER_ELECT: [&str; 4] = [
    "--leader-elect",
    "--leader-elect-lease-duration=15s",
    "--leader-elect-renew-deadline=10s",
    "--leader-elect-retry-period=1s",
];

/// An operator run in this process, so a test can hand it a client of its own.
struct InProcess {
    health: std::net::SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    run: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl InProcess {
    /// Runs the operator with `client`, serving `/readyz` on a free port, with `extra` flags.
    fn start(client: kube::Client, extra: &[&str]) -> InProcess {
        let health = free_port().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let run = tokio::spawn(capmvm_operator::run(
            flags_with(health, extra),
            client,
            async {
                let _ = stopped.await;
            },
        ));
        InProcess { health, stop, run }
    }

    /// The first `/readyz` answer `wanted` accepts (none while the operator does not listen yet).
    async fn readyz_when(&self, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        wait_for(what, WAIT, POLL, || async {
            let Ok(response) = http_get(self.health, "/readyz").await else {
                return Ok(None);
            };
            Ok(wanted(&response).then_some(response))
        })
        .await
        .unwrap()
    }

    /// Waits for `/readyz` to answer 200 and asserts its body says ok.
    async fn ready(&self, what: &str) {
        let ready = self
            .readyz_when(what, |r| status_line(r).contains("200"))
            .await;
        assert!(ready.ends_with("ok"), "{ready}");
    }

    /// Asks it to stop; it must, cleanly, within 30 s.
    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(30), self.run)
            .await
            .expect("the operator stops")
            .unwrap()
            .unwrap();
    }
}

/// Creates a CAPI Machine whose `status.nodeInfo` is what a Kubernetes 1.33 kubelet reports.
async fn machine_with_node_swap(client: &kube::Client, name: &str) {
    let resource = ApiResource::erase::<capmvm_api::capi::Machine>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &resource);
    let machine = DynamicObject::new(name, &resource).data(json!({"spec": {
        "clusterName": "elsewhere",
        "bootstrap": {"dataSecretName": format!("{name}-bootstrap")},
        "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": name},
    }}));
    api.create(&PostParams::default(), &machine).await.unwrap();
    api.patch_status(
        name,
        &PatchParams::default(),
        // Every field a kubelet reports (CAPI's schema requires them all).
        &Patch::Merge(json!({"status": {"nodeInfo": {
            "architecture": "amd64",
            "bootID": "0c4c5b5e-5d1f-4d7e-9a47-0d9a1c0f3b11",
            "containerRuntimeVersion": "containerd://2.0.5",
            "kernelVersion": "6.8.0-60-generic",
            "kubeProxyVersion": "",
            "kubeletVersion": "v1.33.1",
            "machineID": "5f1c7c2e2d6b4f5c9e8a7b6c5d4e3f21",
            "operatingSystem": "linux",
            "osImage": "Ubuntu 24.04.2 LTS",
            "systemUUID": "4c4c4544-0042-3510-8051-b7c04f4e3732",
            "swap": {"capacity": 2_147_483_648_i64},
        }}})),
    )
    .await
    .unwrap();
}

fn status_line(response: &str) -> &str {
    response.lines().next().unwrap_or_default()
}

/// Seen on the demo: once one Machine carried `nodeInfo.swap`, the Machine watch could not list and
/// an operator started then never ran a controller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_started_beside_a_machine_with_node_swap_is_ready_and_reconciles() {
    let mut w = World::start(options()).await.unwrap();
    machine_with_node_swap(&w.client, "kubelet-1-33").await;
    let stored = Api::<DynamicObject>::namespaced_with(
        w.client.clone(),
        NS,
        &ApiResource::erase::<capmvm_api::capi::Machine>(&()),
    )
    .get("kubelet-1-33")
    .await
    .unwrap();
    assert_eq!(
        stored.data["status"]["nodeInfo"]["swap"]["capacity"], 2_147_483_648_i64,
        "the API keeps the field, as CAPI's CRD does"
    );

    w.start_operator(&[]).unwrap();
    let log = w.operator_log();
    let ready = wait_for(
        &format!("/readyz 200 (operator log: {})", log.display()),
        WAIT,
        POLL,
        || async {
            let response = match w.operator().unwrap().readyz().await {
                Ok(r) => r,
                Err(_) => return Ok(None), // not listening yet
            };
            Ok(status_line(&response).contains("200").then_some(response))
        },
    )
    .await
    .unwrap();
    assert!(ready.ends_with("ok"), "{ready}");

    w.apply_demo_cluster(
        &[
            ("CONTROL_PLANE_MACHINE_COUNT", "1".to_string()),
            ("WORKER_MACHINE_COUNT", "0".to_string()),
        ],
        |_| {},
    )
    .await
    .unwrap();
    wait_for(
        &format!("a ready MicrovmMachine (operator log: {})", log.display()),
        WAIT,
        POLL,
        || async {
            let machines = w.microvm_machines(NS).await?;
            let ready = machines.len() == 1
                && machines.iter().all(|m| {
                    m.status.as_ref().is_some_and(|s| {
                        s.conditions
                            .iter()
                            .any(|c| c.type_ == "Ready" && c.status == "True")
                    })
                });
            Ok(ready.then_some(()))
        },
    )
    .await
    .unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("watch error"), "{text}");
    w.stop_operator().await;
    w.shutdown().await;
}

/// A client of the emulator whose Machine list and watch are refused with 403 while `refuse` is set,
/// as an API server answers a ServiceAccount whose ClusterRole lacks Machines.
fn refusing_machines(inner: kube::Client, refuse: Arc<AtomicBool>) -> kube::Client {
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let inner = inner.clone();
        let refuse = refuse.load(Ordering::SeqCst);
        async move {
            if refuse && request.uri().path() == "/apis/cluster.x-k8s.io/v1beta2/machines" {
                let body = json!({
                    "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
                    "message": "machines.cluster.x-k8s.io is forbidden: User \"system:serviceaccount:capmvm-system:capmvm-manager\" cannot list resource \"machines\" in API group \"cluster.x-k8s.io\" at the cluster scope",
                });
                let response = http::Response::builder()
                    .status(403)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(body.to_string().into_bytes()))
                    .unwrap();
                return Ok::<_, kube::Error>(response);
            }
            inner.send(request).await
        }
    });
    kube::Client::new(service, NS)
}

/// The leader (the only candidate) cannot list Machines: it is not ready and says why; a standby
/// beside it stays ready; once the list is allowed the leader becomes ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_fails_naming_the_cache_while_its_list_is_refused() {
    let w = World::start(options()).await.unwrap();
    let refuse = Arc::new(AtomicBool::new(true));
    let client = refusing_machines(w.client.clone(), refuse.clone());
    let operator = InProcess::start(client, &LEADER_ELECT);

    let refused = operator
        .readyz_when("/readyz naming the Machine cache", |r| {
            r.contains("Machine (last error")
        })
        .await;
    assert!(status_line(&refused).contains("503"), "{refused}");
    assert!(refused.contains("watch caches not synced"), "{refused}");
    assert!(refused.contains("forbidden"), "{refused}");

    let standby = InProcess::start(w.client.clone(), &LEADER_ELECT);
    // Ready once it is a candidate (before that it is starting, as any operator).
    let standing_by = standby
        .readyz_when("the standby's /readyz", |r| r.contains("standing by"))
        .await;
    assert!(status_line(&standing_by).contains("200"), "{standing_by}");
    assert!(standing_by.contains("standing by"), "{standing_by}");
    standby.stop().await;

    // Once the list is allowed, the watcher's retry syncs the cache and the operator becomes ready.
    refuse.store(false, Ordering::SeqCst);
    operator.ready("/readyz 200 once the list is allowed").await;
    operator.stop().await;
    w.shutdown().await;
}

/// A watch that fails for good after its first list (the ServiceAccount loses its RBAC for Machines:
/// every renewal of the watch is refused) is not only logged: once the Machine cache has gone two
/// watch timeouts without a successful list, watch or event, `/readyz` fails naming it and its last
/// error; when the watch is allowed again it recovers by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_fails_naming_a_cache_whose_watch_fails_after_its_first_list_and_recovers() {
    let w = World::start(options()).await.unwrap();
    let refuse = Arc::new(AtomicBool::new(false));
    let client = refusing_machines(w.client.clone(), refuse.clone());
    let operator = InProcess::start(client, &["--watch-timeout=2s"]);
    operator.ready("/readyz 200 after the first lists").await;

    // RBAC taken away: the Machine watch's next renewal, and every retry, is refused.
    refuse.store(true, Ordering::SeqCst);
    let refused_at = Instant::now();
    let stale = operator
        .readyz_when("/readyz naming the stale Machine cache", |r| {
            r.contains("stale")
        })
        .await;
    assert!(status_line(&stale).contains("503"), "{stale}");
    assert!(
        stale.contains("Machine (no successful list, watch or event for"),
        "{stale}"
    );
    assert!(stale.contains("forbidden"), "{stale}");
    assert!(
        !stale.contains("MicrovmMachine ("),
        "only the failing cache: {stale}"
    );
    // Not before the bound (two watch timeouts after the last successful answer).
    assert!(refused_at.elapsed() >= Duration::from_secs(3), "{stale}");

    // Allowed again: the watcher's next retry succeeds and readiness comes back by itself.
    refuse.store(false, Ordering::SeqCst);
    operator
        .ready("/readyz 200 once the watch is allowed again")
        .await;
    operator.stop().await;
    w.shutdown().await;
}

/// Forwards connections on `front` to `back` until aborted: the API server's address, which answers
/// only while this runs (a closed port refuses connections, as a server that is down).
async fn forward(front: std::net::SocketAddr, back: std::net::SocketAddr) {
    let listener = tokio::net::TcpListener::bind(front).await.unwrap();
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            if let Ok(mut outbound) = tokio::net::TcpStream::connect(back).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
        });
    }
}

/// The API server is down when the operator starts (as during a control-plane upgrade): discovery
/// fails, and the operator retries with backoff instead of exiting, `/readyz` saying why; once the
/// API server answers again (with what it served before), it starts and becomes ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_waits_for_an_api_server_that_is_down_and_says_why() {
    // The API server, with CAPI and the provider's CRDs, behind an address that is down for now.
    let emulator = Emulator::start(EmulatorOptions::default()).await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(emulator.client().unwrap());
    for crd in capmvm_api::crds()
        .into_iter()
        .chain(capmvm_sim::capi::crds())
    {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let back: std::net::SocketAddr = emulator
        .base_url()
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let api = free_port().unwrap();
    let config = kube::Config::new(format!("http://{api}").parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    let operator = InProcess::start(client, &[]);
    let waiting = operator
        .readyz_when("/readyz saying discovery fails", |r| r.contains("retrying"))
        .await;
    assert!(status_line(&waiting).contains("503"), "{waiting}");
    assert!(waiting.contains("discovery"), "{waiting}");
    // Still retrying a while later, not gone.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!operator.run.is_finished(), "the operator gave up");

    // The API server is back.
    let up = tokio::spawn(forward(api, back));
    operator
        .ready("/readyz 200 once the API server answers")
        .await;
    operator.stop().await;
    up.abort();
    emulator.shutdown().await;
}

/// The operator run in-process against an emulator holding `crds`; its error, within `limit`.
async fn start_up_error(crds: Vec<CustomResourceDefinition>, limit: Duration) -> String {
    let emulator = Emulator::start(EmulatorOptions::default()).await.unwrap();
    let client = emulator.client().unwrap();
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds {
        api.create(&PostParams::default(), &crd).await.unwrap();
    }
    let started = Instant::now();
    let outcome = tokio::time::timeout(
        limit,
        capmvm_operator::run(flags(free_port().unwrap()), client, std::future::pending()),
    )
    .await
    .expect("the operator stops by itself, quickly");
    assert!(started.elapsed() < limit);
    emulator.shutdown().await;
    format!("{:#}", outcome.expect_err("the operator refuses to start"))
}

/// CAPI's CRDs as CAPI v1.10 served them: `v1beta1` only.
fn capi_v1beta1_only() -> Vec<CustomResourceDefinition> {
    capmvm_sim::capi::crds()
        .into_iter()
        .map(|mut crd| {
            for v in &mut crd.spec.versions {
                v.name = "v1beta1".to_string();
            }
            crd
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_capi_v1beta2_the_operator_exits_naming_the_capi_version() {
    let quick = Duration::from_secs(10);

    let error = start_up_error(capmvm_api::crds(), quick).await;
    assert!(
        error.contains("Cluster API v1.11 or later is required")
            && error.contains("cluster.x-k8s.io/v1beta2")
            && error.contains("found: cluster.x-k8s.io not installed")
            && error.contains("clusterctl"),
        "{error}"
    );

    let mut crds = capmvm_api::crds();
    crds.extend(capi_v1beta1_only());
    let error = start_up_error(crds, quick).await;
    assert!(
        error.contains("Cluster API v1.11 or later is required")
            && error.contains("found: cluster.x-k8s.io v1beta1 only")
            && error.contains("clusterctl upgrade"),
        "{error}"
    );

    // CAPI v1beta2 present, the provider's own CRDs not.
    let error = start_up_error(capmvm_sim::capi::crds(), quick).await;
    assert!(
        error.contains("the provider's CRDs are not served")
            && error.contains(
                "infrastructure.cluster.x-k8s.io/v1alpha2 microvmmachines, microvmmachinepools, microvmclusters, microvmmachinetemplates"
            )
            && error.contains("config/crd/bases"),
        "{error}"
    );
}
