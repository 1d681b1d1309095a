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
enum Command {
    /// Serve N hollow flintlock hosts on 127.0.0.1 and print their endpoints, until Ctrl-C.
    Hosts(capmvm_sim::hosts::HostsArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Hosts(args) => capmvm_sim::hosts::main(args)?,
    }
    Ok(())
}
