//! End to end on the real stack: etcd, kube-apiserver and kube-controller-manager, Cluster API
//! v1.14's own core and kubeadm bootstrap managers, our components rendered by the real clusterctl
//! and applied with the real kubectl, the operator as its ServiceAccount, hollow flintlock hosts.
//! Each test asserts what a user sees, and that the API server's audit log holds no 403 for our
//! ServiceAccount.
//!
//! Needs the upstream binaries (`hack/upstream.sh build`): under CI a missing one fails the test,
//! locally the test is reported as skipped.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod real_support;

use std::collections::BTreeSet;
use std::time::Duration;

use capmvm_api::MicrovmMachine;
use capmvm_api::capi::Machine;
use capmvm_api::keys::{DELETE_MACHINE_ANNOTATION, POOL_NAME_LABEL};
use capmvm_flintlock::Method;
use capmvm_sim::real::components;
use capmvm_sim::real::{BINARIES, RealStack};
use capmvm_sim::stack::{self, Stack};
use capmvm_sim::world::HostAuth;
use capmvm_sim::world::{DEMO_CLUSTER, MACHINEPOOL_CLUSTER, wait_for};
use capmvm_upstream::Binaries;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use real_support::least_privilege::{self, SecretNames};
use real_support::{
    POLL, WAIT, assert_no_forbidden, live_vms, options, wait_no_vms_in, wait_ready_with_nodes,
};
use serde_json::json;

/// One real stack at a time: each is an etcd, two kube-apiservers and four controllers, and the
/// machine has two cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A real stack with its operator running, or `None` (the test skipped) without the binaries.
async fn real_stack(test: &str) -> Option<RealStack> {
    Binaries::for_test(test, BINARIES)?;
    let mut real = RealStack::start(options())
        .await
        .expect("the real stack starts");
    real.start_operator(&[]).expect("the operator starts");
    Some(real)
}

/// Applies the demo template (and the pool flavor's pool when `pool` > 0) for Cluster `ns/name`.
async fn apply_cluster(
    real: &mut RealStack,
    ns: &str,
    name: &str,
    control_planes: usize,
    workers: usize,
    pool: usize,
) {
    apply_cluster_with(real, ns, name, [control_planes, workers, pool], |_| {}).await;
}

/// [`apply_cluster`] with `[control planes, workers, pool]`, the hosts' credentials (when they
/// need any) created and named in the MicrovmCluster, and `edit` applied to both templates' objects.
async fn apply_cluster_with(
    real: &mut RealStack,
    ns: &str,
    name: &str,
    [control_planes, workers, pool]: [usize; 3],
    edit: impl Fn(&mut Vec<DynamicObject>),
) {
    let vip = real.prepare_cluster(ns, name).await.unwrap();
    let (token, tls) = stack::create_credentials(&*real, ns, name).await.unwrap();
    let vars = |workers: usize| {
        vec![
            ("CLUSTER_NAME", name.to_string()),
            ("NAMESPACE", ns.to_string()),
            ("CONTROL_PLANE_VIP", vip.to_string()),
            ("CONTROL_PLANE_MACHINE_COUNT", control_planes.to_string()),
            ("WORKER_MACHINE_COUNT", workers.to_string()),
        ]
    };
    stack::apply_template(&*real, DEMO_CLUSTER, &vars(workers), |objects| {
        for o in objects.iter_mut() {
            if o.types.as_ref().is_some_and(|t| t.kind == "MicrovmCluster") {
                if let Some(token) = &token {
                    o.data["spec"]["placement"]["staticPool"]["basicAuthSecret"] = json!(token);
                }
                if let Some(tls) = &tls {
                    o.data["spec"]["tlsSecretRef"] = json!(tls);
                }
            }
        }
        edit(objects)
    })
    .await
    .unwrap();
    if pool > 0 {
        stack::apply_template(&*real, MACHINEPOOL_CLUSTER, &vars(pool), |objects| {
            objects.retain(|o| {
                o.types.as_ref().is_some_and(|t| {
                    matches!(
                        t.kind.as_str(),
                        "MachinePool" | "MicrovmMachinePool" | "KubeadmConfig"
                    )
                })
            });
            edit(objects)
        })
        .await
        .unwrap();
    }
}

