//! `capmvm-sim autoscale`: the real cluster-autoscaler drives microVM pools on the real stack.
//!
//! One real stack (etcd, kube-apiserver and kube-controller-manager, CAPI v1.14's managers, the
//! operator as its ServiceAccount), one Cluster whose workload API runs a kube-scheduler and a
//! kube-controller-manager, hollow kubelets that register Nodes and run Pods, and
//! cluster-autoscaler 1.36.1 (`--cloud-provider=clusterapi`) as its own ServiceAccount under the
//! ClusterRole our components ship for it. The scenarios ([`scenarios`]) run in order; a live table
//! shows the node groups, their replicas, Nodes and microVMs, and the Pods; the summary lists what
//! held and the figures. Exits 0 only if every scenario held.

pub mod observe;
pub mod scenarios;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use capmvm_upstream::{AutoscalerOptions, Binaries};

use self::scenarios::{CLUSTER, NAMESPACE, Outcome, Scenarios, Timings, md, mp};
use crate::real::RealStack;
use crate::stack::Stack as _;
use crate::world::WorldOptions;

/// The upstream binaries `autoscale` needs.
pub fn binaries() -> Vec<&'static str> {
    let mut all = crate::real::BINARIES.to_vec();
    all.push(capmvm_upstream::autoscaler::BINARY);
    all
}

/// Options of `capmvm-sim autoscale`.
#[derive(Debug, Clone, clap::Args)]
pub struct AutoscaleArgs {
    /// Stop once the cluster is up with its node groups at zero (min 0, max 5) and the autoscaler
    /// running, print the kubeconfigs' paths, and leave everything running until Ctrl-C: bring
    /// your own Pods.
    #[arg(long)]
    pub keep: bool,
    /// Milliseconds from create to CREATED on the hosts.
    #[arg(long, default_value_t = 500)]
    pub provision_ms: u64,
    /// The autoscaler's `--scan-interval`, in seconds.
    #[arg(long, default_value_t = 2)]
    pub scan_interval_secs: u64,
    /// The failed scale-up scenario's provision time, in seconds: set on the MachineDeployment
    /// alone (`autoscaling-options-maxnodeprovisiontime`) while it waits for the autoscaler to
    /// give up; the autoscaler's `--max-node-provision-time` stays at upstream's 15 min.
    #[arg(long, default_value_t = 20)]
    pub max_node_provision_secs: u64,
    /// Give up on any step after this many seconds.
    #[arg(long, default_value_t = 120)]
    pub timeout_secs: u64,
}

impl AutoscaleArgs {
    /// The defaults (what the e2e test runs).
    pub fn defaults() -> Self {
        Self {
            keep: false,
            provision_ms: 500,
            scan_interval_secs: 2,
            max_node_provision_secs: 20,
            timeout_secs: 120,
        }
    }

    fn timings(&self) -> Timings {
        Timings {
            provision: Duration::from_millis(self.provision_ms),
            poll: POLL_BUSY,
            scan: Duration::from_secs(self.scan_interval_secs),
            max_provision: Duration::from_secs(self.max_node_provision_secs),
            timeout: Duration::from_secs(self.timeout_secs),
        }
    }
}

/// The operator's host poll while a microVM is pending.
const POLL_BUSY: Duration = Duration::from_millis(200);

/// What a run found.
#[derive(Debug)]
pub struct Report {
    /// Every scenario run, in order (a failed step ends the run: later ones are not run).
    pub outcomes: Vec<Outcome>,
    /// The figures.
    pub figures: scenarios::Figures,
    /// The configured timings.
    pub timings: Timings,
    /// Why the run stopped early, if it did.
    pub stopped: Option<String>,
}

impl Report {
    /// Every scenario ran and held.
    pub fn all_held(&self) -> bool {
        self.stopped.is_none() && self.outcomes.len() == 6 && self.outcomes.iter().all(|o| o.held)
    }
}

