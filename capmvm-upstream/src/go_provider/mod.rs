//! The Go provider (`cluster-api-provider-microvm` v0.10.1) on a loopback management cluster: its
//! manager binary (`capmvm-go-manager`, built by `hack/upstream.sh` from its pinned archive) and
//! its components rendered from the archive's own `config/default` ([`kustomize`]), installed as
//! `clusterctl init` installs them (clusterctl's labels, its inventory entry).
//!
//! What a management cluster without cert-manager or a kubelet changes, as CAPI's envtest does:
//! - its webhooks (admission, and the conversion webhook its CRD patches declare) are called by
//!   URL on loopback with a generated CA instead of through its Service, and the manager serves
//!   them with that CA's certificate; so cert-manager's Issuer and Certificate, the Service and
//!   the `cert-manager.io/inject-ca-from` annotations' effect are not needed (the annotations stay,
//!   as a user's objects have them);
//! - the Deployment is not created: its container's flags (`--leader-elect`) are the manager
//!   process's, which runs out of cluster with a token of its ServiceAccount, so its ClusterRole
//!   and leader-election Role judge every request.

pub mod kustomize;

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use serde_json::{Value, json};

use crate::capi::{apply_dynamic, record_provider, wait_crds_established};
use crate::pki::Ca;
use crate::process::{Process, http_status};
use crate::{Binaries, Error, KubeApiServer, Result, free_port, io_error};

/// The manager binary `hack/upstream.sh` builds.
pub const BINARY: &str = "capmvm-go-manager";
/// Its release.
pub const VERSION: &str = "v0.10.1";
/// The namespace its kustomization installs into.
pub const NAMESPACE: &str = "capmvm-system";
/// Its ServiceAccount (kustomize's `capmvm-` prefix on `controller-manager`).
pub const SERVICE_ACCOUNT: &str = "capmvm-controller-manager";
/// Its name in clusterctl's inventory (`<type>-<name>`), and the provider label clusterctl puts
/// on its objects.
pub const INVENTORY_NAME: &str = "infrastructure-microvm";
/// The user agent of its manager's requests (its main.go sets it on a config it then does not
/// use: the manager's client keeps controller-runtime's default, the binary's name).
pub const USER_AGENT: &str = BINARY;

/// The Go provider installed on a management cluster, its manager running until
/// [`GoProvider::stop`].
#[derive(Debug)]
pub struct GoProvider {
    manager: Option<Process>,
    args: Vec<String>,
    binaries: Binaries,
    log: PathBuf,
    webhook_configurations: Vec<String>,
}

impl Binaries {
    /// The Go provider's unpacked source (its `config/` in it), kept by the build beside the
    /// binaries.
    pub fn go_provider_source(&self) -> Result<PathBuf> {
        let path = self
            .dir()
            .join("go-provider-src")
            .join("cluster-api-provider-microvm-v0.10.1");
        if path.join("config").is_dir() {
            Ok(path)
        } else {
            Err(Error::MissingBinary {
                binary: "go-provider-src (the Go provider's unpacked source)".to_string(),
                dir: self.dir().to_path_buf(),
            })
        }
    }
}

/// The components its `config/default` renders, pointed at a manager on `port` with `ca_bundle`.
/// Returns the objects to create and the manager's flags from its Deployment.
pub fn components(config: &Path, port: u16, ca_bundle: &str) -> Result<(Vec<Value>, Vec<String>)> {
    let rendered = kustomize::render(&config.join("default"))?;
    let mut objects = Vec::new();
    let mut flags = Vec::new();
    for r in rendered {
        let mut o = r.object;
        match o["kind"].as_str().unwrap_or_default() {
            "Deployment" => {
                flags = o
                    .pointer("/spec/template/spec/containers/0/args")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect();
                continue;
            }
            "Issuer" | "Certificate" | "Service" => continue,
            _ => {}
        }
        point_at_url(&mut o, port, ca_bundle);
        // `clusterctl init`'s labels (over kustomize's `cluster.x-k8s.io/provider`).
        o["metadata"]["labels"]["cluster.x-k8s.io/provider"] = json!(INVENTORY_NAME);
        o["metadata"]["labels"]["clusterctl.cluster.x-k8s.io"] = json!("");
        objects.push(o);
    }
    Ok((objects, flags))
}

