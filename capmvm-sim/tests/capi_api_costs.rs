#![allow(clippy::unwrap_used, clippy::expect_used)]
//! What the CAPI stand-in costs the API: it reads through watch caches, as CAPI's controllers read
//! through informers (a MachineDeployment's Machines are created without reading templates or
//! listing Machines live), and writes a Machine's status once per reconcile, as CAPI does.

mod e2e_support;

use capmvm_api::MicrovmMachine;
use capmvm_api::capi::Machine;
use capmvm_sim::kube::Verb;
use capmvm_sim::world::{World, wait_for};
use e2e_support::*;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::{Api, ResourceExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_machine_deployment_creates_its_machines_from_cached_templates() {
    // No operator: only the stand-in writes, and nothing boots.
    let w = World::start(options(1)).await.expect("world starts");
    // The stand-in's controllers have listed what they follow and are watching.
    let watched = [
        "cluster.x-k8s.io/machines",
        "infrastructure.cluster.x-k8s.io/microvmmachinetemplates",
        "bootstrap.cluster.x-k8s.io/kubeadmconfigtemplates",
    ];
    wait_for("the stand-in's watches", WAIT, POLL, || async {
        let counters = w.emulator.counters();
        Ok(watched
            .iter()
            .all(|r| counters.get(Verb::Watch, r) > 0)
            .then_some(()))
    })
    .await
    .unwrap();
    let before = w.emulator.counters();
    w.apply_demo_cluster(&counts(0, 12), |_| {}).await.unwrap();
    let infras: Api<MicrovmMachine> = Api::namespaced(w.client.clone(), NS);
    let names = wait_for("12 MicrovmMachines", WAIT, POLL, || async {
        let names: Vec<String> = infras
            .list(&ListParams::default())
            .await?
            .iter()
            .map(|m| m.name_any())
            .collect();
        Ok((names.len() == 12).then_some(names))
    })
    .await
    .unwrap();
    // Each Machine is created after its MicrovmMachine, with the same name.
    let machines: Api<Machine> = Api::namespaced(w.client.clone(), NS);
    for name in &names {
        wait_for("the Machine", WAIT, POLL, || async {
            Ok(machines.get_opt(name).await?.map(|_| ()))
        })
        .await
        .unwrap();
    }
    let spent = w.emulator.counters().since(&before);
    let count = |verb, resource| spent.get(verb, resource);
    assert_eq!(count(Verb::Create, "cluster.x-k8s.io/machines"), 12);
    assert_eq!(
        count(Verb::Create, "bootstrap.cluster.x-k8s.io/kubeadmconfigs"),
        12
    );
    assert_eq!(
        count(
            Verb::Create,
            "infrastructure.cluster.x-k8s.io/microvmmachines"
        ),
        12
    );
    // Templates come from the caches, and so do the deployment's Machines.
    assert_eq!(
        count(
            Verb::Get,
            "infrastructure.cluster.x-k8s.io/microvmmachinetemplates"
        ),
        0
    );
    assert_eq!(
        count(
            Verb::Get,
            "bootstrap.cluster.x-k8s.io/kubeadmconfigtemplates"
        ),
        0
    );
    assert_eq!(count(Verb::List, "cluster.x-k8s.io/machines"), 0);
    // One watch of Machines, shared by every controller that follows them.
    assert_eq!(
        w.emulator
            .counters()
            .get(Verb::Watch, "cluster.x-k8s.io/machines"),
        1
    );
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_machine_waiting_for_its_bootstrap_data_is_not_rewritten_in_a_loop() {
    // No operator: the cluster gets no endpoint, so the bootstrap data never comes and the
    // Machines stay Pending.
    let w = World::start(options(1)).await.expect("world starts");
    let at_start = w.emulator.counters();
    w.apply_demo_cluster(&counts(0, 4), |_| {}).await.unwrap();
    let raw: Api<DynamicObject> =
        Api::namespaced_with(w.client.clone(), NS, &ApiResource::erase::<Machine>(&()));
    let phases = wait_for("4 Pending Machines", WAIT, POLL, || async {
        let phases: Vec<String> = raw
            .list(&ListParams::default())
            .await?
            .iter()
            .filter_map(|m| m.data.pointer("/status/phase")?.as_str().map(String::from))
            .collect();
        Ok((phases.len() == 4).then_some(phases))
    })
    .await
    .unwrap();
    assert!(phases.iter().all(|p| p == "Pending"), "{phases:?}");
    // Settled: nothing changes any more, so nothing is written.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let before = w.emulator.counters();
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let spent = w.emulator.counters().since(&before);
    assert_eq!(
        spent.get(Verb::Patch, "cluster.x-k8s.io/machines/status"),
        0,
        "status writes to Machines that do not change"
    );
    assert_eq!(spent.get(Verb::Get, "cluster.x-k8s.io/machines"), 0);
    // Each Machine's bootstrap configRef comes from the cache: no Machine was read live.
    assert_eq!(
        w.emulator
            .counters()
            .since(&at_start)
            .get(Verb::Get, "cluster.x-k8s.io/machines"),
        0
    );
    w.shutdown().await;
}
