//! Deletions that leave no microVM, and the operator crashing mid-create.

use super::*;

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
    if let Err(e) = wait_cluster_objects_gone(&real, "team-b").await {
        real.keep_dir();
        let dump = cluster_objects(&real, "team-b", "yaml")
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
