//! The real stack on loopback: etcd, kube-apiserver and kube-controller-manager as a management
//! cluster; Cluster API v1.14's own core and kubeadm bootstrap managers with their webhooks;
//! our components rendered by the real clusterctl and applied with the real kubectl; the operator
//! out of cluster as its ServiceAccount (so RBAC judges every request); per Cluster a workload
//! kube-apiserver, kube-scheduler and kube-controller-manager whose Nodes the hollow kubelets
//! register and whose Pods they run; the hollow flintlock hosts; on demand cluster-autoscaler
//! ([`autoscaler`]).
//!
//! Two parts are not upstream's: the KubeadmControlPlane is played by the stand-in
//! ([`crate::capi::kcp`]; the real one needs etcd inside the workload cluster, reached through a
//! kubelet's port-forward), and the hollow kubelets, which register Nodes from each microVM's
//! cloud-init as on the emulator. docs/real-stack.md says why and what that leaves out.

pub mod autoscaler;
pub mod components;
mod faults;
pub mod go_provider;
pub mod replicas;
pub mod workload;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use capmvm_flintlock::hollow::pki::TestPki;
use capmvm_flintlock::hollow::{HollowHandle, VmSnapshot};
use capmvm_upstream::audit::{AuditLog, service_account_user};
use capmvm_upstream::capi::{Capi, CapiOptions, Provider, StoppedManager};
use capmvm_upstream::tools::{Clusterctl, Kubectl};
use capmvm_upstream::{
    ApiServerOptions, Binaries, ControlPlaneComponent, Etcd, KubeApiServer, ScratchDir,
};
use kube::api::{ApiResource, DynamicObject};

use crate::capi::kubelet::{KubeletControl, KubeletOptions, Kubelets};
use crate::capi::workload::{ClusterKey, WorkloadClusters};
use crate::capi::{self, StandIn, StandInOptions, StandInPlays};
use crate::stack::{self, RequestCounts, Stack};
use crate::world::{HostAuth, OperatorProcess, WorldOptions, spawn_operator, start_hosts};

use self::workload::WorkloadApi;

/// The upstream binaries the real stack runs.
pub const BINARIES: &[&str] = &[
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "capi-manager",
    "capi-kubeadm-bootstrap-manager",
    "clusterctl",
];

/// What the management cluster's kube-controller-manager runs: ownerReferences' garbage
/// collection and namespace deletion (CAPI relies on both), ServiceAccounts, role aggregation.
const MANAGEMENT_CONTROLLERS: &str = "garbage-collector-controller,namespace-controller,serviceaccount-controller,clusterrole-aggregation-controller";

/// What a `clusterctl move` target shares with the stack it moves from.
struct Shared {
    host_controls: Vec<capmvm_flintlock::hollow::HostControl>,
    endpoints: Vec<String>,
}

/// A running real stack.
pub struct RealStack {
    /// Working directory: certificates, kubeconfigs, every component's log.
    pub dir: PathBuf,
    /// The upstream binaries.
    pub binaries: Binaries,
    /// An administrator's client of the management cluster.
    pub client: kube::Client,
    /// The pinned kubectl with the administrator's kubeconfig.
    pub kubectl: Kubectl,
    /// The pinned clusterctl.
    pub clusterctl: Clusterctl,
    /// The kubeconfig the operator uses: its ServiceAccount's token (once our components are
    /// installed).
    pub operator_kubeconfig: PathBuf,
    /// Where the operator serves the conversion webhook (once our components are installed).
    webhook: Option<components::Webhook>,
    /// The hollow hosts.
    pub hosts: Vec<HollowHandle>,
    /// The endpoints of another stack's hosts this one uses (a `clusterctl move` target).
    shared_endpoints: Vec<String>,
    pki: Option<TestPki>,
    workloads: WorkloadClusters,
    workload_apis: Vec<WorkloadApi>,
    kubelets: Option<Kubelets>,
    stand_in: Option<StandIn>,
    capi: Option<Capi>,
    controller_manager: Option<ControlPlaneComponent>,
    management: Option<KubeApiServer>,
    etcd: Option<Etcd>,
    operator: Option<OperatorProcess>,
    autoscaler: Option<autoscaler::Autoscaler>,
    go_provider: Option<go_provider::GoProvider>,
    options: WorldOptions,
    /// `dir` itself: the last field, so it is removed after every process writing into it stopped.
    scratch: ScratchDir,
}

