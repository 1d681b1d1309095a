//! `capmvm-sim demo` as a user runs it: exits 0 after every step, with the MachinePool's steps
//! (scaled up, down, rolled) visible in the table it prints.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

#[test]
fn the_demo_scales_and_rolls_its_machine_pool_and_cleans_up() {
    let out = Command::new(env!("CARGO_BIN_EXE_capmvm-sim"))
        .args(["demo", "--provision-ms", "500", "--timeout-secs", "120"])
        .output()
        .expect("the demo runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in [
        "POOL",
        "mp/demo-mp-0",
        "md/demo-md-0",
        "control-plane",
        "all 6 machines ready",
        "the pool has 4 ready instances",
        "the pool has 2 ready instances",
        "3072Mi",
        "every instance of the pool runs the new template",
        "every microVM are gone",
    ] {
        assert!(stdout.contains(expected), "{expected:?} missing:\n{stdout}");
    }
}
