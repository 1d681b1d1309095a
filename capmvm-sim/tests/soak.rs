//! The soak in a size that fits CI: a cluster created, scaled down and up, and deleted while 5 % of
//! the operator's and the CAPI stand-in's API requests fail (errors, slow answers, and writes that
//! land while their reply is lost), hosts are partitioned and healed, and the operator is killed
//! at least three times. Zero duplicate microVMs, zero leaks, every step converges, and no
//! finalizer goes before its microVM. The full size is `capmvm-sim soak` (docs/reliability.md).

use std::path::PathBuf;

use capmvm_sim::kube::FaultKind;
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
        ..SoakArgs::default()
    };
    let report = run(args, PathBuf::from(env!("CARGO_BIN_EXE_capmvm-sim")))
        .await
        .expect("the soak runs");
    println!("{}", report.render());
    assert!(report.failures().is_empty(), "{}", report.render());
    for kind in [
        FaultKind::CommittedTimeout,
        FaultKind::CommittedCut,
        FaultKind::Slow,
        FaultKind::Timeout,
    ] {
        assert!(
            report.faults.kind_total(kind) > 0,
            "no {kind} injected: {}",
            report.render()
        );
    }
    // The stand-in's own writes (Machines and their bootstrap configs, which the operator never
    // writes) were faulted too.
    let stand_in_faults: u64 = report
        .faults
        .iter()
        .filter(|(_, _, resource, _)| {
            resource.starts_with("bootstrap.cluster.x-k8s.io/")
                || resource.starts_with("cluster.x-k8s.io/machines")
        })
        .map(|(_, _, _, n)| n)
        .sum();
    assert!(stand_in_faults > 0, "{}", report.render());
}
