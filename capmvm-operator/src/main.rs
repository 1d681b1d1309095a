//! `capmvm-operator`: the operator binary. Everything but flag parsing lives in the library, so
//! `capmvm-sim` can run the very same code in a process of its own.

use capmvm_operator::config::Flags;
use clap::Parser;

/// mimalloc (feature `mimalloc`, on by default): at 10 000 machines it costs the operator less CPU and a
/// lower peak RSS than glibc's malloc (docs/benchmarks.md, fifth round). The library sets no allocator.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    capmvm_operator::main_with(Flags::parse()).await
}
