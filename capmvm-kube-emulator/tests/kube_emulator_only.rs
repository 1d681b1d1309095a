#![allow(clippy::unwrap_used, clippy::expect_used)]
//! What only the emulator has, beside the contract (`kube_contract.rs`, run on both servers): its
//! memory bound on slow watchers, the kubeconfig it writes and its request counters.

mod kube_support;

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube_support::*;
use serde_json::json;

#[tokio::test]
async fn a_slow_watcher_is_closed() {
    let (emu, client) =
        start_with(capmvm_kube_emulator::EmulatorOptions::default().watch_buffer(8)).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");

    // A watcher that does not read: its buffer fills and the server closes it instead of growing.
    let mut stalled = cms.events(&WatchParams::default(), "0").await;
    let big = "x".repeat(64 * 1024);
    for i in 0..200 {
        cms.create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": format!("c{i}")}, "data": {"big": big}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    }
    eventually("the slow watcher was closed", || {
        let closed = emu.stats().slow_watchers_closed;
        async move { closed >= 1 }
    })
    .await;
    // What was buffered is delivered in order, then the stream ends: the client re-watches.
    let mut n = 0;
    while let Some(ev) = stalled.try_next().await.unwrap() {
        match ev {
            WatchEvent::Added(_) => n += 1,
            // The end of the (empty) initial state.
            WatchEvent::Bookmark(_) => {}
            other => panic!("{other:?}"),
        }
    }
    assert!(n < 200, "the stream ended early ({n} events)");
    assert_eq!(emu.stats().watchers, 0);
}

// --- Running it --------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_written_kubeconfig_serves_kube_rs() {
    let (emu, _client) = start().await;
    let dir = std::env::temp_dir().join(format!("capmvm-kubeconfig-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kubeconfig");
    emu.write_kubeconfig(&path).unwrap();
    let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
    assert_eq!(config.default_namespace, "default");
    let client = kube::Client::try_from(config).unwrap();
    let info = client.apiserver_version().await.unwrap();
    assert_eq!(info.major, "1");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn requests_are_counted_by_verb_and_resource() {
    use capmvm_kube_emulator::Verb;
    let (emu, client) = start_with_project_crds().await;
    emu.reset_counters();
    let api = machines(&client, "default");
    create_machine(&client, "default", "m").await;
    api.get("m").await.unwrap();
    api.list(&ListParams::default()).await.unwrap();
    api.merge("m", json!({"spec": {"vcpu": 3}})).await;
    api.patch_status(
        "m",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"host": "h"}})),
    )
    .await
    .unwrap();
    let _ = api
        .events(&WatchParams::default().timeout(1), "0")
        .await
        .try_next()
        .await;
    api.delete("m", &DeleteParams::default()).await.unwrap();
    let c = emu.counters();
    let r = "infrastructure.cluster.x-k8s.io/microvmmachines";
    assert_eq!(c.get(Verb::Create, r), 1);
    assert_eq!(c.get(Verb::Get, r), 1);
    assert_eq!(c.get(Verb::List, r), 1);
    assert_eq!(c.get(Verb::Patch, r), 1);
    assert_eq!(c.get(Verb::Patch, &format!("{r}/status")), 1);
    assert_eq!(c.get(Verb::Watch, r), 1);
    assert_eq!(c.get(Verb::Delete, r), 1);
    assert_eq!(c.total(), 7);
    Api::<Secret>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(emu.counters().get(Verb::List, "core/secrets"), 1);
}

