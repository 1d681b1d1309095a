//! Writes: the status subresource, merge, JSON and strategic merge patches, and server-side apply of
//! Leases.

use super::*;

async fn status_subresource_separates_spec_and_status_writes(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    let api = machines(&client, "default");
    let mut m = machine("m");
    m["status"] = json!({"host": "ignored-on-create"});
    let created = api.create_json(m).await;
    assert!(
        created.data.get("status").is_none(),
        "status is dropped on create"
    );

    let pp = PatchParams::default();
    // The main path ignores status changes (and still bumps generation for the spec).
    let main = api
        .patch(
            "m",
            &pp,
            &Patch::Merge(json!({"spec": {"vcpu": 3}, "status": {"host": "h-main"}})),
        )
        .await
        .unwrap();
    assert!(main.data.get("status").is_none());
    assert_eq!(main.metadata.generation, Some(2));
    // The status path ignores everything else.
    let status = api
        .patch_status("m", &pp, &Patch::Merge(json!({"spec": {"vcpu": 7}, "metadata": {"labels": {"new": "x"}}, "status": {"host": "h1"}})))
        .await
        .unwrap();
    assert_eq!(status.data["status"]["host"], "h1");
    assert_eq!(status.data["spec"]["vcpu"], 3);
    assert!(status.labels().get("new").is_none());
    assert_eq!(status.metadata.generation, Some(2));
    assert!(rv_of(&status) > rv_of(&main));
    // PUT on /status with a JSON patch-free replace.
    let mut whole = status.clone();
    whole.data["status"]["vmState"] = json!("running");
    whole.data["spec"]["vcpu"] = json!(9);
    let replaced = api
        .replace_status("m", &PostParams::default(), &whole)
        .await
        .unwrap();
    assert_eq!(replaced.data["status"]["vmState"], "running");
    assert_eq!(replaced.data["spec"]["vcpu"], 3);
    // Status is validated against the schema too.
    let bad = api
        .patch_status(
            "m",
            &pp,
            &Patch::Merge(json!({"status": {"vmState": "exploded"}})),
        )
        .await
        .unwrap_err();
    assert_eq!(status_of(bad).code, 422);
}

// --- Patches ---------------------------------------------------------------------------------------

