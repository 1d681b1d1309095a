//! Deletion, finalizers and owners: deletion held by finalizers, immediate deletion, delete
//! collection, garbage collection and namespace deletion.

use super::*;

async fn finalizers_hold_deletion_until_removed(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    let api = machines(&client, "default");
    let mut m = machine("m");
    m["metadata"]["finalizers"] = json!(["example.com/hold"]);
    let created = api.create_json(m).await;
    let mut events = api
        .events(
            &WatchParams::default().fields("metadata.name=m"),
            &created.metadata.resource_version.clone().unwrap(),
        )
        .await;

    let deleted = api.delete("m", &DeleteParams::default()).await.unwrap();
    let pending = deleted
        .left()
        .expect("the object comes back while finalizers remain");
    assert!(pending.metadata.deletion_timestamp.is_some());
    assert_eq!(pending.metadata.deletion_grace_period_seconds, Some(0));
    assert_eq!(pending.metadata.generation, Some(2));
    assert!(
        matches!(events.try_next().await.unwrap().unwrap(), WatchEvent::Modified(o) if o.metadata.deletion_timestamp.is_some())
    );
    assert!(api.get("m").await.is_ok(), "still there");

    // No new finalizer may be added now.
    let s = status_of(
        api.patch(
            "m",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"finalizers": ["example.com/hold", "example.com/more"]}}),
            ),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    assert_eq!(s.details.unwrap().causes[0].reason, "FieldValueForbidden");
    // Other writes are still allowed.
    api.merge("m", json!({"metadata": {"labels": {"x": "y"}}}))
        .await;
    assert!(matches!(
        events.try_next().await.unwrap().unwrap(),
        WatchEvent::Modified(_)
    ));

    // Removing the last finalizer removes the object.
    let out = api.release_finalizers("m").await;
    assert!(out.finalizers().is_empty());
    assert!(matches!(
        events.try_next().await.unwrap().unwrap(),
        WatchEvent::Deleted(_)
    ));
    assert_eq!(status_of(api.get("m").await.unwrap_err()).code, 404);
}

/// Removing the last finalizer deletes the object without storing that write: the DELETED event
/// carries the object as last stored (marked for deletion, the finalizer just removed still on it),
/// for custom resources and built-in kinds alike, while the writer gets back what it wrote.
/// The object of the DELETED event that ends a watch, after any MODIFIED ones.
async fn deleted_after_modifications<K: std::fmt::Debug>(events: &mut Events<K>) -> K {
    loop {
        match events.try_next().await.unwrap().unwrap() {
            WatchEvent::Modified(_) => {}
            WatchEvent::Deleted(o) => break o,
            other => panic!("unexpected {other:?}"),
        }
    }
}

async fn the_deleted_event_carries_the_last_stored_state(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    let api = machines(&client, "default");
    let mut m = machine("m");
    m["metadata"]["finalizers"] = json!(["example.com/a", "example.com/b"]);
    let created = api.create_json(m).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm = cms
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "c", "finalizers": ["example.com/hold"]},
                "data": {"k": "v"}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let mut events = api
        .events(
            &WatchParams::default().fields("metadata.name=m"),
            &created.metadata.resource_version.clone().unwrap(),
        )
        .await;
    let mut cm_events = cms
        .events(
            &WatchParams::default().fields("metadata.name=c"),
            &cm.metadata.resource_version.clone().unwrap(),
        )
        .await;

    api.delete("m", &DeleteParams::default()).await.unwrap();
    // One finalizer of two removed: stored, MODIFIED.
    let one_left = api
        .merge("m", json!({"metadata": {"finalizers": ["example.com/b"]}}))
        .await;
    let out = api.release_finalizers("m").await;
    assert!(out.finalizers().is_empty(), "the writer gets what it wrote");
    let last_stored = deleted_after_modifications(&mut events).await;
    assert!(last_stored.metadata.deletion_timestamp.is_some());
    assert_eq!(last_stored.finalizers(), ["example.com/b"]);
    assert!(
        rv_of(&last_stored) > rv_of(&one_left),
        "the deletion's revision"
    );

    cms.delete("c", &DeleteParams::default()).await.unwrap();
    cms.release_finalizers("c").await;
    let last_stored = deleted_after_modifications(&mut cm_events).await;
    assert!(last_stored.metadata.deletion_timestamp.is_some());
    assert_eq!(last_stored.finalizers(), ["example.com/hold"]);
    assert_eq!(status_of(cms.get("c").await.unwrap_err()).code, 404);
}

