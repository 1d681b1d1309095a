//! Cluster API on a loopback management cluster, without cert-manager or a kubelet.
//!
//! The CRDs and webhook configurations come from the CAPI module (copied by `hack/upstream.sh`), as
//! CAPI's own envtest uses them: each webhook's `clientConfig` is rewritten from a Service to a URL
//! on loopback with a generated CA, and every CRD with more than one version gets its conversion
//! webhook the same way (CAPI adds those stanzas with kustomize patches). The managers run as
//! processes with that CA's serving certificate.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt as _};
use serde_json::{Value, json};

use crate::pki::Ca;
use crate::process::{Process, http_status};
use crate::{Binaries, Error, KubeApiServer, Result, free_port, io_error};

/// The CAPI version the build pins (hack/upstream.sh), as clusterctl's inventory records it.
pub const CAPI_VERSION: &str = "v1.14.2";

/// A CAPI provider as clusterctl's inventory knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    /// Core: Cluster, Machine, MachineDeployment, MachinePool, ...
    Core,
    /// The kubeadm bootstrap provider (CABPK).
    KubeadmBootstrap,
    /// The kubeadm control-plane provider (KCP).
    KubeadmControlPlane,
}

impl Provider {
    /// Its manager binary.
    pub fn binary(self) -> &'static str {
        match self {
            Provider::Core => "capi-manager",
            Provider::KubeadmBootstrap => "capi-kubeadm-bootstrap-manager",
            Provider::KubeadmControlPlane => "capi-kubeadm-control-plane-manager",
        }
    }

    /// Where its manifests are in the module.
    fn config_dir(self) -> &'static str {
        match self {
            Provider::Core => "core/config",
            Provider::KubeadmBootstrap => "bootstrap/kubeadm/config",
            Provider::KubeadmControlPlane => "controlplane/kubeadm/config",
        }
    }

    /// The namespace clusterctl installs it in.
    pub fn namespace(self) -> &'static str {
        match self {
            Provider::Core => "capi-system",
            Provider::KubeadmBootstrap => "capi-kubeadm-bootstrap-system",
            Provider::KubeadmControlPlane => "capi-kubeadm-control-plane-system",
        }
    }

    /// Its name in clusterctl's inventory (`<type>-<name>`, core: `cluster-api`).
    pub fn inventory_name(self) -> &'static str {
        match self {
            Provider::Core => "cluster-api",
            Provider::KubeadmBootstrap => "bootstrap-kubeadm",
            Provider::KubeadmControlPlane => "control-plane-kubeadm",
        }
    }

    fn inventory_type(self) -> &'static str {
        match self {
            Provider::Core => "CoreProvider",
            Provider::KubeadmBootstrap => "BootstrapProvider",
            Provider::KubeadmControlPlane => "ControlPlaneProvider",
        }
    }

    fn provider_name(self) -> &'static str {
        match self {
            Provider::Core => "cluster-api",
            Provider::KubeadmBootstrap | Provider::KubeadmControlPlane => "kubeadm",
        }
    }
}

/// How CAPI is installed and run.
#[derive(Clone, Debug)]
pub struct CapiOptions {
    /// The providers whose managers run (their CRDs and webhooks are installed). The kubeadm
    /// control-plane provider's CRDs are always installed, so a stand-in can play it.
    pub managers: Vec<Provider>,
    /// Flags added to every manager.
    pub extra_args: Vec<String>,
}

impl Default for CapiOptions {
    fn default() -> Self {
        Self {
            managers: vec![Provider::Core, Provider::KubeadmBootstrap],
            extra_args: Vec::new(),
        }
    }
}

/// CAPI's managers on a management cluster; dropping stops them.
#[derive(Debug)]
pub struct Capi {
    managers: Vec<(Provider, Process, Vec<String>)>,
    binaries: Binaries,
}

/// A manager [`Capi::stop_manager`] stopped: what [`Capi::start`] needs to run it again.
#[derive(Debug)]
pub struct StoppedManager {
    provider: Provider,
    args: Vec<String>,
}

/// The labels a provider's `crd/kustomization.yaml` puts on its CRDs (`labels[].pairs`).
fn kustomize_labels(dir: &Path) -> Result<Vec<(String, String)>> {
    let file = dir.join("kustomization.yaml");
    let mut labels = Vec::new();
    for doc in read_yaml_docs(&file)? {
        for entry in doc
            .get("labels")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            for (k, v) in entry
                .get("pairs")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                if let Some(v) = v.as_str() {
                    labels.push((k.clone(), v.to_string()));
                }
            }
        }
    }
    Ok(labels)
}

