//! End to end, cluster-level: a MicrovmCluster outlives its machines (namespace deletion, deleting it
//! first), credentials are watched and reported per cluster, host observers are per credentials, and
//! microVMs left behind are reported. The operator runs in a process of its own against the API
//! emulator, the CAPI stand-in and hollow hosts.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use capmvm_api::keys::{ABANDON_MICROVM_ANNOTATION, CREDENTIALS_FINALIZER};
use capmvm_api::{HostEndpoint, MicrovmCluster, MicrovmMachine};
use capmvm_flintlock::MicrovmState;
use capmvm_sim::world::{HostAuth, World, WorldOptions, wait_for};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(90);
const POLL: Duration = Duration::from_millis(200);
const TOKEN: &str = "tenant-token-0001";

fn options(hosts: usize, host_poll: &str) -> WorldOptions {
    let mut o = WorldOptions::new(
        hosts,
        Duration::from_millis(300),
        PathBuf::from(env!("CARGO_BIN_EXE_capmvm-sim")),
    );
    o.auth = HostAuth::Token(TOKEN.into());
    o.operator_flags = vec![
        format!("--host-poll-interval={host_poll}"),
        "--host-poll-interval-busy=200ms".into(),
        "--log-level=capmvm_operator=debug,info".into(),
    ];
    o
}

async fn world(options: WorldOptions) -> World {
    let mut w = World::start(options).await.expect("world starts");
    w.start_operator(&[]).expect("operator starts");
    w
}

async fn create_namespace(w: &World, name: &str) {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<Namespace>::all(w.client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
}

/// A token Secret for every host of the world, holding `token`.
async fn token_secret(w: &World, ns: &str, name: &str, token: &str) {
    token_secret_of_type(w, ns, name, token, None).await;
}

/// [`token_secret`], of Secret type `type_`.
async fn token_secret_of_type(w: &World, ns: &str, name: &str, token: &str, type_: Option<&str>) {
    let data: BTreeMap<String, ByteString> = w
        .endpoints()
        .iter()
        .map(|e| {
            let ep: HostEndpoint = e.parse().unwrap();
            (ep.secret_key(), ByteString(token.as_bytes().to_vec()))
        })
        .collect();
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        data: Some(data),
        type_: type_.map(String::from),
        ..Default::default()
    };
    let api = Api::<Secret>::namespaced(w.client.clone(), ns);
    match api.get_opt(name).await.unwrap() {
        Some(_) => {
            api.replace(name, &PostParams::default(), &secret)
                .await
                .unwrap();
        }
        None => {
            api.create(&PostParams::default(), &secret).await.unwrap();
        }
    }
}

/// Applies the demo cluster `cluster` in namespace `ns` with `workers` workers and no control plane,
/// its hosts' tokens in Secret `secret`.
async fn apply_cluster(w: &World, ns: &str, cluster: &str, workers: usize, secret: &str) {
    let vars = [
        ("NAMESPACE", ns.to_string()),
        ("CLUSTER_NAME", cluster.to_string()),
        ("CONTROL_PLANE_MACHINE_COUNT", "0".to_string()),
        ("WORKER_MACHINE_COUNT", workers.to_string()),
    ];
    let secret = secret.to_string();
    w.apply_demo_cluster(&vars, move |objects| {
        for o in objects.iter_mut() {
            if o.types.as_ref().unwrap().kind == "MicrovmCluster" {
                o.data["spec"]["placement"]["staticPool"]["basicAuthSecret"] = json!(secret);
            }
        }
    })
    .await
    .unwrap();
}

async fn machines(w: &World, ns: &str) -> Vec<MicrovmMachine> {
    w.microvm_machines(ns).await.unwrap()
}

fn condition<'a>(conditions: &'a [Condition], t: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == t)
}

fn machine_ready(m: &MicrovmMachine) -> bool {
    m.status
        .as_ref()
        .and_then(|s| condition(&s.conditions, "Ready"))
        .is_some_and(|c| c.status == "True")
}

async fn wait_machines_ready(w: &World, ns: &str, n: usize) {
    wait_for(
        &format!(
            "{n} ready machines in {ns} (log {})",
            w.operator_log().display()
        ),
        WAIT,
        POLL,
        || async {
            let ms = w.microvm_machines(ns).await?;
            Ok((ms.len() == n && ms.iter().all(machine_ready)).then_some(()))
        },
    )
    .await
    .unwrap();
}