async fn machines_in(real: &RealStack, ns: &str) -> Vec<Machine> {
    Api::<Machine>::namespaced(real.client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
}

/// A MachineDeployment scaled up and down, a MachinePool whose Machines real core creates for our
/// instances and whose scale-down takes exactly the Machine the autoscaler marked, and a paused
/// Cluster that changes nothing on the hosts until it is resumed.
///
/// Run with basic-auth and mTLS to the hosts and leader election, it then checks least privilege
/// (issue 36): the shipped roles against the calls in the audit log, the Secrets read against those
/// our objects name, and no password, private key or bootstrap data in the operator's log, any
/// Event or our objects' status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machine_deployments_pools_and_pause_on_real_capi() {
    let _one = ONE_AT_A_TIME.lock().await;
    if Binaries::for_test("machine_deployments_pools_and_pause_on_real_capi", BINARIES).is_none() {
        return;
    }
    let mut opts = options();
    opts.auth = HostAuth::MtlsAndToken(HOST_PASSWORD.into());
    // As the shipped Deployment runs it, so the leader-election Role is exercised too.
    opts.operator_flags.extend([
        "--leader-elect".to_string(),
        format!("--leader-election-namespace={}", components::NAMESPACE),
    ]);
    let mut real = RealStack::start(opts).await.expect("the real stack starts");
    real.start_operator(&[]).expect("the operator starts");
    let named = SecretNames::watch(&real.client);
    let marker = format!(
        "capmvm-bootstrap-marker-{}",
        k8s_openapi::jiff::Timestamp::now().as_nanosecond()
    );
    let ns = "default";
    apply_cluster_with(&mut real, ns, "demo", [1, 2, 2], |objects| {
        least_privilege::bootstrap_file(objects, &marker)
    })
    .await;
    let ready = wait_ready_with_nodes(&real, ns, "demo", 5).await;

    // Real core made a Machine for each pool instance, of the same name, owned by the MachinePool,
    // and became the instance's controller.
    let machines = machines_in(&real, ns).await;
    let instances: Vec<&MicrovmMachine> = ready
        .iter()
        .filter(|m| m.labels().contains_key(POOL_NAME_LABEL))
        .collect();
    assert_eq!(instances.len(), 2);
    for instance in &instances {
        let machine = machines
            .iter()
            .find(|m| m.name_any() == instance.name_any())
            .expect("a MachinePool Machine per instance");
        assert!(
            machine
                .owner_references()
                .iter()
                .any(|o| o.kind == "MachinePool" && o.controller == Some(true)),
            "{:?}",
            machine.owner_references()
        );
        let controller = instance
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true))
            .expect("the instance has a controller");
        assert_eq!(
            (controller.kind.as_str(), controller.name.as_str()),
            ("Machine", machine.name_any().as_str())
        );
    }

    // The MachineDeployment: 2 -> 3 -> 1 with the real kubectl.
    let md = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "MachineDeployment"),
        "machinedeployments",
    );
    real.scale(&md, ns, "demo-md-0", 3).await.unwrap();
    wait_ready_with_nodes(&real, ns, "demo", 6).await;
    real.scale(&md, ns, "demo-md-0", 1).await.unwrap();
    wait_ready_with_nodes(&real, ns, "demo", 4).await;
    assert_eq!(live_vms(&real).len(), 4, "{:?}", live_vms(&real));

    // The autoscaler's path: mark one pool Machine, lower the replicas through the scale
    // subresource; exactly that instance's microVM goes.
    let victim = instances[0].name_any();
    let survivor = instances[1].name_any();
    let survivor_uid = instances[1].spec.provider_id.clone().unwrap();
    Api::<Machine>::namespaced(real.client.clone(), ns)
        .patch(
            &victim,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {DELETE_MACHINE_ANNOTATION: "true"}}}),
            ),
        )
        .await
        .unwrap();
    let pool = capmvm_sim::capi::machinepool::machine_pool_resource();
    real.scale(&pool, ns, "demo-mp-0", 1).await.unwrap();
    let after = wait_ready_with_nodes(&real, ns, "demo", 3).await;
    let names: BTreeSet<String> = after.iter().map(|m| m.name_any()).collect();
    assert!(
        !names.contains(&victim),
        "the marked instance went: {names:?}"
    );
    let kept = after.iter().find(|m| m.name_any() == survivor).unwrap();
    assert_eq!(
        kept.spec.provider_id.as_deref(),
        Some(survivor_uid.as_str())
    );
    assert!(
        !live_vms(&real)
            .iter()
            .any(|(_, _, id)| id == &format!("{ns}/{victim}")),
        "the victim's microVM is gone"
    );

    // Paused, on an object core has already made and we alone would act on: the operator down, a
    // scale-up gives a Machine with its bootstrap data and a MicrovmMachine without a microVM.
    // Then the Cluster is paused and the operator started: it marks that MicrovmMachine Paused and
    // creates nothing (core's pause of the MachineDeployment plays no part: the Machine was made
    // before it); resumed, the microVM is created.
    real.stop_operator().await;
    real.scale(&md, ns, "demo-md-0", 2).await.unwrap();
    let pending = wait_for(
        "a MicrovmMachine whose Machine has its bootstrap data, without a microVM",
        WAIT,
        POLL,
        || async {
            let machines = machines_in(&real, ns).await;
            let infra = Api::<MicrovmMachine>::namespaced(real.client.clone(), ns)
                .list(&ListParams::default())
                .await?
                .items;
            Ok(infra.into_iter().find_map(|m| {
                let owner = m.owner_references().iter().find(|o| o.kind == "Machine")?;
                let machine = machines.iter().find(|x| x.name_any() == owner.name)?;
                (m.spec.provider_id.is_none() && machine.spec.bootstrap.data_secret_name.is_some())
                    .then(|| m.name_any())
            }))
        },
    )
    .await
    .unwrap();
    let creates_before = stack::host_calls(&real.hosts, Method::Create);
    real.kubectl
        .run(&[
            "patch",
            "cluster",
            "demo",
            "-n",
            ns,
            "--type=merge",
            "-p",
            r#"{"spec":{"paused":true}}"#,
        ])
        .await
        .unwrap();
    real.start_operator(&[]).unwrap();
    let infra = Api::<MicrovmMachine>::namespaced(real.client.clone(), ns);
    wait_for("the pending MicrovmMachine Paused", WAIT, POLL, || async {
        let m = infra.get(&pending).await?;
        let paused = m.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Paused" && c.status == "True")
        });
        Ok(paused.then_some(()))
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        stack::host_calls(&real.hosts, Method::Create),
        creates_before,
        "nothing created while paused"
    );
    assert_eq!(infra.get(&pending).await.unwrap().spec.provider_id, None);
    real.kubectl
        .run(&[
            "patch",
            "cluster",
            "demo",
            "-n",
            ns,
            "--type=merge",
            "-p",
            r#"{"spec":{"paused":false}}"#,
        ])
        .await
        .unwrap();
    wait_ready_with_nodes(&real, ns, "demo", 4).await;

    // `migrate-storage`, as a user runs it after an upgrade (its rules are the operator's too).
    let migrated = real.migrate_storage().await.unwrap();
    assert!(migrated.is_ok(), "{migrated:?}");
    assert_no_forbidden(&real);
    let credentials: BTreeSet<(String, String)> = ["demo-flintlock-token", "demo-flintlock-tls"]
        .map(|n| (ns.to_string(), n.to_string()))
        .into();
    let table = least_privilege::assert_least_privilege(&real, &named, &credentials).await;
    eprintln!("the operator's roles against its calls:\n{table}");
    let secrets = least_privilege::secrets_of_the_run(&real, &named, HOST_PASSWORD, &marker).await;
    least_privilege::assert_secrets_nowhere(&real, &secrets).await;
    // The watches end before the API server does.
    drop(named);
    real.shutdown().await;
}

