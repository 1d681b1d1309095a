//! What a user installs: `infrastructure-components.yaml`, its variables filled as clusterctl fills
//! them, applied to the API emulator the way `kubectl apply` resolves kinds. The emulator serves
//! namespaces and CRDs but not apps/v1, rbac.authorization.k8s.io/v1 nor ServiceAccounts; those
//! objects are checked for what clusterctl requires of them instead, and each unserved kind is named
//! in the output so a gap in the emulator shows.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use capmvm_api::{MicrovmCluster, MicrovmMachine, MicrovmMachineTemplate};
use capmvm_sim::kube::{Emulator, EmulatorOptions};
use capmvm_sim::manifest;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DynamicObject, ListParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::Discovery;
use kube::{Api, ResourceExt};

const PROVIDER_LABEL: &str = "cluster.x-k8s.io/provider";
const PROVIDER: &str = "infrastructure-microvm";
const NAMESPACE: &str = "capmvm-system";

fn components() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../infrastructure-components.yaml"
    ))
    .expect("infrastructure-components.yaml at the repository root")
}

/// The variables a user sets; everything else takes the file's defaults, as `clusterctl init` does.
fn user_variables() -> BTreeMap<String, String> {
    BTreeMap::from([(
        "CAPMVM_IMAGE".to_string(),
        "registry.example/capmvm-operator:dev".to_string(),
    )])
}

#[test]
fn the_image_is_required_and_every_other_variable_has_a_default() {
    let text = components();
    let err = manifest::envsubst(&text, &BTreeMap::new()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "variable CAPMVM_IMAGE is not set and has no default (write ${CAPMVM_IMAGE:=value})"
    );
    let filled = manifest::envsubst(&text, &user_variables()).unwrap();
    assert!(!filled.contains("${"), "a variable is left unfilled");
}

#[test]
fn every_object_is_labelled_for_clusterctl_and_the_deployment_runs_the_manager() {
    let objects =
        manifest::parse(&manifest::envsubst(&components(), &user_variables()).unwrap()).unwrap();
    let kinds: Vec<String> = objects
        .iter()
        .map(|o| o.types.clone().unwrap().kind)
        .collect();
    assert_eq!(
        kinds.iter().filter(|k| *k == "Namespace").count(),
        1,
        "clusterctl takes exactly one Namespace as the target namespace"
    );
    for o in &objects {
        let what = format!("{}/{}", o.types.clone().unwrap().kind, o.name_any());
        assert_eq!(
            o.labels().get(PROVIDER_LABEL).map(String::as_str),
            Some(PROVIDER),
            "{what}"
        );
        if let Some(ns) = o.namespace() {
            assert_eq!(ns, NAMESPACE, "{what}");
        }
    }
    for kind in [
        "ServiceAccount",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ] {
        assert!(kinds.iter().any(|k| k == kind), "no {kind}");
    }
    // The operator's; the cluster-autoscaler's, with the reader of our objects aggregated into it;
    // and the one CAPI core aggregates.
    let mut cluster_roles: Vec<String> = objects
        .iter()
        .filter(|o| o.types.as_ref().is_some_and(|t| t.kind == "ClusterRole"))
        .map(|o| o.name_any())
        .collect();
    cluster_roles.sort();
    assert_eq!(
        cluster_roles,
        [
            "capmvm-capi-manager",
            "capmvm-cluster-autoscaler",
            "capmvm-cluster-autoscaler-reader",
            "capmvm-manager-role",
        ]
    );
    let aggregated = objects
        .iter()
        .find(|o| o.name_any() == "capmvm-capi-manager")
        .expect("a ClusterRole for CAPI core");
    assert_eq!(
        aggregated
            .labels()
            .get("cluster.x-k8s.io/aggregate-to-manager")
            .map(String::as_str),
        Some("true")
    );
    for kind in [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        assert!(
            kinds.iter().any(|k| k == kind),
            "no {kind}: the templates' immutability"
        );
    }

    let deployment = objects
        .iter()
        .find(|o| o.types.as_ref().unwrap().kind == "Deployment")
        .unwrap();
    let deployment: Deployment =
        serde_json::from_value(serde_json::to_value(deployment).unwrap()).unwrap();
    let pod = deployment.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some("capmvm-manager"));
    let manager = &pod.containers[0];
    assert_eq!(manager.name, "manager");
    assert_eq!(
        manager.image.as_deref(),
        Some("registry.example/capmvm-operator:dev")
    );
    let probe_path = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        p.as_ref()
            .and_then(|p| p.http_get.as_ref())
            .and_then(|h| h.path.clone())
    };
    assert_eq!(
        probe_path(&manager.liveness_probe).as_deref(),
        Some("/healthz")
    );
    assert_eq!(
        probe_path(&manager.readiness_probe).as_deref(),
        Some("/readyz")
    );
    let args = manager.args.clone().unwrap();
    assert!(args.contains(&"--log-level=info".to_string()), "{args:?}");
    // clusterctl takes an empty default for none: every variable's default is a value.
    assert!(
        args.iter().all(|a| !a.contains(":=}")),
        "an empty default: {args:?}"
    );
}

