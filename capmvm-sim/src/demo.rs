//! `capmvm-sim demo`: the whole system on one machine. Starts the API emulator, three hollow flintlock
//! hosts, the CAPI stand-in and the operator (its own process, through a kubeconfig); creates a cluster
//! of 1 control plane (KubeadmControlPlane) and 3 workers from `templates/cluster-template.yaml`, applied
//! unchanged with clusterctl-style variables, and beside them a MachinePool of 2 from the `machinepool`
//! flavor; scales the pool up and down and rolls it to a new template; shows each step as a live
//! table; deletes the cluster and checks every microVM is gone. Exits 0 only if all of that worked.

use std::collections::BTreeMap;
use std::io::{IsTerminal as _, Write as _};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use capmvm_api::capi::{Cluster, Machine};
use capmvm_api::conditions::types::READY;
use capmvm_api::keys::{CONTROL_PLANE_LABEL, POOL_NAME_LABEL};
use capmvm_api::{MicrovmMachine, MicrovmMachinePool, VmState};
use kube::api::{ApiResource, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::capi::DEPLOYMENT_NAME_LABEL;
use crate::capi::machinepool::machine_pool_resource;
use crate::capi::workload::ClusterKey;
use crate::real::RealStack;
use crate::stack::{RequestCounts, Stack, apply_template};
use crate::world::{DEMO_CLUSTER, MACHINEPOOL_CLUSTER, World, WorldOptions};

/// Options of `capmvm-sim demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Leave everything running once the cluster is ready, print the kubeconfig path, and wait for
    /// Ctrl-C, SIGTERM or SIGHUP, then stop everything it started (the cluster is not deleted).
    #[arg(long)]
    pub keep: bool,
    /// Milliseconds from create to CREATED on the hosts.
    #[arg(long, default_value_t = 2000)]
    pub provision_ms: u64,
    /// Give up on any phase after this many seconds.
    #[arg(long, default_value_t = 180)]
    pub timeout_secs: u64,
    /// What serves the management cluster: `embedded` (the API emulator and the CAPI stand-in, no
    /// Go needed) or `real` (etcd, kube-apiserver and Cluster API v1.14's own managers, built by
    /// `hack/upstream.sh build`).
    #[arg(long, value_enum, default_value_t = ControlPlane::Embedded)]
    pub control_plane: ControlPlane,
}

/// What serves the management cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ControlPlane {
    /// The embedded API emulator with the CAPI stand-in.
    Embedded,
    /// The real kube-apiserver and Cluster API's own managers.
    Real,
}

const NAMESPACE: &str = "default";
const CLUSTER: &str = "demo";
/// The control plane and the MachineDeployment's workers.
const DEPLOYED: usize = 4;
/// The MachinePool (from the `machinepool` flavor).
const POOL: &str = "demo-mp-0";
/// The pool's sizes: created, scaled up to, scaled down to.
const POOL_SIZES: [usize; 3] = [2, 4, 2];
/// The pool's memory before and after the roll.
const POOL_MEMORY_MB: [i64; 2] = [2048, 3072];

/// Runs the demo; the process exit code is 0 only on success.
pub fn main(args: DemoArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(run(args))
}

async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("finding the capmvm-sim executable")?;
    let mut options = WorldOptions::new(3, Duration::from_millis(args.provision_ms), exe);
    options.keep_dir = args.keep;
    options.operator_flags = vec![
        "--host-poll-interval=5s".into(),
        "--host-poll-interval-busy=250ms".into(),
    ];
    if let Ok(level) = std::env::var("CAPMVM_DEMO_OPERATOR_LOG_LEVEL") {
        options.operator_flags.push(format!("--log-level={level}"));
    }
    match args.control_plane {
        ControlPlane::Embedded => {
            println!(
                "capmvm demo: API emulator, 3 hollow flintlock hosts, CAPI stand-in, operator"
            );
            let mut world = World::start(options).await?;
            println!("  API server   {}", world.emulator.base_url());
            println!("  kubeconfig   {}", world.kubeconfig.display());
            world.start_operator(&[])?;
            let pid = world.operator_pid().unwrap_or_default();
            let result = demo(&world, &args, pid, Vec::new()).await;
            world.shutdown().await;
            result
        }
        ControlPlane::Real => {
            let mut real = RealStack::start(options).await?;
            let version = real.client.apiserver_version().await?.git_version;
            println!(
                "capmvm demo on the real stack: etcd, kube-apiserver {version}, Cluster API {} (core, kubeadm bootstrap), 3 hollow flintlock hosts, the operator as its ServiceAccount",
                capmvm_upstream::capi::CAPI_VERSION
            );
            let vip = real.prepare_cluster(NAMESPACE, CLUSTER).await?;
            println!(
                "  API server   {}",
                real.management()
                    .map(|m| m.url().to_string())
                    .unwrap_or_default()
            );
            println!("  kubeconfig   {}", real.kubeconfig().display());
            println!("  workload API https://{vip}:6443 (Cluster {CLUSTER})");
            real.start_operator(&[])?;
            let pid = real.operator_pid().unwrap_or_default();
            let result = demo(
                &real,
                &args,
                pid,
                vec![("CONTROL_PLANE_VIP", vip.to_string())],
            )
            .await;
            if result.is_err() {
                // Every component's log, the audit log and the certificates, for a post-mortem.
                real.keep_dir();
                eprintln!("logs kept in {}", real.dir.display());
            }
            real.shutdown().await;
            result
        }
    }
}