impl RealStack {
    /// Starts everything but the operator ([`RealStack::start_operator`]). `options` as for a
    /// [`crate::world::World`]; its emulator settings do not apply, and the real CABPK rotates
    /// join tokens on its own schedule.
    pub async fn start(options: WorldOptions) -> anyhow::Result<RealStack> {
        Self::start_with(options, None, true).await
    }

    /// Like [`RealStack::start`], without our components: a management cluster as another
    /// provider's users have it (the Go provider: [`RealStack::install_go_provider`]); [`RealStack::install_components`] adds ours.
    pub async fn start_without_components(options: WorldOptions) -> anyhow::Result<RealStack> {
        Self::start_with(options, None, false).await
    }

    /// Installs our components as a user does ([`components::install`]; over CRDs of the same
    /// names, as a move from the Go provider does) and makes the operator's kubeconfig.
    pub async fn install_components(&mut self) -> anyhow::Result<()> {
        let webhook = components::install(&self.clusterctl, &self.kubectl, &self.client, &self.dir)
            .await
            .context("installing our components")?;
        let management = self.management.as_ref().context("the stack is stopped")?;
        self.operator_kubeconfig = management
            .service_account_kubeconfig(
                components::NAMESPACE,
                components::SERVICE_ACCOUNT,
                Duration::from_secs(48 * 3600),
                &self.dir.join("operator.kubeconfig"),
            )
            .await
            .context("a token for the operator's ServiceAccount")?;
        self.webhook = Some(webhook);
        Ok(())
    }

    /// The etcd of the management cluster (and of the workload APIs).
    pub fn etcd(&self) -> Option<&Etcd> {
        self.etcd.as_ref()
    }

    /// A second management cluster for `clusterctl move`: its own etcd, kube-apiserver, CAPI and
    /// components (and its own KubeadmControlPlane stand-in and kubelets' view of it), over this
    /// stack's hosts and workload clusters. Its operator is started separately, as here.
    pub async fn start_move_target(&self) -> anyhow::Result<RealStack> {
        let mut options = self.options.clone();
        options.hosts = 0;
        let shared = Shared {
            host_controls: self.hosts.iter().map(HollowHandle::control).collect(),
            endpoints: self.endpoints(),
        };
        let target = Self::start_with(options, Some(shared), true).await?;
        for api in &self.workload_apis {
            let kubeconfig = std::fs::read_to_string(api.server.kubeconfig())
                .context("reading a workload kubeconfig")?;
            target.workloads.register_external(
                &api.cluster,
                api.server.url(),
                api.server.client().await?,
                kubeconfig,
            )?;
        }
        Ok(target)
    }

