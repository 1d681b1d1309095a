#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Server-side apply and field ownership, on the emulator and on the real kube-apiserver (the
//! oracle): kube-rs's `Patch::Apply` and `kubectl apply --server-side`, `managedFields` per manager and
//! operation, the schema's merge rules (sets, keyed lists, atomic lists and objects, granular maps),
//! conflicts worded as the real server words them, `force`, removal of what a manager stops applying,
//! and the status subresource.

mod kube_support;

use kube::api::{Api, Patch, PatchParams};
use kube::core::DynamicObject;
use kube_support::servers::Server;
use kube_support::*;
use serde_json::{Value, json};

/// A CRD with each merge rule: a set, a list keyed by two fields, an atomic list, a granular and an
/// atomic map and struct, and a status with a keyed list.
fn thing_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "things.test.example.com"},
        "spec": {
            "group": "test.example.com",
            "names": {"plural": "things", "singular": "thing", "kind": "Thing"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {
                        "replicas": {"type": "integer"},
                        "color": {"type": "string"},
                        "tags": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
                        "ports": {"type": "array", "x-kubernetes-list-type": "map",
                            "x-kubernetes-list-map-keys": ["name", "protocol"],
                            "items": {"type": "object", "required": ["name", "protocol"], "properties": {
                                "name": {"type": "string"}, "protocol": {"type": "string"},
                                "port": {"type": "integer"}}}},
                        "items": {"type": "array", "items": {"type": "string"}},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "atomicMap": {"type": "object", "additionalProperties": {"type": "string"},
                            "x-kubernetes-map-type": "atomic"},
                        "granular": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}},
                        "atomicStruct": {"type": "object", "x-kubernetes-map-type": "atomic",
                            "properties": {"a": {"type": "string"}, "b": {"type": "string"}}}
                    }},
                    "status": {"type": "object", "properties": {
                        "replicas": {"type": "integer"},
                        "conditions": {"type": "array", "x-kubernetes-list-type": "map",
                            "x-kubernetes-list-map-keys": ["type"],
                            "items": {"type": "object", "required": ["type"], "properties": {
                                "type": {"type": "string"}, "status": {"type": "string"}}}}
                    }}
                }}}
            }]
        }
    })
}

fn things(client: &kube::Client) -> Api<DynamicObject> {
    let ar = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("test.example.com", "v1", "Thing"),
        "things",
    );
    Api::namespaced_with(client.clone(), "default", &ar)
}

fn thing(spec: Value) -> Value {
    json!({"apiVersion": "test.example.com/v1", "kind": "Thing", "metadata": {"name": "t"}, "spec": spec})
}

const PATH: &str = "/apis/test.example.com/v1/namespaces/default/things/t";

/// The `managedFields` entries as `(manager, operation, subresource, fieldsV1)`.
fn entries(obj: &Value) -> Vec<(String, String, String, Value)> {
    obj["metadata"]["managedFields"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|e| {
            (
                e["manager"].as_str().unwrap_or("").to_string(),
                e["operation"].as_str().unwrap_or("").to_string(),
                e["subresource"].as_str().unwrap_or("").to_string(),
                e["fieldsV1"].clone(),
            )
        })
        .collect()
}

fn fields_of<'a>(obj: &'a Value, manager: &str) -> &'a Value {
    obj["metadata"]["managedFields"]
        .as_array()
        .and_then(|l| l.iter().find(|e| e["manager"] == manager))
        .map_or(&Value::Null, |e| &e["fieldsV1"])
}

/// An apply by `manager`, unforced, to the main resource, that must succeed.
async fn applied(client: &kube::Client, manager: &str, body: Value) -> Value {
    apply(client, manager, false, body, false).await.unwrap()
}

async fn apply(
    client: &kube::Client,
    manager: &str,
    force: bool,
    body: Value,
    status: bool,
) -> Result<Value, kube::core::Status> {
    let mut pp = PatchParams::apply(manager);
    if force {
        pp = pp.force();
    }
    let api = things(client);
    let r = if status {
        api.patch_status("t", &pp, &Patch::Apply(body)).await
    } else {
        api.patch("t", &pp, &Patch::Apply(body)).await
    };
    r.map(|o| serde_json::to_value(o).unwrap())
        .map_err(status_of)
}

