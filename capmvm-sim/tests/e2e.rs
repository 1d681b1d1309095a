//! End to end: the API emulator, hollow flintlock hosts, the CAPI stand-in and the real operator in a
//! process of its own. No mocks: every assertion reads what a user would see through the API or on
//! the hosts.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use capmvm_api::capi::{Cluster, Machine};
use capmvm_api::keys::MACHINE_FINALIZER;
use capmvm_api::{MicrovmCluster, MicrovmMachine, ProviderId, VmState};
use capmvm_flintlock::{Method, MicrovmState};
use capmvm_sim::capi::MachineDeployment;
use capmvm_sim::kube::Verb;
use capmvm_sim::world::{HostAuth, World, wait_for};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

mod e2e_support;
use e2e_support::*;

/// Waits until exactly `n` MicrovmMachines exist and all are Ready.
async fn wait_ready(w: &World, n: usize) -> Vec<MicrovmMachine> {
    wait_ready_within(w, n, WAIT).await
}

/// The demo MicrovmCluster's `HostTransportSecure` condition.
async fn transport_condition(
    w: &World,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    Api::<MicrovmCluster>::namespaced(w.client.clone(), NS)
        .get("demo")
        .await
        .unwrap()
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "HostTransportSecure")
        .expect("the transport is reported")
}