    async fn start_with(
        options: WorldOptions,
        shared: Option<Shared>,
        ours: bool,
    ) -> anyhow::Result<RealStack> {
        let binaries = Binaries::locate();
        if let Some(missing) = BINARIES.iter().find(|b| !binaries.have(&[b])) {
            anyhow::bail!(
                "the real stack needs the upstream binaries ({missing} is not in {}): run `hack/upstream.sh build` (it needs Go and the Go module proxy)",
                binaries.dir().display()
            );
        }
        // Removed on every way out, a failed start included, unless kept (`keep_dir`).
        let mut scratch = ScratchDir::create("capmvm-real")?;
        if options.keep_dir {
            scratch.keep();
        }
        let dir = scratch.path().to_path_buf();
        let etcd = Etcd::start(&binaries, &dir)
            .await
            .context("starting etcd")?;
        let management = KubeApiServer::start(
            &binaries,
            ApiServerOptions::new("management", &dir, &etcd.url()),
        )
        .await
        .context("starting the management kube-apiserver")?;
        let controller_manager = ControlPlaneComponent::controller_manager(
            &binaries,
            &management,
            MANAGEMENT_CONTROLLERS,
            &[],
        )
        .await
        .context("starting kube-controller-manager")?;
        let capi = Capi::install(&binaries, &management, &dir, &CapiOptions::default())
            .await
            .context("installing Cluster API")?;
        let client = management.client().await?;
        let kubectl = Kubectl::new(&binaries, management.kubeconfig())?;
        let clusterctl = Clusterctl::new(&binaries, &dir.join("clusterctl"))?;
        let (hosts, pki) = start_hosts(&options, &dir).await?;
        let (host_controls, shared_endpoints) = match shared {
            Some(s) => (s.host_controls, s.endpoints),
            None => (
                hosts.iter().map(HollowHandle::control).collect(),
                Vec::new(),
            ),
        };
        let workloads = WorkloadClusters::new(dir.join("workloads"));
        let stand_in = capi::run_with_options(
            client.clone(),
            workloads.clone(),
            StandInOptions {
                bootstrap_token_rotation: None,
                plays: StandInPlays::ControlPlaneOnly,
            },
        );
        // The workload clusters schedule (a kube-scheduler and kube-controller-manager each), so
        // the kubelets keep their Leases and run the Pods bound to their Nodes.
        let kubelets = Kubelets::start_with(
            stand_in.management_view(),
            host_controls,
            workloads.clone(),
            KubeletOptions { runs_pods: true },
        );
        let mut real = RealStack {
            operator_kubeconfig: dir.join("operator.kubeconfig"),
            webhook: None,
            dir,
            binaries,
            client,
            kubectl,
            clusterctl,
            hosts,
            shared_endpoints,
            pki,
            workloads,
            workload_apis: Vec::new(),
            kubelets: Some(kubelets),
            stand_in: Some(stand_in),
            capi: Some(capi),
            controller_manager: Some(controller_manager),
            management: Some(management),
            etcd: Some(etcd),
            operator: None,
            autoscaler: None,
            go_provider: None,
            options,
            scratch,
        };
        if ours {
            real.install_components().await?;
        }
        Ok(real)
    }

    /// The management kube-apiserver.
    pub fn management(&self) -> Option<&KubeApiServer> {
        self.management.as_ref()
    }

    /// The management cluster's audit log.
    pub fn audit(&self) -> Option<AuditLog> {
        self.management.as_ref().and_then(KubeApiServer::audit)
    }

    /// The username the operator's requests carry.
    pub fn operator_user() -> String {
        service_account_user(components::NAMESPACE, components::SERVICE_ACCOUNT)
    }

    /// The user of the infrastructure provider that runs: our operator's ServiceAccount, or the
    /// Go provider's where it runs without ours (what the bench counts as "operator").
    pub fn provider_user(&self) -> String {
        if self.operator.is_none() && self.go_provider.is_some() {
            Self::go_provider_user()
        } else {
            Self::operator_user()
        }
    }

    /// Starts the workload API of Cluster `namespace/name` (before the Cluster is created) and
    /// returns the address its template's `CONTROL_PLANE_VIP` must name.
    pub async fn prepare_cluster(
        &mut self,
        namespace: &str,
        name: &str,
    ) -> anyhow::Result<std::net::Ipv4Addr> {
        let key = ClusterKey::new(namespace, name);
        let etcd = self
            .etcd
            .as_ref()
            .map(Etcd::url)
            .context("the stack is stopped")?;
        let api = workload::start(&self.client, &self.binaries, &etcd, &self.dir, &key).await?;
        let client = api.server.client().await?;
        let kubeconfig = std::fs::read_to_string(api.server.kubeconfig())
            .context("reading the workload kubeconfig")?;
        self.workloads
            .register_external(&key, api.server.url(), client, kubeconfig)?;
        let vip = api.vip;
        self.workload_apis.push(api);
        Ok(vip)
    }

