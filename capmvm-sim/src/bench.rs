//! `capmvm-sim bench --hosts H --machines M [--provision-ms MS]`: one cluster of M workers on H hollow
//! hosts, created through the CAPI stand-in and the operator (its own process), measured:
//!
//! - time to all ready, divided by (provision time + host poll interval);
//! - the operator's API writes and reads per machine, by verb, until ready;
//! - flintlock calls per machine until ready, and per minute in steady state;
//! - the operator's CPU seconds and peak RSS.
//!
//! Each target of docs/benchmarks.md is checked and reported as PASS or FAIL.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use capmvm_api::MicrovmMachine;
use capmvm_api::conditions::types::READY;
use kube::Api;
use kube::api::ListParams;

use crate::kube::{CounterSnapshot, Verb};
use crate::world::{World, WorldOptions};

/// A count of at least one (every ratio the bench reports divides by it).
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{s:?} is not a count of at least 1")),
    }
}

/// Options of `capmvm-sim bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Hollow flintlock hosts.
    #[arg(long, default_value_t = 20, value_parser = at_least_one)]
    pub hosts: usize,
    /// Worker machines of the cluster.
    #[arg(long, default_value_t = 1000, value_parser = at_least_one)]
    pub machines: usize,
    /// Milliseconds from create to CREATED on the hosts.
    #[arg(long, default_value_t = 5000)]
    pub provision_ms: u64,
    /// The operator's --host-poll-interval, in seconds.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub poll_secs: u64,
    /// How long to measure the steady state after everything is ready, in seconds.
    #[arg(long, default_value_t = 60)]
    pub steady_secs: u64,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_secs: u64,
    /// Measure a MachinePool instead (`bench_pool`: 0 -> 200 -> 20 -> 200 and a roll).
    #[arg(long)]
    pub pool: bool,
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// The options.
    pub args: BenchArgs,
    /// Time from applying the cluster to every machine ready.
    pub time_to_ready: Duration,
    /// The operator's requests until ready.
    pub operator_requests: CounterSnapshot,
    /// Flintlock calls until ready, by method.
    pub flintlock_to_ready: BTreeMap<&'static str, u64>,
    /// Flintlock calls during the steady-state window, by method.
    pub flintlock_steady: BTreeMap<&'static str, u64>,
    /// Length of the steady-state window.
    pub steady: Duration,
    /// The operator's CPU seconds and peak RSS (KiB) at the end.
    pub operator_usage: Option<(f64, u64)>,
}

/// Runs the benchmark and prints its report.
pub fn main(args: BenchArgs) -> anyhow::Result<()> {
    if args.pool {
        return crate::bench_pool::main(args);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let report = runtime.block_on(run(args))?;
    print!("{}", report.render());
    if report.failures().is_empty() {
        Ok(())
    } else {
        bail!("targets missed: {}", report.failures().join("; "))
    }
}

/// Runs one measurement.
pub async fn run(args: BenchArgs) -> anyhow::Result<Report> {
    let exe = std::env::current_exe().context("finding the capmvm-sim executable")?;
    let mut options = WorldOptions::new(args.hosts, Duration::from_millis(args.provision_ms), exe);
    options.operator_flags = vec![
        format!("--host-poll-interval={}s", args.poll_secs),
        "--host-poll-interval-busy=1s".to_string(),
        // Quiet by default; CAPMVM_BENCH_LOG=debug shows conflicts and decisions in the operator log.
        format!(
            "--log-level={}",
            std::env::var("CAPMVM_BENCH_LOG").unwrap_or_else(|_| "warn".to_string())
        ),
    ];
    // A large cluster makes many changes at once; keep enough history for watches to resume.
    options.emulator = options.emulator.history_limit(50_000).watch_buffer(20_000);
    options.keep_dir = std::env::var("CAPMVM_BENCH_LOG").is_ok();
    let mut world = World::start(options).await?;
    world.start_operator(&[])?;
    let result = measure(&mut world, &args).await;
    eprintln!("operator log: {}", world.operator_log().display());
    world.shutdown().await;
    result
}

async fn measure(world: &mut World, args: &BenchArgs) -> anyhow::Result<Report> {
    eprintln!(
        "bench: {} machines on {} hosts, provisioning {} ms, host poll {} s",
        args.machines, args.hosts, args.provision_ms, args.poll_secs
    );
    // Let the operator start and settle before the clock starts.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let api_before = world
        .emulator
        .counters_of_agent(capmvm_operator::USER_AGENT);
    for h in &world.hosts {
        h.control().reset_counters();
    }
    let started = Instant::now();
    world
        .apply_demo_cluster(
            &[
                ("CONTROL_PLANE_MACHINE_COUNT", "0".to_string()),
                ("WORKER_MACHINE_COUNT", args.machines.to_string()),
            ],
            |_| {},
        )
        .await?;
    let machines: Api<MicrovmMachine> = Api::namespaced(world.client.clone(), "default");
    let deadline = started + Duration::from_secs(args.timeout_secs);
    loop {
        let list = machines.list(&ListParams::default()).await?.items;
        let ready = list
            .iter()
            .filter(|m| {
                m.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == READY && c.status == "True")
                })
            })
            .count();
        progress(ready, args.machines, started.elapsed());
        if ready == args.machines {
            break;
        }
        if Instant::now() > deadline {
            eprintln!();
            bail!(
                "only {ready} of {} machines ready after {}s",
                args.machines,
                args.timeout_secs
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let time_to_ready = started.elapsed();
    eprintln!();
    let operator_requests = world
        .emulator
        .counters_of_agent(capmvm_operator::USER_AGENT)
        .since(&api_before);
    let flintlock_to_ready = world.flintlock_calls();
    // Issue 13: the hollow kubelets keep up (their Nodes are not part of the targets).
    let at_ready = world.kubelets().registered().len();
    while world.kubelets().registered().len() < args.machines && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "hollow kubelets: {at_ready} Nodes registered when all machines were ready, {} after {:.1} s",
        world.kubelets().registered().len(),
        started.elapsed().as_secs_f64()
    );

    eprintln!(
        "steady state: measuring flintlock calls for {} s",
        args.steady_secs
    );
    for h in &world.hosts {
        h.control().reset_counters();
    }
    let steady_started = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.steady_secs)).await;
    let flintlock_steady = world.flintlock_calls();
    Ok(Report {
        args: args.clone(),
        time_to_ready,
        operator_requests,
        flintlock_to_ready,
        flintlock_steady,
        steady: steady_started.elapsed(),
        operator_usage: world.operator_usage(),
    })
}

