//! `capmvm-sim soak`: the whole system under faults, proving nothing is lost.
//!
//! A cluster's workers are created, scaled down, scaled up and deleted while a share of the operator's
//! and the CAPI stand-in's API requests fail (500, 429, 409, 504, slow answers, writes carried out whose
//! reply is then lost to a 504 or a cut connection, cut watches, 410 on resume: the emulator's faults,
//! aimed at the two clients by user agent, never at the harness's own), hosts are partitioned and
//! healed, and the operator process is killed (SIGKILL) at random points and started again. Monitors
//! watch the hosts and the API throughout:
//!
//! - **duplicates**: a machine (its origin uid, carried in the microVM's meta-data) that ever had more
//!   than one microVM on the hosts;
//! - **early releases**: a MicrovmMachine that disappeared (its finalizer released) while a microVM
//!   carrying its uid was still on a host;
//! - **convergence**: after each step, the desired machines exist and are Ready;
//! - **leaks**: anything left on a host once the cluster is deleted.
//!
//! It exits non-zero if any of these fails, or if the chaos did less than asked (kills, partitions).
//! The monitors are [`monitor`]'s, shared with the real-stack soak ([`real`], `--control-plane
//! real`).

pub mod monitor;
pub mod real;
pub mod real_faults;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use capmvm_api::MicrovmMachine;
use capmvm_api::capi::Cluster;
use capmvm_api::conditions::types::READY;
use capmvm_flintlock::hollow::HostControl;
use clap::Args;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;
use tokio::sync::watch;

use self::monitor::{Monitors, Rng};
use crate::capi::MachineDeployment;
use crate::kube::{FaultCounts, FaultKind, FaultRule, Verb};
use crate::world::{World, WorldOptions};

const NS: &str = "default";
const CLUSTER: &str = "demo";
const DEPLOYMENT: &str = "demo-md-0";

/// Where the soak runs.
#[derive(clap::ValueEnum, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ControlPlane {
    /// The embedded API emulator and the CAPI stand-in, with the emulator's API faults.
    #[default]
    Emulator,
    /// The real stack: etcd, kube-apiserver, CAPI's own managers (docs/real-stack.md); the faults
    /// kill and restart them ([`real`]).
    Real,
}

/// Options of `capmvm-sim soak`.
#[derive(Args, Debug, Clone)]
pub struct SoakArgs {
    /// `real`: on the real stack, with etcd, kube-apiserver, CAPI's managers, the operator and the
    /// hosts failing ([`real`]; of the options below only `--minutes`, `--seed`, `--hosts` and
    /// `--step-timeout-secs` apply).
    #[arg(long, value_enum, default_value_t = ControlPlane::Emulator)]
    pub control_plane: ControlPlane,
    /// With `--control-plane real`: minutes of faults (at least one of each kind, whatever the
    /// minutes).
    #[arg(long, default_value_t = 60.0)]
    pub minutes: f64,
    /// Worker machines at full size (the run scales to half and back).
    #[arg(long, default_value_t = 200)]
    pub machines: usize,
    /// Hollow flintlock hosts.
    #[arg(long, default_value_t = 5)]
    pub hosts: usize,
    /// Share of the operator's API requests that fail.
    #[arg(long, default_value_t = 0.05)]
    pub fault_share: f64,
    /// Operator kills (SIGKILL, then a restart), at least.
    #[arg(long, default_value_t = 3)]
    pub kills: usize,
    /// Host partitions (a host stops listening, then listens again), at least.
    #[arg(long, default_value_t = 3)]
    pub partitions: usize,
    /// Scale-down-and-up rounds between the create and the delete.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    pub rounds: u64,
    /// Milliseconds from create to CREATED on the hosts.
    #[arg(long, default_value_t = 1000)]
    pub provision_ms: u64,
    /// Seed of the chaos schedule and of the emulator's faults (a failing run can be replayed).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Give up on a step after this many seconds.
    #[arg(long, default_value_t = 300)]
    pub step_timeout_secs: u64,
}

