//! A whole simulated world on one machine: the API emulator, hollow flintlock hosts, the CAPI stand-in,
//! and the operator in a process of its own, talking to the emulator through a kubeconfig exactly as it
//! would to a real cluster. The demo, the end-to-end tests and the benchmark all run on it.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use capmvm_api::MicrovmMachine;
use capmvm_flintlock::SecretString;
use capmvm_flintlock::hollow::pki::TestPki;
use capmvm_flintlock::hollow::{HollowConfig, HollowHandle, HollowHost, VmSnapshot};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, ListParams, PostParams};
use kube::{Api, ResourceExt};

use crate::capi::kubelet::{KubeletControl, Kubelets};
use crate::capi::workload::{ClusterKey, WorkloadClusters};
use crate::capi::{self, StandIn};
use crate::kube::{EmulatorHandle, EmulatorOptions};
use crate::manifest;
use crate::stack::{self, RequestCounts, Stack};

/// How hosts authenticate callers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum HostAuth {
    /// Plaintext, no token (flintlockd `--insecure`).
    #[default]
    None,
    /// A basic-auth token, plaintext transport.
    Token(String),
    /// TLS with client certificates required (mTLS), and a basic-auth token.
    MtlsAndToken(String),
}

/// How to build a world.
#[derive(Clone, Debug)]
pub struct WorldOptions {
    /// Number of hollow hosts.
    pub hosts: usize,
    /// Time from create to CREATED on the hosts.
    pub provision_time: Duration,
    /// Time from DELETING to gone on the hosts (before scaling).
    pub delete_time: Duration,
    /// Multiplies flintlock's own intervals on the hosts (its 20 s retry backoff); 0.001 makes a
    /// FAILED microVM appear within a second.
    pub time_scale: f64,
    /// Host authentication.
    pub auth: HostAuth,
    /// The executable that runs the operator, and the arguments before the operator's flags
    /// (for `capmvm-sim` itself: `["operator"]`).
    pub operator_command: (PathBuf, Vec<String>),
    /// Extra operator flags.
    pub operator_flags: Vec<String>,
    /// Emulator settings.
    pub emulator: EmulatorOptions,
    /// Keep the working directory (kubeconfig, logs) after the world is dropped.
    pub keep_dir: bool,
    /// How often the stand-in's CABPK rotates a MachinePool's join token (`None`: never).
    pub bootstrap_token_rotation: Option<Duration>,
}

impl WorldOptions {
    /// `hosts` hosts provisioning in `provision_time`, the operator run by `capmvm-sim operator`.
    pub fn new(hosts: usize, provision_time: Duration, sim_binary: PathBuf) -> Self {
        Self {
            hosts,
            provision_time,
            delete_time: Duration::from_millis(300),
            time_scale: 1.0,
            auth: HostAuth::None,
            operator_command: (sim_binary, vec!["operator".to_string()]),
            operator_flags: Vec::new(),
            emulator: EmulatorOptions::default(),
            keep_dir: false,
            bootstrap_token_rotation: Some(capi::DEFAULT_TOKEN_ROTATION),
        }
    }
}

/// An operator process.
pub struct OperatorProcess {
    child: tokio::process::Child,
    /// Its Prometheus metrics address.
    pub metrics: SocketAddr,
    /// Its `/healthz` and `/readyz` address.
    pub health: SocketAddr,
}

impl OperatorProcess {
    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Waits up to `timeout` for it to exit by itself; returns its exit code.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(Ok(status)) => Some(status.code().unwrap_or(-1)),
            _ => None,
        }
    }

    /// Stops it with SIGTERM and waits (SIGKILL after 10 s).
    pub async fn stop(mut self) {
        capmvm_upstream::process::terminate(&mut self.child).await;
    }

    /// Kills it at once (SIGKILL), as a crash would.
    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
    }

    /// Its Prometheus metrics, as text.
    pub async fn scrape_metrics(&self) -> anyhow::Result<String> {
        http_get(self.metrics, "/metrics").await
    }

    /// Its `/readyz` answer: the whole HTTP response (status line, headers, body).
    pub async fn readyz(&self) -> anyhow::Result<String> {
        http_get(self.health, "/readyz").await
    }
}