fn progress(ready: usize, total: usize, elapsed: Duration) {
    const WIDTH: usize = 40;
    let filled = ready * WIDTH / total.max(1);
    eprint!(
        "\r[{}{}] {ready:>6}/{total} ready  {:>6.1}s",
        "#".repeat(filled),
        "-".repeat(WIDTH - filled),
        elapsed.as_secs_f64()
    );
    let _ = std::io::stderr().flush();
}

impl Report {
    /// `time to ready / (provision + poll interval)`.
    pub fn time_ratio(&self) -> f64 {
        let budget = Duration::from_millis(self.args.provision_ms)
            + Duration::from_secs(self.args.poll_secs);
        self.time_to_ready.as_secs_f64() / budget.as_secs_f64()
    }

    /// The operator's writes per machine until ready.
    pub fn writes_per_machine(&self) -> f64 {
        let writes: u64 = [
            Verb::Create,
            Verb::Update,
            Verb::Patch,
            Verb::Delete,
            Verb::DeleteCollection,
        ]
        .into_iter()
        .map(|v| self.operator_requests.verb_total(v))
        .sum();
        writes as f64 / self.args.machines as f64
    }

    /// The operator's writes that each machine causes, per machine until ready: everything but the
    /// per-cluster writes (MicrovmCluster and MicrovmMachineTemplate status, a handful per cluster
    /// whatever its size).
    pub fn machine_caused_writes_per_machine(&self) -> f64 {
        let writes: u64 = self
            .operator_requests
            .iter()
            .filter(|(v, r, _)| {
                !matches!(v, Verb::Get | Verb::List | Verb::Watch)
                    && !r.starts_with("infrastructure.cluster.x-k8s.io/microvmclusters")
                    && !r.starts_with("infrastructure.cluster.x-k8s.io/microvmmachinetemplates")
            })
            .map(|(_, _, n)| n)
            .sum();
        writes as f64 / self.args.machines as f64
    }

    /// The operator's writes to MicrovmMachines (main resource and status) per machine until ready.
    pub fn machine_writes_per_machine(&self) -> f64 {
        let writes: u64 = self
            .operator_requests
            .iter()
            .filter(|(v, r, _)| {
                !matches!(v, Verb::Get | Verb::List | Verb::Watch)
                    && r.starts_with("infrastructure.cluster.x-k8s.io/microvmmachines")
            })
            .map(|(_, _, n)| n)
            .sum();
        writes as f64 / self.args.machines as f64
    }

    /// Flintlock calls per minute in the steady state.
    pub fn steady_calls_per_minute(&self) -> f64 {
        self.flintlock_steady.values().sum::<u64>() as f64 * 60.0
            / self.steady.as_secs_f64().max(1.0)
    }