impl Default for SoakArgs {
    fn default() -> Self {
        Self {
            control_plane: ControlPlane::Emulator,
            minutes: 60.0,
            machines: 200,
            hosts: 5,
            fault_share: 0.05,
            kills: 3,
            partitions: 3,
            rounds: 3,
            provision_ms: 1000,
            seed: 1,
            step_timeout_secs: 300,
        }
    }
}

/// What a soak run saw.
#[derive(Debug)]
pub struct SoakReport {
    /// The options.
    pub args: SoakArgs,
    /// Each step and how long it took to converge (`None`: it did not).
    pub steps: Vec<(String, Option<Duration>)>,
    /// Faults the emulator injected into the operator's and the stand-in's requests.
    pub faults: FaultCounts,
    /// The operator's API requests over the run.
    pub operator_requests: u64,
    /// The CAPI stand-in's API requests over the run.
    pub stand_in_requests: u64,
    /// Operator kills carried out.
    pub kills: usize,
    /// Host partitions carried out.
    pub partitions: usize,
    /// Machines that had more than one microVM: origin uid → microVM uids.
    pub duplicates: BTreeMap<String, BTreeSet<String>>,
    /// MicrovmMachines whose finalizer went while their microVM was still on a host.
    pub early_releases: Vec<String>,
    /// MicroVMs left on the hosts after the cluster was deleted (`host: uid`).
    pub leaks: Vec<String>,
    /// Wall time of the whole run.
    pub total: Duration,
}

impl SoakReport {
    /// What went wrong; empty when the run proved its point.
    pub fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (step, took) in &self.steps {
            if took.is_none() {
                out.push(format!("step {step:?} did not converge"));
            }
        }
        if !self.duplicates.is_empty() {
            out.push(format!(
                "{} machine(s) had duplicate microVMs",
                self.duplicates.len()
            ));
        }
        if !self.early_releases.is_empty() {
            out.push(format!(
                "{} finalizer(s) released before the microVM was gone",
                self.early_releases.len()
            ));
        }
        if !self.leaks.is_empty() {
            out.push(format!("{} microVM(s) leaked", self.leaks.len()));
        }
        if self.kills < self.args.kills {
            out.push(format!(
                "only {} of {} operator kills happened",
                self.kills, self.args.kills
            ));
        }
        if self.partitions < self.args.partitions {
            out.push(format!(
                "only {} of {} host partitions happened",
                self.partitions, self.args.partitions
            ));
        }
        if self.args.fault_share > 0.0 && self.faults.total() == 0 {
            out.push("no fault was injected".to_string());
        }
        out
    }

    /// The report as text.
    pub fn render(&self) -> String {
        let a = &self.args;
        let mut s = format!(
            "soak: {} machines on {} hosts, {} rounds, {:.1} % of the operator's and the stand-in's requests faulted, seed {}\n\n",
            a.machines,
            a.hosts,
            a.rounds,
            a.fault_share * 100.0,
            a.seed
        );
        s.push_str("| step | converged in |\n|---|---:|\n");
        for (step, took) in &self.steps {
            let took = took.map_or_else(
                || "NOT CONVERGED".to_string(),
                |d| format!("{:.1} s", d.as_secs_f64()),
            );
            s.push_str(&format!("| {step} | {took} |\n"));
        }
        s.push_str("\n| fault | injected |\n|---|---:|\n");
        for kind in FaultKind::ALL {
            let n = self.faults.kind_total(kind);
            if n > 0 {
                s.push_str(&format!("| {} | {n} |\n", kind.as_str()));
            }
        }
        s.push_str(&format!(
            "| total | {} of {} requests ({} operator, {} stand-in) |\n",
            self.faults.total(),
            self.operator_requests + self.stand_in_requests,
            self.operator_requests,
            self.stand_in_requests
        ));
        s.push_str(&format!(
            "\n| measure | value |\n|---|---:|\n| operator kills | {} |\n| host partitions | {} |\n| duplicate microVMs | {} |\n| finalizers released early | {} |\n| leaked microVMs | {} |\n| total time | {:.1} s |\n",
            self.kills,
            self.partitions,
            self.duplicates.values().map(|v| v.len() - 1).sum::<usize>(),
            self.early_releases.len(),
            self.leaks.len(),
            self.total.as_secs_f64()
        ));
        for (uid, vms) in &self.duplicates {
            s.push_str(&format!("duplicate: machine {uid}: {vms:?}\n"));
        }
        for r in &self.early_releases {
            s.push_str(&format!("early release: {r}\n"));
        }
        for l in &self.leaks {
            s.push_str(&format!("leak: {l}\n"));
        }
        let failures = self.failures();
        if failures.is_empty() {
            s.push_str("\nresult: PASS\n");
        } else {
            s.push_str(&format!("\nresult: FAIL: {}\n", failures.join("; ")));
        }
        s
    }
}