/// The demo on `stack`, its operator running as `pid`; `vars` are added to the templates'.
async fn demo<S: Stack + Sync>(
    stack: &S,
    args: &DemoArgs,
    pid: u32,
    vars: Vec<(&'static str, String)>,
) -> anyhow::Result<()> {
    for (i, e) in crate::stack::endpoints(stack.hosts()).iter().enumerate() {
        println!("  host-{i}       {e}");
    }
    println!(
        "  operator     pid {pid} (log {})",
        stack.operator_log().display()
    );
    let timeout = Duration::from_secs(args.timeout_secs);
    let result = drive(stack, args, timeout, &vars).await;
    if let Err(e) = &result {
        eprintln!("\ndemo failed: {e:#}");
        eprintln!(
            "last lines of the operator log ({}):",
            stack.operator_log().display()
        );
        for line in tail(&stack.operator_log(), 15) {
            eprintln!("  {line}");
        }
    }
    if args.keep && result.is_ok() {
        let kubeconfig = stack.kubeconfig();
        println!("\nEverything keeps running. Try:");
        println!(
            "  kubectl --kubeconfig {} get mvmc,mvmm,mvmmt,mvmmp,mp",
            kubeconfig.display()
        );
        println!(
            "  kubectl --kubeconfig {} get cluster-api",
            kubeconfig.display()
        );
        // Issue 13: the workload cluster's Nodes, through the kubeconfig Secret as with real CAPI.
        println!("The workload cluster's Nodes (kubeconfig from the Secret {CLUSTER}-kubeconfig):");
        println!(
            "  kubectl --kubeconfig {} get secret {CLUSTER}-kubeconfig -o jsonpath='{{.data.value}}' | base64 -d > {CLUSTER}.kubeconfig",
            kubeconfig.display()
        );
        println!("  kubectl --kubeconfig {CLUSTER}.kubeconfig get nodes -o wide");
        if let Some(path) = stack
            .workloads()
            .kubeconfig_path(&ClusterKey::new(NAMESPACE, CLUSTER))
        {
            println!("  (the same file: {})", path.display());
        }
        println!("Ctrl-C stops it all.");
        stop_requested().await?;
    }
    result
}

/// Waits for SIGINT (Ctrl-C), SIGTERM (a supervisor, `timeout`) or SIGHUP (a closed terminal): the
/// caller then stops what it started. Should the demo die without a word (SIGKILL), its processes
/// die with it (`capmvm_upstream::process::die_with_parent`).
async fn stop_requested() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt()).context("handling SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("handling SIGTERM")?;
    let mut hangup = signal(SignalKind::hangup()).context("handling SIGHUP")?;
    let name = tokio::select! {
        _ = interrupt.recv() => "SIGINT",
        _ = terminate.recv() => "SIGTERM",
        _ = hangup.recv() => "SIGHUP",
    };
    println!("{name}: stopping everything the demo started");
    Ok(())
}

