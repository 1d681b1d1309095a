#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Nodes (core `v1`, cluster-scoped) served as a real kube-apiserver serves them: what a kubelet
//! registers (status included) is kept, `/status` is the subresource a kubelet updates, and
//! `kubectl get nodes` prints NAME, STATUS, ROLES, AGE, VERSION. Every test runs on the emulator and on
//! the real kube-apiserver (see `kube_contract`).

mod kube_support;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeCondition, NodeSpec, NodeStatus, NodeSwapStatus, NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube_support::servers::Server;
use kube_support::*;
use serde_json::json;

fn node(name: &str, ready: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([(
                "node-role.kubernetes.io/control-plane".to_string(),
                String::new(),
            )])),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some("microvm://127.0.0.1:9090/01KE75BHT9H6D7V5YG0KYGRXX2".into()),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            capacity: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("2".into())),
                ("memory".to_string(), Quantity("2048Mi".into())),
                ("pods".to_string(), Quantity("110".into())),
            ])),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: ready.into(),
                reason: Some("KubeletReady".into()),
                ..Default::default()
            }]),
            node_info: Some(NodeSystemInfo {
                architecture: "amd64".into(),
                boot_id: "b".into(),
                container_runtime_version: "containerd://2.0.5".into(),
                kernel_version: "5.10.77".into(),
                kube_proxy_version: "v1.33.0".into(),
                kubelet_version: "v1.33.0".into(),
                machine_id: "m".into(),
                operating_system: "linux".into(),
                os_image: "Ubuntu 24.04.2 LTS".into(),
                system_uuid: "u".into(),
                swap: Some(NodeSwapStatus {
                    capacity: Some(2 << 30),
                }),
            }),
            ..Default::default()
        }),
    }
}

