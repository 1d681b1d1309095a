#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Faults on demand, through kube-rs and kube-runtime: each kind is answered as a real server under
//! stress answers it, a faulted write stores nothing, clients recover (retrying after `Retry-After`,
//! re-watching after a cut, relisting after 410), and the counts match what clients saw.

mod kube_support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use capmvm_kube_emulator::{EmulatorHandle, FaultKind, FaultRule, Verb};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use kube_support::*;
use serde_json::json;

const MACHINES: &str = "infrastructure.cluster.x-k8s.io/microvmmachines";

/// A client that sends this User-Agent and does not retry, to see each answer.
fn client_as(emu: &EmulatorHandle, user_agent: &str) -> Client {
    let mut config = kube::Config::new(emu.base_url().parse().unwrap());
    config.default_retry = false;
    config
        .headers
        .push(("user-agent".parse().unwrap(), user_agent.parse().unwrap()));
    Client::try_from(config).unwrap()
}

fn rule(kind: FaultKind, verbs: &[Verb], resources: &[&str]) -> FaultRule {
    FaultRule::new(kind)
        .verbs(verbs.iter().copied())
        .resources(resources)
        .unwrap()
}

/// A rule for these verbs on the project's machines.
fn machine_rule(kind: FaultKind, verbs: &[Verb]) -> FaultRule {
    rule(kind, verbs, &["microvmmachines"])
}

#[tokio::test]
async fn an_internal_error_refuses_writes_and_stores_nothing() {
    let (emu, client) = start_with_project_crds().await;
    let m = create_machine(&client, "default", "m").await;
    let faults = emu.faults();
    faults
        .set_rules([machine_rule(
            FaultKind::InternalError,
            &[Verb::Create, Verb::Patch, Verb::Delete],
        )])
        .unwrap();
    let api = machines(&client, "default");
    let e = api
        .create(&PostParams::default(), &dynamic(machine("m2")))
        .await
        .unwrap_err();
    let s = status_of(e);
    assert_eq!((s.code, s.reason.as_str()), (500, "InternalError"));
    assert!(
        s.message.starts_with("Internal error occurred: "),
        "{}",
        s.message
    );
    let e = api
        .try_merge("m", json!({"spec": {"vcpu": 4}}))
        .await
        .unwrap_err();
    assert_eq!(status_of(e).code, 500);
    let e = api.delete("m", &Default::default()).await.unwrap_err();
    assert_eq!(status_of(e).code, 500);
    // Reads are not selected by the rule, and show nothing changed.
    let now = api.get("m").await.unwrap();
    assert_eq!(now.metadata.resource_version, m.metadata.resource_version);
    assert_eq!(now.data["spec"]["vcpu"], 2);
    assert!(api.get_opt("m2").await.unwrap().is_none());
    // Other resources are not faulted.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(&PostParams::default(), &configmap("c"))
        .await
        .unwrap();

    let counts = faults.counts();
    assert_eq!(
        counts.get(FaultKind::InternalError, Verb::Create, MACHINES),
        1
    );
    assert_eq!(
        counts.get(FaultKind::InternalError, Verb::Patch, MACHINES),
        1
    );
    assert_eq!(
        counts.get(FaultKind::InternalError, Verb::Delete, MACHINES),
        1
    );
    assert_eq!(counts.total(), 3);
    faults.clear();
    api.create_json(machine("m2")).await;
}

fn configmap(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: kube::core::ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        ..Default::default()
    }
}

