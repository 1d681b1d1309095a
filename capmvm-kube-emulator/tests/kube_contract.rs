#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The contract of the Kubernetes API emulator: one test per rule of `../shared/kube-emulator.md`, each
//! driving a server through a real kube-rs client and asserting what a client sees. Every test runs
//! twice, on the emulator (`emulator::`) and on the real kube-apiserver (`real::`, which needs the
//! binaries of `hack/upstream.sh build`): the real server is the oracle.

mod kube_support;

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::ResourceExt;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::core::DynamicObject;
use kube_support::servers::Server;
use kube_support::*;
use serde_json::{Value, json};

fn rv_of(o: &DynamicObject) -> u64 {
    o.metadata
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .unwrap()
}

// --- Paths and discovery -------------------------------------------------------------------------

async fn discovery_documents_describe_the_served_resources(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;

    let version = get_json(&client, "/version").await;
    assert_eq!(version["major"], "1");
    assert!(version["gitVersion"].as_str().unwrap().starts_with("v1."));

    let api = get_json(&client, "/api").await;
    assert_eq!(api["kind"], "APIVersions");
    assert_eq!(api["versions"], json!(["v1"]));

    let core = get_json(&client, "/api/v1").await;
    assert_eq!(core["kind"], "APIResourceList");
    assert_eq!(core["groupVersion"], "v1");
    let names: Vec<&str> = core["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    for r in [
        "namespaces",
        "namespaces/status",
        "secrets",
        "configmaps",
        "events",
    ] {
        assert!(names.contains(&r), "{r} missing from {names:?}");
    }

    let groups = get_json(&client, "/apis").await;
    assert_eq!(groups["kind"], "APIGroupList");
    let group_names: Vec<&str> = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap())
        .collect();
    for g in [
        "apiextensions.k8s.io",
        "coordination.k8s.io",
        "events.k8s.io",
        "infrastructure.cluster.x-k8s.io",
    ] {
        assert!(group_names.contains(&g), "{g} missing from {group_names:?}");
    }
    let infra = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "infrastructure.cluster.x-k8s.io")
        .unwrap();
    assert_eq!(
        infra["preferredVersion"]["groupVersion"],
        "infrastructure.cluster.x-k8s.io/v1alpha2"
    );

    let list = get_json(&client, "/apis/infrastructure.cluster.x-k8s.io/v1alpha2").await;
    let mvmm = list["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "microvmmachines")
        .unwrap();
    assert_eq!(mvmm["singularName"], "microvmmachine");
    assert_eq!(mvmm["namespaced"], true);
    assert_eq!(mvmm["kind"], "MicrovmMachine");
    assert_eq!(mvmm["shortNames"], json!(["mvmm"]));
    assert_eq!(mvmm["categories"], json!(["cluster-api"]));
    let verbs: Vec<&str> = mvmm["verbs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for v in [
        "create", "delete", "get", "list", "patch", "update", "watch",
    ] {
        assert!(verbs.contains(&v));
    }
    let status = list["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "microvmmachines/status")
        .unwrap();
    assert_eq!(status["verbs"], json!(["get", "patch", "update"]));

    // kube-rs discovery works from these documents.
    let discovery = kube::Discovery::new(client.clone()).run().await.unwrap();
    assert!(discovery.has_group("infrastructure.cluster.x-k8s.io"));
}

async fn namespaced_cluster_scoped_and_all_namespace_paths(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    raw(
        &client,
        "POST",
        "/api/v1/namespaces",
        Some("application/json"),
        br#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"other"}}"#,
    )
    .await;
    create_machine(&client, "default", "a").await;
    create_machine(&client, "other", "b").await;

    let base = "/apis/infrastructure.cluster.x-k8s.io/v1alpha2";
    let one = get_json(
        &client,
        &format!("{base}/namespaces/default/microvmmachines/a"),
    )
    .await;
    assert_eq!(one["metadata"]["name"], "a");
    let in_ns = get_json(&client, &format!("{base}/namespaces/other/microvmmachines")).await;
    assert_eq!(in_ns["items"].as_array().unwrap().len(), 1);
    assert_eq!(in_ns["kind"], "MicrovmMachineList");
    let all = get_json(&client, &format!("{base}/microvmmachines")).await;
    let mut names: Vec<&str> = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(names, vec!["a", "b"]);
    let status = get_json(
        &client,
        &format!("{base}/namespaces/default/microvmmachines/a/status"),
    )
    .await;
    assert_eq!(status["metadata"]["name"], "a");

    // Cluster-scoped: no namespace segment.
    let ns = get_json(&client, "/api/v1/namespaces/other").await;
    assert_eq!(ns["kind"], "Namespace");
    let crd = get_json(&client, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/microvmmachines.infrastructure.cluster.x-k8s.io").await;
    assert_eq!(crd["spec"]["names"]["kind"], "MicrovmMachine");
    // A cluster-scoped resource under a namespace, or a namespaced object without one, is not a path.
    let r = raw(
        &client,
        "GET",
        "/apis/apiextensions.k8s.io/v1/namespaces/default/customresourcedefinitions",
        None,
        b"",
    )
    .await;
    assert_status(&r, 404, "NotFound");
    let r = raw(
        &client,
        "GET",
        &format!("{base}/microvmmachines/a"),
        None,
        b"",
    )
    .await;
    assert_page_not_found(&r);
}

async fn builtin_kinds_are_served_with_default_namespaces(server: Server) {
    let client = server.client();
    let nss: Api<Namespace> = Api::all(client.clone());
    let names: Vec<String> = nss
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    assert!(
        names.contains(&"default".to_string()) && names.contains(&"kube-system".to_string()),
        "{names:?}"
    );

    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let s: Secret = serde_json::from_value(
        json!({"metadata": {"name": "creds"}, "stringData": {"token": "abc"}}),
    )
    .unwrap();
    let s = secrets.create(&PostParams::default(), &s).await.unwrap();
    assert_eq!(s.type_.as_deref(), Some("Opaque"));
    assert_eq!(s.data.unwrap()["token"].0, b"abc");

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "cfg"}, "data": {"a": "b"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();

    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let l: Lease = serde_json::from_value(json!({"metadata": {"name": "leader"}, "spec": {"holderIdentity": "me", "leaseDurationSeconds": 15}})).unwrap();
    leases.create(&PostParams::default(), &l).await.unwrap();

    // events.k8s.io/v1 Events are the core v1 Events with renamed fields, as on a real server.
    let ev = json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "ev1"},
        "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "capmvm", "reportingInstance": "capmvm-0",
        "action": "Provision", "reason": "Created", "type": "Normal", "note": "microVM created",
        "regarding": {"kind": "MicrovmMachine", "name": "m1", "namespace": "default"}
    });
    let r = raw(
        &client,
        "POST",
        "/apis/events.k8s.io/v1/namespaces/default/events",
        Some("application/json"),
        ev.to_string().as_bytes(),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let core = get_json(&client, "/api/v1/namespaces/default/events/ev1").await;
    assert_eq!(core["apiVersion"], "v1");
    assert_eq!(core["message"], "microVM created");
    assert_eq!(core["involvedObject"]["name"], "m1");
    let v1 = get_json(
        &client,
        "/apis/events.k8s.io/v1/namespaces/default/events/ev1",
    )
    .await;
    assert_eq!(v1["note"], "microVM created");

    let crds = get_json(
        &client,
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
    )
    .await;
    assert_eq!(crds["kind"], "CustomResourceDefinitionList");
}

async fn a_created_crd_is_served_at_once_and_deleting_it_stops_serving(server: Server) {
    let client = server.client();
    let path = "/apis/test.example.com/v1/namespaces/default/widgets";
    assert_page_not_found(&raw(&client, "GET", path, None, b"").await);

    let crd = create_crd(&client, &widget_crd()).await;
    let conds = crd.data["status"]["conditions"].as_array().unwrap();
    assert!(
        conds
            .iter()
            .any(|c| c["type"] == "Established" && c["status"] == "True")
    );
    assert_eq!(crd.data["status"]["acceptedNames"]["kind"], "Widget");

    // Served immediately, with its names, scope, status subresource and schema.
    widgets(&client, "default")
        .create(&PostParams::default(), &dynamic(widget("w1", 3)))
        .await
        .unwrap();
    let list = get_json(&client, "/apis/test.example.com/v1").await;
    let res = list["resources"].as_array().unwrap();
    let w = res.iter().find(|r| r["name"] == "widgets").unwrap();
    assert_eq!(w["shortNames"], json!(["wdg"]));
    assert_eq!(w["categories"], json!(["testing"]));
    assert!(res.iter().any(|r| r["name"] == "widgets/status"));
    let bad = widgets(&client, "default")
        .create(&PostParams::default(), &dynamic(widget("w2", 99)))
        .await
        .unwrap_err();
    assert_eq!(status_of(bad).code, 422);

    // Deleting the CRD deletes its objects, then stops serving it.
    crd_api(&client)
        .delete("widgets.test.example.com", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the widget resource is no longer served", || {
        let client = client.clone();
        async move { raw(&client, "GET", path, None, b"").await.status == 404 }
    })
    .await;
    assert_page_not_found(&raw(&client, "GET", "/apis/test.example.com/v1", None, b"").await);
    eventually("the group is gone from discovery", || {
        let client = client.clone();
        async move {
            let groups = get_json(&client, "/apis").await;
            !groups["groups"]
                .as_array()
                .unwrap()
                .iter()
                .any(|g| g["name"] == "test.example.com")
        }
    })
    .await;
    let r = raw(
        &client,
        "GET",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.test.example.com",
        None,
        b"",
    )
    .await;
    assert_status(&r, 404, "NotFound");
}

async fn every_served_version_of_a_crd_is_served(server: Server) {
    let client = server.client();
    let mut crd = widget_crd();
    let v1 = crd["spec"]["versions"][0].clone();
    let mut v2 = v1.clone();
    v2["name"] = json!("v2");
    v2["storage"] = json!(false);
    v2["deprecated"] = json!(true);
    crd["spec"]["versions"] = json!([v1, v2]);
    create_crd(&client, &crd).await;
    let groups = get_json(&client, "/apis").await;
    let g = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "test.example.com")
        .unwrap()
        .clone();
    assert_eq!(
        g["preferredVersion"]["version"], "v2",
        "kube-like version priority: v2 before v1"
    );
    // Written through v2, read through v1: only apiVersion differs (the None conversion strategy).
    let mut w = widget("w", 2);
    w["apiVersion"] = json!("test.example.com/v2");
    let r = raw(
        &client,
        "POST",
        "/apis/test.example.com/v2/namespaces/default/widgets",
        Some("application/json"),
        w.to_string().as_bytes(),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.body["apiVersion"], "test.example.com/v2");
    assert!(
        r.warnings().iter().any(|w| w.contains("deprecated")),
        "{:?}",
        r.warnings()
    );
    let as_v1 = get_json(
        &client,
        "/apis/test.example.com/v1/namespaces/default/widgets/w",
    )
    .await;
    assert_eq!(as_v1["apiVersion"], "test.example.com/v1");
    assert_eq!(as_v1["spec"]["size"], 2);
    let listed = get_json(
        &client,
        "/apis/test.example.com/v2/namespaces/default/widgets",
    )
    .await;
    assert_eq!(listed["items"][0]["apiVersion"], "test.example.com/v2");
    // A CRD update that stops serving v2.
    let mut stored = crd_api(&client)
        .get("widgets.test.example.com")
        .await
        .unwrap();
    stored.data["spec"]["versions"][1]["served"] = json!(false);
    crd_api(&client)
        .replace("widgets.test.example.com", &PostParams::default(), &stored)
        .await
        .unwrap();
    // A version no longer served is no longer routed (on a real server, a moment after the update).
    eventually("v2 is no longer served", || {
        let client = client.clone();
        async move {
            let r = raw(
                &client,
                "GET",
                "/apis/test.example.com/v2/namespaces/default/widgets",
                None,
                b"",
            )
            .await;
            r.status == 404
        }
    })
    .await;
    assert_page_not_found(
        &raw(
            &client,
            "GET",
            "/apis/test.example.com/v2/namespaces/default/widgets",
            None,
            b"",
        )
        .await,
    );
    assert_eq!(
        get_json(
            &client,
            "/apis/test.example.com/v1/namespaces/default/widgets/w"
        )
        .await["spec"]["size"],
        2
    );
}

