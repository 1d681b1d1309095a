//! End to end, host selection and maintenance (issue 35) on the embedded stack: a MachineDeployment
//! pinned to labelled hosts lands only there; one whose selector matches nothing waits with
//! `NoMatchingHost` and proceeds, without a restart, once a host is labelled; a MachinePool whose
//! host is evacuated moves its instances to the other hosts one at a time, never below its ready
//! count, and the MicrovmCluster reports each host's state and microVM count.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod e2e_support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use capmvm_api::{HostState, MicrovmCluster};
use capmvm_sim::world::{MACHINEPOOL_CLUSTER, World, wait_for};
use e2e_support::*;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

/// Sets `labels` on host `index` of the MicrovmCluster about to be applied.
fn label_host(objects: &mut [DynamicObject], index: usize, labels: Value) {
    for o in objects.iter_mut() {
        if o.types.as_ref().is_some_and(|t| t.kind == "MicrovmCluster") {
            o.data["spec"]["placement"]["staticPool"]["hosts"][index]["labels"] = labels.clone();
        }
    }
}

/// Sets `hostSelector` on the worker MicrovmMachineTemplate about to be applied.
fn select_hosts(objects: &mut [DynamicObject], selector: Value) {
    for o in objects.iter_mut() {
        if o.types
            .as_ref()
            .is_some_and(|t| t.kind == "MicrovmMachineTemplate")
            && o.name_any().ends_with("-md-0")
        {
            o.data["spec"]["template"]["spec"]["hostSelector"] = selector.clone();
        }
    }
}

/// The hosts the live microVMs run on, with how many each.
fn vms_per_host(w: &World) -> BTreeMap<String, usize> {
    let mut per_host = BTreeMap::new();
    for (host, _) in live_vms(w) {
        *per_host.entry(host).or_insert(0) += 1;
    }
    per_host
}

/// Patches host `index` of MicrovmCluster `demo` with `fields` (a JSON merge of that entry).
async fn patch_host(w: &World, index: usize, fields: Value) {
    let api = Api::<MicrovmCluster>::namespaced(w.client.clone(), NS);
    let mut mc = api.get("demo").await.unwrap();
    let pool = mc.spec.placement.static_pool.as_mut().unwrap();
    let mut host = serde_json::to_value(&pool.hosts[index]).unwrap();
    for (key, value) in fields.as_object().unwrap() {
        host[key] = value.clone();
    }
    pool.hosts[index] = serde_json::from_value(host).unwrap();
    let hosts = serde_json::to_value(&pool.hosts).unwrap();
    api.patch(
        "demo",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"placement": {"staticPool": {"hosts": hosts}}}})),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_machine_deployment_pinned_to_labelled_hosts_runs_only_there() {
    let w = world(options(3)).await;
    let pinned = w.hosts[1].endpoint();
    w.apply_demo_cluster(&counts(0, 3), |objects| {
        label_host(objects, 1, json!({"disk": "nvme"}));
        select_hosts(objects, json!({"matchLabels": {"disk": "nvme"}}));
    })
    .await
    .unwrap();
    wait_ready_within(&w, 3, WAIT).await;
    assert_eq!(
        vms_per_host(&w),
        BTreeMap::from([(pinned, 3)]),
        "every worker on the one labelled host"
    );
    assert_eq!(creates_on_hosts(&w), 3, "one create per machine");
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_selector_matching_no_host_waits_and_proceeds_once_a_host_is_labelled() {
    let w = world(options(3)).await;
    w.apply_demo_cluster(&counts(0, 2), |objects| {
        select_hosts(objects, json!({"matchLabels": {"disk": "ssd"}}));
    })
    .await
    .unwrap();
    let waiting = wait_reason(&w, "demo-md-0", 2, "NoMatchingHost").await;
    let (_, _, message) = ready_condition(&waiting[0]).unwrap();
    assert!(message.contains("disk=ssd"), "{message}");
    assert!(message.contains("0 of 3 considered match"), "{message}");
    assert_eq!(creates_on_hosts(&w), 0, "never created anywhere else");

    // A label on a host (no restart of anything) lets them proceed, onto that host only.
    patch_host(&w, 2, json!({"labels": {"disk": "ssd"}})).await;
    wait_ready_within(&w, 2, WAIT).await;
    assert_eq!(
        vms_per_host(&w),
        BTreeMap::from([(w.hosts[2].endpoint(), 2)])
    );
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_evacuated_host_empties_its_pool_instances_within_the_pools_budget() {
    let w = world(options(3)).await;
    w.apply_template(MACHINEPOOL_CLUSTER, &counts(0, 4), |_| {})
        .await
        .unwrap();
    wait_ready_within(&w, 4, WAIT).await;
    let before = vms_per_host(&w);
    // The host with the most instances is the one to evacuate (placement spreads them).
    let (victim, on_victim) = before
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(h, n)| (h.clone(), *n))
        .unwrap();
    let index = w.hosts.iter().position(|h| h.endpoint() == victim).unwrap();
    let creates_before = creates_on_hosts(&w);

    // Cordon first: nothing moves, the cluster says Cordoned.
    patch_host(&w, index, json!({"maintenance": "Cordon"})).await;
    let mcs = Api::<MicrovmCluster>::namespaced(w.client.clone(), NS);
    wait_for("the host reported Cordoned", WAIT, POLL, || async {
        let mc = mcs.get("demo").await?;
        let state = mc
            .status
            .and_then(|s| s.hosts.into_iter().find(|h| h.endpoint == victim));
        Ok(state
            .filter(|h| {
                h.state == HostState::Cordoned && h.microvms == i32::try_from(on_victim).unwrap()
            })
            .map(|_| ()))
    })
    .await
    .unwrap();
    assert_eq!(vms_per_host(&w), before, "cordoning moves nothing");

    patch_host(&w, index, json!({"maintenance": "Evacuate"})).await;
    let lowest_ready = AtomicUsize::new(usize::MAX);
    wait_for("the evacuated host empty", WAIT * 2, POLL, || async {
        let machines = w.microvm_machines(NS).await?;
        let ready = machines
            .iter()
            .filter(|m| is_ready(m) && m.metadata.deletion_timestamp.is_none())
            .count();
        lowest_ready.fetch_min(ready, Ordering::Relaxed);
        let per_host = vms_per_host(&w);
        let done =
            !per_host.contains_key(&victim) && per_host.values().sum::<usize>() == 4 && ready == 4;
        Ok(done.then_some(()))
    })
    .await
    .unwrap();
    let lowest_ready = lowest_ready.into_inner();
    assert!(
        lowest_ready >= 4,
        "never fewer than 4 ready instances (maxUnavailable 0), saw {lowest_ready}"
    );
    assert_eq!(
        creates_on_hosts(&w) - creates_before,
        u64::try_from(on_victim).unwrap(),
        "one new microVM per evacuated one, none twice"
    );
    wait_for(
        "the host reported Evacuating and empty",
        WAIT,
        POLL,
        || async {
            let mc = mcs.get("demo").await?;
            let state = mc
                .status
                .and_then(|s| s.hosts.into_iter().find(|h| h.endpoint == victim));
            Ok(state
                .filter(|h| h.state == HostState::Evacuating && h.microvms == 0)
                .map(|_| ()))
        },
    )
    .await
    .unwrap();
    w.shutdown().await;
}