async fn scale(w: &World, deployment: &str, replicas: usize) {
    Api::<MachineDeployment>::namespaced(w.client.clone(), NS)
        .patch(
            deployment,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .unwrap();
}

async fn delete_cluster_and_wait(w: &World) {
    Api::<Cluster>::namespaced(w.client.clone(), NS)
        .delete("demo", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(
        "the cluster, its machines and microVMs to be gone",
        WAIT,
        POLL,
        || async {
            let cluster = Api::<Cluster>::namespaced(w.client.clone(), NS)
                .get_opt("demo")
                .await?;
            let machines = w.microvm_machines(NS).await?;
            Ok((cluster.is_none() && machines.is_empty() && w.all_vms().is_empty()).then_some(()))
        },
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_create_and_delete() {
    let w = world(options(3)).await;
    w.apply_demo_cluster(&counts(1, 2), |_| {}).await.unwrap();
    let machines = wait_ready(&w, 3).await;

    let vms = live_vms(&w);
    assert_eq!(vms.len(), 3, "one microVM per machine");
    for m in &machines {
        let status = m.status.clone().unwrap();
        let pid: ProviderId = m.spec.provider_id.as_deref().unwrap().parse().unwrap();
        assert_eq!(
            Some(pid.host.to_string()),
            status.host,
            "providerID names the recorded host"
        );
        let vm = vms
            .iter()
            .find(|(_, vm)| vm.uid() == pid.uid)
            .expect("the providerID's microVM exists");
        assert_eq!(vm.0, pid.host.to_string());
        assert_eq!(vm.1.spec.id, m.name_any());
        assert_eq!(status.vm_state, Some(VmState::Running));
        assert_eq!(status.initialization.unwrap().provisioned, Some(true));
        assert!(status.failure_domain.is_some());
        assert!(m.finalizers().contains(&MACHINE_FINALIZER.to_string()));
        let reasons: Vec<String> = events_for(&w, &m.name_any())
            .await
            .into_iter()
            .filter_map(|e| e.reason)
            .collect();
        assert!(
            reasons.contains(&"MicrovmCreated".to_string()),
            "{reasons:?}"
        );
    }
    // CAPI sees the same providerIDs on its Machines, and the cluster's failure domains.
    let capi_machines = Api::<Machine>::namespaced(w.client.clone(), NS)
        .list(&ListParams::default())
        .await
        .unwrap();
    for m in &machines {
        let cm = capi_machines
            .iter()
            .find(|c| c.name_any() == m.name_any())
            .unwrap();
        assert_eq!(cm.spec.provider_id, m.spec.provider_id);
    }
    let mc = Api::<MicrovmCluster>::namespaced(w.client.clone(), NS)
        .get("demo")
        .await
        .unwrap();
    assert_eq!(mc.status.unwrap().failure_domains.len(), 3);

    // An edit of a running machine's size is reported, not applied, and nothing is re-created.
    let edited = machines[0].name_any();
    Api::<MicrovmMachine>::namespaced(w.client.clone(), NS)
        .patch(
            &edited,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"vcpu": 4}})),
        )
        .await
        .unwrap();
    let condition = |m: &MicrovmMachine| {
        m.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == "MicrovmUpToDate")
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    };
    let (_, _, message) = wait_for("the edit to be reported", WAIT, POLL, || async {
        let m = Api::<MicrovmMachine>::namespaced(w.client.clone(), NS)
            .get(&edited)
            .await?;
        Ok(condition(&m).filter(|(s, r, _)| s == "False" && r == "SpecChangedAfterCreate"))
    })
    .await
    .unwrap();
    assert!(
        message.contains("spec.vcpu is 4, the microVM has 2"),
        "{message}"
    );
    // Events are published after the status write that carries the condition.
    wait_for("the SpecChangeNotApplied event", WAIT, POLL, || async {
        let events = events_for(&w, &edited).await;
        Ok(events
            .iter()
            .any(|e| e.reason.as_deref() == Some("SpecChangeNotApplied"))
            .then_some(()))
    })
    .await
    .unwrap();
    assert_eq!(creates_on_hosts(&w), 3, "nothing re-created");
    assert!(
        w.microvm_machines(NS).await.unwrap().iter().all(is_ready),
        "still Ready"
    );

    // Deletion deletes the microVM first and releases the finalizer only once the host no longer
    // has it: with deletes held in DELETING on the hosts, the machines stay, finalizer and all.
    for h in &w.hosts {
        h.control().hang_deletes(true);
    }
    Api::<Cluster>::namespaced(w.client.clone(), NS)
        .delete("demo", &DeleteParams::default())
        .await
        .unwrap();
    let held = wait_for("every microVM to be deleting", WAIT, POLL, || async {
        let all = w.all_vms();
        let deleting = all.len() == 3
            && all
                .iter()
                .all(|(_, vm)| vm.state() == MicrovmState::Deleting);
        if !deleting {
            return Ok(None);
        }
        let ms = w.microvm_machines(NS).await?;
        Ok(Some(ms))
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held_now = w.microvm_machines(NS).await.unwrap();
    assert_eq!(
        held_now.len(),
        3,
        "no machine is released while its microVM is deleting"
    );
    for m in held.iter().chain(&held_now) {
        assert!(m.meta().deletion_timestamp.is_some());
        assert!(
            m.finalizers().contains(&MACHINE_FINALIZER.to_string()),
            "{}: finalizer kept while the host deletes",
            m.name_any()
        );
    }
    for h in &w.hosts {
        h.control().hang_deletes(false);
    }
    delete_cluster_and_wait(&w).await;

    // The generated ClusterRole grants every request the operator made, create to delete.
    let used = w.emulator.counters_of_agent(capmvm_operator::USER_AGENT);
    assert!(used.total() > 0);
    for (verb, resource, _) in used.iter() {
        // Discovery (the start-up check of served APIs) is open to every authenticated user
        // through the built-in system:discovery ClusterRole.
        let Some((group, rest)) = resource.split_once('/') else {
            assert_eq!(resource, "discovery", "{verb} on {resource}");
            continue;
        };
        let group = if group == "core" { "" } else { group };
        assert!(
            capmvm_operator::rbac::allows(group, rest, verb.as_str()),
            "the ClusterRole lacks {verb} on {resource}"
        );
    }
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_object_is_reconciled_with_zero_writes() {
    let mut o = options(2);
    o.operator_flags.push("--sync-period=2s".into());
    let w = world(o).await;
    w.apply_demo_cluster(&counts(0, 2), |_| {}).await.unwrap();
    wait_ready(&w, 2).await;
    // Let the last status writes land, then count what the operator writes while it resyncs.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = w.emulator.counters_of_agent(capmvm_operator::USER_AGENT);
    let machine_reconciles_before = reconcile_count_of(&w, "microvmmachine").await;
    let gets_before = capmvm_sim::stack::host_calls(&w.hosts, Method::Get);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let during = w
        .emulator
        .counters_of_agent(capmvm_operator::USER_AGENT)
        .since(&before);
    assert!(
        reconcile_count_of(&w, "microvmmachine").await >= machine_reconciles_before + 2,
        "the MicrovmMachines were reconciled meanwhile (resync every 2 s)"
    );
    let gets = capmvm_sim::stack::host_calls(&w.hosts, Method::Get);
    assert_eq!(
        gets, gets_before,
        "steady-state reconciles read the host observers' lists, no per-microVM get"
    );
    let writes: Vec<(Verb, String, u64)> = during
        .iter()
        .filter(|(v, _, _)| !matches!(v, Verb::Get | Verb::List | Verb::Watch))
        .map(|(v, r, n)| (v, r.to_string(), n))
        .collect();
    assert!(writes.is_empty(), "writes on unchanged objects: {writes:?}");
    w.shutdown().await;
}

async fn reconcile_count_of(w: &World, controller: &str) -> u64 {
    let text = w.operator().unwrap().scrape_metrics().await.unwrap();
    reconciles_in(&text, Some(controller))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_and_resume() {
    let w = world(options(2)).await;
    w.apply_demo_cluster(&counts(0, 2), |objects| {
        for o in objects.iter_mut() {
            if o.types.as_ref().unwrap().kind == "Cluster" {
                o.data["spec"]["paused"] = json!(true);
            }
        }
    })
    .await
    .unwrap();
    wait_reason(&w, "demo-md-0", 2, "Paused").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(creates_on_hosts(&w), 0, "nothing is created while paused");
    let m = &w.microvm_machines(NS).await.unwrap()[0];
    let paused = m
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == "Paused")
        .unwrap();
    assert_eq!(paused.status, "True");

    Api::<Cluster>::namespaced(w.client.clone(), NS)
        .patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paused": false}})),
        )
        .await
        .unwrap();
    wait_ready(&w, 2).await;
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_spec_is_a_condition_and_calls_no_host() {
    let w = world(options(2)).await;
    w.apply_demo_cluster(&counts(0, 2), |objects| {
        for o in objects.iter_mut() {
            if o.types.as_ref().unwrap().kind == "MicrovmMachineTemplate"
                && o.name_any() == "demo-md-0"
            {
                // Valid for the schema, refused by flintlock's firecracker provider.
                o.data["spec"]["template"]["spec"]["networkInterfaces"][0]["type"] =
                    json!("macvtap");
            }
        }
    })
    .await
    .unwrap();
    let machines = wait_reason(&w, "demo-md-0", 2, "InvalidSpec").await;
    let (_, _, message) = ready_condition(&machines[0]).unwrap();
    assert!(
        message.contains("spec.networkInterfaces[0].type"),
        "{message}"
    );
    assert!(
        message.contains("cloudhypervisor"),
        "says how to fix it: {message}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(creates_on_hosts(&w), 0);
    let reasons: Vec<String> = events_for(&w, &machines[0].name_any())
        .await
        .into_iter()
        .filter_map(|e| e.reason)
        .collect();
    assert!(reasons.contains(&"InvalidSpec".to_string()), "{reasons:?}");
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_secret_is_a_condition_until_it_exists() {
    let mut o = options(2);
    o.auth = HostAuth::Token("s3cret-token".into());
    let w = world(o).await;
    w.apply_demo_cluster(&counts(0, 1), |objects| {
        for o in objects.iter_mut() {
            if o.types.as_ref().unwrap().kind == "MicrovmCluster" {
                o.data["spec"]["placement"]["staticPool"]["basicAuthSecret"] =
                    json!("demo-flintlock-token");
            }
        }
    })
    .await
    .unwrap();
    let machines = wait_reason(&w, "demo-md-0", 1, "MissingCredentials").await;
    let (_, _, message) = ready_condition(&machines[0]).unwrap();
    assert!(
        message.contains("\"demo-flintlock-token\" not found"),
        "{message}"
    );
    assert!(!message.contains("s3cret"), "never the token");
    assert_eq!(creates_on_hosts(&w), 0);

    let (token, _) = w.create_credentials(NS, "demo").await.unwrap();
    assert_eq!(token.as_deref(), Some("demo-flintlock-token"));
    wait_ready(&w, 1).await;
    // Basic auth without TLS works (flintlock allows it) but is called out: a condition on the
    // MicrovmCluster and a Warning event.
    let insecure = transport_condition(&w).await;
    assert_eq!(insecure.status, "False");
    assert_eq!(insecure.reason, "BasicAuthWithoutTLS");
    assert!(
        insecure.message.contains("set tlsSecretRef"),
        "says how to fix it: {}",
        insecure.message
    );
    let warned = events_for(&w, "demo").await.into_iter().any(|e| {
        e.reason.as_deref() == Some("InsecureTransport") && e.type_.as_deref() == Some("Warning")
    });
    assert!(warned, "a Warning event on the MicrovmCluster");
    let log = std::fs::read_to_string(w.operator_log()).unwrap();
    assert!(
        !log.contains("s3cret-token"),
        "the token never reaches a log line"
    );
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_unreachable_during_create_and_delete() {
    let w = world(options(3)).await;
    let down = w.hosts[0].control();
    down.set_reachable(false).await.unwrap();
    // Workers must live in host-0's failure domain; the control plane may go anywhere.
    w.apply_demo_cluster(&counts(1, 2), |objects| {
        for o in objects.iter_mut() {
            if o.types.as_ref().unwrap().kind == "MachineDeployment" && o.name_any() == "demo-md-0"
            {
                o.data["spec"]["template"]["spec"]["failureDomain"] = json!("host-0");
            }
        }
    })
    .await
    .unwrap();
    // Its machines wait; the others proceed.
    let waiting = wait_reason(&w, "demo-md-0", 2, "NoEligibleHost").await;
    let (_, _, message) = ready_condition(&waiting[0]).unwrap();
    assert!(message.contains("host-0: unreachable"), "{message}");
    wait_for("the control plane to be ready", WAIT, POLL, || async {
        let ms = w.microvm_machines(NS).await?;
        Ok(ms
            .iter()
            .any(|m| m.name_any().starts_with("demo-control-plane") && is_ready(m))
            .then_some(()))
    })
    .await
    .unwrap();
    assert_eq!(down.counters().of(Method::Create), 0);

    down.set_reachable(true).await.unwrap();
    let machines = wait_ready(&w, 3).await;
    for m in machines
        .iter()
        .filter(|m| m.name_any().starts_with("demo-md-0"))
    {
        assert_eq!(
            m.status.as_ref().unwrap().host.as_deref(),
            Some(w.endpoints()[0].as_str())
        );
    }

    // During delete: the finalizer stays while the host is away, and the delete resumes when it is back.
    down.set_reachable(false).await.unwrap();
    scale(&w, "demo-md-0", 0).await;
    let held = wait_reason(&w, "demo-md-0", 2, "HostUnreachable").await;
    for m in &held {
        assert!(m.meta().deletion_timestamp.is_some());
        assert!(
            m.finalizers().contains(&MACHINE_FINALIZER.to_string()),
            "finalizer kept"
        );
        let (_, _, message) = ready_condition(m).unwrap();
        assert!(
            message.contains(&w.endpoints()[0]) && message.contains("abandon-microvm"),
            "{message}"
        );
    }
    assert_eq!(down.vms().len(), 2, "the microVMs are still there");
    down.set_reachable(true).await.unwrap();
    wait_for(
        "the workers and their microVMs to be gone",
        WAIT,
        POLL,
        || async {
            let left = w
                .microvm_machines(NS)
                .await?
                .iter()
                .filter(|m| m.name_any().starts_with("demo-md-0"))
                .count();
            Ok((left == 0 && down.vms().is_empty()).then_some(()))
        },
    )
    .await
    .unwrap();
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_microvm_is_reported() {
    let mut o = options(1);
    o.time_scale = 0.0005; // flintlock's 20 s backoff in 10 ms
    let w = world(o).await;
    w.hosts[0].control().fail_next_creates(1);
    w.apply_demo_cluster(&counts(0, 1), |_| {}).await.unwrap();
    let machines = wait_reason(&w, "demo-md-0", 1, "MicrovmProvisionFailed").await;
    let m = &machines[0];
    assert_eq!(m.status.as_ref().unwrap().vm_state, Some(VmState::Failed));
    let (_, _, message) = ready_condition(m).unwrap();
    assert!(
        message.contains("delete the Machine to replace it"),
        "{message}"
    );
    let events = events_for(&w, &m.name_any()).await;
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("MicrovmFailed")
                && e.type_.as_deref() == Some("Warning"))
    );
    assert_eq!(
        live_vms(&w).len(),
        1,
        "a FAILED microVM is not replaced behind CAPI's back"
    );
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_create_and_status_write_duplicates_nothing() {
    let mut w = World::start(options(2)).await.unwrap();
    w.start_operator(&[(capmvm_operator::fault::FAULT_ENV, "after-create")])
        .unwrap();
    w.apply_demo_cluster(&counts(0, 3), |_| {}).await.unwrap();
    let code = w.wait_operator_exit(WAIT).await;
    assert_eq!(
        code,
        Some(capmvm_operator::fault::FAULT_EXIT_CODE),
        "the operator crashed at the named point"
    );
    // MicroVMs exist whose machines have no providerID yet (concurrent reconciles may have created
    // more than one before the process died).
    let orphans = live_vms(&w);
    assert!(!orphans.is_empty(), "a create happened before the crash");
    let machines = w.microvm_machines(NS).await.unwrap();
    for (_, vm) in &orphans {
        let m = machines
            .iter()
            .find(|m| m.name_any() == vm.spec.id)
            .unwrap();
        assert!(
            m.spec.provider_id.is_none(),
            "{} crashed before its providerID write",
            m.name_any()
        );
    }

    w.start_operator(&[]).unwrap();
    let machines = wait_ready(&w, 3).await;
    let vms = live_vms(&w);
    assert_eq!(vms.len(), 3, "no duplicate microVM: {vms:?}");
    for m in &machines {
        let pid: ProviderId = m.spec.provider_id.as_deref().unwrap().parse().unwrap();
        assert_eq!(
            vms.iter()
                .filter(|(_, vm)| vm.spec.id == m.name_any())
                .count(),
            1
        );
        assert!(vms.iter().any(|(_, vm)| vm.uid() == pid.uid));
    }
    assert!(
        vms.iter().any(|(_, vm)| vm.uid() == orphans[0].1.uid()),
        "the crashed create was adopted"
    );
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_recording_the_host_and_the_create_loses_nothing() {
    let mut w = World::start(options(2)).await.unwrap();
    w.start_operator(&[(capmvm_operator::fault::FAULT_ENV, "after-host-recorded")])
        .unwrap();
    w.apply_demo_cluster(&counts(0, 2), |_| {}).await.unwrap();
    assert_eq!(
        w.wait_operator_exit(WAIT).await,
        Some(capmvm_operator::fault::FAULT_EXIT_CODE),
        "the operator crashed at the named point"
    );
    assert_eq!(creates_on_hosts(&w), 0, "it crashed before any create");
    let placed: Vec<MicrovmMachine> = w
        .microvm_machines(NS)
        .await
        .unwrap()
        .into_iter()
        .filter(|m| {
            m.annotations()
                .contains_key(capmvm_api::keys::HOST_ANNOTATION)
        })
        .collect();
    assert!(!placed.is_empty(), "a host was recorded before the crash");
    for m in &placed {
        assert!(m.finalizers().contains(&MACHINE_FINALIZER.to_string()));
    }

    w.start_operator(&[]).unwrap();
    let machines = wait_ready(&w, 2).await;
    assert_eq!(live_vms(&w).len(), 2);
    assert_eq!(creates_on_hosts(&w), 2, "one create per machine, no more");
    for p in &placed {
        let m = machines
            .iter()
            .find(|m| m.name_any() == p.name_any())
            .unwrap();
        assert_eq!(
            m.status.as_ref().unwrap().host,
            p.annotations()
                .get(capmvm_api::keys::HOST_ANNOTATION)
                .cloned(),
            "{}: created on the host recorded before the crash",
            m.name_any()
        );
    }
    w.shutdown().await;
}

/// `clusterctl move` recreates every object on the target cluster: same names, labels, annotations
/// and spec, no status, and a new uid. A machine moved between its create and its providerID write
/// must still find the microVM it created under its old uid, not create a second one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_moved_between_create_and_provider_id_adopts_its_microvm() {
    let mut w = World::start(options(2)).await.unwrap();
    w.start_operator(&[(capmvm_operator::fault::FAULT_ENV, "after-create")])
        .unwrap();
    w.apply_demo_cluster(&counts(0, 1), |_| {}).await.unwrap();
    assert_eq!(
        w.wait_operator_exit(WAIT).await,
        Some(capmvm_operator::fault::FAULT_EXIT_CODE)
    );
    let orphans = live_vms(&w);
    assert_eq!(orphans.len(), 1, "one microVM created before the crash");

    // Move, as clusterctl does: pause the Cluster, recreate the object, drop the source's finalizers.
    let clusters = Api::<Cluster>::namespaced(w.client.clone(), NS);
    let pause = |paused: bool| json!({"spec": {"paused": paused}});
    clusters
        .patch("demo", &PatchParams::default(), &Patch::Merge(pause(true)))
        .await
        .unwrap();
    let api = Api::<MicrovmMachine>::namespaced(w.client.clone(), NS);
    let source = w.microvm_machines(NS).await.unwrap().remove(0);
    assert!(
        source.spec.provider_id.is_none(),
        "crashed before the providerID write"
    );
    let name = source.name_any();
    let mut moved = MicrovmMachine::new(&name, source.spec.clone());
    moved.metadata.namespace = source.metadata.namespace.clone();
    moved.metadata.labels = source.metadata.labels.clone();
    moved.metadata.annotations = source.metadata.annotations.clone();
    moved.metadata.owner_references = source.metadata.owner_references.clone();
    moved.metadata.finalizers = source.metadata.finalizers.clone();
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    api.delete(&name, &DeleteParams::default()).await.unwrap();
    wait_for("the source object to be gone", WAIT, POLL, || async {
        Ok(api.get_opt(&name).await?.is_none().then_some(()))
    })
    .await
    .unwrap();
    let target = api.create(&Default::default(), &moved).await.unwrap();
    assert_ne!(target.metadata.uid, source.metadata.uid, "a new object");
    clusters
        .patch("demo", &PatchParams::default(), &Patch::Merge(pause(false)))
        .await
        .unwrap();

    w.start_operator(&[]).unwrap();
    let machines = wait_ready(&w, 1).await;
    let vms = live_vms(&w);
    assert_eq!(vms.len(), 1, "no second microVM: {vms:?}");
    assert_eq!(
        vms[0].1.uid(),
        orphans[0].1.uid(),
        "the moved machine adopted its microVM"
    );
    let pid: ProviderId = machines[0]
        .spec
        .provider_id
        .as_deref()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(pid.uid, orphans[0].1.uid());
    assert_eq!(creates_on_hosts(&w), 1);

    // Deleting the moved machine deletes that microVM: nothing leaks.
    delete_cluster_and_wait(&w).await;
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_auth_and_mtls_end_to_end() {
    let mut o = options(2);
    o.auth = HostAuth::MtlsAndToken("another-s3cret".into());
    let w = world(o).await;
    let credentials = w.create_credentials(NS, "demo").await.unwrap();
    w.apply_demo_cluster(&counts(0, 2), |objects| {
        capmvm_sim::stack::use_credentials(objects, &credentials)
    })
    .await
    .unwrap();
    wait_ready(&w, 2).await;
    let secure = transport_condition(&w).await;
    assert_eq!(secure.status, "True");
    let log = std::fs::read_to_string(w.operator_log()).unwrap();
    assert!(
        !log.contains("another-s3cret") && !log.contains("PRIVATE KEY"),
        "no secret in the log"
    );
    delete_cluster_and_wait(&w).await;
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_workers_3_to_10_to_2() {
    let w = world(options(3)).await;
    w.apply_demo_cluster(&counts(0, 3), |_| {}).await.unwrap();
    wait_ready(&w, 3).await;
    scale(&w, "demo-md-0", 10).await;
    let ten = wait_ready(&w, 10).await;
    assert_eq!(live_vms(&w).len(), 10);
    // Placement spreads the machines: every host is used, none takes more than its share and a half.
    let per_host: BTreeMap<String, usize> = ten.iter().fold(BTreeMap::new(), |mut acc, m| {
        *acc.entry(m.status.clone().unwrap().host.unwrap())
            .or_default() += 1;
        acc
    });
    assert_eq!(per_host.len(), 3, "{per_host:?}");
    assert!(per_host.values().all(|n| *n <= 5), "{per_host:?}");
    scale(&w, "demo-md-0", 2).await;
    let machines = wait_ready(&w, 2).await;
    wait_for("8 microVMs to be deleted", WAIT, POLL, || async {
        Ok((w.all_vms().len() == 2).then_some(()))
    })
    .await
    .unwrap();
    let uids: Vec<String> = machines
        .iter()
        .map(|m| {
            m.spec
                .provider_id
                .as_deref()
                .unwrap()
                .parse::<ProviderId>()
                .unwrap()
                .uid
        })
        .collect();
    let mut on_hosts: Vec<String> = w
        .all_vms()
        .iter()
        .map(|(_, vm)| vm.uid().to_string())
        .collect();
    on_hosts.sort();
    let mut uids_sorted = uids.clone();
    uids_sorted.sort();
    assert_eq!(
        on_hosts, uids_sorted,
        "the remaining microVMs are exactly the remaining machines'"
    );
    w.shutdown().await;
}

/// The pid in a leader Lease's holderIdentity (`<host>_<pid>_<nanos>`).
async fn lease_holder_pid(w: &World) -> Option<u32> {
    let lease = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(w.client.clone(), NS)
        .get_opt("controller-leader-elect-capmvm")
        .await
        .ok()??;
    let holder = lease.spec?.holder_identity?;
    holder.rsplit('_').nth(1)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_election_one_reconciles_and_hands_over() {
    const LEASE: Duration = Duration::from_secs(4);
    const RETRY: Duration = Duration::from_millis(500);
    let mut o = options(2);
    o.operator_flags.extend([
        format!("--leader-elect-lease-duration={}s", LEASE.as_secs()),
        "--leader-elect-renew-deadline=3s".to_string(),
        format!("--leader-elect-retry-period={}ms", RETRY.as_millis()),
        "--leader-elect".to_string(),
    ]);
    let mut w = world(o).await;
    let second = w.spawn_operator(&[], &[]).unwrap();
    w.apply_demo_cluster(&counts(0, 1), |_| {}).await.unwrap();
    wait_ready(&w, 1).await;

    // The Lease names one of the two processes, and only that one reconciles.
    let first_pid = w.operator_pid().unwrap();
    let second_pid = second.pid().unwrap();
    let leader = lease_holder_pid(&w)
        .await
        .expect("a leader holds the Lease");
    assert!(leader == first_pid || leader == second_pid, "{leader}");
    let first_reconciles =
        reconciles_in(&w.operator().unwrap().scrape_metrics().await.unwrap(), None);
    let second_reconciles = reconciles_in(&second.scrape_metrics().await.unwrap(), None);
    let (leader_reconciles, standby_reconciles) = if leader == first_pid {
        (first_reconciles, second_reconciles)
    } else {
        (second_reconciles, first_reconciles)
    };
    assert!(
        leader_reconciles > 0 && standby_reconciles == 0,
        "only the leader reconciles (leader {leader_reconciles}, standby {standby_reconciles})"
    );

    // Kill the leader as a crash would (no release): the standby takes the Lease once it expires.
    let survivor = if leader == first_pid {
        w.kill_operator().await;
        second
    } else {
        second.kill().await;
        w.take_operator().unwrap()
    };
    let survivor_pid = survivor.pid().unwrap();
    let killed_at = std::time::Instant::now();
    wait_for("the standby to take the Lease", WAIT, POLL, || async {
        Ok((lease_holder_pid(&w).await == Some(survivor_pid)).then_some(()))
    })
    .await
    .unwrap();
    let took = killed_at.elapsed();
    // The lease duration, one retry period to notice, and scheduling slack for a busy machine.
    assert!(
        took < LEASE + RETRY + Duration::from_secs(3),
        "handed over in {took:?}"
    );
    scale(&w, "demo-md-0", 2).await;
    wait_ready(&w, 2).await;
    let text = survivor.scrape_metrics().await.unwrap();
    assert!(reconciles_in(&text, None) > 0, "the survivor reconciles");
    survivor.stop().await;
    w.shutdown().await;
}