#[tokio::test]
async fn too_many_requests_carries_retry_after_and_kube_rs_waits_for_it() {
    let (emu, client) = start_with_project_crds().await;
    create_machine(&client, "default", "m").await;
    let faults = emu.faults();
    faults
        .set_rules([FaultRule::new(FaultKind::TooManyRequests)
            .retry_after_secs(2)
            .times(1)])
        .unwrap();
    let base = "/apis/infrastructure.cluster.x-k8s.io/v1alpha2/namespaces/default/microvmmachines";
    let r = raw(
        &client_without_retries(&emu),
        "GET",
        &format!("{base}/m"),
        None,
        b"",
    )
    .await;
    assert_status(&r, 429, "TooManyRequests");
    assert_eq!(r.headers["retry-after"], "2");
    assert_eq!(r.body["details"]["retryAfterSeconds"], 2);
    assert_eq!(
        r.body["message"],
        "Too many requests, please try again later."
    );

    // kube-rs's default client retries a 429 after the server's Retry-After.
    faults
        .set_rules([FaultRule::new(FaultKind::TooManyRequests)
            .retry_after_secs(1)
            .times(1)])
        .unwrap();
    let started = Instant::now();
    let m = machines(&client, "default").get("m").await.unwrap();
    assert_eq!(m.name_any(), "m");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "answered after {:?}",
        started.elapsed()
    );
    assert_eq!(
        faults
            .counts()
            .get(FaultKind::TooManyRequests, Verb::Get, MACHINES),
        2
    );
}

#[tokio::test]
async fn a_conflict_on_a_write_stores_nothing() {
    let (emu, client) = start_with_project_crds().await;
    let m = create_machine(&client, "default", "m").await;
    let faults = emu.faults();
    // No verbs: a conflict applies to updates, patches and deletes only.
    faults
        .set_rules([machine_rule(FaultKind::Conflict, &[])])
        .unwrap();
    let api = machines(&client, "default");
    let e = api
        .try_merge("m", json!({"spec": {"vcpu": 4}}))
        .await
        .unwrap_err();
    let s = status_of(e);
    assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        s.message,
        "Operation cannot be fulfilled on microvmmachines.infrastructure.cluster.x-k8s.io \"m\": \
         the object has been modified; please apply your changes to the latest version and try again"
    );
    let e = api
        .replace("m", &PostParams::default(), &m)
        .await
        .unwrap_err();
    assert_eq!(status_of(e).code, 409);
    let now = api.get("m").await.unwrap();
    assert_eq!(now.metadata.resource_version, m.metadata.resource_version);
    assert_eq!(now.data["spec"]["vcpu"], 2);
    let counts = faults.counts();
    assert_eq!(counts.get(FaultKind::Conflict, Verb::Patch, MACHINES), 1);
    assert_eq!(counts.get(FaultKind::Conflict, Verb::Update, MACHINES), 1);
    assert_eq!(counts.total(), 2, "the reads were not faulted");
}

#[tokio::test]
async fn a_timeout_stores_nothing_so_a_retried_create_succeeds() {
    let (emu, client) = start_with_project_crds().await;
    let faults = emu.faults();
    faults
        .set_rules([machine_rule(FaultKind::Timeout, &[Verb::Create]).times(1)])
        .unwrap();
    let no_retry = client_without_retries(&emu);
    let s = status_of(
        try_create_machine(&no_retry, "default", "m")
            .await
            .unwrap_err(),
    );
    assert_eq!((s.code, s.reason.as_str()), (504, "Timeout"));
    assert!(s.message.starts_with("Timeout: "), "{}", s.message);
    assert!(
        machines(&client, "default")
            .get_opt("m")
            .await
            .unwrap()
            .is_none()
    );

    // kube-rs retries a 504: had the first attempt stored the object, the retry would be 409
    // AlreadyExists.
    faults
        .set_rules([machine_rule(FaultKind::Timeout, &[Verb::Create]).times(1)])
        .unwrap();
    let m = try_create_machine(&client, "default", "m").await.unwrap();
    assert_eq!(m.metadata.generation, Some(1));
    assert_eq!(
        faults
            .counts()
            .get(FaultKind::Timeout, Verb::Create, MACHINES),
        2
    );
}