async fn merge_and_json_patches_on_main_and_status_paths(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    let api = machines(&client, "default");
    create_machine(&client, "default", "m").await;
    let pp = PatchParams::default();
    // RFC 7386: null removes, objects merge, lists replace.
    let p = api
        .patch("m", &pp, &Patch::Merge(json!({"metadata": {"labels": {"cluster.x-k8s.io/cluster-name": null, "a": "b"}},
            "spec": {"networkInterfaces": [{"guestDeviceName": "eth2"}, {"guestDeviceName": "eth3"}]}})))
        .await
        .unwrap();
    assert_eq!(p.labels().len(), 1);
    assert_eq!(
        p.data["spec"]["networkInterfaces"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // RFC 6902 with test ops, as the operator edits finalizers.
    let fin = "microvmmachine.infrastructure.cluster.x-k8s.io";
    let add: json_patch_ops::Ops = json_patch_ops::ops(json!([
        {"op": "test", "path": "/metadata/finalizers", "value": null},
        {"op": "add", "path": "/metadata/finalizers", "value": [fin]}
    ]));
    let p = api.patch("m", &pp, &Patch::<()>::Json(add)).await.unwrap();
    assert_eq!(p.finalizers(), &[fin.to_string()]);
    let remove = json_patch_ops::ops(json!([
        {"op": "test", "path": "/metadata/finalizers/0", "value": fin},
        {"op": "remove", "path": "/metadata/finalizers/0"}
    ]));
    let p = api
        .patch("m", &pp, &Patch::<()>::Json(remove))
        .await
        .unwrap();
    assert!(p.finalizers().is_empty());
    // JSON patch on /status.
    let st =
        json_patch_ops::ops(json!([{"op": "add", "path": "/status", "value": {"host": "h9"}}]));
    let p = api
        .patch_status("m", &pp, &Patch::<()>::Json(st))
        .await
        .unwrap();
    assert_eq!(p.data["status"]["host"], "h9");
    // Merge patch on /status.
    let p = api
        .patch_status(
            "m",
            &pp,
            &Patch::Merge(json!({"status": {"vmState": "pending"}})),
        )
        .await
        .unwrap();
    assert_eq!(
        p.data["status"],
        json!({"host": "h9", "vmState": "pending"})
    );
}

async fn a_failed_json_patch_test_is_422_and_changes_nothing(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    let api = machines(&client, "default");
    let before = create_machine(&client, "default", "m").await;
    let ops = json_patch_ops::ops(json!([
        {"op": "add", "path": "/metadata/labels/added", "value": "yes"},
        {"op": "test", "path": "/spec/vcpu", "value": 99}
    ]));
    let s = status_of(
        api.patch("m", &PatchParams::default(), &Patch::<()>::Json(ops))
            .await
            .unwrap_err(),
    );
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    let after = api.get("m").await.unwrap();
    assert_eq!(
        after.metadata.resource_version,
        before.metadata.resource_version
    );
    assert!(after.labels().get("added").is_none());
}

async fn strategic_merge_patch_only_on_builtins(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    create_machine(&client, "default", "m").await;
    let s = status_of(
        machines(&client, "default")
            .patch(
                "m",
                &PatchParams::default(),
                &Patch::Strategic(json!({"spec": {"vcpu": 3}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!((s.code, s.reason.as_str()), (415, "UnsupportedMediaType"));

    // Built-ins: strategic merge with ObjectMeta's merge keys (finalizers merge, ownerReferences by uid).
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let uid = Api::<Namespace>::all(client.clone())
        .get("kube-system")
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "c", "finalizers": ["a.example.com/x"],
        "ownerReferences": [{"apiVersion": "v1", "kind": "Namespace", "name": "kube-system", "uid": uid}]}, "data": {"a": "1"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let p = json!({"metadata": {"finalizers": ["b.example.com/y"],
        "ownerReferences": [{"apiVersion": "v1", "kind": "Namespace", "name": "renamed", "uid": uid}]}, "data": {"b": "2"}});
    let out = cms
        .patch("c", &PatchParams::default(), &Patch::Strategic(p))
        .await
        .unwrap();
    assert_eq!(
        out.metadata.finalizers.unwrap(),
        vec!["b.example.com/y".to_string(), "a.example.com/x".to_string()],
        "the patch's items first, as the real server merges a list of primitives"
    );
    let owners = out.metadata.owner_references.unwrap();
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0].name, "renamed");
    assert_eq!(out.data.unwrap().len(), 2);
}

async fn leases_support_server_side_apply_with_field_ownership_conflicts(server: Server) {
    let client = server.client();
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let take = |who: &str| json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "lock"}, "spec": {"holderIdentity": who, "leaseDurationSeconds": 10}});
    let a = leases
        .patch(
            "lock",
            &PatchParams::apply("manager-a"),
            &Patch::Apply(take("a")),
        )
        .await
        .unwrap();
    assert_eq!(a.spec.unwrap().holder_identity.as_deref(), Some("a"));
    // Another manager changing a field manager-a owns is a conflict (this is what makes the lease a lock).
    let s = status_of(
        leases
            .patch(
                "lock",
                &PatchParams::apply("manager-b"),
                &Patch::Apply(take("b")),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
    assert!(
        s.message.contains("conflict with \"manager-a\""),
        "{}",
        s.message
    );
    // Applying the same values is not a conflict; forcing takes ownership.
    leases
        .patch(
            "lock",
            &PatchParams::apply("manager-b"),
            &Patch::Apply(take("a")),
        )
        .await
        .unwrap();
    let forced = leases
        .patch(
            "lock",
            &PatchParams::apply("manager-b").force(),
            &Patch::Apply(take("b")),
        )
        .await
        .unwrap();
    assert_eq!(forced.spec.unwrap().holder_identity.as_deref(), Some("b"));
    // Clearing the holder with a strategic merge patch releases ownership, so a fresh apply succeeds.
    let release = json!({"spec": {"holderIdentity": null, "leaseDurationSeconds": null}});
    leases
        .patch(
            "lock",
            &PatchParams {
                field_manager: Some("manager-b".into()),
                ..Default::default()
            },
            &Patch::Strategic(release),
        )
        .await
        .unwrap();
    let c = leases
        .patch(
            "lock",
            &PatchParams::apply("manager-c"),
            &Patch::Apply(take("c")),
        )
        .await
        .unwrap();
    assert_eq!(c.spec.unwrap().holder_identity.as_deref(), Some("c"));
    let managed = c.metadata.managed_fields.unwrap();
    assert!(
        managed
            .iter()
            .any(|m| m.manager.as_deref() == Some("manager-c")
                && m.operation.as_deref() == Some("Apply"))
    );
}

crate::on_both_servers!(
    status_subresource_separates_spec_and_status_writes,
    merge_and_json_patches_on_main_and_status_paths,
    a_failed_json_patch_test_is_422_and_changes_nothing,
    strategic_merge_patch_only_on_builtins,
    leases_support_server_side_apply_with_field_ownership_conflicts,
);
