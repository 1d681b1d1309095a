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
    for template in TEMPLATES {
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
