//! The CAPI stand-in's MachinePool core (capi-contract 5.2 to 5.6), with the test playing the
//! infrastructure provider (no operator runs): it writes the MicrovmMachinePool's status and its
//! labelled MicrovmMachines by hand, and registers Nodes in the workload API as kubelets would.
//! Asserted is what core does: ownership, bootstrap data, Machines for instances (shape, owners, the
//! Machine deletion flow), the list and replicas copied only while the pool is ready, Node counts,
//! retired Nodes deleted, deletion order, the join token's rotation, admission and the scale
//! subresource.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod e2e_support;

use std::time::Duration;

use capmvm_sim::world::{World, wait_for};
use capmvm_sim::{capi, manifest};
use e2e_support::*;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

const POOL: &str = "demo-mp-0";
const CLUSTER: &str = "demo";

fn gvk(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn machine_pools() -> ApiResource {
    gvk("cluster.x-k8s.io", "v1beta2", "MachinePool", "machinepools")
}
fn machines() -> ApiResource {
    gvk("cluster.x-k8s.io", "v1beta2", "Machine", "machines")
}
fn infra_pools() -> ApiResource {
    gvk(
        "infrastructure.cluster.x-k8s.io",
        "v1alpha2",
        "MicrovmMachinePool",
        "microvmmachinepools",
    )
}
fn instances() -> ApiResource {
    gvk(
        "infrastructure.cluster.x-k8s.io",
        "v1alpha2",
        "MicrovmMachine",
        "microvmmachines",
    )
}
fn kubeadm_configs() -> ApiResource {
    gvk(
        "bootstrap.cluster.x-k8s.io",
        "v1beta2",
        "KubeadmConfig",
        "kubeadmconfigs",
    )
}

fn api(w: &World, r: &ApiResource) -> Api<DynamicObject> {
    Api::namespaced_with(w.client.clone(), NS, r)
}

async fn get(w: &World, r: &ApiResource, name: &str) -> Option<DynamicObject> {
    api(w, r).get_opt(name).await.unwrap()
}

/// Removes an infrastructure object's finalizers, as its provider does once its machines are gone.
async fn release(w: &World, r: &ApiResource, name: &str) {
    api(w, r)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
}

/// A world without the operator: the test is the provider.
async fn provider_less_world(rotation: Option<Duration>) -> World {
    let mut o = options(1);
    o.bootstrap_token_rotation = rotation;
    World::start(o).await.expect("world starts")
}

/// Applies the `machinepool` flavor's Cluster (its endpoint given, no control plane), MachinePool,
/// MicrovmMachinePool and KubeadmConfig, with `edit` applied to the MachinePool.
async fn apply_pool(w: &World, edit: impl FnOnce(&mut Value)) {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../templates/cluster-template-machinepool.yaml"),
    )
    .unwrap();
    let mut vars = capmvm_sim::world::template_variables(&w.endpoints());
    vars.insert("WORKER_MACHINE_COUNT".to_string(), "3".to_string());
    let mut objects = manifest::parse(&manifest::envsubst(&text, &vars).unwrap()).unwrap();
    objects.retain(|o| {
        matches!(
            o.types.as_ref().unwrap().kind.as_str(),
            "Cluster" | "MachinePool" | "MicrovmMachinePool" | "KubeadmConfig"
        )
    });
    let mut edit = Some(edit);
    for o in &mut objects {
        match o.types.as_ref().unwrap().kind.as_str() {
            "Cluster" => {
                let spec = o.data["spec"].as_object_mut().unwrap();
                spec.remove("controlPlaneRef");
                spec.remove("infrastructureRef");
                spec.insert(
                    "controlPlaneEndpoint".into(),
                    json!({"host": "10.10.0.100", "port": 6443}),
                );
            }
            "MachinePool" => {
                o.data["spec"]["template"]["metadata"] = json!({
                    "labels": {"pool-role": "worker"},
                    "annotations": {"example.com/note": "from the template"},
                });
                (edit.take().unwrap())(&mut o.data);
            }
            _ => {}
        }
    }
    manifest::apply(&w.client, &objects).await.unwrap();
}

