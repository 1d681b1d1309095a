//! `capmvm-sim bench --pool [--hosts H] [--provision-ms MS] [--poll-secs S]`: one MachinePool (the
//! `machinepool` flavor, no control plane) over H hollow hosts, driven through the CAPI stand-in and
//! the operator (its own process), measured step by step:
//!
//! - scale 0 -> 200 -> 20 -> 200 through the scale subresource (as `kubectl scale mp` and
//!   cluster-autoscaler do): time until exactly that many instances exist, all ready, none being
//!   deleted, against (provision + poll);
//! - then, at 200, a roll to a new template (memory + 1024 MiB) with maxSurge 20 and maxUnavailable 0:
//!   time until all 200 run the new template, against its ideal, 200/20 waves of (provision + poll);
//! - per step, the operator's API writes per instance created (those instances cause: instance,
//!   Machine and Event writes; and all, the pool object's own included) and flintlock calls per
//!   instance created or deleted; the operator's CPU seconds and peak RSS at the end.
//!
//! Targets: each scale step at most 1.5 x (provision + poll); the roll at most 1.5 x its ideal; at
//! most 4.2 instance-caused operator API writes per instance created while scaling up. Missing one
//! exits non-zero.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use capmvm_api::conditions::types::READY;
use capmvm_api::keys::POOL_NAME_LABEL;
use capmvm_api::{MicrovmMachine, MicrovmMachinePool};
use kube::api::{DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt as _};
use serde_json::json;

use crate::bench::{BenchArgs, mark, verdict};
use crate::capi::machinepool::machine_pool_resource;
use crate::kube::{CounterSnapshot, Verb};
use crate::world::{MACHINEPOOL_CLUSTER, World};

const NAMESPACE: &str = "default";
/// The flavor's MachinePool and MicrovmMachinePool (cluster `demo`).
const POOL: &str = "demo-mp-0";
/// The targets.
const SCALE_TARGET: f64 = 1.5;
const ROLL_TARGET: f64 = 1.5;
/// At most this many instance-caused operator API writes per instance created while scaling up.
pub const WRITES_PER_CREATED_TARGET: f64 = 4.2;

/// The sizes the pool goes through.
#[derive(Debug, Clone, Copy)]
pub struct PoolPlan {
    /// The large size (scaled to from 0, scaled back to, and rolled at).
    pub peak: usize,
    /// The small size scaled down to.
    pub low: usize,
    /// `maxSurge` of the roll (`maxUnavailable` is 0).
    pub max_surge: usize,
}

impl Default for PoolPlan {
    fn default() -> Self {
        Self {
            peak: 200,
            low: 20,
            max_surge: 20,
        }
    }
}

/// One measured step.
#[derive(Debug, Clone)]
pub struct Step {
    /// What happened (`scale 0 -> 200`, `roll 200`).
    pub name: String,
    /// Instances created and deleted by it.
    pub created: usize,
    /// See `created`.
    pub deleted: usize,
    /// Time until it converged.
    pub elapsed: Duration,
    /// What it is measured against.
    pub budget: Duration,
    /// The allowed multiple of `budget`.
    pub target: f64,
    /// Whether its API writes per created instance are a target.
    pub writes_target: bool,
    /// The operator's requests during it.
    pub operator_requests: CounterSnapshot,
    /// Flintlock calls during it, by method.
    pub flintlock: BTreeMap<&'static str, u64>,
}

impl Step {
    /// `elapsed / budget`.
    pub fn ratio(&self) -> f64 {
        self.elapsed.as_secs_f64() / self.budget.as_secs_f64().max(0.001)
    }

    /// The operator's writes (create, update, patch, delete).
    pub fn writes(&self) -> u64 {
        self.operator_requests
            .iter()
            .filter(|(v, _, _)| !matches!(v, Verb::Get | Verb::List | Verb::Watch))
            .map(|(_, _, n)| n)
            .sum()
    }