async fn drive<S: Stack + Sync>(
    stack: &S,
    args: &DemoArgs,
    timeout: Duration,
    vars: &[(&'static str, String)],
) -> anyhow::Result<()> {
    let api_before = stack.api_requests()?;
    let operator_before = stack.operator_requests()?;
    let started = Instant::now();
    let with = |extra: (&'static str, String)| {
        let mut all = vars.to_vec();
        all.push(extra);
        all
    };
    let mut applied = apply_template(
        stack,
        DEMO_CLUSTER,
        &with(("WORKER_MACHINE_COUNT", (DEPLOYED - 1).to_string())),
        |_| {},
    )
    .await?;
    // Beside the MachineDeployment, the machinepool flavor's pool (its Cluster is the same).
    applied.extend(
        apply_template(
            stack,
            MACHINEPOOL_CLUSTER,
            &with(("WORKER_MACHINE_COUNT", POOL_SIZES[0].to_string())),
            |objects| {
                objects.retain(|o| {
                    o.types.as_ref().is_some_and(|t| {
                        matches!(
                            t.kind.as_str(),
                            "MachinePool" | "MicrovmMachinePool" | "KubeadmConfig"
                        )
                    })
                })
            },
        )
        .await?,
    );
    println!("\ncreated {}", applied.join(", "));
    println!();

    let mut table = LiveTable::new();
    let deadline = Instant::now() + timeout;
    let total = DEPLOYED + POOL_SIZES[0];
    wait_until(
        stack,
        &mut table,
        deadline,
        "the cluster to be ready",
        |s| s.settled(total, POOL_MEMORY_MB[0]),
    )
    .await?;
    let time_to_ready = started.elapsed();
    let api_to_ready = stack.api_requests()?.since(&api_before);
    let flintlock_to_ready = crate::stack::flintlock_calls(stack.hosts());
    println!(
        "\nall {total} machines ready in {:.1}s (provisioning takes {:.1}s on the hosts)",
        time_to_ready.as_secs_f64(),
        args.provision_ms as f64 / 1000.0
    );
    let operator_to_ready = stack.operator_requests()?.since(&operator_before);
    if args.keep {
        summary(
            time_to_ready,
            None,
            &api_to_ready,
            &operator_to_ready,
            &flintlock_to_ready,
        );
        return Ok(());
    }

    pool_steps(stack, &mut table, timeout).await?;

    println!("\ndeleting Cluster {CLUSTER}");
    let deleted_at = Instant::now();
    stack
        .delete(&cluster_resource(), NAMESPACE, CLUSTER)
        .await
        .context("deleting the Cluster")?;
    let machines: Api<MicrovmMachine> = Api::namespaced(stack.client().clone(), NAMESPACE);
    loop {
        let list = machines.list(&ListParams::default()).await?.items;
        table.show(&list, &node_names(stack, &list));
        let cluster_gone = Api::<Cluster>::namespaced(stack.client().clone(), NAMESPACE)
            .get_opt(CLUSTER)
            .await?
            .is_none();
        let vms = crate::stack::all_vms(stack.hosts());
        if cluster_gone && list.is_empty() && vms.is_empty() {
            break;
        }
        if Instant::now() > deadline.max(deleted_at + timeout) {
            let left: Vec<String> = vms
                .iter()
                .map(|(h, vm)| format!("{} on {h}", vm.uid()))
                .collect();
            bail!("the cluster was not cleaned up within {timeout:?}; microVMs left: {left:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let time_to_clean = deleted_at.elapsed();
    println!(
        "\nthe Cluster, its machines and every microVM are gone ({:.1}s)",
        time_to_clean.as_secs_f64()
    );
    summary(
        time_to_ready,
        Some(time_to_clean),
        &stack.api_requests()?.since(&api_before),
        &stack.operator_requests()?.since(&operator_before),
        &crate::stack::flintlock_calls(stack.hosts()),
    );
    rbac_refused_nothing(stack)
}

/// On the real stack, the API server's audit log: the operator's ServiceAccount made requests and
/// RBAC refused none of them (a refusal is a role the install manifests lack).
fn rbac_refused_nothing<S: Stack>(stack: &S) -> anyhow::Result<()> {
    let Some((requests, denied)) = stack.operator_denials()? else {
        return Ok(());
    };
    if requests == 0 {
        bail!("the audit log holds no request of the operator's ServiceAccount");
    }
    if !denied.is_empty() {
        bail!(
            "RBAC refused {} of the operator's {requests} requests: {denied:?}",
            denied.len()
        );
    }
    println!(
        "RBAC refused none of the operator's {requests} requests (the API server's audit log)"
    );
    Ok(())
}

/// `Cluster` (cluster.x-k8s.io/v1beta2) as a dynamic resource.
fn cluster_resource() -> ApiResource {
    ApiResource::erase::<Cluster>(&())
}

/// The pool's steps: scaled up and down through the scale subresource (as `kubectl scale mp` and
/// cluster-autoscaler do), then rolled to a new memory size.
async fn pool_steps<S: Stack + Sync>(
    stack: &S,
    table: &mut LiveTable,
    timeout: Duration,
) -> anyhow::Result<()> {
    for size in &POOL_SIZES[1..] {
        println!(
            "\nscaling MachinePool {POOL} to {size} (kubectl scale mp {POOL} --replicas={size})"
        );
        let step = Instant::now();
        stack
            .scale(&machine_pool_resource(), NAMESPACE, POOL, *size)
            .await
            .context("scaling the MachinePool")?;
        let total = DEPLOYED + size;
        wait_until(
            stack,
            table,
            Instant::now() + timeout,
            &format!("the pool to reach {size}"),
            |s| s.settled(total, POOL_MEMORY_MB[0]),
        )
        .await?;
        println!(
            "\nthe pool has {size} ready instances ({:.1}s)",
            step.elapsed().as_secs_f64()
        );
    }
    let memory = POOL_MEMORY_MB[1];
    println!(
        "\nrolling MicrovmMachinePool {POOL} to memoryMb {memory} (maxSurge 1, maxUnavailable 0)"
    );
    let step = Instant::now();
    Api::<MicrovmMachinePool>::namespaced(stack.client().clone(), NAMESPACE)
        .patch(
            POOL,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"memoryMb": memory}}})),
        )
        .await
        .context("changing the pool's template")?;
    let total = DEPLOYED + POOL_SIZES[2];
    wait_until(stack, table, Instant::now() + timeout, "the roll", |s| {
        s.settled(total, memory)
    })
    .await?;
    println!(
        "\nevery instance of the pool runs the new template ({:.1}s)",
        step.elapsed().as_secs_f64()
    );
    Ok(())
}

