//! The Go provider (`cluster-api-provider-microvm` v0.10.1) itself on the real stack: its manager
//! built from its pinned archive by `hack/upstream.sh`, its CRDs, RBAC and webhooks from the
//! archive's `config/` as `clusterctl init` installs them ([`capmvm_upstream::go_provider`]),
//! running as its ServiceAccount and talking to the hollow hosts through its own flintlock Go
//! client. The migration test starts from what it made; the bench runs it beside us.

use anyhow::Context as _;
use capmvm_upstream::audit::service_account_user;
pub use capmvm_upstream::go_provider::{
    BINARY, GoProvider, INVENTORY_NAME, NAMESPACE, SERVICE_ACCOUNT, VERSION,
};

use super::RealStack;

impl RealStack {
    /// Installs the Go provider as its users did and starts its manager with `extra_args` after
    /// its own flags; returns once it serves its webhooks.
    pub async fn install_go_provider(&mut self, extra_args: &[String]) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.go_provider.is_none(),
            "the Go provider is already installed"
        );
        let management = self.management.as_ref().context("the stack is stopped")?;
        let provider = GoProvider::install(&self.binaries, management, &self.dir, extra_args)
            .await
            .context("installing the Go provider")?;
        self.go_provider = Some(provider);
        Ok(())
    }

    /// The Go provider, once installed.
    pub fn go_provider(&self) -> Option<&GoProvider> {
        self.go_provider.as_ref()
    }

    /// Stops the Go provider's manager, as scaling its Deployment to zero does (its CRDs, RBAC
    /// and webhook configurations stay).
    pub async fn stop_go_provider(&mut self) {
        if let Some(p) = self.go_provider.as_mut() {
            p.stop().await;
        }
    }

    /// Kills the Go provider's manager at once (SIGKILL), as a crash does.
    pub async fn kill_go_provider(&mut self) {
        if let Some(p) = self.go_provider.as_mut() {
            p.kill().await;
        }
    }

    /// Starts the Go provider's manager again with the same flags.
    pub async fn start_go_provider(&mut self) -> anyhow::Result<()> {
        let p = self
            .go_provider
            .as_mut()
            .context("the Go provider is not installed")?;
        p.start().await.context("restarting the Go provider")?;
        Ok(())
    }

    /// The username the Go provider's requests carry.
    pub fn go_provider_user() -> String {
        service_account_user(NAMESPACE, SERVICE_ACCOUNT)
    }
}
