//! Operator replicas beside (or instead of) the stack's own operator, as a Deployment of several
//! replicas runs them: each its own process, `POD_NAME` (its Lease identity and user agent carry
//! it, so the audit log tells the replicas apart), log and kubeconfig. A replica's kubeconfig may
//! point at a [`capmvm_upstream::link::Link`] in front of the API server, to partition that
//! replica alone.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use super::RealStack;
use super::components::Webhook;
use crate::world::{OperatorProcess, spawn_operator};

impl RealStack {
    /// The management kube-apiserver's address.
    pub fn management_addr(&self) -> anyhow::Result<SocketAddr> {
        let management = self.management.as_ref().context("the stack is stopped")?;
        let url = management.url();
        url.strip_prefix("https://")
            .unwrap_or(url)
            .trim_end_matches('/')
            .parse()
            .with_context(|| format!("the management API's URL {url} is not https://<ip>:<port>"))
    }

    /// Writes at `path` the operator's kubeconfig (its ServiceAccount's token) with `server` in
    /// place of the API server's address: a link in front of it.
    pub fn operator_kubeconfig_via(
        &self,
        server: SocketAddr,
        path: &Path,
    ) -> anyhow::Result<PathBuf> {
        let direct = std::fs::read_to_string(&self.operator_kubeconfig).with_context(|| {
            format!(
                "reading {} (are our components installed?)",
                self.operator_kubeconfig.display()
            )
        })?;
        let url = format!("https://{}", self.management_addr()?);
        anyhow::ensure!(
            direct.contains(&url),
            "the operator's kubeconfig does not name {url}"
        );
        let via = direct.replace(&url, &format!("https://{server}"));
        capmvm_upstream::pki::write_private(path, via.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(path.to_path_buf())
    }

    /// Where replica `name` logs.
    pub fn replica_log(&self, name: &str) -> PathBuf {
        self.dir.join(format!("operator-{name}.log"))
    }

    /// Starts operator replica `name` as the operator's ServiceAccount through `kubeconfig`, with
    /// the stack's operator flags and `flags`; it serves the conversion webhook the CRDs call when
    /// `serves_webhook` (one replica at a time can: out of cluster there is no Service in front).
    pub fn spawn_replica(
        &self,
        name: &str,
        kubeconfig: &Path,
        flags: &[String],
        serves_webhook: bool,
    ) -> anyhow::Result<OperatorProcess> {
        let mut all = self.options.operator_flags.clone();
        all.extend(flags.iter().cloned());
        if serves_webhook {
            let webhook = self
                .webhook
                .as_ref()
                .context("our components are not installed (RealStack::install_components)")?;
            all.extend(webhook.flags());
        } else {
            all.push("--webhook-port=0".to_string());
        }
        spawn_operator(
            &self.options.operator_command,
            kubeconfig,
            &self.replica_log(name),
            &all,
            &[("POD_NAME", name)],
        )
    }

    /// Where the operator serves the conversion webhook, once our components are installed.
    pub fn webhook(&self) -> Option<&Webhook> {
        self.webhook.as_ref()
    }
}