/// What the demo waits on: the MicrovmMachines, their Nodes and the Machines with a providerID.
struct Snapshot {
    machines: Vec<MicrovmMachine>,
    nodes: BTreeMap<String, String>,
    capi_with_provider_id: usize,
}

impl Snapshot {
    /// Exactly `total` machines, all ready with a Node and a Machine that has their providerID, and
    /// the pool's instances all of `memory_mb`.
    fn settled(&self, total: usize, memory_mb: i64) -> bool {
        self.machines.len() == total
            && self.machines.iter().all(is_ready)
            && self.nodes.len() == total
            && self.capi_with_provider_id == total
            && self
                .machines
                .iter()
                .filter(|m| m.labels().contains_key(POOL_NAME_LABEL))
                .all(|m| m.spec.memory_mb == memory_mb)
    }
}

/// Shows the table until `done` holds, or fails at `deadline` naming `what`.
async fn wait_until<S: Stack + Sync>(
    stack: &S,
    table: &mut LiveTable,
    deadline: Instant,
    what: &str,
    done: impl Fn(&Snapshot) -> bool,
) -> anyhow::Result<()> {
    let machines: Api<MicrovmMachine> = Api::namespaced(stack.client().clone(), NAMESPACE);
    let capi_machines: Api<Machine> = Api::namespaced(stack.client().clone(), NAMESPACE);
    loop {
        let list = machines.list(&ListParams::default()).await?.items;
        let nodes = node_names(stack, &list);
        table.show(&list, &nodes);
        let capi_with_provider_id = capi_machines
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|m| m.spec.provider_id.is_some())
            .count();
        let snapshot = Snapshot {
            machines: list,
            nodes,
            capi_with_provider_id,
        };
        if done(&snapshot) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn is_ready(m: &MicrovmMachine) -> bool {
    m.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == READY && c.status == "True")
    })
}

fn summary(
    ready: Duration,
    clean: Option<Duration>,
    api: &RequestCounts,
    operator: &RequestCounts,
    flintlock: &BTreeMap<&str, u64>,
) {
    println!("\nsummary");
    println!("  time to ready          {:.1}s", ready.as_secs_f64());
    if let Some(clean) = clean {
        println!("  time to clean up       {:.1}s", clean.as_secs_f64());
    }
    println!(
        "  API requests           {} by the operator, {} by all clients (CAPI, demo)",
        operator.total(),
        api.total()
    );
    let own = operator.by_verb();
    for (verb, n) in &api.by_verb() {
        println!(
            "    {verb:<20} {:>5} {:>7}",
            own.get(verb).copied().unwrap_or(0),
            n
        );
    }
    println!(
        "  flintlock calls        {}",
        flintlock.values().sum::<u64>()
    );
    for (method, n) in flintlock {
        println!("    {method:<20} {n:>5}");
    }
}

