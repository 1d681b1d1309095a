//! `capmvm-sim bench --hosts H --machines M [--provision-ms MS]`: one cluster of M workers on H hollow
//! hosts, created through the CAPI stand-in and the operator (its own process), measured:
//!
//! - time to all ready, divided by (provision time + host poll interval);
//! - the operator's API writes and reads per machine, by verb, until ready;
//! - flintlock calls per machine until ready, and per minute in steady state;
//! - the operator's CPU seconds and peak RSS, and the simulators' CPU seconds (the bench process:
//!   emulator, CAPI stand-in, hollow hosts and kubelets), each per machine.
//!
//! Each target of docs/benchmarks.md is checked and reported as PASS or FAIL.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt as _;
use kube::Api;
use kube::api::DynamicObject;
use kube::runtime::{WatchStreamExt as _, reflector, watcher};

use crate::bench_provider::BenchProvider;
use crate::real::RealStack;
use crate::stack::{RequestCounts, Stack};
use crate::watch_floor::FloorProcess;
use crate::world::{HostAuth, World, WorldOptions};

mod report;
pub(crate) use report::{mark, verdict};

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
    /// What serves the management cluster: `embedded` (the API emulator and the CAPI stand-in) or
    /// `real` (etcd, kube-apiserver and Cluster API's own managers; `hack/upstream.sh build`). On
    /// the real stack the cluster first gets its control plane (real CABPK joins workers only to an
    /// initialised one), then the clock starts as its MachineDeployment is scaled to `--machines`.
    #[arg(long, value_enum, default_value_t = crate::demo::ControlPlane::Embedded)]
    pub control_plane: crate::demo::ControlPlane,
    /// The infrastructure provider measured: `capmvm` (ours) or `go` (the Go provider v0.10.1
    /// itself, on `--control-plane real` only; its row names are the same, "operator" meaning its
    /// manager).
    #[arg(long, value_enum, default_value_t = BenchProvider::Capmvm)]
    pub provider: BenchProvider,
    /// A departure from real servers, for comparison with runs before issue 37: the embedded
    /// emulator leaves `metadata.managedFields` out of what it sends. Every real kube-apiserver
    /// sends them, and every watcher decodes them with every change.
    #[arg(long)]
    pub without_managed_fields: bool,
    /// On the real stack, stop serving `v1alpha1` once our components are installed, as a user
    /// can where nothing reads or writes it: the API server then keeps no watch cache at
    /// `v1alpha1` and stops sending the conversion review it otherwise sends per write
    /// (kubernetes/kubernetes#129979).
    #[arg(long)]
    pub v1alpha1_unserved: bool,
    /// How the hosts authenticate the operator: `none` (plaintext), `token` (a basic-auth token)
    /// or `mtls` (TLS with client certificates, and a token), with the MicrovmCluster's Secrets
    /// as a user writes them.
    #[arg(long, value_enum, default_value_t = BenchHostAuth::None)]
    pub host_auth: BenchHostAuth,
    /// Also run the operator's watches alone beside the operator, with its identity, and report
    /// their CPU until ready: what receiving the server's changes costs, the floor under the
    /// operator's own figure (the floor's CPU also competes for the machine's cores). `watches`
    /// (`--watch-floor` alone): the operator's own watch layer, caches and mappers, no controller
    /// behind them; `bare`: the same collections' watches read as text, nothing decoded, with
    /// their events and bytes.
    #[arg(long, value_enum, num_args = 0..=1, default_missing_value = "watches")]
    pub watch_floor: Option<WatchFloor>,
}

/// `bench --watch-floor`: what runs beside the operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WatchFloor {
    /// The operator's watch layer alone (`capmvm-sim watch-floor`).
    Watches,
    /// The watches read as text (`capmvm-sim watch-floor --bare`).
    Bare,
}

/// `bench --host-auth`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchHostAuth {
    /// Plaintext, no token.
    #[default]
    None,
    /// A basic-auth token over plaintext.
    Token,
    /// mTLS and a basic-auth token.
    Mtls,
}

impl BenchHostAuth {
    /// The hosts' side of it (the token is the bench's own).
    fn host_auth(self) -> HostAuth {
        const TOKEN: &str = "bench-token";
        match self {
            BenchHostAuth::None => HostAuth::None,
            BenchHostAuth::Token => HostAuth::Token(TOKEN.to_string()),
            BenchHostAuth::Mtls => HostAuth::MtlsAndToken(TOKEN.to_string()),
        }
    }

