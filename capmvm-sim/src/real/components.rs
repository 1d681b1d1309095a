//! Our components on the real management cluster, as a user installs them: `infrastructure-components.yaml`
//! rendered by the real `clusterctl generate yaml` and applied with the real kubectl, then what
//! `clusterctl init` would add (its label on the objects and the provider's inventory entry), which
//! `clusterctl move` relies on. `clusterctl init` itself cannot run here: it first downloads and
//! installs cert-manager, and waits for its Pods (no internet, no kubelet).
//!
//! Without cert-manager, what it would do for the conversion webhook is done here, as
//! `capmvm-upstream` does for CAPI's webhooks: a generated CA issues the serving certificate, the
//! cert-manager Issuer and Certificate are left out, and each CRD's conversion webhook is pointed
//! at the operator on loopback by URL with that CA (out of cluster it has no Service).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use base64::Engine as _;
use capmvm_upstream::capi::{record_provider, wait_crds_established};
use capmvm_upstream::pki::Ca;
use capmvm_upstream::tools::{Clusterctl, Kubectl};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use serde_json::{Value, json};

/// The namespace our components install into.
pub const NAMESPACE: &str = "capmvm-system";
/// The operator's ServiceAccount.
pub const SERVICE_ACCOUNT: &str = "capmvm-manager";
/// clusterctl's name for us (`<type>-<name>`).
pub const PROVIDER: &str = "infrastructure-microvm";
/// The version our inventory entry records (metadata.yaml's release series).
pub const VERSION: &str = "v0.1.0";

/// The shipped components file, compiled in.
pub const COMPONENTS: &str = include_str!("../../../infrastructure-components.yaml");

/// The image the rendered Deployment names: it never runs (no kubelet), the operator runs out of
/// cluster as the Deployment's ServiceAccount.
pub const IMAGE: &str = "capmvm-operator:dev";

/// Where the operator, out of cluster, serves the conversion webhook the CRDs call.
#[derive(Clone, Debug)]
pub struct Webhook {
    /// Its `--webhook-port` (on loopback, as the CRDs' URL says).
    pub port: u16,
    /// Its `--webhook-cert-dir`: the serving certificate the CRDs' caBundle trusts.
    pub cert_dir: PathBuf,
    /// The CA the CRDs' caBundle holds (cert-manager's Issuer, here).
    ca: Arc<Ca>,
}

impl Webhook {
    /// The operator's flags for it.
    pub fn flags(&self) -> Vec<String> {
        vec![
            format!("--webhook-port={}", self.port),
            format!("--webhook-cert-dir={}", self.cert_dir.display()),
        ]
    }

    /// Renews the serving certificate as cert-manager does before it expires: a new key and
    /// certificate from the same CA written over the old files (the CRDs' caBundle stays). Returns
    /// the new certificate (PEM).
    pub fn renew(&self) -> anyhow::Result<String> {
        let serving = issue_serving(&self.ca)?;
        serving.write(&self.cert_dir, "tls")?;
        Ok(serving.cert)
    }

    /// The CA certificate the API server trusts the webhook by (PEM).
    pub fn ca_pem(&self) -> String {
        self.ca.cert_pem()
    }
}

fn issue_serving(ca: &Ca) -> anyhow::Result<capmvm_upstream::pki::KeyPairPem> {
    Ok(ca.issue_server(
        capmvm_api::webhook::SERVICE,
        &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
        &["localhost"],
    )?)
}

/// Renders and applies our components and records us in clusterctl's inventory; where the operator
/// must serve the conversion webhook.
pub async fn install(
    clusterctl: &Clusterctl,
    kubectl: &Kubectl,
    client: &kube::Client,
    dir: &Path,
) -> anyhow::Result<Webhook> {
    let file = dir.join("infrastructure-components.yaml");
    std::fs::write(&file, COMPONENTS).with_context(|| format!("writing {}", file.display()))?;
    let rendered = clusterctl
        .generate_yaml(&file, &[("CAPMVM_IMAGE".to_string(), IMAGE.to_string())])
        .await
        .context("clusterctl generate yaml --from infrastructure-components.yaml")?;
    std::fs::write(
        dir.join("infrastructure-components.rendered.yaml"),
        &rendered,
    )
    .context("keeping the rendered components")?;
    let webhook = webhook_pki(dir)?;
    let applied = without_cert_manager(&rendered, &webhook)?;
    std::fs::write(dir.join("infrastructure-components.applied.yaml"), &applied)
        .context("keeping the applied components")?;
    kubectl
        .apply(&applied, &[])
        .await
        .context("kubectl apply of the rendered components")?;
    // What clusterctl init adds: its label on every object (move discovers CRDs by it).
    kubectl
        .run(&[
            "label",
            "crd",
            "-l",
            &format!("cluster.x-k8s.io/provider={PROVIDER}"),
            "clusterctl.cluster.x-k8s.io=",
            "--overwrite",
        ])
        .await
        .context("labelling our CRDs as clusterctl init does")?;
    record_provider(
        client,
        NAMESPACE,
        PROVIDER,
        "microvm",
        "InfrastructureProvider",
        VERSION,
    )
    .await
    .context("recording the provider in clusterctl's inventory")?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    tokio::time::timeout(Duration::from_secs(60), wait_crds_established(&crds))
        .await
        .context("our CRDs were not Established within 60 s")??;
    Ok(webhook.0)
}

/// A CA and the webhook's serving certificate for 127.0.0.1, written as `tls.crt` and `tls.key`.
fn webhook_pki(dir: &Path) -> anyhow::Result<(Webhook, String)> {
    let cert_dir = dir.join("webhook-certs");
    let ca = Ca::generate("capmvm webhook CA")?;
    issue_serving(&ca)?.write(&cert_dir, "tls")?;
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca.cert_pem());
    let port = capmvm_upstream::free_port()?;
    Ok((
        Webhook {
            port,
            cert_dir,
            ca: Arc::new(ca),
        },
        ca_bundle,
    ))
}