    /// Which targets were missed.
    pub fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        if self.time_ratio() > 1.25 {
            failures.push(format!("time ratio {:.2} > 1.25", self.time_ratio()));
        }
        if self.machine_caused_writes_per_machine() > 4.0 {
            failures.push(format!(
                "{:.2} API writes per machine > 4",
                self.machine_caused_writes_per_machine()
            ));
        }
        // Steady state: one list per host per poll interval, whatever the number of machines.
        let per_host_per_minute = self.steady_calls_per_minute() / self.args.hosts as f64;
        let expected = 60.0 / self.args.poll_secs as f64;
        if per_host_per_minute > expected * 1.5 + 1.0 {
            failures.push(format!(
                "{per_host_per_minute:.1} steady flintlock calls per host per minute > {:.1} (one list per poll)",
                expected * 1.5 + 1.0
            ));
        }
        if let Some((_, rss_kib)) = self.operator_usage
            && rss_kib > 64 * 1024
        {
            failures.push(format!(
                "operator peak RSS {:.1} MiB > 64 MiB",
                rss_kib as f64 / 1024.0
            ));
        }
        failures
    }

    /// The report as Markdown.
    pub fn render(&self) -> String {
        let a = &self.args;
        let m = a.machines as f64;
        let mut out = String::new();
        let mut line = |s: String| {
            out.push_str(&s);
            out.push('\n');
        };
        line(format!(
            "### {} machines on {} hosts (provision {} ms, host poll {} s)\n",
            a.machines, a.hosts, a.provision_ms, a.poll_secs
        ));
        line("| measure | value | target |".into());
        line("|---|---|---|".into());
        line(format!(
            "| time to all ready | {:.1} s | |",
            self.time_to_ready.as_secs_f64()
        ));
        line(format!(
            "| time to ready / (provision + poll) | {:.2} | ≤ 1.25 {} |",
            self.time_ratio(),
            mark(self.time_ratio() <= 1.25)
        ));
        line(format!(
            "| operator API writes per machine (MicrovmMachine and Event writes) | {:.2} | ≤ 4 {} |",
            self.machine_caused_writes_per_machine(),
            mark(self.machine_caused_writes_per_machine() <= 4.0)
        ));
        line(format!(
            "| of which to MicrovmMachines | {:.2} | |",
            self.machine_writes_per_machine()
        ));
        line(format!(
            "| all operator writes / machines (adds the per-cluster status writes) | {:.3} | |",
            self.writes_per_machine()
        ));
        line(format!(
            "| flintlock calls per machine to ready | {:.2} | |",
            self.flintlock_to_ready.values().sum::<u64>() as f64 / m
        ));
        line(format!(
            "| flintlock calls per minute, steady state | {:.1} ({:.1} per host) | one list per host per poll |",
            self.steady_calls_per_minute(),
            self.steady_calls_per_minute() / a.hosts as f64
        ));
        if let Some((cpu, rss)) = self.operator_usage {
            line(format!("| operator CPU | {cpu:.1} s | |"));
            line(format!(
                "| operator peak RSS | {:.1} MiB | ≤ 64 MiB {} |",
                rss as f64 / 1024.0,
                mark(rss <= 64 * 1024)
            ));
        }
        line(String::new());
        line("Operator API requests until ready, per machine, by verb and resource:\n".into());
        line("| verb | resource | per machine | total |".into());
        line("|---|---|---|---|".into());
        for (verb, resource, n) in self.operator_requests.iter() {
            line(format!(
                "| {verb} | {resource} | {:.3} | {n} |",
                n as f64 / m
            ));
        }
        line(String::new());
        line("Flintlock calls until ready and in the steady state:\n".into());
        line("| method | until ready | per machine | steady, per minute |".into());
        line("|---|---|---|---|".into());
        let methods: std::collections::BTreeSet<&str> = self
            .flintlock_to_ready
            .keys()
            .chain(self.flintlock_steady.keys())
            .copied()
            .collect();
        for method in methods {
            let ready = self.flintlock_to_ready.get(method).copied().unwrap_or(0);
            let steady = self.flintlock_steady.get(method).copied().unwrap_or(0) as f64 * 60.0
                / self.steady.as_secs_f64().max(1.0);
            line(format!(
                "| {method} | {ready} | {:.2} | {steady:.1} |",
                ready as f64 / m
            ));
        }
        let failures = self.failures();
        line(String::new());
        if failures.is_empty() {
            line("All targets met.".into());
        } else {
            line(format!("Targets missed: {}.", failures.join("; ")));
        }
        out
    }
}

fn mark(ok: bool) -> &'static str {
    if ok { "PASS" } else { "FAIL" }
}
