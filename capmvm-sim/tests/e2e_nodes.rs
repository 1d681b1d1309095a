//! End to end, the node layer (issue 13): each Cluster gets a workload API and its
//! `<cluster>-kubeconfig` Secret; hollow kubelets register Nodes whose providerIDs equal the
//! Machines'; Machines get nodeRef and nodeInfo; a bad provider-id template registers a Node that
//! matches nothing; a MachineHealthCheck replaces a Machine whose Node is NotReady, of a
//! MachineDeployment and of a MachinePool (the pool repairs what it marks); deleting the Cluster
//! deletes its Nodes and then its workload API.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod e2e_support;

use std::collections::BTreeSet;
use std::time::Duration;

use base64::Engine as _;
use capmvm_api::MicrovmMachineTemplate;
use capmvm_api::capi::Cluster;
use capmvm_sim::world::wait_for;
use e2e_support::*;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

fn machine_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Machine"),
        "machines",
    )
}

async fn capi_machines(client: &kube::Client) -> Vec<DynamicObject> {
    Api::<DynamicObject>::namespaced_with(client.clone(), NS, &machine_resource())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
}

async fn nodes_of(client: kube::Client) -> Vec<Node> {
    Api::<Node>::all(client)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
}

fn provider_id(node: &Node) -> Option<String> {
    node.spec.as_ref()?.provider_id.clone()
}

