//! Helpers shared by the emulator's test suites: starting an emulator, the project's CRDs, a test CRD
//! covering every schema keyword, and raw HTTP requests through the kube client.
#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;

use axum::http::{HeaderMap, Request};
use capmvm_kube_emulator::{Emulator, EmulatorHandle, EmulatorOptions};
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};

mod api_ext;
pub mod servers;

// Not every suite uses each of them.
#[allow(unused_imports)]
pub use api_ext::{ApiExt, Events, next_event};

/// Starts an emulator with default options and returns it with a client.
pub async fn start() -> (EmulatorHandle, Client) {
    start_with(EmulatorOptions::default()).await
}

/// Starts an emulator with default options and the project's CRDs installed.
pub async fn start_with_project_crds() -> (EmulatorHandle, Client) {
    let (emulator, client) = start().await;
    install_project_crds(&client).await;
    (emulator, client)
}

pub async fn start_with(options: EmulatorOptions) -> (EmulatorHandle, Client) {
    let emulator = Emulator::start(options).await.expect("emulator starts");
    let client = emulator.client().expect("client");
    (emulator, client)
}

/// A client that does not retry 429/503/504 answers (kube-rs does by default), to see what the server says.
pub fn client_without_retries(emulator: &EmulatorHandle) -> Client {
    let mut config = kube::Config::new(emulator.base_url().parse().expect("url"));
    config.default_retry = false;
    Client::try_from(config).expect("client")
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The project's CRDs from `config/crd/bases`.
pub fn project_crds() -> Vec<Value> {
    let dir = repo_root().join("config/crd/bases");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("config/crd/bases")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| {
            serde_saphyr::from_str::<Value>(&std::fs::read_to_string(p).expect("read CRD"))
                .expect("CRD YAML")
        })
        .collect()
}

/// CAPI's MachineDeployment CRD (v1.14.0), as CAPI installs it: from shared/, which sits beside the
/// repository (CI exports CAPMVM_SHARED_DIR when it is elsewhere).
pub fn capi_machine_deployment_crd() -> Value {
    let shared = std::env::var_os("CAPMVM_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("../shared"));
    let md = shared.join("capi-crds/v1.14.0/cluster.x-k8s.io_machinedeployments.yaml");
    let md = std::fs::read_to_string(&md).unwrap_or_else(|e| panic!("{}: {e}", md.display()));
    serde_saphyr::from_str(&md).unwrap()
}

/// Every CRD of CAPI v1.14.0 (shared/capi-crds), as CAPI installs them.
pub fn capi_crds() -> Vec<Value> {
    let shared = std::env::var_os("CAPMVM_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("../shared"));
    let dir = shared.join("capi-crds/v1.14.0");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| {
            serde_saphyr::from_str::<Value>(&std::fs::read_to_string(p).expect("read CRD"))
                .expect("CRD YAML")
        })
        .collect()
}

pub fn crd_api(client: &Client) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
        "customresourcedefinitions",
    );
    Api::all_with(client.clone(), &ar)
}

/// Creates a CRD and waits until it is Established and its resource is served (a real server serves
/// it a moment after the create, as envtest's CRD installation waits for); the CRD as it is then.
pub async fn create_crd(client: &Client, crd: &Value) -> DynamicObject {
    let obj: DynamicObject = serde_json::from_value(crd.clone()).expect("CRD object");
    let created = crd_api(client)
        .create(&PostParams::default(), &obj)
        .await
        .expect("create CRD");
    wait_established(client, &created).await
}

/// Waits until a CRD is Established and every served version's collection answers; the CRD then.
pub async fn wait_established(client: &Client, crd: &DynamicObject) -> DynamicObject {
    let name = crd.metadata.name.clone().expect("CRD name");
    let group = crd.data["spec"]["group"].as_str().unwrap_or("").to_string();
    let plural = crd.data["spec"]["names"]["plural"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let versions: Vec<String> = crd.data["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["served"] == true)
        .filter_map(|v| v["name"].as_str().map(str::to_string))
        .collect();
    for _ in 0..400 {
        let now = crd_api(client).get(&name).await.expect("get CRD");
        let established = now.data["status"]["conditions"]
            .as_array()
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Established" && c["status"] == "True")
            });
        let mut served = established;
        for v in &versions {
            if served {
                let path = format!("/apis/{group}/{v}/{plural}?limit=1");
                served = raw(client, "GET", &path, None, b"").await.status == 200;
            }
        }
        if served {
            return now;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("CRD {name} was not established and served within 10 s");
}

pub async fn install_project_crds(client: &Client) {
    for crd in project_crds() {
        create_crd(client, &crd).await;
    }
}

pub fn machine_ar() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "infrastructure.cluster.x-k8s.io",
            "v1alpha2",
            "MicrovmMachine",
        ),
        "microvmmachines",
    )
}

pub fn machines(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &machine_ar())
}

/// A valid MicrovmMachine.
pub fn machine(name: &str) -> Value {
    json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha2",
        "kind": "MicrovmMachine",
        "metadata": {"name": name, "labels": {"cluster.x-k8s.io/cluster-name": "c1"}},
        "spec": {
            "kernel": {"image": "ghcr.io/kernel:6.1", "filename": "boot/vmlinux"},
            "memoryMb": 2048,
            "vcpu": 2,
            "rootVolume": {"id": "root", "image": "ghcr.io/root:1"},
            "networkInterfaces": [{"guestDeviceName": "eth1"}]
        }
    })
}

pub fn dynamic(v: Value) -> DynamicObject {
    serde_json::from_value(v).expect("DynamicObject")
}