/// Starts `options.hosts` hollow hosts with `options`' timings and authentication (its PKI written
/// under `dir/pki` when they use TLS).
pub async fn start_hosts(
    options: &WorldOptions,
    dir: &std::path::Path,
) -> anyhow::Result<(Vec<HollowHandle>, Option<TestPki>)> {
    let pki = match &options.auth {
        HostAuth::MtlsAndToken(_) => {
            let pki = TestPki::generate().context("generating the hosts' PKI")?;
            pki.write_to(&dir.join("pki")).context("writing the PKI")?;
            Some(pki)
        }
        _ => None,
    };
    let mut hosts = Vec::new();
    for _ in 0..options.hosts {
        let config = HollowConfig {
            provision_time: options.provision_time,
            delete_time: options.delete_time,
            time_scale: options.time_scale,
            basic_auth_token: match &options.auth {
                HostAuth::None => None,
                HostAuth::Token(t) | HostAuth::MtlsAndToken(t) => {
                    Some(SecretString::new(t.clone()))
                }
            },
            tls: pki.as_ref().map(|p| p.server_tls(true)),
            ..HollowConfig::default()
        };
        hosts.push(
            HollowHost::start(config)
                .await
                .context("starting a hollow host")?,
        );
    }
    Ok((hosts, pki))
}

/// Starts the operator (`command`: the program and the arguments before the operator's flags) with
/// `kubeconfig`, free metrics and health ports, JSON logs appended to `log`, then `flags`.
pub fn spawn_operator(
    command: &(PathBuf, Vec<String>),
    kubeconfig: &std::path::Path,
    log: &std::path::Path,
    flags: &[String],
    env: &[(&str, &str)],
) -> anyhow::Result<OperatorProcess> {
    let metrics = free_port()?;
    let health = free_port()?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .context("opening the operator log")?;
    let (program, prefix) = command;
    let mut command = tokio::process::Command::new(program);
    command
        .args(prefix)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg(format!("--diagnostics-address={metrics}"))
        .arg(format!("--health-addr={health}"))
        .arg("--log-format=json")
        .args(flags)
        .env_remove("KUBECONFIG")
        // A replica's name is what a caller gives it (its user agent and Lease identity carry it).
        .env_remove("POD_NAME")
        .stdin(Stdio::null())
        .stdout(log.try_clone().context("cloning the log handle")?)
        .stderr(log)
        .kill_on_drop(true);
    // The operator must not outlive the simulator, however the simulator ends (issue 34).
    capmvm_upstream::process::die_with_parent(&mut command);
    for (k, v) in env {
        command.env(k, v);
    }
    let child = command
        .spawn()
        .with_context(|| format!("starting the operator ({})", program.display()))?;
    Ok(OperatorProcess {
        child,
        metrics,
        health,
    })
}

/// `GET path` on `addr` over plain HTTP/1.1; the whole response as text.
pub async fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: operator\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    Ok(response)
}

/// A running world.
pub struct World {
    /// Working directory: kubeconfig, PKI, operator log.
    pub dir: PathBuf,
    /// The API emulator.
    pub emulator: EmulatorHandle,
    /// A client of the emulator over HTTP, as a test or kubectl reaches it. The stand-in and the
    /// hollow kubelets, in the emulator's process, call it directly ([`World::in_process_client`]).
    pub client: kube::Client,
    /// Path of the kubeconfig the operator uses.
    pub kubeconfig: PathBuf,
    /// The hollow hosts.
    pub hosts: Vec<HollowHandle>,
    /// The PKI of the hosts, when they use TLS.
    pub pki: Option<TestPki>,
    stand_in: Option<StandIn>,
    workloads: WorkloadClusters,
    kubelets: Option<Kubelets>,
    operator: Option<OperatorProcess>,
    options: WorldOptions,
}

