//! `capmvm-sim demo`: the whole system on one machine. Starts the API emulator, three hollow flintlock
//! hosts, the CAPI stand-in and the operator (its own process, through a kubeconfig); creates a cluster
//! of 1 control plane (KubeadmControlPlane) and 3 workers from `templates/cluster-template.yaml`, applied
//! unchanged with clusterctl-style variables; shows progress as a live table;
//! deletes the cluster and checks every microVM is gone. Exits 0 only if all of that worked.

use std::collections::BTreeMap;
use std::io::{IsTerminal as _, Write as _};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use capmvm_api::capi::{Cluster, Machine};
use capmvm_api::conditions::types::READY;
use capmvm_api::{MicrovmMachine, VmState};
use kube::api::{DeleteParams, ListParams};
use kube::{Api, ResourceExt};

use crate::kube::CounterSnapshot;
use crate::world::{World, WorldOptions};

/// Options of `capmvm-sim demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Leave everything running once the cluster is ready, print the kubeconfig path, and wait for
    /// Ctrl-C (the cluster is not deleted).
    #[arg(long)]
    pub keep: bool,
    /// Milliseconds from create to CREATED on the hosts.
    #[arg(long, default_value_t = 2000)]
    pub provision_ms: u64,
    /// Give up on any phase after this many seconds.
    #[arg(long, default_value_t = 180)]
    pub timeout_secs: u64,
}

const NAMESPACE: &str = "default";
const CLUSTER: &str = "demo";
const MACHINES: usize = 4;

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
    let timeout = Duration::from_secs(args.timeout_secs);

    println!("capmvm demo: API emulator, 3 hollow flintlock hosts, CAPI stand-in, operator");
    let mut world = World::start(options).await?;
    println!("  API server   {}", world.emulator.base_url());
    println!("  kubeconfig   {}", world.kubeconfig.display());
    for (i, e) in world.endpoints().iter().enumerate() {
        println!("  host-{i}       {e}");
    }
    world.start_operator(&[])?;
    println!(
        "  operator     pid {} (log {})",
        world.operator_pid().unwrap_or_default(),
        world.operator_log().display()
    );

    let result = drive(&mut world, &args, timeout).await;
    if let Err(e) = &result {
        eprintln!("\ndemo failed: {e:#}");
        eprintln!(
            "last lines of the operator log ({}):",
            world.operator_log().display()
        );
        for line in tail(&world.operator_log(), 15) {
            eprintln!("  {line}");
        }
    }
    if args.keep && result.is_ok() {
        println!("\nEverything keeps running. Try:");
        println!(
            "  kubectl --kubeconfig {} get mvmc,mvmm,mvmmt",
            world.kubeconfig.display()
        );
        println!(
            "  kubectl --kubeconfig {} get cluster-api",
            world.kubeconfig.display()
        );
        // Issue 13: the workload cluster's Nodes, through the kubeconfig Secret as with real CAPI.
        println!("The workload cluster's Nodes (kubeconfig from the Secret {CLUSTER}-kubeconfig):");
        println!(
            "  kubectl --kubeconfig {} get secret {CLUSTER}-kubeconfig -o jsonpath='{{.data.value}}' | base64 -d > {CLUSTER}.kubeconfig",
            world.kubeconfig.display()
        );
        println!("  kubectl --kubeconfig {CLUSTER}.kubeconfig get nodes -o wide");
        if let Some(path) = world.workload_kubeconfig(NAMESPACE, CLUSTER) {
            println!("  (the same file: {})", path.display());
        }
        println!("Ctrl-C stops it all.");
        let _ = tokio::signal::ctrl_c().await;
    }
    world.shutdown().await;
    result
}