fn provider_id(i: usize) -> String {
    format!("microvm://127.0.0.1:19090/01J0000000000000000000000{i}")
}

/// The provider creates instance `i`: a MicrovmMachine with both labels, a non-controller owner
/// reference to the pool and the pool's template.
async fn create_instance(w: &World, i: usize) -> String {
    let pool = get(w, &infra_pools(), POOL).await.unwrap();
    let name = format!("{POOL}-inst{i}");
    let mut spec = pool.data["spec"]["template"].clone();
    spec["providerID"] = json!(provider_id(i));
    let obj = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha2",
        "kind": "MicrovmMachine",
        "metadata": {
            "name": name,
            "labels": {
                "cluster.x-k8s.io/pool-name": POOL,
                "cluster.x-k8s.io/cluster-name": CLUSTER,
            },
            "ownerReferences": [{
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha2",
                "kind": "MicrovmMachinePool",
                "name": POOL,
                "uid": pool.uid().unwrap(),
            }],
        },
        "spec": spec,
    });
    let obj: DynamicObject = serde_json::from_value(obj).unwrap();
    api(w, &instances())
        .create(&PostParams::default(), &obj)
        .await
        .unwrap();
    api(w, &instances())
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"ready": true, "initialization": {"provisioned": true}}}),
            ),
        )
        .await
        .unwrap();
    name
}

/// The provider writes the pool's list and status: a pool turning unready says so before its list
/// changes, one turning ready after.
async fn write_pool(w: &World, ids: &[usize], ready: bool, replicas: usize) {
    let mut list: Vec<String> = ids.iter().map(|i| provider_id(*i)).collect();
    list.sort();
    let pools = api(w, &infra_pools());
    let status = json!({"status": {
        "ready": ready,
        "initialization": {"provisioned": ready},
        "replicas": replicas,
        "infrastructureMachineKind": "MicrovmMachine",
    }});
    if !ready {
        pools
            .patch_status(POOL, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
    }
    pools
        .patch(
            POOL,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"providerIDList": list}})),
        )
        .await
        .unwrap();
    if ready {
        pools
            .patch_status(POOL, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
    }
}

