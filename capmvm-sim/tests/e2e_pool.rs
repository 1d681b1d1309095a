//! End to end, a MicrovmMachinePool under the stand-in's MachinePool core (issue 14): scale
//! 0 -> 5 -> 2 with the right victims, the autoscaler's pick, rolls within maxSurge /
//! maxUnavailable sampled as they go, a bootstrap-only change, a vanished microVM, the pool's
//! deletion, and the operator killed mid-scale and mid-roll.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod e2e_support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use base64::Engine as _;
use capmvm_api::keys::{DELETE_MACHINE_ANNOTATION, POOL_NAME_LABEL};
use capmvm_api::{MicrovmMachine, MicrovmMachinePool};
use capmvm_sim::world::{World, wait_for};
use e2e_support::*;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use kube::{Api, ResourceExt};
use serde_json::json;

const POOL: &str = "demo-pool";
const SECRET: &str = "demo-pool-bootstrap";

fn machine_pool_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "MachinePool"),
        "machinepools",
    )
}

fn machine_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Machine"),
        "machines",
    )
}

fn machine_pools(w: &World) -> Api<DynamicObject> {
    Api::namespaced_with(w.client.clone(), NS, &machine_pool_resource())
}

fn machines_api(w: &World) -> Api<DynamicObject> {
    Api::namespaced_with(w.client.clone(), NS, &machine_resource())
}

fn pools(w: &World) -> Api<MicrovmMachinePool> {
    Api::namespaced(w.client.clone(), NS)
}

/// Bootstrap data as CABPK renders it for a worker, its join token `token`: the kubelet's
/// provider-id comes from the microVM's meta-data, so its Node registers and matches its Machine
/// (a pool counts an instance available in a roll only once its Node registered).
fn cloud_config(token: &str) -> String {
    let provider_id = "microvm://{{ ds.meta_data.vm_host }}/{{ ds.meta_data.instance_id }}";
    format!(
        "## template: jinja\n#cloud-config\nwrite_files:\n- path: /run/kubeadm/kubeadm-join-config.yaml\n  content: |\n    apiVersion: kubeadm.k8s.io/v1beta4\n    kind: JoinConfiguration\n    discovery:\n      bootstrapToken:\n        token: {token}\n    nodeRegistration:\n      kubeletExtraArgs:\n      - name: provider-id\n        value: \"{provider_id}\"\nruncmd:\n- kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml\n"
    )
}

/// A worker-only cluster whose workers are one MachinePool of `replicas` over a MicrovmMachinePool,
/// its bootstrap data given directly by `dataSecretName` (as CAPI allows).
async fn pool_world(hosts: usize, replicas: i32, surge: i32, unavailable: i32) -> World {
    let w = world(options(hosts)).await;
    w.apply_demo_cluster(&counts(0, 0), |_| {}).await.unwrap();
    let yaml = format!(
        r#"
apiVersion: v1
kind: Secret
metadata: {{name: {SECRET}, namespace: {NS}}}
stringData:
  value: {value:?}
  format: cloud-config
---
apiVersion: infrastructure.cluster.x-k8s.io/v1alpha2
kind: MicrovmMachinePool
metadata: {{name: {POOL}, namespace: {NS}}}
spec:
  template:
    vcpu: 1
    memoryMb: 1024
    rootVolume: {{id: root, image: "ghcr.io/liquidmetal-dev/capmvm-kubernetes:1.23.5"}}
    kernel: {{image: "ghcr.io/liquidmetal-dev/kernel-bin:5.10.77", filename: boot/vmlinux}}
    networkInterfaces: [{{guestDeviceName: eth1, type: tap}}]
  strategy:
    type: RollingUpdate
    rollingUpdate: {{maxSurge: {surge}, maxUnavailable: {unavailable}, deletePolicy: Oldest}}
---
apiVersion: cluster.x-k8s.io/v1beta2
kind: MachinePool
metadata: {{name: {POOL}, namespace: {NS}}}
spec:
  clusterName: demo
  replicas: {replicas}
  template:
    spec:
      clusterName: demo
      bootstrap: {{dataSecretName: {SECRET}}}
      infrastructureRef:
        apiGroup: infrastructure.cluster.x-k8s.io
        kind: MicrovmMachinePool
        name: {POOL}
"#,
        value = cloud_config("first")
    );
    let objects = capmvm_sim::manifest::parse(&yaml).unwrap();
    capmvm_sim::manifest::apply(&w.client, &objects)
        .await
        .unwrap();
    w
}

