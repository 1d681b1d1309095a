//! DeleteMicroVM: DELETING saved at once, removal by flintlock's own reconcile, repeated deletes,
//! deleting what is gone.

use std::time::{Duration, Instant};

use capmvm_flintlock::{ErrorKind, MicrovmState};
use tonic::Code;

use crate::retries::wait_until;
use crate::servers::{Backend, Options};
use crate::support::{valid_spec, wait_for_removal};

crate::on_both_servers!(
    a_delete_saves_deleting_and_removal_waits_for_the_retry_backoff,
    deleting_what_is_gone_or_nothing_is_refused,
);

async fn a_delete_saves_deleting_and_removal_waits_for_the_retry_backoff(backend: Backend) {
    let server = backend.start(Options::default()).await;
    let client = server.client();
    let created = client.create(valid_spec("m1")).await.unwrap();
    let uid = created.uid();
    let (failed, first) = wait_until(&client, uid, Duration::from_secs(5), "retried", |vm| {
        vm.status.retry == 1
    })
    .await;

    // Deletes at the start of a second, so two in a row fall in the same one.
    let into_second = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_millis();
    tokio::time::sleep(Duration::from_millis(u64::from(1050 - into_second))).await;
    client.delete(uid).await.unwrap();
    let deleting = client.get(uid).await.unwrap();
    assert_eq!(deleting.status.state, MicrovmState::Deleting);
    assert_eq!(
        deleting.version,
        failed.version + 1,
        "the delete is one save"
    );
    assert_eq!(deleting.status.retry, 0, "a delete resets retry");
    assert_eq!(
        deleting.status.volumes, failed.status.volumes,
        "the status is kept"
    );

    // flintlock saves `deleted_at` in seconds and skips saves that change nothing: a repeated
    // delete in the same second changes nothing, one in the next second is a new version.
    client.delete(uid).await.unwrap();
    let again = client.get(uid).await.unwrap();
    assert_eq!(
        (again.status.state, again.version),
        (MicrovmState::Deleting, deleting.version)
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    client.delete(uid).await.unwrap();
    let later = client.get(uid).await.unwrap();
    assert_eq!(
        (later.status.state, later.version),
        (MicrovmState::Deleting, deleting.version + 1)
    );

    // flintlock reconciles nothing of a microVM before its backoff (20 s after the failed attempt)
    // is over, its deletion included: it stays DELETING until then.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        client.get(uid).await.unwrap().status.state,
        MicrovmState::Deleting
    );
    let err = wait_for_removal(&client, uid, Duration::from_secs(20)).await;
    let gone = Instant::now();
    assert!(
        gone - first >= Duration::from_secs(18),
        "removed {:?} after the failed attempt",
        gone - first
    );
    assert_eq!(
        (err.kind(), err.code()),
        (ErrorKind::NotFound, Some(Code::Unknown))
    );
    assert!(client.list("ns1", None).await.unwrap().is_empty());
    server.stop().await;
}

async fn deleting_what_is_gone_or_nothing_is_refused(backend: Backend) {
    let server = backend.start(Options::default()).await;
    let client = server.client();
    let uid = "01KZZZZZZZZZZZZZZZZZZZZZZZ";
    let err = client.delete(uid).await.unwrap_err();
    assert_eq!(
        (err.kind(), err.code()),
        (ErrorKind::NotFound, Some(Code::Unknown)),
        "a delete is not idempotent"
    );
    assert_eq!(
        err.message(),
        format!("deleting microvm: checking to see if spec exists: microvm spec //{uid} not found")
    );
    let err = client.delete("").await.unwrap_err();
    assert_eq!(
        (err.kind(), err.code(), err.message()),
        (
            ErrorKind::InvalidArgument,
            Some(Code::InvalidArgument),
            "invalid request"
        )
    );
    server.stop().await;
}
