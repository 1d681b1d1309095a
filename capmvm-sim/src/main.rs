//! `capmvm-sim`: the simulation kit's command line.

use clap::{Parser, Subcommand};

/// Runs capmvm on one machine with simulated flintlock hosts and an embedded Kubernetes API.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {}
}