/// The stack's options: three hollow hosts, the operator polling every 2 s (200 ms while busy).
pub fn stack_options(args: &AutoscaleArgs, operator: PathBuf) -> WorldOptions {
    let mut o = WorldOptions::new(3, Duration::from_millis(args.provision_ms), operator);
    o.operator_flags = vec![
        "--host-poll-interval=2s".into(),
        format!("--host-poll-interval-busy={}ms", POLL_BUSY.as_millis()),
    ];
    o.keep_dir = args.keep;
    o
}

/// Prepares the Cluster on `real` (its operator running), starts the autoscaler, and runs every
/// scenario; `show` prints the live table and narration.
pub async fn run_on(
    real: &mut RealStack,
    args: &AutoscaleArgs,
    show: bool,
) -> anyhow::Result<Report> {
    let timings = args.timings();
    scenarios::prepare(real, timings.timeout).await?;
    {
        let s = Scenarios::new(real, timings, false).await?;
        s.set_sizes("machinedeployments.cluster.x-k8s.io", &md(), Some((0, 5)))
            .await?;
        s.create_load().await?;
    }
    let scan = timings.scan;
    real.start_autoscaler(NAMESPACE, CLUSTER, |o: &mut AutoscalerOptions| {
        o.scan_interval = scan;
    })
    .await?;
    let mut s = Scenarios::new(real, timings, show).await?;
    let mut outcomes = Vec::new();
    let mut stopped = None;
    for step in 0..5 {
        let result = match step {
            0 => s.md_from_zero().await,
            1 => s.mp_from_zero().await,
            2 => s.max_size_holds().await,
            3 => s.scale_down().await,
            _ => s.failed_scale_up().await,
        };
        match result {
            Ok(o) => {
                let held = o.held;
                s.say(&format!(
                    "    {}: {}",
                    if held { "held" } else { "FAILED" },
                    o.detail
                ));
                outcomes.push(o);
                if !held {
                    break;
                }
            }
            Err(e) => {
                let why = format!("{e:#}");
                s.say(&format!("    FAILED: {why}"));
                stopped = Some(why);
                break;
            }
        }
    }
    if stopped.is_none() && outcomes.iter().all(|o| o.held) {
        let o = s.clean_logs();
        s.say(&format!(
            "    {}: {}",
            if o.held { "held" } else { "FAILED" },
            o.detail
        ));
        outcomes.push(o);
    }
    Ok(Report {
        outcomes,
        figures: s.figures.clone(),
        timings,
        stopped,
    })
}

/// Runs the command; the process exit code is 0 only if every scenario held.
pub fn main(args: AutoscaleArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(run(args))
}

async fn run(args: AutoscaleArgs) -> anyhow::Result<()> {
    let located = Binaries::locate();
    if let Some(missing) = binaries().into_iter().find(|b| !located.have(&[b])) {
        anyhow::bail!(
            "`autoscale` runs the real stack and cluster-autoscaler ({missing} is not in {}): run `bash hack/upstream.sh build` first",
            located.dir().display()
        );
    }
    let exe = std::env::current_exe().context("finding the capmvm-sim executable")?;
    let mut real = RealStack::start(stack_options(&args, exe)).await?;
    let version = real.client.apiserver_version().await?.git_version;
    println!(
        "capmvm autoscale on the real stack: etcd, kube-apiserver {version}, Cluster API {}, cluster-autoscaler 1.36.1 (clusterapi), 3 hollow flintlock hosts, the operator as its ServiceAccount",
        capmvm_upstream::capi::CAPI_VERSION
    );
    real.start_operator(&[])?;
    let result = if args.keep {
        keep(&mut real, &args).await
    } else {
        match run_on(&mut real, &args, true).await {
            Ok(report) => {
                summary(&report);
                if report.all_held() {
                    Ok(())
                } else {
                    Err(anyhow::anyhow!("not every scenario held"))
                }
            }
            Err(e) => Err(e),
        }
    };
    if let Err(e) = &result {
        real.keep_dir();
        eprintln!(
            "\nautoscale failed: {e:#}\nlogs kept in {}",
            real.dir.display()
        );
    }
    real.shutdown().await;
    result
}