/// Runs `capmvm-sim soak` and prints its report; an error if anything was lost.
pub fn main(args: SoakArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let exe = std::env::current_exe().context("finding the capmvm-sim executable")?;
    if args.control_plane == ControlPlane::Real {
        let real_args = real::RealSoakArgs {
            minutes: args.minutes,
            seed: args.seed,
            hosts: args.hosts,
            step_timeout_secs: args.step_timeout_secs,
        };
        let report = runtime.block_on(real::run(real_args, exe))?;
        print!("{}", report.render());
        let failures = report.failures();
        if failures.is_empty() {
            return Ok(());
        }
        bail!("soak failed: {}", failures.join("; "));
    }
    let report = runtime.block_on(run(args, exe))?;
    print!("{}", report.render());
    let failures = report.failures();
    if failures.is_empty() {
        Ok(())
    } else {
        bail!("soak failed: {}", failures.join("; "))
    }
}

/// The faults aimed at the operator and at the CAPI stand-in: `share` of each one's requests,
/// spread over the kinds real servers answer under stress (errors, slow answers, and writes carried
/// out whose reply is lost), plus cut watches and 410 on resume.
fn fault_rules(share: f64) -> anyhow::Result<Vec<FaultRule>> {
    let mut rules = Vec::new();
    for agent in ["capmvm-operator/", "capmvm-capi-stand-in/"] {
        rules.extend(fault_rules_for(agent, share));
    }
    Ok(rules)
}

/// [`fault_rules`] for the client whose User-Agent starts with `agent`.
fn fault_rules_for(agent: &str, share: f64) -> Vec<FaultRule> {
    // Rules are tried in order, each drawing on its own; kinds of `share / 4` each make about
    // `share` of the requests they apply to fail, writes a little more.
    let each = share / 4.0;
    let writes = [Verb::Create, Verb::Update, Verb::Patch, Verb::Delete];
    vec![
        FaultRule::new(FaultKind::InternalError)
            .user_agent_prefix(agent)
            .share(each),
        FaultRule::new(FaultKind::TooManyRequests)
            .user_agent_prefix(agent)
            .retry_after_secs(1)
            .share(each),
        FaultRule::new(FaultKind::Conflict)
            .verbs([Verb::Update, Verb::Patch])
            .user_agent_prefix(agent)
            .share(each * 2.0),
        FaultRule::new(FaultKind::Timeout)
            .user_agent_prefix(agent)
            .share(each),
        // The common bad case: the write lands, its reply does not.
        FaultRule::new(FaultKind::CommittedTimeout)
            .verbs(writes)
            .user_agent_prefix(agent)
            .share(each),
        FaultRule::new(FaultKind::CommittedCut)
            .verbs(writes)
            .user_agent_prefix(agent)
            .share(each),
        FaultRule::new(FaultKind::Slow)
            .user_agent_prefix(agent)
            .delay(Duration::from_millis(400))
            .share(each),
        FaultRule::new(FaultKind::CutWatch)
            .user_agent_prefix(agent)
            .cut_after(5)
            .share(share),
        FaultRule::new(FaultKind::Gone)
            .user_agent_prefix(agent)
            .share(share),
    ]
}