/// Waits until `n` Machines exist and all have a nodeRef.
async fn wait_node_refs(w: &capmvm_sim::world::World, n: usize) -> Vec<DynamicObject> {
    wait_for(
        &format!("{n} Machines with a nodeRef"),
        WAIT,
        POLL,
        || async {
            let ms = capi_machines(&w.client).await;
            let ok = ms.len() == n
                && ms
                    .iter()
                    .all(|m| m.data.pointer("/status/nodeRef/name").is_some());
            Ok(ok.then_some(ms))
        },
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_register_machines_get_their_node_and_the_cluster_takes_them_along() {
    let w = world(options(3)).await;
    w.apply_demo_cluster(&counts(1, 2), |_| {}).await.unwrap();
    wait_ready_within(&w, 3, WAIT).await;
    let machines = wait_node_refs(&w, 3).await;

    // The kubeconfig Secret, as CAPI writes it; a client made from it sees the Nodes.
    let secret = Api::<Secret>::namespaced(w.client.clone(), NS)
        .get("demo-kubeconfig")
        .await
        .unwrap();
    assert_eq!(secret.type_.as_deref(), Some("cluster.x-k8s.io/secret"));
    assert_eq!(secret.labels()["cluster.x-k8s.io/cluster-name"], "demo");
    let owner = &secret.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Cluster", "demo")
    );
    let kubeconfig = String::from_utf8(secret.data.unwrap()["value"].0.clone()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&kubeconfig).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let workload = kube::Client::try_from(config).unwrap();
    let nodes = nodes_of(workload.clone()).await;
    assert_eq!(nodes.len(), 3);

    // Every Machine's providerID is exactly one Node's; nodeRef names it; nodeInfo is the whole object.
    let node_pids: BTreeSet<String> = nodes.iter().filter_map(provider_id).collect();
    for m in &machines {
        let pid = m
            .data
            .pointer("/spec/providerID")
            .and_then(Value::as_str)
            .unwrap();
        assert!(node_pids.contains(pid), "{pid} not among {node_pids:?}");
        let node = nodes
            .iter()
            .find(|n| provider_id(n).as_deref() == Some(pid))
            .unwrap();
        assert_eq!(
            m.data["status"]["nodeRef"],
            json!({"name": node.name_any()})
        );
        assert_eq!(m.data["status"]["phase"], "Running");
        let info = &m.data["status"]["nodeInfo"];
        assert_eq!(info["kubeletVersion"], "v1.33.0");
        assert_eq!(info["architecture"], "amd64");
        assert_eq!(info["operatingSystem"], "linux");
        // A kubelet without swap leaves `swap` out (the real API server refuses a capacity of 0).
        assert!(info.get("swap").is_none(), "{info}");
        // The Node carries the microVM's size: 2 vCPUs, 2048 MiB (the kubelet's 2097152Ki, which the
        // API server stores in canonical form, as a real one does).
        let capacity = node.status.as_ref().unwrap().capacity.as_ref().unwrap();
        assert_eq!(capacity["cpu"].0, "2");
        assert_eq!(capacity["memory"].0, "2Gi");
        assert_eq!(capacity["pods"].0, "110");
    }
    let roles: Vec<bool> = nodes
        .iter()
        .map(|n| {
            n.labels()
                .contains_key("node-role.kubernetes.io/control-plane")
        })
        .collect();
    assert_eq!(
        roles.iter().filter(|r| **r).count(),
        1,
        "one control-plane Node"
    );

    // `kubectl get nodes` through the kubeconfig file shows them Ready.
    let path = w.workload_kubeconfig(NS, "demo").unwrap();
    if let Some(kubectl) = pinned_kubectl() {
        let out = std::process::Command::new(kubectl)
            .arg("--kubeconfig")
            .arg(&path)
            .args(["get", "nodes"])
            .env("HOME", std::env::temp_dir())
            .output()
            .expect("kubectl runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            text.lines().filter(|l| l.contains(" Ready ")).count(),
            3,
            "{text}"
        );
    }

    // The operator keeps working with Machines that carry nodeRef and nodeInfo: a scale-up works.
    let mds: Api<DynamicObject> = Api::namespaced_with(
        w.client.clone(),
        NS,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "MachineDeployment"),
            "machinedeployments",
        ),
    );
    mds.patch(
        "demo-md-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 3}})),
    )
    .await
    .unwrap();
    wait_ready_within(&w, 4, WAIT).await;
    wait_node_refs(&w, 4).await;

    // Deleting the Cluster deletes the Nodes (while the workload API still serves), then the API.
    let url = w
        .workloads()
        .url(&capmvm_sim::capi::workload::ClusterKey::new(NS, "demo"))
        .unwrap();
    // Watch the workload's Nodes from before the delete until the API stops: every Node must be
    // seen deleted on that watch (a poll could miss the moment between the last deletion and the
    // API stopping on a busy machine).
    let nodes = Api::<Node>::all(workload.clone());
    let before = nodes.list(&ListParams::default()).await.unwrap();
    let names: BTreeSet<String> = before.items.iter().map(|n| n.name_any()).collect();
    assert_eq!(names.len(), 4, "{names:?}");
    let version = before.metadata.resource_version.unwrap_or_default();
    let mut stream = nodes
        .watch(&kube::api::WatchParams::default().timeout(290), &version)
        .await
        .unwrap()
        .boxed();
    Api::<Cluster>::namespaced(w.client.clone(), NS)
        .delete("demo", &DeleteParams::default())
        .await
        .unwrap();
    let mut deleted = BTreeSet::new();
    let watched = tokio::time::timeout(WAIT, async {
        while let Some(event) = stream.next().await {
            match event {
                Ok(kube::api::WatchEvent::Deleted(node)) => {
                    deleted.insert(node.name_any());
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    })
    .await;
    assert!(watched.is_ok(), "the workload API did not stop");
    assert_eq!(
        deleted, names,
        "every Node is deleted while the workload API still serves"
    );
    // The watch ends as the API shuts down; its listener closes right after.
    let addr = url.trim_start_matches("http://").to_string();
    wait_for("the workload API to stop listening", WAIT, POLL, || {
        let addr = addr.clone();
        async move { Ok(std::net::TcpStream::connect(&addr).is_err().then_some(())) }
    })
    .await
    .unwrap();
    assert!(w.workload_client(NS, "demo").is_none());
    wait_for("the kubeconfig Secret to go", WAIT, POLL, || async {
        let gone = Api::<Secret>::namespaced(w.client.clone(), NS)
            .get_opt("demo-kubeconfig")
            .await?
            .is_none();
        Ok(gone.then_some(()))
    })
    .await
    .unwrap();
    w.shutdown().await;
}

/// Creates a Machine `name` outside any MachineDeployment, with its own bootstrap Secret holding
/// `user_data` and a MicrovmMachine cloned from the `demo-md-0` template.
async fn standalone_machine(w: &capmvm_sim::world::World, name: &str, user_data: &str) {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-bootstrap"), "namespace": NS},
        "type": "cluster.x-k8s.io/secret",
        "data": {
            "value": base64::engine::general_purpose::STANDARD.encode(user_data),
            "format": base64::engine::general_purpose::STANDARD.encode("cloud-config"),
        },
    }))
    .unwrap();
    Api::<Secret>::namespaced(w.client.clone(), NS)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let template = Api::<MicrovmMachineTemplate>::namespaced(w.client.clone(), NS)
        .get("demo-md-0")
        .await
        .unwrap();
    let infra = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha2",
        "kind": "MicrovmMachine",
        "metadata": {"name": name, "namespace": NS, "labels": {"cluster.x-k8s.io/cluster-name": "demo"}},
        "spec": template.spec.template.spec,
    });
    let infra_resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "infrastructure.cluster.x-k8s.io",
            "v1alpha2",
            "MicrovmMachine",
        ),
        "microvmmachines",
    );
    Api::<DynamicObject>::namespaced_with(w.client.clone(), NS, &infra_resource)
        .create(
            &PostParams::default(),
            &serde_json::from_value(infra).unwrap(),
        )
        .await
        .unwrap();
    let machine = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Machine",
        "metadata": {"name": name, "namespace": NS, "labels": {"cluster.x-k8s.io/cluster-name": "demo"}},
        "spec": {
            "clusterName": "demo",
            "version": "v1.32.4",
            "bootstrap": {"dataSecretName": format!("{name}-bootstrap")},
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "MicrovmMachine", "name": name},
        },
    });
    Api::<DynamicObject>::namespaced_with(w.client.clone(), NS, &machine_resource())
        .create(
            &PostParams::default(),
            &serde_json::from_value(machine).unwrap(),
        )
        .await
        .unwrap();
}

