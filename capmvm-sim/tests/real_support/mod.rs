//! What the real-stack tests share: the stack's options.

use std::path::PathBuf;
use std::time::Duration;

use capmvm_sim::world::WorldOptions;

/// Three hollow hosts provisioning in 0.5 s, polled every 2 s (every 200 ms while busy).
pub(crate) fn options() -> WorldOptions {
    let mut o = WorldOptions::new(
        3,
        Duration::from_millis(500),
        PathBuf::from(env!("CARGO_BIN_EXE_capmvm-sim")),
    );
    o.operator_flags = vec![
        "--host-poll-interval=2s".into(),
        "--host-poll-interval-busy=200ms".into(),
    ];
    o
}
