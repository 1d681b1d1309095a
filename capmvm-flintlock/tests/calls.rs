//! The client against hollow hosts over loopback TCP: what only the hollow host can show (CREATED and
//! what follows it, its fault and timing switches) and the client's own behaviour (deadlines,
//! reconnection, pooling, IPv6, message sizes). flintlock's API semantics before CREATED are the
//! contract suite's (`tests/contract/`), run on the hollow host and the real flintlockd alike.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use capmvm_flintlock::hollow::{Capacity, HollowConfig};
use capmvm_flintlock::{
    CallObserver, ClientPool, ErrorKind, HostConfig, Method, MicrovmState, PoolOptions,
};
use futures::StreamExt as _;
use support::*;
use tonic::Code;

#[tokio::test]
async fn lifecycle_pending_created_deleting_gone() {
    let host = start(fast_config()).await;
    let pool = pool();
    let client = client(&pool, &host.endpoint());

    let created = client.create(valid_spec("m1")).await.unwrap();
    let uid = created.uid().to_owned();
    let ready = wait_for_state(&client, &uid, MicrovmState::Created, Duration::from_secs(5)).await;
    assert_eq!(ready.version, 2, "one save on reaching CREATED");
    assert_eq!(ready.status.retry, 0);
    assert!(
        ready.status.network_interfaces.contains_key("eth1"),
        "{:?}",
        ready.status
    );
    assert!(ready.status.volumes.contains_key("root"));

    client.delete(&uid).await.unwrap();
    let deleting = client.get(&uid).await;
    // Removal takes the scaled delete time (1 ms here), so the record may already be gone.
    if let Ok(deleting) = deleting {
        assert_eq!(deleting.status.state, MicrovmState::Deleting);
        assert_eq!(deleting.version, 3);
    }
    let err = wait_for_removal(&client, &uid, Duration::from_secs(5)).await;
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert_eq!(
        err.code(),
        Some(Code::Unknown),
        "flintlock says Unknown; the client reads it as NotFound"
    );
    assert_eq!(
        err.message(),
        format!(
            "getting microvm: error attempting to locate microvm with uid: {uid}: microvm spec //{uid} not found"
        )
    );

    let err = client.delete(&uid).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "delete is not idempotent");
    assert_eq!(
        err.message(),
        format!("deleting microvm: checking to see if spec exists: microvm spec //{uid} not found")
    );
}