impl World {
    /// Starts the emulator (with every CRD installed), the hosts and the CAPI stand-in. The operator
    /// is started separately ([`World::start_operator`]).
    pub async fn start(options: WorldOptions) -> anyhow::Result<World> {
        let dir = std::env::temp_dir().join(format!(
            "capmvm-sim-{}-{}",
            std::process::id(),
            k8s_openapi::jiff::Timestamp::now().as_nanosecond()
        ));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let emulator = crate::kube::Emulator::start(options.emulator.clone())
            .await
            .context("starting the API emulator")?;
        let kubeconfig = dir.join("kubeconfig");
        emulator
            .write_kubeconfig(&kubeconfig)
            .context("writing the kubeconfig")?;
        let client = emulator
            .client()
            .context("building a client of the emulator")?;

        // CAPI's own CRDs where present (CI, development), else the built-in ones; and CAPI's
        // webhooks' defaulting, so manifests are written as for a real management cluster.
        let (capi_crds, capi_source) = capi::capi_crds().context("reading CAPI's CRDs")?;
        tracing::info!(source = %capi_source, "installing CAPI's CRDs");
        capi::admission::register(&emulator.admission());
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        let mut all_crds: Vec<CustomResourceDefinition> =
            capmvm_api::crds().into_iter().chain(capi_crds).collect();
        capi::nodes::add_missing_crds(&mut all_crds);
        for crd in all_crds {
            crds.create(&PostParams::default(), &crd)
                .await
                .with_context(|| format!("installing CRD {}", crd.name_any()))?;
        }

        let (hosts, pki) = start_hosts(&options, &dir).await?;
        // Issue 13: workload clusters served by the stand-in, Nodes registered by hollow kubelets.
        let workloads = WorkloadClusters::new(dir.join("workloads"));
        // Simulators in this process skip loopback TCP: at 10 000 machines the sockets and HTTP
        // framing of their requests and watches were about a fifth of the simulators' CPU.
        let in_process = emulator.in_process_client_as(STAND_IN_USER_AGENT);
        let stand_in = capi::run_with_options(
            in_process,
            workloads.clone(),
            capi::StandInOptions {
                bootstrap_token_rotation: options.bootstrap_token_rotation,
                plays: capi::StandInPlays::All,
            },
        );
        let kubelets = Kubelets::start(
            stand_in.management_view(),
            hosts.iter().map(HollowHandle::control).collect(),
            workloads.clone(),
        );
        Ok(World {
            dir,
            emulator,
            client,
            kubeconfig,
            hosts,
            pki,
            stand_in: Some(stand_in),
            workloads,
            kubelets: Some(kubelets),
            operator: None,
            options,
        })
    }

    /// A client that calls the emulator in this process directly, as the stand-in's does: for the
    /// simulation's own instruments (the benchmark's watch), not for what a test checks.
    pub fn in_process_client(&self) -> kube::Client {
        self.emulator.in_process_client()
    }

    /// A client of the workload API of Cluster `namespace/cluster`, while it is served: the
    /// stand-in's own, in process (its kubeconfig, [`World::workload_kubeconfig`], reaches the same
    /// API over HTTP).
    pub fn workload_client(&self, namespace: &str, cluster: &str) -> Option<kube::Client> {
        self.workloads.client(&ClusterKey::new(namespace, cluster))
    }

    /// The kubeconfig file of Cluster `namespace/cluster`'s workload API, while it is served (the
    /// `value` of its `<cluster>-kubeconfig` Secret).
    pub fn workload_kubeconfig(&self, namespace: &str, cluster: &str) -> Option<PathBuf> {
        self.workloads
            .kubeconfig_path(&ClusterKey::new(namespace, cluster))
    }

    /// The workload clusters.
    pub fn workloads(&self) -> &WorkloadClusters {
        &self.workloads
    }

    /// The hollow kubelets: the Nodes they registered, and the disruptor.
    pub fn kubelets(&self) -> KubeletControl {
        self.kubelets
            .as_ref()
            .map(|k| k.control().clone())
            .unwrap_or_default()
    }

