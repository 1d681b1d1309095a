//! End to end, the control plane at 3 replicas and scaled 3 -> 5 -> 3 through the KubeadmControlPlane
//! stand-in, as real KCP does it: the `kubeadm init` Machine first, every join only once the control
//! plane is initialized and every Machine before it is provisioned, scale down one Machine at a time,
//! oldest first; each Machine gets one microVM and keeps it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod e2e_support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use capmvm_api::capi::Machine;
use capmvm_sim::capi::kcp::kubeadm_control_plane_resource;
use capmvm_sim::world::{World, wait_for};
use e2e_support::*;
use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

const KCP: &str = "demo-control-plane";

/// What was true when a control-plane Machine first appeared, or was first seen being deleted.
#[derive(Debug, Clone)]
struct Seen {
    machine: String,
    /// The KubeadmControlPlane's `status.initialization.controlPlaneInitialized` at that moment.
    initialized: bool,
    /// Other control-plane Machines not provisioned (or, for a deletion, also being deleted).
    others_busy: Vec<String>,
}

#[derive(Default)]
struct Record {
    created: Vec<Seen>,
    deleted: Vec<Seen>,
}

fn provisioned(m: &Machine) -> bool {
    m.status
        .as_ref()
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.infrastructure_provisioned)
        == Some(true)
}

async fn control_plane_machines(client: &kube::Client) -> Vec<Machine> {
    Api::<Machine>::namespaced(client.clone(), NS)
        .list(&ListParams::default().labels("cluster.x-k8s.io/control-plane"))
        .await
        .unwrap()
        .items
}

fn kcps(w: &World) -> Api<DynamicObject> {
    Api::namespaced_with(w.client.clone(), NS, &kubeadm_control_plane_resource())
}

/// Watches control-plane Machines and records, the moment each appears or starts being deleted,
/// what the control plane looked like.
fn record(w: &World) -> (Arc<Mutex<Record>>, tokio::task::JoinHandle<()>) {
    let record = Arc::new(Mutex::new(Record::default()));
    let client = w.client.clone();
    let out = record.clone();
    let task = tokio::spawn(async move {
        let machines: Api<Machine> = Api::namespaced(client.clone(), NS);
        let kcp_api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), NS, &kubeadm_control_plane_resource());
        let mut created = BTreeSet::new();
        let mut deleted = BTreeSet::new();
        let stream = watcher(
            machines,
            watcher::Config::default().labels("cluster.x-k8s.io/control-plane"),
        );
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            let (m, gone) = match event {
                Ok(watcher::Event::Apply(m) | watcher::Event::InitApply(m)) => (m, false),
                Ok(watcher::Event::Delete(m)) => (m, true),
                _ => continue,
            };
            let name = m.name_any();
            let deleting = gone || m.metadata.deletion_timestamp.is_some();
            if created.contains(&name) && (!deleting || deleted.contains(&name)) {
                continue;
            }
            let initialized = kcp_api.get(KCP).await.ok().is_some_and(|k| {
                k.data
                    .pointer("/status/initialization/controlPlaneInitialized")
                    .and_then(Value::as_bool)
                    == Some(true)
            });
            let all = control_plane_machines(&client).await;
            let others = all.iter().filter(|o| o.name_any() != name);
            let mut record = out.lock().unwrap();
            if created.insert(name.clone()) {
                record.created.push(Seen {
                    machine: name.clone(),
                    initialized,
                    others_busy: others
                        .clone()
                        .filter(|o| !provisioned(o))
                        .map(ResourceExt::name_any)
                        .collect(),
                });
            }
            if deleting && deleted.insert(name.clone()) {
                record.deleted.push(Seen {
                    machine: name.clone(),
                    initialized,
                    others_busy: others
                        .filter(|o| o.metadata.deletion_timestamp.is_some())
                        .map(ResourceExt::name_any)
                        .collect(),
                });
            }
        }
    });
    (record, task)
}

