//! A microVM whose images cannot be pulled: every attempt fails, `status.retry` counts them,
//! flintlock waits `retry` × 20 s before the next, and FAILED comes as soon as an attempt takes
//! `retry` past `--maximum-retry`.

use std::time::{Duration, Instant};

use capmvm_flintlock::{FlintlockClient, Microvm, MicrovmState, VolumeStatus};

use crate::servers::{Backend, Options};
use crate::support::valid_spec;

crate::on_both_servers!(
    a_failed_attempt_counts_retry_and_stays_pending,
    the_next_attempt_waits_20_seconds_per_retry,
    failed_once_retry_passes_the_maximum,
);

/// Polls until `check` holds for the microVM; its record and when.
pub(crate) async fn wait_until(
    client: &FlintlockClient,
    uid: &str,
    within: Duration,
    what: &str,
    check: impl Fn(&Microvm) -> bool,
) -> (Microvm, Instant) {
    let deadline = Instant::now() + within;
    loop {
        let vm = client.get(uid).await.unwrap();
        if check(&vm) {
            return (vm, Instant::now());
        }
        assert!(
            Instant::now() < deadline,
            "{uid}: not {what} after {within:?}: {:?} retry {} version {}",
            vm.status.state,
            vm.status.retry,
            vm.version
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn a_failed_attempt_counts_retry_and_stays_pending(backend: Backend) {
    let server = backend.start(Options::default()).await;
    let client = server.client();
    let mut spec = valid_spec("m1");
    spec.additional_volumes = vec![capmvm_flintlock::Volume {
        id: "data".to_owned(),
        source: capmvm_flintlock::VolumeSource {
            container_source: Some("ghcr.io/liquidmetal-dev/data:1".to_owned()),
            virtiofs_source: None,
        },
        ..Default::default()
    }];
    let created = client.create(spec).await.unwrap();
    let (vm, _) = wait_until(
        &client,
        created.uid(),
        Duration::from_secs(5),
        "retried",
        |vm| vm.status.retry == 1,
    )
    .await;
    assert_eq!(vm.status.state, MicrovmState::Pending);
    assert_eq!(vm.version, 2, "the failed attempt is one save");
    // Building the plan recorded an empty status for each pulled volume and each interface.
    let mut volumes: Vec<(&String, &VolumeStatus)> = vm.status.volumes.iter().collect();
    volumes.sort_by_key(|(id, _)| id.as_str());
    let ids: Vec<&str> = volumes.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["data", "root"]);
    assert!(
        volumes
            .iter()
            .all(|(_, status)| status.mount.as_ref().is_some_and(|m| m.source.is_empty())),
        "{volumes:?}"
    );
    let mut ifaces: Vec<&String> = vm.status.network_interfaces.keys().collect();
    ifaces.sort();
    assert_eq!(ifaces, ["eth0", "eth1"]);
    assert!(
        vm.status
            .network_interfaces
            .values()
            .all(|i| i.host_device_name.is_empty() && i.mac_address.is_empty()),
        "{:?}",
        vm.status.network_interfaces
    );
    assert_eq!(vm.status.kernel_mount, None);
    server.stop().await;
}

async fn the_next_attempt_waits_20_seconds_per_retry(backend: Backend) {
    let server = backend.start(Options::default()).await;
    let client = server.client();
    let created = client.create(valid_spec("m1")).await.unwrap();
    let (_, first) = wait_until(
        &client,
        created.uid(),
        Duration::from_secs(5),
        "retried",
        |vm| vm.status.retry == 1,
    )
    .await;
    let (vm, second) = wait_until(
        &client,
        created.uid(),
        Duration::from_secs(30),
        "retried twice",
        |vm| vm.status.retry == 2,
    )
    .await;
    let waited = second - first;
    assert!(
        waited >= Duration::from_secs(19) && waited <= Duration::from_secs(23),
        "the second attempt came {waited:?} after the first"
    );
    assert_eq!((vm.status.state, vm.version), (MicrovmState::Pending, 3));
    server.stop().await;
}

async fn failed_once_retry_passes_the_maximum(backend: Backend) {
    let server = backend
        .start(Options {
            maximum_retry: Some(0),
            ..Options::default()
        })
        .await;
    let client = server.client();
    let created = client.create(valid_spec("m1")).await.unwrap();
    let (_, first) = wait_until(
        &client,
        created.uid(),
        Duration::from_secs(5),
        "retried",
        |vm| vm.status.retry == 1,
    )
    .await;
    // Saving the failed attempt wakes flintlockd's reconcile, whose retry check (retry 1 > 0)
    // comes before its backoff check: FAILED at once, not after the 20 s backoff.
    let (vm, failed) = wait_until(
        &client,
        created.uid(),
        Duration::from_secs(5),
        "FAILED",
        |vm| vm.status.state == MicrovmState::Failed,
    )
    .await;
    assert!(
        failed - first < Duration::from_secs(5),
        "FAILED {:?} after the first attempt",
        failed - first
    );
    assert_eq!((vm.status.retry, vm.version), (1, 3));

    // A FAILED microVM is not retried: the record stays as it is.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let later = client.get(created.uid()).await.unwrap();
    assert_eq!(
        (later.status.state, later.version),
        (MicrovmState::Failed, 3)
    );

    // Deleting it waits for the backoff of its last attempt (20 s here; 220 s after flintlock's
    // default 10 retries): until then flintlockd reconciles nothing of it.
    client.delete(created.uid()).await.unwrap();
    assert_eq!(
        client.get(created.uid()).await.unwrap().status.state,
        MicrovmState::Deleting
    );
    let err =
        crate::support::wait_for_removal(&client, created.uid(), Duration::from_secs(25)).await;
    assert_eq!(err.kind(), capmvm_flintlock::ErrorKind::NotFound);
    assert!(
        first.elapsed() >= Duration::from_secs(18),
        "removed {:?} after the failed attempt",
        first.elapsed()
    );
    server.stop().await;
}
