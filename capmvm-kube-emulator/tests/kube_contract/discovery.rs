//! Paths and discovery: discovery documents, the paths of namespaced, cluster-scoped and
//! all-namespace resources, built-in kinds, CRDs served on create, OpenAPI v3, field validation and 404s.

use super::*;

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
        .create_json(widget("w1", 3))
        .await;
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
    // The group's document changes while the project's other CRDs of the group are taken in; the real
    // server then redirects (301) an index's hash that is no longer current, so the index is read
    // again until its document is served.
    let mut attempts = 0;
    let doc = loop {
        attempts += 1;
        let index = get_json(&client, "/openapi/v3").await;
        let entry = &index["paths"]["apis/infrastructure.cluster.x-k8s.io/v1alpha2"];
        let url = entry["serverRelativeURL"].as_str().unwrap().to_string();
        assert!(
            url.starts_with("/openapi/v3/apis/infrastructure.cluster.x-k8s.io/v1alpha2?hash="),
            "{url}"
        );
        assert!(index["paths"]["api/v1"].is_object());
        let r = raw(&client, "GET", &url, None, b"").await;
        if r.status == 301 && attempts < 50 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        assert_eq!(r.status, 200, "GET {url}: {}", r.text);
        break r.body;
    };
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
        .create_json(widget("w", 2))
        .await;

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

crate::on_both_servers!(
    discovery_documents_describe_the_served_resources,
    namespaced_cluster_scoped_and_all_namespace_paths,
    builtin_kinds_are_served_with_default_namespaces,
    a_created_crd_is_served_at_once_and_deleting_it_stops_serving,
    every_served_version_of_a_crd_is_served,
    openapi_v3_documents_come_from_the_served_schemas,
    field_validation_strict_warn_and_ignore,
    unknown_fields_are_found_in_the_whole_body_before_the_status_rules,
    unknown_paths_and_resources_are_404_status,
);
