//! `capmvm-sim bench --pool` at CI size: every step converges (exact size, all ready, the roll to
//! the new template) and the report names each step with its budget and counts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capmvm_sim::bench::BenchArgs;
use capmvm_sim::bench_pool::{PoolPlan, WRITES_PER_CREATED_TARGET};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_pool_scales_rolls_and_is_reported() {
    let args = BenchArgs {
        hosts: 3,
        machines: 1,
        provision_ms: 500,
        poll_secs: 2,
        steady_secs: 0,
        timeout_secs: 120,
        pool: true,
        control_plane: capmvm_sim::demo::ControlPlane::Embedded,
        provider: capmvm_sim::bench_provider::BenchProvider::Capmvm,
        without_managed_fields: false,
        v1alpha1_unserved: false,
        host_auth: capmvm_sim::bench::BenchHostAuth::None,
        watch_floor: None,
    };
    let plan = PoolPlan {
        peak: 6,
        low: 2,
        max_surge: 2,
    };
    let report = run_with_sim(args, plan).await;
    let names: Vec<&str> = report.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "scale 0 -> 6",
            "scale 6 -> 2",
            "scale 2 -> 6",
            "roll 6 (maxSurge 2)"
        ]
    );
    assert_eq!(report.steps[0].created, 6);
    assert_eq!(report.steps[1].deleted, 4);
    // The roll's ideal: 6/2 waves of (provision + poll).
    assert_eq!(report.steps[3].budget.as_millis(), 3 * 2500);
    // The writes-per-instance bound of the scale-ups. Each instance created costs its create, two
    // patches (host record, providerID) and one status write; the step adds one Event. At this
    // size that Event is a visible share (4 instances: 4.25 per instance), so the bound is checked
    // as those counts; from 5 instances up it is within the bench's target of 4.2 per instance,
    // which the 6-instance step must meet as the 200-instance bench does.
    for step in [&report.steps[0], &report.steps[2]] {
        assert!(step.writes_target, "{} has the writes target", step.name);
        let created = step.created as u64;
        assert!(
            (created..=4 * created + 1).contains(&step.instance_writes()),
            "{}: {} instance-caused operator writes for {created} instances created:\n{}",
            step.name,
            step.instance_writes(),
            report.render()
        );
    }
    let first = report.steps[0].writes_per_created().unwrap();
    assert!(
        first <= WRITES_PER_CREATED_TARGET,
        "scale 0 -> 6: {first:.2} writes per instance created > {WRITES_PER_CREATED_TARGET}:\n{}",
        report.render()
    );
    let text = report.render();
    assert!(text.contains("| roll 6 (maxSurge 2) |"), "{text}");
    assert!(report.operator_usage.is_some());
}

async fn run_with_sim(args: BenchArgs, plan: PoolPlan) -> capmvm_sim::bench_pool::PoolReport {
    capmvm_sim::bench_pool::run_with_exe(
        args,
        plan,
        std::path::PathBuf::from(env!("CARGO_BIN_EXE_capmvm-sim")),
    )
    .await
    .unwrap()
}
