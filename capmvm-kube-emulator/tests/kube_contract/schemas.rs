//! Schemas of custom resources: validation answers, formats, strict decoding, CEL rules, defaults
//! and pruning.

use super::*;

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
    let ok = api.create_json(w).await;
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
    let out = api.create_json(w).await;
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
    let m = machines(&client, "default").create_json(m).await;
    assert_eq!(m.data["spec"]["networkInterfaces"][0]["type"], "tap");
    assert!(m.data["spec"].get("forgotten").is_none());
}

/// A MicrovmCluster names its credentials Secrets by name, in its own namespace: a
/// `namespace/name` is refused at admission, at both served versions (v1alpha1 is checked before
/// any conversion, so no webhook is needed), naming the field and the fix; a plain name passes.
async fn a_microvm_cluster_cannot_name_a_secret_in_another_namespace(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    let cluster = |version: &str, name: &str, tls: &str, token: &str| {
        json!({
            "apiVersion": format!("infrastructure.cluster.x-k8s.io/{version}"),
            "kind": "MicrovmCluster",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "placement": {"staticPool": {
                    "hosts": [{"endpoint": "127.0.0.1:9090", "controlplaneAllowed": true}],
                    "basicAuthSecret": token,
                }},
                "tlsSecretRef": tls,
            },
        })
    };
    let fix = "names a Secret in another namespace: a MicrovmCluster may use only Secrets in its own namespace; create the Secret in the MicrovmCluster's namespace and give its name alone, without a namespace/ prefix";
    for version in ["v1alpha2", "v1alpha1"] {
        let path = format!(
            "/apis/infrastructure.cluster.x-k8s.io/{version}/namespaces/default/microvmclusters"
        );
        let refused = cluster(
            version,
            "other-ns",
            "kube-system/host-tls",
            "kube-system/tokens",
        );
        let r = raw(
            &client,
            "POST",
            &path,
            Some("application/json"),
            refused.to_string().as_bytes(),
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
        let invalid = |value: &str| format!("Invalid value: \"{value}\": {fix}");
        assert_eq!(
            causes,
            vec![
                (
                    "spec.placement.staticPool.basicAuthSecret".to_string(),
                    invalid("kube-system/tokens")
                ),
                (
                    "spec.tlsSecretRef".to_string(),
                    invalid("kube-system/host-tls")
                ),
            ],
            "{version}: {}",
            r.text
        );
        let message = r.body["message"].as_str().unwrap();
        assert!(
            message.contains(&format!(
                "spec.tlsSecretRef: {}",
                invalid("kube-system/host-tls")
            )),
            "{message}"
        );
        // Names in the MicrovmCluster's own namespace are what the field is for.
        let accepted = cluster(version, &format!("own-{version}"), "host-tls", "tokens");
        let r = raw(
            &client,
            "POST",
            &path,
            Some("application/json"),
            accepted.to_string().as_bytes(),
        )
        .await;
        if version == "v1alpha2" {
            assert_eq!(r.status, 201, "{}", r.text);
            // The cluster templates render an unset Secret as `null`: the real server runs no rule
            // on a null value, so the rule must not refuse it.
            let mut unset = cluster(version, "unset", "x", "x");
            unset["spec"]["tlsSecretRef"] = serde_json::Value::Null;
            unset["spec"]["placement"]["staticPool"]["basicAuthSecret"] = serde_json::Value::Null;
            let r = raw(
                &client,
                "POST",
                &path,
                Some("application/json"),
                unset.to_string().as_bytes(),
            )
            .await;
            assert_eq!(r.status, 201, "{}", r.text);
        } else {
            // Stored at v1alpha2 through the conversion webhook, which no test server runs: the
            // request passed validation and failed only at conversion.
            assert_ne!(r.status, 422, "{}", r.text);
        }
    }
}

crate::on_both_servers!(
    cel_rules_are_evaluated_with_old_self,
    a_microvm_cluster_cannot_name_a_secret_in_another_namespace,
    formats_int_or_string_and_unknown_fields_under_strict_decoding,
    every_invalid_field_is_named_in_one_answer,
    schema_validation_reports_422_with_field_paths,
    defaults_are_applied_and_unknown_fields_pruned,
);
