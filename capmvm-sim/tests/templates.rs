//! The shipped cluster templates are a user's, not the demo's: hosts, SSH key and control-plane
//! address are required variables (clusterctl refuses to generate without them), flintlock
//! credentials are optional variables wired to the MicrovmCluster, and every variable is documented
//! with its meaning in docs/templates.md.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};

use capmvm_api::MicrovmCluster;
use capmvm_sim::kube::{Emulator, EmulatorOptions};
use capmvm_sim::manifest;
use capmvm_sim::world::template_variables;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::PostParams;

const TEMPLATES: [&str; 2] = [
    "templates/cluster-template.yaml",
    "templates/cluster-template-machinepool.yaml",
];

/// The `clusterclass` flavor: the Cluster, and the ClusterClass clusterctl adds to it.
const CLUSTERCLASS_FLAVOR: &str = "templates/cluster-template-clusterclass.yaml";
const CLUSTERCLASS: &str = "templates/clusterclass-microvm.yaml";

fn repo_file(path: &str) -> String {
    std::fs::read_to_string(format!("{}/../{path}", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The MicrovmCluster `template` renders to with `vars`.
fn microvm_cluster(template: &str, vars: &BTreeMap<String, String>) -> MicrovmCluster {
    let objects =
        manifest::parse(&manifest::envsubst(&repo_file(template), vars).unwrap()).unwrap();
    let mc = objects
        .iter()
        .find(|o| o.types.as_ref().is_some_and(|t| t.kind == "MicrovmCluster"))
        .unwrap();
    serde_json::from_value(serde_json::to_value(mc).unwrap()).unwrap()
}

#[test]
fn hosts_key_and_vip_are_required_and_credentials_are_optional() {
    for template in TEMPLATES {
        let listed = manifest::variables(&repo_file(template)).unwrap();
        let required: BTreeSet<&str> = listed
            .iter()
            .filter(|(_, default)| default.is_none())
            .map(|(name, _)| name.as_str())
            .collect();
        assert_eq!(
            required,
            BTreeSet::from(["CONTROL_PLANE_VIP", "FLINTLOCK_HOSTS", "SSH_PUBLIC_KEY"]),
            "{template}"
        );
        // Optional, with a default YAML reads as null (the field left out): clusterctl takes an
        // empty default for no default, which would make them required.
        for credentials in ["FLINTLOCK_BASIC_AUTH_SECRET", "FLINTLOCK_TLS_SECRET"] {
            assert_eq!(
                listed.get(credentials),
                Some(&Some("null".to_string())),
                "{template}: {credentials} is optional, null by default"
            );
        }
        // Generating with defaults only is refused, naming a required variable.
        let err = manifest::envsubst(&repo_file(template), &BTreeMap::new()).unwrap_err();
        assert!(
            matches!(&err, manifest::Error::Unset(v) if required.contains(v.as_str())),
            "{template}: {err}"
        );
        // Nothing of the demo is left in the text.
        let text = repo_file(template);
        for demo in ["127.0.0.1:1909", "demo@capmvm", "10.10.0.100"] {
            assert!(!text.contains(demo), "{template} still holds {demo:?}");
        }
    }
}

#[test]
fn the_variables_fill_hosts_and_credentials_of_the_microvm_cluster() {
    let endpoints = [
        "192.168.10.11:9090".to_string(),
        "[fd00::5]:9090".to_string(),
    ];
    for template in TEMPLATES {
        let mut vars = template_variables(&endpoints);
        let plain = microvm_cluster(template, &vars);
        let pool = plain.spec.placement.static_pool.clone().unwrap();
        let got: Vec<&str> = pool.hosts.iter().map(|h| h.endpoint.as_str()).collect();
        assert_eq!(got, endpoints, "{template}");
        assert_eq!(pool.basic_auth_secret, None, "{template}");
        assert_eq!(plain.spec.tls_secret_ref, None, "{template}");
        capmvm_api::validation::validate_cluster(&plain).unwrap();

        vars.insert(
            "FLINTLOCK_BASIC_AUTH_SECRET".into(),
            "flintlock-tokens".into(),
        );
        vars.insert("FLINTLOCK_TLS_SECRET".into(), "flintlock-tls".into());
        let secured = microvm_cluster(template, &vars);
        assert_eq!(
            secured
                .spec
                .placement
                .static_pool
                .unwrap()
                .basic_auth_secret
                .as_deref(),
            Some("flintlock-tokens"),
            "{template}"
        );
        assert_eq!(
            secured.spec.tls_secret_ref.as_deref(),
            Some("flintlock-tls"),
            "{template}"
        );
    }
}

/// Every variable of every template has a row in docs/templates.md saying what it means.
#[test]
fn every_variable_is_documented_with_its_meaning() {
    let doc = repo_file("docs/templates.md");
    let rows: BTreeMap<String, String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| {
            let (name, rest) = l.split_once('`')?;
            let meaning = rest.trim_end_matches('|').rsplit('|').next()?.trim();
            Some((name.to_string(), meaning.to_string()))
        })
        .collect();
    for template in TEMPLATES
        .into_iter()
        .chain([CLUSTERCLASS_FLAVOR, CLUSTERCLASS])
    {
        for name in manifest::variables(&repo_file(template)).unwrap().keys() {
            let meaning = rows
                .get(name)
                .unwrap_or_else(|| panic!("{template}: {name} is not in docs/templates.md"));
            assert!(meaning.len() > 10, "{name}: {meaning:?}");
        }
    }
}

/// As the API server stores it: the empty credentials are no fields at all (a null of a
/// non-nullable field is dropped), the given ones are kept.
#[tokio::test]
async fn the_rendered_microvm_cluster_is_accepted_with_and_without_credentials() {
    let emulator = Emulator::start(EmulatorOptions::default()).await.unwrap();
    let client = emulator.client().unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in capmvm_api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let mut vars = template_variables(&["10.0.0.11:9090".to_string()]);
    let text = repo_file(TEMPLATES[0]);
    let plain = manifest::parse(&manifest::envsubst(&text, &vars).unwrap()).unwrap();
    let only_cluster = |objects: Vec<kube::api::DynamicObject>| -> Vec<kube::api::DynamicObject> {
        objects
            .into_iter()
            .filter(|o| o.types.as_ref().is_some_and(|t| t.kind == "MicrovmCluster"))
            .collect()
    };
    manifest::apply(&client, &only_cluster(plain))
        .await
        .unwrap();
    let api: Api<MicrovmCluster> = Api::namespaced(client.clone(), "default");
    let stored = api.get("demo").await.unwrap();
    assert_eq!(stored.spec.tls_secret_ref, None);
    assert_eq!(
        stored.spec.placement.static_pool.unwrap().basic_auth_secret,
        None
    );

    vars.insert("CLUSTER_NAME".into(), "secured".into());
    vars.insert(
        "FLINTLOCK_BASIC_AUTH_SECRET".into(),
        "flintlock-tokens".into(),
    );
    vars.insert("FLINTLOCK_TLS_SECRET".into(), "flintlock-tls".into());
    let secured = manifest::parse(&manifest::envsubst(&text, &vars).unwrap()).unwrap();
    manifest::apply(&client, &only_cluster(secured))
        .await
        .unwrap();
    let stored = api.get("secured").await.unwrap();
    assert_eq!(stored.spec.tls_secret_ref.as_deref(), Some("flintlock-tls"));
    assert_eq!(
        stored
            .spec
            .placement
            .static_pool
            .unwrap()
            .basic_auth_secret
            .as_deref(),
        Some("flintlock-tokens")
    );
    emulator.shutdown().await;
}

/// The `clusterclass` flavor asks for what the others ask for: hosts, SSH key and VIP required,
/// credentials optional (empty by default: a ClusterClass variable cannot be null); the class
/// itself has no clusterctl variable (one class serves many clusters).
#[test]
fn the_clusterclass_flavor_requires_hosts_key_and_vip() {
    let listed = manifest::variables(&repo_file(CLUSTERCLASS_FLAVOR)).unwrap();
    let required: BTreeSet<&str> = listed
        .iter()
        .filter(|(_, default)| default.is_none())
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(
        required,
        BTreeSet::from(["CONTROL_PLANE_VIP", "FLINTLOCK_HOSTS", "SSH_PUBLIC_KEY"])
    );
    for credentials in ["FLINTLOCK_BASIC_AUTH_SECRET", "FLINTLOCK_TLS_SECRET"] {
        assert_eq!(
            listed.get(credentials),
            Some(&Some("\"\"".to_string())),
            "{credentials} is optional, empty by default"
        );
    }
    assert!(
        manifest::variables(&repo_file(CLUSTERCLASS))
            .unwrap()
            .is_empty(),
        "the ClusterClass is the same for every cluster"
    );
}

/// The ClusterClass and the flavor agree: the Cluster sets every variable the class declares and
/// no other, and every variable a patch or its `enabledIf` reads is declared.
#[test]
fn the_cluster_sets_exactly_the_variables_the_class_declares_and_patches_use() {
    let class = manifest::parse(&repo_file(CLUSTERCLASS)).unwrap();
    let class = class
        .iter()
        .find(|o| o.types.as_ref().is_some_and(|t| t.kind == "ClusterClass"))
        .expect("a ClusterClass");
    let declared: BTreeSet<String> = class.data["spec"]["variables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect();
    let vars = template_variables(&["10.0.0.11:9090".to_string()]);
    let flavor =
        manifest::parse(&manifest::envsubst(&repo_file(CLUSTERCLASS_FLAVOR), &vars).unwrap())
            .unwrap();
    let cluster = flavor
        .iter()
        .find(|o| o.types.as_ref().is_some_and(|t| t.kind == "Cluster"))
        .expect("a Cluster");
    assert_eq!(
        cluster.data["spec"]["topology"]["classRef"]["name"],
        "microvm"
    );
    let set: BTreeSet<String> = cluster.data["spec"]["topology"]["variables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(set, declared, "the Cluster sets every declared variable");

    // What the patches read: `valueFrom.variable` and `.name` inside templates and enabledIf.
    let mut used = BTreeSet::new();
    let text = serde_json::to_string(&class.data["spec"]["patches"]).unwrap();
    for part in text.split("{{").skip(1) {
        let expr = part.split("}}").next().unwrap_or_default();
        for word in expr.split(|c: char| c.is_whitespace() || c == '(' || c == ')') {
            if let Some(name) = word.strip_prefix('.') {
                used.insert(name.to_string());
            }
        }
    }
    let patches = class.data["spec"]["patches"].as_array().unwrap();
    for patch in patches {
        for definition in patch["definitions"].as_array().unwrap() {
            for json_patch in definition["jsonPatches"].as_array().unwrap() {
                if let Some(v) = json_patch["valueFrom"]["variable"].as_str() {
                    used.insert(v.to_string());
                }
            }
        }
    }
    let undeclared: Vec<&String> = used.difference(&declared).collect();
    assert!(undeclared.is_empty(), "used, not declared: {undeclared:?}");
    let unused: Vec<&String> = declared.difference(&used).collect();
    assert!(unused.is_empty(), "declared, never used: {unused:?}");
}