/// Sets `MachinePool.spec.replicas`, as a person editing the MachinePool does.
async fn set_replicas(w: &World, replicas: i32) {
    machine_pools(w)
        .patch(
            POOL,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .unwrap();
}

/// The pool's instances (MicrovmMachines labelled with its name), deleting ones included.
async fn instances(w: &World) -> Vec<MicrovmMachine> {
    Api::<MicrovmMachine>::namespaced(w.client.clone(), NS)
        .list(&ListParams::default().labels(&format!("{POOL_NAME_LABEL}={POOL}")))
        .await
        .unwrap()
        .items
}

async fn machines(w: &World) -> Vec<DynamicObject> {
    machines_api(w)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
}

fn names<K: ResourceExt>(objects: &[K]) -> BTreeSet<String> {
    objects.iter().map(ResourceExt::name_any).collect()
}

/// Waits until the pool settled at `n`: `n` instances, all Ready and none leaving, their `n`
/// Machines, one live microVM each and no other, the pool's status and providerIDList saying so,
/// and core's MachinePool counting them. Returns the instances.
async fn wait_pool(w: &World, n: usize) -> Vec<MicrovmMachine> {
    let log = w.operator_log();
    wait_for(
        &format!("the pool settled at {n} (operator log: {})", log.display()),
        WAIT,
        POLL,
        || async {
            let is = instances(w).await;
            let ms = machines(w).await;
            let pool = pools(w).get(POOL).await?;
            let mp = machine_pools(w).get(POOL).await?;
            let vms = live_vms(w);
            let status = pool.status.clone().unwrap_or_default();
            let settled = is.len() == n
                && is
                    .iter()
                    .all(|i| is_ready(i) && i.metadata.deletion_timestamp.is_none())
                && names(&ms) == names(&is)
                && ms.iter().all(|m| m.metadata.deletion_timestamp.is_none())
                && vms.len() == n
                && usize::try_from(status.ready_replicas).ok() == Some(n)
                && pool.spec.provider_id_list.len() == n
                && status.ready
                && mp.data.pointer("/status/replicas").and_then(|v| v.as_i64())
                    == i64::try_from(n).ok();
            Ok(settled.then_some(is))
        },
    )
    .await
    .unwrap()
}

/// Every live microVM belongs to an instance that exists, and no instance has two.
fn assert_no_duplicate_or_leak(w: &World, instances: &[MicrovmMachine]) {
    let vms = live_vms(w);
    let mut per_instance: BTreeMap<String, usize> = BTreeMap::new();
    for (_, vm) in &vms {
        *per_instance.entry(vm.spec.id.clone()).or_default() += 1;
    }
    let existing = names(instances);
    for (name, count) in &per_instance {
        assert_eq!(*count, 1, "instance {name} has {count} microVMs");
        assert!(existing.contains(name), "microVM of {name} leaked");
    }
    assert_eq!(per_instance.len(), existing.len(), "{vms:?}");
}

fn by_age(instances: &[MicrovmMachine]) -> Vec<String> {
    let mut v: Vec<&MicrovmMachine> = instances.iter().collect();
    v.sort_by_key(|i| (i.metadata.creation_timestamp.clone(), i.name_any()));
    v.into_iter().map(ResourceExt::name_any).collect()
}

/// The operator's ClusterRole grants everything it asked of the API server.
fn assert_rbac_covers_what_the_operator_did(w: &World) {
    let used = w.emulator.counters_of_agent(capmvm_operator::USER_AGENT);
    for (verb, resource, _) in used.iter() {
        let Some((group, rest)) = resource.split_once('/') else {
            continue;
        };
        let group = if group == "core" { "" } else { group };
        assert!(
            capmvm_operator::rbac::allows(group, rest, verb.as_str()),
            "the ClusterRole lacks {verb} on {resource}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scales_zero_to_five_to_two_removing_the_oldest() {
    let w = pool_world(3, 0, 1, 0).await;
    wait_pool(&w, 0).await;

    set_replicas(&w, 5).await;
    let five = wait_pool(&w, 5).await;
    assert_no_duplicate_or_leak(&w, &five);
    // Spread over the hosts (capacity-aware placement, not one host for all).
    let hosts: BTreeSet<String> = live_vms(&w).into_iter().map(|(h, _)| h).collect();
    assert!(hosts.len() >= 2, "{hosts:?}");
    let oldest_first = by_age(&five);

    set_replicas(&w, 2).await;
    let two = wait_pool(&w, 2).await;
    assert_eq!(
        names(&two),
        oldest_first[3..].iter().cloned().collect::<BTreeSet<_>>(),
        "deletePolicy Oldest removes the three oldest"
    );
    assert_no_duplicate_or_leak(&w, &two);
    let pool = pools(&w).get(POOL).await.unwrap();
    let mut listed = pool.spec.provider_id_list.clone();
    let mut expected: Vec<String> = two
        .iter()
        .filter_map(|i| i.spec.provider_id.clone())
        .collect();
    listed.sort();
    expected.sort();
    assert_eq!(listed, expected);
    assert_rbac_covers_what_the_operator_did(&w);
    w.shutdown().await;
}

/// Core adopts each new instance (an ownerReference write) moments after the pool creates it. An
/// instance placed before that loses its placement's compare-and-swap to the adoption: a 422, a
/// second write, a "reconcile failed" warning and a backoff. Placed once adopted, each instance costs
/// exactly its two writes (host record, providerID) and the log carries no failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_scale_up_places_each_instance_once_core_adopted_it_without_a_lost_write() {
    let w = pool_world(3, 0, 12, 0).await;
    wait_pool(&w, 0).await;
    let instance_patches = || {
        w.emulator
            .counters_of_agent(capmvm_operator::USER_AGENT)
            .get(
                capmvm_sim::kube::Verb::Patch,
                "infrastructure.cluster.x-k8s.io/microvmmachines",
            )
    };
    let before = instance_patches();
    set_replicas(&w, 12).await;
    wait_pool(&w, 12).await;
    assert_eq!(
        instance_patches() - before,
        24,
        "one host record and one providerID write per instance, none lost to core's adoption"
    );
    let log = std::fs::read_to_string(w.operator_log()).unwrap();
    assert!(
        !log.lines().any(|l| l.contains("reconcile failed")),
        "no reconcile failed: {}",
        w.operator_log().display()
    );
    w.shutdown().await;
}

/// A pool instance's write lost to another writer (409: its resourceVersion is stale; a 422 from a
/// JSON patch's failed `test` is classed the same): the operator reads the instance afresh and
/// decides again within the same reconcile, and the scale-up still ends with one microVM per
/// instance. The emulator answers three of the operator's patches of instances 409, as the API
/// server does when another writer won; at most three, so none reaches the round limit, and each
/// is then the one GET of a MicrovmMachine the operator makes (it reads them from its caches).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_instance_write_lost_to_a_conflict_is_decided_again_from_a_fresh_read() {
    use capmvm_sim::kube::{FaultKind, FaultRule, Verb};
    let w = pool_world(3, 0, 4, 0).await;
    wait_pool(&w, 0).await;
    let faults = w.emulator.faults();
    faults
        .add_rule(
            FaultRule::new(FaultKind::Conflict)
                .verbs([Verb::Patch])
                .resources(["microvmmachines.infrastructure.cluster.x-k8s.io"])
                .unwrap()
                .user_agent_prefix(capmvm_operator::USER_AGENT)
                .times(3),
        )
        .unwrap();
    let gets = || {
        w.emulator
            .counters_of_agent(capmvm_operator::USER_AGENT)
            .get(Verb::Get, "infrastructure.cluster.x-k8s.io/microvmmachines")
    };
    let gets_before = gets();
    set_replicas(&w, 4).await;
    let four = wait_pool(&w, 4).await;
    assert_eq!(
        faults.counts().kind_total(FaultKind::Conflict),
        3,
        "the conflicts were injected"
    );
    assert_eq!(gets() - gets_before, 3, "one fresh read per lost write");
    assert_no_duplicate_or_leak(&w, &four);
    assert_eq!(
        w.hosts
            .iter()
            .map(|h| h.control().counters().of(capmvm_flintlock::Method::Create))
            .sum::<u64>(),
        4,
        "one create per instance"
    );
    let log = std::fs::read_to_string(w.operator_log()).unwrap();
    assert!(
        !log.lines().any(|l| l.contains("reconcile failed")),
        "a conflict is no failure: {}",
        w.operator_log().display()
    );
    w.shutdown().await;
}

/// While its counts move, the pool's status is written at most about once a second, and its last
/// state is always written: a scale of 12 on 3 hosts changes a count dozens of times in a few
/// seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_pools_status_is_written_at_most_once_a_second_while_counts_move() {
    let w = pool_world(3, 0, 2, 0).await;
    wait_pool(&w, 0).await;
    let status_patches = || {
        w.emulator
            .counters_of_agent(capmvm_operator::USER_AGENT)
            .get(
                capmvm_sim::kube::Verb::Patch,
                "infrastructure.cluster.x-k8s.io/microvmmachinepools/status",
            )
    };
    let before = status_patches();
    let started = Instant::now();
    set_replicas(&w, 12).await;
    // Settled means the status says 12 ready: the last state was written.
    wait_pool(&w, 12).await;
    let elapsed = started.elapsed();
    let written = status_patches() - before;
    let allowed = elapsed.as_secs_f64().ceil() as u64 + 1;
    assert!(
        written <= allowed,
        "{written} status writes in {elapsed:?} (at most {allowed})"
    );
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_autoscalers_pick_is_the_instance_removed() {
    let w = pool_world(3, 4, 1, 0).await;
    let four = wait_pool(&w, 4).await;
    // Not the oldest or the newest: the pick, not the policy, decides.
    let pick = by_age(&four)[1].clone();
    machines_api(&w)
        .patch(
            &pick,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {DELETE_MACHINE_ANNOTATION: "2026-01-01T00:00:00Z"}}})),
        )
        .await
        .unwrap();
    // Copied down onto the instance, as the contract asks.
    wait_for("the delete mark on the instance", WAIT, POLL, || async {
        let i = Api::<MicrovmMachine>::namespaced(w.client.clone(), NS)
            .get(&pick)
            .await?;
        Ok(i.annotations()
            .contains_key(DELETE_MACHINE_ANNOTATION)
            .then_some(()))
    })
    .await
    .unwrap();
    // cluster-autoscaler lowers the replicas through the scale subresource.
    machine_pools(&w)
        .patch_scale(
            POOL,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    let three = wait_pool(&w, 3).await;
    let expected: BTreeSet<String> = names(&four).into_iter().filter(|n| *n != pick).collect();
    assert_eq!(names(&three), expected);
    w.shutdown().await;
}