async fn apply_creates_the_object_and_owns_what_it_names(server: Server) {
    let client = server.client();
    create_crd(&client, &thing_crd()).await;
    let mut config = thing(json!({
        "replicas": 2, "color": "red", "tags": ["x", "z"],
        "ports": [{"name": "http", "protocol": "TCP", "port": 80}], "items": ["a", "b"],
        "labels": {"k1": "v1"}, "atomicMap": {"m1": "v1"}, "granular": {"a": "A"},
        "atomicStruct": {"a": "A"}}));
    config["metadata"]["labels"] = json!({"a": "1"});
    // Status sent to the main path is not the applier's (and dropped on create).
    config["status"] = json!({"replicas": 9});
    let created = applied(&client, "mgr-a", config).await;
    assert_eq!(created["spec"]["ports"][0]["port"], 80);
    assert!(created.get("status").is_none(), "{created}");
    assert_eq!(
        entries(&created),
        vec![(
            "mgr-a".to_string(),
            "Apply".to_string(),
            String::new(),
            json!({"f:metadata": {"f:labels": {"f:a": {}}}, "f:spec": {"f:atomicMap": {},
                "f:atomicStruct": {}, "f:color": {}, "f:granular": {"f:a": {}}, "f:items": {},
                "f:labels": {"f:k1": {}},
                "f:ports": {"k:{\"name\":\"http\",\"protocol\":\"TCP\"}": {".": {}, "f:name": {}, "f:port": {}, "f:protocol": {}}},
                "f:replicas": {}, "f:tags": {"v:\"x\"": {}, "v:\"z\"": {}}}})
        )]
    );
    // The same configuration again changes nothing.
    let rv = created["metadata"]["resourceVersion"].clone();
    let mut again = thing(created["spec"].clone());
    again["metadata"]["labels"] = json!({"a": "1"});
    let same = applied(&client, "mgr-a", again).await;
    assert_eq!(same["metadata"]["resourceVersion"], rv);
}

async fn an_apply_that_changes_another_managers_fields_conflicts(server: Server) {
    let client = server.client();
    create_crd(&client, &thing_crd()).await;
    applied(
        &client,
        "mgr-a",
        thing(json!({"color": "red", "tags": ["x"], "items": ["a", "b"],
            "ports": [{"name": "http", "protocol": "TCP", "port": 80}],
            "granular": {"a": "A"}, "atomicStruct": {"a": "A"}})),
    )
    .await;
    let b = thing(json!({"color": "blue", "tags": ["w"], "items": ["c"],
        "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
        "granular": {"b": "B"}, "atomicStruct": {"b": "B"}}));
    let s = apply(&client, "mgr-b", false, b.clone(), false)
        .await
        .unwrap_err();
    assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        s.message,
        "Apply failed with 4 conflicts: conflicts with \"mgr-a\":\n- .spec.atomicStruct\n- .spec.color\n- .spec.items\n- .spec.ports[name=\"http\",protocol=\"TCP\"].port"
    );
    let causes = s.details.unwrap().causes;
    assert_eq!(causes.len(), 4);
    assert_eq!(causes[3].reason, "FieldManagerConflict");
    assert_eq!(causes[3].message, "conflict with \"mgr-a\"");
    assert_eq!(
        causes[3].field,
        ".spec.ports[name=\"http\",protocol=\"TCP\"].port"
    );
    // Nothing was written.
    let now = things(&client).get("t").await.unwrap();
    assert_eq!(now.data["spec"]["color"], "red");

    // Applying the values another manager set is no conflict: both own the field.
    let shared = applied(&client, "mgr-c", thing(json!({"color": "red"}))).await;
    assert_eq!(
        fields_of(&shared, "mgr-c"),
        &json!({"f:spec": {"f:color": {}}})
    );
    assert!(fields_of(&shared, "mgr-a")["f:spec"]["f:color"].is_object());

    // Forced, the apply takes the fields over; what did not conflict merges in.
    let forced = apply(&client, "mgr-b", true, b, false).await.unwrap();
    assert_eq!(forced["spec"]["color"], "blue");
    assert_eq!(forced["spec"]["tags"], json!(["x", "w"]));
    assert_eq!(forced["spec"]["items"], json!(["c"]));
    assert_eq!(forced["spec"]["granular"], json!({"a": "A", "b": "B"}));
    assert_eq!(forced["spec"]["atomicStruct"], json!({"b": "B"}));
    assert_eq!(
        forced["spec"]["ports"],
        json!([{"name": "http", "protocol": "TCP", "port": 8080}])
    );
    let a = fields_of(&forced, "mgr-a");
    assert!(a["f:spec"].get("f:color").is_none(), "{a}");
    assert!(a["f:spec"].get("f:items").is_none(), "{a}");
    assert!(a["f:spec"]["f:tags"]["v:\"x\""].is_object(), "{a}");
    // mgr-c's co-ownership of color went with the change.
    assert!(fields_of(&forced, "mgr-c").is_null(), "{forced}");
}