/// Every `clientConfig.service` (webhooks, a CRD's conversion webhook) becomes a URL on loopback.
fn point_at_url(o: &mut Value, port: u16, ca_bundle: &str) {
    let config = |c: &mut Value| {
        let path = c
            .pointer("/service/path")
            .and_then(Value::as_str)
            .unwrap_or("/")
            .to_string();
        *c = json!({"url": format!("https://127.0.0.1:{port}{path}"), "caBundle": ca_bundle});
    };
    if let Some(c) = o.pointer_mut("/spec/conversion/webhook/clientConfig") {
        config(c);
    }
    for hook in o
        .get_mut("webhooks")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if let Some(c) = hook.get_mut("clientConfig") {
            config(c);
        }
    }
}

fn is_webhook_configuration(o: &Value) -> bool {
    matches!(
        o["kind"].as_str(),
        Some("MutatingWebhookConfiguration" | "ValidatingWebhookConfiguration")
    )
}

impl GoProvider {
    /// Installs its components on `server` and starts its manager as its ServiceAccount with
    /// `extra_args` after its Deployment's flags; returns once it is ready and its webhook
    /// configurations are registered.
    pub async fn install(
        binaries: &Binaries,
        server: &KubeApiServer,
        dir: &Path,
        extra_args: &[String],
    ) -> Result<GoProvider> {
        let source = binaries.go_provider_source()?;
        let program = binaries.path(BINARY)?;
        let dir = dir.join("go-provider");
        let cert_dir = dir.join("webhook-certs");
        let ca = Ca::generate("go provider webhook CA")?;
        let serving = ca.issue_server(
            "capmvm-webhook-service",
            &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
            &["localhost"],
        )?;
        std::fs::create_dir_all(&cert_dir).map_err(io_error(&cert_dir))?;
        std::fs::write(cert_dir.join("tls.crt"), &serving.cert).map_err(io_error(&cert_dir))?;
        crate::pki::write_private(&cert_dir.join("tls.key"), serving.key.as_bytes())?;
        let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca.cert_pem());
        let port = free_port()?;
        let config = source.join("config");
        let (objects, deployment_flags) = components(&config, port, &ca_bundle)?;
        let client = server.client().await?;

