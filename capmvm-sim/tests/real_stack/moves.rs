//! `clusterctl move` to a second real management cluster.

use super::*;

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