/// The common bad case of a real cluster: the write lands, its reply does not. A create answered
/// 504 after it was stored is there, and its retry meets AlreadyExists; a patch whose connection is
/// cut after it was stored has changed the object although the client saw an error.
#[tokio::test]
async fn a_write_committed_then_failed_is_stored_though_the_client_sees_an_error() {
    let (emu, client) = start_with_project_crds().await;
    let faults = emu.faults();
    faults
        .set_rules([machine_rule(FaultKind::CommittedTimeout, &[Verb::Create]).times(1)])
        .unwrap();
    let no_retry = client_without_retries(&emu);
    let s = status_of(
        try_create_machine(&no_retry, "default", "m")
            .await
            .unwrap_err(),
    );
    assert_eq!((s.code, s.reason.as_str()), (504, "Timeout"));
    let stored = machines(&client, "default").get("m").await.unwrap();
    assert_eq!(stored.metadata.generation, Some(1), "committed");
    let again = try_create_machine(&no_retry, "default", "m")
        .await
        .unwrap_err();
    assert_eq!(status_of(again).code, 409, "the retry finds it");

    faults
        .set_rules([machine_rule(FaultKind::CommittedCut, &[Verb::Patch]).times(1)])
        .unwrap();
    let cut = machines(&no_retry, "default")
        .try_merge("m", json!({"spec": {"vcpu": 4}}))
        .await;
    assert!(cut.is_err(), "the reply was cut: {cut:?}");
    let now = machines(&client, "default").get("m").await.unwrap();
    assert_eq!(now.data["spec"]["vcpu"], 4, "committed");
    // A write the store refuses fails as itself: there was nothing to commit.
    faults
        .set_rules([machine_rule(FaultKind::CommittedTimeout, &[Verb::Patch])])
        .unwrap();
    let refused = machines(&no_retry, "default")
        .try_merge("m", json!({"spec": {"vcpu": "many"}}))
        .await
        .unwrap_err();
    assert_eq!(status_of(refused).code, 422);
    let counts = faults.counts();
    assert_eq!(
        counts.get(FaultKind::CommittedTimeout, Verb::Create, MACHINES),
        1
    );
    assert_eq!(
        counts.get(FaultKind::CommittedCut, Verb::Patch, MACHINES),
        1
    );
    assert!(
        "kind=committed-timeout;share=0.05"
            .parse::<FaultRule>()
            .is_ok_and(|r| r.kind() == FaultKind::CommittedTimeout)
    );
    assert!(
        "kind=committed-cut;verbs=get".parse::<FaultRule>().is_err(),
        "a read commits nothing"
    );
}

#[tokio::test]
async fn a_slow_answer_comes_late_and_right() {
    let (emu, client) = start_with_project_crds().await;
    create_machine(&client, "default", "m").await;
    emu.faults()
        .set_rules([machine_rule(FaultKind::Slow, &[Verb::Get]).delay(Duration::from_millis(300))])
        .unwrap();
    let api = machines(&client, "default");
    let started = Instant::now();
    assert_eq!(api.get("m").await.unwrap().name_any(), "m");
    assert!(started.elapsed() >= Duration::from_millis(300));
    let started = Instant::now();
    api.list(&ListParams::default()).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(300),
        "lists are not slowed"
    );
    assert_eq!(
        emu.faults()
            .counts()
            .get(FaultKind::Slow, Verb::Get, MACHINES),
        1
    );
}

#[tokio::test]
async fn faults_can_be_kept_to_one_client() {
    let (emu, client) = start_with_project_crds().await;
    create_machine(&client, "default", "m").await;
    emu.faults()
        .set_rules([FaultRule::new(FaultKind::InternalError).user_agent_prefix("capmvm-operator/")])
        .unwrap();
    let operator = client_as(&emu, "capmvm-operator/0.1.0 (linux)");
    let e = machines(&operator, "default").get("m").await.unwrap_err();
    assert_eq!(status_of(e).code, 500);
    let kubectl = client_as(&emu, "kubectl/v1.33.0 (linux/amd64)");
    machines(&kubectl, "default").get("m").await.unwrap();
    machines(&client, "default").get("m").await.unwrap();
    assert_eq!(emu.faults().counts().total(), 1);
    assert_eq!(emu.counters_of_agent("capmvm-operator").total(), 1);
}