async fn openapi_v3_documents_come_from_the_served_schemas(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    // A real server publishes a new CRD's OpenAPI a moment after it is established.
    eventually("the CRD's group version is in the OpenAPI v3 index", || {
        let client = client.clone();
        async move {
            get_json(&client, "/openapi/v3").await["paths"]
                ["apis/infrastructure.cluster.x-k8s.io/v1alpha2"]
                .is_object()
        }
    })
    .await;
    let index = get_json(&client, "/openapi/v3").await;
    let entry = &index["paths"]["apis/infrastructure.cluster.x-k8s.io/v1alpha2"];
    let url = entry["serverRelativeURL"].as_str().unwrap();
    assert!(
        url.starts_with("/openapi/v3/apis/infrastructure.cluster.x-k8s.io/v1alpha2?hash="),
        "{url}"
    );
    assert!(index["paths"]["api/v1"].is_object());
    let doc = get_json(&client, url).await;
    assert_eq!(doc["openapi"], "3.0.0");
    let schema =
        &doc["components"]["schemas"]["io.x-k8s.cluster.infrastructure.v1alpha2.MicrovmMachine"];
    assert_eq!(
        schema["x-kubernetes-group-version-kind"][0]["kind"],
        "MicrovmMachine"
    );
    assert_eq!(
        schema["properties"]["spec"]["properties"]["vcpu"]["maximum"],
        64.0
    );
    let patch = &doc["paths"]["/apis/infrastructure.cluster.x-k8s.io/v1alpha2/namespaces/{namespace}/microvmmachines/{name}"]
        ["patch"];
    assert!(
        patch["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "fieldValidation")
    );
    assert!(patch["requestBody"]["content"]["application/merge-patch+json"].is_object());
    assert!(patch["requestBody"]["content"]["application/strategic-merge-patch+json"].is_null());
    let core = get_json(&client, "/openapi/v3/api/v1").await;
    assert!(core["components"]["schemas"]["io.k8s.api.core.v1.Secret"].is_object());

    // The hash changes when the served schemas change.
    create_crd(&client, &widget_crd()).await;
    eventually("the new group version is in the OpenAPI v3 index", || {
        let client = client.clone();
        async move {
            get_json(&client, "/openapi/v3").await["paths"]["apis/test.example.com/v1"].is_object()
        }
    })
    .await;
}

async fn field_validation_strict_warn_and_ignore(server: Server) {
    let client = server.client();
    create_crd(&client, &widget_crd()).await;
    let path = "/apis/test.example.com/v1/namespaces/default/widgets";
    let body = |name: &str| {
        json!({"apiVersion": "test.example.com/v1", "kind": "Widget", "metadata": {"name": name},
        "spec": {"size": 2, "bogus": 1}})
        .to_string()
    };

    let strict = raw(
        &client,
        "POST",
        &format!("{path}?fieldValidation=Strict"),
        Some("application/json"),
        body("s").as_bytes(),
    )
    .await;
    assert_status(&strict, 400, "BadRequest");
    assert!(
        strict.body["message"]
            .as_str()
            .unwrap()
            .contains("unknown field \"spec.bogus\""),
        "{}",
        strict.text
    );

    let warn = raw(
        &client,
        "POST",
        &format!("{path}?fieldValidation=Warn"),
        Some("application/json"),
        body("w").as_bytes(),
    )
    .await;
    assert_eq!(warn.status, 201);
    assert!(
        warn.warnings()
            .iter()
            .any(|w| w.contains("unknown field \\\"spec.bogus\\\"")),
        "{:?}",
        warn.warnings()
    );
    assert!(warn.body["spec"].get("bogus").is_none());

    let default = raw(
        &client,
        "POST",
        path,
        Some("application/json"),
        body("d").as_bytes(),
    )
    .await;
    assert_eq!(default.status, 201);
    assert_eq!(default.warnings().len(), 1, "Warn is the default");

    let ignore = raw(
        &client,
        "POST",
        &format!("{path}?fieldValidation=Ignore"),
        Some("application/json"),
        body("i").as_bytes(),
    )
    .await;
    assert_eq!(ignore.status, 201);
    assert!(ignore.warnings().is_empty());
    assert!(ignore.body["spec"].get("bogus").is_none());

    let bad = raw(
        &client,
        "POST",
        &format!("{path}?fieldValidation=Sometimes"),
        Some("application/json"),
        body("x").as_bytes(),
    )
    .await;
    assert_status(&bad, 422, "Invalid");
    assert_eq!(
        bad.body["message"],
        "CreateOptions.meta.k8s.io \"\" is invalid: fieldValidation: Unsupported value: \"Sometimes\": supported values: \"\", \"Ignore\", \"Strict\", \"Warn\""
    );

    // Patches are validated the same way; a patched object that fails strict decoding is an
    // invalid `patch` (422), where a create is a bad request.
    let p = raw(
        &client,
        "PATCH",
        &format!("{path}/w?fieldValidation=Strict"),
        Some("application/merge-patch+json"),
        br#"{"spec":{"alsoBogus":true}}"#,
    )
    .await;
    assert_status(&p, 422, "Invalid");
    assert_eq!(
        p.body["details"]["causes"][0]["field"], "patch",
        "{}",
        p.text
    );
    assert!(
        p.text
            .contains(r#"strict decoding error: unknown field \"spec.alsoBogus\""#),
        "{}",
        p.text
    );
}

async fn unknown_fields_are_found_in_the_whole_body_before_the_status_rules(server: Server) {
    // A real server finds unknown fields while decoding the whole request, before the status
    // subresource's rules drop `status` on the main path (or everything but `status` on /status).
    let client = server.client();
    create_crd(&client, &widget_crd()).await;
    let path = "/apis/test.example.com/v1/namespaces/default/widgets";
    let strict_create = raw(
        &client,
        "POST",
        &format!("{path}?fieldValidation=Strict"),
        Some("application/json"),
        json!({"apiVersion": "test.example.com/v1", "kind": "Widget", "metadata": {"name": "s"},
            "spec": {"size": 2}, "status": {"phase": "x", "bogus": 1}})
        .to_string()
        .as_bytes(),
    )
    .await;
    assert_status(&strict_create, 400, "BadRequest");
    assert!(
        strict_create
            .text
            .contains(r#"unknown field \"status.bogus\""#),
        "{}",
        strict_create.text
    );
    widgets(&client, "default")
        .create(&PostParams::default(), &dynamic(widget("w", 2)))
        .await
        .unwrap();

    // `status` sent to the main path.
    let main = raw(
        &client,
        "PATCH",
        &format!("{path}/w?fieldValidation=Strict"),
        Some("application/merge-patch+json"),
        br#"{"status":{"bogus":true}}"#,
    )
    .await;
    assert_status(&main, 422, "Invalid");
    assert!(
        main.text.contains(r#"unknown field \"status.bogus\""#),
        "{}",
        main.text
    );
    let warned = raw(
        &client,
        "PATCH",
        &format!("{path}/w"),
        Some("application/merge-patch+json"),
        br#"{"status":{"bogus":true}}"#,
    )
    .await;
    assert_eq!(warned.status, 200, "{}", warned.text);
    assert!(
        warned
            .warnings()
            .iter()
            .any(|w| w.contains(r#"unknown field \"status.bogus\""#)),
        "{:?}",
        warned.warnings()
    );

    // `spec` sent to /status, by merge patch and by PUT.
    let status = raw(
        &client,
        "PATCH",
        &format!("{path}/w/status?fieldValidation=Strict"),
        Some("application/merge-patch+json"),
        br#"{"spec":{"alsoBogus":1},"status":{"phase":"p"}}"#,
    )
    .await;
    assert_status(&status, 422, "Invalid");
    assert!(
        status.text.contains(r#"unknown field \"spec.alsoBogus\""#),
        "{}",
        status.text
    );
    let mut whole = get_json(&client, &format!("{path}/w")).await;
    whole["spec"]["alsoBogus"] = json!(1);
    let put = raw(
        &client,
        "PUT",
        &format!("{path}/w/status"),
        Some("application/json"),
        whole.to_string().as_bytes(),
    )
    .await;
    assert_eq!(put.status, 200, "{}", put.text);
    assert!(
        put.warnings()
            .iter()
            .any(|w| w.contains(r#"unknown field \"spec.alsoBogus\""#)),
        "{:?}",
        put.warnings()
    );
    assert!(put.body["spec"].get("alsoBogus").is_none());
}

async fn unknown_paths_and_resources_are_404_status(server: Server) {
    let client = server.client();
    // Where no API handler serves the path: the mux's plain-text 404.
    for path in [
        "/nope",
        "/apis/nope.example.com/v1",
        "/apis/test.example.com/v1/namespaces/default/widgets/w",
    ] {
        let r = raw(&client, "GET", path, None, b"").await;
        assert_page_not_found(&r);
    }
    // Where the core API's handlers do: a Status.
    for path in ["/api/v1/namespaces/default/nothings", "/api/v2"] {
        let r = raw(&client, "GET", path, None, b"").await;
        assert_status(&r, 404, "NotFound");
    }
    let r = raw(
        &client,
        "GET",
        "/api/v1/namespaces/default/secrets/missing",
        None,
        b"",
    )
    .await;
    assert_status(&r, 404, "NotFound");
    assert_eq!(r.body["message"], "secrets \"missing\" not found");
    assert_eq!(
        r.body["details"],
        json!({"name": "missing", "kind": "secrets"})
    );
}

// --- Objects and versions ------------------------------------------------------------------------

async fn one_global_strictly_increasing_resource_version(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    let a = create_machine(&client, "default", "a").await;
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap();
    let c = Api::<ConfigMap>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    let b = create_machine(&client, "default", "b").await;
    let rv_c: u64 = c.metadata.resource_version.unwrap().parse().unwrap();
    assert!(
        rv_of(&a) < rv_c && rv_c < rv_of(&b),
        "one counter across resources"
    );
    let patched = machines(&client, "default")
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    assert!(rv_of(&patched) > rv_of(&b));
    let list = machines(&client, "default")
        .list(&ListParams::default())
        .await
        .unwrap();
    let list_rv: u64 = list.metadata.resource_version.unwrap().parse().unwrap();
    assert_eq!(
        list_rv,
        rv_of(&patched),
        "a list carries the current revision"
    );
    // A write that changes nothing does not get a new revision.
    let same = machines(&client, "default")
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    assert_eq!(rv_of(&same), rv_of(&patched));
}

async fn create_fills_system_fields_and_rejects_duplicates_and_missing_namespaces(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    let m = create_machine(&client, "default", "m1").await;
    assert_eq!(m.metadata.uid.as_ref().unwrap().len(), 36);
    assert!(m.metadata.creation_timestamp.is_some());
    assert!(m.metadata.resource_version.is_some());
    assert_eq!(m.metadata.generation, Some(1));

    let mut generated = machine("ignored");
    generated["metadata"] = json!({"generateName": "worker-"});
    let g = machines(&client, "default")
        .create(&PostParams::default(), &dynamic(generated))
        .await
        .unwrap();
    let name = g.metadata.name.unwrap();
    assert!(
        name.starts_with("worker-") && name.len() == "worker-".len() + 5,
        "{name}"
    );

    let dup = machines(&client, "default")
        .create(&PostParams::default(), &dynamic(machine("m1")))
        .await
        .unwrap_err();
    let s = status_of(dup);
    assert_eq!((s.code, s.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(
        s.message,
        "microvmmachines.infrastructure.cluster.x-k8s.io \"m1\" already exists"
    );

    let missing = machines(&client, "nowhere")
        .create(&PostParams::default(), &dynamic(machine("m2")))
        .await
        .unwrap_err();
    let s = status_of(missing);
    assert_eq!((s.code, s.reason.as_str()), (404, "NotFound"));
    assert_eq!(s.message, "namespaces \"nowhere\" not found");

    let mut with_rv = machine("m3");
    with_rv["metadata"]["resourceVersion"] = json!("5");
    let e = machines(&client, "default")
        .create(&PostParams::default(), &dynamic(with_rv))
        .await
        .unwrap_err();
    // The real registry raises this as a plain error: a 500 without a reason.
    let s = status_of(e);
    assert_eq!(s.code, 500, "{s:?}");
    assert_eq!(
        s.message,
        "resourceVersion should not be set on objects to be created"
    );
    let mut unnamed = machine("x");
    unnamed["metadata"] = json!({});
    let e = machines(&client, "default")
        .create(&PostParams::default(), &dynamic(unnamed))
        .await
        .unwrap_err();
    let s = status_of(e);
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    let e = machines(&client, "default")
        .create(&PostParams::default(), &dynamic(machine("Bad_Name")))
        .await
        .unwrap_err();
    assert_eq!(status_of(e).code, 422);
}

/// The 422 Invalid a real server gives for a bad `metadata.name`: one cause per broken rule.
fn assert_invalid_name(e: kube::Error, name: &str, message: &str) {
    let s = status_of(e);
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"), "{s:?}");
    let causes = s
        .details
        .as_ref()
        .map(|d| d.causes.clone())
        .unwrap_or_default();
    assert!(
        causes
            .iter()
            .any(|c| c.field == "metadata.name" && c.message.contains(message)),
        "{name}: expected a metadata.name cause saying {message:?}, got {causes:?}"
    );
    assert!(s.message.contains("metadata.name"), "{}", s.message);
}

async fn names_are_dns_subdomains_and_namespaces_dns_labels(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    // A DNS subdomain has no 63-character limit on the parts between dots; only the whole counts.
    let long = format!("m{}", "a".repeat(99));
    let dotted = format!("{}.{}", "b".repeat(70), "c".repeat(70));
    for name in [&long, &dotted] {
        let m = create_machine(&client, "default", name).await;
        assert_eq!(m.metadata.name.as_deref(), Some(name.as_str()));
    }
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm = ConfigMap {
        metadata: kube::core::ObjectMeta {
            name: Some(long.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    configmaps
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    assert_eq!(configmaps.get(&long).await.unwrap().name_any(), long);
    // A generated name keeps 58 characters of a long prefix, then 5 random ones.
    let mut generated = cm.clone();
    generated.metadata.name = None;
    generated.metadata.generate_name = Some(format!("{long}-"));
    let g = configmaps
        .create(&PostParams::default(), &generated)
        .await
        .unwrap();
    assert_eq!(g.name_any().len(), 63, "{}", g.name_any());
    assert!(g.name_any().starts_with(&long[..58]));

    let too_long = "a".repeat(254);
    let e = machines(&client, "default")
        .create(&PostParams::default(), &dynamic(machine(&too_long)))
        .await
        .unwrap_err();
    assert_invalid_name(e, &too_long, "must be no more than 253 characters");
    let mut cm_too_long = cm.clone();
    cm_too_long.metadata.name = Some(too_long.clone());
    let e = configmaps
        .create(&PostParams::default(), &cm_too_long)
        .await
        .unwrap_err();
    assert_invalid_name(e, &too_long, "must be no more than 253 characters");
    let e = machines(&client, "default")
        .create(&PostParams::default(), &dynamic(machine("Worker-1")))
        .await
        .unwrap_err();
    assert_invalid_name(e, "Worker-1", "a lowercase RFC 1123 subdomain");

    // Namespaces are DNS labels: 63 characters at most, no dots.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = |name: &str| Namespace {
        metadata: kube::core::ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    namespaces
        .create(&PostParams::default(), &ns(&"n".repeat(63)))
        .await
        .unwrap();
    let e = namespaces
        .create(&PostParams::default(), &ns(&"n".repeat(64)))
        .await
        .unwrap_err();
    assert_invalid_name(e, "64 n", "must be no more than 63 characters");
    let e = namespaces
        .create(&PostParams::default(), &ns("team.a"))
        .await
        .unwrap_err();
    assert_invalid_name(e, "team.a", "must not contain dots");
    let e = namespaces
        .create(&PostParams::default(), &ns("Team"))
        .await
        .unwrap_err();
    assert_invalid_name(e, "Team", "a lowercase RFC 1123 label");
}

async fn generation_changes_only_when_spec_changes(server: Server) {
    let client = server.client();
    create_crd(&client, &widget_crd()).await;
    let api = widgets(&client, "default");
    api.create(&PostParams::default(), &dynamic(widget("w", 1)))
        .await
        .unwrap();
    let pp = PatchParams::default();
    let labels = api
        .patch(
            "w",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}, "annotations": {"x": "y"}}})),
        )
        .await
        .unwrap();
    assert_eq!(labels.metadata.generation, Some(1));
    let status = api
        .patch_status(
            "w",
            &pp,
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .unwrap();
    assert_eq!(status.metadata.generation, Some(1));
    assert!(rv_of(&status) > rv_of(&labels));
    let spec = api
        .patch("w", &pp, &Patch::Merge(json!({"spec": {"size": 2}})))
        .await
        .unwrap();
    assert_eq!(spec.metadata.generation, Some(2));
    let spec = api
        .patch("w", &pp, &Patch::Merge(json!({"spec": {"size": 3}})))
        .await
        .unwrap();
    assert_eq!(spec.metadata.generation, Some(3));
}

async fn writes_with_a_stale_resource_version_conflict(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    let api = machines(&client, "default");
    let first = create_machine(&client, "default", "m").await;
    let second = api
        .patch(
            "m",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"vcpu": 4}})),
        )
        .await
        .unwrap();

    // PUT with the old resourceVersion.
    let mut stale = first.clone();
    stale.data["spec"]["vcpu"] = json!(8);
    let s = status_of(
        api.replace("m", &PostParams::default(), &stale)
            .await
            .unwrap_err(),
    );
    assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        s.message,
        "Operation cannot be fulfilled on microvmmachines.infrastructure.cluster.x-k8s.io \"m\": the object has been modified; please apply your changes to the latest version and try again"
    );
    // PUT with the current one succeeds.
    let mut fresh = second.clone();
    fresh.data["spec"]["vcpu"] = json!(8);
    let replaced = api
        .replace("m", &PostParams::default(), &fresh)
        .await
        .unwrap();
    assert_eq!(replaced.data["spec"]["vcpu"], 8);
    // A custom resource cannot be replaced without a resourceVersion.
    let mut unconditional = replaced.clone();
    unconditional.metadata.resource_version = None;
    let s = status_of(
        api.replace("m", &PostParams::default(), &unconditional)
            .await
            .unwrap_err(),
    );
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));

    // A merge patch carrying metadata.resourceVersion is conditional, as the operator writes status.
    let old_rv = first.metadata.resource_version.clone().unwrap();
    let patch =
        json!({"metadata": {"resourceVersion": old_rv}, "spec": {"providerID": "microvm://h/1"}});
    let s = status_of(
        api.patch("m", &PatchParams::default(), &Patch::Merge(patch))
            .await
            .unwrap_err(),
    );
    assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
    let cur_rv = replaced.metadata.resource_version.clone().unwrap();
    let patch =
        json!({"metadata": {"resourceVersion": cur_rv}, "spec": {"providerID": "microvm://h/1"}});
    let ok = api
        .patch("m", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    assert_eq!(ok.data["spec"]["providerID"], "microvm://h/1");
    // Built-ins allow unconditional updates.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "c"}, "data": {"a": "1"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let cm2: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "c"}, "data": {"a": "2"}})).unwrap();
    assert_eq!(
        cms.replace("c", &PostParams::default(), &cm2)
            .await
            .unwrap()
            .data
            .unwrap()["a"],
        "2"
    );
}

async fn errors_are_status_objects_with_matching_http_codes(server: Server) {
    let client = server.client();
    let no_retry = server.client_without_retries().await;
    install_project_crds(&client).await;
    create_machine(&client, "default", "m").await;
    let base = "/apis/infrastructure.cluster.x-k8s.io/v1alpha2/namespaces/default/microvmmachines";
    let cases: Vec<(Raw, u16, &str)> = vec![
        (
            raw(&client, "GET", &format!("{base}/none"), None, b"").await,
            404,
            "NotFound",
        ),
        (
            raw(
                &client,
                "POST",
                base,
                Some("application/json"),
                b"{not json",
            )
            .await,
            400,
            "BadRequest",
        ),
        (
            raw(&client, "POST", base, Some("application/json"), b"[]").await,
            400,
            "BadRequest",
        ),
        // The custom resource handler takes a POST to a named path as a create, and a PUT to the
        // collection as an update without a name.
        (
            raw(
                &client,
                "POST",
                &format!("{base}/m"),
                Some("application/json"),
                b"{}",
            )
            .await,
            400,
            "BadRequest",
        ),
        (
            raw(&client, "PUT", base, Some("application/json"), b"{}").await,
            400,
            "BadRequest",
        ),
        (
            raw(
                &client,
                "PUT",
                "/api/v1/namespaces/default/configmaps",
                Some("application/json"),
                b"{}",
            )
            .await,
            405,
            "MethodNotAllowed",
        ),
        (
            raw(
                &client,
                "PATCH",
                &format!("{base}/m"),
                Some("application/strategic-merge-patch+json"),
                b"{}",
            )
            .await,
            415,
            "UnsupportedMediaType",
        ),
        (
            raw(
                &client,
                "PATCH",
                &format!("{base}/m"),
                Some("text/plain"),
                b"{}",
            )
            .await,
            415,
            "UnsupportedMediaType",
        ),
        (
            raw(
                &client,
                "PATCH",
                &format!("{base}/m"),
                Some("application/merge-patch+json"),
                br#"{"spec":{"vcpu":0}}"#,
            )
            .await,
            422,
            "Invalid",
        ),
        (
            raw(
                &client,
                "GET",
                &format!("{base}?labelSelector=a%20in%20b"),
                None,
                b"",
            )
            .await,
            400,
            "BadRequest",
        ),
        (
            raw(
                &client,
                "GET",
                &format!("{base}?fieldSelector=spec.vcpu%3D1"),
                None,
                b"",
            )
            .await,
            400,
            "BadRequest",
        ),
        (
            raw(&client, "GET", &format!("{base}?limit=abc"), None, b"").await,
            400,
            "BadRequest",
        ),
        (
            raw(
                &client,
                "GET",
                &format!("{base}?continue=bm90LWpzb24"),
                None,
                b"",
            )
            .await,
            400,
            "BadRequest",
        ),
        (
            raw(
                &no_retry,
                "GET",
                &format!("{base}?resourceVersion=999999&resourceVersionMatch=NotOlderThan"),
                None,
                b"",
            )
            .await,
            504,
            "Timeout",
        ),
        (
            raw(
                &client,
                "PATCH",
                &format!("{base}/m"),
                Some("application/json-patch+json"),
                br#"[{"op":"explode"}]"#,
            )
            .await,
            422,
            "Invalid",
        ),
        (
            raw(
                &client,
                "DELETE",
                &format!("{base}/m"),
                Some("application/json"),
                br#"{"propagationPolicy":"Sideways"}"#,
            )
            .await,
            422,
            "Invalid",
        ),
    ];
    for (r, code, reason) in &cases {
        assert_status(r, *code, reason);
    }
    // A huge limit is just a limit; a huge body is 413.
    let r = raw(
        &client,
        "GET",
        &format!("{base}?limit=18446744073709551615"),
        None,
        b"",
    )
    .await;
    assert_eq!(
        r.status, 400,
        "u64::MAX does not fit the int64 limit: {}",
        r.text
    );
    let r = raw(
        &client,
        "GET",
        &format!("{base}?limit=9223372036854775807"),
        None,
        b"",
    )
    .await;
    assert_eq!(r.status, 200);
    let big = vec![b' '; 4 * 1024 * 1024];
    let r = raw(&client, "POST", base, Some("application/json"), &big).await;
    assert_status(&r, 413, "RequestEntityTooLarge");
    let invalid = &cases[8].0;
    assert_eq!(invalid.body["details"]["kind"], "MicrovmMachine");
    assert_eq!(
        invalid.body["details"]["group"],
        "infrastructure.cluster.x-k8s.io"
    );
    assert_eq!(invalid.body["details"]["name"], "m");
    assert_eq!(invalid.body["details"]["causes"][0]["field"], "spec.vcpu");
}

async fn malformed_requests_get_status_answers_and_never_break_the_server(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    create_machine(&client, "default", "m").await;
    let base = "/apis/infrastructure.cluster.x-k8s.io/v1alpha2/namespaces/default/microvmmachines";
    let paths = [
        base.to_string(),
        format!("{base}/m"),
        format!("{base}/m/status"),
        format!("{base}/m/scale"),
        format!("{base}/m/status/extra"),
        "/api/v1/namespaces/default/secrets".into(),
        "/api/v1/namespaces/%ZZ/secrets/%2F".into(),
        "/api/v1/namespaces/default/configmaps/é".into(),
        "/apis/coordination.k8s.io/v1/namespaces/default/leases/l".into(),
        "/api/v1/watch/namespaces/default/configmaps?resourceVersion=notanumber".into(),
        format!("{base}?labelSelector=%28%28&fieldSelector=%3D%3D%3D&limit=-5&continue=%00"),
        // Any value but false or 0 makes a watch (ended by its timeout here).
        format!("{base}?watch=maybe&timeoutSeconds=1"),
        format!("{base}?watch=true&resourceVersion=abc"),
        format!("{base}?watch=true&sendInitialEvents=true"),
        format!("{base}?resourceVersion=1&resourceVersionMatch=Sometimes"),
        format!("{base}?includeObject=Everything"),
        "/openapi/v3/apis/nope/v1".into(),
    ];
    let bodies: [&[u8]; 9] = [
        b"",
        b"null",
        b"{",
        b"[1,2,3]",
        b"{\"apiVersion\":7,\"kind\":[],\"metadata\":\"x\"}",
        br#"{"apiVersion":"infrastructure.cluster.x-k8s.io/v1alpha2","kind":"MicrovmMachine","metadata":{"name":"m","labels":{"a":1},"finalizers":"x"}}"#,
        br#"[{"op":"remove","path":"/nope/deeper"},{"op":"move","from":"/spec","path":"/spec/inner"}]"#,
        br#"{"metadata":{"resourceVersion":"not-a-number"}}"#,
        "{\"spec\":{\"vcpu\":\"\u{0}\u{fffd}é\"}}".as_bytes(),
    ];
    let types = [
        "application/json",
        "application/merge-patch+json",
        "application/json-patch+json",
        "application/strategic-merge-patch+json",
        "application/apply-patch+yaml",
        "application/yaml",
    ];
    let mut answers = 0;
    for path in &paths {
        for method in ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"] {
            for (i, body) in bodies.iter().enumerate() {
                let ct = types[(i + method.len()) % types.len()];
                let r = raw(&client, method, path, Some(ct), body).await;
                answers += 1;
                if (r.status == 404 && r.text.trim() == "404 page not found")
                    || (r.status == 400 && r.text.trim() == "400 Bad Request")
                    || (r.status == 404 && r.text.is_empty() && path.starts_with("/openapi/"))
                {
                    // A path no API handler serves, one the HTTP server cannot decode, or an
                    // OpenAPI document of a group version that does not exist (an empty 404).
                } else if r.status >= 400 {
                    assert_eq!(r.body["kind"], "Status", "{method} {path} {ct}: {}", r.text);
                    assert_eq!(r.body["code"], r.status, "{method} {path}: {}", r.text);
                    // The one 5xx: the real server's storage layer answers an unparsable
                    // resourceVersion of a watch, a GET or an update with a plain (reason-less) 500.
                    let parse_error = r.status == 500
                        && r.body.get("reason").is_none()
                        && r.body["message"]
                            .as_str()
                            .is_some_and(|m| m.contains("strconv.ParseUint"));
                    assert!(
                        r.status < 500 || parse_error,
                        "{method} {path} {ct} {:?}: {}",
                        String::from_utf8_lossy(body),
                        r.text
                    );
                }
            }
        }
    }
    assert_eq!(answers, paths.len() * 6 * bodies.len());
    // Still serving (the DELETEs above removed `m`; nothing else changed it).
    create_machine(&client, "default", "after").await;
    assert_eq!(
        machines(&client, "default")
            .get("after")
            .await
            .unwrap()
            .data["spec"]["vcpu"],
        2
    );
}

// --- Status subresource ----------------------------------------------------------------------------

async fn status_subresource_separates_spec_and_status_writes(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    let api = machines(&client, "default");
    let mut m = machine("m");
    m["status"] = json!({"host": "ignored-on-create"});
    let created = api
        .create(&PostParams::default(), &dynamic(m))
        .await
        .unwrap();
    assert!(
        created.data.get("status").is_none(),
        "status is dropped on create"
    );

    let pp = PatchParams::default();
    // The main path ignores status changes (and still bumps generation for the spec).
    let main = api
        .patch(
            "m",
            &pp,
            &Patch::Merge(json!({"spec": {"vcpu": 3}, "status": {"host": "h-main"}})),
        )
        .await
        .unwrap();
    assert!(main.data.get("status").is_none());
    assert_eq!(main.metadata.generation, Some(2));
    // The status path ignores everything else.
    let status = api
        .patch_status("m", &pp, &Patch::Merge(json!({"spec": {"vcpu": 7}, "metadata": {"labels": {"new": "x"}}, "status": {"host": "h1"}})))
        .await
        .unwrap();
    assert_eq!(status.data["status"]["host"], "h1");
    assert_eq!(status.data["spec"]["vcpu"], 3);
    assert!(status.labels().get("new").is_none());
    assert_eq!(status.metadata.generation, Some(2));
    assert!(rv_of(&status) > rv_of(&main));
    // PUT on /status with a JSON patch-free replace.
    let mut whole = status.clone();
    whole.data["status"]["vmState"] = json!("running");
    whole.data["spec"]["vcpu"] = json!(9);
    let replaced = api
        .replace_status("m", &PostParams::default(), &whole)
        .await
        .unwrap();
    assert_eq!(replaced.data["status"]["vmState"], "running");
    assert_eq!(replaced.data["spec"]["vcpu"], 3);
    // Status is validated against the schema too.
    let bad = api
        .patch_status(
            "m",
            &pp,
            &Patch::Merge(json!({"status": {"vmState": "exploded"}})),
        )
        .await
        .unwrap_err();
    assert_eq!(status_of(bad).code, 422);
}

// --- Patches ---------------------------------------------------------------------------------------

async fn merge_and_json_patches_on_main_and_status_paths(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    let api = machines(&client, "default");
    create_machine(&client, "default", "m").await;
    let pp = PatchParams::default();
    // RFC 7386: null removes, objects merge, lists replace.
    let p = api
        .patch("m", &pp, &Patch::Merge(json!({"metadata": {"labels": {"cluster.x-k8s.io/cluster-name": null, "a": "b"}},
            "spec": {"networkInterfaces": [{"guestDeviceName": "eth2"}, {"guestDeviceName": "eth3"}]}})))
        .await
        .unwrap();
    assert_eq!(p.labels().len(), 1);
    assert_eq!(
        p.data["spec"]["networkInterfaces"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // RFC 6902 with test ops, as the operator edits finalizers.
    let fin = "microvmmachine.infrastructure.cluster.x-k8s.io";
    let add: json_patch_ops::Ops = json_patch_ops::ops(json!([
        {"op": "test", "path": "/metadata/finalizers", "value": null},
        {"op": "add", "path": "/metadata/finalizers", "value": [fin]}
    ]));
    let p = api.patch("m", &pp, &Patch::<()>::Json(add)).await.unwrap();
    assert_eq!(p.finalizers(), &[fin.to_string()]);
    let remove = json_patch_ops::ops(json!([
        {"op": "test", "path": "/metadata/finalizers/0", "value": fin},
        {"op": "remove", "path": "/metadata/finalizers/0"}
    ]));
    let p = api
        .patch("m", &pp, &Patch::<()>::Json(remove))
        .await
        .unwrap();
    assert!(p.finalizers().is_empty());
    // JSON patch on /status.
    let st =
        json_patch_ops::ops(json!([{"op": "add", "path": "/status", "value": {"host": "h9"}}]));
    let p = api
        .patch_status("m", &pp, &Patch::<()>::Json(st))
        .await
        .unwrap();
    assert_eq!(p.data["status"]["host"], "h9");
    // Merge patch on /status.
    let p = api
        .patch_status(
            "m",
            &pp,
            &Patch::Merge(json!({"status": {"vmState": "pending"}})),
        )
        .await
        .unwrap();
    assert_eq!(
        p.data["status"],
        json!({"host": "h9", "vmState": "pending"})
    );
}

async fn a_failed_json_patch_test_is_422_and_changes_nothing(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    let api = machines(&client, "default");
    let before = create_machine(&client, "default", "m").await;
    let ops = json_patch_ops::ops(json!([
        {"op": "add", "path": "/metadata/labels/added", "value": "yes"},
        {"op": "test", "path": "/spec/vcpu", "value": 99}
    ]));
    let s = status_of(
        api.patch("m", &PatchParams::default(), &Patch::<()>::Json(ops))
            .await
            .unwrap_err(),
    );
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    let after = api.get("m").await.unwrap();
    assert_eq!(
        after.metadata.resource_version,
        before.metadata.resource_version
    );
    assert!(after.labels().get("added").is_none());
}

async fn strategic_merge_patch_only_on_builtins(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    create_machine(&client, "default", "m").await;
    let s = status_of(
        machines(&client, "default")
            .patch(
                "m",
                &PatchParams::default(),
                &Patch::Strategic(json!({"spec": {"vcpu": 3}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!((s.code, s.reason.as_str()), (415, "UnsupportedMediaType"));

    // Built-ins: strategic merge with ObjectMeta's merge keys (finalizers merge, ownerReferences by uid).
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let uid = Api::<Namespace>::all(client.clone())
        .get("kube-system")
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "c", "finalizers": ["a.example.com/x"],
        "ownerReferences": [{"apiVersion": "v1", "kind": "Namespace", "name": "kube-system", "uid": uid}]}, "data": {"a": "1"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let p = json!({"metadata": {"finalizers": ["b.example.com/y"],
        "ownerReferences": [{"apiVersion": "v1", "kind": "Namespace", "name": "renamed", "uid": uid}]}, "data": {"b": "2"}});
    let out = cms
        .patch("c", &PatchParams::default(), &Patch::Strategic(p))
        .await
        .unwrap();
    assert_eq!(
        out.metadata.finalizers.unwrap(),
        vec!["b.example.com/y".to_string(), "a.example.com/x".to_string()],
        "the patch's items first, as the real server merges a list of primitives"
    );
    let owners = out.metadata.owner_references.unwrap();
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0].name, "renamed");
    assert_eq!(out.data.unwrap().len(), 2);
}

async fn leases_support_server_side_apply_with_field_ownership_conflicts(server: Server) {
    let client = server.client();
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let take = |who: &str| json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "lock"}, "spec": {"holderIdentity": who, "leaseDurationSeconds": 10}});
    let a = leases
        .patch(
            "lock",
            &PatchParams::apply("manager-a"),
            &Patch::Apply(take("a")),
        )
        .await
        .unwrap();
    assert_eq!(a.spec.unwrap().holder_identity.as_deref(), Some("a"));
    // Another manager changing a field manager-a owns is a conflict (this is what makes the lease a lock).
    let s = status_of(
        leases
            .patch(
                "lock",
                &PatchParams::apply("manager-b"),
                &Patch::Apply(take("b")),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
    assert!(
        s.message.contains("conflict with \"manager-a\""),
        "{}",
        s.message
    );
    // Applying the same values is not a conflict; forcing takes ownership.
    leases
        .patch(
            "lock",
            &PatchParams::apply("manager-b"),
            &Patch::Apply(take("a")),
        )
        .await
        .unwrap();
    let forced = leases
        .patch(
            "lock",
            &PatchParams::apply("manager-b").force(),
            &Patch::Apply(take("b")),
        )
        .await
        .unwrap();
    assert_eq!(forced.spec.unwrap().holder_identity.as_deref(), Some("b"));
    // Clearing the holder with a strategic merge patch releases ownership, so a fresh apply succeeds.
    let release = json!({"spec": {"holderIdentity": null, "leaseDurationSeconds": null}});
    leases
        .patch(
            "lock",
            &PatchParams {
                field_manager: Some("manager-b".into()),
                ..Default::default()
            },
            &Patch::Strategic(release),
        )
        .await
        .unwrap();
    let c = leases
        .patch(
            "lock",
            &PatchParams::apply("manager-c"),
            &Patch::Apply(take("c")),
        )
        .await
        .unwrap();
    assert_eq!(c.spec.unwrap().holder_identity.as_deref(), Some("c"));
    let managed = c.metadata.managed_fields.unwrap();
    assert!(
        managed
            .iter()
            .any(|m| m.manager.as_deref() == Some("manager-c")
                && m.operation.as_deref() == Some("Apply"))
    );
}

// --- Schemas -----------------------------------------------------------------------------------------

async fn schema_validation_reports_422_with_field_paths(server: Server) {
    let client = server.client();
    create_crd(&client, &widget_crd()).await;
    let api = widgets(&client, "default");
    let cases: Vec<(Value, &str, &str)> = vec![
        (
            json!({"size": "big"}),
            "spec.size",
            "must be of type integer",
        ),
        (json!({}), "spec.size", "Required value"),
        (
            json!({"size": 1, "color": "pink"}),
            "spec.color",
            "Unsupported value: \"pink\": supported values: \"red\", \"green\", \"blue\"",
        ),
        (
            json!({"size": 0}),
            "spec.size",
            "should be greater than or equal to 1",
        ),
        (
            json!({"size": 11}),
            "spec.size",
            "should be less than or equal to 10",
        ),
        (
            json!({"size": 1, "name": "a"}),
            "spec.name",
            "should be at least 2 chars long",
        ),
        (
            json!({"size": 1, "name": "abcdefghij"}),
            "spec.name",
            "Too long: may not be more than 8 bytes",
        ),
        (
            json!({"size": 1, "name": "ABC"}),
            "spec.name",
            "should match '^[a-z]+$'",
        ),
        (
            json!({"size": 1, "tags": []}),
            "spec.tags",
            "should have at least 1 items",
        ),
        (
            json!({"size": 1, "tags": ["a", "b", "c", "d"]}),
            "spec.tags",
            "Too many: 4: must have at most 3 items",
        ),
        (
            json!({"size": 1, "tags": ["a", "a"]}),
            "spec.tags[1]",
            "Duplicate value",
        ),
        (
            json!({"size": 1, "ratio": 1.0}),
            "spec.ratio",
            "should be less than 1",
        ),
        (
            json!({"size": 1, "enabled": "yes"}),
            "spec.enabled",
            "must be of type boolean",
        ),
        (
            json!({"size": 1, "settings": {"a": 1}}),
            "spec.settings.a",
            "must be of type string",
        ),
        (
            json!({"size": 1, "limits": {}}),
            "spec.limits",
            "should have at least 1 properties",
        ),
        (
            json!({"size": 1, "limits": {"a": 1, "b": 2, "c": 3}}),
            "spec.limits",
            "Too many: 3: must have at most 2 items",
        ),
    ];
    for (i, (spec, field, msg)) in cases.into_iter().enumerate() {
        let mut w = widget(&format!("w{i}"), 1);
        w["spec"] = spec.clone();
        let s = status_of(
            api.create(&PostParams::default(), &dynamic(w))
                .await
                .unwrap_err(),
        );
        assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"), "{spec}");
        let details = s.details.unwrap();
        assert_eq!(details.kind, "Widget");
        assert_eq!(details.group, "test.example.com");
        let cause = details
            .causes
            .iter()
            .find(|c| c.field == field)
            .unwrap_or_else(|| panic!("{spec}: no cause for {field}: {:?}", details.causes));
        assert!(cause.message.contains(msg), "{spec}: {:?}", cause.message);
        assert!(
            s.message
                .starts_with(&format!("Widget.test.example.com \"w{i}\" is invalid: ")),
            "{}",
            s.message
        );
    }
    // A nullable field may be null.
    let mut w = widget("ok", 1);
    w["spec"]["nullableNote"] = Value::Null;
    let ok = api
        .create(&PostParams::default(), &dynamic(w))
        .await
        .unwrap();
    assert!(ok.data["spec"]["nullableNote"].is_null());
}

async fn every_invalid_field_is_named_in_one_answer(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    let mut m = machine("bad");
    m["spec"] = json!({"vcpu": 0, "memoryMb": -1,
        "networkInterfaces": [{"guestDeviceName": "eth1", "type": "bogus"}]});
    let s = status_of(
        machines(&client, "default")
            .create(&PostParams::default(), &dynamic(m))
            .await
            .unwrap_err(),
    );
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    let causes: Vec<(String, String, String)> = s
        .details
        .unwrap()
        .causes
        .into_iter()
        .map(|c| (c.field, c.reason, c.message))
        .collect();
    let value_errors = [
        (
            "spec.memoryMb",
            "FieldValueInvalid",
            "Invalid value: -1: spec.memoryMb in body should be greater than or equal to 1024",
        ),
        (
            "spec.networkInterfaces[0].type",
            "FieldValueNotSupported",
            "Unsupported value: \"bogus\": supported values: \"tap\", \"macvtap\"",
        ),
        (
            "spec.vcpu",
            "FieldValueInvalid",
            "Invalid value: 0: spec.vcpu in body should be greater than or equal to 1",
        ),
    ];
    let required = [
        ("spec.kernel", "FieldValueRequired", "Required value"),
        ("spec.rootVolume", "FieldValueRequired", "Required value"),
    ];
    let own = |c: &[(&str, &str, &str)]| -> Vec<(String, String, String)> {
        c.iter()
            .map(|(f, r, m)| (f.to_string(), r.to_string(), m.to_string()))
            .collect()
    };
    // Every one, in one answer: the value errors first (a real server lists them in the order its
    // validator meets them, which varies from one request to the next), then the missing fields.
    assert_eq!(causes.len(), 5, "{causes:?}");
    let mut values = causes[..3].to_vec();
    values.sort();
    assert_eq!(values, own(&value_errors));
    assert_eq!(causes[3..].to_vec(), own(&required));
    let listed: Vec<String> = causes.iter().map(|(f, _, m)| format!("{f}: {m}")).collect();
    assert_eq!(
        s.message,
        format!(
            "MicrovmMachine.infrastructure.cluster.x-k8s.io \"bad\" is invalid: [{}]",
            listed.join(", ")
        )
    );
}

async fn formats_int_or_string_and_unknown_fields_under_strict_decoding(server: Server) {
    let client = server.client();
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "gauges.test.example.com"},
        "spec": {"group": "test.example.com", "scope": "Namespaced",
            "names": {"plural": "gauges", "singular": "gauge", "kind": "Gauge"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {
                    "type": "object", "properties": {
                        "when": {"type": "string", "format": "date-time"},
                        "uid": {"type": "string", "format": "uuid"},
                        "address": {"type": "string", "format": "ipv4"},
                        "port": {"x-kubernetes-int-or-string": true},
                        "surge": {"x-kubernetes-int-or-string": true, "pattern": "^[0-9]+%?$"},
                        "count": {"type": "integer", "format": "int32"},
                        "name": {"type": "string", "maxLength": 3}
                    }}}}}}]}
    });
    create_crd(&client, &crd).await;
    let path = "/apis/test.example.com/v1/namespaces/default/gauges";
    let body = json!({"apiVersion": "test.example.com/v1", "kind": "Gauge", "metadata": {"name": "g"},
        "spec": {"when": "yesterday", "uid": "not-a-uuid", "address": "300.1.1.1", "port": [1],
            "surge": "10 percent", "count": 3_000_000_000_i64, "name": "long"}});
    let r = raw(
        &client,
        "POST",
        path,
        Some("application/json"),
        body.to_string().as_bytes(),
    )
    .await;
    assert_status(&r, 422, "Invalid");
    let mut causes: Vec<(String, String)> = r.body["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["field"].as_str().unwrap().to_string(),
                c["message"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    causes.sort();
    let expected: Vec<(String, String)> = [
        // Word for word the real server's: its validator loses the path of an int32 overflow.
        ("<nil>", "Invalid value: \"\": Checked value must be of type integer with format int32 in spec.count"),
        ("spec.address", "Invalid value: \"300.1.1.1\": spec.address in body must be of type ipv4: \"300.1.1.1\""),

        ("spec.name", "Too long: may not be more than 3 bytes"),
        ("spec.port", "Invalid value: \"array\": spec.port in body must be of type integer,string: \"array\""),
        ("spec.surge", "Invalid value: \"10 percent\": spec.surge in body should match '^[0-9]+%?$'"),
        ("spec.uid", "Invalid value: \"not-a-uuid\": spec.uid in body must be of type uuid: \"not-a-uuid\""),
        ("spec.when", "Invalid value: \"yesterday\": spec.when in body must be of type date-time: \"yesterday\""),
    ]
    .iter()
    .map(|(f, m)| (f.to_string(), m.to_string()))
    .collect();
    assert_eq!(causes, expected, "{}", r.text);
    // Valid values of every shape pass; an unknown field under strict decoding is named with the
    // whole body still checked.
    let good = json!({"apiVersion": "test.example.com/v1", "kind": "Gauge", "metadata": {"name": "g"},
        "spec": {"when": "2026-01-02T03:04:05Z", "uid": "0f0e0d0c-0b0a-0908-0706-050403020100",
            "address": "10.0.0.1", "port": "http", "surge": "25%", "count": 7, "name": "abc",
            "colour": "red"}});
    let r = raw(
        &client,
        "POST",
        &format!("{path}?fieldValidation=Strict"),
        Some("application/json"),
        good.to_string().as_bytes(),
    )
    .await;
    assert_status(&r, 400, "BadRequest");
    assert_eq!(
        r.body["message"],
        "Gauge in version \"v1\" cannot be handled as a Gauge: strict decoding error: unknown field \"spec.colour\""
    );
    let r = raw(
        &client,
        "POST",
        path,
        Some("application/json"),
        good.to_string().as_bytes(),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.body["spec"]["port"], "http");
}

/// A CRD whose schema carries CEL rules of each kind CAPI's and ours use.
fn ruled_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "pools.test.example.com"},
        "spec": {"group": "test.example.com", "scope": "Namespaced",
            "names": {"plural": "pools", "singular": "pool", "kind": "Pool"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {
                    "type": "object",
                    "x-kubernetes-validations": [
                        {"rule": "self.min <= self.max", "message": "min must not exceed max"},
                        {"rule": "!has(self.zone) || self.zone == oldSelf.zone",
                            "message": "zone is immutable", "reason": "FieldValueForbidden"},
                        {"rule": "[has(self.layout),has(self.diskLayout)].filter(x,x==true).size() <= 1",
                            "messageExpression": "'at most one of layout (' + self.layout + ') and diskLayout'"}
                    ],
                    "properties": {
                        "min": {"type": "integer"}, "max": {"type": "integer"},
                        "zone": {"type": "string"},
                        "layout": {"type": "string", "maxLength": 20},
                        "diskLayout": {"type": "string", "maxLength": 20},
                        "type": {"type": "string", "maxLength": 20,
                            "x-kubernetes-validations": [{"rule": "!(self in ['Ready','Available'])",
                                "message": "type must not be one of: Ready, Available"}]},
                        "args": {"type": "array", "maxItems": 10, "items": {"type": "object",
                            "properties": {"name": {"type": "string", "maxLength": 20}}},
                            "x-kubernetes-validations": [{"rule": "self.all(x, self.exists_one(y, x.name == y.name))",
                                "message": "args name must be unique"}]}
                    }}}}}}]}
    })
}

