//! Our components on the real management cluster, as a user installs them: `infrastructure-components.yaml`
//! rendered by the real `clusterctl generate yaml` and applied with the real kubectl, then what
//! `clusterctl init` would add (its label on the objects and the provider's inventory entry), which
//! `clusterctl move` relies on. `clusterctl init` itself cannot run here: it first downloads and
//! installs cert-manager, and waits for its Pods (no internet, no kubelet).

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use capmvm_upstream::capi::{record_provider, wait_crds_established};
use capmvm_upstream::tools::{Clusterctl, Kubectl};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;

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

/// Renders and applies our components and records us in clusterctl's inventory.
pub async fn install(
    clusterctl: &Clusterctl,
    kubectl: &Kubectl,
    client: &kube::Client,
    dir: &Path,
) -> anyhow::Result<()> {
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
    kubectl
        .apply(&rendered, &[])
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
    Ok(())
}
