#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The scale subresource of custom resources: discovery, GET/PUT/PATCH of `{resource}/{name}/scale`
//! as an `autoscaling/v1` Scale written through to the CRD's paths, and `kubectl scale`. Every test runs
//! on the emulator and on the real kube-apiserver (see `kube_contract`).

mod kube_support;

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube_support::servers::Server;
use kube_support::*;
use serde_json::{Value, json};

/// `pools.test.example.com`: spec.replicas (at most 10), status.replicas and status.selector.
fn pool_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "pools.test.example.com"},
        "spec": {
            "group": "test.example.com",
            "names": {"plural": "pools", "singular": "pool", "kind": "Pool"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}, "scale": {
                    "specReplicasPath": ".spec.replicas",
                    "statusReplicasPath": ".status.replicas",
                    "labelSelectorPath": ".status.selector"
                }},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {
                        "replicas": {"type": "integer", "minimum": 0, "maximum": 10},
                        "size": {"type": "string"}}},
                    "status": {"type": "object", "properties": {
                        "replicas": {"type": "integer"}, "selector": {"type": "string"}}}
                }}}
            }]
        }
    })
}

fn pools(client: &kube::Client) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("test.example.com", "v1", "Pool"),
        "pools",
    );
    Api::namespaced_with(client.clone(), "default", &ar)
}

async fn pool(client: &kube::Client, replicas: i64) -> DynamicObject {
    let api = pools(client);
    api.create_json(json!({"apiVersion": "test.example.com/v1", "kind": "Pool",
            "metadata": {"name": "p"}, "spec": {"replicas": replicas, "size": "m"}}))
        .await;
    api.patch_status(
        "p",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"replicas": 1, "selector": "pool=p"}})),
    )
    .await
    .unwrap()
}

const SCALE: &str = "/apis/test.example.com/v1/namespaces/default/pools/p/scale";

/// A merge patch of p's scale, as `kubectl scale` sends it.
async fn patch_scale(client: &kube::Client, patch: &[u8]) -> Raw {
    raw(
        client,
        "PATCH",
        SCALE,
        Some("application/merge-patch+json"),
        patch,
    )
    .await
}

/// A PUT of p's scale.
async fn put_scale(client: &kube::Client, scale: &Value) -> Raw {
    raw(
        client,
        "PUT",
        SCALE,
        Some("application/json"),
        scale.to_string().as_bytes(),
    )
    .await
}

async fn discovery_lists_the_scale_subresource(server: Server) {
    let client = server.client();
    create_crd(&client, &pool_crd()).await;
    let doc = get_json(&client, "/apis/test.example.com/v1").await;
    let scale = doc["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "pools/scale")
        .expect("pools/scale listed");
    assert_eq!(scale["group"], "autoscaling");
    assert_eq!(scale["version"], "v1");
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["verbs"], json!(["get", "patch", "update"]));
    // CAPI's MachineDeployment declares it too.
    create_crd(&client, &capi_machine_deployment_crd()).await;
    let doc = get_json(&client, "/apis/cluster.x-k8s.io/v1beta2").await;
    assert!(
        doc["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "machinedeployments/scale"),
        "{doc}"
    );
}

async fn scale_reads_and_writes_through_to_the_object(server: Server) {
    let client = server.client();
    create_crd(&client, &pool_crd()).await;
    let p = pool(&client, 3).await;
    let s = get_json(&client, SCALE).await;
    assert_eq!(s["kind"], "Scale");
    assert_eq!(s["apiVersion"], "autoscaling/v1");
    assert_eq!(s["metadata"]["name"], "p");
    assert_eq!(s["metadata"]["uid"], json!(p.metadata.uid));
    assert_eq!(
        s["metadata"]["resourceVersion"],
        json!(p.metadata.resource_version)
    );
    assert_eq!(s["spec"]["replicas"], 3);
    assert_eq!(s["status"], json!({"replicas": 1, "selector": "pool=p"}));

    // A merge patch (what `kubectl scale` sends) writes spec.replicas and bumps generation.
    let r = patch_scale(&client, br#"{"spec":{"replicas":5}}"#).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.body["spec"]["replicas"], 5);
    let obj = pools(&client).get("p").await.unwrap();
    assert_eq!(obj.data["spec"], json!({"replicas": 5, "size": "m"}));
    assert_eq!(obj.metadata.generation, Some(2));
    assert_eq!(
        r.body["metadata"]["resourceVersion"],
        json!(obj.metadata.resource_version)
    );

    // PUT with the current resourceVersion; a stale one is 409 and changes nothing.
    let mut s = get_json(&client, SCALE).await;
    s["spec"]["replicas"] = json!(7);
    let r = put_scale(&client, &s).await;
    assert_eq!(
        (r.status, &r.body["spec"]["replicas"]),
        (200, &json!(7)),
        "{}",
        r.text
    );
    s["spec"]["replicas"] = json!(8);
    let r = put_scale(&client, &s).await;
    assert_status(&r, 409, "Conflict");
    // Negative replicas are refused as a real server refuses them; the CRD's schema still applies.
    let r = patch_scale(&client, br#"{"spec":{"replicas":-1}}"#).await;
    assert_status(&r, 422, "Invalid");
    assert_eq!(r.body["details"]["causes"][0]["field"], "spec.replicas");
    let r = patch_scale(&client, br#"{"spec":{"replicas":11}}"#).await;
    assert_status(&r, 422, "Invalid");
    assert_eq!(
        pools(&client).get("p").await.unwrap().data["spec"]["replicas"],
        7
    );
    // A resource without the subresource, or a missing object, is 404.
    let r = raw(
        &client,
        "GET",
        "/apis/test.example.com/v1/namespaces/default/pools/none/scale",
        None,
        b"",
    )
    .await;
    assert_status(&r, 404, "NotFound");
}

async fn kubectl_scale_sets_the_replicas(server: Server) {
    let client = server.client();
    create_crd(&client, &pool_crd()).await;
    pool(&client, 2).await;
    let Some(kubectl) = server.kubectl("kubectl_scale_sets_the_replicas") else {
        return;
    };
    let out = kubectl
        .run(&["scale", "pools.test.example.com/p", "--replicas=4"])
        .await
        .expect("kubectl scale");
    assert_eq!(out.trim(), "pool.test.example.com/p scaled");
    assert_eq!(
        pools(&client).get("p").await.unwrap().data["spec"]["replicas"],
        4
    );
}

on_both_servers!(
    discovery_lists_the_scale_subresource,
    scale_reads_and_writes_through_to_the_object,
    kubectl_scale_sets_the_replicas,
);
