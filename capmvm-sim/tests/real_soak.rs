//! The real-stack soak in a size that fits CI: `capmvm-sim soak --control-plane real` with a
//! fixed seed and no minutes beyond one fault of each kind. Two workload clusters on the real
//! management stack (etcd, kube-apiserver, CAPI v1.14's own managers, the operator as its
//! ServiceAccount); each fault lands while a MachineDeployment or MachinePool scales: etcd,
//! kube-apiserver, CAPI's core and bootstrap managers and the operator SIGKILLed and restarted, a
//! flintlock host restarted, a host cut off behind a loopback link. After each, every Machine is
//! Ready with its Node again; at the end no microVM was created twice or leaked, no finalizer
//! went before its microVM, RBAC refused nothing, and deleting the clusters empties the hosts.
//! The 60-minute run is in docs/reliability.md.
//!
//! Needs the upstream binaries (`hack/upstream.sh build`): under CI a missing one fails the test,
//! locally the test is reported as skipped.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use capmvm_sim::real::BINARIES;
use capmvm_sim::soak::real::{RealSoakArgs, run};
use capmvm_sim::soak::real_faults::Fault;
use capmvm_upstream::Binaries;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_lost_when_the_real_control_plane_and_hosts_fail() {
    if Binaries::for_test(
        "nothing_is_lost_when_the_real_control_plane_and_hosts_fail",
        BINARIES,
    )
    .is_none()
    {
        return;
    }
    let args = RealSoakArgs {
        minutes: 0.0,
        seed: 7,
        hosts: 3,
        step_timeout_secs: 240,
    };
    let report = run(args, PathBuf::from(env!("CARGO_BIN_EXE_capmvm-sim")))
        .await
        .expect("the soak runs");
    println!("{}", report.render());
    assert!(report.failures().is_empty(), "{}", report.render());
    for kind in Fault::ALL {
        assert!(
            report.faults.iter().any(|f| f.fault == kind),
            "no {kind}: {}",
            report.render()
        );
    }
    // Both kinds of group were scaled under faults.
    for group in ["-md-0", "-mp-0"] {
        assert!(
            report.scales.iter().any(|(_, s)| s.contains(group)),
            "no scale of a {group} group: {}",
            report.render()
        );
    }
}