/// The CRD files of a provider.
fn crd_files(config: &Path, provider: Provider) -> Result<Vec<PathBuf>> {
    let dir = config.join(provider.config_dir()).join("crd/bases");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(io_error(&dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    Ok(files)
}

fn read_yaml_docs(path: &Path) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).map_err(io_error(path))?;
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).map_err(|e| Error::Manifest {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

impl Capi {
    /// Installs CAPI's CRDs and webhooks on `server` and starts `options.managers`, each serving its
    /// webhooks on a loopback port; returns once every manager reports ready.
    pub async fn install(
        binaries: &Binaries,
        server: &KubeApiServer,
        dir: &Path,
        options: &CapiOptions,
    ) -> Result<Capi> {
        let config = binaries.capi_config()?;
        let client = server.client().await?;
        let dir = dir.join("capi");
        let cert_dir = dir.join("webhook-certs");
        let ca = Ca::generate("capi webhook CA")?;
        let serving = ca.issue_server(
            "capi-webhook-service",
            &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
            &["localhost"],
        )?;
        std::fs::create_dir_all(&cert_dir).map_err(io_error(&cert_dir))?;
        std::fs::write(cert_dir.join("tls.crt"), &serving.cert).map_err(io_error(&cert_dir))?;
        crate::pki::write_private(&cert_dir.join("tls.key"), serving.key.as_bytes())?;
        let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca.cert_pem());

        let mut ports = Vec::new();
        for provider in &options.managers {
            ports.push((*provider, free_port()?));
        }
        let port_of = |p: Provider| ports.iter().find(|(q, _)| *q == p).map(|(_, port)| *port);

        // CRDs: every provider's, with a conversion webhook where its manager runs.
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        let mut all = Vec::new();
        for provider in [
            Provider::Core,
            Provider::KubeadmBootstrap,
            Provider::KubeadmControlPlane,
        ] {
            let labels = kustomize_labels(&config.join(provider.config_dir()).join("crd"))?;
            for file in crd_files(&config, provider)? {
                for mut doc in read_yaml_docs(&file)? {
                    // The contract labels (`cluster.x-k8s.io/v1beta2: v1beta2`) core reads to pick
                    // a version come from kustomize, not from the CRD files.
                    for (key, value) in &labels {
                        doc["metadata"]["labels"][key] = json!(value);
                    }
                    let versions = doc
                        .pointer("/spec/versions")
                        .and_then(Value::as_array)
                        .map_or(0, Vec::len);
                    if versions > 1
                        && let Some(port) = port_of(provider)
                    {
                        doc["spec"]["conversion"] = json!({
                            "strategy": "Webhook",
                            "webhook": {
                                "conversionReviewVersions": ["v1", "v1beta1"],
                                "clientConfig": {
                                    "url": format!("https://127.0.0.1:{port}/convert"),
                                    "caBundle": ca_bundle,
                                },
                            },
                        });
                    }
                    label_as_clusterctl_does(&mut doc, provider);
                    all.push((file.clone(), doc));
                }
            }
        }
        // clusterctl's own inventory CRD, so `clusterctl move` finds the providers.
        let inventory = config.join("cmd/clusterctl/config/crd/bases");
        if inventory.is_dir() {
            for entry in std::fs::read_dir(&inventory).map_err(io_error(&inventory))? {
                let file = entry.map_err(io_error(&inventory))?.path();
                for doc in read_yaml_docs(&file)? {
                    all.push((file.clone(), doc));
                }
            }
        }
        for (file, doc) in all {
            let crd: CustomResourceDefinition =
                serde_json::from_value(doc).map_err(|e| Error::Manifest {
                    path: file.clone(),
                    message: e.to_string(),
                })?;
            let name = crd.name_any();
            crds.patch(
                &name,
                &PatchParams::apply("capmvm-upstream").force(),
                &Patch::Apply(&crd),
            )
            .await?;
        }
        wait_crds_established(&crds).await?;

        // The managers, each in a namespace of its own as clusterctl installs them.
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let mut managers = Vec::new();
        for (provider, port) in &ports {
            let namespace = Namespace {
                metadata: ObjectMeta {
                    name: Some(provider.namespace().to_string()),
                    ..Default::default()
                },
                ..Default::default()
            };
            match namespaces.create(&PostParams::default(), &namespace).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
            let args = manager_args(server, &cert_dir, *port, &options.extra_args)?;
            let process = spawn_manager(binaries, *provider, &args, &dir)?;
            managers.push((*provider, process, args));
        }
        let mut capi = Capi {
            managers,
            binaries: binaries.clone(),
        };
        capi.wait_ready().await?;

        // Webhook configurations last: with failurePolicy Fail they refuse writes until the
        // managers serve them.
        for (provider, port) in &ports {
            let file = config
                .join(provider.config_dir())
                .join("webhook/manifests.yaml");
            if !file.is_file() {
                continue;
            }
            for mut doc in read_yaml_docs(&file)? {
                point_webhooks_at(&mut doc, *port, &ca_bundle, *provider);
                apply_dynamic(&client, &doc, &file).await?;
            }
        }
        // clusterctl's inventory, as `clusterctl init` writes it.
        for (provider, _) in &ports {
            record_provider(
                &client,
                provider.namespace(),
                provider.inventory_name(),
                provider.provider_name(),
                provider.inventory_type(),
                CAPI_VERSION,
            )
            .await?;
        }
        Ok(capi)
    }

    async fn wait_ready(&mut self) -> Result<()> {
        for (_, process, args) in &mut self.managers {
            let health = args
                .iter()
                .find_map(|a| a.strip_prefix("--health-addr=127.0.0.1:"))
                .and_then(|p| p.parse::<u16>().ok())
                .unwrap_or(0);
            process
                .wait_ready(Duration::from_secs(120), || async move {
                    http_status(health, "/readyz").await.map(|c| c == 200)
                })
                .await?;
        }
        Ok(())
    }

    /// The process id of `provider`'s manager.
    pub fn pid(&self, provider: Provider) -> Option<u32> {
        self.managers
            .iter()
            .find(|(p, _, _)| *p == provider)
            .and_then(|(_, process, _)| process.pid())
    }

    /// The log of `provider`'s manager.
    pub fn log(&self, provider: Provider) -> Option<PathBuf> {
        self.managers
            .iter()
            .find(|(p, _, _)| *p == provider)
            .map(|(_, process, _)| process.log().to_path_buf())
    }

    /// Stops the `provider` manager, remembering its flags for [`Capi::start`]; `None` when it
    /// was not running.
    pub async fn stop_manager(&mut self, provider: Provider) -> Option<StoppedManager> {
        let i = self.managers.iter().position(|(p, _, _)| *p == provider)?;
        let (provider, process, args) = self.managers.remove(i);
        process.stop().await;
        Some(StoppedManager { provider, args })
    }

    /// Kills the `provider` manager at once (SIGKILL), as a crash would, remembering its flags for
    /// [`Capi::start`]; `None` when it was not running.
    pub async fn kill_manager(&mut self, provider: Provider) -> Option<StoppedManager> {
        let i = self.managers.iter().position(|(p, _, _)| *p == provider)?;
        let (provider, process, args) = self.managers.remove(i);
        process.kill().await;
        Some(StoppedManager { provider, args })
    }

    /// Starts a stopped manager again with the same flags (its log continues); returns once every
    /// manager is ready.
    pub async fn start(&mut self, stopped: StoppedManager, dir: &Path) -> Result<()> {
        let StoppedManager { provider, args } = stopped;
        let process = spawn_manager(&self.binaries, provider, &args, &dir.join("capi"))?;
        self.managers.push((provider, process, args));
        self.wait_ready().await
    }

    /// Stops every manager.
    pub async fn stop(self) {
        for (_, process, _) in self.managers {
            process.stop().await;
        }
    }
}

fn manager_args(
    server: &KubeApiServer,
    cert_dir: &Path,
    webhook_port: u16,
    extra: &[String],
) -> Result<Vec<String>> {
    let mut args = vec![
        format!("--kubeconfig={}", server.kubeconfig().display()),
        format!("--webhook-port={webhook_port}"),
        format!("--webhook-cert-dir={}", cert_dir.display()),
        format!("--health-addr=127.0.0.1:{}", free_port()?),
        format!("--diagnostics-address=127.0.0.1:{}", free_port()?),
        "--insecure-diagnostics".to_string(),
        "--leader-elect=false".to_string(),
        // ClusterTopology: ClusterClass and managed topologies (off by default in v1.14).
        "--feature-gates=MachinePool=true,ClusterTopology=true".to_string(),
    ];
    args.extend(extra.iter().cloned());
    Ok(args)
}

fn spawn_manager(
    binaries: &Binaries,
    provider: Provider,
    args: &[String],
    dir: &Path,
) -> Result<Process> {
    let program = binaries.path(provider.binary())?;
    Process::spawn(
        provider.binary(),
        &program,
        args,
        &[("POD_NAMESPACE", provider.namespace())],
        &dir.join(format!("{}.log", provider.binary())),
    )
}

/// The labels `clusterctl init` puts on every object of a provider's components.
fn label_as_clusterctl_does(doc: &mut Value, provider: Provider) {
    let labels = &mut doc["metadata"]["labels"];
    if !labels.is_object() {
        *labels = json!({});
    }
    labels["clusterctl.cluster.x-k8s.io"] = json!("");
    labels["cluster.x-k8s.io/provider"] = json!(provider.inventory_name());
}

/// Rewrites every webhook of a (Mutating|Validating)WebhookConfiguration to call the manager on
/// `port`, and names the configuration after its provider as clusterctl's namePrefix does.
fn point_webhooks_at(doc: &mut Value, port: u16, ca_bundle: &str, provider: Provider) {
    let prefix = match provider {
        Provider::Core => "capi-",
        Provider::KubeadmBootstrap => "capi-kubeadm-bootstrap-",
        Provider::KubeadmControlPlane => "capi-kubeadm-control-plane-",
    };
    if let Some(name) = doc.pointer("/metadata/name").and_then(Value::as_str) {
        doc["metadata"]["name"] = json!(format!("{prefix}{name}"));
    }
    label_as_clusterctl_does(doc, provider);
    if let Some(webhooks) = doc.get_mut("webhooks").and_then(Value::as_array_mut) {
        for webhook in webhooks {
            let path = webhook
                .pointer("/clientConfig/service/path")
                .and_then(Value::as_str)
                .unwrap_or("/")
                .to_string();
            webhook["clientConfig"] = json!({
                "url": format!("https://127.0.0.1:{port}{path}"),
                "caBundle": ca_bundle,
            });
        }
    }
}

/// Server-side applies one manifest object.
pub async fn apply_dynamic(client: &kube::Client, doc: &Value, source: &Path) -> Result<()> {
    let object: DynamicObject =
        serde_json::from_value(doc.clone()).map_err(|e| Error::Manifest {
            path: source.to_path_buf(),
            message: e.to_string(),
        })?;
    let types = object.types.clone().ok_or_else(|| Error::Manifest {
        path: source.to_path_buf(),
        message: "an object without apiVersion and kind".to_string(),
    })?;
    let gvk = GroupVersionKind::try_from(&types).map_err(|e| Error::Manifest {
        path: source.to_path_buf(),
        message: e.to_string(),
    })?;
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk).await?;
    let api: Api<DynamicObject> = match (caps.scope, object.namespace()) {
        (kube::discovery::Scope::Namespaced, Some(ns)) => {
            Api::namespaced_with(client.clone(), &ns, &resource)
        }
        _ => Api::all_with(client.clone(), &resource),
    };
    api.patch(
        &object.name_any(),
        &PatchParams::apply("capmvm-upstream").force(),
        &Patch::Apply(&object),
    )
    .await?;
    Ok(())
}

