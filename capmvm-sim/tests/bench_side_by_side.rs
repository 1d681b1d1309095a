//! `capmvm-sim bench --control-plane real --provider go|capmvm` at CI size: 100 machines over 20
//! hollow hosts (provision 5 s, host poll 10 s), the Go provider v0.10.1 itself and ours, each on
//! a real stack of its own with the same settings. Both runs bring every machine to Ready and
//! print the same table rows; the figures are printed, not judged (docs/benchmarks.md holds the
//! measured ones).
//!
//! Needs the upstream binaries (`hack/upstream.sh build`): under CI a missing one fails the test,
//! locally the test is reported as skipped.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use capmvm_sim::bench::{self, BenchArgs};
use capmvm_sim::bench_provider::BenchProvider;
use capmvm_sim::demo::ControlPlane;
use capmvm_sim::real::{BINARIES, go_provider};
use capmvm_upstream::Binaries;

fn args(provider: BenchProvider) -> BenchArgs {
    BenchArgs {
        hosts: 20,
        machines: 100,
        provision_ms: 5000,
        poll_secs: 10,
        steady_secs: 20,
        timeout_secs: 600,
        pool: false,
        control_plane: ControlPlane::Real,
        provider,
        without_managed_fields: false,
        v1alpha1_unserved: false,
        host_auth: capmvm_sim::bench::BenchHostAuth::None,
        watch_floor: None,
    }
}

/// The first column of the report's first table: the row names.
fn row_names(report: &str) -> Vec<String> {
    report
        .lines()
        .skip_while(|l| !l.starts_with("| measure |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| l.split('|').nth(1).map(|c| c.trim().to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_go_provider_and_ours_bring_100_machines_to_ready_and_report_the_same_rows() {
    let needs: Vec<&str> = BINARIES
        .iter()
        .copied()
        .chain([go_provider::BINARY])
        .collect();
    if Binaries::for_test("bench_side_by_side", &needs).is_none() {
        return;
    }
    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_capmvm-sim"));
    let go = bench::run_with(args(BenchProvider::Go), exe.clone())
        .await
        .expect("the Go provider brings every machine to Ready");
    let go_report = go.render();
    println!("{go_report}");
    let ours = bench::run_with(args(BenchProvider::Capmvm), exe)
        .await
        .expect("ours brings every machine to Ready");
    let our_report = ours.render();
    println!("{our_report}");
    assert!(go_report.starts_with("### the Go provider"), "{go_report}");
    assert!(our_report.starts_with("### capmvm"), "{our_report}");
    let rows = row_names(&our_report);
    assert!(rows.contains(&"time to all ready".to_string()), "{rows:?}");
    assert!(rows.contains(&"operator peak RSS".to_string()), "{rows:?}");
    assert_eq!(row_names(&go_report), rows);
    // Each counted its own provider's requests: both made API writes, both called the hosts.
    for report in [&go, &ours] {
        assert!(report.operator_requests.writes() > 0, "{report:?}");
        assert!(report.flintlock_to_ready.values().sum::<u64>() >= 100);
        assert!(report.operator_usage.is_some());
    }
}