async fn cel_rules_are_evaluated_with_old_self(server: Server) {
    let client = server.client();
    create_crd(&client, &ruled_crd()).await;
    let path = "/apis/test.example.com/v1/namespaces/default/pools";
    let pool = |spec: Value| {
        json!({"apiVersion": "test.example.com/v1", "kind": "Pool", "metadata": {"name": "p"}, "spec": spec})
        .to_string()
    };
    let r = raw(
        &client,
        "POST",
        path,
        Some("application/json"),
        pool(
            json!({"min": 3, "max": 1, "layout": "a", "diskLayout": "b", "type": "Ready",
            "args": [{"name": "x"}, {"name": "x"}]}),
        )
        .as_bytes(),
    )
    .await;
    assert_status(&r, 422, "Invalid");
    let mut causes: Vec<(String, String, String)> = r.body["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["field"].as_str().unwrap().to_string(),
                c["reason"].as_str().unwrap().to_string(),
                c["message"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    causes.sort();
    let expected: Vec<(String, String, String)> = [
        (
            "spec",
            "FieldValueInvalid",
            "Invalid value: at most one of layout (a) and diskLayout",
        ),
        (
            "spec",
            "FieldValueInvalid",
            "Invalid value: min must not exceed max",
        ),
        (
            "spec.args",
            "FieldValueInvalid",
            "Invalid value: args name must be unique",
        ),
        (
            "spec.type",
            "FieldValueInvalid",
            "Invalid value: \"Ready\": type must not be one of: Ready, Available",
        ),
    ]
    .iter()
    .map(|(f, r, m)| (f.to_string(), r.to_string(), m.to_string()))
    .collect();
    assert_eq!(causes, expected, "{}", r.text);
    // A valid one; then a transition rule checks the update against the object before it.
    let r = raw(
        &client,
        "POST",
        path,
        Some("application/json"),
        pool(json!({"min": 1, "max": 3, "zone": "a"})).as_bytes(),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let p = raw(
        &client,
        "PATCH",
        &format!("{path}/p"),
        Some("application/merge-patch+json"),
        br#"{"spec":{"zone":"b"}}"#,
    )
    .await;
    assert_status(&p, 422, "Invalid");
    assert_eq!(
        p.body["message"],
        "Pool.test.example.com \"p\" is invalid: spec: Forbidden: zone is immutable"
    );
    let ok = raw(
        &client,
        "PATCH",
        &format!("{path}/p"),
        Some("application/merge-patch+json"),
        br#"{"spec":{"max":4}}"#,
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.text);

    // A rule that does not parse is refused with the CRD, as the real server refuses it.
    let mut broken = ruled_crd();
    broken["metadata"]["name"] = json!("brokens.test.example.com");
    broken["spec"]["names"] = json!({"plural": "brokens", "singular": "broken", "kind": "Broken"});
    broken["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["x-kubernetes-validations"] =
        json!([{"rule": "self.min ==", "message": "bad"}]);
    let r = raw(
        &client,
        "POST",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        Some("application/json"),
        broken.to_string().as_bytes(),
    )
    .await;
    assert_status(&r, 422, "Invalid");
    let cause = &r.body["details"]["causes"][0];
    assert_eq!(
        cause["field"],
        "spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule"
    );
    assert_eq!(
        cause["message"],
        "Invalid value: {\"Rule\":\"self.min ==\",\"Message\":\"bad\",\"MessageExpression\":\"\",\"Reason\":null,\"FieldPath\":\"\",\"OptionalOldSelf\":null}: compilation failed: ERROR: <input>:1:12: Syntax error: mismatched input '<EOF>' expecting {'[', '{', '(', '.', '-', '!', 'true', 'false', 'null', NUM_FLOAT, NUM_INT, NUM_UINT, STRING, BYTES, IDENTIFIER}\n | self.min ==\n | ...........^"
    );
}

async fn defaults_are_applied_and_unknown_fields_pruned(server: Server) {
    let client = server.client();
    create_crd(&client, &widget_crd()).await;
    let api = widgets(&client, "default");
    let mut w = widget("w", 1);
    w["spec"]["ports"] = json!([{"port": 80}, {"port": 53, "protocol": "UDP", "junk": true}]);
    w["spec"]["free"] = json!({"anything": {"goes": [1, 2]}});
    w["spec"]["unknown"] = json!("dropped");
    w["spec"]["color"] = Value::Null;
    w["topLevelJunk"] = json!(1);
    w["metadata"]["unknownMeta"] = json!("x");
    let out = api
        .create(&PostParams::default(), &dynamic(w))
        .await
        .unwrap();
    let spec = &out.data["spec"];
    assert_eq!(spec["color"], "red", "defaulted (also from null)");
    assert_eq!(
        spec["ports"][0]["protocol"], "TCP",
        "defaulted in list items"
    );
    assert_eq!(spec["ports"][1]["protocol"], "UDP");
    assert!(
        spec["ports"][1].get("junk").is_none(),
        "pruned in list items"
    );
    assert_eq!(
        spec["free"]["anything"]["goes"],
        json!([1, 2]),
        "kept under x-kubernetes-preserve-unknown-fields"
    );
    assert!(spec.get("unknown").is_none());
    assert!(out.data.get("topLevelJunk").is_none());
    // The project CRD: `type` of a network interface defaults to tap; a field the schema forgets is lost.
    install_project_crds(&client).await;
    let mut m = machine("m");
    m["spec"]["forgotten"] = json!(true);
    let m = machines(&client, "default")
        .create(&PostParams::default(), &dynamic(m))
        .await
        .unwrap();
    assert_eq!(m.data["spec"]["networkInterfaces"][0]["type"], "tap");
    assert!(m.data["spec"].get("forgotten").is_none());
}

// --- Deletion, finalizers and owners ------------------------------------------------------------------

async fn finalizers_hold_deletion_until_removed(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    let api = machines(&client, "default");
    let mut m = machine("m");
    m["metadata"]["finalizers"] = json!(["example.com/hold"]);
    let created = api
        .create(&PostParams::default(), &dynamic(m))
        .await
        .unwrap();
    let mut events = api
        .watch(
            &WatchParams::default().fields("metadata.name=m"),
            &created.metadata.resource_version.clone().unwrap(),
        )
        .await
        .unwrap()
        .boxed();

    let deleted = api.delete("m", &DeleteParams::default()).await.unwrap();
    let pending = deleted
        .left()
        .expect("the object comes back while finalizers remain");
    assert!(pending.metadata.deletion_timestamp.is_some());
    assert_eq!(pending.metadata.deletion_grace_period_seconds, Some(0));
    assert_eq!(pending.metadata.generation, Some(2));
    assert!(
        matches!(events.try_next().await.unwrap().unwrap(), WatchEvent::Modified(o) if o.metadata.deletion_timestamp.is_some())
    );
    assert!(api.get("m").await.is_ok(), "still there");

    // No new finalizer may be added now.
    let s = status_of(
        api.patch(
            "m",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"finalizers": ["example.com/hold", "example.com/more"]}}),
            ),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    assert_eq!(s.details.unwrap().causes[0].reason, "FieldValueForbidden");
    // Other writes are still allowed.
    api.patch(
        "m",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
    )
    .await
    .unwrap();
    assert!(matches!(
        events.try_next().await.unwrap().unwrap(),
        WatchEvent::Modified(_)
    ));

    // Removing the last finalizer removes the object.
    let out = api
        .patch(
            "m",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    assert!(out.finalizers().is_empty());
    assert!(matches!(
        events.try_next().await.unwrap().unwrap(),
        WatchEvent::Deleted(_)
    ));
    assert_eq!(status_of(api.get("m").await.unwrap_err()).code, 404);
}

async fn delete_without_finalizers_removes_at_once_and_answers_success(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    let api = machines(&client, "default");
    let created = create_machine(&client, "default", "m").await;
    let out = api.delete("m", &DeleteParams::default()).await.unwrap();
    // A custom resource removed at once is answered with a Success Status naming it, as built-ins are.
    let status = out.right().expect("an immediate deletion answers a Status");
    assert_eq!(
        status.status,
        Some(kube::core::response::StatusSummary::Success)
    );
    let details = status.details.expect("details");
    assert_eq!(details.name, "m");
    assert_eq!(details.kind, "microvmmachines");
    assert_eq!(details.group, "infrastructure.cluster.x-k8s.io");
    assert_eq!(Some(details.uid), created.metadata.uid);
    assert_eq!(status_of(api.get("m").await.unwrap_err()).code, 404);
    assert_eq!(
        status_of(api.delete("m", &DeleteParams::default()).await.unwrap_err()).code,
        404
    );
    // Preconditions.
    let m = create_machine(&client, "default", "p").await;
    let s = status_of(
        api.delete(
            "p",
            &DeleteParams {
                preconditions: Some(kube::api::Preconditions {
                    uid: Some("wrong".into()),
                    resource_version: None,
                }),
                ..Default::default()
            },
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(s.code, 409);
    api.delete(
        "p",
        &DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: m.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    // Built-ins answer an immediate deletion with a Success Status.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap(),
    )
    .await
    .unwrap();
    let out = cms.delete("c", &DeleteParams::default()).await.unwrap();
    assert!(
        out.right()
            .is_some_and(|s| s.status == Some(kube::core::response::StatusSummary::Success))
    );
}

async fn a_delete_without_finalizers_removes_the_object_unmarked(server: Server) {
    // A real registry deletes an object nothing holds straight from etcd: neither the answer nor the
    // DELETED event carries deletionTimestamp or deletionGracePeriodSeconds, nor a new generation.
    let client = server.client();
    install_project_crds(&client).await;
    let api = machines(&client, "default");
    let created = create_machine(&client, "default", "m").await;
    assert_eq!(created.metadata.generation, Some(1));
    let mut events = api
        .watch(
            &WatchParams::default(),
            &created.metadata.resource_version.clone().unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    let out = api.delete("m", &DeleteParams::default()).await.unwrap();
    assert!(out.is_right(), "answered with a Success Status: {out:?}");
    match tokio::time::timeout(Duration::from_secs(5), events.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
    {
        WatchEvent::Deleted(o) => {
            assert!(o.metadata.deletion_timestamp.is_none(), "{o:?}");
            assert!(o.metadata.deletion_grace_period_seconds.is_none());
            assert_eq!(o.metadata.generation, Some(1));
            assert!(rv_of(&o) > rv_of(&created), "the deletion's revision");
        }
        other => panic!("expected DELETED only, got {other:?}"),
    }
    // A dry run answers the same, and removes nothing.
    create_machine(&client, "default", "d").await;
    let dry = api
        .delete(
            "d",
            &DeleteParams {
                dry_run: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(dry.is_right(), "{dry:?}");
    assert!(api.get("d").await.is_ok());
    // What stays (a finalizer, or a propagation policy that adds one) is still marked first.
    let orphaned = api
        .delete("d", &DeleteParams::orphan())
        .await
        .unwrap()
        .left()
        .expect("held by the orphan finalizer");
    assert!(orphaned.metadata.deletion_timestamp.is_some());
    assert_eq!(orphaned.metadata.generation, Some(2));
}

async fn delete_collection_deletes_what_the_selector_selects(server: Server) {
    let client = server.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for (name, tier) in [("a", "x"), ("b", "x"), ("c", "y")] {
        cms.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name, "labels": {"tier": tier}}}))
                .unwrap(),
        )
        .await
        .unwrap();
    }
    let out = cms
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("tier=x"),
        )
        .await
        .unwrap();
    let deleted: Vec<String> = out
        .left()
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    assert_eq!(deleted, vec!["a", "b"]);
    let left: Vec<String> = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    assert_eq!(left, vec!["c"]);
}

async fn garbage_collection_deletes_dependents_of_removed_owners(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    server.start_controllers().await;
    let api = machines(&client, "default");
    let owner = create_machine(&client, "default", "owner").await;
    let other = create_machine(&client, "default", "other").await;
    let oref = |o: &DynamicObject| {
        json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha2", "kind": "MicrovmMachine",
        "name": o.metadata.name, "uid": o.metadata.uid})
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let dep = |name: &str, owners: Vec<Value>, fins: Vec<&str>| -> Secret {
        serde_json::from_value(
            json!({"metadata": {"name": name, "ownerReferences": owners, "finalizers": fins}}),
        )
        .unwrap()
    };
    secrets
        .create(
            &PostParams::default(),
            &dep("only-owner", vec![oref(&owner)], vec![]),
        )
        .await
        .unwrap();
    secrets
        .create(
            &PostParams::default(),
            &dep("two-owners", vec![oref(&owner), oref(&other)], vec![]),
        )
        .await
        .unwrap();
    secrets
        .create(
            &PostParams::default(),
            &dep("held", vec![oref(&owner)], vec!["example.com/hold"]),
        )
        .await
        .unwrap();
    // A dependent of a dependent goes too, in turn.
    let only = secrets.get("only-owner").await.unwrap();
    let grand = json!({"apiVersion": "v1", "kind": "Secret", "name": "only-owner", "uid": only.metadata.uid});
    secrets
        .create(
            &PostParams::default(),
            &dep("grandchild", vec![grand], vec![]),
        )
        .await
        .unwrap();

    api.delete("owner", &DeleteParams::default()).await.unwrap();
    eventually("dependents of the removed owner are gone", || {
        let secrets = secrets.clone();
        async move {
            secrets.get_opt("only-owner").await.unwrap().is_none()
                && secrets.get_opt("grandchild").await.unwrap().is_none()
        }
    })
    .await;
    // An object with another live owner stays, without the dangling reference.
    eventually("dangling owner reference removed", || {
        let secrets = secrets.clone();
        async move {
            secrets
                .get("two-owners")
                .await
                .unwrap()
                .metadata
                .owner_references
                .unwrap_or_default()
                .len()
                == 1
        }
    })
    .await;
    // Its own finalizers are respected.
    let held = secrets.get("held").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    secrets
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    assert!(secrets.get_opt("held").await.unwrap().is_none());
    // An object created with an owner that does not exist is collected.
    secrets.create(&PostParams::default(), &dep("orphan", vec![json!({"apiVersion": "v1", "kind": "Secret", "name": "ghost", "uid": "no-such-uid"})], vec![])).await.unwrap();
    eventually("dependent of a missing owner collected", || {
        let secrets = secrets.clone();
        async move { secrets.get_opt("orphan").await.unwrap().is_none() }
    })
    .await;
    // Orphan propagation keeps dependents and drops their references.
    let o2 = create_machine(&client, "default", "owner2").await;
    secrets
        .create(
            &PostParams::default(),
            &dep("kept", vec![oref(&o2)], vec![]),
        )
        .await
        .unwrap();
    api.delete("owner2", &DeleteParams::orphan()).await.unwrap();
    eventually("owner2 removed after orphaning", || {
        let api = api.clone();
        async move { api.get_opt("owner2").await.unwrap().is_none() }
    })
    .await;
    assert!(
        secrets
            .get("kept")
            .await
            .unwrap()
            .metadata
            .owner_references
            .is_none()
    );
    // Foreground propagation deletes dependents before the owner.
    let o3 = create_machine(&client, "default", "owner3").await;
    let mut blocking = oref(&o3);
    blocking["blockOwnerDeletion"] = json!(true);
    secrets
        .create(
            &PostParams::default(),
            &dep("blocker", vec![blocking], vec!["example.com/hold"]),
        )
        .await
        .unwrap();
    api.delete("owner3", &DeleteParams::foreground())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let o3_now = api.get("owner3").await.unwrap();
    assert!(
        o3_now
            .finalizers()
            .contains(&"foregroundDeletion".to_string()),
        "owner waits for its blocking dependent"
    );
    secrets
        .patch(
            "blocker",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    eventually("owner3 removed once its dependent is gone", || {
        let api = api.clone();
        async move { api.get_opt("owner3").await.unwrap().is_none() }
    })
    .await;
}

async fn deleting_a_namespace_removes_what_is_in_it(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    server.start_controllers().await;
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "doomed"}})).unwrap(),
    )
    .await
    .unwrap();
    create_machine(&client, "doomed", "a").await;
    let mut held = machine("b");
    held["metadata"]["finalizers"] = json!(["example.com/hold"]);
    machines(&client, "doomed")
        .create(&PostParams::default(), &dynamic(held))
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "doomed");
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "s"}})).unwrap(),
        )
        .await
        .unwrap();

    let out = nss
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    let ns = out.left().unwrap();
    assert_eq!(ns.status.unwrap().phase.as_deref(), Some("Terminating"));
    eventually("contents without finalizers deleted", || {
        let client = client.clone();
        async move {
            machines(&client, "doomed")
                .get_opt("a")
                .await
                .unwrap()
                .is_none()
        }
    })
    .await;
    eventually("the secret deleted too", || {
        let secrets = secrets.clone();
        async move { secrets.get_opt("s").await.unwrap().is_none() }
    })
    .await;
    // New content is refused while it terminates.
    let s = status_of(
        machines(&client, "doomed")
            .create(&PostParams::default(), &dynamic(machine("c")))
            .await
            .unwrap_err(),
    );
    assert_eq!((s.code, s.reason.as_str()), (403, "Forbidden"));
    assert!(
        nss.get_opt("doomed").await.unwrap().is_some(),
        "held by b's finalizer"
    );
    machines(&client, "doomed")
        .patch(
            "b",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    eventually("namespace removed", || {
        let nss = nss.clone();
        async move { nss.get_opt("doomed").await.unwrap().is_none() }
    })
    .await;
    // The built-in namespaces cannot be deleted.
    assert_eq!(
        status_of(
            nss.delete("default", &DeleteParams::default())
                .await
                .unwrap_err()
        )
        .code,
        403
    );
}

