//! Crashing and restarting the management cluster's own processes, as `capmvm-sim soak
//! --control-plane real` does: etcd and kube-apiserver are SIGKILLed and started again with the
//! same flags (etcd on the same data directory), CAPI's managers SIGKILLed and started again.

use anyhow::Context as _;
use capmvm_upstream::capi::{Provider, StoppedManager};

use super::RealStack;

impl RealStack {
    /// SIGKILLs etcd (the management cluster's and every workload API's store).
    pub async fn crash_etcd(&mut self) -> anyhow::Result<()> {
        self.etcd
            .as_mut()
            .context("the stack is stopped")?
            .crash()
            .await;
        Ok(())
    }

    /// Starts etcd again on the same data directory and ports; returns once it is healthy.
    pub async fn restart_etcd(&mut self) -> anyhow::Result<()> {
        self.etcd
            .as_mut()
            .context("the stack is stopped")?
            .restart()
            .await
            .context("restarting etcd")
    }

    /// SIGKILLs the management kube-apiserver.
    pub async fn crash_management(&mut self) -> anyhow::Result<()> {
        self.management
            .as_mut()
            .context("the stack is stopped")?
            .crash()
            .await;
        Ok(())
    }

    /// Starts the management kube-apiserver again (same port, certificates and audit log);
    /// returns once `/readyz` answers.
    pub async fn restart_management(&mut self) -> anyhow::Result<()> {
        self.management
            .as_mut()
            .context("the stack is stopped")?
            .restart()
            .await
            .context("restarting the management kube-apiserver")
    }

    /// SIGKILLs CAPI's `provider` manager; [`RealStack::start_capi`] starts it again.
    pub async fn kill_capi(&mut self, provider: Provider) -> Option<StoppedManager> {
        self.capi.as_mut()?.kill_manager(provider).await
    }
}
