//! The soak in a size that fits CI: a cluster created, scaled down and up, and deleted while 5 % of
//! the operator's API requests fail, hosts are partitioned and healed, and the operator is killed
//! at least three times. Zero duplicate microVMs, zero leaks, every step converges, and no
//! finalizer goes before its microVM. The full size is `capmvm-sim soak` (docs/reliability.md).

use std::path::PathBuf;

use capmvm_sim::soak::{SoakArgs, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_lost_under_faults_partitions_and_kills() {
    let args = SoakArgs {
        machines: 24,
        hosts: 3,
        fault_share: 0.05,
        kills: 3,
        partitions: 2,
        rounds: 1,
        provision_ms: 500,
        seed: 7,
        step_timeout_secs: 180,
    };
    let report = run(args, PathBuf::from(env!("CARGO_BIN_EXE_capmvm-sim")))
        .await
        .expect("the soak runs");
    println!("{}", report.render());
    assert!(report.failures().is_empty(), "{}", report.render());
    assert!(report.faults.total() > 0);
}
