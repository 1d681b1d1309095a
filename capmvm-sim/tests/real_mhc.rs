//! Pool repair on the real stack with Cluster API's own MachineHealthCheck controller (real core's,
//! not the stand-in's): one pool instance's Node turns NotReady; core's MHC marks its Machine
//! `OwnerRemediated=False` (core leaves a MachinePool Machine's replacement to the pool); the pool
//! replaces that instance, and only it, within `maxSurge: 1` / `maxUnavailable: 0`.
//!
//! Needs the upstream binaries (`hack/upstream.sh build`): under CI a missing one fails the test,
//! locally the test is reported as skipped.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod real_support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use capmvm_api::MicrovmMachine;
use capmvm_api::capi::Machine;
use capmvm_api::keys::POOL_NAME_LABEL;
use capmvm_flintlock::MicrovmState;
use capmvm_sim::real::{BINARIES, RealStack};
use capmvm_sim::stack;
use capmvm_sim::world::{DEMO_CLUSTER, MACHINEPOOL_CLUSTER, wait_for};
use capmvm_upstream::Binaries;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(240);
const POLL: Duration = Duration::from_millis(500);
const NS: &str = "default";
const CLUSTER: &str = "repair";
const POOL: &str = "repair-mp-0";

/// The Machines as core writes them (nodeRef and conditions included).
async fn machines(real: &RealStack) -> Vec<DynamicObject> {
    Api::<DynamicObject>::namespaced_with(
        real.client.clone(),
        NS,
        &ApiResource::erase::<Machine>(&()),
    )
    .list(&ListParams::default())
    .await
    .unwrap()
    .items
}

fn pool_machines(all: &[DynamicObject]) -> Vec<&DynamicObject> {
    all.iter()
        .filter(|m| m.labels().get(POOL_NAME_LABEL).map(String::as_str) == Some(POOL))
        .collect()
}

fn node_ref(m: &DynamicObject) -> Option<&str> {
    m.data.pointer("/status/nodeRef/name")?.as_str()
}

/// Live microVMs: (uid, instance name).
fn live_vms(real: &RealStack) -> Vec<(String, String)> {
    real.all_vms()
        .into_iter()
        .filter(|(_, vm)| vm.state() != MicrovmState::Deleting)
        .map(|(_, vm)| (vm.uid().to_string(), vm.microvm.spec.id.clone()))
        .collect()
}