#[tokio::test]
async fn the_components_apply_and_the_crds_are_served() {
    let emulator = Emulator::start(EmulatorOptions::default()).await.unwrap();
    let client = emulator.client().unwrap();
    let objects =
        manifest::parse(&manifest::envsubst(&components(), &user_variables()).unwrap()).unwrap();

    // Apply what the server serves, as `kubectl apply` would; name the rest.
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    let mut unserved = Vec::new();
    for o in &objects {
        let types = o.types.clone().unwrap();
        let gvk = GroupVersionKind::try_from(&types).unwrap();
        if discovery.resolve_gvk(&gvk).is_none() {
            let kind = format!("{}/{}", types.api_version, types.kind);
            if !unserved.contains(&kind) {
                unserved.push(kind);
            }
            continue;
        }
        manifest::apply(&client, std::slice::from_ref(o))
            .await
            .unwrap_or_else(|e| panic!("{}/{} refused: {e}", types.kind, o.name_any()));
    }
    eprintln!("not served by the emulator, checked offline only: {unserved:?}");
    for served in [
        "v1/Namespace",
        "apiextensions.k8s.io/v1/CustomResourceDefinition",
    ] {
        assert!(!unserved.iter().any(|u| u == served), "{served} unserved");
    }

    // The CRDs are served with the labels CAPI and clusterctl read, and their kinds accept objects.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in [
        "microvmclusters.infrastructure.cluster.x-k8s.io",
        "microvmmachines.infrastructure.cluster.x-k8s.io",
        "microvmmachinetemplates.infrastructure.cluster.x-k8s.io",
    ] {
        let crd = crds.get(name).await.unwrap();
        assert_eq!(
            crd.labels()
                .get("cluster.x-k8s.io/v1beta2")
                .map(String::as_str),
            Some("v1alpha2"),
            "{name}: the contract label"
        );
        assert_eq!(
            crd.labels().get(PROVIDER_LABEL).map(String::as_str),
            Some(PROVIDER)
        );
    }
    let clusters: Api<MicrovmCluster> = Api::namespaced(client.clone(), NAMESPACE);
    let machines: Api<MicrovmMachine> = Api::namespaced(client.clone(), NAMESPACE);
    assert!(
        clusters
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    assert!(
        machines
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    // The example template, as committed, is accepted by the installed CRD.
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/microvmmachinetemplate.yaml"
    ))
    .unwrap();
    let mut template: DynamicObject = manifest::parse(&example).unwrap().remove(0);
    template.metadata.namespace = Some(NAMESPACE.to_string());
    let templates: Api<MicrovmMachineTemplate> = Api::namespaced(client.clone(), NAMESPACE);
    let template: MicrovmMachineTemplate =
        serde_json::from_value(serde_json::to_value(&template).unwrap()).unwrap();
    templates
        .create(&PostParams::default(), &template)
        .await
        .unwrap();

    // Applying again changes nothing and fails nothing (an upgrade re-applies the same file).
    for o in objects.iter().filter(|o| {
        let types = o.types.clone().unwrap();
        discovery
            .resolve_gvk(&GroupVersionKind::try_from(&types).unwrap())
            .is_some()
    }) {
        manifest::apply(&client, std::slice::from_ref(o))
            .await
            .unwrap();
    }
    emulator.shutdown().await;
}

/// A host endpoint that is not `host:port` is refused by the API server when the MicrovmCluster is
/// applied, naming the host (its index and value) and the form to write, as every other field's
/// shape is; it never reaches the operator to sit waiting. Endpoints of every accepted form pass.
#[tokio::test]
async fn a_host_endpoint_that_is_not_host_and_port_is_refused_at_admission() {
    let emulator = Emulator::start(EmulatorOptions::default()).await.unwrap();
    let client = emulator.client().unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in capmvm_api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let clusters: Api<MicrovmCluster> = Api::namespaced(client.clone(), "default");
    let cluster = |name: &str, endpoints: &[&str]| -> MicrovmCluster {
        let hosts: Vec<serde_json::Value> = endpoints
            .iter()
            .map(|e| serde_json::json!({"endpoint": e}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha2",
            "kind": "MicrovmCluster",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"placement": {"staticPool": {"hosts": hosts}}},
        }))
        .unwrap()
    };
    for (bad, why) in [
        ("not a host", "spaces"),
        ("10.0.0.5", "no port"),
        ("http://10.0.0.5:9090", "a URL"),
        ("fd00::5:9090", "IPv6 without brackets"),
        ("host_a:9090", "not a DNS name"),
    ] {
        let err = clusters
            .create(
                &PostParams::default(),
                &cluster("bad", &["10.0.0.4:9090", bad]),
            )
            .await
            .expect_err(why);
        let kube::Error::Api(status) = err else {
            panic!("{why}: {err}");
        };
        assert_eq!(status.code, 422, "{why}: {status:?}");
        assert!(
            status
                .message
                .contains("spec.placement.staticPool.hosts[1].endpoint")
                && status.message.contains(&format!("{bad:?}")),
            "{why}: the message names the host: {}",
            status.message
        );
    }
    clusters
        .create(
            &PostParams::default(),
            &cluster(
                "good",
                &["10.0.0.5:9090", "host-a.example.com:443", "[fd00::5]:9090"],
            ),
        )
        .await
        .unwrap();
    emulator.shutdown().await;
}
