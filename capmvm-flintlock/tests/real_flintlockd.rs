//! The real flintlockd as `capmvm-upstream` runs it: on loopback, on a containerd of its own, in a
//! folder of its own, and gone without a trace once stopped.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use capmvm_flintlock::{ClientPool, HostConfig, MicrovmState, PoolOptions};
use capmvm_upstream::flintlock::{FLINTLOCK_NAMESPACE, is_running, mounts_under};
use capmvm_upstream::{Flintlockd, FlintlockdOptions};
use support::valid_spec;

#[tokio::test]
async fn flintlockd_stops_leaving_no_namespace_lease_mount_process_or_folder() {
    let Some((binaries, tools)) =
        capmvm_upstream::flintlock::for_test("flintlockd_stops_leaving_nothing")
    else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("capmvm-real-flintlockd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let flintlockd = Flintlockd::start(&binaries, &tools, &dir, &FlintlockdOptions::default())
        .await
        .unwrap();
    let endpoint = flintlockd.endpoint();
    assert!(endpoint.starts_with("127.0.0.1:"), "{endpoint}");
    let pids = flintlockd.pids();
    assert_eq!(pids.len(), 2, "flintlockd and containerd");

    // A create makes flintlockd store its record in containerd: its namespace and a lease appear.
    let pool = ClientPool::new(PoolOptions::default());
    let client = pool.client(&HostConfig::new(&endpoint)).unwrap();
    let created = client.create(valid_spec("m1")).await.unwrap();
    assert_eq!(created.status.state, MicrovmState::Pending);
    let containerd = flintlockd.containerd();
    assert_eq!(
        containerd.namespaces().await.unwrap(),
        [FLINTLOCK_NAMESPACE]
    );
    let leases = containerd.leases(FLINTLOCK_NAMESPACE).await.unwrap();
    assert_eq!(
        leases,
        [format!("flintlock/ns1/m1/{}", created.uid())],
        "one lease per microVM"
    );

    let leftovers = flintlockd.stop().await.unwrap();
    assert!(leftovers.is_empty(), "left behind: {leftovers:?}");
    for pid in pids {
        assert!(!is_running(pid), "process {pid} still runs");
    }
    assert!(mounts_under(&dir).is_empty(), "{:?}", mounts_under(&dir));
    assert!(!dir.exists(), "{} is still there", dir.display());
    // Nothing listens on its port any more.
    let refused = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::net::TcpStream::connect(&endpoint),
    )
    .await
    .unwrap();
    assert!(refused.is_err(), "{endpoint} still accepts connections");
}
