#![allow(clippy::unwrap_used, clippy::expect_used)]
//! kube-runtime against the emulator, unchanged: the watcher (including its relist after a 410 Gone),
//! a reflector, a Controller that owns Secrets, the events recorder, and kube-lease-manager's refused
//! apply. The reflector, the Controller and the recorder run on the real kube-apiserver too (see
//! `kube_contract`); the watcher's relist needs the emulator's forgetting history and counters, and
//! the lease manager a multi-threaded runtime.

mod kube_support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use capmvm_kube_emulator::{EmulatorOptions, Verb};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Resource, ResourceExt};
use kube_support::servers::Server;
use kube_support::*;
use serde_json::json;

#[tokio::test]
async fn the_watcher_follows_changes_and_relists_after_410_gone() {
    // A tiny history and watch buffer make a stalled watcher fall behind the history.
    let (emu, client) =
        start_with(EmulatorOptions::default().history_limit(10).watch_buffer(4)).await;
    install_project_crds(&client).await;
    let api = machines(&client, "default");
    for i in 0..3 {
        create_machine(&client, "default", &format!("m{i}")).await;
    }
    let mut events = watcher(api.clone(), watcher::Config::default()).boxed();
    // The initial list.
    let mut initial = BTreeSet::new();
    loop {
        match events.try_next().await.unwrap().unwrap() {
            watcher::Event::Init => {}
            watcher::Event::InitApply(o) => {
                initial.insert(o.name_any());
            }
            watcher::Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(initial.len(), 3);
    // A live change.
    create_machine(&client, "default", "live").await;
    match next_event(&mut events).await {
        watcher::Event::Apply(o) => assert_eq!(o.name_any(), "live"),
        other => panic!("unexpected {other:?}"),
    }
    let lists_before = emu.counters().get(
        Verb::List,
        "infrastructure.cluster.x-k8s.io/microvmmachines",
    );

    // While the consumer stalls, many large writes (more than the socket buffers hold): the server closes
    // the slow watch, and the history moves past the last resourceVersion the watcher saw.
    let big = "x".repeat(200 * 1024);
    for i in 0..80 {
        let patch = json!({"metadata": {"annotations": {"big": format!("{i}{big}")}}, "spec": {"vcpu": 1 + (i % 60)}});
        api.merge("m0", patch).await;
    }
    api.delete("m1", &DeleteParams::default()).await.unwrap();
    create_machine(&client, "default", "after").await;
    eventually("the slow watch was closed", || {
        let closed = emu.stats().slow_watchers_closed;
        async move { closed >= 1 }
    })
    .await;

    // Resuming: buffered events, then the re-watch gets 410 Gone, which the watcher reports, and it relists.
    let mut saw_gone = false;
    let mut relisted = None;
    while relisted.is_none() {
        match tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .unwrap()
            .unwrap()
        {
            Err(watcher::Error::WatchError(s)) if s.code == 410 => saw_gone = true,
            Err(e) => panic!("unexpected error {e:?}"),
            Ok(watcher::Event::Init) => {
                let mut names = BTreeSet::new();
                loop {
                    match events.try_next().await.unwrap().unwrap() {
                        watcher::Event::InitApply(o) => {
                            names.insert(o.name_any());
                        }
                        watcher::Event::InitDone => break,
                        other => panic!("unexpected {other:?}"),
                    }
                }
                relisted = Some(names);
            }
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {}
            Ok(other) => panic!("unexpected {other:?}"),
        }
    }
    assert!(
        saw_gone,
        "the re-watch from the old resourceVersion got 410 Gone"
    );
    let names = relisted.unwrap();
    let expected: BTreeSet<String> = ["after", "live", "m0", "m2"]
        .iter()
        .map(|s| (*s).to_string())
        .collect();
    assert_eq!(names, expected, "the relist shows the current state");
    let lists_after = emu.counters().get(
        Verb::List,
        "infrastructure.cluster.x-k8s.io/microvmmachines",
    );
    assert!(lists_after > lists_before, "the watcher listed again");
    // And it keeps following changes.
    api.delete("after", &DeleteParams::default()).await.unwrap();
    loop {
        match next_event(&mut events).await {
            watcher::Event::Delete(o) => {
                assert_eq!(o.name_any(), "after");
                break;
            }
            watcher::Event::Apply(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}

async fn a_reflector_store_tracks_the_collection(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    let api = machines(&client, "default");
    let writer = reflector::store::Writer::<DynamicObject>::new(machine_ar());
    let reader = writer.as_reader();
    let stream = reflector(
        writer,
        watcher(api.clone(), watcher::Config::default().page_size(2)),
    )
    .applied_objects();
    let handle = tokio::spawn(stream.for_each(|_| async {}));
    for i in 0..5 {
        create_machine(&client, "default", &format!("r{i}")).await;
    }
    api.delete("r3", &DeleteParams::default()).await.unwrap();
    eventually("the reflector holds four machines", || {
        let reader = reader.clone();
        async move { reader.state().len() == 4 }
    })
    .await;
    handle.abort();
}

struct Ctx {
    client: kube::Client,
    reconciles: AtomicUsize,
}

#[derive(Debug, thiserror::Error)]
#[error(transparent)]
struct ReconcileError(#[from] kube::Error);

async fn reconcile(obj: Arc<DynamicObject>, ctx: Arc<Ctx>) -> Result<Action, ReconcileError> {
    ctx.reconciles.fetch_add(1, Ordering::Relaxed);
    let ns = obj.namespace().unwrap();
    let name = obj.name_any();
    let api = machines(&ctx.client, &ns);
    // The operator's write pattern: a merge patch of status carrying resourceVersion.
    let patch = json!({"metadata": {"resourceVersion": obj.resource_version()}, "status": {"host": "reconciled"}});
    if obj.data.pointer("/status/host").and_then(|h| h.as_str()) != Some("reconciled") {
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {
                return Ok(Action::requeue(Duration::from_millis(50)));
            }
            Err(e) => return Err(e.into()),
        }
    }
    // Own a Secret, so that the Controller's `owns` watch sees it.
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    if secrets.get_opt(&name).await?.is_none() {
        let oref = obj.controller_owner_ref(&machine_ar()).unwrap();
        let s: Secret = serde_json::from_value(json!({"metadata": {"name": name, "ownerReferences": [oref]}, "stringData": {"k": "v"}})).unwrap();
        secrets.create(&PostParams::default(), &s).await?;
    }
    Ok(Action::await_change())
}

fn error_policy(_obj: Arc<DynamicObject>, _err: &ReconcileError, _ctx: Arc<Ctx>) -> Action {
    Action::requeue(Duration::from_millis(100))
}

async fn a_controller_reconciles_every_object_and_reacts_to_owned_objects(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    // The garbage collector (kube-controller-manager's on the real server, started once the CRDs
    // exist) removes owned Secrets.
    server.start_controllers().await;
    let api = machines(&client, "default");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        reconciles: AtomicUsize::new(0),
    });
    let controller = Controller::new_with(api.clone(), watcher::Config::default(), machine_ar())
        .owns_with(secrets.clone(), (), watcher::Config::default())
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|_| async {});
    let handle = tokio::spawn(controller);
    for i in 0..10 {
        create_machine(&client, "default", &format!("c{i}")).await;
    }
    eventually("every machine reconciled", || {
        let api = api.clone();
        async move {
            let list = api.list(&ListParams::default()).await.unwrap();
            list.items.len() == 10
                && list
                    .items
                    .iter()
                    .all(|m| m.data.pointer("/status/host").is_some())
        }
    })
    .await;
    eventually("every machine owns a Secret", || {
        let secrets = secrets.clone();
        async move {
            secrets
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .len()
                == 10
        }
    })
    .await;
    // Deleting an owned Secret triggers a reconcile of its owner, which recreates it.
    let before = ctx.reconciles.load(Ordering::Relaxed);
    secrets
        .delete("c3", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the owner recreated its Secret", || {
        let secrets = secrets.clone();
        async move { secrets.get_opt("c3").await.unwrap().is_some() }
    })
    .await;
    assert!(ctx.reconciles.load(Ordering::Relaxed) > before);
    // Deleting an owner garbage-collects its Secret.
    api.delete("c5", &DeleteParams::default()).await.unwrap();
    secrets
        .eventually_gone("the owned Secret was garbage collected", "c5")
        .await;
    handle.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_lease_manager_takes_no_lease_as_on_a_real_server() {
    // kube-lease-manager 0.13.1 takes a free lease with a server-side apply whose body names no
    // object (no `metadata.name`). A real kube-apiserver (v1.36, the contract suite's oracle) refuses
    // that apply with 400 "name must be provided", and so does the emulator since it was measured
    // against one: the manager takes no lease on either (its own tests run against a mock server).
    // The emulator used to accept the apply and elect a leader.
    use kube_lease_manager::LeaseManagerBuilder;
    let (_emu, client) = start().await;
    let manager = LeaseManagerBuilder::new(client, "capmvm-leader")
        .with_namespace("default")
        .with_identity("a")
        .with_duration(3)
        .with_grace(1)
        .build()
        .await
        .unwrap();
    let err = tokio::time::timeout(Duration::from_secs(10), manager.changed())
        .await
        .expect("the manager answers")
        .unwrap_err();
    assert!(
        format!("{err:?}").contains("name must be provided"),
        "{err:?}"
    );
}

async fn kube_runtime_recorder_publishes_events_and_series(server: Server) {
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let client = server.client();
    install_project_crds(&client).await;
    let m = create_machine(&client, "default", "m").await;
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "capmvm".into(),
            instance: Some("capmvm-0".into()),
        },
    );
    let reference = m.object_ref(&machine_ar());
    let ev = Event {
        type_: EventType::Normal,
        reason: "Created".into(),
        note: Some("microVM created".into()),
        action: "Provision".into(),
        secondary: None,
    };
    recorder.publish(&ev, &reference).await.unwrap();
    // The same event again is a series: a merge patch of the existing Event.
    recorder.publish(&ev, &reference).await.unwrap();
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), "default");
    // Only the Events about this Machine: a real server may record its own in the namespace.
    let all = events.list(&ListParams::default()).await.unwrap().items;
    let about_m: Vec<_> = all
        .iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.uid.as_ref()) == m.metadata.uid.as_ref())
        .collect();
    assert_eq!(about_m.len(), 1, "one Event about the Machine: {all:#?}");
    let e = about_m[0];
    assert_eq!(e.series.as_ref().unwrap().count, 2);
    // Visible as a core Event too, found by what `kubectl describe` selects on.
    let core: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "default");
    let sel = format!(
        "involvedObject.name=m,involvedObject.namespace=default,involvedObject.uid={}",
        m.metadata.uid.unwrap()
    );
    let found = core
        .list(&ListParams::default().fields(&sel))
        .await
        .unwrap();
    assert_eq!(found.items.len(), 1);
    assert_eq!(found.items[0].message.as_deref(), Some("microVM created"));
}

on_both_servers!(
    a_reflector_store_tracks_the_collection,
    a_controller_reconciles_every_object_and_reacts_to_owned_objects,
    kube_runtime_recorder_publishes_events_and_series,
);