// --- Lists and watches ----------------------------------------------------------------------------------

async fn label_and_field_selectors(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    let api = machines(&client, "default");
    for (name, labels) in [
        ("a", json!({"tier": "cp", "zone": "1"})),
        ("b", json!({"tier": "worker", "zone": "2"})),
        ("c", json!({"tier": "worker"})),
        ("d", json!({})),
    ] {
        let mut m = machine(name);
        m["metadata"]["labels"] = labels;
        api.create(&PostParams::default(), &dynamic(m))
            .await
            .unwrap();
    }
    let names = |sel: &'static str| {
        let api = api.clone();
        async move {
            let mut n: Vec<String> = api
                .list(&ListParams::default().labels(sel))
                .await
                .unwrap()
                .items
                .into_iter()
                .filter_map(|o| o.metadata.name)
                .collect();
            n.sort();
            n
        }
    };
    assert_eq!(names("tier=worker").await, vec!["b", "c"]);
    assert_eq!(names("tier==cp").await, vec!["a"]);
    assert_eq!(names("tier!=worker").await, vec!["a", "d"]);
    assert_eq!(names("zone in (1,2)").await, vec!["a", "b"]);
    assert_eq!(names("tier notin (cp)").await, vec!["b", "c", "d"]);
    assert_eq!(names("zone").await, vec!["a", "b"]);
    assert_eq!(names("!zone").await, vec!["c", "d"]);
    assert_eq!(names("tier=worker,zone").await, vec!["b"]);
    let by_name = api
        .list(&ListParams::default().fields("metadata.name=c"))
        .await
        .unwrap();
    assert_eq!(by_name.items.len(), 1);
    let not_c = api
        .list(&ListParams::default().fields("metadata.name!=c,metadata.namespace=default"))
        .await
        .unwrap();
    assert_eq!(not_c.items.len(), 3);
    let all_ns: Api<DynamicObject> = Api::all_with(client.clone(), &machine_ar());
    assert_eq!(
        all_ns
            .list(&ListParams::default().fields("metadata.namespace=kube-system"))
            .await
            .unwrap()
            .items
            .len(),
        0
    );
    let s = status_of(
        api.list(&ListParams::default().fields("spec.vcpu=2"))
            .await
            .unwrap_err(),
    );
    assert_eq!(s.code, 400);
    assert!(
        s.message == "field label not supported: spec.vcpu",
        "{}",
        s.message
    );
    let s = status_of(
        api.list(&ListParams::default().labels("tier in worker"))
            .await
            .unwrap_err(),
    );
    assert_eq!(s.code, 400);
    // Built-in field selectors (Secret type).
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    secrets.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "tls"}, "type": "kubernetes.io/tls", "data": {"tls.crt": "", "tls.key": ""}})).unwrap()).await.unwrap();
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "plain"}})).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        secrets
            .list(&ListParams::default().fields("type=kubernetes.io/tls"))
            .await
            .unwrap()
            .items
            .len(),
        1
    );
}