/// The hosts' basic-auth password in the pause test.
const HOST_PASSWORD: &str = "host-basic-auth-password-s3cret";

/// A namespace deleted whole, and a MicrovmCluster deleted before its Cluster: every microVM goes,
/// every finalizer is released, and nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_and_infra_cluster_first_deletions_leave_no_microvm() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut real) =
        real_stack("namespace_and_infra_cluster_first_deletions_leave_no_microvm").await
    else {
        return;
    };
    apply_cluster(&mut real, "team-a", "alpha", 1, 1, 1).await;
    apply_cluster(&mut real, "team-b", "beta", 1, 1, 0).await;
    wait_ready_with_nodes(&real, "team-a", "alpha", 3).await;
    wait_ready_with_nodes(&real, "team-b", "beta", 2).await;

    real.kubectl
        .run(&["delete", "namespace", "team-a", "--wait=false"])
        .await
        .unwrap();
    real.kubectl
        .run(&[
            "delete",
            "microvmcluster",
            "beta",
            "-n",
            "team-b",
            "--wait=false",
        ])
        .await
        .unwrap();
    real.kubectl
        .run(&["delete", "cluster", "beta", "-n", "team-b", "--wait=false"])
        .await
        .unwrap();
    wait_no_vms_in(&real, "team-a").await;
    wait_no_vms_in(&real, "team-b").await;
    wait_for("namespace team-a gone", WAIT, POLL, || async {
        let gone = real
            .kubectl
            .run(&[
                "get",
                "namespace",
                "team-a",
                "--ignore-not-found",
                "-o",
                "name",
            ])
            .await?
            .trim()
            .is_empty();
        Ok(gone.then_some(()))
    })
    .await
    .unwrap();
    let left = wait_for("team-b's cluster objects gone", WAIT, POLL, || async {
        let left = real
            .kubectl
            .run(&[
                "get",
                "clusters.cluster.x-k8s.io,machines.cluster.x-k8s.io,microvmmachines,microvmclusters",
                "-n",
                "team-b",
                "-o",
                "name",
            ])
            .await?;
        Ok(left.trim().is_empty().then_some(()))
    })
    .await;
    if let Err(e) = left {
        real.keep_dir();
        let dump = real
            .kubectl
            .run(&["get", "clusters.cluster.x-k8s.io,machines.cluster.x-k8s.io,microvmmachines,microvmclusters", "-n", "team-b", "-o", "yaml"])
            .await
            .unwrap_or_default();
        panic!("{e}; left (logs in {}):\n{dump}", real.dir.display());
    }
    assert!(real.all_vms().is_empty(), "{:?}", live_vms(&real));
    assert_no_forbidden(&real);
    real.shutdown().await;
}

