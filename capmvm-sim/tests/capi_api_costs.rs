#![allow(clippy::unwrap_used, clippy::expect_used)]
//! What the CAPI stand-in costs the API: it reads through watch caches, as CAPI's controllers read
//! through informers (a MachineDeployment's Machines are created without reading templates or
//! listing Machines live).

mod e2e_support;

use capmvm_api::MicrovmMachine;
use capmvm_api::capi::Machine;
use capmvm_sim::kube::Verb;
use capmvm_sim::world::{World, wait_for};
use e2e_support::*;
use kube::api::ListParams;
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