/// Waits until the pool has `n` Machines, none leaving, each with a Node, and every MicrovmMachine
/// of the namespace is Ready.
async fn wait_pool_with_nodes(real: &RealStack, n: usize) -> Vec<DynamicObject> {
    wait_for(
        &format!(
            "{n} pool Machines with Nodes (operator log {})",
            real.operator_log().display()
        ),
        WAIT,
        POLL,
        || async {
            let all = machines(real).await;
            let pool: Vec<DynamicObject> = pool_machines(&all).into_iter().cloned().collect();
            let infra = Api::<MicrovmMachine>::namespaced(real.client.clone(), NS)
                .list(&ListParams::default())
                .await?
                .items;
            let ready = infra.iter().all(|m| {
                m.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                })
            });
            let settled = pool.len() == n
                && ready
                && pool
                    .iter()
                    .all(|m| m.metadata.deletion_timestamp.is_none() && node_ref(m).is_some());
            Ok(settled.then_some(pool))
        },
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_cores_machine_health_check_gets_the_marked_pool_instance_replaced() {
    if Binaries::for_test(
        "real_cores_machine_health_check_gets_the_marked_pool_instance_replaced",
        BINARIES,
    )
    .is_none()
    {
        return;
    }
    let mut real = RealStack::start(real_support::options()).await.unwrap();
    real.start_operator(&[]).unwrap();
    let vip = real.prepare_cluster(NS, CLUSTER).await.unwrap();
    let vars = |workers: usize| {
        vec![
            ("CLUSTER_NAME", CLUSTER.to_string()),
            ("NAMESPACE", NS.to_string()),
            ("CONTROL_PLANE_VIP", vip.to_string()),
            ("CONTROL_PLANE_MACHINE_COUNT", "1".to_string()),
            ("WORKER_MACHINE_COUNT", workers.to_string()),
            ("WORKER_MACHINE_MAX_SURGE", "1".to_string()),
            ("WORKER_MACHINE_MAX_UNAVAILABLE", "0".to_string()),
        ]
    };
    // Workers need a control plane on real CAPI: the cluster with no MachineDeployment workers,
    // then the pool flavor's pool of 3.
    stack::apply_template(&real, DEMO_CLUSTER, &vars(0), |_| {})
        .await
        .unwrap();
    stack::apply_template(&real, MACHINEPOOL_CLUSTER, &vars(3), |objects| {
        objects.retain(|o| {
            o.types.as_ref().is_some_and(|t| {
                matches!(
                    t.kind.as_str(),
                    "MachinePool" | "MicrovmMachinePool" | "KubeadmConfig"
                )
            })
        })
    })
    .await
    .unwrap();
    let before = wait_pool_with_nodes(&real, 3).await;

    // Core's MachineHealthCheck over the pool's Machines: a Node not Ready for 2 s is unhealthy.
    let mhcs: Api<DynamicObject> = Api::namespaced_with(
        real.client.clone(),
        NS,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "MachineHealthCheck"),
            "machinehealthchecks",
        ),
    );
    let mhc = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "MachineHealthCheck",
        "metadata": {"name": POOL, "namespace": NS},
        "spec": {
            "clusterName": CLUSTER,
            "selector": {"matchLabels": {POOL_NAME_LABEL: POOL}},
            "checks": {"unhealthyNodeConditions": [
                {"type": "Ready", "status": "False", "timeoutSeconds": 2},
                {"type": "Ready", "status": "Unknown", "timeoutSeconds": 2},
            ]},
        },
    });
    mhcs.create(
        &PostParams::default(),
        &serde_json::from_value(mhc).unwrap(),
    )
    .await
    .unwrap();
    wait_for(
        "core's MachineHealthCheck to see 3 healthy Machines",
        WAIT,
        POLL,
        || async {
            let m = mhcs.get(POOL).await?;
            Ok((m.data["status"]["currentHealthy"] == 3).then_some(()))
        },
    )
    .await
    .unwrap();

    let victim = before[0].name_any();
    let victim_node = node_ref(&before[0]).unwrap().to_string();
    let healthy: BTreeSet<String> = before[1..].iter().map(ResourceExt::name_any).collect();
    real.kubelets().set_not_ready(&victim_node, true);

    // Sampled while the pool repairs: the healthy instances are never touched, and the pool never
    // exceeds 3 + maxSurge instances.
    let mut marked = false;
    let mut most = 0;
    let deadline = Instant::now() + WAIT;
    let replaced = loop {
        assert!(
            Instant::now() < deadline,
            "the marked instance not replaced in time (operator log {}, logs in {})",
            real.operator_log().display(),
            real.dir.display()
        );
        let all = machines(&real).await;
        let pool = pool_machines(&all);
        let instances = Api::<MicrovmMachine>::namespaced(real.client.clone(), NS)
            .list(&ListParams::default().labels(&format!("{POOL_NAME_LABEL}={POOL}")))
            .await
            .unwrap()
            .items;
        most = most.max(instances.len());
        for name in &healthy {
            assert!(
                pool.iter()
                    .any(|m| &m.name_any() == name && m.metadata.deletion_timestamp.is_none()),
                "healthy {name} was deleted"
            );
        }
        if let Some(v) = pool.iter().find(|m| m.name_any() == victim) {
            marked |= v.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "OwnerRemediated" && c["status"] == "False");
        }
        let done = pool.len() == 3
            && pool.iter().all(|m| {
                m.name_any() != victim
                    && m.metadata.deletion_timestamp.is_none()
                    && node_ref(m).is_some()
            });
        if done {
            break pool.into_iter().cloned().collect::<Vec<_>>();
        }
        tokio::time::sleep(POLL).await;
    };
    assert!(
        marked,
        "core's MachineHealthCheck marked the Machine OwnerRemediated=False"
    );
    assert!(most <= 4, "{most} instances: beyond 3 + maxSurge");
    let replacement = replaced
        .iter()
        .find(|m| !healthy.contains(&m.name_any()))
        .unwrap();
    let pid = replacement.data["spec"]["providerID"]
        .as_str()
        .unwrap()
        .to_string();
    let vms = live_vms(&real);
    assert!(
        vms.iter().any(|(uid, _)| pid.ends_with(&format!("/{uid}"))),
        "{pid} has a live microVM: {vms:?}"
    );
    assert!(
        !vms.iter().any(|(_, id)| id == &victim),
        "the marked instance's microVM is gone: {vms:?}"
    );
    real.shutdown().await;
}