    /// The hosts' endpoints.
    pub fn endpoints(&self) -> Vec<String> {
        stack::endpoints(&self.hosts)
    }

    /// Where the operator logs.
    pub fn operator_log(&self) -> PathBuf {
        self.dir.join("operator.log")
    }

    /// Starts the operator process with `env` added to its environment.
    pub fn start_operator(&mut self, env: &[(&str, &str)]) -> anyhow::Result<()> {
        if self.operator.is_some() {
            bail!("the operator is already running");
        }
        self.operator = Some(self.spawn_operator(&[], env)?);
        Ok(())
    }

    /// Starts one more operator process (for leader election), with `flags` after the world's own.
    /// Its output goes to the same log.
    pub fn spawn_operator(
        &self,
        flags: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<OperatorProcess> {
        let mut all: Vec<String> = self.options.operator_flags.clone();
        all.extend(flags.iter().map(|f| f.to_string()));
        spawn_operator(
            &self.options.operator_command,
            &self.kubeconfig,
            &self.operator_log(),
            &all,
            env,
        )
    }

    /// The operator's process id, while it runs.
    pub fn operator_pid(&self) -> Option<u32> {
        self.operator.as_ref().and_then(OperatorProcess::pid)
    }

    /// The operator process, while it runs.
    pub fn operator(&self) -> Option<&OperatorProcess> {
        self.operator.as_ref()
    }

    /// Takes the operator process out of the world (the caller stops it).
    pub fn take_operator(&mut self) -> Option<OperatorProcess> {
        self.operator.take()
    }

    /// Waits up to `timeout` for the operator to exit by itself; returns its exit code.
    pub async fn wait_operator_exit(&mut self, timeout: Duration) -> Option<i32> {
        let code = self.operator.as_mut()?.wait_exit(timeout).await;
        if code.is_some() {
            self.operator = None;
        }
        code
    }

    /// Stops the operator with SIGTERM and waits for it.
    pub async fn stop_operator(&mut self) {
        if let Some(op) = self.operator.take() {
            op.stop().await;
        }
    }

    /// Kills the operator at once (SIGKILL), as a crash would.
    pub async fn kill_operator(&mut self) {
        if let Some(op) = self.operator.take() {
            op.kill().await;
        }
    }

    /// Creates the Secrets the hosts' authentication needs, named `<cluster>-flintlock-token` and
    /// `<cluster>-flintlock-tls`, and returns `(basicAuthSecret, tlsSecretRef)` to put in the
    /// MicrovmCluster.
    pub async fn create_credentials(
        &self,
        namespace: &str,
        cluster: &str,
    ) -> anyhow::Result<(Option<String>, Option<String>)> {
        stack::create_credentials(self, namespace, cluster).await
    }

    /// Renders `templates/cluster-template.yaml` with these hosts and `vars` (as clusterctl fills
    /// variables), and lets `edit` change the objects before they are applied. With
    /// `CONTROL_PLANE_MACHINE_COUNT=0` the cluster has no control plane (no KubeadmControlPlane and no
    /// `controlPlaneRef`: CAPI refuses a KubeadmControlPlane of 0 replicas), for worker-only tests.
    pub async fn apply_demo_cluster(
        &self,
        vars: &[(&str, String)],
        edit: impl FnOnce(&mut Vec<DynamicObject>),
    ) -> anyhow::Result<Vec<String>> {
        self.apply_template(DEMO_CLUSTER, vars, edit).await
    }

    /// [`World::apply_demo_cluster`] for another cluster template (such as
    /// [`MACHINEPOOL_CLUSTER`], the `machinepool` flavor).
    pub async fn apply_template(
        &self,
        template: &str,
        vars: &[(&str, String)],
        edit: impl FnOnce(&mut Vec<DynamicObject>),
    ) -> anyhow::Result<Vec<String>> {
        stack::apply_template(self, template, vars, edit).await
    }

    /// Every microVM on every host, with the host's endpoint.
    pub fn all_vms(&self) -> Vec<(String, VmSnapshot)> {
        stack::all_vms(&self.hosts)
    }

    /// Flintlock calls the hosts answered, by method (methods never called left out).
    pub fn flintlock_calls(&self) -> BTreeMap<&'static str, u64> {
        stack::flintlock_calls(&self.hosts)
    }

