//! Lists: label and field selectors, limit and continue.

use super::*;

async fn label_and_field_selectors(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    let api = machines(&client, "default");
    for (name, labels) in [
        ("a", json!({"tier": "cp", "zone": "1"})),
        ("b", json!({"tier": "worker", "zone": "2"})),
        ("c", json!({"tier": "worker"})),
        ("d", json!({})),
    ] {
        let mut m = machine(name);
        m["metadata"]["labels"] = labels;
        api.create_json(m).await;
    }
    let names = |sel: &'static str| {
        let api = api.clone();
        async move {
            let mut n: Vec<String> = api
                .list(&ListParams::default().labels(sel))
                .await
                .unwrap()
                .items
                .into_iter()
                .filter_map(|o| o.metadata.name)
                .collect();
            n.sort();
            n
        }
    };
    assert_eq!(names("tier=worker").await, vec!["b", "c"]);
    assert_eq!(names("tier==cp").await, vec!["a"]);
    assert_eq!(names("tier!=worker").await, vec!["a", "d"]);
    assert_eq!(names("zone in (1,2)").await, vec!["a", "b"]);
    assert_eq!(names("tier notin (cp)").await, vec!["b", "c", "d"]);
    assert_eq!(names("zone").await, vec!["a", "b"]);
    assert_eq!(names("!zone").await, vec!["c", "d"]);
    assert_eq!(names("tier=worker,zone").await, vec!["b"]);
    let by_name = api
        .list(&ListParams::default().fields("metadata.name=c"))
        .await
        .unwrap();
    assert_eq!(by_name.items.len(), 1);
    let not_c = api
        .list(&ListParams::default().fields("metadata.name!=c,metadata.namespace=default"))
        .await
        .unwrap();
    assert_eq!(not_c.items.len(), 3);
    let all_ns: Api<DynamicObject> = Api::all_with(client.clone(), &machine_ar());
    assert_eq!(
        all_ns
            .list(&ListParams::default().fields("metadata.namespace=kube-system"))
            .await
            .unwrap()
            .items
            .len(),
        0
    );
    let s = status_of(
        api.list(&ListParams::default().fields("spec.vcpu=2"))
            .await
            .unwrap_err(),
    );
    assert_eq!(s.code, 400);
    assert!(
        s.message == "field label not supported: spec.vcpu",
        "{}",
        s.message
    );
    let s = status_of(
        api.list(&ListParams::default().labels("tier in worker"))
            .await
            .unwrap_err(),
    );
    assert_eq!(s.code, 400);
    // Built-in field selectors (Secret type).
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    secrets.create_json(json!({"metadata": {"name": "tls"}, "type": "kubernetes.io/tls", "data": {"tls.crt": "", "tls.key": ""}})).await;
    secrets
        .create_json(json!({"metadata": {"name": "plain"}}))
        .await;
    assert_eq!(
        secrets
            .list(&ListParams::default().fields("type=kubernetes.io/tls"))
            .await
            .unwrap()
            .items
            .len(),
        1
    );
}

async fn limit_and_continue_paginate_consistently(server: Server) {
    let client = server.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for i in 0..25 {
        cms.create_json(json!({"metadata": {"name": format!("c{i:02}")}}))
            .await;
    }
    let first = cms.list(&ListParams::default().limit(10)).await.unwrap();
    assert_eq!(first.items.len(), 10);
    assert_eq!(first.metadata.remaining_item_count, Some(15));
    let list_rv = first.metadata.resource_version.clone().unwrap();
    // Changes after the first page do not show in the rest of the list.
    cms.delete("c15", &DeleteParams::default()).await.unwrap();
    cms.create_json(json!({"metadata": {"name": "c99"}})).await;
    cms.merge("c20", json!({"data": {"changed": "yes"}})).await;
    let mut names: Vec<String> = first
        .items
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    let mut token = first.metadata.continue_;
    while let Some(t) = token {
        let page = cms
            .list(&ListParams::default().limit(10).continue_token(&t))
            .await
            .unwrap();
        assert_eq!(
            page.metadata.resource_version.as_deref(),
            Some(list_rv.as_str()),
            "every page is at the list's resourceVersion"
        );
        for c in &page.items {
            if c.metadata.name.as_deref() == Some("c20") {
                assert!(
                    c.data.is_none(),
                    "the object as it was at the list's resourceVersion"
                );
            }
        }
        names.extend(page.items.iter().filter_map(|c| c.metadata.name.clone()));
        token = page.metadata.continue_;
    }
    let expected: Vec<String> = (0..25).map(|i| format!("c{i:02}")).collect();
    assert_eq!(names, expected);
    // A fresh list sees the changes.
    let now = cms.list(&ListParams::default()).await.unwrap();
    assert!(
        now.items
            .iter()
            .any(|c| c.metadata.name.as_deref() == Some("c99"))
    );
    assert!(
        !now.items
            .iter()
            .any(|c| c.metadata.name.as_deref() == Some("c15"))
    );
    // Listing exactly at an old revision works while the history reaches it.
    let exact = cms
        .list(
            &ListParams::default()
                .at(&list_rv)
                .matching(kube::api::VersionMatch::Exact),
        )
        .await
        .unwrap();
    assert_eq!(exact.items.len(), 25);
}

crate::on_both_servers!(
    label_and_field_selectors,
    limit_and_continue_paginate_consistently,
);
