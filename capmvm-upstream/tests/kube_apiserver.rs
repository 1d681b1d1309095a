//! The real kube-apiserver as this crate runs it: the version the build stamped, RBAC refusing a
//! ServiceAccount what no role grants it, and the audit log counting that refusal.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use capmvm_upstream::Binaries;
use capmvm_upstream::audit::service_account_user;
use capmvm_upstream::tools::Kubectl;
use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use kube::Api;
use kube::api::{ListParams, PostParams};
use support::Management;

#[tokio::test]
async fn a_service_account_is_refused_what_rbac_does_not_grant_and_the_audit_log_counts_it() {
    let Some(binaries) =
        Binaries::for_test("kube_apiserver", &["etcd", "kube-apiserver", "kubectl"])
    else {
        return;
    };
    let management = Management::start(&binaries, "test").await;
    let server = &management.server;

    // The pinned kubectl reports the pinned version of both ends.
    let kubectl = Kubectl::new(&binaries, server.kubeconfig()).unwrap();
    let version = kubectl.run(&["version", "-o", "json"]).await.unwrap();
    let version: serde_json::Value = serde_json::from_str(&version).unwrap();
    assert_eq!(version["clientVersion"]["gitVersion"], "v1.36.3");
    assert_eq!(version["serverVersion"]["gitVersion"], "v1.36.3");

    let admin = server.client().await.unwrap();
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "team"}})).unwrap();
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let sa: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "robot"}})).unwrap();
    Api::<ServiceAccount>::namespaced(admin.clone(), "team")
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
    let kubeconfig = server
        .service_account_kubeconfig(
            "team",
            "robot",
            Duration::from_secs(3600),
            &management.dir.join("robot.kubeconfig"),
        )
        .await
        .unwrap();
    let robot = capmvm_upstream::kubeapi::client_from(&kubeconfig)
        .await
        .unwrap();
    let refused = Api::<Secret>::namespaced(robot, "team")
        .list(&ListParams::default())
        .await
        .unwrap_err();
    match refused {
        kube::Error::Api(status) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("expected a 403, got {other:?}"),
    }

    let audit = server.audit().unwrap();
    let user = service_account_user("team", "robot");
    let mut forbidden = Vec::new();
    for _ in 0..50 {
        forbidden = audit.forbidden_for(&user).unwrap();
        if !forbidden.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(forbidden.len(), 1, "{forbidden:?}");
    assert_eq!(forbidden[0].verb, "list");
    assert_eq!(forbidden[0].resource(), "secrets");
    management.stop().await;
}

/// Removing an object's last finalizer deletes it, and the DELETED watch event carries the last
/// stored state: the finalizer just removed is still on it (a controller that waits for "deleting
/// and no finalizers" in its watch never sees that state).
#[tokio::test]
async fn the_deleted_event_of_a_finalized_object_carries_its_last_stored_finalizer() {
    use futures::StreamExt as _;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{DeleteParams, Patch, PatchParams, WatchEvent, WatchParams};

    let Some(binaries) = Binaries::for_test("kube_apiserver", &["etcd", "kube-apiserver"]) else {
        return;
    };
    let management = Management::start(&binaries, "deleted").await;
    let server = &management.server;
    let client = server.client().await.unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(client, "default");
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "held", "finalizers": ["example.com/hold"]}
    }))
    .unwrap();
    let created = maps.create(&PostParams::default(), &cm).await.unwrap();
    maps.delete("held", &DeleteParams::default()).await.unwrap();
    let watch = maps
        .watch(
            &WatchParams::default().fields("metadata.name=held"),
            &created.metadata.resource_version.clone().unwrap(),
        )
        .await
        .unwrap();
    maps.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    let mut watch = std::pin::pin!(watch);
    let deleted = loop {
        match tokio::time::timeout(Duration::from_secs(10), watch.next()).await {
            Ok(Some(Ok(WatchEvent::Deleted(obj)))) => break obj,
            Ok(Some(Ok(_))) => continue,
            other => panic!("no DELETED event: {other:?}"),
        }
    };
    assert!(deleted.metadata.deletion_timestamp.is_some());
    assert_eq!(
        deleted.metadata.finalizers,
        Some(vec!["example.com/hold".to_string()]),
        "the DELETED event carries the last stored state"
    );
    management.stop().await;
}