async fn limit_and_continue_paginate_consistently(server: Server) {
    let client = server.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for i in 0..25 {
        cms.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": format!("c{i:02}")}})).unwrap(),
        )
        .await
        .unwrap();
    }
    let first = cms.list(&ListParams::default().limit(10)).await.unwrap();
    assert_eq!(first.items.len(), 10);
    assert_eq!(first.metadata.remaining_item_count, Some(15));
    let list_rv = first.metadata.resource_version.clone().unwrap();
    // Changes after the first page do not show in the rest of the list.
    cms.delete("c15", &DeleteParams::default()).await.unwrap();
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "c99"}})).unwrap(),
    )
    .await
    .unwrap();
    cms.patch(
        "c20",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"changed": "yes"}})),
    )
    .await
    .unwrap();
    let mut names: Vec<String> = first
        .items
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    let mut token = first.metadata.continue_;
    while let Some(t) = token {
        let page = cms
            .list(&ListParams::default().limit(10).continue_token(&t))
            .await
            .unwrap();
        assert_eq!(
            page.metadata.resource_version.as_deref(),
            Some(list_rv.as_str()),
            "every page is at the list's resourceVersion"
        );
        for c in &page.items {
            if c.metadata.name.as_deref() == Some("c20") {
                assert!(
                    c.data.is_none(),
                    "the object as it was at the list's resourceVersion"
                );
            }
        }
        names.extend(page.items.iter().filter_map(|c| c.metadata.name.clone()));
        token = page.metadata.continue_;
    }
    let expected: Vec<String> = (0..25).map(|i| format!("c{i:02}")).collect();
    assert_eq!(names, expected);
    // A fresh list sees the changes.
    let now = cms.list(&ListParams::default()).await.unwrap();
    assert!(
        now.items
            .iter()
            .any(|c| c.metadata.name.as_deref() == Some("c99"))
    );
    assert!(
        !now.items
            .iter()
            .any(|c| c.metadata.name.as_deref() == Some("c15"))
    );
    // Listing exactly at an old revision works while the history reaches it.
    let exact = cms
        .list(
            &ListParams::default()
                .at(&list_rv)
                .matching(kube::api::VersionMatch::Exact),
        )
        .await
        .unwrap();
    assert_eq!(exact.items.len(), 25);
}