    /// The MicrovmMachines of `namespace`.
    pub async fn microvm_machines(&self, namespace: &str) -> anyhow::Result<Vec<MicrovmMachine>> {
        Ok(
            Api::<MicrovmMachine>::namespaced(self.client.clone(), namespace)
                .list(&ListParams::default())
                .await?
                .items,
        )
    }

    /// The operator's CPU seconds and peak resident memory in KiB, from /proc (Linux).
    pub fn operator_usage(&self) -> Option<(f64, u64)> {
        let pid = self.operator_pid()?;
        process_usage(pid)
    }

    /// Stops everything; keeps the working directory if asked to.
    pub async fn shutdown(mut self) {
        self.stop_operator().await;
        if let Some(s) = self.stand_in.take() {
            s.stop();
        }
        self.kubelets = None;
        self.workloads.stop_all().await;
        for h in std::mem::take(&mut self.hosts) {
            h.shutdown().await;
        }
        if !self.options.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// User agent of the CAPI stand-in's requests (its controllers, the hollow kubelets' view of the
/// management cluster): counted apart, and faulted apart by the soak.
pub const STAND_IN_USER_AGENT: &str = concat!("capmvm-capi-stand-in/", env!("CARGO_PKG_VERSION"));

/// The shipped cluster template the demo applies, compiled in so the demo runs from any directory.
pub const DEMO_CLUSTER: &str = include_str!("../../templates/cluster-template.yaml");

/// The `machinepool` flavor (`templates/cluster-template-machinepool.yaml`), compiled in likewise.
pub const MACHINEPOOL_CLUSTER: &str =
    include_str!("../../templates/cluster-template-machinepool.yaml");

/// The SSH key the demo and the tests put on their machines (its private half is nowhere).
pub const DEMO_SSH_PUBLIC_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHmW0bV5Ckb2wA1X8nN2xY2q8C0Qe4yN6q3yF0z1xk7P demo@capmvm";
/// The control-plane VIP the demo gives its clusters (hollow machines serve no API).
pub const DEMO_CONTROL_PLANE_VIP: &str = "10.10.0.100";

/// The templates' required variables, filled as a user fills them for `clusterctl generate
/// cluster`: every one of `endpoints` is a host of the pool (control planes allowed), the demo's
/// key and VIP. Credentials stay unset (plaintext, no basic auth).
pub fn template_variables(endpoints: &[String]) -> BTreeMap<String, String> {
    // A host without a failureDomain is a domain of its own, and a Cluster holds at most 100: past
    // that the hosts are grouped, as a user with that many hosts must group them.
    let domains = capmvm_api::validation::MAX_FAILURE_DOMAINS;
    let hosts: Vec<String> = endpoints
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let domain = if endpoints.len() > domains {
                format!(", failureDomain: fd-{}", i % domains)
            } else {
                String::new()
            };
            format!("{{name: host-{i}, endpoint: {e:?}, controlplaneAllowed: true{domain}}}")
        })
        .collect();
    BTreeMap::from([
        (
            "FLINTLOCK_HOSTS".to_string(),
            format!("[{}]", hosts.join(", ")),
        ),
        (
            "SSH_PUBLIC_KEY".to_string(),
            DEMO_SSH_PUBLIC_KEY.to_string(),
        ),
        (
            "CONTROL_PLANE_VIP".to_string(),
            DEMO_CONTROL_PLANE_VIP.to_string(),
        ),
    ])
}

/// Polls `check` every `every` until it returns `Some`, or fails after `timeout` with `what`.
pub async fn wait_for<T, F, Fut>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut check: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await? {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(every).await;
    }
}