#[tokio::test]
async fn failing_creates_end_failed_after_the_retry_budget() {
    let host = start(fast_config()).await;
    let control = host.control();
    let pool = pool();
    let client = client(&pool, &host.endpoint());

    control.fail_next_creates(1);
    let doomed = client.create(valid_spec("doomed")).await.unwrap();
    let fine = client.create(valid_spec("fine")).await.unwrap();
    // 11 failures, the first ten followed by 20, 40, ... 200 ms of backoff (20 s scaled by 0.001), the
    // eleventh FAILED at once: about 1.1 s.
    let failed = wait_for_state(
        &client,
        doomed.uid(),
        MicrovmState::Failed,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(failed.status.retry, 11);
    assert_eq!(
        failed.version,
        1 + 11 + 1,
        "each failed attempt and the final FAILED are saves"
    );
    let snapshot = control.vm(doomed.uid()).unwrap();
    assert!(snapshot.last_failure.unwrap().contains("fail_next_creates"));
    wait_for_state(
        &client,
        fine.uid(),
        MicrovmState::Created,
        Duration::from_secs(5),
    )
    .await;

    // A transient failure is retried after the backoff and succeeds.
    control.fail_next_attempts(2);
    let flaky = client.create(valid_spec("flaky")).await.unwrap();
    let created = wait_for_state(
        &client,
        flaky.uid(),
        MicrovmState::Created,
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(created.status.retry, 0, "success resets retry");
    assert_eq!(created.version, 1 + 2 + 1);
}

#[tokio::test]
async fn time_scale_set_through_the_control_api_applies_to_later_backoffs_and_deletes() {
    // flintlock's own clock, unscaled, with intervals of an hour: without the switch, nothing
    // below would finish while the test runs.
    let host = start(HollowConfig {
        provision_time: Duration::from_millis(10),
        backoff_base: Duration::from_secs(3600),
        delete_time: Duration::from_secs(3600),
        time_scale: 1.0,
        ..HollowConfig::default()
    })
    .await;
    let control = host.control();
    let pool = pool();
    let client = client(&pool, &host.endpoint());

    // An hour becomes 3.6 ms.
    control.set_time_scale(0.000_001).unwrap();
    assert_eq!(control.time_scale(), 0.000_001);
    control.fail_next_attempts(1);
    let flaky = client.create(valid_spec("flaky")).await.unwrap();
    let created = wait_for_state(
        &client,
        flaky.uid(),
        MicrovmState::Created,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        created.version,
        1 + 1 + 1,
        "one failed attempt, then CREATED"
    );
    client.delete(flaky.uid()).await.unwrap();
    let err = wait_for_removal(&client, flaky.uid(), Duration::from_secs(30)).await;
    assert_eq!(err.kind(), ErrorKind::NotFound);

    // Scales that cannot scale a wait are refused and leave the current one in place.
    for bad in [-1.0, f64::NAN, f64::INFINITY] {
        assert!(control.set_time_scale(bad).is_err(), "{bad} was accepted");
    }
    assert_eq!(control.time_scale(), 0.000_001);
}

#[tokio::test]
async fn a_huge_call_timeout_is_no_deadline_not_a_panic() {
    let host = start(fast_config()).await;
    let pool = ClientPool::new(PoolOptions {
        call_timeout: Duration::MAX,
        ..PoolOptions::default()
    });
    let client = pool.client(&HostConfig::new(host.endpoint())).unwrap();
    let created = client.create(valid_spec("m1")).await.unwrap();
    assert_eq!(
        client.get(created.uid()).await.unwrap().uid(),
        created.uid()
    );
    assert_eq!(client.list("", None).await.unwrap().len(), 1);
    let streamed: Vec<_> = client.list_stream("ns1").await.unwrap().collect().await;
    assert_eq!(streamed.len(), 1);
    assert!(streamed[0].is_ok());
    client.delete(created.uid()).await.unwrap();
}

#[tokio::test]
async fn creates_beyond_capacity_end_failed_with_a_clear_reason() {
    let mut config = fast_config();
    config.capacity = Some(Capacity {
        vcpu: 4,
        memory_mb: 8192,
    });
    let host = start(config).await;
    let control = host.control();
    let pool = pool();
    let client = client(&pool, &host.endpoint());

    let first = client.create(valid_spec("one")).await.unwrap();
    wait_for_state(
        &client,
        first.uid(),
        MicrovmState::Created,
        Duration::from_secs(5),
    )
    .await;
    let second = client.create(valid_spec("two")).await.unwrap();
    wait_for_state(
        &client,
        second.uid(),
        MicrovmState::Created,
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(
        control.used(),
        Capacity {
            vcpu: 4,
            memory_mb: 4096
        }
    );

    let third = client.create(valid_spec("three")).await.unwrap();
    assert_eq!(
        third.status.state,
        MicrovmState::Pending,
        "the create itself succeeds"
    );
    wait_for_state(
        &client,
        third.uid(),
        MicrovmState::Failed,
        Duration::from_secs(10),
    )
    .await;
    let reason = control.vm(third.uid()).unwrap().last_failure.unwrap();
    assert!(
        reason.starts_with("insufficient capacity: needs 2 vCPU and 2048 MiB"),
        "{reason}"
    );
}

#[tokio::test]
async fn hanging_deletes_stay_deleting_until_released() {
    let host = start(fast_config()).await;
    let control = host.control();
    let pool = pool();
    let client = client(&pool, &host.endpoint());
    let created = client.create(valid_spec("m")).await.unwrap();
    wait_for_state(
        &client,
        created.uid(),
        MicrovmState::Created,
        Duration::from_secs(5),
    )
    .await;

    control.hang_deletes(true);
    client.delete(created.uid()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stuck = client.get(created.uid()).await.unwrap();
    assert_eq!(stuck.status.state, MicrovmState::Deleting);
    // flintlock stores `deleted_at` in seconds and skips a save that changes nothing: a repeated
    // delete is a new version only in another second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    client.delete(created.uid()).await.unwrap();
    assert_eq!(
        client.get(created.uid()).await.unwrap().version,
        stuck.version + 1,
        "a repeated delete is a save"
    );

    control.hang_deletes(false);
    let err = wait_for_removal(&client, created.uid(), Duration::from_secs(5)).await;
    assert_eq!(err.kind(), ErrorKind::NotFound);
}

#[tokio::test]
async fn deadline_exceeded_when_the_host_is_slow() {
    let host = start(fast_config()).await;
    host.control().set_latency(Duration::from_millis(800));
    let pool = ClientPool::new(PoolOptions {
        call_timeout: Duration::from_millis(150),
        ..PoolOptions::default()
    });
    let client = pool.client(&HostConfig::new(host.endpoint())).unwrap();
    let started = std::time::Instant::now();
    let err = client.list("", None).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::DeadlineExceeded, "{err}");
    assert!(
        started.elapsed() < Duration::from_millis(700),
        "gave up after {:?}",
        started.elapsed()
    );

    // A longer deadline on the same channel succeeds.
    let patient = client.with_call_timeout(Duration::from_secs(3));
    assert!(patient.list("", None).await.unwrap().is_empty());
}

#[tokio::test]
async fn deadline_covers_the_whole_stream() {
    let host = start(fast_config()).await;
    let pool = ClientPool::new(PoolOptions {
        call_timeout: Duration::from_millis(150),
        ..PoolOptions::default()
    });
    let client = pool.client(&HostConfig::new(host.endpoint())).unwrap();
    host.control().set_latency(Duration::from_millis(800));
    let err = match client.list_stream("ns1").await {
        Ok(mut stream) => stream.next().await.unwrap().unwrap_err(),
        Err(err) => err,
    };
    assert_eq!(err.kind(), ErrorKind::DeadlineExceeded);
}

#[tokio::test]
async fn unreachable_host_is_unavailable_and_the_shared_channel_recovers() {
    let host = start(fast_config()).await;
    let control = host.control();
    let pool = pool();
    let client = client(&pool, &host.endpoint());
    let created = client.create(valid_spec("m")).await.unwrap();

    control.set_reachable(false).await.unwrap();
    assert!(!control.is_reachable().await);
    for _ in 0..3 {
        let err = client.get(created.uid()).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    }

    control.set_reachable(true).await.unwrap();
    let back = client.get(created.uid()).await.unwrap();
    assert_eq!(
        back.uid(),
        created.uid(),
        "same host, same records, same port"
    );
    assert_eq!(
        pool.channel_count(),
        1,
        "the channel was reused, not replaced"
    );
}

#[tokio::test]
async fn host_that_never_existed_is_unavailable() {
    // Bind and drop: a loopback port with nothing listening.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let pool = pool();
    let client = client(&pool, &format!("127.0.0.1:{port}"));
    let err = client.get("x").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert!(
        err.message().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
}

#[tokio::test]
async fn ipv6_endpoints_work() {
    let mut config = fast_config();
    config.bind = "[::1]:0".parse().unwrap();
    let host = start(config).await;
    assert!(host.endpoint().starts_with("[::1]:"), "{}", host.endpoint());
    let pool = pool();
    let client = client(&pool, &host.endpoint());
    assert!(client.list("", None).await.unwrap().is_empty());
}

#[tokio::test]
async fn one_connection_serves_every_caller() {
    let host = start(fast_config()).await;
    let proxy =
        capmvm_flintlock::hollow::proxy::ConnectProxy::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
    let pool = pool();
    let config = HostConfig {
        proxy: Some(proxy.endpoint()),
        ..HostConfig::new(host.endpoint())
    };
    let mut calls = Vec::new();
    for i in 0..40 {
        // A fresh handle per call, as a reconcile loop would take one.
        let client = pool.client(&config).unwrap();
        calls.push(tokio::spawn(async move {
            if i % 2 == 0 {
                client.list("", None).await.map(|_| ())
            } else {
                client.get("nope").await.map(|_| ())
            }
        }));
    }
    for call in calls {
        let result = call.await.unwrap();
        assert!(result.is_ok() || result.unwrap_err().kind() == ErrorKind::NotFound);
    }
    assert_eq!(
        proxy.tunnels(),
        1,
        "all 40 calls went over one TCP connection"
    );
    assert_eq!(pool.channel_count(), 1);
    let counters = host.control().counters();
    assert_eq!(
        (counters.list, counters.get, counters.total()),
        (20, 20, 40)
    );
}

type Observation = (String, Method, Result<(), ErrorKind>);

#[derive(Default)]
struct Recorder(Mutex<Vec<Observation>>);

impl CallObserver for Recorder {
    fn observe(
        &self,
        endpoint: &str,
        method: Method,
        outcome: Result<(), ErrorKind>,
        _elapsed: Duration,
    ) {
        self.0
            .lock()
            .unwrap()
            .push((endpoint.to_owned(), method, outcome));
    }
}

#[tokio::test]
async fn observer_sees_every_call_with_its_outcome() {
    let host = start(fast_config()).await;
    let recorder = Arc::new(Recorder::default());
    let pool = ClientPool::new(PoolOptions {
        observer: Some(recorder.clone()),
        ..PoolOptions::default()
    });
    let client = pool.client(&HostConfig::new(host.endpoint())).unwrap();
    let created = client.create(valid_spec("m")).await.unwrap();
    client.get(created.uid()).await.unwrap();
    client.get("missing").await.unwrap_err();
    client.list("", None).await.unwrap();
    let _opened = client.list_stream("ns1").await.unwrap();
    client.delete(created.uid()).await.unwrap();

    let seen = recorder.0.lock().unwrap().clone();
    let endpoint = host.endpoint();
    assert_eq!(
        seen,
        vec![
            (endpoint.clone(), Method::Create, Ok(())),
            (endpoint.clone(), Method::Get, Ok(())),
            (endpoint.clone(), Method::Get, Err(ErrorKind::NotFound)),
            (endpoint.clone(), Method::List, Ok(())),
            (endpoint.clone(), Method::ListStream, Ok(())),
            (endpoint.clone(), Method::Delete, Ok(())),
        ]
    );
}

#[tokio::test]
async fn forgotten_records_are_not_found() {
    let host = start(fast_config()).await;
    let pool = pool();
    let client = client(&pool, &host.endpoint());
    let created = client.create(valid_spec("m")).await.unwrap();
    assert!(host.control().forget(created.uid()));
    assert_eq!(
        client.get(created.uid()).await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
}

#[tokio::test]
async fn lists_larger_than_grpcs_usual_4_mib_are_received() {
    let host = start(fast_config()).await;
    let pool = pool();
    let client = client(&pool, &host.endpoint());
    // 300 microVMs with 16 KiB of user-data each: about 5 MiB in one ListMicroVMs answer.
    let payload = b64(&"x".repeat(12 * 1024));
    for i in 0..300 {
        let mut spec = valid_spec(&format!("m{i}"));
        spec.metadata
            .insert("user-data".to_owned(), payload.clone());
        client.create(spec).await.unwrap();
    }
    let all = client.list("ns1", None).await.unwrap();
    assert_eq!(all.len(), 300);
    assert!(
        all.iter()
            .all(|vm| vm.spec.metadata["user-data"] == payload)
    );
}

#[tokio::test]
async fn requests_over_the_hosts_4_mib_limit_are_other_errors() {
    let host = start(fast_config()).await;
    let pool = pool();
    let client = client(&pool, &host.endpoint());
    let mut huge = valid_spec("huge");
    huge.metadata
        .insert("user-data".to_owned(), "A".repeat(5 * 1024 * 1024));
    let err = client.create(huge).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Other, "{err}");
    assert!(host.control().vms().is_empty());
    // The connection survives it.
    client.create(valid_spec("small")).await.unwrap();
}