fn user_data(provider_id_template: &str) -> String {
    format!(
        "## template: jinja\n#cloud-config\nwrite_files:\n- path: /run/kubeadm/kubeadm-join-config.yaml\n  content: |\n    apiVersion: kubeadm.k8s.io/v1beta4\n    kind: JoinConfiguration\n    nodeRegistration:\n      kubeletExtraArgs:\n      - name: provider-id\n        value: \"{provider_id_template}\"\nruncmd:\n- kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bad_provider_id_matches_nothing_and_a_silent_kubelet_registers_once_let_go() {
    let w = world(options(2)).await;
    w.apply_demo_cluster(&counts(0, 0), |_| {}).await.unwrap();
    w.kubelets().set_never_register("silent-0", true);
    standalone_machine(
        &w,
        "bad-0",
        &user_data("microvm://{{ ds.meta_data.vm_hostname }}/{{ ds.meta_data.instance_id }}"),
    )
    .await;
    standalone_machine(
        &w,
        "silent-0",
        &user_data("microvm://{{ ds.meta_data.vm_host }}/{{ v1.instance_id }}"),
    )
    .await;
    wait_ready_within(&w, 2, WAIT).await;
    let workload = wait_for("the workload API", WAIT, POLL, || async {
        Ok(w.workload_client(NS, "demo"))
    })
    .await
    .unwrap();

    // bad-0 registers a Node whose providerID is what cloud-init rendered: it matches no Machine.
    let bad = wait_for("bad-0's Node", WAIT, POLL, || async {
        Ok(nodes_of(workload.clone())
            .await
            .into_iter()
            .find(|n| n.name_any() == "bad-0"))
    })
    .await
    .unwrap();
    let pid = provider_id(&bad).unwrap();
    assert!(
        pid.starts_with("microvm://CI_MISSING_JINJA_VAR/vm_hostname/"),
        "{pid}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let machines = capi_machines(&w.client).await;
    for m in &machines {
        assert!(m.data.pointer("/spec/providerID").is_some());
        assert_eq!(m.data.pointer("/status/nodeRef"), None, "{}", m.name_any());
        assert_eq!(m.data["status"]["phase"], "Provisioned", "{}", m.name_any());
    }
    // silent-0's kubelet never registered.
    assert_eq!(nodes_of(workload.clone()).await.len(), 1);

    // Let it go: its Node registers and wakes its Machine, which gets nodeRef and nodeInfo.
    w.kubelets().set_never_register("silent-0", false);
    let silent = wait_for("silent-0's nodeRef", WAIT, POLL, || async {
        let ms = capi_machines(&w.client).await;
        Ok(ms
            .into_iter()
            .find(|m| m.name_any() == "silent-0" && m.data.pointer("/status/nodeRef").is_some()))
    })
    .await
    .unwrap();
    assert_eq!(
        silent.data["status"]["nodeRef"],
        json!({"name": "silent-0"})
    );
    assert_eq!(
        silent.data["status"]["nodeInfo"]["kubeletVersion"],
        "v1.32.4"
    );
    assert_eq!(silent.data["status"]["phase"], "Running");
    w.shutdown().await;
}

/// A MachineHealthCheck `name` of the demo cluster over the Machines labelled `selector`: a Node
/// not Ready (False or Unknown) for 2 s is unhealthy.
fn node_health_check(name: &str, (label, value): (&str, &str)) -> serde_json::Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "MachineHealthCheck",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "clusterName": "demo",
            "selector": {"matchLabels": {label: value}},
            "checks": {"unhealthyNodeConditions": [
                {"type": "Ready", "status": "False", "timeoutSeconds": 2},
                {"type": "Ready", "status": "Unknown", "timeoutSeconds": 2},
            ]},
        },
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_machine_health_check_replaces_a_machine_whose_node_is_not_ready() {
    let w = world(options(2)).await;
    w.apply_demo_cluster(&counts(0, 2), |_| {}).await.unwrap();
    let before = wait_node_refs(&w, 2).await;
    let mhc = node_health_check(
        "demo-md-0",
        ("cluster.x-k8s.io/deployment-name", "demo-md-0"),
    );
    let mhcs: Api<DynamicObject> = Api::namespaced_with(
        w.client.clone(),
        NS,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "MachineHealthCheck"),
            "machinehealthchecks",
        ),
    );
    mhcs.create(
        &PostParams::default(),
        &serde_json::from_value(mhc).unwrap(),
    )
    .await
    .unwrap();
    wait_for(
        "the MachineHealthCheck to see 2 healthy Machines",
        WAIT,
        POLL,
        || async {
            let m = mhcs.get("demo-md-0").await?;
            Ok((m.data["status"]["currentHealthy"] == 2
                && m.data["status"]["expectedMachines"] == 2)
                .then_some(()))
        },
    )
    .await
    .unwrap();

    let victim = before[0].data["status"]["nodeRef"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let victim_machine = before[0].name_any();
    w.kubelets().set_not_ready(&victim, true);
    let workload = w.workload_client(NS, "demo").unwrap();
    let after = wait_for("the unhealthy Machine replaced", WAIT, POLL, || async {
        let ms = capi_machines(&w.client).await;
        let ok = ms.len() == 2
            && ms.iter().all(|m| {
                m.name_any() != victim_machine && m.data.pointer("/status/nodeRef").is_some()
            });
        Ok(ok.then_some(ms))
    })
    .await
    .unwrap();
    assert!(
        after.iter().any(|m| m.name_any() == before[1].name_any()),
        "the healthy Machine stays"
    );
    wait_for(
        "the unhealthy Machine's Node deleted",
        WAIT,
        POLL,
        || async {
            let names: Vec<String> = nodes_of(workload.clone())
                .await
                .iter()
                .map(|n| n.name_any())
                .collect();
            Ok((!names.contains(&victim) && names.len() == 2).then_some(()))
        },
    )
    .await
    .unwrap();
    w.shutdown().await;
}