        // Everything but the webhook configurations first: with failurePolicy Fail they refuse
        // writes until the manager serves them.
        let (webhooks, rest): (Vec<Value>, Vec<Value>) =
            objects.into_iter().partition(is_webhook_configuration);
        let (namespaces, rest): (Vec<Value>, Vec<Value>) =
            rest.into_iter().partition(|o| o["kind"] == "Namespace");
        for o in namespaces.iter().chain(&rest) {
            apply_dynamic(&client, o, &config).await?;
        }
        wait_crds_established(&Api::<CustomResourceDefinition>::all(client.clone())).await?;
        let kubeconfig = server
            .service_account_kubeconfig(
                NAMESPACE,
                SERVICE_ACCOUNT,
                Duration::from_secs(48 * 3600),
                &dir.join("go-provider.kubeconfig"),
            )
            .await?;
        let health = free_port()?;
        let mut args = vec![format!("--kubeconfig={}", kubeconfig.display())];
        args.extend(deployment_flags);
        args.extend([
            format!("--leader-election-namespace={NAMESPACE}"),
            format!("--webhook-port={port}"),
            format!("--webhook-cert-dir={}", cert_dir.display()),
            format!("--health-addr=127.0.0.1:{health}"),
            format!("--diagnostics-address=127.0.0.1:{}", free_port()?),
            "--insecure-diagnostics".to_string(),
        ]);
        args.extend(extra_args.iter().cloned());
        let log = dir.join(format!("{BINARY}.log"));
        let mut manager = Process::spawn(BINARY, &program, &args, &[], &log)?;
        manager
            .wait_ready(Duration::from_secs(120), || async move {
                http_status(health, "/readyz").await.map(|c| c == 200)
            })
            .await?;
        let mut webhook_configurations = Vec::new();
        for o in &webhooks {
            apply_dynamic(&client, o, &config).await?;
            if let Some(name) = o.pointer("/metadata/name").and_then(Value::as_str) {
                webhook_configurations.push(name.to_string());
            }
        }
        record_provider(
            &client,
            NAMESPACE,
            INVENTORY_NAME,
            "microvm",
            "InfrastructureProvider",
            VERSION,
        )
        .await?;
        Ok(GoProvider {
            manager: Some(manager),
            args,
            binaries: binaries.clone(),
            log,
            webhook_configurations,
        })
    }

    /// Its manager's log.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Its manager's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.manager.as_ref().and_then(Process::pid)
    }

    /// The names of its admission webhook configurations.
    pub fn webhook_configurations(&self) -> &[String] {
        &self.webhook_configurations
    }

    /// Stops its manager, as scaling its Deployment to zero does: CRDs, RBAC and webhook
    /// configurations stay.
    pub async fn stop(&mut self) {
        if let Some(manager) = self.manager.take() {
            manager.stop().await;
        }
    }

    /// Kills its manager at once (SIGKILL), as a crash does.
    pub async fn kill(&mut self) {
        if let Some(manager) = self.manager.take() {
            manager.kill().await;
        }
    }

    /// Starts its manager again with the same flags (its log continues); returns once ready.
    pub async fn start(&mut self) -> Result<()> {
        if self.manager.is_some() {
            return Ok(());
        }
        let program = self.binaries.path(BINARY)?;
        let health = self
            .args
            .iter()
            .find_map(|a| a.strip_prefix("--health-addr=127.0.0.1:"))
            .and_then(|p| p.parse::<u16>().ok())
            .unwrap_or(0);
        let mut manager = Process::spawn(BINARY, &program, &self.args, &[], &self.log)?;
        manager
            .wait_ready(Duration::from_secs(120), || async move {
                http_status(health, "/readyz").await.map(|c| c == 200)
            })
            .await?;
        self.manager = Some(manager);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// Its own config/ as a user's `clusterctl init` renders it: what the test can check only
    /// where the build unpacked the archive.
    #[test]
    fn its_config_renders_as_clusterctl_installs_it() {
        let Ok(source) = Binaries::locate().go_provider_source() else {
            eprintln!(
                "SKIPPED: the Go provider's source is not unpacked (hack/upstream.sh build go-provider)"
            );
            return;
        };
        let (objects, flags) = components(&source.join("config"), 9443, "Q0E=").unwrap();
        assert_eq!(flags, vec!["--leader-elect".to_string()]);
        let find = |kind: &str, name: &str| {
            objects
                .iter()
                .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
                .unwrap_or_else(|| panic!("{kind} {name} in {objects:#?}"))
        };
        assert!(find("Namespace", NAMESPACE).is_object());
        let sa = find("ServiceAccount", SERVICE_ACCOUNT);
        assert_eq!(sa["metadata"]["namespace"], NAMESPACE);
        let binding = find("ClusterRoleBinding", "capmvm-manager-rolebinding");
        assert_eq!(binding["roleRef"]["name"], "capmvm-manager-role");
        assert_eq!(binding["subjects"][0]["name"], SERVICE_ACCOUNT);
        assert_eq!(binding["subjects"][0]["namespace"], NAMESPACE);
        find("ClusterRole", "capmvm-manager-role");
        find("Role", "capmvm-leader-election-role");
        let machines = find(
            "CustomResourceDefinition",
            "microvmmachines.infrastructure.cluster.x-k8s.io",
        );
        assert_eq!(
            machines["metadata"]["labels"]["cluster.x-k8s.io/v1beta1"],
            "v1alpha1"
        );
        assert_eq!(
            machines["metadata"]["labels"]["cluster.x-k8s.io/provider"],
            INVENTORY_NAME
        );
        assert_eq!(
            machines["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            "capmvm-system/capmvm-serving-cert"
        );
        assert_eq!(
            machines["spec"]["conversion"]["webhook"]["clientConfig"],
            json!({"url": "https://127.0.0.1:9443/convert", "caBundle": "Q0E="})
        );
        let templates = find(
            "CustomResourceDefinition",
            "microvmmachinetemplates.infrastructure.cluster.x-k8s.io",
        );
        assert!(templates["spec"].get("conversion").is_none());
        let validating = find(
            "ValidatingWebhookConfiguration",
            "capmvm-validating-webhook-configuration",
        );
        assert_eq!(
            validating["webhooks"][0]["clientConfig"]["url"],
            "https://127.0.0.1:9443/validate-infrastructure-cluster-x-k8s-io-v1alpha1-microvmcluster"
        );
        find(
            "MutatingWebhookConfiguration",
            "capmvm-mutating-webhook-configuration",
        );
        assert!(!objects.iter().any(|o| matches!(
            o["kind"].as_str(),
            Some("Deployment" | "Service" | "Certificate" | "Issuer")
        )));
    }
}