/// A kubelet registers the Node of instance `i` in the workload API, Ready.
async fn register_node(w: &World, name: &str, provider_id: &str) {
    let client = w.workload_client(NS, CLUSTER).unwrap();
    let nodes: Api<Node> = Api::all(client);
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"providerID": provider_id},
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let status = json!({"status": {
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z", "lastHeartbeatTime": "2026-01-01T00:00:00Z"}],
        "nodeInfo": {"kubeletVersion": "v1.33.0", "architecture": "amd64", "operatingSystem": "linux",
            "bootID": "", "containerRuntimeVersion": "", "kernelVersion": "", "kubeProxyVersion": "",
            "machineID": "", "osImage": "", "systemUUID": ""},
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
}

async fn node_names(w: &World) -> Vec<String> {
    let client = w.workload_client(NS, CLUSTER).unwrap();
    let mut names: Vec<String> = Api::<Node>::all(client)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    names.sort();
    names
}

/// Waits until the MachinePool satisfies `check`; returns it.
async fn wait_pool(w: &World, what: &str, check: impl Fn(&DynamicObject) -> bool) -> DynamicObject {
    wait_for(what, WAIT, POLL, || async {
        Ok(get(w, &machine_pools(), POOL).await.filter(|mp| check(mp)))
    })
    .await
    .unwrap()
}

fn owner_kinds(obj: &DynamicObject) -> Vec<(String, Option<bool>)> {
    obj.owner_references()
        .iter()
        .map(|o| (o.kind.clone(), o.controller))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn machine_pool_core_follows_its_infrastructure_pool_as_capi_v1_14_does() {
    let w = provider_less_world(None).await;
    apply_pool(&w, |_| {}).await;

    // Ownership, finalizer and bootstrap data: the pool's one Secret.
    let mp = wait_pool(&w, "the pool's bootstrap data", |mp| {
        mp.data
            .pointer("/spec/template/spec/bootstrap/dataSecretName")
            .is_some()
            && mp
                .data
                .pointer("/status/initialization/bootstrapDataSecretCreated")
                == Some(&json!(true))
    })
    .await;
    assert_eq!(owner_kinds(&mp), vec![("Cluster".into(), None)]);
    assert!(
        mp.finalizers()
            .contains(&"machinepool.cluster.x-k8s.io".to_string())
    );
    assert_eq!(mp.labels()["cluster.x-k8s.io/cluster-name"], CLUSTER);
    assert_eq!(
        mp.data["spec"]["template"]["spec"]["bootstrap"]["dataSecretName"],
        POOL
    );
    assert_eq!(
        mp.data["status"]["initialization"]["infrastructureProvisioned"],
        false
    );
    let config = get(&w, &kubeadm_configs(), POOL).await.unwrap();
    assert_eq!(
        owner_kinds(&config),
        vec![("MachinePool".into(), Some(true))]
    );
    assert_eq!(config.labels()["cluster.x-k8s.io/cluster-name"], CLUSTER);
    let secret = Api::<Secret>::namespaced(w.client.clone(), NS)
        .get(POOL)
        .await
        .unwrap();
    let user_data = String::from_utf8(secret.data.unwrap()["value"].0.clone()).unwrap();
    assert!(user_data.contains("kubeadm join"), "{user_data}");
    let infra = get(&w, &infra_pools(), POOL).await.unwrap();
    assert_eq!(
        owner_kinds(&infra),
        vec![("MachinePool".into(), Some(true))]
    );
    assert_eq!(infra.labels()["cluster.x-k8s.io/cluster-name"], CLUSTER);

    // Instances while the pool is not ready: Machines appear, nothing is copied.
    for i in 0..3 {
        create_instance(&w, i).await;
    }
    write_pool(&w, &[0, 1, 2], false, 3).await;
    let pool_machines = wait_for("3 MachinePool Machines", WAIT, POLL, || async {
        let ms = api(&w, &machines())
            .list(&ListParams::default())
            .await?
            .items;
        Ok((ms.len() == 3).then_some(ms))
    })
    .await
    .unwrap();
    for m in &pool_machines {
        let name = m.name_any();
        assert!(name.starts_with(&format!("{POOL}-inst")), "{name}");
        assert_eq!(owner_kinds(m), vec![("MachinePool".into(), Some(true))]);
        assert_eq!(m.labels()["cluster.x-k8s.io/pool-name"], POOL);
        assert_eq!(m.labels()["cluster.x-k8s.io/cluster-name"], CLUSTER);
        assert_eq!(m.labels()["pool-role"], "worker");
        assert_eq!(m.annotations()["example.com/note"], "from the template");
        assert_eq!(m.data["spec"]["bootstrap"], json!({"dataSecretName": ""}));
        assert_eq!(
            m.data["spec"]["infrastructureRef"],
            json!({"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "MicrovmMachine", "name": name})
        );
    }
    let mp = get(&w, &machine_pools(), POOL).await.unwrap();
    assert!(
        mp.data.pointer("/spec/providerIDList").is_none(),
        "{:?}",
        mp.data
    );
    assert!(
        mp.data.pointer("/status/replicas").is_none(),
        "{:?}",
        mp.data
    );

    // The Machine controller takes the instances over and keeps the pool's owner reference.
    wait_for(
        "instances adopted by their Machines",
        WAIT,
        POLL,
        || async {
            let all = api(&w, &instances())
                .list(&ListParams::default())
                .await?
                .items;
            let adopted = all.iter().all(|i| {
                let mut kinds = owner_kinds(i);
                kinds.sort();
                kinds
                    == vec![
                        ("Machine".into(), Some(true)),
                        ("MicrovmMachinePool".into(), None),
                    ]
            });
            Ok((all.len() == 3 && adopted).then_some(()))
        },
    )
    .await
    .unwrap();

    // Nodes for instances 0 and 1 (and one whose providerID only starts like instance 2's).
    register_node(&w, "node-0", &provider_id(0)).await;
    register_node(&w, "node-1", &provider_id(1)).await;
    register_node(&w, "node-x", &format!("{}9", provider_id(2))).await;

    // Ready: the list and replicas are copied, Nodes counted by exact providerID.
    write_pool(&w, &[0, 1, 2], true, 3).await;
    let mp = wait_pool(&w, "the pool's list and Node counts", |mp| {
        mp.data.pointer("/status/readyReplicas") == Some(&json!(2))
    })
    .await;
    let mut all_ids: Vec<String> = (0..3).map(provider_id).collect();
    all_ids.sort();
    assert_eq!(mp.data["spec"]["providerIDList"], json!(all_ids));
    assert_eq!(mp.data["status"]["replicas"], 3);
    assert_eq!(mp.data["status"]["availableReplicas"], 2);
    assert_eq!(mp.data["status"]["upToDateReplicas"], 2);
    assert_eq!(
        mp.data["status"]["initialization"]["infrastructureProvisioned"],
        true
    );
    let refs: Vec<&str> = mp.data["status"]["nodeRefs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(refs, vec!["node-0", "node-1"]);
    // Each pool Machine got its version from its Node where the Node came first: none here, and
    // the Machine controller copied the instance's providerID.
    let m0 = get(&w, &machines(), &format!("{POOL}-inst0"))
        .await
        .unwrap();
    assert_eq!(m0.data["spec"]["providerID"], provider_id(0));

    // Not ready again: a changed list is not copied; ready once provisioned stays.
    write_pool(&w, &[1, 2], false, 2).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mp = get(&w, &machine_pools(), POOL).await.unwrap();
    assert_eq!(mp.data["spec"]["providerIDList"], json!(all_ids));
    assert_eq!(mp.data["status"]["replicas"], 3);
    assert_eq!(
        mp.data["status"]["initialization"]["infrastructureProvisioned"],
        true
    );
    assert!(node_names(&w).await.contains(&"node-0".to_string()));

    // Ready: instance 0 left the list, so its Node is deleted (undrained), the others stay.
    write_pool(&w, &[1, 2], true, 2).await;
    wait_for("node-0 deleted as retired", WAIT, POLL, || async {
        Ok((node_names(&w).await == vec!["node-1", "node-x"]).then_some(()))
    })
    .await
    .unwrap();
    let mp = wait_pool(&w, "one nodeRef left", |mp| {
        mp.data["status"]["nodeRefs"].as_array().map(Vec::len) == Some(1)
    })
    .await;
    assert_eq!(mp.data["status"]["replicas"], 2);

    // What the stand-in stored is valid against CAPI's own CRDs, strictly.
    strict_check(
        &w,
        &[
            (&machine_pools(), POOL),
            (&machines(), &format!("{POOL}-inst1")),
        ],
    )
    .await;

    // The Machine flow for a pool Machine: the instance is deleted and gone first, then the Node.
    let inst1 = format!("{POOL}-inst1");
    api(&w, &instances())
        .patch(
            &inst1,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["test.example.com/hold"]}})),
        )
        .await
        .unwrap();
    api(&w, &machines())
        .delete(&inst1, &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the instance being deleted", WAIT, POLL, || async {
        Ok(get(&w, &instances(), &inst1)
            .await
            .and_then(|i| i.metadata.deletion_timestamp)
            .map(|_| ()))
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        get(&w, &machines(), &inst1).await.is_some(),
        "the Machine waits"
    );
    assert!(
        node_names(&w).await.contains(&"node-1".to_string()),
        "the Node waits"
    );
    release(&w, &instances(), &inst1).await;
    wait_for("the Machine and its Node gone", WAIT, POLL, || async {
        let gone = get(&w, &machines(), &inst1).await.is_none()
            && !node_names(&w).await.contains(&"node-1".to_string());
        Ok(gone.then_some(()))
    })
    .await
    .unwrap();

    // Deletion: bootstrap config and InfraMachinePool deleted and waited for, then the Nodes left,
    // then the finalizer. The provider holds its pool a moment (its own finalizer).
    register_node(&w, "node-2", &provider_id(2)).await;
    wait_pool(&w, "node-2 referenced", |mp| {
        mp.data["status"]["nodeRefs"]
            .as_array()
            .is_some_and(|r| r.iter().any(|r| r["name"] == "node-2"))
    })
    .await;
    api(&w, &infra_pools())
        .patch(
            POOL,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["test.example.com/provider"]}})),
        )
        .await
        .unwrap();
    api(&w, &machine_pools())
        .delete(POOL, &DeleteParams::default())
        .await
        .unwrap();
    wait_for(
        "the bootstrap config gone and the pool deleting",
        WAIT,
        POLL,
        || async {
            let config_gone = get(&w, &kubeadm_configs(), POOL).await.is_none();
            let infra_deleting = get(&w, &infra_pools(), POOL)
                .await
                .is_some_and(|p| p.metadata.deletion_timestamp.is_some());
            Ok((config_gone && infra_deleting).then_some(()))
        },
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        get(&w, &machine_pools(), POOL).await.is_some(),
        "MachinePool waits"
    );
    assert!(
        node_names(&w).await.contains(&"node-2".to_string()),
        "Nodes wait"
    );
    release(&w, &infra_pools(), POOL).await;
    wait_for("the MachinePool and its Nodes gone", WAIT, POLL, || async {
        let gone = get(&w, &machine_pools(), POOL).await.is_none()
            && !node_names(&w).await.contains(&"node-2".to_string());
        Ok(gone.then_some(()))
    })
    .await
    .unwrap();
    // A Node that matched nothing is not the pool's to delete.
    assert_eq!(node_names(&w).await, vec!["node-x"]);
    w.shutdown().await;
}

