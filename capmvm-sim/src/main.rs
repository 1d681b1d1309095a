//! `capmvm-sim`: the simulation kit's command line.

use clap::{Parser, Subcommand};

/// mimalloc, as the capmvm-operator binary: the `operator` subcommand then runs with the allocator the
/// operator ships with, and the simulators (many threads allocating and freeing JSON) spend a fraction
/// of what glibc's malloc cost them (docs/benchmarks.md, fifth round).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Runs capmvm on one machine with simulated flintlock hosts and an embedded Kubernetes API.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve N hollow flintlock hosts on 127.0.0.1 and print their endpoints, until Ctrl-C.
    Hosts(capmvm_sim::hosts::HostsArgs),
    /// Serve the embedded Kubernetes API emulator on loopback and write a kubeconfig, until Ctrl-C / SIGTERM.
    Kube(capmvm_sim::kube::KubeArgs),
    /// The main job: a cluster of 1 control plane and 3 workers created and deleted on simulators.
    Demo(capmvm_sim::demo::DemoArgs),
    /// The real cluster-autoscaler drives microVM pools on the real stack: scale from zero on a
    /// MachineDeployment and a MachinePool, max size, scale down by Node, a failed scale-up. Exits 0
    /// only if every scenario held.
    Autoscale(capmvm_sim::autoscale::AutoscaleArgs),
    /// Measure a large cluster: time to ready, API and flintlock calls per machine, operator CPU and memory.
    Bench(capmvm_sim::bench::BenchArgs),
    /// The whole system under API faults, host partitions and operator kills: exits non-zero if a
    /// microVM is duplicated or leaked, a finalizer goes early, or a step does not converge.
    Soak(capmvm_sim::soak::SoakArgs),
    /// The operator's watches alone, no controller behind them (`bench --watch-floor` runs it
    /// beside the operator): what receiving the server's changes costs.
    WatchFloor(capmvm_sim::watch_floor::WatchFloorArgs),
    /// Run the capmvm operator (the same code as the capmvm-operator binary).
    Operator(Box<capmvm_operator::config::Flags>),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Hosts(args) => capmvm_sim::hosts::main(args)?,
        Command::Kube(args) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(capmvm_sim::kube::run(args))?,
        Command::Demo(args) => capmvm_sim::demo::main(args)?,
        Command::Autoscale(args) => capmvm_sim::autoscale::main(args)?,
        Command::Bench(args) => capmvm_sim::bench::main(args)?,
        Command::Soak(args) => capmvm_sim::soak::main(args)?,
        Command::WatchFloor(args) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(capmvm_sim::watch_floor::run(args))?,
        Command::Operator(flags) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(capmvm_operator::main_with(*flags))?,
    }
    Ok(())
}
