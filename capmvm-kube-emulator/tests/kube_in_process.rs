#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The in-process client (`EmulatorHandle::in_process_client`): the same server as over HTTP, without
//! the socket. What it writes, HTTP clients read, and the other way round; its watches, errors,
//! counters and faults are those of any client.

mod kube_support;

use std::time::Duration;

use capmvm_kube_emulator::{FaultRule, Verb};
use futures::TryStreamExt as _;
use kube::ResourceExt as _;
use kube::runtime::watcher;
use kube_support::*;
use serde_json::json;

#[tokio::test]
async fn an_in_process_client_shares_the_store_watches_and_errors_of_http_clients() {
    let (emu, http) = start().await;
    install_project_crds(&http).await;
    let local = emu.in_process_client();

    // Written in process, read over HTTP, and the other way round.
    let created = try_create_machine(&local, "default", "a").await.unwrap();
    let read = machines(&http, "default").get("a").await.unwrap();
    assert_eq!(read.uid(), created.uid());
    create_machine(&http, "default", "b").await;
    assert_eq!(
        machines(&local, "default")
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .len(),
        2
    );

    // A watch in process sees a change made over HTTP.
    let mut events = Box::pin(watcher(
        machines(&local, "default"),
        watcher::Config::default(),
    ));
    loop {
        if let watcher::Event::InitDone = events.try_next().await.unwrap().unwrap() {
            break;
        }
    }
    machines(&http, "default")
        .merge("b", json!({"metadata": {"labels": {"seen": "yes"}}}))
        .await;
    let changed = tokio::time::timeout(Duration::from_secs(5), events.try_next())
        .await
        .expect("the watch event within 5 s")
        .unwrap()
        .unwrap();
    match changed {
        watcher::Event::Apply(o) => {
            assert_eq!(o.labels().get("seen").map(String::as_str), Some("yes"))
        }
        other => panic!("unexpected {other:?}"),
    }

    // Errors are the server's Status answers: a create of an existing name is 409 AlreadyExists.
    let err = try_create_machine(&local, "default", "a")
        .await
        .unwrap_err();
    let status = status_of(err);
    assert_eq!(
        (status.code, status.reason.as_str()),
        (409, "AlreadyExists")
    );

    // Counted like any request.
    let before = emu
        .counters()
        .get(Verb::Get, "infrastructure.cluster.x-k8s.io/microvmmachines");
    machines(&local, "default").get("a").await.unwrap();
    assert_eq!(
        emu.counters()
            .get(Verb::Get, "infrastructure.cluster.x-k8s.io/microvmmachines"),
        before + 1
    );
}

#[tokio::test]
async fn faults_on_demand_reach_in_process_requests_too() {
    let (emu, http) = start().await;
    install_project_crds(&http).await;
    let local = emu.in_process_client();
    create_machine(&http, "default", "a").await;
    emu.faults()
        .add_rule(
            "kind=500;verbs=get;resources=microvmmachines;share=1"
                .parse::<FaultRule>()
                .unwrap(),
        )
        .unwrap();
    let err = machines(&local, "default").get("a").await.unwrap_err();
    assert_eq!(status_of(err).code, 500);
}
