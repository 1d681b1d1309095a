//! End to end, exactly-once creation under bursts, races and refusals: the API emulator, hollow
//! flintlock hosts, the CAPI stand-in and the real operator in processes of their own. Every assertion
//! reads what a user would see through the API or on the hosts.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod e2e_support;

use std::collections::BTreeMap;
use std::time::Duration;

use capmvm_api::keys::PLACEMENT_CLAIM_ANNOTATION;
use capmvm_api::{MicrovmMachine, ProviderId};
use capmvm_sim::capi::MachineDeployment;
use capmvm_sim::world::{World, wait_for};
use e2e_support::*;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

/// Waits until `n` MicrovmMachines exist (CAPI made them), whatever their state.
async fn wait_machines_exist(w: &World, n: usize) {
    wait_for(&format!("{n} MicrovmMachines"), WAIT, POLL, || async {
        Ok((w.microvm_machines(NS).await?.len() == n).then_some(()))
    })
    .await
    .unwrap();
}

/// MicroVMs per machine name over every host, counting those being deleted too.
fn vms_per_machine(w: &World) -> BTreeMap<String, usize> {
    let mut per = BTreeMap::new();
    for (_, vm) in w.all_vms() {
        *per.entry(vm.microvm.spec.id.clone()).or_default() += 1;
    }
    per
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_30_machines_spreads_evenly_over_3_equal_hosts() {
    // Every machine exists before the operator starts, so its reconciles place them all at once.
    let mut w = World::start(options(3)).await.unwrap();
    w.apply_demo_cluster(&counts(0, 30), |_| {}).await.unwrap();
    wait_machines_exist(&w, 30).await;
    w.start_operator(&[]).unwrap();
    let machines = wait_ready_within(&w, 30, Duration::from_secs(180)).await;

    let mut per_host: BTreeMap<String, usize> = w.endpoints().into_iter().map(|e| (e, 0)).collect();
    for (host, _) in live_vms(&w) {
        *per_host.entry(host).or_default() += 1;
    }
    assert_eq!(
        per_host.values().copied().collect::<Vec<_>>(),
        [10, 10, 10],
        "a burst spreads like a trickle: {per_host:?}"
    );
    // Each machine's status names the host its microVM is on.
    for m in &machines {
        let pid: ProviderId = m.spec.provider_id.as_deref().unwrap().parse().unwrap();
        assert_eq!(
            m.status.as_ref().unwrap().host.as_deref(),
            Some(pid.host.to_string().as_str())
        );
    }
    assert_eq!(creates_on_hosts(&w), 30, "one create per machine");
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_operators_without_leader_election_create_each_microvm_once() {
    const MACHINES: usize = 50;
    let mut w = World::start(options(3)).await.unwrap();
    w.start_operator(&[]).unwrap();
    let second = w.spawn_operator(&[], &[]).unwrap();
    w.apply_demo_cluster(&counts(0, MACHINES), |_| {})
        .await
        .unwrap();
    let machines = wait_ready_within(&w, MACHINES, Duration::from_secs(240)).await;

    // Both processes took part (neither was a standby).
    let first_metrics = w.operator().unwrap().scrape_metrics().await.unwrap();
    let second_metrics = second.scrape_metrics().await.unwrap();
    for text in [&first_metrics, &second_metrics] {
        assert!(
            reconciles_in(text, Some("microvmmachine")) > 0,
            "both operators reconcile machines"
        );
    }

    let per_machine = vms_per_machine(&w);
    let duplicated: Vec<_> = per_machine.iter().filter(|(_, n)| **n != 1).collect();
    assert!(duplicated.is_empty(), "duplicate microVMs: {duplicated:?}");
    assert_eq!(per_machine.len(), MACHINES);
    assert_eq!(
        creates_on_hosts(&w),
        MACHINES as u64,
        "no second microVM was ever created, not even one deleted since"
    );
    let vms = live_vms(&w);
    for m in &machines {
        let pid: ProviderId = m.spec.provider_id.as_deref().unwrap().parse().unwrap();
        assert!(
            vms.iter()
                .any(|(host, vm)| vm.uid() == pid.uid && *host == pid.host.to_string()),
            "{} names its microVM",
            m.name_any()
        );
    }
    second.stop().await;
    w.shutdown().await;
}

/// Two replicas without leader election, the second's clock an hour ahead of the first's, and
/// creates that take two seconds to reach the hosts. A claim the first writes is an hour old by the
/// second's clock; the second still waits for the first's create instead of making a second
/// microVM, because a claim's age is how long it has seen it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_operators_whose_clocks_are_an_hour_apart_create_each_microvm_once() {
    const MACHINES: usize = 12;
    let mut w = World::start(options(3)).await.unwrap();
    for host in &w.hosts {
        host.control().set_create_latency(Duration::from_secs(5));
    }
    w.start_operator(&[]).unwrap();
    let skewed = w
        .spawn_operator(&[], &[(capmvm_operator::fault::CLOCK_SKEW_ENV, "3600")])
        .unwrap();
    w.apply_demo_cluster(&counts(0, MACHINES), |_| {})
        .await
        .unwrap();
    wait_ready_within(&w, MACHINES, Duration::from_secs(240)).await;
    let per_machine = vms_per_machine(&w);
    let duplicated: Vec<_> = per_machine.iter().filter(|(_, n)| **n != 1).collect();
    assert!(duplicated.is_empty(), "duplicate microVMs: {duplicated:?}");
    assert_eq!(
        creates_on_hosts(&w),
        MACHINES as u64,
        "no second microVM was ever created, not even one deleted since"
    );
    skewed.stop().await;
    w.shutdown().await;
}

/// Two replicas without leader election, creates that take 6 s to reach the host, and the machine
/// scaled away as soon as its placement is recorded: the replica that did not claim the placement
/// handles the deletion while the other's create is still on its way, and finds nothing on the
/// host yet. It must not release the finalizer then: the create lands after, and its microVM would
/// outlive its MicrovmMachine (reported orphaned, deleted by nobody). The deletion ends with no
/// microVM on the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_deleted_while_another_replica_creates_its_microvm_leaks_nothing() {
    const CREATE_LATENCY: Duration = Duration::from_secs(6);
    let mut w = World::start(options(1)).await.unwrap();
    for host in &w.hosts {
        host.control().set_create_latency(CREATE_LATENCY);
    }
    w.start_operator(&[]).unwrap();
    let second = w.spawn_operator(&[], &[]).unwrap();
    w.apply_demo_cluster(&counts(0, 1), |_| {}).await.unwrap();

    // One replica recorded the host and claimed the placement: its create is on its way.
    let claimed = wait_for(
        "a claimed placement",
        WAIT,
        Duration::from_millis(50),
        || async {
            Ok(w.microvm_machines(NS)
                .await?
                .into_iter()
                .find(|m| m.annotations().contains_key(PLACEMENT_CLAIM_ANNOTATION)))
        },
    )
    .await
    .unwrap();
    let name = claimed.name_any();
    Api::<MachineDeployment>::namespaced(w.client.clone(), NS)
        .patch(
            "demo-md-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await
        .unwrap();
    let api = Api::<MicrovmMachine>::namespaced(w.client.clone(), NS);
    wait_for(
        "the MicrovmMachine to be deleted",
        WAIT,
        Duration::from_millis(50),
        || async {
            Ok(api
                .get_opt(&name)
                .await?
                .is_none_or(|m| m.metadata.deletion_timestamp.is_some())
                .then_some(()))
        },
    )
    .await
    .unwrap();
    assert!(
        w.all_vms().is_empty(),
        "the deletion must begin before the create reaches the host, or this test shows nothing"
    );

    wait_for("the MicrovmMachine to be gone", WAIT, POLL, || async {
        Ok(api.get_opt(&name).await?.is_none().then_some(()))
    })
    .await
    .unwrap();
    // A create still on its way when the finalizer went would land within its latency.
    let gone_at = std::time::Instant::now();
    while gone_at.elapsed() < CREATE_LATENCY + Duration::from_secs(2) {
        let outlived: Vec<_> = live_vms(&w)
            .into_iter()
            .filter(|(_, vm)| vm.spec.id == name)
            .collect();
        assert!(
            outlived.is_empty(),
            "the finalizer went while a create was on its way: {outlived:?} outlived MicrovmMachine {name}"
        );
        tokio::time::sleep(POLL).await;
    }
    wait_for("no microVM on the host", WAIT, POLL, || async {
        Ok(w.all_vms().is_empty().then_some(()))
    })
    .await
    .unwrap();
    assert_eq!(creates_on_hosts(&w), 1, "one create, deleted again");
    second.stop().await;
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_the_host_refuses_is_not_sent_again_until_it_changes() {
    const REFUSED_KERNEL: &str = "ghcr.io/example/kernel:refused-by-the-host";
    let w = world(options(1)).await;
    w.hosts[0]
        .control()
        .refuse_kernel_image(REFUSED_KERNEL, true);
    w.apply_demo_cluster(&counts(0, 1), |objects| {
        for o in objects.iter_mut() {
            if o.types.as_ref().unwrap().kind == "MicrovmMachineTemplate"
                && o.name_any() == "demo-md-0"
            {
                // Valid by our checks, refused by this host's stricter ones (another flintlock).
                o.data["spec"]["template"]["spec"]["kernel"]["image"] = json!(REFUSED_KERNEL);
            }
        }
    })
    .await
    .unwrap();
    let machines = wait_reason(&w, "demo-md-0", 1, "MicrovmSpecRejected").await;
    let name = machines[0].name_any();
    let (status, _, message) = ready_condition(&machines[0]).unwrap();
    assert_eq!(status, "False");
    assert!(
        message.contains(&w.endpoints()[0]) && message.contains("'imageURI' tag"),
        "names the host and what it refused: {message}"
    );
    assert!(
        message.contains("spec changes"),
        "says what to do: {message}"
    );

    // A retry with backoff would have sent it again by now (1 s, then 2 s, ...).
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(creates_on_hosts(&w), 1, "the refused create is not retried");
    let rejected: Vec<_> = events_for(&w, &name)
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("MicrovmSpecRejected"))
        .collect();
    assert_eq!(rejected.len(), 1, "one Warning event: {rejected:?}");
    assert_eq!(rejected[0].type_.as_deref(), Some("Warning"));

    // The spec changes (a new generation): the create is tried again, and succeeds.
    Api::<MicrovmMachine>::namespaced(w.client.clone(), NS)
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"kernel": {"image": "ghcr.io/liquidmetal-dev/flintlock-kernel:5.10.77"}}})),
        )
        .await
        .unwrap();
    wait_ready_within(&w, 1, WAIT).await;
    assert_eq!(creates_on_hosts(&w), 2);
    assert_eq!(live_vms(&w).len(), 1);
    w.shutdown().await;
}