async fn delete_without_finalizers_removes_at_once_and_answers_success(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    let api = machines(&client, "default");
    let created = create_machine(&client, "default", "m").await;
    let out = api.delete("m", &DeleteParams::default()).await.unwrap();
    // A custom resource removed at once is answered with a Success Status naming it, as built-ins are.
    let status = out.right().expect("an immediate deletion answers a Status");
    assert_eq!(
        status.status,
        Some(kube::core::response::StatusSummary::Success)
    );
    let details = status.details.expect("details");
    assert_eq!(details.name, "m");
    assert_eq!(details.kind, "microvmmachines");
    assert_eq!(details.group, "infrastructure.cluster.x-k8s.io");
    assert_eq!(Some(details.uid), created.metadata.uid);
    assert_eq!(status_of(api.get("m").await.unwrap_err()).code, 404);
    assert_eq!(
        status_of(api.delete("m", &DeleteParams::default()).await.unwrap_err()).code,
        404
    );
    // Preconditions.
    let m = create_machine(&client, "default", "p").await;
    let s = status_of(
        api.delete(
            "p",
            &DeleteParams {
                preconditions: Some(kube::api::Preconditions {
                    uid: Some("wrong".into()),
                    resource_version: None,
                }),
                ..Default::default()
            },
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(s.code, 409);
    api.delete(
        "p",
        &DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: m.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    // Built-ins answer an immediate deletion with a Success Status.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create_json(json!({"metadata": {"name": "c"}})).await;
    let out = cms.delete("c", &DeleteParams::default()).await.unwrap();
    assert!(
        out.right()
            .is_some_and(|s| s.status == Some(kube::core::response::StatusSummary::Success))
    );
}

async fn a_delete_without_finalizers_removes_the_object_unmarked(server: Server) {
    // A real registry deletes an object nothing holds straight from etcd: neither the answer nor the
    // DELETED event carries deletionTimestamp or deletionGracePeriodSeconds, nor a new generation.
    let client = server.client();
    install_project_crds(&client).await;
    let api = machines(&client, "default");
    let created = create_machine(&client, "default", "m").await;
    assert_eq!(created.metadata.generation, Some(1));
    let mut events = api
        .events(
            &WatchParams::default(),
            &created.metadata.resource_version.clone().unwrap(),
        )
        .await;
    let out = api.delete("m", &DeleteParams::default()).await.unwrap();
    assert!(out.is_right(), "answered with a Success Status: {out:?}");
    match next_event(&mut events).await {
        WatchEvent::Deleted(o) => {
            assert!(o.metadata.deletion_timestamp.is_none(), "{o:?}");
            assert!(o.metadata.deletion_grace_period_seconds.is_none());
            assert_eq!(o.metadata.generation, Some(1));
            assert!(rv_of(&o) > rv_of(&created), "the deletion's revision");
        }
        other => panic!("expected DELETED only, got {other:?}"),
    }
    // A dry run answers the same, and removes nothing.
    create_machine(&client, "default", "d").await;
    let dry = api
        .delete(
            "d",
            &DeleteParams {
                dry_run: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(dry.is_right(), "{dry:?}");
    assert!(api.get("d").await.is_ok());
    // What stays (a finalizer, or a propagation policy that adds one) is still marked first.
    let orphaned = api
        .delete("d", &DeleteParams::orphan())
        .await
        .unwrap()
        .left()
        .expect("held by the orphan finalizer");
    assert!(orphaned.metadata.deletion_timestamp.is_some());
    assert_eq!(orphaned.metadata.generation, Some(2));
}

async fn delete_collection_deletes_what_the_selector_selects(server: Server) {
    let client = server.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for (name, tier) in [("a", "x"), ("b", "x"), ("c", "y")] {
        cms.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name, "labels": {"tier": tier}}}))
                .unwrap(),
        )
        .await
        .unwrap();
    }
    let out = cms
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("tier=x"),
        )
        .await
        .unwrap();
    let deleted: Vec<String> = out
        .left()
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    assert_eq!(deleted, vec!["a", "b"]);
    let left: Vec<String> = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    assert_eq!(left, vec!["c"]);
}