#[tokio::test]
async fn request_counters_fold_clients_beyond_the_cap_into_other() {
    // The User-Agent is whatever a client sends: past 64 distinct clients, requests are counted
    // together under "other" instead of growing the counters without bound.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (emu, _client) = start().await;
    emu.reset_counters();
    for i in 0..70 {
        let mut conn = tokio::net::TcpStream::connect(emu.addr()).await.unwrap();
        let req = format!(
            "GET /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: {}\r\nUser-Agent: agent-{i}/1.0\r\nConnection: close\r\n\r\n",
            emu.addr()
        );
        conn.write_all(req.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        conn.read_to_end(&mut answer).await.unwrap();
        assert!(
            answer.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
    }
    use capmvm_kube_emulator::{OTHER_AGENTS, Verb};
    assert_eq!(
        emu.counters().get(Verb::List, "core/configmaps"),
        70,
        "every request counted"
    );
    assert_eq!(emu.counters_of_agent("agent-0").total(), 1);
    assert_eq!(emu.counters_of_agent("agent-63/2.0").total(), 1);
    assert_eq!(emu.counters_of_agent("agent-64").total(), 0);
    assert_eq!(
        emu.counters_of_agent(OTHER_AGENTS)
            .get(Verb::List, "core/configmaps"),
        6
    );
    // A client counted apart stays so.
    let mut conn = tokio::net::TcpStream::connect(emu.addr()).await.unwrap();
    conn.write_all(
        b"GET /version HTTP/1.1\r\nHost: x\r\nUser-Agent: agent-1\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer).await.unwrap();
    assert_eq!(emu.counters_of_agent("agent-1").total(), 2);
}

/// Where the emulator deliberately answers otherwise than the real server (the README lists these):
/// a protobuf body for a custom resource is a 415 (kube-apiserver v1.36 drops the connection without
/// an answer), and a client that accepts only protobuf gets its 406 Status in JSON (the real server
/// encodes it in protobuf, which the emulator never writes).
#[tokio::test]
async fn protobuf_a_custom_resource_cannot_take_is_refused_with_a_json_status() {
    let (_emu, client) = start_with_project_crds().await;
    create_machine(&client, "default", "m").await;
    let base = "/apis/infrastructure.cluster.x-k8s.io/v1alpha2/namespaces/default/microvmmachines";
    let r = raw(
        &client,
        "POST",
        base,
        Some("application/vnd.kubernetes.protobuf"),
        b"k8s\0",
    )
    .await;
    assert_status(&r, 415, "UnsupportedMediaType");
    let r = raw_with(
        &client,
        "GET",
        &format!("{base}/m"),
        None,
        Some("application/vnd.kubernetes.protobuf"),
        b"",
    )
    .await;
    assert_status(&r, 406, "NotAcceptable");
}

/// A watch from a resourceVersion older than the history gets 410 Gone. Not in the contract suite:
/// kube-apiserver v1.36 watches from its watch cache, which replays even a watch from revision 1 after
/// etcd's compaction, so no test can make it forget (a real server does answer 410 once its cache's
/// window has moved on, minutes of changes later).
#[tokio::test]
async fn a_watch_older_than_the_history_gets_410_gone() {
    let (_emu, client) =
        start_with(capmvm_kube_emulator::EmulatorOptions::default().history_limit(3)).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let first = cms.create_json(json!({"metadata": {"name": "c"}})).await;
    for i in 0..5 {
        cms.merge("c", json!({"data": {"n": i.to_string()}})).await;
    }
    let mut s = cms
        .events(
            &WatchParams::default(),
            &first.metadata.resource_version.unwrap(),
        )
        .await;
    match s.try_next().await.unwrap().unwrap() {
        WatchEvent::Error(e) => {
            assert_eq!(e.code, 410);
            assert_eq!(e.reason, "Expired");
            assert!(
                e.message.starts_with("too old resource version"),
                "{}",
                e.message
            );
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    assert!(
        s.try_next().await.unwrap().is_none(),
        "the stream ends after the error"
    );
    // A recent resourceVersion is fine.
    let now = cms.list_rv().await;
    let mut s = cms.events(&WatchParams::default().timeout(1), &now).await;
    assert!(s.try_next().await.unwrap().is_none());
}

/// Protobuf bodies, which the real server takes only for built-in kinds (and for custom resources
/// drops the connection without an answer): every path still answers with a Status, never a 5xx.
#[tokio::test]
async fn protobuf_bodies_never_break_the_server() {
    let (_emu, client) = start_with_project_crds().await;
    create_machine(&client, "default", "m").await;
    let base = "/apis/infrastructure.cluster.x-k8s.io/v1alpha2/namespaces/default/microvmmachines";
    let paths = [
        base.to_string(),
        format!("{base}/m"),
        format!("{base}/m/status"),
        "/api/v1/namespaces/default/secrets".into(),
        "/api/v1/namespaces/default/configmaps/c".into(),
        "/api/v1/namespaces".into(),
    ];
    let bodies: [&[u8]; 4] = [b"", b"k8s\0", b"k8s\0\x0a\xff\xff", b"{}"];
    for path in &paths {
        for method in ["POST", "PUT", "PATCH"] {
            for body in bodies {
                let r = raw(
                    &client,
                    method,
                    path,
                    Some("application/vnd.kubernetes.protobuf"),
                    body,
                )
                .await;
                assert!(
                    r.status >= 400 && r.status < 500,
                    "{method} {path}: {}",
                    r.text
                );
                assert_eq!(r.body["kind"], "Status", "{method} {path}: {}", r.text);
            }
        }
    }
    create_machine(&client, "default", "after").await;
}

/// A continue token older than the history is 410. Not in the contract suite: kube-apiserver v1.36
/// serves continued lists from its watch cache's snapshots, which only its own compactor (every five
/// minutes) invalidates; after a compaction made behind its back it even answers an empty list.
#[tokio::test]
async fn a_continue_token_older_than_the_history_is_410() {
    let (emu, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for i in 0..6 {
        cms.create_json(json!({"metadata": {"name": format!("c{i}")}}))
            .await;
    }
    let first = cms.list(&ListParams::default().limit(2)).await.unwrap();
    for i in 0..10 {
        cms.merge("c0", json!({"data": {"n": i.to_string()}})).await;
    }
    // The history forgets what is older than now, as etcd's compaction does.
    emu.compact();
    let s = status_of(
        cms.list(
            &ListParams::default()
                .limit(2)
                .continue_token(&first.metadata.continue_.unwrap()),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((s.code, s.reason.as_str()), (410, "Expired"));
}

/// `EmulatorOptions::managed_fields(false)`: writes record no `Update` entries (what a simulation at
/// scale opts out of), while server-side apply still records and checks its own.
#[tokio::test]
async fn without_update_tracking_only_apply_owns_fields() {
    let (_emu, client) =
        start_with(capmvm_kube_emulator::EmulatorOptions::default().managed_fields(false)).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let created = cms
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "c"}, "data": {"a": "1"}}))
                .unwrap(),
        )
        .await
        .unwrap();
    assert!(created.metadata.managed_fields.is_none());
    let apply = |manager: &'static str, value: &'static str| {
        let cms = cms.clone();
        async move {
            cms.patch(
                "c",
                &PatchParams::apply(manager),
                &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "c"}, "data": {"b": value}})),
            )
            .await
        }
    };
    let applied = apply("team-a", "1").await.unwrap();
    let entries = applied.metadata.managed_fields.unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].operation.as_deref(), Some("Apply"));
    let e = status_of(apply("team-b", "2").await.unwrap_err());
    assert_eq!(
        e.message,
        "Apply failed with 1 conflict: conflict with \"team-a\": .data.b"
    );
    // A merge patch keeps the entries as they are.
    let patched = cms.merge("c", json!({"data": {"a": "2"}})).await;
    assert_eq!(patched.metadata.managed_fields.unwrap().len(), 1);
}