/// A microVM someone else made on `endpoint` under `namespace/name`, with no meta-data of ours.
async fn create_foreign_microvm(endpoint: &str, namespace: &str, name: &str) -> String {
    use capmvm_flintlock::{
        ClientPool, HostConfig, Kernel, MicrovmSpec, NetworkInterface, PoolOptions, Volume,
        VolumeSource,
    };
    let pool = ClientPool::new(PoolOptions::default());
    let client = pool.client(&HostConfig::new(endpoint)).unwrap();
    let vm = client
        .create(MicrovmSpec {
            id: name.to_string(),
            namespace: namespace.to_string(),
            vcpu: 2,
            memory_mb: 2048,
            kernel: Kernel {
                image: "ghcr.io/liquidmetal-dev/flintlock-kernel:5.10.77".into(),
                filename: Some("boot/vmlinux".into()),
                ..Default::default()
            },
            root_volume: Some(Volume {
                id: "root".into(),
                source: VolumeSource {
                    container_source: Some("ghcr.io/liquidmetal-dev/capmvm-k8s-os:1.33.0".into()),
                    virtiofs_source: None,
                },
                ..Default::default()
            }),
            interfaces: vec![NetworkInterface {
                device_id: "eth1".into(),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .unwrap();
    vm.uid().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_same_name_microvm_on_the_recorded_host_blocks_creation() {
    // The operator records the host, then dies before creating; meanwhile someone else's microVM
    // with the machine's name appears on that host (its meta-data carries no uid of ours).
    let mut w = World::start(options(1)).await.unwrap();
    w.start_operator(&[(capmvm_operator::fault::FAULT_ENV, "after-host-recorded")])
        .unwrap();
    w.apply_demo_cluster(&counts(0, 1), |_| {}).await.unwrap();
    assert_eq!(
        w.wait_operator_exit(WAIT).await,
        Some(capmvm_operator::fault::FAULT_EXIT_CODE)
    );
    let name = w.microvm_machines(NS).await.unwrap()[0].name_any();
    let host = w.endpoints()[0].clone();
    let foreign = create_foreign_microvm(&host, NS, &name).await;

    w.start_operator(&[]).unwrap();
    let machines = wait_reason(&w, "demo-md-0", 1, "UnknownMicrovmOnHost").await;
    let (status, _, message) = ready_condition(&machines[0]).unwrap();
    assert_eq!(status, "False");
    for part in [host.as_str(), foreign.as_str(), "no readable", "delete it"] {
        assert!(message.contains(part), "{part:?} missing from: {message}");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        creates_on_hosts(&w),
        1,
        "only the foreign create: none of ours"
    );
    assert_eq!(
        live_vms(&w).len(),
        1,
        "someone else's microVM is left alone"
    );
    let warned = events_for(&w, &name)
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("UnknownMicrovmOnHost"))
        .count();
    assert_eq!(warned, 1);
    w.shutdown().await;
}