/// `--keep`: the Cluster with both node groups at zero (min 0, max 5) and the autoscaler running.
async fn keep(real: &mut RealStack, args: &AutoscaleArgs) -> anyhow::Result<()> {
    let timings = args.timings();
    scenarios::prepare(real, timings.timeout).await?;
    {
        let s = Scenarios::new(real, timings, false).await?;
        s.set_sizes("machinedeployments.cluster.x-k8s.io", &md(), Some((0, 5)))
            .await?;
        s.set_sizes("machinepools.cluster.x-k8s.io", &mp(), Some((0, 5)))
            .await?;
        s.create_load().await?;
    }
    let scan = timings.scan;
    let autoscaler = real
        .start_autoscaler(NAMESPACE, CLUSTER, |o| {
            o.scan_interval = scan;
        })
        .await?;
    let workload = autoscaler.workload_kubeconfig.display().to_string();
    let log = autoscaler.process.log().display().to_string();
    let management = real.kubeconfig();
    println!(
        "\nEverything keeps running: {} and {} at 0 replicas (min 0, max 5), cluster-autoscaler running.",
        md(),
        mp()
    );
    println!("  management kubeconfig   {}", management.display());
    println!("  workload kubeconfig     {workload}");
    println!("  autoscaler log          {log}");
    println!("Try:");
    println!("  kubectl --kubeconfig {workload} scale deployment/load --replicas=5");
    println!("  kubectl --kubeconfig {workload} get pods,nodes -o wide");
    println!(
        "  kubectl --kubeconfig {} get md,mp,mvmm",
        management.display()
    );
    println!(
        "  kubectl --kubeconfig {workload} -n kube-system get configmap cluster-autoscaler-status -o yaml"
    );
    println!("Ctrl-C stops it all.");
    let _ = tokio::signal::ctrl_c().await;
    Ok(())
}

/// The summary: each scenario, then the figures.
pub fn summary(report: &Report) {
    println!("\nsummary");
    for o in &report.outcomes {
        println!("  [{}] {}", if o.held { "held" } else { "FAILED" }, o.name);
        println!("         {}", o.detail);
    }
    if let Some(why) = &report.stopped {
        println!("  stopped: {why}");
    }
    let t = &report.timings;
    let bound = t.provision + t.poll + t.scan;
    let secs = |d: Option<Duration>| {
        d.map(|d| format!("{:.1}s", d.as_secs_f64()))
            .unwrap_or_else(|| "-".into())
    };
    let f = &report.figures;
    println!(
        "  first pending Pod to all Running: MachineDeployment {} ({} microVMs created), MachinePool {} ({} created)",
        secs(f.md_scale_up),
        f.md_created
            .map(|n| n.to_string())
            .unwrap_or_else(|| "-".into()),
        secs(f.mp_scale_up),
        f.mp_created
            .map(|n| n.to_string())
            .unwrap_or_else(|| "-".into()),
    );
    println!(
        "    against provision {:.1}s + host poll {:.1}s + scan interval {:.1}s = {:.1}s",
        t.provision.as_secs_f64(),
        t.poll.as_secs_f64(),
        t.scan.as_secs_f64(),
        bound.as_secs_f64()
    );
    println!(
        "  scale down (Pods removed to the last unneeded microVM gone): {}",
        secs(f.scale_down)
    );
    println!(
        "  never-registering microVM removed after {} (the group's maxnodeprovisiontime {}s); recovered {} after the kubelets registered again",
        secs(f.failed_removed_after),
        t.max_provision.as_secs(),
        secs(f.recovered_after)
    );
}