/// Runs one soak; `exe` runs the operator (`capmvm-sim operator`).
pub async fn run(args: SoakArgs, exe: PathBuf) -> anyhow::Result<SoakReport> {
    let started = Instant::now();
    let mut options = WorldOptions::new(args.hosts, Duration::from_millis(args.provision_ms), exe);
    options.operator_flags = vec![
        "--host-poll-interval=2s".to_string(),
        "--host-poll-interval-busy=500ms".to_string(),
        format!(
            "--log-level={}",
            std::env::var("CAPMVM_SOAK_LOG").unwrap_or_else(|_| "warn".to_string())
        ),
    ];
    options.emulator = options.emulator.history_limit(50_000).watch_buffer(20_000);
    options.keep_dir = std::env::var("CAPMVM_SOAK_LOG").is_ok();
    let mut world = World::start(options).await?;
    world.start_operator(&[])?;
    eprintln!("soak: operator log {}", world.operator_log().display());
    let faults = world.emulator.faults();
    faults.seed(args.seed);
    faults.set_rules(fault_rules(args.fault_share)?)?;
    let api_before = world
        .emulator
        .counters_of_agent(capmvm_operator::USER_AGENT);
    let stand_in_before = world
        .emulator
        .counters_of_agent(crate::world::STAND_IN_USER_AGENT);

    let client = world.client.clone();
    let hosts: Vec<HostControl> = world.hosts.iter().map(|h| h.control()).collect();
    let monitors = Monitors::start(
        Api::<MicrovmMachine>::namespaced(client.clone(), NS),
        hosts.clone(),
    );
    let (stop_tx, stop_rx) = watch::channel(false);
    world
        .apply_demo_cluster(
            &[
                ("CONTROL_PLANE_MACHINE_COUNT", "0".to_string()),
                ("WORKER_MACHINE_COUNT", args.machines.to_string()),
            ],
            |_| {},
        )
        .await?;
    // The chaos owns the world (it kills and restarts the operator) until the steps are done.
    let (done_tx, mut done_rx) = watch::channel((0, 0));
    let chaos = tokio::spawn(chaos(world, args.clone(), stop_rx.clone(), done_tx));

    let step_timeout = Duration::from_secs(args.step_timeout_secs);
    let half = (args.machines / 2).max(1);
    let mut steps = Vec::new();
    let t = Instant::now();
    let ok = converge(&client, args.machines, step_timeout).await?;
    steps.push((format!("create {}", args.machines), ok.then(|| t.elapsed())));
    for round in 1..=args.rounds {
        for size in [half, args.machines] {
            if steps.iter().any(|(_, d)| d.is_none()) {
                break;
            }
            scale(&client, size).await?;
            let t = Instant::now();
            let ok = converge(&client, size, step_timeout).await?;
            steps.push((
                format!("round {round}: scale to {size}"),
                ok.then(|| t.elapsed()),
            ));
        }
    }
    if steps.iter().all(|(_, d)| d.is_some()) {
        // Small runs converge faster than the chaos reaches its counts: hold the full size under
        // chaos until it has, then check it converged again.
        let t = Instant::now();
        let targets = (args.kills, args.partitions);
        let reached = tokio::time::timeout(
            step_timeout,
            done_rx.wait_for(|(k, p)| *k >= targets.0 && *p >= targets.1),
        )
        .await
        .is_ok();
        let ok = reached && converge(&client, args.machines, step_timeout).await?;
        steps.push((
            format!("hold {} under chaos", args.machines),
            ok.then(|| t.elapsed()),
        ));
    }
    Api::<Cluster>::namespaced(client.clone(), NS)
        .delete(CLUSTER, &DeleteParams::default())
        .await
        .context("deleting the cluster")?;
    let t = Instant::now();
    let ok = gone(&client, &hosts, step_timeout).await?;
    steps.push(("delete the cluster".to_string(), ok.then(|| t.elapsed())));

    let _ = stop_tx.send(true);
    let (mut world, kills, partitions) = chaos.await.context("the chaos task")??;
    let findings = monitors.finish().await?;
    faults.clear();
    let operator_requests = world
        .emulator
        .counters_of_agent(capmvm_operator::USER_AGENT)
        .since(&api_before)
        .total();
    let stand_in_requests = world
        .emulator
        .counters_of_agent(crate::world::STAND_IN_USER_AGENT)
        .since(&stand_in_before)
        .total();
    let leaks = monitor::leaks(&hosts, &BTreeSet::new());
    let fault_counts = faults.counts();
    world.stop_operator().await;
    world.shutdown().await;
    Ok(SoakReport {
        args,
        steps,
        faults: fault_counts,
        operator_requests,
        stand_in_requests,
        kills,
        partitions,
        duplicates: findings.duplicates,
        early_releases: findings.early_releases,
        leaks,
        total: started.elapsed(),
    })
}