/// The kubectl `hack/upstream.sh build` pinned, never one the machine happens to have: `None` (the
/// step reported as skipped) locally without it, a failure in CI.
fn pinned_kubectl() -> Option<std::path::PathBuf> {
    capmvm_upstream::Binaries::for_test("kubectl get nodes", &["kubectl"])
        .and_then(|b| b.path("kubectl").ok())
}

/// A MachinePool of 3 (the `machinepool` flavor, `maxSurge: 1`, `maxUnavailable: 0`): one instance's
/// Node turns NotReady; the MachineHealthCheck marks its Machine `OwnerRemediated=False` (core leaves
/// a pool Machine's replacement to the pool); the pool replaces that instance, and only it, within
/// its surge; a new microVM boots and its Node registers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pool_replaces_the_instance_a_machine_health_check_marked() {
    let w = world(options(3)).await;
    w.apply_template(
        capmvm_sim::world::MACHINEPOOL_CLUSTER,
        &[
            ("CONTROL_PLANE_MACHINE_COUNT", "0".to_string()),
            ("WORKER_MACHINE_COUNT", "3".to_string()),
            ("WORKER_MACHINE_MAX_SURGE", "1".to_string()),
            ("WORKER_MACHINE_MAX_UNAVAILABLE", "0".to_string()),
        ],
        |_| {},
    )
    .await
    .unwrap();
    let before = wait_node_refs(&w, 3).await;
    let mhcs: Api<DynamicObject> = Api::namespaced_with(
        w.client.clone(),
        NS,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "MachineHealthCheck"),
            "machinehealthchecks",
        ),
    );
    let mhc = node_health_check("demo-mp-0", ("cluster.x-k8s.io/pool-name", "demo-mp-0"));
    mhcs.create(
        &PostParams::default(),
        &serde_json::from_value(mhc).unwrap(),
    )
    .await
    .unwrap();
    wait_for(
        "the MachineHealthCheck to see 3 healthy Machines",
        WAIT,
        POLL,
        || async {
            let m = mhcs.get("demo-mp-0").await?;
            Ok((m.data["status"]["currentHealthy"] == 3).then_some(()))
        },
    )
    .await
    .unwrap();

    let victim = before[0].name_any();
    let victim_node = before[0].data["status"]["nodeRef"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let healthy: BTreeSet<String> = before[1..].iter().map(ResourceExt::name_any).collect();
    w.kubelets().set_not_ready(&victim_node, true);

    // Sampled while the pool repairs: the healthy instances are never touched, and the pool stays
    // within 3 + maxSurge instances.
    let mut marked = false;
    let mut most = 0;
    let log = w.operator_log();
    let deadline = std::time::Instant::now() + WAIT;
    let replaced = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the marked instance not replaced in time (operator log {})",
            log.display()
        );
        let ms = capi_machines(&w.client).await;
        let instances = w.microvm_machines(NS).await.unwrap();
        most = most.max(instances.len());
        for name in &healthy {
            let m = ms.iter().find(|m| &m.name_any() == name);
            assert!(
                m.is_some_and(|m| m.metadata.deletion_timestamp.is_none()),
                "healthy {name} was deleted"
            );
        }
        if let Some(v) = ms.iter().find(|m| m.name_any() == victim) {
            marked |= v.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "OwnerRemediated" && c["status"] == "False");
        }
        let done = ms.len() == 3
            && ms.iter().all(|m| {
                m.name_any() != victim
                    && m.metadata.deletion_timestamp.is_none()
                    && m.data.pointer("/status/nodeRef/name").is_some()
            });
        if done {
            break ms;
        }
        tokio::time::sleep(POLL).await;
    };
    assert!(
        marked,
        "the MachineHealthCheck marked the Machine for its owner"
    );
    assert!(most <= 4, "{most} instances: beyond 3 + maxSurge");
    let replacement = replaced
        .iter()
        .find(|m| !healthy.contains(&m.name_any()))
        .unwrap();
    // The replacement runs on a microVM of its own, and its Node registered under it.
    let pid = replacement.data["spec"]["providerID"]
        .as_str()
        .unwrap()
        .to_string();
    let vm_uid = pid.rsplit('/').next().unwrap().to_string();
    assert!(
        live_vms(&w).iter().any(|(_, vm)| vm.uid() == vm_uid),
        "{pid} has a live microVM"
    );
    assert!(
        !live_vms(&w).iter().any(|(_, vm)| vm.spec.id == victim),
        "the marked instance's microVM is gone"
    );
    let workload = w.workload_client(NS, "demo").unwrap();
    let nodes = nodes_of(workload).await;
    assert!(
        nodes
            .iter()
            .any(|n| provider_id(n).as_deref() == Some(pid.as_str())),
        "a Node under the new microVM"
    );
    assert!(
        !nodes.iter().any(|n| n.name_any() == victim_node),
        "the unhealthy Node is gone"
    );
    w.shutdown().await;
}