    /// Where the operator logs.
    pub fn operator_log(&self) -> PathBuf {
        self.dir.join("operator.log")
    }

    /// Starts the operator as its ServiceAccount, with `env` added to its environment.
    pub fn start_operator(&mut self, env: &[(&str, &str)]) -> anyhow::Result<()> {
        anyhow::ensure!(self.operator.is_none(), "the operator is already running");
        let webhook = self
            .webhook
            .as_ref()
            .context("our components are not installed (RealStack::install_components)")?;
        let mut flags = self.options.operator_flags.clone();
        flags.extend(webhook.flags());
        self.operator = Some(spawn_operator(
            &self.options.operator_command,
            &self.operator_kubeconfig,
            &self.operator_log(),
            &flags,
            env,
        )?);
        Ok(())
    }

    /// Runs `capmvm-operator migrate-storage` as the operator's ServiceAccount (as `kubectl exec`
    /// into its Pod does); its output, or its error output.
    pub async fn migrate_storage(&self) -> anyhow::Result<Result<String, String>> {
        let (program, prefix) = &self.options.operator_command;
        let mut command = tokio::process::Command::new(program);
        command
            .args(prefix)
            .arg("--kubeconfig")
            .arg(&self.operator_kubeconfig)
            .arg("migrate-storage")
            .env_remove("KUBECONFIG")
            .kill_on_drop(true);
        capmvm_upstream::process::die_with_parent(&mut command);
        let output = command
            .output()
            .await
            .with_context(|| format!("running {} migrate-storage", program.display()))?;
        let stdout = String::from_utf8_lossy(&output.stdout).to_string();
        let stderr = String::from_utf8_lossy(&output.stderr).to_string();
        Ok(if output.status.success() {
            Ok(stdout)
        } else {
            Err(format!("{stdout}{stderr}"))
        })
    }

    /// The operator process, while it runs.
    pub fn operator(&self) -> Option<&OperatorProcess> {
        self.operator.as_ref()
    }

    /// The operator's process id, while it runs.
    pub fn operator_pid(&self) -> Option<u32> {
        self.operator.as_ref().and_then(OperatorProcess::pid)
    }

    /// Waits up to `timeout` for the operator to exit by itself; its exit code.
    pub async fn wait_operator_exit(&mut self, timeout: Duration) -> Option<i32> {
        let code = self.operator.as_mut()?.wait_exit(timeout).await;
        if code.is_some() {
            self.operator = None;
        }
        code
    }

    /// Kills the operator at once (SIGKILL), as a crash would.
    pub async fn kill_operator(&mut self) {
        if let Some(op) = self.operator.take() {
            op.kill().await;
        }
    }

    /// Stops the operator with SIGTERM.
    pub async fn stop_operator(&mut self) {
        if let Some(op) = self.operator.take() {
            op.stop().await;
        }
    }

    /// The hollow kubelets.
    pub fn kubelets(&self) -> KubeletControl {
        self.kubelets
            .as_ref()
            .map(|k| k.control().clone())
            .unwrap_or_default()
    }

    /// The hosts' endpoints (another stack's, for a `clusterctl move` target).
    pub fn endpoints(&self) -> Vec<String> {
        if self.hosts.is_empty() {
            self.shared_endpoints.clone()
        } else {
            stack::endpoints(&self.hosts)
        }
    }

    /// Every microVM on every host, with the host's endpoint.
    pub fn all_vms(&self) -> Vec<(String, VmSnapshot)> {
        stack::all_vms(&self.hosts)
    }

