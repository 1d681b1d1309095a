//! MachineDeployments, MachinePools and pause on real Cluster API, with least privilege checked.

use super::*;

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