    /// How the report's title names it (nothing for plaintext).
    pub(crate) fn describe(self) -> &'static str {
        match self {
            BenchHostAuth::None => "",
            BenchHostAuth::Token => ", hosts with a basic-auth token",
            BenchHostAuth::Mtls => ", hosts with mTLS and a token",
        }
    }
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// The options.
    pub args: BenchArgs,
    /// Time from applying the cluster to every machine ready.
    pub time_to_ready: Duration,
    /// `(ready, expected)` when the Go provider had not brought every machine to Ready by
    /// `--timeout-secs`: its progress then is the figure (the other measures run to that time).
    pub unfinished: Option<(usize, usize)>,
    /// The operator's requests until ready.
    pub operator_requests: RequestCounts,
    /// Every client's API requests (operator, CAPI or its stand-in, hollow kubelets) until ready:
    /// what the management API served (the emulator's counters, or the real server's audit log).
    pub all_requests: RequestCounts,
    /// Flintlock calls until ready, by method.
    pub flintlock_to_ready: BTreeMap<&'static str, u64>,
    /// Flintlock calls during the steady-state window, by method.
    pub flintlock_steady: BTreeMap<&'static str, u64>,
    /// Length of the steady-state window.
    pub steady: Duration,
    /// The operator's CPU seconds and peak RSS (KiB) at the end.
    pub operator_usage: Option<(f64, u64)>,
    /// The operator's CPU seconds from the clock's start to every machine ready: what the machines
    /// cost it, without its start, the control plane's wait on the real stack and the steady window.
    pub operator_cpu_to_ready: Option<f64>,
    /// The operator's CPU seconds over the steady-state window (from the Nodes' registration, all
    /// machines ready): its polls and watches, and what CAPI still writes then; counted in the
    /// kernel's 10 ms ticks, so a short window of an idle operator is coarse.
    pub operator_cpu_steady: Option<f64>,
    /// The bench process's own CPU seconds over the same run (its children excluded): the
    /// simulators the operator talks to (emulator, CAPI stand-in, hollow hosts, hollow kubelets;
    /// on the real stack the hollow hosts and kubelets and the KubeadmControlPlane stand-in).
    pub simulators_cpu: Option<f64>,
    /// On the real stack, the upstream processes' CPU seconds (etcd, kube-apiservers,
    /// kube-controller-manager, CAPI's managers) over the whole run.
    pub upstream_cpu: Option<f64>,
    /// On the real stack, the conversion reviews the API server sent for our CRDs from the clock's
    /// start to the end of the steady window, by `<crd> to <version>`.
    pub conversion_reviews: Option<BTreeMap<String, u64>>,
    /// On the real stack, the API server's 429 answers (priority and fairness) until ready, of all
    /// clients and of the operator.
    pub throttled: Option<(u64, u64)>,
    /// With `--watch-floor`: the watches alone, their CPU seconds from the clock's start to every
    /// machine ready, and the wake-ups their mappers sent meanwhile (machine, cluster, pool).
    pub watch_floor: Option<FloorFigures>,
    /// From our operator's metrics, clock start to every machine ready: the watch events it
    /// received by kind, and the MicrovmMachine reconciles it ran.
    pub operator_counts: Option<OperatorCounts>,
}

/// What our operator's `/metrics` counted from the clock's start to every machine ready.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OperatorCounts {
    /// Watch events received, by kind (`capmvm_watch_events_total`).
    pub watch_events: BTreeMap<String, u64>,
    /// MicrovmMachine reconciles, every result (`controller_runtime_reconcile_total`).
    pub machine_reconciles: u64,
}

impl OperatorCounts {
    /// The counts in the operator's metrics text (lines it does not know are skipped).
    pub fn parse(metrics: &str) -> OperatorCounts {
        let mut counts = OperatorCounts::default();
        for line in metrics.lines() {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let value = value as u64;
            if let Some(kind) = series
                .strip_prefix("capmvm_watch_events_total{kind=\"")
                .and_then(|r| r.strip_suffix("\"}"))
            {
                counts.watch_events.insert(kind.to_string(), value);
            } else if series.starts_with("controller_runtime_reconcile_total{")
                && series.contains("controller=\"microvmmachine\"")
            {
                counts.machine_reconciles += value;
            }
        }
        counts
    }