    /// Flintlock calls the hosts answered, by method.
    pub fn flintlock_calls(&self) -> BTreeMap<&'static str, u64> {
        stack::flintlock_calls(&self.hosts)
    }

    /// The upstream processes' ids (etcd, the kube-apiservers, kube-controller-manager, CAPI's
    /// managers), for measuring what they cost.
    pub fn upstream_pids(&self) -> Vec<u32> {
        let mut pids: Vec<Option<u32>> = vec![
            self.etcd.as_ref().and_then(Etcd::pid),
            self.management.as_ref().and_then(KubeApiServer::pid),
            self.controller_manager
                .as_ref()
                .and_then(ControlPlaneComponent::pid),
        ];
        pids.extend(
            self.workload_apis
                .iter()
                .flat_map(|a| a.pids().into_iter().map(Some)),
        );
        if let Some(capi) = &self.capi {
            pids.extend(
                [
                    capmvm_upstream::capi::Provider::Core,
                    capmvm_upstream::capi::Provider::KubeadmBootstrap,
                ]
                .map(|p| capi.pid(p)),
            );
        }
        pids.into_iter().flatten().collect()
    }

    /// The CAPI managers.
    pub fn capi(&self) -> Option<&Capi> {
        self.capi.as_ref()
    }

    /// Stops CAPI's `provider` manager (the first half of `kubectl rollout restart deployment`
    /// for an installed one); [`RealStack::start_capi`] runs it again. Apart so a caller can tell
    /// what the old process did from what the new one does.
    pub async fn stop_capi(&mut self, provider: Provider) -> Option<StoppedManager> {
        self.capi.as_mut()?.stop_manager(provider).await
    }

    /// Starts a manager [`RealStack::stop_capi`] stopped, with the same flags; returns once ready.
    pub async fn start_capi(&mut self, stopped: StoppedManager) -> anyhow::Result<()> {
        if let Some(capi) = self.capi.as_mut() {
            capi.start(stopped, &self.dir).await?;
        }
        Ok(())
    }

    /// Keeps the working directory (logs, certificates, kubeconfigs) after shutdown.
    pub fn keep_dir(&mut self) {
        self.options.keep_dir = true;
        self.scratch.keep();
    }

    /// Stops everything, in the reverse order of starting; keeps the directory if asked to.
    pub async fn shutdown(mut self) {
        self.stop_autoscaler().await;
        self.stop_operator().await;
        self.stop_go_provider().await;
        self.kubelets = None;
        if let Some(s) = self.stand_in.take() {
            s.stop();
        }
        self.workloads.stop_all().await;
        for api in std::mem::take(&mut self.workload_apis) {
            api.stop().await;
        }
        if let Some(capi) = self.capi.take() {
            capi.stop().await;
        }
        if let Some(c) = self.controller_manager.take() {
            c.stop().await;
        }
        if let Some(m) = self.management.take() {
            m.stop().await;
        }
        if let Some(e) = self.etcd.take() {
            e.stop().await;
        }
        for h in std::mem::take(&mut self.hosts) {
            h.shutdown().await;
        }
        // `scratch` goes with `self`.
    }
}

impl Drop for RealStack {
    fn drop(&mut self) {
        for api in &self.workload_apis {
            workload::release_vip(api.vip);
        }
    }
}

impl Stack for RealStack {
    fn client(&self) -> &kube::Client {
        &self.client
    }

    fn hosts(&self) -> &[HollowHandle] {
        &self.hosts
    }

    fn host_auth(&self) -> &HostAuth {
        &self.options.auth
    }

    fn host_pki(&self) -> Option<&TestPki> {
        self.pki.as_ref()
    }

    fn workloads(&self) -> &WorkloadClusters {
        &self.workloads
    }

    fn operator_log(&self) -> PathBuf {
        self.dir.join("operator.log")
    }

    fn operator_metrics(&self) -> Option<std::net::SocketAddr> {
        self.operator.as_ref().map(|o| o.metrics)
    }