/// Samples the pool every few milliseconds until it settled on the new template: the fewest ready
/// instances seen (Ready, neither it nor its Machine being deleted) and the most instances seen.
async fn roll_and_sample(w: &World, desired: usize) -> (usize, usize) {
    pools(w)
        .patch(
            POOL,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"memoryMb": 1536}}})),
        )
        .await
        .unwrap();
    let started = Instant::now();
    let (mut fewest_ready, mut most) = (usize::MAX, 0);
    loop {
        assert!(started.elapsed() < WAIT, "the roll did not finish");
        // Machines first: a Machine is deleted only after its replacement is ready, so an
        // instance list read after it shows that replacement.
        let ms = machines(w).await;
        let is = instances(w).await;
        let leaving: BTreeSet<String> = ms
            .iter()
            .filter(|m| m.metadata.deletion_timestamp.is_some())
            .map(ResourceExt::name_any)
            .collect();
        let ready = is
            .iter()
            .filter(|i| {
                is_ready(i)
                    && i.metadata.deletion_timestamp.is_none()
                    && !leaving.contains(&i.name_any())
            })
            .count();
        fewest_ready = fewest_ready.min(ready);
        most = most.max(is.len()).max(live_vms(w).len());
        let rolled =
            is.len() == desired && ready == desired && is.iter().all(|i| i.spec.memory_mb == 1536);
        if rolled {
            return (fewest_ready, most);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_roll_with_surge_one_keeps_every_instance_ready() {
    let w = pool_world(3, 3, 1, 0).await;
    let before = wait_pool(&w, 3).await;
    let (fewest_ready, most) = roll_and_sample(&w, 3).await;
    assert!(fewest_ready >= 3, "ready instances fell to {fewest_ready}");
    assert!(most <= 4, "{most} instances at once with maxSurge 1");
    let after = wait_pool(&w, 3).await;
    assert!(
        names(&after).is_disjoint(&names(&before)),
        "every instance replaced"
    );
    assert_no_duplicate_or_leak(&w, &after);
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_roll_without_surge_never_exceeds_the_desired_count() {
    let w = pool_world(3, 3, 0, 2).await;
    let before = wait_pool(&w, 3).await;
    let (fewest_ready, most) = roll_and_sample(&w, 3).await;
    assert!(most <= 3, "{most} instances at once with maxSurge 0");
    assert!(fewest_ready >= 1, "maxUnavailable 2 of 3 keeps one ready");
    let after = wait_pool(&w, 3).await;
    assert!(names(&after).is_disjoint(&names(&before)));
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bootstrap_only_change_rolls_nothing_and_new_instances_boot_with_it() {
    let w = pool_world(3, 2, 1, 0).await;
    let before = wait_pool(&w, 2).await;
    // CABPK rotating the join token rewrites the Secret.
    Api::<Secret>::namespaced(w.client.clone(), NS)
        .patch(
            SECRET,
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"value": cloud_config("rotated")}})),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = wait_pool(&w, 2).await;
    assert_eq!(names(&still), names(&before), "nothing rolled");

    set_replicas(&w, 3).await;
    let three = wait_pool(&w, 3).await;
    let new: Vec<String> = names(&three).difference(&names(&before)).cloned().collect();
    assert_eq!(new.len(), 1);
    let user_data = |name: &str| {
        let (_, vm) = live_vms(&w)
            .into_iter()
            .find(|(_, vm)| vm.spec.id == name)
            .unwrap();
        let encoded = vm
            .spec
            .metadata
            .get("user-data")
            .cloned()
            .unwrap_or_default();
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .unwrap(),
        )
        .unwrap()
    };
    assert!(
        user_data(&new[0]).contains("rotated"),
        "{}",
        user_data(&new[0])
    );
    assert!(user_data(&before[0].name_any()).contains("first"));
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_vanished_microvm_is_replaced_then_deleting_the_pool_leaves_nothing() {
    let w = pool_world(3, 3, 1, 0).await;
    let three = wait_pool(&w, 3).await;
    let victim = three[0].name_any();
    let uid = three[0]
        .spec
        .provider_id
        .as_deref()
        .unwrap()
        .parse::<capmvm_api::ProviderId>()
        .unwrap()
        .uid;
    assert!(
        w.hosts.iter().any(|h| h.control().forget(&uid)),
        "the microVM was on a host"
    );
    let after = wait_for("the vanished instance replaced", WAIT, POLL, || async {
        let is = wait_pool(&w, 3).await;
        Ok((!names(&is).contains(&victim)).then_some(is))
    })
    .await
    .unwrap();
    assert_no_duplicate_or_leak(&w, &after);

    // Deleting the MachinePool takes the pool, its Machines, instances and microVMs along.
    machine_pools(&w)
        .delete(POOL, &DeleteParams::default())
        .await
        .unwrap();
    wait_for("nothing of the pool left", WAIT, POLL, || async {
        let gone = instances(&w).await.is_empty()
            && machines(&w).await.is_empty()
            && live_vms(&w).is_empty()
            && w.all_vms().is_empty()
            && pools(&w)
                .list(&ListParams::default())
                .await?
                .items
                .is_empty();
        Ok(gone.then_some(()))
    })
    .await
    .unwrap();
    assert_rbac_covers_what_the_operator_did(&w);
    w.shutdown().await;
}

/// A pseudo-random delay in `0..max_ms` (the clock's nanoseconds: no seed to keep).
fn jitter(max_ms: u64) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    Duration::from_millis(u64::from(nanos) % max_ms.max(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_operator_killed_mid_scale_and_mid_roll_ends_right() {
    let mut w = pool_world(3, 1, 1, 0).await;
    wait_pool(&w, 1).await;

    // Mid-scale: up to 4, killed twice at random points.
    set_replicas(&w, 4).await;
    for _ in 0..2 {
        tokio::time::sleep(jitter(1500)).await;
        w.kill_operator().await;
        w.start_operator(&[]).unwrap();
    }
    let four = wait_pool(&w, 4).await;
    assert_no_duplicate_or_leak(&w, &four);

    // Mid-roll, and a scale down at once.
    pools(&w)
        .patch(
            POOL,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"memoryMb": 1536}}})),
        )
        .await
        .unwrap();
    set_replicas(&w, 3).await;
    for _ in 0..2 {
        tokio::time::sleep(jitter(2000)).await;
        w.kill_operator().await;
        w.start_operator(&[]).unwrap();
    }
    let three = wait_pool(&w, 3).await;
    assert!(three.iter().all(|i| i.spec.memory_mb == 1536));
    assert_no_duplicate_or_leak(&w, &three);
    w.shutdown().await;
}