async fn garbage_collection_deletes_dependents_of_removed_owners(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    server.start_controllers().await;
    let api = machines(&client, "default");
    let owner = create_machine(&client, "default", "owner").await;
    let other = create_machine(&client, "default", "other").await;
    let oref = |o: &DynamicObject| {
        json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha2", "kind": "MicrovmMachine",
        "name": o.metadata.name, "uid": o.metadata.uid})
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let dep = |name: &str, owners: Vec<Value>, fins: Vec<&str>| -> Secret {
        serde_json::from_value(
            json!({"metadata": {"name": name, "ownerReferences": owners, "finalizers": fins}}),
        )
        .unwrap()
    };
    secrets
        .create(
            &PostParams::default(),
            &dep("only-owner", vec![oref(&owner)], vec![]),
        )
        .await
        .unwrap();
    secrets
        .create(
            &PostParams::default(),
            &dep("two-owners", vec![oref(&owner), oref(&other)], vec![]),
        )
        .await
        .unwrap();
    secrets
        .create(
            &PostParams::default(),
            &dep("held", vec![oref(&owner)], vec!["example.com/hold"]),
        )
        .await
        .unwrap();
    // A dependent of a dependent goes too, in turn.
    let only = secrets.get("only-owner").await.unwrap();
    let grand = json!({"apiVersion": "v1", "kind": "Secret", "name": "only-owner", "uid": only.metadata.uid});
    secrets
        .create(
            &PostParams::default(),
            &dep("grandchild", vec![grand], vec![]),
        )
        .await
        .unwrap();

    api.delete("owner", &DeleteParams::default()).await.unwrap();
    eventually("dependents of the removed owner are gone", || {
        let secrets = secrets.clone();
        async move {
            secrets.get_opt("only-owner").await.unwrap().is_none()
                && secrets.get_opt("grandchild").await.unwrap().is_none()
        }
    })
    .await;
    // An object with another live owner stays, without the dangling reference.
    eventually("dangling owner reference removed", || {
        let secrets = secrets.clone();
        async move {
            secrets
                .get("two-owners")
                .await
                .unwrap()
                .metadata
                .owner_references
                .unwrap_or_default()
                .len()
                == 1
        }
    })
    .await;
    // Its own finalizers are respected.
    let held = secrets.get("held").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    secrets.release_finalizers("held").await;
    assert!(secrets.get_opt("held").await.unwrap().is_none());
    // An object created with an owner that does not exist is collected.
    secrets.create(&PostParams::default(), &dep("orphan", vec![json!({"apiVersion": "v1", "kind": "Secret", "name": "ghost", "uid": "no-such-uid"})], vec![])).await.unwrap();
    secrets
        .eventually_gone("dependent of a missing owner collected", "orphan")
        .await;
    // Orphan propagation keeps dependents and drops their references.
    let o2 = create_machine(&client, "default", "owner2").await;
    secrets
        .create(
            &PostParams::default(),
            &dep("kept", vec![oref(&o2)], vec![]),
        )
        .await
        .unwrap();
    api.delete("owner2", &DeleteParams::orphan()).await.unwrap();
    api.eventually_gone("owner2 removed after orphaning", "owner2")
        .await;
    assert!(
        secrets
            .get("kept")
            .await
            .unwrap()
            .metadata
            .owner_references
            .is_none()
    );
    // Foreground propagation deletes dependents before the owner.
    let o3 = create_machine(&client, "default", "owner3").await;
    let mut blocking = oref(&o3);
    blocking["blockOwnerDeletion"] = json!(true);
    secrets
        .create(
            &PostParams::default(),
            &dep("blocker", vec![blocking], vec!["example.com/hold"]),
        )
        .await
        .unwrap();
    api.delete("owner3", &DeleteParams::foreground())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let o3_now = api.get("owner3").await.unwrap();
    assert!(
        o3_now
            .finalizers()
            .contains(&"foregroundDeletion".to_string()),
        "owner waits for its blocking dependent"
    );
    secrets.release_finalizers("blocker").await;
    api.eventually_gone("owner3 removed once its dependent is gone", "owner3")
        .await;
}

async fn deleting_a_namespace_removes_what_is_in_it(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    server.start_controllers().await;
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create_json(json!({"metadata": {"name": "doomed"}}))
        .await;
    create_machine(&client, "doomed", "a").await;
    let mut held = machine("b");
    held["metadata"]["finalizers"] = json!(["example.com/hold"]);
    machines(&client, "doomed").create_json(held).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "doomed");
    secrets
        .create_json(json!({"metadata": {"name": "s"}}))
        .await;

    let out = nss
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    let ns = out.left().unwrap();
    assert_eq!(ns.status.unwrap().phase.as_deref(), Some("Terminating"));
    eventually("contents without finalizers deleted", || {
        let client = client.clone();
        async move {
            machines(&client, "doomed")
                .get_opt("a")
                .await
                .unwrap()
                .is_none()
        }
    })
    .await;
    secrets.eventually_gone("the secret deleted too", "s").await;
    // New content is refused while it terminates.
    let s = status_of(
        try_create_machine(&client, "doomed", "c")
            .await
            .unwrap_err(),
    );
    assert_eq!((s.code, s.reason.as_str()), (403, "Forbidden"));
    assert!(
        nss.get_opt("doomed").await.unwrap().is_some(),
        "held by b's finalizer"
    );
    machines(&client, "doomed").release_finalizers("b").await;
    nss.eventually_gone("namespace removed", "doomed").await;
    // The built-in namespaces cannot be deleted.
    assert_eq!(
        status_of(
            nss.delete("default", &DeleteParams::default())
                .await
                .unwrap_err()
        )
        .code,
        403
    );
}

crate::on_both_servers!(
    finalizers_hold_deletion_until_removed,
    the_deleted_event_carries_the_last_stored_state,
    delete_without_finalizers_removes_at_once_and_answers_success,
    a_delete_without_finalizers_removes_the_object_unmarked,
    delete_collection_deletes_what_the_selector_selects,
    garbage_collection_deletes_dependents_of_removed_owners,
    deleting_a_namespace_removes_what_is_in_it,
);