async fn fields_a_manager_stops_applying_are_removed_unless_another_owns_them(server: Server) {
    let client = server.client();
    create_crd(&client, &thing_crd()).await;
    applied(
        &client,
        "mgr-a",
        thing(json!({"color": "red", "replicas": 1, "tags": ["x", "y1"],
            "granular": {"a": "A", "b": "B"}, "labels": {"k1": "v1", "k2": "v2"},
            "ports": [{"name": "http", "protocol": "TCP", "port": 80},
                {"name": "dns", "protocol": "UDP", "port": 53}]})),
    )
    .await;
    // Another manager co-owns the color.
    applied(&client, "mgr-b", thing(json!({"color": "red"}))).await;
    let after = applied(
        &client,
        "mgr-a",
        thing(json!({"replicas": 1, "tags": ["x"], "granular": {"a": "A"},
            "labels": {"k1": "v1"}, "ports": [{"name": "http", "protocol": "TCP", "port": 80}]})),
    )
    .await;
    assert_eq!(after["spec"]["color"], "red", "still mgr-b's");
    assert_eq!(after["spec"]["tags"], json!(["x"]));
    assert_eq!(after["spec"]["granular"], json!({"a": "A"}));
    assert_eq!(after["spec"]["labels"], json!({"k1": "v1"}));
    assert_eq!(
        after["spec"]["ports"],
        json!([{"name": "http", "protocol": "TCP", "port": 80}])
    );
    // Once nobody applies a struct's fields, the struct goes too.
    let last = applied(&client, "mgr-a", thing(json!({"replicas": 1}))).await;
    assert!(last["spec"].get("granular").is_none(), "{last}");
    assert!(last["spec"].get("ports").is_none(), "{last}");
    assert_eq!(last["spec"]["color"], "red");
}

