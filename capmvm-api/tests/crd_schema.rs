//! The generated CRDs are what the CAPI contract and the API server require: structural schemas whose
//! defaults are valid, the contract label, names CAPI can compute, printer columns, status subresources.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code

use capmvm_api::crds;
use serde_json::Value;

/// Checks the rules of a structural schema (Kubernetes "Specifying a structural schema") at `node` and
/// below, collecting violations with their schema path.
fn check_structural(node: &Value, path: &str, errors: &mut Vec<String>) {
    let Some(obj) = node.as_object() else {
        errors.push(format!("{path}: schema is not an object"));
        return;
    };
    for forbidden in [
        "$ref",
        "allOf",
        "anyOf",
        "oneOf",
        "not",
        "definitions",
        "$defs",
    ] {
        if obj.contains_key(forbidden) {
            errors.push(format!(
                "{path}: uses {forbidden}, which a structural schema may not"
            ));
        }
    }
    let preserves = obj.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    let int_or_string = obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    let ty = obj.get("type").and_then(Value::as_str);
    if ty.is_none() && !preserves && !int_or_string {
        errors.push(format!("{path}: has no type"));
    }
    if obj.get("type").is_some_and(|t| !t.is_string()) {
        errors.push(format!("{path}: type is not a single string"));
    }
    if obj.contains_key("properties") && obj.contains_key("additionalProperties") {
        errors.push(format!(
            "{path}: has both properties and additionalProperties"
        ));
    }
    if ty == Some("array") && !obj.contains_key("items") {
        errors.push(format!("{path}: array without items"));
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (name, sub) in props {
            check_structural(sub, &format!("{path}.{name}"), errors);
        }
    }
    if let Some(required) = obj.get("required").and_then(Value::as_array) {
        for r in required {
            let name = r.as_str().unwrap_or_default();
            if obj.get("properties").and_then(|p| p.get(name)).is_none() {
                errors.push(format!("{path}: requires {name}, which is not a property"));
            }
        }
    }
    if let Some(items) = obj.get("items") {
        check_structural(items, &format!("{path}[]"), errors);
        if obj.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("map") {
            let keys = obj["x-kubernetes-list-map-keys"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if keys.is_empty() {
                errors.push(format!("{path}: list-type map without list-map-keys"));
            }
            for key in keys {
                let key = key.as_str().unwrap_or_default();
                let required = items["required"]
                    .as_array()
                    .is_some_and(|r| r.iter().any(|k| k == key));
                let defaulted = items["properties"][key].get("default").is_some();
                if !required && !defaulted {
                    errors.push(format!(
                        "{path}: list-map key {key} is neither required nor defaulted"
                    ));
                }
            }
        }
    }
    if let Some(additional) = obj.get("additionalProperties")
        && additional.is_object()
    {
        check_structural(additional, &format!("{path}.*"), errors);
    }
    if let Some(default) = obj.get("default") {
        for e in validate_value(default, node, &format!("{path} (default)")) {
            errors.push(e);
        }
    }
}

/// A small OpenAPI v3 validator, enough to check default values: type, enum, bounds, lengths, pattern.
fn validate_value(value: &Value, schema: &Value, path: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.is_null() {
        if schema.get("nullable") != Some(&Value::Bool(true)) {
            errors.push(format!("{path}: null where the schema is not nullable"));
        }
        return errors;
    }
    let type_ok = match schema.get("type").and_then(Value::as_str) {
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        Some("array") => value.is_array(),
        Some("object") => value.is_object(),
        _ => true,
    };
    if !type_ok {
        errors.push(format!("{path}: {value} is not of type {}", schema["type"]));
        return errors;
    }
    if let Some(choices) = schema.get("enum").and_then(Value::as_array)
        && !choices.contains(value)
    {
        errors.push(format!("{path}: {value} is not one of {choices:?}"));
    }
    if let Some(n) = value.as_f64() {
        if schema
            .get("minimum")
            .and_then(Value::as_f64)
            .is_some_and(|m| n < m)
        {
            errors.push(format!("{path}: {n} is below minimum"));
        }
        if schema
            .get("maximum")
            .and_then(Value::as_f64)
            .is_some_and(|m| n > m)
        {
            errors.push(format!("{path}: {n} is above maximum"));
        }
    }
    if let Some(s) = value.as_str() {
        let len = s.chars().count() as u64;
        if schema
            .get("minLength")
            .and_then(Value::as_u64)
            .is_some_and(|m| len < m)
        {
            errors.push(format!("{path}: shorter than minLength"));
        }
        if schema
            .get("maxLength")
            .and_then(Value::as_u64)
            .is_some_and(|m| len > m)
        {
            errors.push(format!("{path}: longer than maxLength"));
        }
        if let Some(p) = schema.get("pattern").and_then(Value::as_str)
            && !regex::Regex::new(p).unwrap().is_match(s)
        {
            errors.push(format!("{path}: {s:?} does not match {p}"));
        }
    }
    if let (Some(obj), Some(props)) = (
        value.as_object(),
        schema.get("properties").and_then(Value::as_object),
    ) {
        for (k, v) in obj {
            match props.get(k) {
                Some(sub) => errors.extend(validate_value(v, sub, &format!("{path}.{k}"))),
                None => errors.push(format!("{path}: unknown field {k}")),
            }
        }
    }
    if let (Some(items), Some(item_schema)) = (value.as_array(), schema.get("items")) {
        for (i, v) in items.iter().enumerate() {
            errors.extend(validate_value(v, item_schema, &format!("{path}[{i}]")));
        }
    }
    errors
}

#[test]
fn schemas_are_structural_and_defaults_are_valid() {
    for crd in crds() {
        let crd = serde_json::to_value(&crd).unwrap();
        let name = crd["metadata"]["name"].as_str().unwrap().to_string();
        for version in crd["spec"]["versions"].as_array().unwrap() {
            let schema = &version["schema"]["openAPIV3Schema"];
            let mut errors = Vec::new();
            check_structural(schema, &name, &mut errors);
            assert!(
                errors.is_empty(),
                "{name} is not structural:\n{}",
                errors.join("\n")
            );
            // The defaults we rely on are really there.
            assert!(
                !schema["properties"]["spec"].is_null(),
                "{name} has a spec schema"
            );
        }
    }
}

#[test]
fn defaults_the_api_relies_on_are_in_the_schema() {
    let all: Vec<Value> = crds()
        .iter()
        .map(|c| serde_json::to_value(c).unwrap())
        .collect();
    let schema = |i: usize| all[i]["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone();
    let host = &schema(0)["properties"]["spec"]["properties"]["placement"]["properties"]["staticPool"]
        ["properties"]["hosts"]["items"];
    assert_eq!(
        host["properties"]["controlplaneAllowed"]["default"],
        Value::Bool(true)
    );
    let nic = &schema(1)["properties"]["spec"]["properties"]["networkInterfaces"]["items"];
    assert_eq!(nic["properties"]["type"]["default"], "tap");
    assert_eq!(
        nic["properties"]["guestDeviceName"]["pattern"],
        "^[a-z][a-z0-9_]*$"
    );
    let spec = &schema(1)["properties"]["spec"]["properties"];
    assert_eq!(spec["vcpu"]["minimum"].as_f64(), Some(1.0));
    assert_eq!(spec["vcpu"]["maximum"].as_f64(), Some(64.0));
    assert_eq!(spec["memoryMb"]["minimum"].as_f64(), Some(1024.0));
    assert_eq!(spec["memoryMb"]["maximum"].as_f64(), Some(32768.0));
    assert_eq!(spec["networkInterfaces"]["minItems"], 1);
    let fds = &schema(0)["properties"]["status"]["properties"]["failureDomains"];
    assert_eq!(fds["maxItems"], 100);
    assert_eq!(fds["x-kubernetes-list-type"], "map");
}

/// The endpoint's schema pattern (what the API server checks at admission) lets through every
/// endpoint the parser accepts in canonical form, and refuses what is not `host:port` at all.
#[test]
fn the_endpoint_pattern_agrees_with_the_parser() {
    let cluster = serde_json::to_value(&crds()[0]).unwrap();
    let host = &cluster["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["placement"]["properties"]["staticPool"]["properties"]["hosts"]["items"];
    let pattern =
        regex::Regex::new(host["properties"]["endpoint"]["pattern"].as_str().unwrap()).unwrap();
    for accepted in [
        "10.0.0.5:9090",
        "host-a.example.com:443",
        "[fd00::5]:9090",
        "[::ffff:10.0.0.1]:1",
        "localhost:65535",
        "A1.b-2.C:9090",
    ] {
        let parsed: capmvm_api::HostEndpoint = accepted.parse().unwrap();
        assert_eq!(parsed.to_string(), accepted, "canonical");
        assert!(pattern.is_match(accepted), "{accepted}");
    }
    for refused in [
        "not a host",
        "10.0.0.5",
        "http://10.0.0.5:9090",
        "fd00::5:9090",
        "host_a:9090",
        "-host:9090",
        "host.:9090",
        ":9090",
        "host:",
        "",
    ] {
        assert!(
            refused.parse::<capmvm_api::HostEndpoint>().is_err(),
            "{refused}"
        );
        assert!(!pattern.is_match(refused), "{refused}");
    }
}

#[test]
fn crd_metadata_follows_the_capi_contract() {
    let expected = [
        (
            "microvmclusters.infrastructure.cluster.x-k8s.io",
            "mvmc",
            vec!["Cluster", "Ready", "Endpoint", "Age"],
        ),
        (
            "microvmmachines.infrastructure.cluster.x-k8s.io",
            "mvmm",
            vec!["Cluster", "Host", "State", "ProviderID", "Ready", "Age"],
        ),
        (
            "microvmmachinetemplates.infrastructure.cluster.x-k8s.io",
            "mvmmt",
            vec!["CPU", "Memory", "Age"],
        ),
    ];
    for (crd, (name, short, columns)) in crds().iter().zip(expected) {
        let crd = serde_json::to_value(crd).unwrap();
        assert_eq!(crd["metadata"]["name"], name);
        assert_eq!(
            crd["metadata"]["labels"]["cluster.x-k8s.io/v1beta2"],
            "v1alpha2"
        );
        assert_eq!(crd["spec"]["scope"], "Namespaced");
        assert_eq!(
            crd["spec"]["names"]["shortNames"],
            serde_json::json!([short])
        );
        assert_eq!(
            crd["spec"]["names"]["categories"],
            serde_json::json!(["cluster-api"])
        );
        let version = &crd["spec"]["versions"][0];
        assert_eq!(version["name"], "v1alpha2");
        assert_eq!(version["served"], true);
        assert_eq!(version["storage"], true);
        assert_eq!(version["subresources"]["status"], serde_json::json!({}));
        let got: Vec<&str> = version["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(got, columns, "{name} printer columns");
    }
}

#[test]
fn check_structural_catches_violations() {
    // The checker itself must be able to fail, or the tests above prove nothing.
    let bad = serde_json::json!({
        "type": "object",
        "properties": {
            "untyped": {"description": "no type"},
            "list": {"type": "array"},
            "flag": {"type": "boolean", "default": "yes"},
            "port": {"type": "integer", "minimum": 1, "default": 0},
            "conds": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"],
                      "items": {"type": "object", "properties": {"type": {"type": "string"}}}},
            "ref": {"$ref": "#/definitions/X"}
        }
    });
    let mut errors = Vec::new();
    check_structural(&bad, "bad", &mut errors);
    let text = errors.join("\n");
    for needle in [
        "untyped: has no type",
        "list: array without items",
        "flag (default)",
        "port (default)",
        "list-map key type",
        "uses $ref",
    ] {
        assert!(
            text.contains(needle),
            "checker missed {needle:?} in:\n{text}"
        );
    }
}

/// MicrovmCluster, MicrovmMachine and MicrovmMachineTemplate serve the Go provider's v1alpha1
/// beside v1alpha2 (the one stored), converted by the operator's webhook behind its Service, whose
/// CA cert-manager injects; the pool and the ClusterClass templates, new in v1alpha2 (the Go
/// provider had none), have no other version.
#[test]
fn the_go_providers_kinds_serve_v1alpha1_through_the_conversion_webhook() {
    for crd in crds() {
        let crd = serde_json::to_value(&crd).unwrap();
        let name = crd["metadata"]["name"].as_str().unwrap();
        let versions: Vec<(&str, bool, bool)> = crd["spec"]["versions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                (
                    v["name"].as_str().unwrap(),
                    v["served"].as_bool().unwrap(),
                    v["storage"].as_bool().unwrap(),
                )
            })
            .collect();
        if [
            "microvmmachinepools.",
            "microvmclustertemplates.",
            "microvmmachinepooltemplates.",
        ]
        .iter()
        .any(|p| name.starts_with(p))
        {
            assert_eq!(versions, [("v1alpha2", true, true)]);
            assert!(crd["spec"]["conversion"].is_null(), "{name}");
            continue;
        }
        assert_eq!(
            versions,
            [("v1alpha2", true, true), ("v1alpha1", true, false)],
            "{name}"
        );
        assert_eq!(
            crd["spec"]["conversion"],
            serde_json::json!({
                "strategy": "Webhook",
                "webhook": {
                    "conversionReviewVersions": ["v1"],
                    "clientConfig": {"service": {
                        "namespace": "capmvm-system",
                        "name": "capmvm-webhook-service",
                        "path": "/convert",
                    }},
                },
            }),
            "{name}"
        );
        assert_eq!(
            crd["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            "capmvm-system/capmvm-serving-cert",
            "{name}"
        );
    }
}

/// The v1alpha1 schema is the Go provider's: its required fields, bounds and defaults.
#[test]
fn the_v1alpha1_schema_is_the_go_providers() {
    let all: Vec<Value> = crds()
        .iter()
        .map(|c| serde_json::to_value(c).unwrap())
        .collect();
    let v1 = |i: usize| {
        all[i]["spec"]["versions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "v1alpha1")
            .unwrap()["schema"]["openAPIV3Schema"]
            .clone()
    };
    let cluster = v1(0);
    let spec = &cluster["properties"]["spec"];
    assert_eq!(spec["required"], serde_json::json!(["placement"]));
    let endpoint = &spec["properties"]["controlPlaneEndpoint"];
    assert_eq!(endpoint["required"], serde_json::json!(["host", "port"]));
    assert!(endpoint.get("default").is_none(), "no default: {endpoint}");
    let host = &spec["properties"]["placement"]["properties"]["staticPool"]["properties"]["hosts"]
        ["items"];
    assert_eq!(
        host["required"],
        serde_json::json!(["controlplaneAllowed", "endpoint"])
    );
    assert_eq!(host["properties"]["controlplaneAllowed"]["default"], true);
    assert!(
        host["properties"].get("failureDomain").is_none(),
        "a v1alpha2 field"
    );
    let status = &cluster["properties"]["status"]["properties"];
    assert_eq!(status["ready"]["default"], false);
    assert_eq!(status["failureDomains"]["type"], "object", "a map");

    let machine = v1(1);
    let spec = &machine["properties"]["spec"];
    assert_eq!(
        spec["required"],
        serde_json::json!([
            "kernel",
            "memoryMb",
            "networkInterfaces",
            "rootVolume",
            "vcpu"
        ])
    );
    assert_eq!(spec["properties"]["vcpu"]["minimum"].as_f64(), Some(1.0));
    assert!(spec["properties"]["vcpu"].get("maximum").is_none());
    assert_eq!(spec["properties"]["provider"]["type"], "string");
    assert!(spec["properties"]["provider"].get("enum").is_none());
    let nic = &spec["properties"]["networkInterfaces"]["items"];
    assert_eq!(
        nic["required"],
        serde_json::json!(["guestDeviceName", "type"])
    );
    assert_eq!(
        nic["properties"]["type"]["enum"],
        serde_json::json!(["macvtap", "tap"])
    );
    assert_eq!(
        spec["properties"]["rootVolume"]["properties"]["readOnly"]["default"],
        false
    );
    let conditions = &machine["properties"]["status"]["properties"]["conditions"]["items"];
    assert_eq!(
        conditions["required"],
        serde_json::json!(["lastTransitionTime", "status", "type"])
    );
    assert!(conditions["properties"]["severity"].is_object());

    let template = v1(2);
    assert!(template["properties"].get("status").is_none(), "no status");
}

/// The CRDs as the Go provider installed them: v1alpha1 alone, labelled with the v1beta1 contract.
#[test]
fn the_go_providers_own_crds_have_v1alpha1_alone() {
    for crd in capmvm_api::v1alpha1::crds() {
        let crd = serde_json::to_value(&crd).unwrap();
        let versions = crd["spec"]["versions"].as_array().unwrap();
        assert_eq!(versions.len(), 1);
        assert_eq!(versions[0]["name"], "v1alpha1");
        assert_eq!(versions[0]["storage"], true);
        assert_eq!(
            crd["metadata"]["labels"]["cluster.x-k8s.io/v1beta1"],
            "v1alpha1"
        );
        assert!(
            crd["metadata"]["labels"]
                .get("cluster.x-k8s.io/v1beta2")
                .is_none()
        );
        assert!(crd["spec"]["conversion"].is_null());
    }
}

/// CAPI's InfraClusterTemplate and InfraMachinePoolTemplate contracts, which ClusterClass needs:
/// `<Kind>Template`, namespaced, the contract label, `spec.template.spec` the very spec of the kind
/// it clones (so every field of a MicrovmCluster can be set from a ClusterClass) and an optional
/// `spec.template.metadata`.
#[test]
fn the_clusterclass_templates_follow_capis_template_contract() {
    let all: Vec<Value> = crds()
        .iter()
        .map(|c| serde_json::to_value(c).unwrap())
        .collect();
    let named = |name: &str| {
        all.iter()
            .find(|c| c["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no CRD {name}"))
    };
    let schema = |crd: &Value| crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone();
    for (kind, template) in [
        ("microvmclusters", "microvmclustertemplates"),
        ("microvmmachinepools", "microvmmachinepooltemplates"),
    ] {
        let object = named(&format!("{kind}.infrastructure.cluster.x-k8s.io"));
        let template = named(&format!("{template}.infrastructure.cluster.x-k8s.io"));
        assert_eq!(
            template["spec"]["names"]["kind"],
            format!(
                "{}Template",
                object["spec"]["names"]["kind"].as_str().unwrap()
            )
        );
        assert_eq!(template["spec"]["scope"], "Namespaced");
        assert_eq!(
            template["metadata"]["labels"]["cluster.x-k8s.io/v1beta2"],
            "v1alpha2"
        );
        let inner = &schema(template)["properties"]["spec"]["properties"]["template"];
        assert_eq!(inner["required"], serde_json::json!(["spec"]), "{template}");
        let mut want = schema(object)["properties"]["spec"].clone();
        let mut got = inner["properties"]["spec"].clone();
        // Descriptions differ (the template's field is documented as the clone's spec).
        want["description"] = Value::Null;
        got["description"] = Value::Null;
        assert_eq!(
            got, want,
            "{template}: spec.template.spec is the {kind} spec"
        );
        assert!(inner["properties"]["metadata"].is_object(), "{template}");
    }
}

/// The README tells users to stop serving `v1alpha1` with a JSON patch of `/spec/versions/1/served`:
/// that entry must be `v1alpha1`, served and not stored, on every CRD that has it.
#[test]
fn v1alpha1_is_the_second_version_where_served() {
    let with_v1alpha1: Vec<_> = crds()
        .into_iter()
        .filter(|c| c.spec.versions.iter().any(|v| v.name == "v1alpha1"))
        .collect();
    assert_eq!(
        with_v1alpha1.len(),
        3,
        "MicrovmCluster, MicrovmMachine, MicrovmMachineTemplate"
    );
    for crd in with_v1alpha1 {
        let v = &crd.spec.versions[1];
        assert_eq!(v.name, "v1alpha1", "{:?}", crd.metadata.name);
        assert!(v.served && !v.storage, "{:?}", crd.metadata.name);
    }
}