    /// The counts from `before` to `self`.
    fn since(&self, before: &OperatorCounts) -> OperatorCounts {
        OperatorCounts {
            watch_events: self
                .watch_events
                .iter()
                .map(|(k, n)| {
                    let was = before.watch_events.get(k).copied().unwrap_or(0);
                    (k.clone(), n.saturating_sub(was))
                })
                .collect(),
            machine_reconciles: self
                .machine_reconciles
                .saturating_sub(before.machine_reconciles),
        }
    }
}

/// Our operator's counts now, if it serves its metrics.
async fn operator_counts<S: Stack>(stack: &S) -> Option<OperatorCounts> {
    let addr = stack.operator_metrics()?;
    let text = crate::world::http_get(addr, "/metrics").await.ok()?;
    Some(OperatorCounts::parse(&text))
}

/// What `--watch-floor` measured from the clock's start to every machine ready.
#[derive(Debug, Clone)]
pub struct FloorFigures {
    /// Which floor.
    pub kind: WatchFloor,
    /// Its CPU seconds.
    pub cpu: f64,
    /// What it counted.
    pub counts: crate::watch_floor::Counts,
}

/// Runs the benchmark and prints its report.
pub fn main(args: BenchArgs) -> anyhow::Result<()> {
    if args.host_auth != BenchHostAuth::None && args.pool {
        bail!("--host-auth is not wired into --pool: run the pool bench on plaintext hosts");
    }
    if args.watch_floor.is_some() && args.pool {
        bail!("--watch-floor is not wired into --pool");
    }
    if args.pool {
        return crate::bench_pool::main(args);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let report = runtime.block_on(run(args))?;
    print!("{}", report.render());
    // Our targets are ours: the Go provider's misses are its figures, not a failed run.
    if report.failures().is_empty() || report.args.provider == BenchProvider::Go {
        Ok(())
    } else {
        bail!("targets missed: {}", report.failures().join("; "))
    }
}

/// The world both benchmarks run in: the operator polling as `args` say (1 s while busy), and an
/// emulator with room for a large cluster's changes.
pub(crate) fn world_options(args: &BenchArgs, exe: std::path::PathBuf) -> WorldOptions {
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
    // The emulator sends the managedFields entries every write records, as every real server does
    // (every watcher decodes them with every change); `--without-managed-fields` leaves them out,
    // a departure from real servers kept to compare with the runs before issue 37.
    options.emulator = options
        .emulator
        .history_limit(50_000)
        .watch_buffer(20_000)
        .managed_fields(!args.without_managed_fields);
    options.auth = args.host_auth.host_auth();
    options.keep_dir = std::env::var("CAPMVM_BENCH_LOG").is_ok();
    // CAPMVM_BENCH_OPERATOR_WRAPPER=heaptrack (or `perf record ...`) runs the operator under a
    // profiler: the wrapper is given the operator's command line.
    if let Ok(wrapper) = std::env::var("CAPMVM_BENCH_OPERATOR_WRAPPER") {
        let mut words = wrapper.split_whitespace().map(String::from);
        if let Some(program) = words.next() {
            let (exe, prefix) = options.operator_command.clone();
            let mut args: Vec<String> = words.collect();
            args.push(exe.display().to_string());
            args.extend(prefix);
            options.operator_command = (program.into(), args);
        }
    }
    options
}

/// Runs one measurement.
pub async fn run(args: BenchArgs) -> anyhow::Result<Report> {
    let exe = std::env::current_exe().context("finding the capmvm-sim executable")?;
    run_with(args, exe).await
}

/// Runs one measurement with `exe` as the capmvm-sim executable that runs the operator (a test's
/// `CARGO_BIN_EXE_capmvm-sim`).
pub async fn run_with(args: BenchArgs, exe: std::path::PathBuf) -> anyhow::Result<Report> {
    if args.watch_floor.is_some() && args.provider == BenchProvider::Go {
        bail!("--watch-floor runs our operator's watches: it is for --provider capmvm");
    }
    if args.host_auth != BenchHostAuth::None && args.provider == BenchProvider::Go {
        bail!("--host-auth is for our provider: the Go provider's credentials are not wired here");
    }
    let options = world_options(&args, exe.clone());
    let own_cpu_before = own_cpu();
    match args.control_plane {
        crate::demo::ControlPlane::Embedded if args.provider == BenchProvider::Go => {
            bail!(
                "--provider go needs --control-plane real: the Go provider is a Go program that runs only against a real kube-apiserver"
            )
        }
        crate::demo::ControlPlane::Embedded => {
            let mut world = World::start(options).await?;
            world.start_operator(&[])?;
            let floor = args
                .watch_floor
                .map(|kind| {
                    FloorProcess::spawn(
                        &exe,
                        &world.kubeconfig,
                        &world.dir,
                        kind == WatchFloor::Bare,
                    )
                })
                .transpose()?;
            let result = measure(&world, &args, Start::Apply, floor.as_ref()).await;
            eprintln!("operator log: {}", world.operator_log().display());
            world.shutdown().await;
            result.map(|report| with_own_cpu(report, own_cpu_before))
        }
        crate::demo::ControlPlane::Real => {
            let mut real = match args.provider {
                BenchProvider::Capmvm => RealStack::start(options).await?,
                BenchProvider::Go => {
                    let mut real = RealStack::start_without_components(options).await?;
                    real.install_go_provider(&[]).await?;
                    real
                }
            };
            if args.v1alpha1_unserved {
                crate::real::components::serve_v1alpha1(&real.kubectl, false).await?;
            }
            let vip = real.prepare_cluster("default", "demo").await?;
            if args.provider == BenchProvider::Capmvm {
                real.start_operator(&[])?;
            }
            let floor = args
                .watch_floor
                .map(|kind| {
                    FloorProcess::spawn(
                        &exe,
                        &real.operator_kubeconfig,
                        &real.dir,
                        kind == WatchFloor::Bare,
                    )
                })
                .transpose()?;
            let reviews_before = crate::real::components::conversion_reviews(&real.kubectl).await;
            let result = measure(
                &real,
                &args,
                Start::ScaleAfterControlPlane(vip),
                floor.as_ref(),
            )
            .await;
            let reviews_after = crate::real::components::conversion_reviews(&real.kubectl).await;
            let reviews = match (reviews_before, reviews_after) {
                (Ok(before), Ok(after)) => Some(
                    after
                        .into_iter()
                        .map(|(k, n)| {
                            let was = before.get(&k).copied().unwrap_or(0);
                            (k, n.saturating_sub(was))
                        })
                        .collect(),
                ),
                (Err(e), _) | (_, Err(e)) => {
                    eprintln!("bench: the conversion reviews are not reported: {e:#}");
                    None
                }
            };
            let upstream_cpu: f64 = real
                .upstream_pids()
                .into_iter()
                .filter_map(|pid| crate::world::process_usage(pid).map(|(cpu, _)| cpu))
                .sum();
            match real.go_provider() {
                Some(go) => eprintln!("Go provider log: {}", go.log().display()),
                None => eprintln!("operator log: {}", real.operator_log().display()),
            }
            if result.is_err() {
                real.keep_dir();
                eprintln!("logs kept in {}", real.dir.display());
            }
            real.shutdown().await;
            result.map(|mut report| {
                report.upstream_cpu = Some(upstream_cpu);
                report.conversion_reviews = reviews;
                with_own_cpu(report, own_cpu_before)
            })
        }
    }
}

fn with_own_cpu(mut report: Report, before: Option<f64>) -> Report {
    report.simulators_cpu = own_cpu().zip(before).map(|(after, before)| after - before);
    report
}

/// How the measured machines come to be.
enum Start {
    /// The template applied with the machines as workers and no control plane (the stand-in
    /// allows it), the clock started at the apply.
    Apply,
    /// The template applied with one control-plane machine (its workload API at this address)
    /// and no workers; once the control plane is ready the clock starts and the MachineDeployment
    /// is scaled to the machines.
    ScaleAfterControlPlane(std::net::Ipv4Addr),
}

async fn measure<S: Stack + Sync>(
    stack: &S,
    args: &BenchArgs,
    start: Start,
    floor: Option<&FloorProcess>,
) -> anyhow::Result<Report> {
    eprintln!(
        "bench: {}: {} machines on {} hosts, provisioning {} ms, host poll {} s",
        args.provider.describe(),
        args.machines,
        args.hosts,
        args.provision_ms,
        args.poll_secs
    );
    let provider = args.provider;
    // Let the operator start and settle before the clock starts.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let resource = provider.machines();
    let machines: Api<DynamicObject> =
        Api::namespaced_with(stack.client().clone(), "default", &resource);
    // A watch cache, not a list every half second: listing 10 000 objects twice a second made the
    // bench itself a noticeable share of the simulators' CPU.
    let writer = reflector::store::Writer::<DynamicObject>::new(resource.clone());
    let cache = writer.as_reader();
    let watch = tokio::spawn(
        watcher(machines, watcher::Config::default())
            .reflect(writer)
            .for_each(|_| futures::future::ready(())),
    );
    let ready_count = || {
        cache
            .state()
            .iter()
            .filter(|m| provider.is_ready(m))
            .count()
    };
    let credentials = crate::stack::create_credentials(stack, "default", "demo").await?;
    let mut expected = args.machines;
    let (api_before, all_before, started) = match start {
        Start::Apply => {
            let (api_before, all_before) = (stack.operator_requests()?, stack.api_requests()?);
            for h in stack.hosts() {
                h.control().reset_counters();
            }
            let started = Instant::now();
            crate::stack::apply_template(
                stack,
                crate::world::DEMO_CLUSTER,
                &[
                    ("CONTROL_PLANE_MACHINE_COUNT", "0".to_string()),
                    ("WORKER_MACHINE_COUNT", args.machines.to_string()),
                ],
                |objects| crate::stack::use_credentials(objects, &credentials),
            )
            .await?;
            (api_before, all_before, started)
        }
        Start::ScaleAfterControlPlane(vip) => {
            let mut rewritten = Ok(());
            crate::stack::apply_template(
                stack,
                crate::world::DEMO_CLUSTER,
                &[
                    ("CONTROL_PLANE_VIP", vip.to_string()),
                    ("CONTROL_PLANE_MACHINE_COUNT", "1".to_string()),
                    ("WORKER_MACHINE_COUNT", "0".to_string()),
                ],
                |objects| {
                    crate::stack::use_credentials(objects, &credentials);
                    rewritten = provider.rewrite(objects);
                },
            )
            .await?;
            rewritten?;
            let deadline = Instant::now() + Duration::from_secs(args.timeout_secs);
            while ready_count() < 1 {
                if Instant::now() > deadline {
                    watch.abort();
                    bail!(
                        "the control plane was not ready after {}s",
                        args.timeout_secs
                    );
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            eprintln!(
                "bench: control plane ready; scaling the MachineDeployment to {}",
                args.machines
            );
            expected += 1;
            let (api_before, all_before) = (stack.operator_requests()?, stack.api_requests()?);
            for h in stack.hosts() {
                h.control().reset_counters();
            }
            let started = Instant::now();
            stack
                .scale(
                    &machine_deployment_resource(),
                    "default",
                    "demo-md-0",
                    args.machines,
                )
                .await?;
            (api_before, all_before, started)
        }
    };
    let throttled_before = stack.throttled()?;
    let operator_cpu = || {
        stack
            .operator_pid()
            .and_then(crate::world::process_usage)
            .map(|(cpu, _)| cpu)
    };
    let operator_cpu_at_start = operator_cpu();
    let counts_at_start = operator_counts(stack).await;
    let floor_at_start = floor.map(|f| floor_figures(f, args));
    let deadline = started + Duration::from_secs(args.timeout_secs);
    let mut unfinished = None;
    loop {
        let ready = ready_count();
        progress(ready, expected, started.elapsed());
        if ready == expected {
            break;
        }
        if Instant::now() > deadline && provider == BenchProvider::Go {
            unfinished = Some((ready, expected));
            break;
        }
        if Instant::now() > deadline {
            watch.abort();
            eprintln!();
            bail!(
                "only {ready} of {expected} machines ready after {}s",
                args.timeout_secs
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let time_to_ready = started.elapsed();
    let operator_cpu_to_ready = operator_cpu()
        .zip(operator_cpu_at_start)
        .map(|(now, before)| now - before);
    let watch_floor = floor
        .map(|f| floor_figures(f, args))
        .zip(floor_at_start)
        .and_then(|(now, before)| Some(now?.since(&before?)));
    let operator_counts = operator_counts(stack)
        .await
        .zip(counts_at_start)
        .map(|(now, before)| now.since(&before));
    if floor.is_some() && watch_floor.is_none() {
        eprintln!(
            "bench: the watch floor's figures are missing (it exited or wrote no counts); see watch-floor.log in the run's directory"
        );
    }
    watch.abort();
    eprintln!();
    let operator_requests = stack.operator_requests()?.since(&api_before);
    let all_requests = stack.api_requests()?.since(&all_before);
    let throttled = stack
        .throttled()?
        .zip(throttled_before)
        .map(|((all, op), (all0, op0))| (all.saturating_sub(all0), op.saturating_sub(op0)));
    let flintlock_to_ready = crate::stack::flintlock_calls(stack.hosts());
    // Issue 13: the hollow kubelets keep up (their Nodes are not part of the targets).
    let at_ready = stack.kubelets().registered().len();
    while stack.kubelets().registered().len() < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "hollow kubelets: {at_ready} Nodes registered when all machines were ready, {} after {:.1} s",
        stack.kubelets().registered().len(),
        started.elapsed().as_secs_f64()
    );

    eprintln!(
        "steady state: measuring flintlock calls for {} s",
        args.steady_secs
    );
    for h in stack.hosts() {
        h.control().reset_counters();
    }
    let steady_started = Instant::now();
    let operator_cpu_at_steady = operator_cpu();
    tokio::time::sleep(Duration::from_secs(args.steady_secs)).await;
    let flintlock_steady = crate::stack::flintlock_calls(stack.hosts());
    let operator_cpu_steady = operator_cpu()
        .zip(operator_cpu_at_steady)
        .map(|(now, before)| now - before);
    Ok(Report {
        args: args.clone(),
        time_to_ready,
        unfinished,
        operator_requests,
        all_requests,
        flintlock_to_ready,
        flintlock_steady,
        steady: steady_started.elapsed(),
        operator_usage: stack.operator_pid().and_then(crate::world::process_usage),
        operator_cpu_to_ready,
        operator_cpu_steady,
        simulators_cpu: None,
        upstream_cpu: None,
        conversion_reviews: None,
        throttled,
        watch_floor,
        operator_counts,
    })
}

/// The watch floor's CPU and counts so far; `None` once it has exited or before its first count.
fn floor_figures(floor: &FloorProcess, args: &BenchArgs) -> Option<FloorFigures> {
    let (cpu, _) = floor.pid().and_then(crate::world::process_usage)?;
    Some(FloorFigures {
        kind: args.watch_floor?,
        cpu,
        counts: floor.counts()?,
    })
}

impl FloorFigures {
    /// The figures from `before` to `self`.
    fn since(&self, before: &FloorFigures) -> FloorFigures {
        FloorFigures {
            kind: self.kind,
            cpu: self.cpu - before.cpu,
            counts: self.counts.since(&before.counts),
        }
    }
}

/// `MachineDeployment` (cluster.x-k8s.io/v1beta2) as a dynamic resource.
fn machine_deployment_resource() -> kube::api::ApiResource {
    kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "MachineDeployment"),
        "machinedeployments",
    )
}

/// This process's own CPU seconds (its children excluded).
fn own_cpu() -> Option<f64> {
    crate::world::process_usage(std::process::id()).map(|(cpu, _)| cpu)
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

#[cfg(test)]
mod tests {
    use super::OperatorCounts;

    #[test]
    fn the_operators_counts_are_read_from_its_metrics() {
        let text = "# HELP capmvm_watch_events Watch events received\n\
            capmvm_watch_events_total{kind=\"Machine\"} 15\n\
            capmvm_watch_events_total{kind=\"MicrovmMachine\"} 7\n\
            controller_runtime_reconcile_total{controller=\"microvmmachine\",result=\"success\"} 5\n\
            controller_runtime_reconcile_total{controller=\"microvmmachine\",result=\"error\"} 1\n\
            controller_runtime_reconcile_total{controller=\"microvmcluster\",result=\"success\"} 9\n\
            # EOF\n";
        let counts = OperatorCounts::parse(text);
        assert_eq!(counts.machine_reconciles, 6);
        assert_eq!(counts.watch_events.get("Machine"), Some(&15));
        let before = OperatorCounts::parse("capmvm_watch_events_total{kind=\"Machine\"} 5\n");
        assert_eq!(counts.since(&before).watch_events.get("Machine"), Some(&10));
        assert_eq!(counts.since(&before).machine_reconciles, 6);
    }
}