/// The operator killed right after a create, before it could record anything: restarted, it adopts
/// that microVM (one per machine, no second create); then SIGKILLed in the middle of a scale-up's
/// creates: restarted, every machine has exactly one microVM. And a MicrovmMachine with invalid
/// fields is refused by the real API server with our schema's message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_create_adopts_and_an_invalid_spec_is_refused() {
    let _one = ONE_AT_A_TIME.lock().await;
    if Binaries::for_test(
        "a_crash_after_create_adopts_and_an_invalid_spec_is_refused",
        BINARIES,
    )
    .is_none()
    {
        return;
    }
    // One MicrovmMachine reconciled at a time, so a scale-up's creates reach the hosts one by one
    // (below, each held 3 s at the host): the kill then lands between them.
    let mut opts = options();
    opts.operator_flags
        .push("--microvmmachine-concurrency=1".into());
    let mut real = RealStack::start(opts).await.unwrap();
    real.start_operator(&[("CAPMVM_FAULT_CRASH_AT", "after-create")])
        .unwrap();
    // Workers need a control plane on real CAPI (CABPK renders their join once it is initialised).
    apply_cluster(&mut real, "default", "crash", 1, 1, 0).await;
    // The operator exits with 86 at the fault, right after its first create.
    let exited = real
        .wait_operator_exit(WAIT)
        .await
        .expect("the operator exits at the fault");
    assert_eq!(exited, 86, "the fault's exit code");
    let creates = |real: &RealStack| stack::host_calls(&real.hosts, Method::Create);
    assert_eq!(creates(&real), 1, "one create before the crash");
    real.start_operator(&[]).unwrap();
    wait_ready_with_nodes(&real, "default", "crash", 2).await;
    assert_eq!(
        creates(&real),
        2,
        "no second create for the adopted machine"
    );
    let vms = live_vms(&real);
    let ids: BTreeSet<&str> = vms.iter().map(|(_, _, id)| id.as_str()).collect();
    assert_eq!(
        (vms.len(), ids.len()),
        (2, 2),
        "one microVM per machine: {vms:?}"
    );

    // SIGKILLed in the middle of a scale-up: four more workers, each create held 3 s at the host
    // and the creates one at a time, the operator killed once the first of the four reached a host,
    // with the other three still to come (asserted), then restarted. Every machine ends with one
    // microVM, none created twice.
    let md = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "MachineDeployment"),
        "machinedeployments",
    );
    const HELD: Duration = Duration::from_secs(3);
    for h in &real.hosts {
        h.control().set_create_latency(HELD);
    }
    real.scale(&md, "default", "crash-md-0", 5).await.unwrap();
    wait_for(
        "the scale-up's first create on a host",
        WAIT,
        Duration::from_millis(20),
        || async { Ok((creates(&real) > 2).then_some(())) },
    )
    .await
    .unwrap();
    real.kill_operator().await;
    let killed_at = creates(&real);
    assert_eq!(
        killed_at, 3,
        "killed after 1 of the scale-up's 4 creates, 3 still to come"
    );
    // The create in flight at the kill: carried out after its hold, or dropped with the connection.
    tokio::time::sleep(HELD + Duration::from_secs(1)).await;
    let carried_out = live_vms(&real).len() - 2;
    assert!(carried_out <= 1, "{:?}", live_vms(&real));
    assert_eq!(
        creates(&real),
        3,
        "nothing created while the operator is dead"
    );
    for h in &real.hosts {
        h.control().set_create_latency(Duration::ZERO);
    }
    real.start_operator(&[]).unwrap();
    let ready = wait_ready_with_nodes(&real, "default", "crash", 6).await;
    let vms = live_vms(&real);
    let ids: BTreeSet<&str> = vms.iter().map(|(_, _, id)| id.as_str()).collect();
    assert_eq!(
        (vms.len(), ids.len()),
        (6, 6),
        "one microVM per machine after the kill: {vms:?}"
    );
    // One create per machine; the one in flight at the kill counts twice only if the host dropped
    // it (then it created nothing), and nothing was deleted to undo a second microVM.
    assert_eq!(creates(&real), 6 + (1 - carried_out) as u64);
    assert_eq!(stack::host_calls(&real.hosts, Method::Delete), 0);
    assert_eq!(ready.len(), 6);

    let invalid = r#"apiVersion: infrastructure.cluster.x-k8s.io/v1alpha2
