//! Objects and versions: resourceVersions, what a create fills, names, generation, conflicts, and the
//! Status answers of errors and malformed requests.

use super::*;

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
        .merge("a", json!({"metadata": {"labels": {"x": "y"}}}))
        .await;
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
        .merge("a", json!({"metadata": {"labels": {"x": "y"}}}))
        .await;
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
    let g = machines(&client, "default").create_json(generated).await;
    let name = g.metadata.name.unwrap();
    assert!(
        name.starts_with("worker-") && name.len() == "worker-".len() + 5,
        "{name}"
    );

    let dup = try_create_machine(&client, "default", "m1")
        .await
        .unwrap_err();
    let s = status_of(dup);
    assert_eq!((s.code, s.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(
        s.message,
        "microvmmachines.infrastructure.cluster.x-k8s.io \"m1\" already exists"
    );

    let missing = try_create_machine(&client, "nowhere", "m2")
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
    let e = try_create_machine(&client, "default", "Bad_Name")
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
    let e = try_create_machine(&client, "default", &too_long)
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
    let e = try_create_machine(&client, "default", "Worker-1")
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
    api.create_json(widget("w", 1)).await;
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
    let second = api.merge("m", json!({"spec": {"vcpu": 4}})).await;

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
    let s = status_of(api.try_merge("m", patch).await.unwrap_err());
    assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
    let cur_rv = replaced.metadata.resource_version.clone().unwrap();
    let patch =
        json!({"metadata": {"resourceVersion": cur_rv}, "spec": {"providerID": "microvm://h/1"}});
    let ok = api.merge("m", patch).await;
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
    // (client, method, path, content type, body, the status's code and reason)
    type Case<'a> = (
        &'a kube::Client,
        &'a str,
        String,
        Option<&'a str>,
        &'a [u8],
        u16,
        &'a str,
    );
    let requests: Vec<Case<'_>> = vec![
        (
            &client,
            "GET",
            format!("{base}/none"),
            None,
            b"",
            404,
            "NotFound",
        ),
        (
            &client,
            "POST",
            base.to_string(),
            Some("application/json"),
            b"{not json",
            400,
            "BadRequest",
        ),
        (
            &client,
            "POST",
            base.to_string(),
            Some("application/json"),
            b"[]",
            400,
            "BadRequest",
        ),
        // The custom resource handler takes a POST to a named path as a create, and a PUT to the
        // collection as an update without a name.
        (
            &client,
            "POST",
            format!("{base}/m"),
            Some("application/json"),
            b"{}",
            400,
            "BadRequest",
        ),
        (
            &client,
            "PUT",
            base.to_string(),
            Some("application/json"),
            b"{}",
            400,
            "BadRequest",
        ),
        (
            &client,
            "PUT",
            "/api/v1/namespaces/default/configmaps".to_string(),
            Some("application/json"),
            b"{}",
            405,
            "MethodNotAllowed",
        ),
        (
            &client,
            "PATCH",
            format!("{base}/m"),
            Some("application/strategic-merge-patch+json"),
            b"{}",
            415,
            "UnsupportedMediaType",
        ),
        (
            &client,
            "PATCH",
            format!("{base}/m"),
            Some("text/plain"),
            b"{}",
            415,
            "UnsupportedMediaType",
        ),
        (
            &client,
            "PATCH",
            format!("{base}/m"),
            Some("application/merge-patch+json"),
            br#"{"spec":{"vcpu":0}}"#,
            422,
            "Invalid",
        ),
        (
            &client,
            "GET",
            format!("{base}?labelSelector=a%20in%20b"),
            None,
            b"",
            400,
            "BadRequest",
        ),
        (
            &client,
            "GET",
            format!("{base}?fieldSelector=spec.vcpu%3D1"),
            None,
            b"",
            400,
            "BadRequest",
        ),
        (
            &client,
            "GET",
            format!("{base}?limit=abc"),
            None,
            b"",
            400,
            "BadRequest",
        ),
        (
            &client,
            "GET",
            format!("{base}?continue=bm90LWpzb24"),
            None,
            b"",
            400,
            "BadRequest",
        ),
        (
            &no_retry,
            "GET",
            format!("{base}?resourceVersion=999999&resourceVersionMatch=NotOlderThan"),
            None,
            b"",
            504,
            "Timeout",
        ),
        (
            &client,
            "PATCH",
            format!("{base}/m"),
            Some("application/json-patch+json"),
            br#"[{"op":"explode"}]"#,
            422,
            "Invalid",
        ),
        (
            &client,
            "DELETE",
            format!("{base}/m"),
            Some("application/json"),
            br#"{"propagationPolicy":"Sideways"}"#,
            422,
            "Invalid",
        ),
    ];
    let mut cases: Vec<(Raw, u16, &str)> = Vec::new();
    for (c, method, path, content_type, body, code, reason) in requests {
        cases.push((
            raw(c, method, &path, content_type, body).await,
            code,
            reason,
        ));
    }
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

crate::on_both_servers!(
    one_global_strictly_increasing_resource_version,
    create_fills_system_fields_and_rejects_duplicates_and_missing_namespaces,
    names_are_dns_subdomains_and_namespaces_dns_labels,
    generation_changes_only_when_spec_changes,
    writes_with_a_stale_resource_version_conflict,
    errors_are_status_objects_with_matching_http_codes,
    malformed_requests_get_status_answers_and_never_break_the_server,
);
