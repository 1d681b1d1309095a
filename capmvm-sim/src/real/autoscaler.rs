//! cluster-autoscaler beside the real stack, run as a user runs it for a capmvm cluster from the
//! management cluster: `--cloud-provider=clusterapi`, the workload cluster's kubeconfig from its
//! `<cluster>-kubeconfig` Secret, and as `--cloud-config` a kubeconfig of its own ServiceAccount
//! (`kube-system/cluster-autoscaler`) bound to the ClusterRole our components ship for it, so real
//! RBAC judges everything it does on the management cluster.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use capmvm_operator::components::AUTOSCALER_MANAGEMENT_ROLE_NAME;
use capmvm_upstream::audit::service_account_user;
use capmvm_upstream::{AutoscalerOptions, ClusterAutoscaler};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;

use super::RealStack;
use crate::capi::workload::{ClusterKey, KUBECONFIG_KEY};

/// The autoscaler's namespace and ServiceAccount on the management cluster.
pub const NAMESPACE: &str = "kube-system";
/// Its ServiceAccount.
pub const SERVICE_ACCOUNT: &str = "cluster-autoscaler";
/// The binding of that ServiceAccount to our role.
pub const BINDING: &str = "cluster-autoscaler-capmvm";

/// The running autoscaler and what it was started with.
pub struct Autoscaler {
    /// The process.
    pub process: ClusterAutoscaler,
    /// The Cluster whose node groups it scales.
    pub cluster: ClusterKey,
    /// The workload kubeconfig it reads Nodes and Pods with (the Cluster's kubeconfig Secret).
    pub workload_kubeconfig: PathBuf,
    /// Its `--cloud-config`: its ServiceAccount's token on the management cluster.
    pub management_kubeconfig: PathBuf,
}

/// Its ServiceAccount and the binding to our role, as `kubectl apply`.
fn rbac_manifest() -> String {
    format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: {SERVICE_ACCOUNT}\n  namespace: {NAMESPACE}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: {BINDING}\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: {AUTOSCALER_MANAGEMENT_ROLE_NAME}\nsubjects:\n- kind: ServiceAccount\n  name: {SERVICE_ACCOUNT}\n  namespace: {NAMESPACE}\n"
    )
}

impl RealStack {
    /// The username the autoscaler's requests to the management cluster carry.
    pub fn autoscaler_user() -> String {
        service_account_user(NAMESPACE, SERVICE_ACCOUNT)
    }

    /// Starts cluster-autoscaler for Cluster `namespace/name` (node groups of that Cluster, found by
    /// their min/max annotations); `tune` adjusts the options (timings) before it starts.
    pub async fn start_autoscaler(
        &mut self,
        namespace: &str,
        name: &str,
        tune: impl FnOnce(&mut AutoscalerOptions),
    ) -> anyhow::Result<&Autoscaler> {
        anyhow::ensure!(
            self.autoscaler.is_none(),
            "the autoscaler is already running"
        );
        self.kubectl
            .apply(&rbac_manifest(), &[])
            .await
            .context("kubectl apply of the autoscaler's ServiceAccount and binding")?;
        let management = self.management.as_ref().context("the stack is stopped")?;
        let management_kubeconfig = management
            .service_account_kubeconfig(
                NAMESPACE,
                SERVICE_ACCOUNT,
                Duration::from_secs(48 * 3600),
                &self.dir.join("cluster-autoscaler.kubeconfig"),
            )
            .await
            .context("a token for the autoscaler's ServiceAccount")?;
        // What a user mounts: the `value` of the Cluster's kubeconfig Secret.
        let secret = Api::<Secret>::namespaced(self.client.clone(), namespace)
            .get(&format!("{name}-kubeconfig"))
            .await
            .with_context(|| format!("reading Secret {namespace}/{name}-kubeconfig"))?;
        let value = secret
            .data
            .and_then(|d| d.get(KUBECONFIG_KEY).cloned())
            .with_context(|| format!("Secret {name}-kubeconfig has no `{KUBECONFIG_KEY}`"))?;
        let workload_kubeconfig = self.dir.join(format!("{namespace}-{name}.kubeconfig"));
        capmvm_upstream::pki::write_private(&workload_kubeconfig, &value.0)
            .context("writing the workload kubeconfig")?;
        let mut options =
            AutoscalerOptions::new(&self.dir, &workload_kubeconfig, &management_kubeconfig);
        options.namespace = Some(namespace.to_string());
        options.cluster_name = Some(name.to_string());
        tune(&mut options);
        let process = ClusterAutoscaler::start(&self.binaries, &options)
            .await
            .context("starting cluster-autoscaler")?;
        Ok(self.autoscaler.insert(Autoscaler {
            process,
            cluster: ClusterKey::new(namespace, name),
            workload_kubeconfig,
            management_kubeconfig,
        }))
    }

    /// The autoscaler, while it runs.
    pub fn autoscaler(&self) -> Option<&Autoscaler> {
        self.autoscaler.as_ref()
    }

    /// Stops the autoscaler.
    pub async fn stop_autoscaler(&mut self) {
        if let Some(a) = self.autoscaler.take() {
            a.process.stop().await;
        }
    }
}
