//! `capmvm-sim bench` on the embedded stack, small: the report a user reads, with the hosts
//! demanding mTLS and a token (`--host-auth mtls`), as production hosts do, and the operator's
//! watches measured alone beside it (`--watch-floor`).

use capmvm_sim::bench::{BenchArgs, BenchHostAuth, run_with};
use capmvm_sim::bench_provider::BenchProvider;
use capmvm_sim::demo::ControlPlane;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_bench_on_mtls_hosts_brings_every_machine_to_ready() {
    let args = BenchArgs {
        hosts: 3,
        machines: 6,
        provision_ms: 200,
        poll_secs: 1,
        steady_secs: 2,
        timeout_secs: 120,
        pool: false,
        control_plane: ControlPlane::Embedded,
        provider: BenchProvider::Capmvm,
        without_managed_fields: false,
        v1alpha1_unserved: false,
        host_auth: BenchHostAuth::Mtls,
        watch_floor: Some(capmvm_sim::bench::WatchFloor::Watches),
    };
    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_capmvm-sim"));
    // Hosts that refuse the operator's credentials never let a machine become ready: the run
    // would time out instead of reporting.
    let report = run_with(args, exe).await.expect("the bench runs");
    assert_eq!(report.unfinished, None);
    let creates = report
        .flintlock_to_ready
        .get(capmvm_flintlock::Method::Create.as_str())
        .copied();
    assert_eq!(
        creates,
        Some(6),
        "one create per machine: {:?}",
        report.flintlock_to_ready
    );
    // The watches alone saw every machine: each was woken at least once, and they used CPU.
    let floor = report
        .watch_floor
        .as_ref()
        .expect("--watch-floor reports its figures");
    assert!(
        floor.counts.wakes.0 >= 6,
        "machine wake-ups: {:?}",
        floor.counts.wakes
    );
    // The operator's own counts: every MicrovmMachine created was an event and got a reconcile.
    let counts = report
        .operator_counts
        .as_ref()
        .expect("the operator's metrics were read");
    assert!(counts.machine_reconciles >= 6, "{counts:?}");
    assert!(
        counts
            .watch_events
            .get("MicrovmMachine")
            .is_some_and(|n| *n >= 6),
        "{counts:?}"
    );
    let rendered = report.render();
    assert!(
        rendered.contains("the operator's watches alone"),
        "{rendered}"
    );
    assert!(
        rendered.contains("watch events the operator received per machine"),
        "{rendered}"
    );
    assert!(
        rendered.contains("6 machines on 3 hosts, hosts with mTLS and a token"),
        "{rendered}"
    );
}