#[tokio::test]
async fn the_same_seed_replays_the_same_faults() {
    let (emu, _client) = start().await;
    let no_retry = client_without_retries(&emu);
    let cms: Api<ConfigMap> = Api::namespaced(no_retry, "default");
    let faults = emu.faults();
    faults
        .set_rules([rule(FaultKind::InternalError, &[Verb::List], &["configmaps"]).share(0.5)])
        .unwrap();
    let mut runs = Vec::new();
    for _ in 0..2 {
        faults.seed(1234);
        let mut outcomes = Vec::new();
        for _ in 0..40 {
            outcomes.push(cms.list(&ListParams::default()).await.is_ok());
        }
        runs.push(outcomes);
    }
    assert_eq!(runs[0], runs[1]);
    let failed = runs[0].iter().filter(|ok| !**ok).count() as u64;
    assert!(
        (8..=32).contains(&failed),
        "about half of 40 failed: {failed}"
    );
    assert_eq!(
        faults.counts().kind_total(FaultKind::InternalError),
        failed * 2
    );
    // The counts are also served for reports.
    let table = get_json_text(&emu, "/debug/faults").await;
    assert!(table.contains("internal-error (500)"), "{table}");
    assert!(table.contains(&format!(" {}\n", failed * 2)), "{table}");
}

async fn get_json_text(emu: &EmulatorHandle, path: &str) -> String {
    let r = raw(&emu.client().unwrap(), "GET", path, None, b"").await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.text
}

// --- Watches -------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_cut_watch_ends_after_some_events() {
    let (emu, client) = start_with_project_crds().await;
    for i in 0..3 {
        create_machine(&client, "default", &format!("m{i}")).await;
    }
    emu.faults()
        .set_rules([machine_rule(FaultKind::CutWatch, &[]).cut_after(2).times(1)])
        .unwrap();
    // On the wire: the events, then the connection drops without the chunked body's end.
    let path = "/apis/infrastructure.cluster.x-k8s.io/v1alpha2/namespaces/default/microvmmachines?watch=true&resourceVersion=0";
    let req = axum::http::Request::get(path)
        .body(kube::client::Body::empty())
        .unwrap();
    let resp = client.send(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        resp.into_body().collect_bytes().await.is_err(),
        "the body ends abruptly"
    );
    // kube-rs takes the cut as the end of the stream (and its watcher watches again).
    emu.faults()
        .set_rules([machine_rule(FaultKind::CutWatch, &[]).cut_after(2).times(1)])
        .unwrap();
    let api = machines(&client, "default");
    let events: Vec<_> = tokio::time::timeout(
        Duration::from_secs(5),
        api.watch(&WatchParams::default(), "0")
            .await
            .unwrap()
            .try_collect::<Vec<_>>(),
    )
    .await
    .expect("the cut ends the stream")
    .unwrap();
    assert_eq!(events.len(), 2, "two events, then the cut");
    assert!(events.iter().all(|e| matches!(e, WatchEvent::Added(_))));
    assert_eq!(
        emu.faults()
            .counts()
            .get(FaultKind::CutWatch, Verb::Watch, MACHINES),
        2
    );
    // The next watch is whole: the three objects, then the bookmark that ends the initial state.
    let events: Vec<_> = api
        .watch(&WatchParams::default().timeout(1), "0")
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(events.len(), 4);
    assert!(
        events[..3]
            .iter()
            .all(|e| matches!(e, WatchEvent::Added(_)))
    );
    assert!(matches!(events[3], WatchEvent::Bookmark(_)));
}