async fn watch_streams_added_modified_deleted_and_bookmarks(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    let api = machines(&client, "default");
    let start_rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = api
        .watch(&WatchParams::default(), &start_rv)
        .await
        .unwrap()
        .boxed();
    create_machine(&client, "default", "m").await;
    api.patch(
        "m",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"vcpu": 3}})),
    )
    .await
    .unwrap();
    api.delete("m", &DeleteParams::default()).await.unwrap();
    let mut seen = Vec::new();
    let mut last_rv = 0;
    while seen.len() < 3 {
        match tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            WatchEvent::Added(o) => seen.push(("ADDED", o.data["spec"]["vcpu"].clone())),
            WatchEvent::Modified(o) => seen.push(("MODIFIED", o.data["spec"]["vcpu"].clone())),
            WatchEvent::Deleted(o) => {
                last_rv = rv_of(&o);
                seen.push(("DELETED", o.data["spec"]["vcpu"].clone()))
            }
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(
        seen,
        vec![
            ("ADDED", json!(2)),
            ("MODIFIED", json!(3)),
            ("DELETED", json!(3))
        ]
    );
    // A watch that starts with the current state (here none) and allows bookmarks (kube-rs asks for
    // them) marks the end of that state with a bookmark at a revision that covers every change so far
    // (periodic bookmarks come every minute, on both servers).
    let mut fresh = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    let b = match tokio::time::timeout(Duration::from_secs(5), fresh.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
    {
        WatchEvent::Bookmark(b) => b,
        other => panic!("expected the initial-events-end bookmark, got {other:?}"),
    };
    assert_eq!(b.types.kind, "MicrovmMachine");
    assert_eq!(
        b.metadata
            .annotations
            .get("k8s.io/initial-events-end")
            .map(String::as_str),
        Some("true")
    );
    let list_rv: u64 = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap()
        .parse()
        .unwrap();
    let bookmark_rv: u64 = b.metadata.resource_version.parse().unwrap();
    assert!(
        bookmark_rv >= last_rv && bookmark_rv <= list_rv,
        "a bookmark carries a revision covering what was sent: {last_rv} <= {bookmark_rv} <= {list_rv}"
    );

    // The wire format: newline-delimited JSON over a chunked response.
    let r = raw(&client, "GET", "/apis/infrastructure.cluster.x-k8s.io/v1alpha2/namespaces/default/microvmmachines?watch=true&resourceVersion=0&timeoutSeconds=1", None, b"").await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.headers
            .get("transfer-encoding")
            .and_then(|v| v.to_str().ok()),
        Some("chunked")
    );
    assert_eq!(
        r.text, "",
        "nothing exists, nothing sent, then the timeout ends the stream cleanly"
    );
}