/// A `kubectl get`-like table, redrawn in place on a terminal, printed on change otherwise.
struct LiveTable {
    last: String,
    lines: usize,
    tty: bool,
}

impl LiveTable {
    fn new() -> Self {
        Self {
            last: String::new(),
            lines: 0,
            tty: std::io::stdout().is_terminal(),
        }
    }

    fn show(&mut self, machines: &[MicrovmMachine], nodes: &BTreeMap<String, String>) {
        let mut rows: Vec<[String; 8]> = machines
            .iter()
            .map(|m| {
                let status = m.status.clone().unwrap_or_default();
                let ready = status.conditions.iter().find(|c| c.type_ == READY);
                let deleting = m.metadata.deletion_timestamp.is_some();
                [
                    group_of(m),
                    m.name_any(),
                    format!("{}Mi", m.spec.memory_mb),
                    status.host.unwrap_or_else(|| "-".into()),
                    status.vm_state.map(state_name).unwrap_or("-").to_string(),
                    ready
                        .map(|c| c.status.clone())
                        .unwrap_or_else(|| "-".into()),
                    nodes
                        .get(&m.name_any())
                        .cloned()
                        .unwrap_or_else(|| "-".into()),
                    if deleting {
                        "Deleting".to_string()
                    } else {
                        ready.map(|c| c.reason.clone()).unwrap_or_default()
                    },
                ]
            })
            .collect();
        rows.sort();
        let header = [
            "POOL", "MACHINE", "MEMORY", "HOST", "STATE", "READY", "NODE", "REASON",
        ]
        .map(String::from);
        let widths: Vec<usize> = (0..8)
            .map(|i| {
                rows.iter()
                    .chain([&header])
                    .map(|r| r[i].len())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut text = String::new();
        for row in [&header].into_iter().chain(rows.iter()) {
            let line: Vec<String> = row
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect();
            text.push_str(line.join("   ").trim_end());
            text.push('\n');
        }
        if text == self.last {
            return;
        }
        let mut out = std::io::stdout().lock();
        if self.tty && self.lines > 0 {
            // Move up over the previous table and clear it.
            let _ = write!(out, "\x1b[{}A\x1b[J", self.lines);
        } else if !self.tty && self.lines > 0 {
            let _ = writeln!(out);
        }
        let _ = write!(out, "{text}");
        let _ = out.flush();
        self.lines = text.lines().count();
        self.last = text;
    }
}

/// What a machine belongs to: `mp/<pool>`, `md/<deployment>` or `control-plane` (the demo's and
/// the autoscale run's tables).
pub(crate) fn group_of(m: &MicrovmMachine) -> String {
    let labels = m.labels();
    if let Some(pool) = labels.get(POOL_NAME_LABEL) {
        format!("mp/{pool}")
    } else if let Some(md) = labels.get(DEPLOYMENT_NAME_LABEL) {
        format!("md/{md}")
    } else if labels.contains_key(CONTROL_PLANE_LABEL) {
        "control-plane".to_string()
    } else {
        "-".to_string()
    }
}

/// Issue 13: each machine's Node in the workload cluster (registered with its providerID), by
/// machine name.
fn node_names<S: Stack>(stack: &S, machines: &[MicrovmMachine]) -> BTreeMap<String, String> {
    let cluster = ClusterKey::new(NAMESPACE, CLUSTER);
    machines
        .iter()
        .filter_map(|m| {
            let pid = m.spec.provider_id.as_deref()?;
            let node = stack.workloads().node_by_provider_id(&cluster, pid)?;
            Some((m.name_any(), node.name_any()))
        })
        .collect()
}

fn state_name(s: VmState) -> &'static str {
    match s {
        VmState::Pending => "pending",
        VmState::Running => "running",
        VmState::Failed => "failed",
        VmState::Deleting => "deleting",
        VmState::Unknown => "unknown",
    }
}

/// The last `n` lines of a file (for failure reports).
fn tail(path: &std::path::Path, n: usize) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| l.to_string())
        .collect()
}