kind: MicrovmMachine
metadata:
  name: invalid
  namespace: default
spec:
  vcpu: 0
  memoryMb: -1
  rootVolume:
    id: root
    image: ghcr.io/liquidmetal-dev/capmvm-kubernetes:1.23.5
  kernel:
    image: ghcr.io/liquidmetal-dev/kernel-bin:5.10.77
    filename: boot/vmlinux
"#;
    let refused = real
        .kubectl
        .apply(invalid, &[])
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("spec.vcpu"), "{refused}");
    assert!(refused.contains("spec.memoryMb"), "{refused}");
    assert!(
        refused.contains("should be greater than or equal to 1"),
        "the schema's words: {refused}"
    );
    assert_no_forbidden(&real);
    real.shutdown().await;
}

/// `clusterctl move` to a second real management cluster. While a Machine is still provisioning,
/// the real clusterctl refuses (nothing moves); once every Machine has its Node, it moves, and the
/// target's operator adopts every microVM as it is (no create, no delete, same providerIDs), scales,
/// and deletes the cluster with nothing left on the hosts or in the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusterctl_move_to_a_second_management_cluster() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut source) = real_stack("clusterctl_move_to_a_second_management_cluster").await
    else {
        return;
    };
    let ns = "default";
    apply_cluster(&mut source, ns, "moved", 1, 1, 0).await;
    wait_ready_with_nodes(&source, ns, "moved", 2).await;
    let target = source.start_move_target().await.unwrap();
    let mut target = target;
    target.start_operator(&[]).unwrap();
    let to = target.kubeconfig().display().to_string();
    let from = source.kubeconfig().display().to_string();
    let md = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "MachineDeployment"),
        "machinedeployments",
    );

    // Mid-creation: a worker still provisioning makes clusterctl refuse the move. The hosts take
    // 30 s for this one microVM, so the move is asked while its Machine surely has no Node yet
    // (with 500 ms a loaded machine could see the Node before clusterctl looks).
    for h in &source.hosts {
        h.control().set_provision_time(Duration::from_secs(30));
    }
    source.scale(&md, ns, "moved-md-0", 2).await.unwrap();
    wait_for("the third Machine exists", WAIT, POLL, || async {
        let machines = Api::<DynamicObject>::namespaced_with(
            source.client.clone(),
            ns,
            &ApiResource::erase::<Machine>(&()),
        )
        .list(&ListParams::default())
        .await?;
        Ok((machines.items.len() == 3).then_some(()))
    })
    .await
    .unwrap();
    let move_args = [
        "move",
        "--kubeconfig",
        &from,
        "--to-kubeconfig",
        &to,
        "-n",
        ns,
    ];
    let refused = source
        .clusterctl
        .run(&move_args, &[])
        .await
        .expect_err("clusterctl refuses to move a provisioning Machine")
        .to_string();
    assert!(
        refused.contains("cannot start the move operation while"),
        "{refused}"
    );
    for h in &source.hosts {
        h.control().set_provision_time(options().provision_time);
    }
    let before = wait_ready_with_nodes(&source, ns, "moved", 3).await;
    let calls = |real: &RealStack, m: Method| stack::host_calls(&real.hosts, m);
    let (creates, deletes) = (
        calls(&source, Method::Create),
        calls(&source, Method::Delete),
    );
    let vms_before: BTreeSet<String> = live_vms(&source)
        .into_iter()
        .map(|(_, uid, _)| uid)
        .collect();

    source.clusterctl.run(&move_args, &[]).await.unwrap();
    let after = wait_ready_with_nodes(&target, ns, "moved", 3).await;
    let ids = |ms: &[MicrovmMachine]| -> BTreeSet<(String, Option<String>)> {
        ms.iter()
            .map(|m| (m.name_any(), m.spec.provider_id.clone()))
            .collect()
    };
    assert_eq!(ids(&after), ids(&before), "same machines, same providerIDs");
    assert_eq!(
        (
            calls(&source, Method::Create),
            calls(&source, Method::Delete)
        ),
        (creates, deletes),
        "no microVM created or deleted by the move"
    );
    let vms_after: BTreeSet<String> = live_vms(&source)
        .into_iter()
        .map(|(_, uid, _)| uid)
        .collect();
    assert_eq!(vms_after, vms_before);
    let left = source
        .kubectl
        .run(&[
            "get",
            "clusters.cluster.x-k8s.io,machines.cluster.x-k8s.io,microvmmachines,microvmclusters",
            "-n",
            ns,
            "-o",
            "name",
        ])
        .await
        .unwrap();
    assert!(left.trim().is_empty(), "the source keeps nothing: {left}");

    // The target runs it: a scale-up, then the deletion.
    target.scale(&md, ns, "moved-md-0", 3).await.unwrap();
    wait_ready_with_nodes(&target, ns, "moved", 4).await;
    assert_eq!(
        calls(&source, Method::Create),
        creates + 1,
        "one create for one more machine"
    );
    target
        .kubectl
        .run(&["delete", "cluster", "moved", "-n", ns, "--wait=false"])
        .await
        .unwrap();
    wait_no_vms_in(&source, ns).await;
    assert_no_forbidden(&source);
    assert_no_forbidden(&target);
    target.shutdown().await;
    source.shutdown().await;
}