/// Creates each object, as stored, on an emulator serving CAPI's own CRDs with
/// `fieldValidation=Strict`, and writes its status the same way: no error, no warning.
async fn strict_check(w: &World, objects: &[(&ApiResource, &str)]) {
    let Some(dir) = capi::real_crds_dir_or_skip("strict_check of the MachinePool objects") else {
        return;
    };
    let target = capmvm_sim::kube::Emulator::start(Default::default())
        .await
        .unwrap();
    let client = target.client().unwrap();
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    for crd in capmvm_api::crds()
        .into_iter()
        .chain(capi::read_crds(&dir).unwrap())
    {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    for (resource, name) in objects {
        let stored = get(w, resource, name).await.unwrap();
        let mut obj = serde_json::to_value(&stored).unwrap();
        obj["apiVersion"] = json!(resource.api_version);
        obj["kind"] = json!(resource.kind);
        let status = obj.as_object_mut().unwrap().remove("status");
        let meta = obj["metadata"].as_object_mut().unwrap();
        for f in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "generation",
            "managedFields",
            "ownerReferences",
            "finalizers",
            "deletionTimestamp",
        ] {
            meta.remove(f);
        }
        let path = format!(
            "/apis/{}/namespaces/{NS}/{}",
            resource.api_version, resource.plural
        );
        let created = send(
            &client,
            "POST",
            &format!("{path}?fieldValidation=Strict"),
            &obj,
        )
        .await;
        if let Some(status) = status {
            let mut with_status = created;
            with_status["status"] = status.clone();
            let answer = send(
                &client,
                "PUT",
                &format!("{path}/{name}/status?fieldValidation=Strict"),
                &with_status,
            )
            .await;
            assert_eq!(answer["status"], status, "{name}: status kept as written");
        }
    }
    target.shutdown().await;
}

