//! `capmvm-operator`: the operator binary. Everything but flag parsing lives in the library, so
//! `capmvm-sim` can run the very same code in a process of its own.

use capmvm_operator::config::Flags;
use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    capmvm_operator::main_with(Flags::parse()).await
}