pub async fn create_machine(client: &Client, ns: &str, name: &str) -> DynamicObject {
    try_create_machine(client, ns, name)
        .await
        .expect("create machine")
}

/// Creates `machine(name)`, returning what the server answered (for creates expected to fail).
pub async fn try_create_machine(
    client: &Client,
    ns: &str,
    name: &str,
) -> kube::Result<DynamicObject> {
    machines(client, ns)
        .create(&PostParams::default(), &dynamic(machine(name)))
        .await
}

/// A CRD whose schema uses every keyword the emulator validates: `widgets.test.example.com`.
pub fn widget_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.test.example.com"},
        "spec": {
            "group": "test.example.com",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wdg"], "categories": ["testing"]},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                    {"name": "Color", "type": "string", "jsonPath": ".spec.color", "priority": 1},
                    {"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"},
                    {"name": "Owner", "type": "string", "jsonPath": ".metadata.labels.example\\.com/owner"},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
                ],
                "schema": {"openAPIV3Schema": widget_schema()}
            }]
        }
    })
}

fn widget_schema() -> Value {
    let spec = json!({
        "type": "object",
        "required": ["size"],
        "properties": {
            "size": {"type": "integer", "minimum": 1, "maximum": 10},
            "color": {"type": "string", "enum": ["red", "green", "blue"], "default": "red"},
            "name": {"type": "string", "minLength": 2, "maxLength": 8, "pattern": "^[a-z]+$"},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3, "x-kubernetes-list-type": "set"},
            "ratio": {"type": "number", "exclusiveMaximum": true, "maximum": 1.0},
            "enabled": {"type": "boolean"},
            "nullableNote": {"type": "string", "nullable": true},
            "settings": {"type": "object", "additionalProperties": {"type": "string"}},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            "ports": {"type": "array", "items": {"type": "object", "properties": {
                "port": {"type": "integer"},
                "protocol": {"type": "string", "default": "TCP"}
            }}},
            "limits": {"type": "object", "minProperties": 1, "maxProperties": 2, "additionalProperties": {"type": "integer"}}
        }
    });
    let status = json!({
        "type": "object",
        "properties": {
            "phase": {"type": "string"},
            "conditions": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"],
                "items": {"type": "object", "required": ["type", "status"], "properties": {
                    "type": {"type": "string"}, "status": {"type": "string"}}}}
        }
    });
    json!({"type": "object", "properties": {"spec": spec, "status": status}})
}

pub fn widget_ar() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("test.example.com", "v1", "Widget"),
        "widgets",
    )
}

pub fn widgets(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &widget_ar())
}

pub fn widget(name: &str, size: i64) -> Value {
    json!({"apiVersion": "test.example.com/v1", "kind": "Widget", "metadata": {"name": name}, "spec": {"size": size}})
}

/// A raw answer: status, headers and the JSON body (Null when empty or not JSON).
#[derive(Debug)]
pub struct Raw {
    pub status: u16,
    pub headers: HeaderMap,
    pub text: String,
    pub body: Value,
}

impl Raw {
    pub fn warnings(&self) -> Vec<String> {
        self.headers
            .get_all("warning")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::to_string)
            .collect()
    }
}

/// Sends a raw request through the kube client (so through a real HTTP connection).
pub async fn raw(
    client: &Client,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &[u8],
) -> Raw {
    raw_with(client, method, path, content_type, None, body).await
}

pub async fn raw_with(
    client: &Client,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    accept: Option<&str>,
    body: &[u8],
) -> Raw {
    let mut req = Request::builder().method(method).uri(path);
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    if let Some(a) = accept {
        req = req.header("accept", a);
    }
    let req = req
        .body(kube::client::Body::from(body.to_vec()))
        .expect("request");
    let resp = client.send(req).await.expect("send");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect_bytes().await.expect("body");
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Raw {
        status,
        headers,
        text,
        body,
    }
}

pub async fn get_json(client: &Client, path: &str) -> Value {
    let r = raw(client, "GET", path, None, b"").await;
    assert_eq!(r.status, 200, "GET {path}: {}", r.text);
    r.body
}

/// The Status of a failed kube-rs call.
pub fn status_of(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// Asserts a raw answer is a `Status` failure with this code and reason.
pub fn assert_status(r: &Raw, code: u16, reason: &str) {
    assert_eq!(r.status, code, "{}", r.text);
    assert_eq!(r.body["kind"], "Status", "{}", r.text);
    assert_eq!(r.body["apiVersion"], "v1", "{}", r.text);
    assert_eq!(r.body["status"], "Failure", "{}", r.text);
    assert_eq!(r.body["code"], code, "{}", r.text);
    assert_eq!(r.body["reason"], reason, "{}", r.text);
    assert!(
        r.body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{}",
        r.text
    );
}

/// Asserts a raw answer is the plain-text `404 page not found` of a path no API handler serves (an
/// unknown group or version, or an unknown resource of a custom resource group), as the real server's
/// mux answers it: not a Status.
pub fn assert_page_not_found(r: &Raw) {
    assert_eq!(r.status, 404, "{}", r.text);
    assert_eq!(r.text.trim(), "404 page not found", "{}", r.text);
    assert!(
        r.headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|c| c.starts_with("text/plain")),
        "{:?}",
        r.headers
    );
}

/// Waits until `f` holds, polling.
pub async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    // Up to 30 s: the real server's garbage collector and namespace controller take a moment.
    for _ in 0..1200 {
        if f().await {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for: {what}");
}