/// A raw request; asserts success and no warning; the answer's body.
async fn send(client: &kube::Client, method: &str, path: &str, body: &Value) -> Value {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(kube::client::Body::from(serde_json::to_vec(body).unwrap()))
        .unwrap();
    let resp = client.send(req).await.unwrap();
    let status = resp.status().as_u16();
    let warnings: Vec<String> = resp
        .headers()
        .get_all("warning")
        .iter()
        .filter_map(|v| v.to_str().ok().map(String::from))
        .collect();
    let bytes = resp.into_body().collect_bytes().await.unwrap();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    assert!(
        (200..300).contains(&status),
        "{method} {path}: {status} {text}"
    );
    assert!(warnings.is_empty(), "{method} {path}: {warnings:?}");
    serde_json::from_slice(&bytes).unwrap()
}

/// The join token in a bootstrap Secret's kubeadm JoinConfiguration.
async fn join_token(w: &World) -> String {
    let secret = Api::<Secret>::namespaced(w.client.clone(), NS)
        .get(POOL)
        .await
        .unwrap();
    let text = String::from_utf8(secret.data.unwrap()["value"].0.clone()).unwrap();
    let doc: Value = serde_saphyr::from_str(&text).unwrap();
    let kubeadm: Value =
        serde_saphyr::from_str(doc["write_files"][0]["content"].as_str().unwrap()).unwrap();
    kubeadm["discovery"]["bootstrapToken"]["token"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pools_join_token_rotates_by_rewriting_its_one_secret() {
    let w = provider_less_world(Some(Duration::from_secs(2))).await;
    apply_pool(&w, |_| {}).await;
    wait_pool(&w, "the pool's bootstrap data", |mp| {
        mp.data
            .pointer("/spec/template/spec/bootstrap/dataSecretName")
            == Some(&json!(POOL))
    })
    .await;
    let first = join_token(&w).await;
    let second = wait_for("a rotated token", WAIT, POLL, || async {
        let t = join_token(&w).await;
        Ok((t != first).then_some(t))
    })
    .await
    .unwrap();
    assert_ne!(first, second);
    // Same Secret, same name in the pool: new instances simply read the current data.
    let mp = get(&w, &machine_pools(), POOL).await.unwrap();
    assert_eq!(
        mp.data["spec"]["template"]["spec"]["bootstrap"]["dataSecretName"],
        POOL
    );
    let secrets = Api::<Secret>::namespaced(w.client.clone(), NS)
        .list(&ListParams::default().labels(&format!("cluster.x-k8s.io/cluster-name={CLUSTER}")))
        .await
        .unwrap();
    assert_eq!(
        secrets
            .items
            .iter()
            .filter(|s| s.name_any().starts_with(POOL))
            .count(),
        1
    );

    // Deleting the Cluster deletes its MachinePools (and waits for them) before it goes.
    let clusters = gvk("cluster.x-k8s.io", "v1beta2", "Cluster", "clusters");
    api(&w, &infra_pools())
        .patch(
            POOL,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["test.example.com/provider"]}})),
        )
        .await
        .unwrap();
    api(&w, &clusters)
        .delete(CLUSTER, &DeleteParams::default())
        .await
        .unwrap();
    wait_for(
        "the pool deleting while the Cluster waits",
        WAIT,
        POLL,
        || async {
            let pool_deleting = get(&w, &machine_pools(), POOL)
                .await
                .is_some_and(|p| p.metadata.deletion_timestamp.is_some());
            let cluster_waits = get(&w, &clusters, CLUSTER).await.is_some();
            Ok((pool_deleting && cluster_waits).then_some(()))
        },
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        get(&w, &clusters, CLUSTER).await.is_some(),
        "the Cluster waits"
    );
    release(&w, &infra_pools(), POOL).await;
    wait_for("the Cluster and its pool gone", WAIT, POLL, || async {
        let gone = get(&w, &clusters, CLUSTER).await.is_none()
            && get(&w, &machine_pools(), POOL).await.is_none()
            && get(&w, &infra_pools(), POOL).await.is_none()
            && get(&w, &kubeadm_configs(), POOL).await.is_none();
        Ok(gone.then_some(()))
    })
    .await
    .unwrap();
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_defaults_and_refuses_pools_as_capi_and_kubectl_scales_them() {
    let w = provider_less_world(None).await;
    // Defaulting: replicas, the version's `v`; bootstrap given directly as a Secret's name.
    apply_pool(&w, |mp| {
        mp["spec"].as_object_mut().unwrap().remove("replicas");
        mp["spec"]["template"]["spec"]["version"] = json!("1.33.0");
        mp["spec"]["template"]["spec"]["bootstrap"] = json!({"dataSecretName": "my-own-data"});
    })
    .await;
    let mp = wait_pool(&w, "bootstrap data from dataSecretName", |mp| {
        mp.data
            .pointer("/status/initialization/bootstrapDataSecretCreated")
            == Some(&json!(true))
    })
    .await;
    assert_eq!(mp.data["spec"]["replicas"], 1);
    assert_eq!(mp.data["spec"]["template"]["spec"]["version"], "v1.33.0");
    assert_eq!(mp.labels()["cluster.x-k8s.io/cluster-name"], CLUSTER);
    assert_eq!(
        mp.data["spec"]["template"]["spec"]["bootstrap"],
        json!({"dataSecretName": "my-own-data"})
    );

    // Refused: no bootstrap data at all.
    let mut bad = mp.clone();
    bad.metadata = kube::api::ObjectMeta {
        name: Some("no-bootstrap".into()),
        namespace: Some(NS.into()),
        ..Default::default()
    };
    bad.data["spec"]["template"]["spec"]["bootstrap"] = json!({});
    bad.data.as_object_mut().unwrap().remove("status");
    let e = api(&w, &machine_pools())
        .create(&PostParams::default(), &bad)
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("spec.template.spec.bootstrap.dataSecretName"),
        "{text}"
    );

    // `kubectl scale mp` goes through the scale subresource (locally without the pinned kubectl,
    // the same request from kube-rs).
    if let Some(kubectl) = pinned_kubectl() {
        let out = std::process::Command::new(kubectl)
            .arg("--kubeconfig")
            .arg(&w.kubeconfig)
            .args(["-n", NS, "scale", "mp", POOL, "--replicas=5"])
            .output()
            .expect("kubectl runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    } else {
        api(&w, &machine_pools())
            .patch_scale(
                POOL,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 5}})),
            )
            .await
            .unwrap();
    }
    let mp = get(&w, &machine_pools(), POOL).await.unwrap();
    assert_eq!(mp.data["spec"]["replicas"], 5);
    // The provider reports none yet: the Scale shows what core copied.
    api(&w, &infra_pools())
        .patch_status(
            POOL,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"ready": true, "initialization": {"provisioned": true}, "replicas": 0}})),
        )
        .await
        .unwrap();
    let scale = wait_for("the Scale's status", WAIT, POLL, || async {
        let s = api(&w, &machine_pools()).get_scale(POOL).await?;
        Ok((s.status.as_ref().map(|s| s.replicas) == Some(0)).then_some(s))
    })
    .await
    .unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(5));
    w.shutdown().await;
}

/// The kubectl `hack/upstream.sh build` pinned, never one the machine happens to have: `None` (the
/// step reported as skipped) locally without it, a failure in CI.
fn pinned_kubectl() -> Option<std::path::PathBuf> {
    capmvm_upstream::Binaries::for_test("kubectl scale mp", &["kubectl"])
        .and_then(|b| b.path("kubectl").ok())
}
