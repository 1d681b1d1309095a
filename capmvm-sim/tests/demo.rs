//! `capmvm-sim demo` as a user runs it: exits 0 after every step, with the MachinePool's steps
//! (scaled up, down, rolled) visible in the table it prints.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

#[test]
fn the_demo_scales_and_rolls_its_machine_pool_and_cleans_up() {
    let stdout = the_demo_succeeds(&[]);
    assert!(
        !stdout.contains("RBAC refused"),
        "the emulator has no RBAC:\n{stdout}"
    );
}

/// The same story on the real stack: etcd, kube-apiserver, Cluster API's own managers, the real
/// clusterctl and kubectl (`hack/upstream.sh build`; skipped locally without them, a failure in CI).
#[test]
fn the_demo_on_the_real_stack_does_the_same() {
    if capmvm_upstream::Binaries::for_test(
        "the_demo_on_the_real_stack_does_the_same",
        capmvm_sim::real::BINARIES,
    )
    .is_none()
    {
        return;
    }
    let stdout = the_demo_succeeds(&["--control-plane", "real"]);
    // The demo read the API server's audit log: the operator's ServiceAccount made requests and
    // RBAC refused none (it exits non-zero, naming them, if it did).
    let requests: u64 = stdout
        .lines()
        .find_map(|l| {
            l.strip_prefix("RBAC refused none of the operator's ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no RBAC line:\n{stdout}"));
    assert!(
        requests >= 10,
        "{requests} requests of the operator audited"
    );
}

fn the_demo_succeeds(extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_capmvm-sim"))
        .args(["demo", "--provision-ms", "500", "--timeout-secs", "180"])
        .args(extra)
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
    stdout.into_owned()
}