async fn watch_from_a_resource_version_replays_in_order_and_from_zero_lists_first(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    let api = machines(&client, "default");
    let a = create_machine(&client, "default", "a").await;
    create_machine(&client, "default", "b").await;
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"vcpu": 5}})),
    )
    .await
    .unwrap();
    api.delete("b", &DeleteParams::default()).await.unwrap();

    let collect = |rv: String, n: usize| {
        let api = api.clone();
        async move {
            let mut s = api
                .watch(&WatchParams::default().timeout(2), &rv)
                .await
                .unwrap()
                .boxed();
            let mut out = Vec::new();
            while out.len() < n {
                match s.try_next().await.unwrap() {
                    Some(WatchEvent::Added(o)) => {
                        out.push(format!("ADDED {}", o.metadata.name.unwrap()))
                    }
                    Some(WatchEvent::Modified(o)) => {
                        out.push(format!("MODIFIED {}", o.metadata.name.unwrap()))
                    }
                    Some(WatchEvent::Deleted(o)) => {
                        out.push(format!("DELETED {}", o.metadata.name.unwrap()))
                    }
                    Some(other) => panic!("{other:?}"),
                    None => break,
                }
            }
            out
        }
    };
    // From a's creation: everything after it, in order.
    assert_eq!(
        collect(a.metadata.resource_version.clone().unwrap(), 3).await,
        vec!["ADDED b", "MODIFIED a", "DELETED b"]
    );
    // From "0": the current objects as ADDED, then changes.
    assert_eq!(collect("0".into(), 1).await, vec!["ADDED a"]);
    let mut s = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    assert!(matches!(
        s.try_next().await.unwrap(),
        Some(WatchEvent::Added(_))
    ));
    // With bookmarks allowed (kube-rs's default), the end of the initial state is marked.
    assert!(
        matches!(s.try_next().await.unwrap(), Some(WatchEvent::Bookmark(b)) if b.metadata.annotations.contains_key("k8s.io/initial-events-end"))
    );
    create_machine(&client, "default", "c").await;
    assert!(
        matches!(s.try_next().await.unwrap(), Some(WatchEvent::Added(o)) if o.metadata.name.as_deref() == Some("c"))
    );
    // sendInitialEvents: the current objects, then a bookmark marking their end.
    let wp = WatchParams::default().initial_events();
    let mut s = api.watch(&wp, "").await.unwrap().boxed();
    let mut added = 0;
    loop {
        match s.try_next().await.unwrap().unwrap() {
            WatchEvent::Added(_) => added += 1,
            WatchEvent::Bookmark(b) => {
                assert_eq!(
                    b.metadata
                        .annotations
                        .get("k8s.io/initial-events-end")
                        .map(String::as_str),
                    Some("true")
                );
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(added, 2);
}

async fn a_watch_with_a_selector_sees_objects_enter_and_leave(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    let api = machines(&client, "default");
    create_machine(&client, "default", "m").await;
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut s = api
        .watch(&WatchParams::default().labels("role=worker"), &rv)
        .await
        .unwrap()
        .boxed();
    let pp = PatchParams::default();
    api.patch(
        "m",
        &pp,
        &Patch::Merge(json!({"metadata": {"labels": {"role": "worker"}}})),
    )
    .await
    .unwrap();
    api.patch("m", &pp, &Patch::Merge(json!({"spec": {"vcpu": 4}})))
        .await
        .unwrap();
    let left = api
        .patch(
            "m",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"role": "cp"}}})),
        )
        .await
        .unwrap();
    api.patch("m", &pp, &Patch::Merge(json!({"spec": {"vcpu": 5}})))
        .await
        .unwrap();
    api.patch(
        "m",
        &pp,
        &Patch::Merge(json!({"metadata": {"labels": {"role": "worker"}}})),
    )
    .await
    .unwrap();
    let mut seen = Vec::new();
    for _ in 0..4 {
        match tokio::time::timeout(Duration::from_secs(5), s.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            WatchEvent::Added(o) => seen.push(format!("ADDED {}", o.data["spec"]["vcpu"])),
            WatchEvent::Modified(o) => seen.push(format!("MODIFIED {}", o.data["spec"]["vcpu"])),
            WatchEvent::Deleted(o) => {
                // As from the real watch cache: the object as it last matched (role=worker), at the
                // revision of the change that made it leave.
                assert_eq!(
                    o.labels().get("role").map(String::as_str),
                    Some("worker"),
                    "{o:?}"
                );
                assert_eq!(rv_of(&o), rv_of(&left));
                seen.push(format!("DELETED {}", o.data["spec"]["vcpu"]))
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(seen, vec!["ADDED 2", "MODIFIED 4", "DELETED 4", "ADDED 5"]);
    // Replayed from the history, the same.
    let replayed: Vec<_> = api
        .watch(
            &WatchParams::default().labels("role=worker").timeout(1),
            &rv,
        )
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let deleted = replayed
        .iter()
        .find_map(|e| match e {
            WatchEvent::Deleted(o) => Some(o),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        deleted.labels().get("role").map(String::as_str),
        Some("worker")
    );
    assert_eq!(rv_of(deleted), rv_of(&left));
}

async fn a_watch_on_a_named_path_watches_that_object_only(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    let api = machines(&client, "default");
    create_machine(&client, "default", "m").await;
    create_machine(&client, "default", "n").await;
    let base = "/apis/infrastructure.cluster.x-k8s.io/v1alpha2";
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let lines = |r: &Raw| -> Vec<(String, String)> {
        r.text
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                (
                    v["type"].as_str().unwrap().to_string(),
                    v["object"]["metadata"]["name"]
                        .as_str()
                        .unwrap_or("")
                        .to_string(),
                )
            })
            .collect()
    };
    let pair = |t: &str, n: &str| (t.to_string(), n.to_string());
    if let Some(emu) = server.emulator_handle() {
        emu.reset_counters();
    }

    // From "0": the object as ADDED, then its changes; the other object is not seen.
    let watch = {
        let client = client.clone();
        tokio::spawn(async move {
            raw(
                &client,
                "GET",
                &format!("{base}/watch/namespaces/default/microvmmachines/m?resourceVersion=0&timeoutSeconds=2"),
                None,
                b"",
            )
            .await
        })
    };
    // From a resourceVersion: only the changes after it.
    let from_rv = {
        let client = client.clone();
        tokio::spawn(async move {
            raw(
                &client,
                "GET",
                &format!("{base}/watch/namespaces/default/microvmmachines/m?resourceVersion={rv}&timeoutSeconds=2"),
                None,
                b"",
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pp = PatchParams::default();
    for name in ["n", "m"] {
        api.patch(name, &pp, &Patch::Merge(json!({"spec": {"vcpu": 3}})))
            .await
            .unwrap();
    }
    let watch = watch.await.unwrap();
    assert_eq!(watch.status, 200, "{}", watch.text);
    assert_eq!(
        lines(&watch),
        vec![pair("ADDED", "m"), pair("MODIFIED", "m")]
    );
    let from_rv = from_rv.await.unwrap();
    assert_eq!(lines(&from_rv), vec![pair("MODIFIED", "m")]);
    // Two watches counted (the emulator's request counters; the real server has no such counters).
    if let Some(emu) = server.emulator_handle() {
        assert_eq!(
            emu.counters().get(
                capmvm_kube_emulator::Verb::Watch,
                "infrastructure.cluster.x-k8s.io/microvmmachines"
            ),
            2
        );
    }

    // The legacy core path.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for name in ["c", "d"] {
        cms.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
        )
        .await
        .unwrap();
    }
    let core = raw(
        &client,
        "GET",
        "/api/v1/watch/namespaces/default/configmaps/c?resourceVersion=0&timeoutSeconds=1",
        None,
        b"",
    )
    .await;
    assert_eq!(lines(&core), vec![pair("ADDED", "c")]);

    // A field selector must name the same object; the watch paths take GET only.
    let other = raw(
        &client,
        "GET",
        "/api/v1/watch/namespaces/default/configmaps/c?fieldSelector=metadata.name%3Dd",
        None,
        b"",
    )
    .await;
    assert_status(&other, 400, "BadRequest");
    let post = raw(
        &client,
        "POST",
        "/api/v1/watch/namespaces/default/configmaps",
        Some("application/json"),
        br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}"#,
    )
    .await;
    assert_status(&post, 405, "MethodNotAllowed");
    // `?watch=true` on a named path is a plain GET on a real server.
    let get = raw(
        &client,
        "GET",
        "/api/v1/namespaces/default/configmaps/c?watch=true",
        None,
        b"",
    )
    .await;
    assert_eq!(get.status, 200);
    assert_eq!(get.body["kind"], "ConfigMap");
}

async fn reads_from_a_resource_version_not_reached_yet(server: Server) {
    let client = server.client();
    let no_retry = server.client_without_retries().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let create = |name: String| {
        let cms = cms.clone();
        async move {
            let c = cms
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
                )
                .await
                .unwrap();
            c.metadata.resource_version.unwrap().parse::<u64>().unwrap()
        }
    };
    let now: u64 = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap()
        .parse()
        .unwrap();

    // A watch from a future resourceVersion starts and sends only the changes after it (a real server
    // "may wait indefinitely" for it): not the ones on the way there. (A real server writes too, its
    // own leases: which of these creates come after it depends on them.)
    let future = now + 2;
    let mut s = cms
        .watch(&WatchParams::default(), &future.to_string())
        .await
        .unwrap()
        .boxed();
    let mut created = Vec::new();
    for i in 1..=3 {
        created.push((format!("c{i}"), create(format!("c{i}")).await));
    }
    let first_after = created
        .iter()
        .find(|(_, rv)| *rv > future)
        .map(|(n, _)| n.clone());
    assert!(first_after.is_some(), "{created:?}");
    match tokio::time::timeout(Duration::from_secs(5), s.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
    {
        WatchEvent::Added(o) => assert_eq!(o.metadata.name, first_after, "{created:?}"),
        other => panic!("expected ADDED {first_after:?}, got {other:?}"),
    }

    // A list waits briefly for the version it asks for (the next write's): it answers once that
    // version is reached, with it.
    let now = created[2].1;
    let started = std::time::Instant::now();
    let later = {
        let cms = cms.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let late = cms
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(json!({"metadata": {"name": "late"}})).unwrap(),
                )
                .await
                .unwrap();
            late.metadata
                .resource_version
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
    };
    let list = cms
        .list(&ListParams::default().at(&(now + 1).to_string()))
        .await
        .unwrap();
    let waited = started.elapsed();
    let late_rv = later.await.unwrap();
    let list_rv: u64 = list.metadata.resource_version.unwrap().parse().unwrap();
    assert!(list_rv > now, "{list_rv} {now}");
    let has_late = list
        .items
        .iter()
        .any(|c| c.metadata.name.as_deref() == Some("late"));
    // The real server's own writes may reach that version first; without them (the emulator has
    // none) the list waited for "late".
    assert_eq!(has_late, list_rv >= late_rv, "{list_rv} {late_rv}");
    if !has_late {
        assert!(server.is_real(), "only a real server writes by itself");
    } else {
        assert!(waited >= Duration::from_millis(400), "{waited:?}");
    }
    let now = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap()
        .parse::<u64>()
        .unwrap();

    // ...and then, as a GET does, fails with the real server's "Too large resource version"; a
    // watch with sendInitialEvents (whose initial state must be that fresh) fails the same way, as an
    // ERROR event.
    let too_large = |r: &Value| {
        assert_eq!(r["code"], 504, "{r}");
        assert_eq!(r["reason"], "Timeout", "{r}");
        let message = r["message"].as_str().unwrap();
        let prefix = format!(
            "Timeout: Too large resource version: {}, current: ",
            now + 100
        );
        let current: u64 = message
            .strip_prefix(&prefix)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{r}"));
        assert!(current >= now && current < now + 100, "{r}");
        assert_eq!(
            r["details"]["causes"][0]["reason"], "ResourceVersionTooLarge",
            "{r}"
        );
        assert_eq!(r["details"]["retryAfterSeconds"], 1, "{r}");
    };
    let started = std::time::Instant::now();
    let base = "/api/v1/namespaces/default/configmaps";
    let future = now + 100;
    let list_path = format!("{base}?resourceVersion={future}");
    let get_path = format!("{base}/c1?resourceVersion={future}");
    let watch_path = format!(
        "{base}?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&resourceVersion={future}"
    );
    let (list, get, watch) = tokio::join!(
        raw(&no_retry, "GET", &list_path, None, b""),
        raw(&no_retry, "GET", &get_path, None, b""),
        raw(&no_retry, "GET", &watch_path, None, b""),
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(2500) && waited < Duration::from_secs(10),
        "{waited:?}"
    );
    assert_status(&list, 504, "Timeout");
    too_large(&list.body);
    assert_status(&get, 504, "Timeout");
    assert_eq!(list.headers.get("retry-after").unwrap(), "1");
    assert_eq!(watch.status, 200, "{}", watch.text);
    assert_eq!(watch.body["type"], "ERROR", "{}", watch.text);
    too_large(&watch.body["object"]);
}

async fn watch_timeout_ends_cleanly(server: Server) {
    let client = server.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let started = std::time::Instant::now();
    let mut s = cms
        .watch(&WatchParams::default().timeout(1), "0")
        .await
        .unwrap()
        .boxed();
    // Nothing exists: only the bookmark that ends the (empty) initial state, then the end.
    let first = s.try_next().await.unwrap();
    assert!(matches!(first, Some(WatchEvent::Bookmark(_))), "{first:?}");
    let next = s.try_next().await.unwrap();
    assert!(next.is_none(), "{next:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(900)
            && started.elapsed() < Duration::from_secs(5)
    );
}

// --- Tables -----------------------------------------------------------------------------------------------

async fn tables_carry_the_printer_columns(server: Server) {
    let client = server.client();
    create_crd(&client, &widget_crd()).await;
    let mut w = widget("w", 4);
    w["metadata"]["labels"] = json!({"example.com/owner": "team-a"});
    w["spec"]["color"] = json!("blue");
    widgets(&client, "default")
        .create(&PostParams::default(), &dynamic(w))
        .await
        .unwrap();
    widgets(&client, "default")
        .patch_status("w", &PatchParams::default(), &Patch::Merge(json!({"status": {"conditions": [{"type": "Paused", "status": "False"}, {"type": "Ready", "status": "True"}]}})))
        .await
        .unwrap();
    let accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
    let r = raw_with(
        &client,
        "GET",
        "/apis/test.example.com/v1/namespaces/default/widgets",
        None,
        Some(accept),
        b"",
    )
    .await;
    assert_eq!(r.status, 200);
    let t = r.body;
    assert_eq!(t["kind"], "Table");
    assert_eq!(t["apiVersion"], "meta.k8s.io/v1");
    let cols: Vec<&str> = t["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(cols, vec!["Name", "Size", "Color", "Ready", "Owner", "Age"]);
    assert_eq!(t["columnDefinitions"][2]["priority"], 1);
    let cells = &t["rows"][0]["cells"];
    assert_eq!(cells[0], "w");
    assert_eq!(cells[1], 4);
    assert_eq!(cells[2], "blue");
    assert_eq!(cells[3], "True");
    assert_eq!(cells[4], "team-a");
    assert!(
        cells[5].as_str().unwrap().ends_with('s'),
        "age like 0s: {}",
        cells[5]
    );
    assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    // One object as a Table, and a missing value is null.
    widgets(&client, "default")
        .create(&PostParams::default(), &dynamic(widget("bare", 1)))
        .await
        .unwrap();
    let one = raw_with(
        &client,
        "GET",
        "/apis/test.example.com/v1/namespaces/default/widgets/bare",
        None,
        Some(accept),
        b"",
    )
    .await
    .body;
    assert_eq!(one["rows"].as_array().unwrap().len(), 1);
    assert!(one["rows"][0]["cells"][3].is_null());
    // PartialObjectMetadata, as kube-rs metadata calls ask.
    let meta: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    assert!(
        meta.list_metadata(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let dmeta = widgets(&client, "default").get_metadata("w").await.unwrap();
    assert_eq!(
        dmeta.metadata.labels.unwrap()["example.com/owner"],
        "team-a"
    );
}

// --- Access reviews ----------------------------------------------------------------------------------

async fn self_reviews_answer_what_a_client_may_do(server: Server) {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
        SelfSubjectRulesReview, SelfSubjectRulesReviewSpec,
    };
    let client = server.client();
    // The emulator has no authorization and the real server's test client is an administrator
    // (system:masters): both allow everything, and say so.
    let reviews: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some("create".into()),
                group: Some("infrastructure.cluster.x-k8s.io".into()),
                resource: Some("microvmmachines".into()),
                namespace: Some("default".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = reviews
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    assert!(answer.status.as_ref().unwrap().allowed, "{answer:?}");
    assert_eq!(
        answer.spec.resource_attributes.unwrap().resource.as_deref(),
        Some("microvmmachines")
    );
    // Neither kind of attributes: 422 naming the field.
    let e = status_of(
        reviews
            .create(&PostParams::default(), &SelfSubjectAccessReview::default())
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        e.details.unwrap().causes[0].field,
        "spec.resourceAttributes"
    );
    let rules: Api<SelfSubjectRulesReview> = Api::all(client.clone());
    let listed = rules
        .create(
            &PostParams::default(),
            &SelfSubjectRulesReview {
                spec: SelfSubjectRulesReviewSpec {
                    namespace: Some("default".into()),
                },
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .status
        .unwrap();
    assert!(!listed.incomplete);
    assert!(listed.resource_rules.iter().any(|r| r.verbs == ["*"]
        && r.api_groups.as_deref() == Some(&["*".to_string()][..])
        && r.resources.as_deref() == Some(&["*".to_string()][..])));
    // kubectl asks the same questions.
    let Some(kubectl) = server.kubectl("self_reviews_answer_what_a_client_may_do") else {
        return;
    };
    let can = kubectl
        .run(&[
            "auth",
            "can-i",
            "create",
            "microvmmachines.infrastructure.cluster.x-k8s.io",
            "-n",
            "default",
        ])
        .await
        .unwrap();
    assert_eq!(can.trim(), "yes");
    let list = kubectl
        .run(&["auth", "can-i", "--list", "-n", "default"])
        .await
        .unwrap();
    assert!(list.lines().any(|l| l.starts_with("*.*")), "{list}");
}

on_both_servers!(
    cel_rules_are_evaluated_with_old_self,
    formats_int_or_string_and_unknown_fields_under_strict_decoding,
    every_invalid_field_is_named_in_one_answer,
    self_reviews_answer_what_a_client_may_do,
    discovery_documents_describe_the_served_resources,
    namespaced_cluster_scoped_and_all_namespace_paths,
    builtin_kinds_are_served_with_default_namespaces,
    a_created_crd_is_served_at_once_and_deleting_it_stops_serving,
    every_served_version_of_a_crd_is_served,
    openapi_v3_documents_come_from_the_served_schemas,
    field_validation_strict_warn_and_ignore,
    unknown_fields_are_found_in_the_whole_body_before_the_status_rules,
    unknown_paths_and_resources_are_404_status,
    one_global_strictly_increasing_resource_version,
    create_fills_system_fields_and_rejects_duplicates_and_missing_namespaces,
    names_are_dns_subdomains_and_namespaces_dns_labels,
    generation_changes_only_when_spec_changes,
    writes_with_a_stale_resource_version_conflict,
    errors_are_status_objects_with_matching_http_codes,
    malformed_requests_get_status_answers_and_never_break_the_server,
    status_subresource_separates_spec_and_status_writes,
    merge_and_json_patches_on_main_and_status_paths,
    a_failed_json_patch_test_is_422_and_changes_nothing,
    strategic_merge_patch_only_on_builtins,
    leases_support_server_side_apply_with_field_ownership_conflicts,
    schema_validation_reports_422_with_field_paths,
    defaults_are_applied_and_unknown_fields_pruned,
    finalizers_hold_deletion_until_removed,
    delete_without_finalizers_removes_at_once_and_answers_success,
    a_delete_without_finalizers_removes_the_object_unmarked,
    delete_collection_deletes_what_the_selector_selects,
    garbage_collection_deletes_dependents_of_removed_owners,
    deleting_a_namespace_removes_what_is_in_it,
    label_and_field_selectors,
    limit_and_continue_paginate_consistently,
    watch_streams_added_modified_deleted_and_bookmarks,
    watch_from_a_resource_version_replays_in_order_and_from_zero_lists_first,
    a_watch_with_a_selector_sees_objects_enter_and_leave,
    a_watch_on_a_named_path_watches_that_object_only,
    reads_from_a_resource_version_not_reached_yet,
    watch_timeout_ends_cleanly,
    tables_carry_the_printer_columns,
);

/// JSON patch documents for kube's `Patch::Json`, from JSON values.
mod json_patch_ops {
    pub(crate) type Ops = json_patch::Patch;

    pub(crate) fn ops(v: serde_json::Value) -> Ops {
        serde_json::from_value(v).unwrap()
    }
}