/// A deliberate difference: a rule calling a Kubernetes library function (quantities here) is
/// accepted with its CRD, as on a real server, but the emulator does not evaluate that library: the
/// object is refused with an error naming the function and the rule, never let through unchecked.
#[tokio::test]
async fn a_library_function_the_emulator_does_not_evaluate_is_an_error_not_a_pass() {
    let (_emu, client) = start().await;
    create_crd(
        &client,
        &json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "quotas.test.example.com"},
            "spec": {"group": "test.example.com", "scope": "Namespaced",
                "names": {"plural": "quotas", "singular": "quota", "kind": "Quota"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {
                        "type": "object",
                        "x-kubernetes-validations": [{
                            "rule": "!has(self.memory) || quantity(self.memory).isGreaterThan(quantity('1Mi'))",
                            "message": "memory must exceed 1Mi"}],
                        "properties": {"memory": {"type": "string", "maxLength": 20}}}}}}}]}
        }),
    )
    .await;
    let path = "/apis/test.example.com/v1/namespaces/default/quotas";
    let quota = |name: &str, spec: serde_json::Value| {
        json!({"apiVersion": "test.example.com/v1", "kind": "Quota", "metadata": {"name": name}, "spec": spec})
            .to_string()
    };
    // The rule does not reach the library: evaluated as usual.
    let r = raw(
        &client,
        "POST",
        path,
        Some("application/json"),
        quota("none", json!({})).as_bytes(),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let r = raw(
        &client,
        "POST",
        path,
        Some("application/json"),
        quota("some", json!({"memory": "2Gi"})).as_bytes(),
    )
    .await;
    assert_status(&r, 422, "Invalid");
    let cause = &r.body["details"]["causes"][0];
    assert_eq!(cause["field"], "spec", "{}", r.text);
    assert_eq!(
        cause["message"],
        "Invalid value: \"object\": quantity: not supported by the emulator's CEL evaluator (it type-checks as on a real server) evaluating rule: memory must exceed 1Mi",
        "{}",
        r.text
    );
}