/// Ready Nodes of cluster `ns/name` in its workload API whose names start with `prefix`.
fn ready_nodes(real: &RealStack, ns: &str, name: &str, prefix: &str) -> usize {
    let key = capmvm_sim::capi::workload::ClusterKey::new(ns, name);
    real.workloads()
        .nodes(&key)
        .iter()
        .filter(|n| n.name_any().starts_with(prefix))
        .filter(|n| {
            n.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            })
        })
        .count()
}

/// Host maintenance through real Cluster API (issue 35): one of three hosts, under a
/// MachineDeployment of 4 and a MachinePool of 3, is cordoned (nothing moves) and then evacuated.
/// The MachineDeployment's machines there report `HostEvacuating`, which real core mirrors as the
/// Machine's `InfrastructureReady=False`; real core's MachineHealthCheck remediates them, one at a
/// time (`remediation.maxInFlight: 1`), through the MachineSet; the pool replaces its own within
/// `maxUnavailable: 0`. The host ends empty, every replacement lands elsewhere, no microVM is
/// created twice, the pool's Ready Nodes never drop below 3 and the MachineDeployment's below 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evacuated_host_is_emptied_through_real_capi_within_budget() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut real) =
        real_stack("an_evacuated_host_is_emptied_through_real_capi_within_budget").await
    else {
        return;
    };
    let ns = "maintenance";
    apply_cluster(&mut real, ns, "demo", 1, 4, 3).await;
    let ready = wait_ready_with_nodes(&real, ns, "demo", 8).await;

    // The victim: the host running the most workers, and not the control plane (KubeadmControlPlane
    // remediation is not what this shows).
    let control_plane_host = ready
        .iter()
        .find(|m| m.labels().contains_key("cluster.x-k8s.io/control-plane"))
        .and_then(|m| m.status.as_ref()?.host.clone())
        .unwrap();
    let mut per_host: std::collections::BTreeMap<String, usize> = Default::default();
    for (host, _, _) in live_vms(&real) {
        *per_host.entry(host).or_default() += 1;
    }
    let (victim, moving) = per_host
        .iter()
        .filter(|(h, _)| **h != control_plane_host)
        .max_by_key(|(_, n)| **n)
        .map(|(h, n)| (h.clone(), *n))
        .unwrap();
    let index = real
        .hosts
        .iter()
        .position(|h| h.endpoint() == victim)
        .unwrap();

    // What a user sets up once: remediation one at a time, and a health check on the mirrored
    // infrastructure condition.
    real.kubectl
        .run(&[
            "patch",
            "machinedeployment",
            "demo-md-0",
            "-n",
            ns,
            "--type=merge",
            "-p",
            r#"{"spec":{"remediation":{"maxInFlight":1}}}"#,
        ])
        .await
        .unwrap();
    let mhc = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "MachineHealthCheck",
        "metadata": {"name": "workers-evacuation", "namespace": ns},
        "spec": {
            "clusterName": "demo",
            "selector": {"matchLabels": {"cluster.x-k8s.io/deployment-name": "demo-md-0"}},
            "checks": {"unhealthyMachineConditions": [
                {"type": "InfrastructureReady", "status": "False", "timeoutSeconds": 0},
            ]},
        },
    });
    let file = real.dir.join("mhc.json");
    std::fs::write(&file, mhc.to_string()).unwrap();
    real.kubectl
        .run(&["apply", "-f", file.to_str().unwrap()])
        .await
        .unwrap();

    let set_maintenance = |value: &'static str| {
        let real = &real;
        async move {
            let path = format!("/spec/placement/staticPool/hosts/{index}/maintenance");
            let patch = format!(r#"[{{"op":"add","path":"{path}","value":"{value}"}}]"#);
            real.kubectl
                .run(&[
                    "patch",
                    "microvmcluster",
                    "demo",
                    "-n",
                    ns,
                    "--type=json",
                    "-p",
                    &patch,
                ])
                .await
                .unwrap();
        }
    };
    let host_state = |want: capmvm_api::HostState, microvms: Option<i32>| {
        let real = &real;
        let victim = victim.clone();
        async move {
            wait_for(&format!("host {victim} {want:?}"), WAIT, POLL, || async {
                let mc = Api::<capmvm_api::MicrovmCluster>::namespaced(real.client.clone(), ns)
                    .get("demo")
                    .await?;
                let host = mc
                    .status
                    .and_then(|s| s.hosts.into_iter().find(|h| h.endpoint == victim));
                Ok(host
                    .filter(|h| h.state == want && microvms.is_none_or(|n| h.microvms == n))
                    .map(|_| ()))
            })
            .await
            .unwrap();
        }
    };

    // Cordoned: nothing moves.
    let creates_before = stack::host_calls(&real.hosts, Method::Create);
    let victim_creates_before = stack::host_calls(&real.hosts[index..=index], Method::Create);
    set_maintenance("Cordon").await;
    host_state(capmvm_api::HostState::Cordoned, None).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        stack::host_calls(&real.hosts, Method::Create),
        creates_before
    );
    assert_eq!(ready_nodes(&real, ns, "demo", ""), 8);

    // Evacuated: emptied within the budget.
    set_maintenance("Evacuate").await;
    let lowest_md = std::sync::atomic::AtomicUsize::new(usize::MAX);
    let lowest_pool = std::sync::atomic::AtomicUsize::new(usize::MAX);
    wait_for(
        &format!(
            "host {victim} emptied (operator log {})",
            real.operator_log().display()
        ),
        WAIT * 2,
        POLL,
        || async {
            let nodes = ready_nodes(&real, ns, "demo", "");
            let (md, pool) = (
                ready_nodes(&real, ns, "demo", "demo-md-0"),
                ready_nodes(&real, ns, "demo", "demo-mp-0"),
            );
            lowest_md.fetch_min(md, std::sync::atomic::Ordering::Relaxed);
            lowest_pool.fetch_min(pool, std::sync::atomic::Ordering::Relaxed);
            let vms = live_vms(&real);
            let done = !vms.iter().any(|(h, _, _)| *h == victim) && vms.len() == 8 && nodes == 8;
            Ok(done.then_some(()))
        },
    )
    .await
    .unwrap();
    wait_ready_with_nodes(&real, ns, "demo", 8).await;
    host_state(capmvm_api::HostState::Evacuating, Some(0)).await;
    let (lowest_md, lowest_pool) = (lowest_md.into_inner(), lowest_pool.into_inner());
    eprintln!(
        "lowest Ready Nodes: MachineDeployment {lowest_md} of 4, MachinePool {lowest_pool} of 3"
    );
    assert!(
        lowest_pool >= 3,
        "the pool's Ready Nodes dropped to {lowest_pool} (maxUnavailable 0)"
    );
    // Real core's MachineSet counts a remediation finished once the replacement Machine exists,
    // not once its Node is Ready: with every machine of the host released at once it started the
    // next while the first replacement's Node registered (measured: 2 of 4). The operator releases
    // them one at a time, each only once its MachineDeployment is whole and Ready again.
    assert!(
        lowest_md >= 3,
        "the MachineDeployment's Ready Nodes dropped to {lowest_md}: machines were released to CAPI more than one at a time"
    );
    assert_eq!(
        stack::host_calls(&real.hosts, Method::Create) - creates_before,
        u64::try_from(moving).unwrap(),
        "one create per evacuated microVM, none twice"
    );
    assert_eq!(
        stack::host_calls(&real.hosts[index..=index], Method::Create),
        victim_creates_before,
        "no replacement landed on the evacuated host"
    );
    assert_no_forbidden(&real);
    real.shutdown().await;
}