    /// The operator's writes that instances cause: all but those to the pool object itself and
    /// the MicrovmCluster (a handful per step whatever the pool's size), as the machine bench
    /// leaves out the per-cluster writes.
    pub fn instance_writes(&self) -> u64 {
        self.operator_requests
            .iter()
            .filter(|(v, r, _)| {
                !matches!(v, Verb::Get | Verb::List | Verb::Watch)
                    && !r.starts_with("infrastructure.cluster.x-k8s.io/microvmmachinepools")
                    && !r.starts_with("infrastructure.cluster.x-k8s.io/microvmclusters")
            })
            .map(|(_, _, n)| n)
            .sum()
    }

    /// Instance-caused operator writes per instance created (`None` when none was): the target.
    pub fn writes_per_created(&self) -> Option<f64> {
        (self.created > 0).then(|| self.instance_writes() as f64 / self.created as f64)
    }

    /// All operator writes per instance created, the pool's own included.
    pub fn all_writes_per_created(&self) -> Option<f64> {
        (self.created > 0).then(|| self.writes() as f64 / self.created as f64)
    }

    /// Flintlock calls per instance created or deleted.
    pub fn flintlock_per_instance(&self) -> Option<f64> {
        let changed = self.created + self.deleted;
        (changed > 0).then(|| self.flintlock.values().sum::<u64>() as f64 / changed as f64)
    }
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct PoolReport {
    /// The options.
    pub args: BenchArgs,
    /// The sizes.
    pub plan: PoolPlan,
    /// The steps, in order.
    pub steps: Vec<Step>,
    /// The operator's CPU seconds and peak RSS (KiB) at the end.
    pub operator_usage: Option<(f64, u64)>,
}

/// Runs the pool benchmark and prints its report; an error when a target is missed.
pub fn main(args: BenchArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let report = runtime.block_on(run(args, PoolPlan::default()))?;
    print!("{}", report.render());
    let failures = report.failures();
    if failures.is_empty() {
        Ok(())
    } else {
        bail!("targets missed: {}", failures.join("; "))
    }
}

/// Runs one measurement, the operator run by this executable (`capmvm-sim`).
pub async fn run(args: BenchArgs, plan: PoolPlan) -> anyhow::Result<PoolReport> {
    let exe = std::env::current_exe().context("finding the capmvm-sim executable")?;
    run_with_exe(args, plan, exe).await
}

/// [`run`], the operator run by `capmvm-sim` at `exe` (`capmvm-sim operator`).
pub async fn run_with_exe(
    args: BenchArgs,
    plan: PoolPlan,
    exe: std::path::PathBuf,
) -> anyhow::Result<PoolReport> {
    if plan.max_surge == 0 || plan.low > plan.peak {
        bail!("the pool plan needs maxSurge >= 1 and low <= peak, got {plan:?}");
    }
    let options = crate::bench::world_options(&args, exe);
    let mut world = World::start(options).await?;
    world.start_operator(&[])?;
    let result = measure(&world, &args, plan).await;
    eprintln!("operator log: {}", world.operator_log().display());
    let usage = world.operator_usage();
    world.shutdown().await;
    let steps = result?;
    Ok(PoolReport {
        args,
        plan,
        steps,
        operator_usage: usage,
    })
}

async fn measure(world: &World, args: &BenchArgs, plan: PoolPlan) -> anyhow::Result<Vec<Step>> {
    eprintln!(
        "bench --pool: 0 -> {} -> {} -> {}, then a roll with maxSurge {}, on {} hosts (provision {} ms, host poll {} s)",
        plan.peak,
        plan.low,
        plan.peak,
        plan.max_surge,
        args.hosts,
        args.provision_ms,
        args.poll_secs
    );
    world
        .apply_template(
            MACHINEPOOL_CLUSTER,
            &[
                ("CONTROL_PLANE_MACHINE_COUNT", "0".to_string()),
                ("WORKER_MACHINE_COUNT", "0".to_string()),
                ("WORKER_MACHINE_MAX_SURGE", plan.max_surge.to_string()),
                ("WORKER_MACHINE_MAX_UNAVAILABLE", "0".to_string()),
            ],
            |_| {},
        )
        .await?;
    // Let the operator and the stand-in take the empty pool in before the clock starts.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cycle = Duration::from_millis(args.provision_ms) + Duration::from_secs(args.poll_secs);
    let deadline = Duration::from_secs(args.timeout_secs);
    let memory = current_memory(world).await?;
    let mut steps = Vec::new();
    let mut size = 0;
    for target in [plan.peak, plan.low, plan.peak] {
        let name = format!("scale {size} -> {target}");
        let step = timed(world, &name, deadline, memory, target, || async {
            Api::<DynamicObject>::namespaced_with(
                world.client.clone(),
                NAMESPACE,
                &machine_pool_resource(),
            )
            .patch_scale(
                POOL,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": target}})),
            )
            .await
            .context("scaling the MachinePool")?;
            Ok(())
        })
        .await?;
        steps.push(Step {
            created: target.saturating_sub(size),
            deleted: size.saturating_sub(target),
            budget: cycle,
            target: SCALE_TARGET,
            writes_target: target > size,
            ..step
        });
        size = target;
    }
    let new_memory = memory + 1024;
    let waves = plan.peak.div_ceil(plan.max_surge);
    let step = timed(
        world,
        &format!("roll {} (maxSurge {})", plan.peak, plan.max_surge),
        deadline,
        new_memory,
        plan.peak,
        || async {
            Api::<MicrovmMachinePool>::namespaced(world.client.clone(), NAMESPACE)
                .patch(
                    POOL,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"template": {"memoryMb": new_memory}}})),
                )
                .await
                .context("changing the pool's template")?;
            Ok(())
        },
    )
    .await?;
    steps.push(Step {
        created: plan.peak,
        deleted: plan.peak,
        budget: cycle * u32::try_from(waves).unwrap_or(u32::MAX),
        target: ROLL_TARGET,
        writes_target: false,
        ..step
    });
    Ok(steps)
}