    /// Ours, or the Go provider's manager where it runs without ours.
    fn operator_pid(&self) -> Option<u32> {
        match (&self.operator, &self.go_provider) {
            (None, Some(go)) => go.pid(),
            (op, _) => op.as_ref().and_then(OperatorProcess::pid),
        }
    }

    fn kubelets(&self) -> crate::capi::kubelet::KubeletControl {
        self.kubelets
            .as_ref()
            .map(|k| k.control().clone())
            .unwrap_or_default()
    }

    fn kubeconfig(&self) -> PathBuf {
        self.management
            .as_ref()
            .map(|m| m.kubeconfig().to_path_buf())
            .unwrap_or_default()
    }

    fn api_requests(&self) -> anyhow::Result<RequestCounts> {
        audit_counts(self.audit(), None)
    }

    fn operator_requests(&self) -> anyhow::Result<RequestCounts> {
        audit_counts(self.audit(), Some(&self.provider_user()))
    }

    fn throttled(&self) -> anyhow::Result<Option<(u64, u64)>> {
        let requests = audit_requests(self.audit())?;
        let operator = self.provider_user();
        let throttled = requests.iter().filter(|e| e.code() == 429);
        let (all, ours) = throttled.fold((0, 0), |(all, ours), e| {
            (all + 1, ours + u64::from(e.user.username == operator))
        });
        Ok(Some((all, ours)))
    }

    fn operator_denials(&self) -> anyhow::Result<Option<(u64, Vec<String>)>> {
        let operator = self.provider_user();
        let requests = audit_requests(self.audit())?;
        let ours: Vec<_> = requests
            .iter()
            .filter(|e| e.user.username == operator)
            .collect();
        let denied = ours
            .iter()
            .filter(|e| e.denied_by_authorization())
            .map(|e| format!("{} {}", e.verb, e.request_uri))
            .collect();
        Ok(Some((ours.len() as u64, denied)))
    }

    /// `clusterctl generate cluster <name> --from <template>` with `vars` in its environment, as
    /// a user renders a template.
    async fn render(
        &self,
        template: &str,
        vars: &BTreeMap<String, String>,
    ) -> anyhow::Result<Vec<DynamicObject>> {
        let name = vars
            .get("CLUSTER_NAME")
            .cloned()
            .unwrap_or_else(|| "demo".to_string());
        let namespace = vars
            .get("NAMESPACE")
            .cloned()
            .unwrap_or_else(|| "default".to_string());
        let file = self.dir.join(format!(
            "template-{}.yaml",
            k8s_openapi::jiff::Timestamp::now().as_nanosecond()
        ));
        std::fs::write(&file, template).context("writing the template")?;
        let vars: Vec<(String, String)> =
            vars.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let rendered = self
            .clusterctl
            .generate_cluster(&name, &file, &namespace, &vars)
            .await
            .context("clusterctl generate cluster")?;
        let _ = std::fs::remove_file(&file);
        Ok(crate::manifest::parse(&rendered)?)
    }

    /// `kubectl apply -f -` of the objects, as a user applies a rendered template.
    async fn apply(&self, objects: &[DynamicObject]) -> anyhow::Result<Vec<String>> {
        let mut yaml = String::new();
        let mut names = Vec::new();
        for object in objects {
            yaml.push_str("---\n");
            yaml.push_str(&serde_saphyr::to_string(object).context("serialising a manifest")?);
            let kind = object
                .types
                .as_ref()
                .map(|t| t.kind.clone())
                .unwrap_or_default();
            names.push(format!(
                "{kind}/{}",
                object.metadata.name.clone().unwrap_or_default()
            ));
        }
        self.kubectl
            .apply(&yaml, &[])
            .await
            .context("kubectl apply")?;
        Ok(names)
    }

    /// `kubectl scale <plural>.<group> <name> --replicas=N`.
    async fn scale(
        &self,
        resource: &ApiResource,
        namespace: &str,
        name: &str,
        replicas: usize,
    ) -> anyhow::Result<()> {
        self.kubectl
            .run(&[
                "scale",
                "-n",
                namespace,
                &format!("{}.{}/{name}", resource.plural, resource.group),
                &format!("--replicas={replicas}"),
            ])
            .await
            .context("kubectl scale")?;
        Ok(())
    }