/// Waits until the control plane is `n` Machines, none being deleted, each provisioned, with one
/// ready MicrovmMachine and one live microVM each.
async fn wait_control_plane(w: &World, n: usize) -> Vec<Machine> {
    let log = w.operator_log();
    wait_for(
        &format!(
            "{n} control-plane machines (operator log {})",
            log.display()
        ),
        WAIT,
        POLL,
        || async {
            let ms = control_plane_machines(&w.client).await;
            let infra = w.microvm_machines(NS).await?;
            let ok = ms.len() == n
                && ms
                    .iter()
                    .all(|m| provisioned(m) && m.metadata.deletion_timestamp.is_none())
                && infra.len() == n
                && infra.iter().all(is_ready)
                && live_vms(w).len() == n;
            Ok(ok.then_some(ms))
        },
    )
    .await
    .unwrap()
}

async fn set_replicas(w: &World, n: i64) {
    kcps(w)
        .patch(
            KCP,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": n}})),
        )
        .await
        .unwrap();
}

/// Every join was created with the control plane initialized and every other Machine provisioned.
fn assert_joins_waited(created: &[Seen]) {
    for seen in created {
        assert!(
            seen.initialized,
            "{} was created before the control plane was initialized: {created:#?}",
            seen.machine
        );
        assert!(
            seen.others_busy.is_empty(),
            "{} was created while {:?} were not provisioned: {created:#?}",
            seen.machine,
            seen.others_busy
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_control_planes_init_first_then_join_and_scale_three_five_three() {
    let w = world(options(3)).await;
    let (record, watching) = record(&w);
    w.apply_demo_cluster(&counts(3, 0), |_| {}).await.unwrap();
    wait_control_plane(&w, 3).await;

    // The bootstrap: exactly one `kubeadm init`, the others join as control-plane members.
    let configs: Api<DynamicObject> = Api::namespaced_with(
        w.client.clone(),
        NS,
        &ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk(
                "bootstrap.cluster.x-k8s.io",
                "v1beta2",
                "KubeadmConfig",
            ),
            "kubeadmconfigs",
        ),
    );
    let configs = configs.list(&ListParams::default()).await.unwrap().items;
    let inits = configs
        .iter()
        .filter(|c| c.data.pointer("/spec/initConfiguration").is_some())
        .count();
    let joins = configs
        .iter()
        .filter(|c| {
            c.data
                .pointer("/spec/joinConfiguration/controlPlane")
                .is_some()
        })
        .count();
    assert_eq!((inits, joins), (1, 2), "{configs:#?}");
    {
        let record = record.lock().unwrap();
        assert_eq!(record.created.len(), 3, "{:#?}", record.created);
        assert!(
            !record.created[0].initialized,
            "the first Machine initializes the control plane"
        );
        assert_joins_waited(&record.created[1..]);
    }

    // 3 -> 5: each new member joins once the others are provisioned.
    set_replicas(&w, 5).await;
    wait_control_plane(&w, 5).await;
    {
        let record = record.lock().unwrap();
        assert_eq!(record.created.len(), 5, "{:#?}", record.created);
        assert_joins_waited(&record.created[1..]);
    }

    // 5 -> 3: the two oldest go, one at a time.
    let mut by_age = control_plane_machines(&w.client).await;
    by_age.sort_by_key(|m| (m.metadata.creation_timestamp.clone(), m.name_any()));
    set_replicas(&w, 3).await;
    let left = wait_control_plane(&w, 3).await;
    {
        let record = record.lock().unwrap();
        let gone: Vec<&str> = record.deleted.iter().map(|s| s.machine.as_str()).collect();
        let oldest: Vec<String> = by_age.iter().take(2).map(ResourceExt::name_any).collect();
        assert_eq!(gone, oldest, "the oldest go first");
        for seen in &record.deleted {
            assert!(
                seen.others_busy.is_empty(),
                "{} was deleted while {:?} were still being deleted",
                seen.machine,
                seen.others_busy
            );
        }
    }
    let left: BTreeSet<String> = left.iter().map(ResourceExt::name_any).collect();
    // One microVM per control-plane machine, none left behind by the scale-down.
    let vms: Vec<String> = live_vms(&w).into_iter().map(|(_, vm)| vm.spec.id).collect();
    assert_eq!(
        vms.iter().cloned().collect::<BTreeSet<_>>(),
        left,
        "{vms:?}"
    );
    watching.abort();
    w.shutdown().await;
}