async fn scale(client: &kube::Client, replicas: usize) -> anyhow::Result<()> {
    Api::<MachineDeployment>::namespaced(client.clone(), NS)
        .patch(
            DEPLOYMENT,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .with_context(|| format!("scaling {DEPLOYMENT} to {replicas}"))?;
    Ok(())
}

/// Waits until exactly `n` MicrovmMachines exist, none deleting, all Ready. `false` on timeout.
async fn converge(client: &kube::Client, n: usize, timeout: Duration) -> anyhow::Result<bool> {
    let api = Api::<MicrovmMachine>::namespaced(client.clone(), NS);
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let machines = api.list(&ListParams::default()).await?.items;
        let ready = machines
            .iter()
            .filter(|m| m.metadata.deletion_timestamp.is_none())
            .filter(|m| {
                m.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == READY && c.status == "True")
                })
            })
            .count();
        eprint!(
            "\rsoak: {ready:>5}/{n} ready, {:>5} objects",
            machines.len()
        );
        if machines.len() == n && ready == n {
            eprintln!();
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!();
    Ok(false)
}

/// Waits until no MicrovmMachine exists and the hosts hold no microVM. `false` on timeout.
async fn gone(
    client: &kube::Client,
    hosts: &[HostControl],
    timeout: Duration,
) -> anyhow::Result<bool> {
    let api = Api::<MicrovmMachine>::namespaced(client.clone(), NS);
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let machines = api.list(&ListParams::default()).await?.items.len();
        let vms: usize = hosts.iter().map(|h| h.vms().len()).sum();
        eprint!("\rsoak: deleting: {machines:>5} objects, {vms:>5} microVMs");
        if machines == 0 && vms == 0 {
            eprintln!();
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!();
    Ok(false)
}

/// Kills and restarts the operator, and partitions and heals hosts, at random moments until told to
/// stop; then heals everything and makes sure the operator runs. Returns the world and the counts.
async fn chaos(
    mut world: World,
    args: SoakArgs,
    mut stop: watch::Receiver<bool>,
    done: watch::Sender<(usize, usize)>,
) -> anyhow::Result<(World, usize, usize)> {
    let mut rng = Rng::new(args.seed ^ 0x5eed);
    let hosts: Vec<HostControl> = world.hosts.iter().map(|h| h.control()).collect();
    let (mut kills, mut partitions) = (0, 0);
    loop {
        let pause = rng.millis(1_000, 4_000);
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = stop.changed() => break,
        }
        // Kills and partitions alternate at random, the one behind its target first.
        let kill = if kills < args.kills && partitions >= args.partitions {
            true
        } else if partitions < args.partitions && kills >= args.kills {
            false
        } else {
            rng.next_u64().is_multiple_of(2)
        };
        if kill {
            world.kill_operator().await;
            kills += 1;
            tokio::time::sleep(rng.millis(200, 1_500)).await;
            world.start_operator(&[])?;
        } else if !hosts.is_empty() {
            let host = &hosts[rng.below(hosts.len())];
            host.set_reachable(false).await?;
            partitions += 1;
            tokio::time::sleep(rng.millis(2_000, 6_000)).await;
            host.set_reachable(true).await?;
        }
        done.send_replace((kills, partitions));
    }
    for h in &hosts {
        if !h.is_reachable().await {
            h.set_reachable(true).await?;
        }
    }
    if world.operator().is_none() {
        world.start_operator(&[])?;
    }
    Ok((world, kills, partitions))
}