/// CPU seconds (user + system) and peak RSS (KiB) of a process, from /proc.
pub fn process_usage(pid: u32) -> Option<(f64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th overall.
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let hwm = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    // Linux reports CPU time in clock ticks of 1/100 s (USER_HZ) on every mainstream architecture.
    Some((ticks as f64 / 100.0, hwm))
}

/// A loopback address with a port free at the time of asking.
pub fn free_port() -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?)
}

impl Drop for World {
    fn drop(&mut self) {
        if !self.options.keep_dir && self.operator.is_none() && self.hosts.is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Requests by verb and resource from the emulator's counters.
pub fn request_counts(snapshot: &crate::kube::CounterSnapshot) -> RequestCounts {
    let mut counts = RequestCounts::default();
    for (verb, resource, n) in snapshot.iter() {
        counts.add(verb.as_str(), resource, n);
    }
    counts
}

impl Stack for World {
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

    fn operator_pid(&self) -> Option<u32> {
        self.operator.as_ref().and_then(OperatorProcess::pid)
    }

    fn operator_metrics(&self) -> Option<std::net::SocketAddr> {
        self.operator.as_ref().map(|o| o.metrics)
    }

    fn kubelets(&self) -> crate::capi::kubelet::KubeletControl {
        self.kubelets
            .as_ref()
            .map(|k| k.control().clone())
            .unwrap_or_default()
    }

    fn kubeconfig(&self) -> PathBuf {
        self.kubeconfig.clone()
    }

    fn api_requests(&self) -> anyhow::Result<RequestCounts> {
        Ok(request_counts(&self.emulator.counters()))
    }

    fn operator_requests(&self) -> anyhow::Result<RequestCounts> {
        Ok(request_counts(
            &self.emulator.counters_of_agent(capmvm_operator::USER_AGENT),
        ))
    }

    async fn render(
        &self,
        template: &str,
        vars: &BTreeMap<String, String>,
    ) -> anyhow::Result<Vec<DynamicObject>> {
        Ok(manifest::parse(&manifest::envsubst(template, vars)?)?)
    }

    async fn apply(&self, objects: &[DynamicObject]) -> anyhow::Result<Vec<String>> {
        Ok(manifest::apply(&self.client, objects).await?)
    }

    async fn scale(
        &self,
        resource: &ApiResource,
        namespace: &str,
        name: &str,
        replicas: usize,
    ) -> anyhow::Result<()> {
        Api::<DynamicObject>::namespaced_with(self.client.clone(), namespace, resource)
            .patch_scale(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(serde_json::json!({"spec": {"replicas": replicas}})),
            )
            .await?;
        Ok(())
    }

    async fn delete(
        &self,
        resource: &ApiResource,
        namespace: &str,
        name: &str,
    ) -> anyhow::Result<()> {
        Api::<DynamicObject>::namespaced_with(self.client.clone(), namespace, resource)
            .delete(name, &kube::api::DeleteParams::default())
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeSet;

    use capmvm_api::MicrovmHost;

    use super::*;

    fn hosts_of(n: usize) -> Vec<MicrovmHost> {
        let endpoints: Vec<String> = (0..n).map(|i| format!("127.0.0.1:{}", 9000 + i)).collect();
        serde_saphyr::from_str(&template_variables(&endpoints)["FLINTLOCK_HOSTS"]).unwrap()
    }

    /// Up to 100 hosts each is its own failure domain; past that they are grouped into the 100 a
    /// Cluster holds (300 hosts in one domain each were refused by the MicrovmCluster's validation).
    #[test]
    fn more_hosts_than_a_cluster_has_failure_domains_are_grouped() {
        let few = hosts_of(20);
        assert!(few.iter().all(|h| h.failure_domain.is_none()));
        let many = hosts_of(300);
        assert_eq!(many.len(), 300);
        assert!(many.iter().all(|h| h.failure_domain.is_some()));
        let domains: BTreeSet<&str> = many.iter().map(MicrovmHost::failure_domain_name).collect();
        assert_eq!(domains.len(), capmvm_api::validation::MAX_FAILURE_DOMAINS);
    }
}