/// Writes clusterctl's inventory entry for a provider (what `clusterctl init` records).
pub async fn record_provider(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    provider_name: &str,
    provider_type: &str,
    version: &str,
) -> Result<()> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("clusterctl.cluster.x-k8s.io", "v1alpha3", "Provider"),
        "providers",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
    let object = json!({
        "apiVersion": "clusterctl.cluster.x-k8s.io/v1alpha3",
        "kind": "Provider",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "clusterctl.cluster.x-k8s.io": "",
                "cluster.x-k8s.io/provider": name,
            },
        },
        "providerName": provider_name,
        "type": provider_type,
        "version": version,
    });
    api.patch(
        name,
        &PatchParams::apply("clusterctl").force(),
        &Patch::Apply(&object),
    )
    .await?;
    Ok(())
}

/// Waits until every CRD is Established.
pub async fn wait_crds_established(crds: &Api<CustomResourceDefinition>) -> Result<()> {
    for _ in 0..300 {
        let list = crds.list(&Default::default()).await?;
        let pending = list.items.iter().any(|crd| {
            !crd.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                })
        });
        if !pending {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(Error::NotReady {
        what: "CRDs".to_string(),
        why: "not Established after 30 s".to_string(),
        log: PathBuf::new(),
        tail: String::new(),
    })
}