async fn microvm_cluster(w: &World, ns: &str, name: &str) -> Option<MicrovmCluster> {
    Api::<MicrovmCluster>::namespaced(w.client.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
}

/// The demo's MicrovmCluster, as (namespace, name).
const DEMO: (&str, &str) = ("default", "demo");

/// Waits until the MicrovmCluster `(ns, name)`'s condition `t` has `status` and `reason`; returns
/// its message.
async fn wait_cluster_condition(
    w: &World,
    (ns, name): (&str, &str),
    (t, status, reason): (&str, &str, &str),
) -> String {
    wait_for(
        &format!("MicrovmCluster {ns}/{name} {t}={status} ({reason})"),
        WAIT,
        POLL,
        || async {
            let mc = Api::<MicrovmCluster>::namespaced(w.client.clone(), ns)
                .get_opt(name)
                .await?;
            Ok(mc
                .and_then(|mc| mc.status)
                .and_then(|s| condition(&s.conditions, t).cloned())
                .filter(|c| c.status == status && c.reason == reason)
                .map(|c| c.message))
        },
    )
    .await
    .unwrap()
}

/// Whether a Warning event with `reason` was recorded about `name` in `ns`.
async fn warned(w: &World, (ns, name): (&str, &str), reason: &str) -> bool {
    Api::<Event>::namespaced(w.client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .any(|e| e.reason.as_deref() == Some(reason))
}

/// MicroVMs of namespace `ns` on any host, not being deleted.
fn live_vms_in(w: &World, ns: &str) -> usize {
    w.all_vms()
        .into_iter()
        .filter(|(_, vm)| vm.state() != MicrovmState::Deleting && vm.microvm.spec.namespace == ns)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_namespace_with_a_running_cluster_leaves_no_microvm() {
    let w = world(options(2, "2s")).await;
    create_namespace(&w, "tenant-a").await;
    token_secret(&w, "tenant-a", "tokens", TOKEN).await;
    apply_cluster(&w, "tenant-a", "alpha", 3, "tokens").await;
    wait_machines_ready(&w, "tenant-a", 3).await;
    assert_eq!(live_vms_in(&w, "tenant-a"), 3);
    // The token Secret is kept for the machines' deletion.
    let secret = Api::<Secret>::namespaced(w.client.clone(), "tenant-a")
        .get("tokens")
        .await
        .unwrap();
    assert!(
        secret
            .finalizers()
            .iter()
            .any(|f| f == CREDENTIALS_FINALIZER)
    );

    // Everything in the namespace is deleted at once: Secrets, the MicrovmCluster, the machines.
    Api::<Namespace>::all(w.client.clone())
        .delete("tenant-a", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(
        &format!(
            "namespace tenant-a gone with no microVM left (log {})",
            w.operator_log().display()
        ),
        WAIT,
        POLL,
        || async {
            let ns = Api::<Namespace>::all(w.client.clone())
                .get_opt("tenant-a")
                .await?;
            let vms = w
                .all_vms()
                .into_iter()
                .filter(|(_, vm)| vm.microvm.spec.namespace == "tenant-a")
                .count();
            Ok((ns.is_none() && vms == 0).then_some(()))
        },
    )
    .await
    .unwrap();
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_microvm_cluster_deleted_first_serves_its_machines_deletion_then_goes() {
    let w = world(options(2, "2s")).await;
    token_secret(&w, "default", "tokens", TOKEN).await;
    apply_cluster(&w, "default", "demo", 2, "tokens").await;
    wait_machines_ready(&w, "default", 2).await;

    Api::<MicrovmCluster>::namespaced(w.client.clone(), "default")
        .delete("demo", &DeleteParams::default())
        .await
        .unwrap();
    let message = wait_cluster_condition(&w, DEMO, ("Ready", "False", "WaitingForMachines")).await;
    assert!(message.contains("2 MicrovmMachine(s)"), "{message}");
    // The Secret cannot go while a machine needs it either.
    Api::<Secret>::namespaced(w.client.clone(), "default")
        .delete("tokens", &DeleteParams::default())
        .await
        .unwrap();

    Api::<capmvm_api::capi::Cluster>::namespaced(w.client.clone(), "default")
        .delete("demo", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(
        &format!(
            "machines, microVMs, the MicrovmCluster and the Secret gone (log {})",
            w.operator_log().display()
        ),
        WAIT,
        POLL,
        || async {
            let mc = microvm_cluster(&w, "default", "demo").await;
            let secret = Api::<Secret>::namespaced(w.client.clone(), "default")
                .get_opt("tokens")
                .await?;
            let ms = w.microvm_machines("default").await?;
            Ok(
                (mc.is_none() && secret.is_none() && ms.is_empty() && w.all_vms().is_empty())
                    .then_some(()),
            )
        },
    )
    .await
    .unwrap();
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_watched_and_reported_on_the_cluster() {
    // A long host poll: a corrected token must not wait for it.
    let w = world(options(2, "8s")).await;
    apply_cluster(&w, "default", "demo", 1, "tokens").await;

    // No Secret: the cluster is not Ready, with a Warning event.
    let message = wait_cluster_condition(&w, DEMO, ("Ready", "False", "MissingCredentials")).await;
    assert!(message.contains("\"tokens\" not found"), "{message}");
    assert!(warned(&w, DEMO, "MissingCredentials").await);

    // A wrong token: an authentication failure, not "unreachable".
    token_secret(&w, "default", "tokens", "wrong-token").await;
    let message =
        wait_cluster_condition(&w, DEMO, ("Ready", "False", "HostAuthenticationFailed")).await;
    assert!(message.contains("refused the credentials"), "{message}");
    assert!(!message.contains("wrong-token"), "never the token");
    assert!(warned(&w, DEMO, "HostAuthenticationFailed").await);
    assert_eq!(live_vms_in(&w, "default"), 0);

    // Corrected: picked up from the Secret's watch event, well within one host poll.
    let fixed = Instant::now();
    token_secret(&w, "default", "tokens", TOKEN).await;
    wait_cluster_condition(&w, DEMO, ("Ready", "True", "Ready")).await;
    let took = fixed.elapsed();
    assert!(
        took < Duration::from_secs(8),
        "the corrected token took {took:?}"
    );
    wait_machines_ready(&w, "default", 1).await;
    let log = std::fs::read_to_string(w.operator_log()).unwrap();
    assert!(!log.contains("wrong-token") && !log.contains(TOKEN));
    w.shutdown().await;
}

/// The operator does not watch Cluster API's own Secrets (one per machine); a credential of that
/// type is refused with a message that says how to fix it, and the fix is picked up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_secret_of_cluster_apis_type_is_refused_by_name() {
    let w = world(options(2, "8s")).await;
    token_secret_of_type(
        &w,
        "default",
        "tokens",
        TOKEN,
        Some("cluster.x-k8s.io/secret"),
    )
    .await;
    apply_cluster(&w, "default", "demo", 1, "tokens").await;
    let message = wait_cluster_condition(&w, DEMO, ("Ready", "False", "MissingCredentials")).await;
    assert!(
        message.contains("\"tokens\" has type cluster.x-k8s.io/secret")
            && message.contains("Opaque"),
        "{message}"
    );
    assert_eq!(live_vms_in(&w, "default"), 0);

    // The type cannot be changed: the user recreates the Secret as Opaque.
    Api::<Secret>::namespaced(w.client.clone(), "default")
        .delete("tokens", &Default::default())
        .await
        .unwrap();
    token_secret(&w, "default", "tokens", TOKEN).await;
    wait_cluster_condition(&w, DEMO, ("Ready", "True", "Ready")).await;
    wait_machines_ready(&w, "default", 1).await;
    w.shutdown().await;
}

/// `capmvm_host_observer_starts_total` by host, from the operator's `/metrics`.
async fn observer_starts(w: &World) -> BTreeMap<String, u64> {
    let metrics = w.operator().unwrap().scrape_metrics().await.unwrap();
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("capmvm_host_observer_starts_total{host=\""))
        .filter_map(|l| {
            let (host, count) = l.split_once("\"} ")?;
            Some((host.to_string(), count.trim().parse().ok()?))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_sees_a_host_only_through_its_own_credentials() {
    let w = world(options(2, "2s")).await;
    create_namespace(&w, "tenant-b").await;
    token_secret(&w, "default", "tokens", TOKEN).await;
    token_secret(&w, "tenant-b", "tokens", "not-the-token").await;
    apply_cluster(&w, "default", "demo", 2, "tokens").await;
    apply_cluster(&w, "tenant-b", "beta", 1, "tokens").await;
    wait_machines_ready(&w, "default", 2).await;

    // Same hosts, other credentials: beta is refused, and never reads what demo's token lists.
    let message = wait_cluster_condition(
        &w,
        ("tenant-b", "beta"),
        ("HostsReachable", "False", "HostAuthenticationFailed"),
    )
    .await;
    assert!(message.contains("0 of 2 hosts reachable"), "{message}");
    let demo = microvm_cluster(&w, "default", "demo").await.unwrap();
    let demo_ready = condition(&demo.status.unwrap().conditions, "Ready")
        .cloned()
        .unwrap();
    assert_eq!(demo_ready.status, "True", "{demo_ready:?}");
    let beta_machines = machines(&w, "tenant-b").await;
    assert_eq!(beta_machines.len(), 1);
    assert!(!machine_ready(&beta_machines[0]));
    assert_eq!(live_vms_in(&w, "tenant-b"), 0);

    // Both observers stay: demo's machines keep being observed while beta is refused. Each host
    // has had exactly one observer per tenant's credentials, and no more start while both run.
    let starts = observer_starts(&w).await;
    assert_eq!(
        starts,
        w.endpoints().iter().map(|e| (e.clone(), 2)).collect(),
        "one observer per host and credentials"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(observer_starts(&w).await, starts, "no observer restarted");
    assert_eq!(
        machines(&w, "default")
            .await
            .iter()
            .filter(|m| machine_ready(m))
            .count(),
        2
    );
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_microvm_left_behind_is_reported_not_deleted() {
    let w = world(options(2, "2s")).await;
    token_secret(&w, "default", "tokens", TOKEN).await;
    apply_cluster(&w, "default", "demo", 2, "tokens").await;
    // A second cluster of the namespace on the same hosts: what demo's machines leave behind is
    // demo's to report (the microVM's meta-data names its cluster), not beta's too.
    apply_cluster(&w, "default", "beta", 1, "tokens").await;
    wait_machines_ready(&w, "default", 3).await;
    // Abandon one machine's microVM, then delete the machine.
    let api = Api::<MicrovmMachine>::namespaced(w.client.clone(), "default");
    let victim = machines(&w, "default")
        .await
        .into_iter()
        .map(|m| m.name_any())
        .find(|n| n.starts_with("demo-"))
        .unwrap();
    api.patch(
        &victim,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {ABANDON_MICROVM_ANNOTATION: "true"}}})),
    )
    .await
    .unwrap();
    api.delete(&victim, &DeleteParams::default()).await.unwrap();

    let message = wait_cluster_condition(
        &w,
        DEMO,
        ("OrphanedMicrovms", "True", "OrphanedMicrovmsFound"),
    )
    .await;
    assert!(message.contains(&victim), "{message}");
    assert!(warned(&w, DEMO, "OrphanedMicrovm").await);
    let metrics = w.operator().unwrap().scrape_metrics().await.unwrap();
    assert!(
        metrics.contains("capmvm_orphaned_microvms{cluster=\"default/demo\"} 1"),
        "{metrics}"
    );
    // beta lists the same hosts and has looked since (a host's change wakes every cluster using
    // it), and reports nothing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let beta = microvm_cluster(&w, "default", "beta").await.unwrap();
    let orphaned = condition(&beta.status.unwrap().conditions, "OrphanedMicrovms")
        .cloned()
        .unwrap();
    assert_eq!(orphaned.status, "False", "{orphaned:?}");
    assert!(!warned(&w, ("default", "beta"), "OrphanedMicrovm").await);
    let metrics = w.operator().unwrap().scrape_metrics().await.unwrap();
    assert!(
        metrics.contains("capmvm_orphaned_microvms{cluster=\"default/beta\"} 0"),
        "{metrics}"
    );
    // Left running: only a person decides.
    assert!(
        w.all_vms()
            .iter()
            .any(|(_, vm)| vm.microvm.spec.id == victim && vm.state() == MicrovmState::Created)
    );
    w.shutdown().await;
}