/// Follows a kube-runtime watcher (with its default backoff) until `names` have all been applied,
/// counting the errors it reported on the way.
async fn watch_until_seen(
    events: &mut (
             impl futures::Stream<
        Item = Result<watcher::Event<kube::core::DynamicObject>, watcher::Error>,
    > + Unpin
         ),
    names: &[&str],
) -> Vec<watcher::Error> {
    let mut seen = BTreeSet::new();
    let mut errors = Vec::new();
    while !names.iter().all(|n| seen.contains(*n)) {
        match tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .expect("the watcher goes on")
            .expect("the watcher does not end")
        {
            Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                seen.insert(o.name_any());
            }
            Ok(_) => {}
            Err(e) => errors.push(e),
        }
    }
    errors
}

#[tokio::test]
async fn kube_runtime_watcher_recovers_from_cut_streams() {
    let (emu, client) = start_with_project_crds().await;
    create_machine(&client, "default", "m0").await;
    let faults = emu.faults();
    // Every watch is cut after one event, three times over.
    faults
        .set_rules([machine_rule(FaultKind::CutWatch, &[Verb::Watch]).times(3)])
        .unwrap();
    let api = machines(&client, "default");
    let mut events = watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .boxed();
    watch_until_seen(&mut events, &["m0"]).await;
    let mut errors = Vec::new();
    // Each cut watch sends one event; the watcher re-watches from it and goes on.
    for i in 1..=4 {
        let name = format!("m{i}");
        create_machine(&client, "default", &name).await;
        errors.extend(watch_until_seen(&mut events, &[&name]).await);
    }
    assert_eq!(faults.counts().kind_total(FaultKind::CutWatch), 3);
    assert!(
        errors.is_empty(),
        "kube-rs takes a cut as a clean end: {errors:?}"
    );
    assert!(
        emu.counters().get(Verb::Watch, MACHINES) >= 4,
        "the watcher watched again after each cut"
    );
}

#[tokio::test]
async fn a_resumed_watch_gets_410_and_kube_runtime_relists() {
    let (emu, client) = start_with_project_crds().await;
    let m = create_machine(&client, "default", "m0").await;
    let faults = emu.faults();
    faults
        .set_rules([machine_rule(FaultKind::Gone, &[]).times(2)])
        .unwrap();
    let api = machines(&client, "default");
    // A watch from "0" is not a resume: it is served.
    let first = api
        .events(&WatchParams::default().timeout(1), "0")
        .await
        .try_next()
        .await
        .unwrap();
    assert!(matches!(first, Some(WatchEvent::Added(_))), "{first:?}");
    // A watch from a resourceVersion gets the ERROR event of a compacted history.
    let rv = m.resource_version().unwrap();
    let first = api
        .events(&WatchParams::default(), &rv)
        .await
        .try_next()
        .await
        .unwrap();
    match first {
        Some(WatchEvent::Error(e)) => {
            assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));
            assert!(
                e.message
                    .starts_with(&format!("too old resource version: {rv} (")),
                "{}",
                e.message
            );
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    // kube-runtime's watcher lists, watches from the list's resourceVersion, gets 410, relists.
    let lists_before = emu.counters().get(Verb::List, MACHINES);
    let mut events = watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .boxed();
    watch_until_seen(&mut events, &["m0"]).await;
    create_machine(&client, "default", "m1").await;
    let errors = watch_until_seen(&mut events, &["m1"]).await;
    assert!(
        errors
            .iter()
            .any(|e| matches!(e, watcher::Error::WatchError(s) if s.code == 410)),
        "{errors:?}"
    );
    assert_eq!(
        faults.counts().get(FaultKind::Gone, Verb::Watch, MACHINES),
        2
    );
    assert!(
        emu.counters().get(Verb::List, MACHINES) >= lists_before + 2,
        "the watcher relisted after the 410"
    );
}