    /// `kubectl delete <plural>.<group> <name> --wait=false`.
    async fn delete(
        &self,
        resource: &ApiResource,
        namespace: &str,
        name: &str,
    ) -> anyhow::Result<()> {
        self.kubectl
            .run(&[
                "delete",
                "-n",
                namespace,
                &format!("{}.{}/{name}", resource.plural, resource.group),
                "--wait=false",
            ])
            .await
            .context("kubectl delete")?;
        Ok(())
    }
}

/// An audited request's resource as the emulator's counters name it:
/// `<group, or core>/<plural>[/<subresource>]` (empty for a non-resource path such as /version).
fn counter_resource(e: &capmvm_upstream::AuditEvent) -> String {
    match &e.object_ref {
        Some(o) => {
            let group = if o.api_group.is_empty() {
                "core"
            } else {
                o.api_group.as_str()
            };
            if o.subresource.is_empty() {
                format!("{group}/{}", o.resource)
            } else {
                format!("{group}/{}/{}", o.resource, o.subresource)
            }
        }
        None => String::new(),
    }
}

/// Every request of the audit log. A log that is not there or cannot be read is an error: the
/// numbers a bench reports from it would read as zero requests.
fn audit_requests(log: Option<AuditLog>) -> anyhow::Result<Vec<capmvm_upstream::AuditEvent>> {
    let log =
        log.context("the management API keeps no audit log: its requests cannot be counted")?;
    // `requests` reads a log not written yet as empty; by the time anything is counted the server
    // has logged its own start, so a missing file means the log is elsewhere or gone.
    if !log.path().is_file() {
        anyhow::bail!(
            "the audit log {} is missing: the API requests cannot be counted",
            log.path().display()
        );
    }
    log.requests()
        .with_context(|| format!("reading the audit log {}", log.path().display()))
}

/// Requests by verb and resource from the audit log, of one user or of all.
fn audit_counts(log: Option<AuditLog>, user: Option<&str>) -> anyhow::Result<RequestCounts> {
    let mut counts = RequestCounts::default();
    for e in audit_requests(log)?
        .iter()
        .filter(|e| user.is_none_or(|u| e.user.username == u))
    {
        counts.add(&e.verb, &counter_resource(e), 1);
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// The bench's numbers come from the audit log: a log that is not there or cannot be read is
    /// an error naming it, never a count of zero requests.
    #[test]
    fn an_audit_log_that_cannot_be_read_is_an_error_not_zero_requests() {
        let dir = std::env::temp_dir().join(format!("capmvm-audit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.log");
        let error = audit_counts(Some(AuditLog::new(&missing)), None).unwrap_err();
        assert!(
            format!("{error:#}").contains(&missing.display().to_string()),
            "{error:#}"
        );
        // A directory where the log should be: it exists but cannot be read as a file.
        let unreadable = dir.join("unreadable.log");
        std::fs::create_dir_all(&unreadable).unwrap();
        assert!(audit_counts(Some(AuditLog::new(&unreadable)), None).is_err());
        assert!(audit_counts(None, None).is_err());

        let log = dir.join("audit.log");
        std::fs::write(
            &log,
            r#"{"auditID":"a","stage":"ResponseComplete","verb":"create","user":{"username":"u"},"objectRef":{"resource":"pods"},"responseStatus":{"code":201}}"#,
        )
        .unwrap();
        let counts = audit_counts(Some(AuditLog::new(&log)), Some("u")).unwrap();
        assert_eq!((counts.total(), counts.writes()), (1, 1));
        assert_eq!(
            audit_counts(Some(AuditLog::new(&log)), Some("someone else"))
                .unwrap()
                .total(),
            0
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