/// The rendered components without cert-manager's objects, each conversion webhook pointed at the
/// operator on loopback with `webhook`'s CA.
fn without_cert_manager(rendered: &str, webhook: &(Webhook, String)) -> anyhow::Result<String> {
    let (webhook, ca_bundle) = webhook;
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(rendered).context("parsing the rendered components")?;
    let mut out = String::new();
    for mut doc in docs.into_iter().filter(|d| !d.is_null()) {
        let api_version = doc["apiVersion"].as_str().unwrap_or_default();
        if api_version.starts_with("cert-manager.io/") {
            continue;
        }
        if doc["kind"] == "CustomResourceDefinition"
            && doc.pointer("/spec/conversion/webhook").is_some()
        {
            doc["spec"]["conversion"]["webhook"]["clientConfig"] = json!({
                "url": format!("https://127.0.0.1:{}{}", webhook.port, capmvm_api::webhook::CONVERT_PATH),
                "caBundle": ca_bundle,
            });
        }
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&doc).context("writing a component")?);
    }
    Ok(out)
}

/// Serves (or stops serving) `v1alpha1` on every CRD that has it, with the README's command (a
/// JSON patch of `/spec/versions/1/served` by kubectl), as a user can once no client reads or
/// writes that version: the API server keeps a watch cache per served version and converts every
/// change into each of them, read or not (kubernetes/kubernetes#129979), so an unread `v1alpha1`
/// costs a conversion review per write. Objects stored at `v1alpha1` are still read.
pub async fn serve_v1alpha1(kubectl: &Kubectl, served: bool) -> anyhow::Result<()> {
    for crd in capmvm_api::crds() {
        let Some(index) = crd.spec.versions.iter().position(|v| v.name == "v1alpha1") else {
            continue;
        };
        let name = crd.metadata.name.unwrap_or_default();
        let patch = json!([{
            "op": "replace",
            "path": format!("/spec/versions/{index}/served"),
            "value": served,
        }])
        .to_string();
        kubectl
            .run(&["patch", "crd", &name, "--type=json", "-p", &patch])
            .await
            .with_context(|| format!("setting v1alpha1 served={served} on CRD {name}"))?;
    }
    Ok(())
}

/// The conversion reviews the API server has sent for our CRDs, by `<crd> to <version>`, from its
/// own metric (`apiserver_crd_conversion_webhook_duration_seconds_count`).
pub async fn conversion_reviews(kubectl: &Kubectl) -> anyhow::Result<BTreeMap<String, u64>> {
    let metrics = kubectl
        .run(&["get", "--raw", "/metrics"])
        .await
        .context("kubectl get --raw /metrics")?;
    parse_conversion_reviews(&metrics)
}

/// The counts of [`conversion_reviews`] in the API server's metrics text; a count that is not a
/// number is an error, never a zero.
fn parse_conversion_reviews(metrics: &str) -> anyhow::Result<BTreeMap<String, u64>> {
    let mut reviews = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) =
            line.strip_prefix("apiserver_crd_conversion_webhook_duration_seconds_count{")
        else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let label = |key: &str| {
            labels.split(',').find_map(|kv| {
                let (k, v) = kv.split_once('=')?;
                (k == key).then(|| v.trim_matches('"').to_string())
            })
        };
        let (Some(crd), Some(to)) = (label("crd_name"), label("to_version")) else {
            continue;
        };
        if !crd.ends_with(capmvm_api::GROUP) {
            continue;
        }
        let count = value
            .trim()
            .parse::<f64>()
            .with_context(|| format!("the API server's metric line {line:?}"))?;
        *reviews.entry(format!("{crd} to {to}")).or_default() += count as u64;
    }
    Ok(reviews)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversion_reviews_are_read_from_the_api_servers_metric() {
        let metrics = "# HELP x\n\
apiserver_crd_conversion_webhook_duration_seconds_count{crd_name=\"microvmmachines.infrastructure.cluster.x-k8s.io\",from_version=\"v1alpha2\",succeeded=\"true\",to_version=\"v1alpha1\"} 12\n\
apiserver_crd_conversion_webhook_duration_seconds_count{crd_name=\"microvmmachines.infrastructure.cluster.x-k8s.io\",from_version=\"v1alpha2\",succeeded=\"false\",to_version=\"v1alpha1\"} 1\n\
apiserver_crd_conversion_webhook_duration_seconds_count{crd_name=\"machines.cluster.x-k8s.io\",from_version=\"v1beta1\",succeeded=\"true\",to_version=\"v1beta2\"} 40\n\
apiserver_crd_conversion_webhook_duration_seconds_sum{crd_name=\"microvmmachines.infrastructure.cluster.x-k8s.io\",from_version=\"v1alpha2\",succeeded=\"true\",to_version=\"v1alpha1\"} 0.5\n";
        let reviews = parse_conversion_reviews(metrics).unwrap();
        assert_eq!(
            reviews.get("microvmmachines.infrastructure.cluster.x-k8s.io to v1alpha1"),
            Some(&13)
        );
        assert_eq!(
            reviews.len(),
            1,
            "CAPI's own CRDs are not ours: {reviews:?}"
        );
        let garbled = "apiserver_crd_conversion_webhook_duration_seconds_count{crd_name=\"microvmmachines.infrastructure.cluster.x-k8s.io\",to_version=\"v1alpha1\"} many\n";
        assert!(parse_conversion_reviews(garbled).is_err());
    }
}