async fn current_memory(world: &World) -> anyhow::Result<i64> {
    let pool = Api::<MicrovmMachinePool>::namespaced(world.client.clone(), NAMESPACE)
        .get(POOL)
        .await
        .context("reading the MicrovmMachinePool")?;
    Ok(pool.spec.template.memory_mb)
}

/// Runs `act`, then waits until exactly `size` instances exist, all ready with `memory_mb`, none
/// being deleted; measures the time and the operator's and hosts' calls meanwhile.
async fn timed<F, Fut>(
    world: &World,
    name: &str,
    timeout: Duration,
    memory_mb: i64,
    size: usize,
    act: F,
) -> anyhow::Result<Step>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let before = world
        .emulator
        .counters_of_agent(capmvm_operator::USER_AGENT);
    for h in &world.hosts {
        h.control().reset_counters();
    }
    let instances: Api<MicrovmMachine> = Api::namespaced(world.client.clone(), NAMESPACE);
    let selector = format!("{POOL_NAME_LABEL}={POOL}");
    let started = Instant::now();
    act().await?;
    loop {
        let list = instances
            .list(&ListParams::default().labels(&selector))
            .await?
            .items;
        let deleting = list
            .iter()
            .filter(|m| m.metadata.deletion_timestamp.is_some())
            .count();
        let ready = list
            .iter()
            .filter(|m| {
                m.metadata.deletion_timestamp.is_none()
                    && m.spec.memory_mb == memory_mb
                    && m.status.as_ref().is_some_and(|s| {
                        s.conditions
                            .iter()
                            .any(|c| c.type_ == READY && c.status == "True")
                    })
            })
            .count();
        eprint!(
            "\r{name}: {ready:>4} ready of {size}, {:>4} instances ({deleting} deleting)  {:>6.1}s",
            list.len(),
            started.elapsed().as_secs_f64()
        );
        let _ = std::io::stderr().flush();
        if ready == size && list.len() == size {
            break;
        }
        if started.elapsed() > timeout {
            eprintln!();
            let names: Vec<String> = list.iter().take(5).map(|m| m.name_any()).collect();
            bail!("{name}: not converged after {timeout:?} (first instances: {names:?})");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let elapsed = started.elapsed();
    eprintln!();
    Ok(Step {
        name: name.to_string(),
        created: 0,
        deleted: 0,
        elapsed,
        budget: Duration::ZERO,
        target: 0.0,
        writes_target: false,
        operator_requests: world
            .emulator
            .counters_of_agent(capmvm_operator::USER_AGENT)
            .since(&before),
        flintlock: world.flintlock_calls(),
    })
}

impl PoolReport {
    /// Which targets were missed.
    pub fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        for s in &self.steps {
            if s.ratio() > s.target {
                failures.push(format!(
                    "{}: {:.1} s is {:.2} x its budget of {:.1} s (> {})",
                    s.name,
                    s.elapsed.as_secs_f64(),
                    s.ratio(),
                    s.budget.as_secs_f64(),
                    s.target
                ));
            }
            if s.writes_target
                && let Some(w) = s.writes_per_created()
                && w > WRITES_PER_CREATED_TARGET
            {
                failures.push(format!(
                    "{}: {w:.2} API writes per instance created > {WRITES_PER_CREATED_TARGET}",
                    s.name
                ));
            }
        }
        failures
    }

    /// The report as Markdown.
    pub fn render(&self) -> String {
        let a = &self.args;
        let mut out = String::new();
        let mut line = |s: String| {
            out.push_str(&s);
            out.push('\n');
        };
        line(format!(
            "### MachinePool 0 -> {} -> {} -> {}, roll with maxSurge {} ({} hosts, provision {} ms, host poll {} s)\n",
            self.plan.peak,
            self.plan.low,
            self.plan.peak,
            self.plan.max_surge,
            a.hosts,
            a.provision_ms,
            a.poll_secs
        ));
        line("| step | time | budget | time / budget | target | operator API writes per instance created (instance, Machine and Event writes) | all operator writes per instance created (adds the pool's own) | flintlock calls per instance created or deleted |".into());
        line("|---|---|---|---|---|---|---|---|".into());
        for s in &self.steps {
            let writes = s
                .writes_per_created()
                .map_or("-".to_string(), |w| format!("{w:.2}"));
            let writes = if s.writes_target {
                format!(
                    "{writes} (≤ {WRITES_PER_CREATED_TARGET} {})",
                    mark(s.writes_per_created().unwrap_or(0.0) <= WRITES_PER_CREATED_TARGET)
                )
            } else {
                writes
            };
            let all_writes = s
                .all_writes_per_created()
                .map_or("-".to_string(), |w| format!("{w:.2}"));
            line(format!(
                "| {} | {:.1} s | {:.1} s{} | {:.2} | ≤ {} {} | {} | {all_writes} | {} |",
                s.name,
                s.elapsed.as_secs_f64(),
                s.budget.as_secs_f64(),
                if s.name.starts_with("roll") {
                    " (ideal: waves of provision + poll)"
                } else {
                    " (provision + poll)"
                },
                s.ratio(),
                s.target,
                mark(s.ratio() <= s.target),
                writes,
                s.flintlock_per_instance()
                    .map_or("-".to_string(), |f| format!("{f:.2}")),
            ));
        }
        if let Some((cpu, rss)) = self.operator_usage {
            line(String::new());
            line(format!(
                "Operator: {cpu:.1} s CPU, peak RSS {:.1} MiB.",
                rss as f64 / 1024.0
            ));
        }
        line(String::new());
        line("Operator writes per step, by verb and resource:\n".into());
        line("| step | verb | resource | count |".into());
        line("|---|---|---|---|".into());
        for s in &self.steps {
            for (verb, resource, n) in s.operator_requests.iter() {
                if !matches!(verb, Verb::Get | Verb::List | Verb::Watch) {
                    line(format!("| {} | {verb} | {resource} | {n} |", s.name));
                }
            }
        }
        line(String::new());
        line(verdict(&self.failures()));
        out
    }
}
