//! cluster-autoscaler with its Cluster API provider (`--cloud-provider=clusterapi`), run as users run
//! it beside a management cluster: the workload cluster's kubeconfig for Nodes and Pods, the
//! management cluster's as `--cloud-config`, node groups found by CAPI's min/max size annotations.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::process::Process;
use crate::{Binaries, Result, free_port};

/// The binary `hack/upstream.sh build` makes from the pinned archive (`go build -tags clusterapi`).
pub const BINARY: &str = "cluster-autoscaler";

/// Where the autoscaler writes its status: this ConfigMap in `kube-system` of the workload cluster.
pub const STATUS_CONFIG_MAP: &str = "cluster-autoscaler-status";

/// How to run one cluster-autoscaler.
#[derive(Clone, Debug)]
pub struct AutoscalerOptions {
    /// Names its log (`<dir>/<name>.log`).
    pub name: String,
    /// Where its log goes.
    pub dir: PathBuf,
    /// The workload cluster's kubeconfig (`--kubeconfig`): Nodes, Pods, its status ConfigMap.
    pub workload_kubeconfig: PathBuf,
    /// The management cluster's kubeconfig (`--cloud-config`): MachineDeployments, MachinePools,
    /// Machines and the infrastructure templates.
    pub management_kubeconfig: PathBuf,
    /// Only node groups in this namespace (`--node-group-auto-discovery=clusterapi:namespace=`).
    pub namespace: Option<String>,
    /// Only node groups of this Cluster (`clusterapi:clusterName=`).
    pub cluster_name: Option<String>,
    /// `--scan-interval`.
    pub scan_interval: Duration,
    /// `--scale-down-unneeded-time`: how long a Node stays unneeded before it is removed.
    pub scale_down_unneeded_time: Duration,
    /// `--scale-down-delay-after-add`.
    pub scale_down_delay_after_add: Duration,
    /// `--max-node-provision-time`: a machine without a Node after this long is a failed scale-up.
    /// Keep it above the autoscaler's 2-minute refresh of its node-instances cache: a Machine
    /// cached while it had no `nodeRef` yet is "unregistered" until that refresh, and a shorter
    /// provision time deletes it with its Node up (docs/autoscaler.md, item 9).
    pub max_node_provision_time: Duration,
    /// `--initial-node-group-backoff-duration`: how long a group that failed to scale up rests.
    pub initial_backoff: Duration,
    /// `--kube-client-qps` / `--kube-client-burst` (both clients). client-go's default, 5 / 10,
    /// throttles the clusterapi provider: with v1beta2's `infrastructureRef` (an `apiGroup`, no
    /// version) each look at a group's template costs a discovery request, and two node groups
    /// stretched one loop to 20 s (docs/autoscaler.md).
    pub kube_client_qps: u32,
    /// `CAPI_SCALE_ZERO_DEFAULT_ARCH`: unset, the autoscaler logs an error on its first scale from
    /// zero ("Unrecognized architecture ''") even when the template reports its architecture.
    pub default_arch: Option<String>,
    /// More flags.
    pub extra_args: Vec<String>,
}

impl AutoscalerOptions {
    /// Upstream's defaults but for short test timings: a 2 s scan, Nodes removed after 10 s unneeded,
    /// 10 s after a scale-up, 10 s of backoff; a machine without a Node fails after upstream's
    /// 15 min (a test that needs less sets it on one node group, by annotation).
    pub fn new(dir: &Path, workload_kubeconfig: &Path, management_kubeconfig: &Path) -> Self {
        Self {
            name: "cluster-autoscaler".to_string(),
            dir: dir.to_path_buf(),
            workload_kubeconfig: workload_kubeconfig.to_path_buf(),
            management_kubeconfig: management_kubeconfig.to_path_buf(),
            namespace: None,
            cluster_name: None,
            scan_interval: Duration::from_secs(2),
            scale_down_unneeded_time: Duration::from_secs(10),
            scale_down_delay_after_add: Duration::from_secs(10),
            max_node_provision_time: Duration::from_secs(15 * 60),
            initial_backoff: Duration::from_secs(10),
            kube_client_qps: 50,
            default_arch: Some("amd64".to_string()),
            extra_args: Vec::new(),
        }
    }