async fn apply_conflicts_with_update_managers_and_on_the_status_subresource(server: Server) {
    let client = server.client();
    create_crd(&client, &thing_crd()).await;
    applied(&client, "mgr-a", thing(json!({"replicas": 1}))).await;
    // A merge patch is an update: its manager owns what it changed, taken from mgr-a.
    let r = raw(
        &client,
        "PATCH",
        &format!("{PATH}?fieldManager=patcher"),
        Some("application/merge-patch+json"),
        br#"{"spec":{"replicas":5}}"#,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        fields_of(&r.body, "patcher"),
        &json!({"f:spec": {"f:replicas": {}}})
    );
    assert!(fields_of(&r.body, "mgr-a").is_null(), "{}", r.text);
    let r = raw(
        &client,
        "PATCH",
        &format!("{PATH}/status?fieldManager=statuser"),
        Some("application/merge-patch+json"),
        br#"{"status":{"replicas":1,"conditions":[{"type":"Ready","status":"True"}]}}"#,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let status_entry = entries(&r.body)
        .into_iter()
        .find(|e| e.0 == "statuser")
        .unwrap();
    assert_eq!(
        status_entry,
        (
            "statuser".to_string(),
            "Update".to_string(),
            "status".to_string(),
            json!({"f:status": {".": {}, "f:conditions": {".": {},
                "k:{\"type\":\"Ready\"}": {".": {}, "f:status": {}, "f:type": {}}}, "f:replicas": {}}})
        )
    );
    // An apply to the main path ignores status, and names the update manager it conflicts with.
    let mut config = thing(json!({"replicas": 7}));
    config["status"] = json!({"replicas": 3});
    let s = apply(&client, "mgr-c", false, config, false)
        .await
        .unwrap_err();
    assert_eq!(
        s.message,
        "Apply failed with 1 conflict: conflict with \"patcher\" using test.example.com/v1: .spec.replicas"
    );
    // On the status subresource, the conflict names the subresource.
    let mut config = thing(json!({}));
    config["status"] = json!({"replicas": 3, "conditions": [{"type": "Ready", "status": "False"}]});
    let s = apply(&client, "mgr-c", false, config.clone(), true)
        .await
        .unwrap_err();
    assert_eq!(
        s.message,
        "Apply failed with 2 conflicts: conflicts with \"statuser\" with subresource \"status\" using test.example.com/v1:\n- .status.replicas\n- .status.conditions[type=\"Ready\"].status"
    );
    let forced = apply(&client, "mgr-c", true, config, true).await.unwrap();
    assert_eq!(forced["status"]["conditions"][0]["status"], "False");
    let applied = entries(&forced)
        .into_iter()
        .find(|e| e.0 == "mgr-c" && e.2 == "status")
        .unwrap();
    assert_eq!(applied.1, "Apply");
}

async fn writes_record_their_fields_under_their_manager(server: Server) {
    let client = server.client();
    create_crd(&client, &widget_crd()).await;
    let r = raw(
        &client,
        "POST",
        "/apis/test.example.com/v1/namespaces/default/widgets?fieldManager=creator",
        Some("application/json"),
        json!({"apiVersion": "test.example.com/v1", "kind": "Widget",
            "metadata": {"name": "w", "labels": {"app": "x"}}, "spec": {"size": 2}})
        .to_string()
        .as_bytes(),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    // The create owns what it set and what defaulting added (the color).
    assert_eq!(
        entries(&r.body),
        vec![(
            "creator".to_string(),
            "Update".to_string(),
            String::new(),
            json!({"f:metadata": {"f:labels": {".": {}, "f:app": {}}},
                "f:spec": {".": {}, "f:color": {}, "f:size": {}}})
        )]
    );
    // A PUT by another manager takes what it changed; the entry of each stays separate.
    let mut whole = r.body.clone();
    whole["spec"]["size"] = json!(3);
    let r = raw(
        &client,
        "PUT",
        "/apis/test.example.com/v1/namespaces/default/widgets/w?fieldManager=editor",
        Some("application/json"),
        whole.to_string().as_bytes(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        fields_of(&r.body, "editor"),
        &json!({"f:spec": {"f:size": {}}})
    );
    assert_eq!(
        fields_of(&r.body, "creator"),
        &json!({"f:metadata": {"f:labels": {".": {}, "f:app": {}}}, "f:spec": {".": {}, "f:color": {}}})
    );
}

async fn apply_needs_a_field_manager_and_a_named_object(server: Server) {
    let client = server.client();
    create_crd(&client, &thing_crd()).await;
    let body = thing(json!({"color": "red"})).to_string();
    let r = raw(
        &client,
        "PATCH",
        PATH,
        Some("application/apply-patch+yaml"),
        body.as_bytes(),
    )
    .await;
    assert_status(&r, 422, "Invalid");
    assert_eq!(
        r.body["message"],
        "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"
    );
    let mut unnamed = thing(json!({"color": "red"}));
    unnamed["metadata"] = json!({});
    let r = raw(
        &client,
        "PATCH",
        &format!("{PATH}?fieldManager=m"),
        Some("application/apply-patch+yaml"),
        unnamed.to_string().as_bytes(),
    )
    .await;
    assert_status(&r, 400, "BadRequest");
    assert_eq!(
        r.body["message"],
        "the name of the object (t based on URL) was undeterminable: name must be provided"
    );
    // YAML, as kubectl sends it.
    let r = raw(
        &client,
        "PATCH",
        &format!("{PATH}?fieldManager=m"),
        Some("application/apply-patch+yaml"),
        b"apiVersion: test.example.com/v1\nkind: Thing\nmetadata:\n  name: t\nspec:\n  color: red\n",
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.body["spec"]["color"], "red");
}

async fn kubectl_apply_server_side_on_a_configmap_and_a_capi_machine_deployment(server: Server) {
    let client = server.client();
    let Some(kubectl) =
        server.kubectl("kubectl_apply_server_side_on_a_configmap_and_a_capi_machine_deployment")
    else {
        return;
    };
    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: default\ndata:\n  a: \"1\"\n";
    let out = kubectl
        .apply(cm, &["--server-side", "--field-manager=team-a"])
        .await
        .unwrap();
    assert_eq!(out.trim(), "configmap/settings serverside-applied");
    let changed = cm.replace("a: \"1\"", "a: \"2\"");
    let e = kubectl
        .apply(&changed, &["--server-side", "--field-manager=team-b"])
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("Apply failed with 1 conflict: conflict with \"team-a\": .data.a"),
        "{e}"
    );
    kubectl
        .apply(
            &changed,
            &[
                "--server-side",
                "--field-manager=team-b",
                "--force-conflicts",
            ],
        )
        .await
        .unwrap();
    let got: Value = serde_json::from_str(
        &kubectl
            .run(&[
                "get",
                "configmap",
                "settings",
                "-n",
                "default",
                "-o",
                "json",
                "--show-managed-fields",
            ])
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(got["data"]["a"], "2");
    assert_eq!(fields_of(&got, "team-b"), &json!({"f:data": {"f:a": {}}}));

    // CAPI's MachineDeployment, as CAPI installs its CRD.
    create_crd(&client, &capi_machine_deployment_crd()).await;
    let deployment = |replicas: u32| {
        format!(
            "apiVersion: cluster.x-k8s.io/v1beta2\nkind: MachineDeployment\nmetadata:\n  name: workers\n  namespace: default\nspec:\n  clusterName: demo\n  replicas: {replicas}\n  selector:\n    matchLabels:\n      pool: workers\n  template:\n    metadata:\n      labels:\n        pool: workers\n    spec:\n      clusterName: demo\n      version: v1.33.0\n      bootstrap:\n        configRef:\n          apiGroup: bootstrap.cluster.x-k8s.io\n          kind: KubeadmConfigTemplate\n          name: workers\n      infrastructureRef:\n        apiGroup: infrastructure.cluster.x-k8s.io\n        kind: MicrovmMachineTemplate\n        name: workers\n"
        )
    };
    let out = kubectl
        .apply(&deployment(2), &["--server-side", "--field-manager=gitops"])
        .await
        .unwrap();
    assert_eq!(
        out.trim(),
        "machinedeployment.cluster.x-k8s.io/workers serverside-applied"
    );
    let e = kubectl
        .apply(
            &deployment(3),
            &["--server-side", "--field-manager=autoscaler"],
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("Apply failed with 1 conflict: conflict with \"gitops\": .spec.replicas"),
        "{e}"
    );
    let mds = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        "default",
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "MachineDeployment"),
            "machinedeployments",
        ),
    );
    let got = mds.get("workers").await.unwrap();
    assert_eq!(got.data["spec"]["replicas"], 2);
    let entry = serde_json::to_value(&got).unwrap();
    assert!(
        fields_of(&entry, "gitops")["f:spec"]["f:template"]["f:spec"]["f:infrastructureRef"]
            ["f:kind"]
            .is_object(),
        "{entry}"
    );
    // kube-rs's Patch::Apply on the same object, forced.
    let forced = mds
        .patch(
            "workers",
            &PatchParams::apply("autoscaler").force(),
            &Patch::Apply(
                json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
                "metadata": {"name": "workers"}, "spec": {"replicas": 3}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(forced.data["spec"]["replicas"], 3);
}

on_both_servers!(
    apply_creates_the_object_and_owns_what_it_names,
    an_apply_that_changes_another_managers_fields_conflicts,
    fields_a_manager_stops_applying_are_removed_unless_another_owns_them,
    apply_conflicts_with_update_managers_and_on_the_status_subresource,
    writes_record_their_fields_under_their_manager,
    apply_needs_a_field_manager_and_a_named_object,
    kubectl_apply_server_side_on_a_configmap_and_a_capi_machine_deployment,
);