async fn drive(world: &mut World, args: &DemoArgs, timeout: Duration) -> anyhow::Result<()> {
    let api_before = world.emulator.counters();
    let operator_before = world
        .emulator
        .counters_of_agent(capmvm_operator::USER_AGENT);
    let started = Instant::now();
    let applied = world.apply_demo_cluster(&[], |_| {}).await?;
    println!("\ncreated {}", applied.join(", "));
    println!();

    let mut table = LiveTable::new();
    let machines: Api<MicrovmMachine> = Api::namespaced(world.client.clone(), NAMESPACE);
    let capi_machines: Api<Machine> = Api::namespaced(world.client.clone(), NAMESPACE);
    let deadline = Instant::now() + timeout;
    loop {
        let list = machines.list(&ListParams::default()).await?.items;
        let nodes = node_names(world, &list);
        table.show(&list, &nodes);
        let capi_ready = capi_machines
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|m| m.spec.provider_id.is_some())
            .count();
        if list.len() == MACHINES
            && list.iter().all(is_ready)
            && capi_ready == MACHINES
            && nodes.len() == MACHINES
        {
            break;
        }
        if Instant::now() > deadline {
            bail!("the cluster was not ready within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let time_to_ready = started.elapsed();
    let api_to_ready = world.emulator.counters().since(&api_before);
    let flintlock_to_ready = world.flintlock_calls();
    println!(
        "\nall {MACHINES} machines ready in {:.1}s (provisioning takes {:.1}s on the hosts)",
        time_to_ready.as_secs_f64(),
        args.provision_ms as f64 / 1000.0
    );
    let operator_to_ready = world
        .emulator
        .counters_of_agent(capmvm_operator::USER_AGENT)
        .since(&operator_before);
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

    println!("\ndeleting Cluster {CLUSTER}");
    let deleted_at = Instant::now();
    Api::<Cluster>::namespaced(world.client.clone(), NAMESPACE)
        .delete(CLUSTER, &DeleteParams::default())
        .await
        .context("deleting the Cluster")?;
    loop {
        let list = machines.list(&ListParams::default()).await?.items;
        table.show(&list, &node_names(world, &list));
        let cluster_gone = Api::<Cluster>::namespaced(world.client.clone(), NAMESPACE)
            .get_opt(CLUSTER)
            .await?
            .is_none();
        if cluster_gone && list.is_empty() && world.all_vms().is_empty() {
            break;
        }
        if Instant::now() > deadline.max(deleted_at + timeout) {
            let left: Vec<String> = world
                .all_vms()
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
        &world.emulator.counters().since(&api_before),
        &world
            .emulator
            .counters_of_agent(capmvm_operator::USER_AGENT)
            .since(&operator_before),
        &world.flintlock_calls(),
    );
    Ok(())
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
    api: &CounterSnapshot,
    operator: &CounterSnapshot,
    flintlock: &BTreeMap<&str, u64>,
) {
    let by_verb = |c: &CounterSnapshot| {
        let mut m: BTreeMap<&'static str, u64> = BTreeMap::new();
        for (verb, _, n) in c.iter() {
            *m.entry(verb.as_str()).or_default() += n;
        }
        m
    };
    println!("\nsummary");
    println!("  time to ready          {:.1}s", ready.as_secs_f64());
    if let Some(clean) = clean {
        println!("  time to clean up       {:.1}s", clean.as_secs_f64());
    }
    println!(
        "  API requests           {} by the operator, {} by all clients (CAPI stand-in, demo)",
        operator.total(),
        api.total()
    );
    let all = by_verb(api);
    let own = by_verb(operator);
    for (verb, n) in &all {
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
        let mut rows: Vec<[String; 6]> = machines
            .iter()
            .map(|m| {
                let status = m.status.clone().unwrap_or_default();
                let ready = status.conditions.iter().find(|c| c.type_ == READY);
                [
                    m.name_any(),
                    status.host.unwrap_or_else(|| "-".into()),
                    status.vm_state.map(state_name).unwrap_or("-").to_string(),
                    ready
                        .map(|c| c.status.clone())
                        .unwrap_or_else(|| "-".into()),
                    nodes
                        .get(&m.name_any())
                        .cloned()
                        .unwrap_or_else(|| "-".into()),
                    ready.map(|c| c.reason.clone()).unwrap_or_default(),
                ]
            })
            .collect();
        rows.sort();
        let header = ["MACHINE", "HOST", "STATE", "READY", "NODE", "REASON"].map(String::from);
        let widths: Vec<usize> = (0..6)
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

/// Issue 13: each machine's Node in the workload cluster (registered with its providerID), by
/// machine name.
fn node_names(world: &World, machines: &[MicrovmMachine]) -> BTreeMap<String, String> {
    let cluster = crate::capi::workload::ClusterKey::new(NAMESPACE, CLUSTER);
    machines
        .iter()
        .filter_map(|m| {
            let pid = m.spec.provider_id.as_deref()?;
            let node = world.workloads().node_by_provider_id(&cluster, pid)?;
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