async fn a_registered_node_keeps_its_status_and_status_is_a_subresource(server: Server) {
    let client = server.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let created = nodes
        .create(&PostParams::default(), &node("cp-0", "True"))
        .await
        .unwrap();
    // A kubelet registers its Node with status; the API server keeps it on create.
    let info = created.status.as_ref().unwrap().node_info.as_ref().unwrap();
    assert_eq!(info.kubelet_version, "v1.33.0");
    assert_eq!(info.swap.as_ref().unwrap().capacity, Some(2 << 30));
    // Quantities are kept in their canonical form, as `resource.Quantity` writes itself.
    assert_eq!(
        created.status.as_ref().unwrap().capacity.as_ref().unwrap()["memory"],
        Quantity("2Gi".into())
    );
    let mut bad = node("bad-quantity", "True");
    bad.status
        .as_mut()
        .unwrap()
        .capacity
        .as_mut()
        .unwrap()
        .insert("cpu".into(), Quantity("two".into()));
    let s = status_of(
        nodes
            .create(&PostParams::default(), &bad)
            .await
            .unwrap_err(),
    );
    assert_eq!(s.code, 400, "{}", s.message);
    assert!(
        s.message
            .contains("quantities must match the regular expression"),
        "{}",
        s.message
    );
    assert_eq!(
        created.spec.as_ref().unwrap().provider_id.as_deref(),
        Some("microvm://127.0.0.1:9090/01KE75BHT9H6D7V5YG0KYGRXX2")
    );

    // A write to the main resource leaves status alone; one to /status changes only status.
    let params = PatchParams::default();
    let patched = nodes
        .patch(
            "cp-0",
            &params,
            &Patch::Merge(json!({"spec": {"unschedulable": true}, "status": {"phase": "x"}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.spec.as_ref().unwrap().unschedulable, Some(true));
    assert_eq!(patched.status.as_ref().unwrap().phase, None);
    let body = json!({"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]}, "spec": {"unschedulable": false}});
    let patched = nodes
        .patch_status("cp-0", &params, &Patch::Merge(body))
        .await
        .unwrap();
    assert_eq!(patched.spec.as_ref().unwrap().unschedulable, Some(true));
    assert_eq!(
        patched
            .status
            .as_ref()
            .unwrap()
            .conditions
            .as_ref()
            .unwrap()[0]
            .status,
        "False"
    );

    // Field selectors a real server offers on Nodes.
    let cordoned = nodes
        .list(&ListParams::default().fields("spec.unschedulable=true"))
        .await
        .unwrap();
    assert_eq!(cordoned.items.len(), 1);
}

async fn nodes_are_discovered_cluster_scoped_with_their_short_name_and_status(server: Server) {
    let client = server.client();
    let list = get_json(&client, "/api/v1").await;
    let resources = list["resources"].as_array().unwrap();
    let nodes = resources.iter().find(|r| r["name"] == "nodes").unwrap();
    assert_eq!(nodes["kind"], "Node");
    assert_eq!(nodes["namespaced"], false);
    assert_eq!(nodes["shortNames"], json!(["no"]));
    assert!(resources.iter().any(|r| r["name"] == "nodes/status"));
    // Nodes live outside namespaces: the namespaced path is not served.
    let r = raw(
        &client,
        "GET",
        "/api/v1/namespaces/default/nodes",
        None,
        b"",
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.text);
}

async fn the_node_table_prints_status_roles_and_kubelet_version(server: Server) {
    let client = server.client();
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &node("cp-0", "True"))
        .await
        .unwrap();
    let mut worker = node("md-0", "Unknown");
    worker.metadata.labels = None;
    worker.spec.as_mut().unwrap().unschedulable = Some(true);
    nodes.create(&PostParams::default(), &worker).await.unwrap();
    let mut unregistered = node("bare", "True");
    unregistered.status = None;
    nodes
        .create(&PostParams::default(), &unregistered)
        .await
        .unwrap();

    let r = raw_with(
        &client,
        "GET",
        "/api/v1/nodes",
        None,
        Some("application/json;as=Table;v=v1;g=meta.k8s.io"),
        b"",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let columns: Vec<&str> = r.body["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["priority"] == 0)
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(columns, ["Name", "Status", "Roles", "Age", "Version"]);
    let rows: Vec<(String, String, String, String)> = r.body["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            let c = &row["cells"];
            let s = |i: usize| c[i].as_str().unwrap_or("").to_string();
            (s(0), s(1), s(2), s(4))
        })
        .collect();
    assert_eq!(
        rows,
        [
            (
                "bare".into(),
                "Unknown".into(),
                "control-plane".into(),
                "".into()
            ),
            (
                "cp-0".into(),
                "Ready".into(),
                "control-plane".into(),
                "v1.33.0".into()
            ),
            (
                "md-0".into(),
                "NotReady,SchedulingDisabled".into(),
                "<none>".into(),
                "v1.33.0".into()
            ),
        ]
    );
}

/// A Node that reports swap reports a positive capacity: the real `ValidateNode` refuses 0 or less
/// on create, under `metadata.nodeSwapStatus.capacity`, and its update validation does not look.
async fn a_node_reporting_swap_reports_a_positive_capacity(server: Server) {
    let client = server.client();
    let nodes: Api<Node> = Api::all(client.clone());
    for (name, capacity) in [("zero", 0), ("negative", -1)] {
        let mut n = node(name, "True");
        n.status.as_mut().unwrap().node_info.as_mut().unwrap().swap = Some(NodeSwapStatus {
            capacity: Some(capacity),
        });
        let s = status_of(nodes.create(&PostParams::default(), &n).await.unwrap_err());
        assert_eq!(
            (s.code, s.reason.as_str()),
            (422, "Invalid"),
            "{}",
            s.message
        );
        assert_eq!(
            s.message,
            format!(
                "Node \"{name}\" is invalid: metadata.nodeSwapStatus.capacity: Invalid value: {capacity}: must be greater than zero"
            )
        );
        let causes = s.details.unwrap().causes;
        assert_eq!(causes.len(), 1, "{causes:?}");
        assert_eq!(causes[0].field, "metadata.nodeSwapStatus.capacity");
        assert_eq!(causes[0].reason, "FieldValueInvalid");
    }
    // Without swap, or with a positive capacity, the Node registers; a later status write of 0 is
    // not checked.
    let mut bare = node("no-swap", "True");
    bare.status
        .as_mut()
        .unwrap()
        .node_info
        .as_mut()
        .unwrap()
        .swap = None;
    nodes.create(&PostParams::default(), &bare).await.unwrap();
    nodes
        .create(&PostParams::default(), &node("swap", "True"))
        .await
        .unwrap();
    let patched = nodes
        .patch_status(
            "swap",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"nodeInfo": {"swap": {"capacity": 0}}}})),
        )
        .await
        .unwrap();
    let info = patched.status.unwrap().node_info.unwrap();
    assert_eq!(info.swap.unwrap().capacity, Some(0));
}

on_both_servers!(
    a_registered_node_keeps_its_status_and_status_is_a_subresource,
    nodes_are_discovered_cluster_scoped_with_their_short_name_and_status,
    the_node_table_prints_status_roles_and_kubelet_version,
    a_node_reporting_swap_reports_a_positive_capacity,
);