    /// The command line.
    pub fn args(&self, port: u16) -> Vec<String> {
        let mut discovery = Vec::new();
        if let Some(ns) = &self.namespace {
            discovery.push(format!("namespace={ns}"));
        }
        if let Some(name) = &self.cluster_name {
            discovery.push(format!("clusterName={name}"));
        }
        let secs = |d: Duration| format!("{}s", d.as_secs().max(1));
        let mut args = vec![
            "--cloud-provider=clusterapi".to_string(),
            format!("--kubeconfig={}", self.workload_kubeconfig.display()),
            format!("--cloud-config={}", self.management_kubeconfig.display()),
            format!("--address=127.0.0.1:{port}"),
            "--leader-elect=false".to_string(),
            format!("--scan-interval={}", secs(self.scan_interval)),
            format!(
                "--scale-down-unneeded-time={}",
                secs(self.scale_down_unneeded_time)
            ),
            format!(
                "--scale-down-delay-after-add={}",
                secs(self.scale_down_delay_after_add)
            ),
            "--scale-down-delay-after-delete=0s".to_string(),
            // A Node found unremovable (its Pods had nowhere to go) is otherwise left alone for
            // 5 minutes, long after the cluster has room again.
            format!(
                "--unremovable-node-recheck-timeout={}",
                secs(self.scale_down_unneeded_time)
            ),
            "--scale-down-delay-after-failure=2s".to_string(),
            format!(
                "--max-node-provision-time={}",
                secs(self.max_node_provision_time)
            ),
            format!(
                "--initial-node-group-backoff-duration={}",
                secs(self.initial_backoff)
            ),
            format!(
                "--max-node-group-backoff-duration={}",
                secs(self.initial_backoff * 2)
            ),
            format!("--kube-client-qps={}", self.kube_client_qps),
            format!("--kube-client-burst={}", self.kube_client_qps * 2),
            "--v=4".to_string(),
        ];
        if !discovery.is_empty() {
            args.push(format!(
                "--node-group-auto-discovery=clusterapi:{}",
                discovery.join(",")
            ));
        }
        args.extend(self.extra_args.iter().cloned());
        args
    }
}

/// A running cluster-autoscaler; dropping it kills it.
#[derive(Debug)]
pub struct ClusterAutoscaler {
    process: Process,
    port: u16,
}

impl ClusterAutoscaler {
    /// Starts it and waits until it serves its metrics and health endpoint.
    pub async fn start(binaries: &Binaries, options: &AutoscalerOptions) -> Result<Self> {
        let program = binaries.path(BINARY)?;
        let port = free_port()?;
        let env: Vec<(&str, &str)> = options
            .default_arch
            .as_deref()
            .map(|arch| ("CAPI_SCALE_ZERO_DEFAULT_ARCH", arch))
            .into_iter()
            .collect();
        let mut process = Process::spawn(
            &options.name,
            &program,
            &options.args(port),
            &env,
            &options.dir.join(format!("{}.log", options.name)),
        )?;
        process
            .wait_ready(Duration::from_secs(60), || async move {
                tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .map(|_| true)
                    .map_err(|e| e.to_string())
            })
            .await?;
        Ok(Self { process, port })
    }

    /// Its log (klog's text format: `E1127 ...` lines are errors).
    pub fn log(&self) -> &Path {
        self.process.log()
    }

    /// Its metrics endpoint (`/metrics`; `/health-check` as well).
    pub fn metrics_url(&self) -> String {
        format!("http://127.0.0.1:{}/metrics", self.port)
    }

    /// Its process id.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Stops it (SIGTERM).
    pub async fn stop(self) {
        self.process.stop().await;
    }
}

/// The error lines of a klog log (`E` then the date): what the autoscaler reports as errors.
pub fn error_lines(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| {
            let mut chars = l.chars();
            chars.next() == Some('E') && chars.next().is_some_and(|c| c.is_ascii_digit())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_the_users() {
        let mut o = AutoscalerOptions::new(
            Path::new("/d"),
            Path::new("/w.kubeconfig"),
            Path::new("/m.kubeconfig"),
        );
        o.namespace = Some("default".into());
        let args = o.args(8085);
        for want in [
            "--cloud-provider=clusterapi",
            "--kubeconfig=/w.kubeconfig",
            "--cloud-config=/m.kubeconfig",
            "--scan-interval=2s",
            "--scale-down-unneeded-time=10s",
            "--node-group-auto-discovery=clusterapi:namespace=default",
        ] {
            assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
        }
    }

    #[test]
    fn only_klog_error_lines_are_errors() {
        let log = "I1127 06:00:00.1 1 main.go:1] Cluster Autoscaler 1.36.1\nE1127 06:00:01.2 1 static_autoscaler.go:9] Failed to get node infos\nError-ish text\n";
        assert_eq!(error_lines(log).len(), 1);
    }
}
