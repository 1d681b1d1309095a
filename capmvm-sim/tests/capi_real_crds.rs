//! What a real management cluster would say: every object of `templates/` and `examples/`, and every
//! object the CAPI stand-in writes (captured from a converged world), is created and its status
//! written on an emulator serving CAPI v1.14's own CRDs with `fieldValidation=Strict`: no error, no
//! warning, nothing pruned. Runs where CAPI's CRDs are present (CI and development machines:
//! `../shared/capi-crds`, or `CAPMVM_SHARED_DIR`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod e2e_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use capmvm_sim::capi;
use capmvm_sim::kube::{Emulator, EmulatorOptions};
use capmvm_sim::manifest;
use capmvm_sim::world::wait_for;
use e2e_support::*;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

/// Raw requests through the kube client, with the answer's warnings.
mod raw {
    use serde_json::Value;

    pub(super) struct Answer {
        pub(super) status: u16,
        pub(super) warnings: Vec<String>,
        pub(super) body: Value,
        pub(super) text: String,
    }

    pub(super) async fn send(
        client: &kube::Client,
        method: &str,
        path: &str,
        body: &Value,
    ) -> Answer {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(kube::client::Body::from(serde_json::to_vec(body).unwrap()))
            .unwrap();
        let resp = client.send(req).await.unwrap();
        let status = resp.status().as_u16();
        let warnings = resp
            .headers()
            .get_all("warning")
            .iter()
            .filter_map(|v| v.to_str().ok().map(String::from))
            .collect();
        let bytes = resp.into_body().collect_bytes().await.unwrap();
        Answer {
            status,
            warnings,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            text: String::from_utf8_lossy(&bytes).into_owned(),
        }
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// An emulator serving the project's CRDs and CAPI's own; `webhooks` registers CAPI's defaulting.
async fn capi_emulator(
    test: &str,
    webhooks: bool,
) -> Option<(capmvm_sim::kube::EmulatorHandle, kube::Client)> {
    let dir = capi::real_crds_dir_or_skip(test)?;
    let emulator = Emulator::start(EmulatorOptions::default()).await.unwrap();
    let client = emulator.client().unwrap();
    if webhooks {
        capi::admission::register(&emulator.admission());
    }
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in capmvm_api::crds()
        .into_iter()
        .chain(capi::read_crds(&dir).unwrap())
    {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    Some((emulator, client))
}

/// The collection path of an object (namespaced, in `default` unless it says otherwise).
fn collection(obj: &Value) -> String {
    let api_version = obj["apiVersion"].as_str().unwrap();
    let kind = obj["kind"].as_str().unwrap();
    let ns = obj["metadata"]["namespace"].as_str().unwrap_or("default");
    let plural = format!("{}s", kind.to_lowercase());
    format!("/apis/{api_version}/namespaces/{ns}/{plural}")
}

/// Creates `obj` with `fieldValidation=Strict`; asserts 201 and no warning. Returns the stored object.
async fn create_strict(client: &kube::Client, obj: &Value, what: &str) -> Value {
    let path = format!("{}?fieldValidation=Strict", collection(obj));
    let answer = raw::send(client, "POST", &path, obj).await;
    assert_eq!(answer.status, 201, "{what}: {}", answer.text);
    assert!(answer.warnings.is_empty(), "{what}: {:?}", answer.warnings);
    answer.body
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml") {
            out.push(path);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_object_of_templates_and_examples_validates_against_capi_crds() {
    // Manifests are written for a real management cluster: CAPI's webhooks default them there.
    let Some((emulator, client)) = capi_emulator(
        "every_object_of_templates_and_examples_validates_against_capi_crds",
        true,
    )
    .await
    else {
        return;
    };
    let mut files = Vec::new();
    yaml_files(&repo_root().join("templates"), &mut files);
    yaml_files(&repo_root().join("examples"), &mut files);
    // The clusterclass flavor needs CAPI's ClusterClass and KubeadmControlPlaneTemplate CRDs and
    // its topology webhooks, which are not among these CRDs: the real API server and CAPI check it
    // in tests/clusterclass.rs.
    files.retain(|f| {
        !f.file_name()
            .is_some_and(|n| n.to_string_lossy().contains("clusterclass"))
    });
    files.sort();
    assert!(
        files
            .iter()
            .any(|f| f.ends_with("templates/cluster-template.yaml")),
        "{files:?}"
    );
    assert!(
        files
            .iter()
            .any(|f| f.ends_with("templates/cluster-template-machinepool.yaml")),
        "{files:?}"
    );
    let mut kinds = Vec::new();
    for file in &files {
        // Filled as clusterctl fills them: the required variables given, the defaults for the rest.
        let vars = capmvm_sim::world::template_variables(&["10.0.0.11:9090".into()]);
        let text = manifest::envsubst(&std::fs::read_to_string(file).unwrap(), &vars).unwrap();
        for obj in manifest::parse(&text).unwrap() {
            let value = serde_json::to_value(&obj).unwrap();
            let what = format!(
                "{}: {} {}",
                file.display(),
                value["kind"],
                value["metadata"]["name"]
            );
            // Examples of every kind may reuse names across files: each file gets its own namespace.
            let ns = format!("ns-{}", kinds.len());
            raw::send(
                &client,
                "POST",
                "/api/v1/namespaces",
                &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            )
            .await;
            let mut value = value;
            value["metadata"]["namespace"] = json!(ns);
            create_strict(&client, &value, &what).await;
            kinds.push(value["kind"].as_str().unwrap().to_string());
        }
    }
    for kind in [
        "Cluster",
        "KubeadmControlPlane",
        "KubeadmConfigTemplate",
        "MachineDeployment",
        "MicrovmCluster",
        "MicrovmMachineTemplate",
        "MicrovmMachine",
        "MachinePool",
        "MicrovmMachinePool",
        "KubeadmConfig",
    ] {
        assert!(kinds.iter().any(|k| k == kind), "{kind} in {kinds:?}");
    }
    emulator.shutdown().await;
}

/// Each kind the stand-in (and the operator) writes: its list path in the world.
const WRITTEN: &[(&str, &str)] = &[
    ("cluster.x-k8s.io/v1beta2", "clusters"),
    ("cluster.x-k8s.io/v1beta2", "machines"),
    ("cluster.x-k8s.io/v1beta2", "machinedeployments"),
    (
        "controlplane.cluster.x-k8s.io/v1beta2",
        "kubeadmcontrolplanes",
    ),
    ("bootstrap.cluster.x-k8s.io/v1beta2", "kubeadmconfigs"),
    (
        "bootstrap.cluster.x-k8s.io/v1beta2",
        "kubeadmconfigtemplates",
    ),
    (
        "infrastructure.cluster.x-k8s.io/v1alpha2",
        "microvmclusters",
    ),
    (
        "infrastructure.cluster.x-k8s.io/v1alpha2",
        "microvmmachines",
    ),
    (
        "infrastructure.cluster.x-k8s.io/v1alpha2",
        "microvmmachinetemplates",
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_object_the_stand_in_writes_validates_against_capi_crds() {
    // No webhooks here: what the stand-in stored must be valid as it is.
    let Some((emulator, target)) = capi_emulator(
        "every_object_the_stand_in_writes_validates_against_capi_crds",
        false,
    )
    .await
    else {
        return;
    };
    let w = world(options(3)).await;
    w.apply_demo_cluster(&counts(1, 2), |_| {}).await.unwrap();
    wait_ready_within(&w, 3, WAIT).await;
    wait_for("the control plane to be initialized", WAIT, POLL, || async {
        let kcp = raw::send(
            &w.client,
            "GET",
            "/apis/controlplane.cluster.x-k8s.io/v1beta2/namespaces/default/kubeadmcontrolplanes/demo-control-plane",
            &Value::Null,
        )
        .await;
        let machines = raw::send(
            &w.client,
            "GET",
            "/apis/cluster.x-k8s.io/v1beta2/namespaces/default/machines",
            &Value::Null,
        )
        .await;
        let all_bootstrapped = machines.body["items"].as_array().is_some_and(|items| {
            items.len() == 3
                && items
                    .iter()
                    .all(|m| m["status"]["phase"] == "Running" && m["spec"]["bootstrap"]["dataSecretName"].is_string())
        });
        Ok((kcp.body["status"]["initialization"]["controlPlaneInitialized"] == true
            && kcp.body["status"]["readyReplicas"] == 1
            && all_bootstrapped)
            .then_some(()))
    })
    .await
    .unwrap();

    let mut checked = BTreeMap::new();
    for (api_version, plural) in WRITTEN {
        let list = raw::send(
            &w.client,
            "GET",
            &format!("/apis/{api_version}/namespaces/default/{plural}"),
            &Value::Null,
        )
        .await;
        let kind = list.body["kind"]
            .as_str()
            .unwrap()
            .trim_end_matches("List")
            .to_string();
        for mut obj in list.body["items"].as_array().cloned().unwrap_or_default() {
            obj["apiVersion"] = json!(api_version);
            obj["kind"] = json!(kind);
            let status = obj.get("status").cloned();
            let meta = obj["metadata"].as_object_mut().unwrap();
            // Server-set fields, and owners that do not exist on the target (the garbage collector
            // would remove what they own).
            for f in [
                "uid",
                "resourceVersion",
                "creationTimestamp",
                "generation",
                "managedFields",
                "ownerReferences",
                "finalizers",
            ] {
                meta.remove(f);
            }
            let what = format!("{kind} {}", obj["metadata"]["name"]);
            let created = create_strict(&target, &obj, &what).await;
            if let Some(status) = status {
                let mut with_status = created.clone();
                with_status["status"] = status.clone();
                let path = format!(
                    "{}/{}/status?fieldValidation=Strict",
                    collection(&obj),
                    obj["metadata"]["name"].as_str().unwrap()
                );
                let answer = raw::send(&target, "PUT", &path, &with_status).await;
                assert_eq!(answer.status, 200, "{what} status: {}", answer.text);
                assert!(answer.warnings.is_empty(), "{what}: {:?}", answer.warnings);
                assert_eq!(
                    answer.body["status"], status,
                    "{what}: status kept as written"
                );
            }
            *checked.entry(kind.clone()).or_insert(0) += 1;
        }
    }
    assert_eq!(checked.get("Machine"), Some(&3), "{checked:?}");
    assert_eq!(checked.get("KubeadmConfig"), Some(&3), "{checked:?}");
    assert_eq!(checked.get("KubeadmControlPlane"), Some(&1), "{checked:?}");
    w.shutdown().await;
    emulator.shutdown().await;
}

/// Without CAPI's CRDs a check against them cannot pass unseen: under CI (`CI=true`) it fails
/// naming where the CRDs were looked for; on a developer's machine it is skipped and says so on
/// the terminal (past the harness's capture). Runs one of this file's checks in a child process of
/// this test binary, with `CAPMVM_SHARED_DIR` pointing at an empty directory.
#[test]
fn without_capis_crds_ci_fails_and_a_local_run_reports_a_skip() {
    let empty = std::env::temp_dir().join(format!("capmvm-no-shared-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let run = |ci: Option<&str>| {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap());
        child
            .args([
                "every_object_of_templates_and_examples_validates_against_capi_crds",
                "--exact",
            ])
            .env("CAPMVM_SHARED_DIR", &empty);
        match ci {
            Some(v) => child.env("CI", v),
            None => child.env_remove("CI"),
        };
        child.output().unwrap()
    };
    let ci = run(Some("true"));
    let text =
        String::from_utf8_lossy(&ci.stdout).into_owned() + &String::from_utf8_lossy(&ci.stderr);
    assert!(
        !ci.status.success(),
        "passed under CI without its input:\n{text}"
    );
    assert!(
        text.contains("CI=true") && text.contains(&empty.display().to_string()),
        "{text}"
    );
    let local = run(None);
    let stderr = String::from_utf8_lossy(&local.stderr);
    assert!(local.status.success(), "{stderr}");
    assert!(
        stderr
            .contains("SKIPPED every_object_of_templates_and_examples_validates_against_capi_crds"),
        "the skip is said: {stderr}"
    );
    let _ = std::fs::remove_dir(&empty);
}
