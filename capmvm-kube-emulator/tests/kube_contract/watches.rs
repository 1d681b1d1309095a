//! Watches: event types and bookmarks, replay from a resourceVersion, selectors, named paths,
//! reads from a resourceVersion not reached yet, timeouts.

use super::*;

/// The bookmark's `k8s.io/initial-events-end` annotation ("true" on the one ending the initial state).
fn initial_events_end(b: &kube::core::watch::Bookmark) -> Option<&str> {
    b.metadata
        .annotations
        .get("k8s.io/initial-events-end")
        .map(String::as_str)
}

async fn watch_streams_added_modified_deleted_and_bookmarks(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    let api = machines(&client, "default");
    let start_rv = api.list_rv().await;
    let mut stream = api.events(&WatchParams::default(), &start_rv).await;
    create_machine(&client, "default", "m").await;
    api.merge("m", json!({"spec": {"vcpu": 3}})).await;
    api.delete("m", &DeleteParams::default()).await.unwrap();
    let mut seen = Vec::new();
    let mut last_rv = 0;
    while seen.len() < 3 {
        match next_event(&mut stream).await {
            WatchEvent::Added(o) => seen.push(("ADDED", o.data["spec"]["vcpu"].clone())),
            WatchEvent::Modified(o) => seen.push(("MODIFIED", o.data["spec"]["vcpu"].clone())),
            WatchEvent::Deleted(o) => {
                last_rv = rv_of(&o);
                seen.push(("DELETED", o.data["spec"]["vcpu"].clone()))
            }
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(
        seen,
        vec![
            ("ADDED", json!(2)),
            ("MODIFIED", json!(3)),
            ("DELETED", json!(3))
        ]
    );
    // A watch that starts with the current state (here none) and allows bookmarks (kube-rs asks for
    // them) marks the end of that state with a bookmark at a revision that covers every change so far
    // (periodic bookmarks come every minute, on both servers).
    let mut fresh = api.events(&WatchParams::default(), "0").await;
    let b = match next_event(&mut fresh).await {
        WatchEvent::Bookmark(b) => b,
        other => panic!("expected the initial-events-end bookmark, got {other:?}"),
    };
    assert_eq!(b.types.kind, "MicrovmMachine");
    assert_eq!(initial_events_end(&b), Some("true"));
    let list_rv: u64 = api.list_rv().await.parse().unwrap();
    let bookmark_rv: u64 = b.metadata.resource_version.parse().unwrap();
    assert!(
        bookmark_rv >= last_rv && bookmark_rv <= list_rv,
        "a bookmark carries a revision covering what was sent: {last_rv} <= {bookmark_rv} <= {list_rv}"
    );

    // The wire format: newline-delimited JSON over a chunked response.
    let r = raw(&client, "GET", "/apis/infrastructure.cluster.x-k8s.io/v1alpha2/namespaces/default/microvmmachines?watch=true&resourceVersion=0&timeoutSeconds=1", None, b"").await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.headers
            .get("transfer-encoding")
            .and_then(|v| v.to_str().ok()),
        Some("chunked")
    );
    assert_eq!(
        r.text, "",
        "nothing exists, nothing sent, then the timeout ends the stream cleanly"
    );
}

async fn watch_from_a_resource_version_replays_in_order_and_from_zero_lists_first(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    let api = machines(&client, "default");
    let a = create_machine(&client, "default", "a").await;
    create_machine(&client, "default", "b").await;
    api.merge("a", json!({"spec": {"vcpu": 5}})).await;
    api.delete("b", &DeleteParams::default()).await.unwrap();

    let collect = |rv: String, n: usize| {
        let api = api.clone();
        async move {
            let mut s = api.events(&WatchParams::default().timeout(2), &rv).await;
            let mut out = Vec::new();
            while out.len() < n {
                match s.try_next().await.unwrap() {
                    Some(WatchEvent::Added(o)) => {
                        out.push(format!("ADDED {}", o.metadata.name.unwrap()))
                    }
                    Some(WatchEvent::Modified(o)) => {
                        out.push(format!("MODIFIED {}", o.metadata.name.unwrap()))
                    }
                    Some(WatchEvent::Deleted(o)) => {
                        out.push(format!("DELETED {}", o.metadata.name.unwrap()))
                    }
                    Some(other) => panic!("{other:?}"),
                    None => break,
                }
            }
            out
        }
    };
    // From a's creation: everything after it, in order.
    assert_eq!(
        collect(a.metadata.resource_version.clone().unwrap(), 3).await,
        vec!["ADDED b", "MODIFIED a", "DELETED b"]
    );
    // From "0": the current objects as ADDED, then changes.
    assert_eq!(collect("0".into(), 1).await, vec!["ADDED a"]);
    let mut s = api.events(&WatchParams::default(), "0").await;
    assert!(matches!(
        s.try_next().await.unwrap(),
        Some(WatchEvent::Added(_))
    ));
    // With bookmarks allowed (kube-rs's default), the end of the initial state is marked.
    assert!(
        matches!(s.try_next().await.unwrap(), Some(WatchEvent::Bookmark(b)) if b.metadata.annotations.contains_key("k8s.io/initial-events-end"))
    );
    create_machine(&client, "default", "c").await;
    assert!(
        matches!(s.try_next().await.unwrap(), Some(WatchEvent::Added(o)) if o.metadata.name.as_deref() == Some("c"))
    );
    // sendInitialEvents: the current objects, then a bookmark marking their end.
    let wp = WatchParams::default().initial_events();
    let mut s = api.events(&wp, "").await;
    let mut added = 0;
    loop {
        match s.try_next().await.unwrap().unwrap() {
            WatchEvent::Added(_) => added += 1,
            WatchEvent::Bookmark(b) => {
                assert_eq!(initial_events_end(&b), Some("true"));
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(added, 2);
}

async fn a_watch_with_a_selector_sees_objects_enter_and_leave(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    let api = machines(&client, "default");
    create_machine(&client, "default", "m").await;
    let rv = api.list_rv().await;
    let mut s = api
        .events(&WatchParams::default().labels("role=worker"), &rv)
        .await;
    api.merge("m", json!({"metadata": {"labels": {"role": "worker"}}}))
        .await;
    api.merge("m", json!({"spec": {"vcpu": 4}})).await;
    let left = api
        .merge("m", json!({"metadata": {"labels": {"role": "cp"}}}))
        .await;
    api.merge("m", json!({"spec": {"vcpu": 5}})).await;
    api.merge("m", json!({"metadata": {"labels": {"role": "worker"}}}))
        .await;
    let mut seen = Vec::new();
    for _ in 0..4 {
        match next_event(&mut s).await {
            WatchEvent::Added(o) => seen.push(format!("ADDED {}", o.data["spec"]["vcpu"])),
            WatchEvent::Modified(o) => seen.push(format!("MODIFIED {}", o.data["spec"]["vcpu"])),
            WatchEvent::Deleted(o) => {
                // As from the real watch cache: the object as it last matched (role=worker), at the
                // revision of the change that made it leave.
                assert_eq!(
                    o.labels().get("role").map(String::as_str),
                    Some("worker"),
                    "{o:?}"
                );
                assert_eq!(rv_of(&o), rv_of(&left));
                seen.push(format!("DELETED {}", o.data["spec"]["vcpu"]))
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(seen, vec!["ADDED 2", "MODIFIED 4", "DELETED 4", "ADDED 5"]);
    // Replayed from the history, the same.
    let replayed: Vec<_> = api
        .watch(
            &WatchParams::default().labels("role=worker").timeout(1),
            &rv,
        )
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let deleted = replayed
        .iter()
        .find_map(|e| match e {
            WatchEvent::Deleted(o) => Some(o),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        deleted.labels().get("role").map(String::as_str),
        Some("worker")
    );
    assert_eq!(rv_of(deleted), rv_of(&left));
}

async fn a_watch_on_a_named_path_watches_that_object_only(server: Server) {
    let client = server.client();
    install_project_crds(&client).await;
    let api = machines(&client, "default");
    create_machine(&client, "default", "m").await;
    create_machine(&client, "default", "n").await;
    let base = "/apis/infrastructure.cluster.x-k8s.io/v1alpha2";
    let rv = api.list_rv().await;
    let lines = |r: &Raw| -> Vec<(String, String)> {
        r.text
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                (
                    v["type"].as_str().unwrap().to_string(),
                    v["object"]["metadata"]["name"]
                        .as_str()
                        .unwrap_or("")
                        .to_string(),
                )
            })
            .collect()
    };
    let pair = |t: &str, n: &str| (t.to_string(), n.to_string());
    if let Some(emu) = server.emulator_handle() {
        emu.reset_counters();
    }

    // A GET of m's watch path from this resourceVersion, for two seconds, in the background.
    let watch_m = |from: String| {
        let client = client.clone();
        tokio::spawn(async move {
            raw(
                &client,
                "GET",
                &format!("{base}/watch/namespaces/default/microvmmachines/m?resourceVersion={from}&timeoutSeconds=2"),
                None,
                b"",
            )
            .await
        })
    };
    // From "0": the object as ADDED, then its changes; the other object is not seen.
    let watch = watch_m("0".to_string());
    // From a resourceVersion: only the changes after it.
    let from_rv = watch_m(rv);
    tokio::time::sleep(Duration::from_millis(300)).await;
    for name in ["n", "m"] {
        api.merge(name, json!({"spec": {"vcpu": 3}})).await;
    }
    let watch = watch.await.unwrap();
    assert_eq!(watch.status, 200, "{}", watch.text);
    assert_eq!(
        lines(&watch),
        vec![pair("ADDED", "m"), pair("MODIFIED", "m")]
    );
    let from_rv = from_rv.await.unwrap();
    assert_eq!(lines(&from_rv), vec![pair("MODIFIED", "m")]);
    // Two watches counted (the emulator's request counters; the real server has no such counters).
    if let Some(emu) = server.emulator_handle() {
        assert_eq!(
            emu.counters().get(
                capmvm_kube_emulator::Verb::Watch,
                "infrastructure.cluster.x-k8s.io/microvmmachines"
            ),
            2
        );
    }

    // The legacy core path.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for name in ["c", "d"] {
        cms.create_json(json!({"metadata": {"name": name}})).await;
    }
    let core = raw(
        &client,
        "GET",
        "/api/v1/watch/namespaces/default/configmaps/c?resourceVersion=0&timeoutSeconds=1",
        None,
        b"",
    )
    .await;
    assert_eq!(lines(&core), vec![pair("ADDED", "c")]);

    // A field selector must name the same object; the watch paths take GET only.
    let other = raw(
        &client,
        "GET",
        "/api/v1/watch/namespaces/default/configmaps/c?fieldSelector=metadata.name%3Dd",
        None,
        b"",
    )
    .await;
    assert_status(&other, 400, "BadRequest");
    let post = raw(
        &client,
        "POST",
        "/api/v1/watch/namespaces/default/configmaps",
        Some("application/json"),
        br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}"#,
    )
    .await;
    assert_status(&post, 405, "MethodNotAllowed");
    // `?watch=true` on a named path is a plain GET on a real server.
    let get = raw(
        &client,
        "GET",
        "/api/v1/namespaces/default/configmaps/c?watch=true",
        None,
        b"",
    )
    .await;
    assert_eq!(get.status, 200);
    assert_eq!(get.body["kind"], "ConfigMap");
}

async fn reads_from_a_resource_version_not_reached_yet(server: Server) {
    let client = server.client();
    let no_retry = server.client_without_retries().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let create = |name: String| {
        let cms = cms.clone();
        async move {
            let c = cms.create_json(json!({"metadata": {"name": name}})).await;
            c.metadata.resource_version.unwrap().parse::<u64>().unwrap()
        }
    };
    let now: u64 = cms.list_rv().await.parse().unwrap();

    // A watch from a future resourceVersion starts and sends only the changes after it (a real server
    // "may wait indefinitely" for it): not the ones on the way there. (A real server writes too, its
    // own leases: which of these creates come after it depends on them.)
    let future = now + 2;
    let mut s = cms
        .events(&WatchParams::default(), &future.to_string())
        .await;
    let mut created = Vec::new();
    for i in 1..=3 {
        created.push((format!("c{i}"), create(format!("c{i}")).await));
    }
    let first_after = created
        .iter()
        .find(|(_, rv)| *rv > future)
        .map(|(n, _)| n.clone());
    assert!(first_after.is_some(), "{created:?}");
    match next_event(&mut s).await {
        WatchEvent::Added(o) => assert_eq!(o.metadata.name, first_after, "{created:?}"),
        other => panic!("expected ADDED {first_after:?}, got {other:?}"),
    }

    // A list waits briefly for the version it asks for (the next write's): it answers once that
    // version is reached, with it.
    let now = created[2].1;
    let started = std::time::Instant::now();
    let later = {
        let cms = cms.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let late = cms.create_json(json!({"metadata": {"name": "late"}})).await;
            late.metadata
                .resource_version
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
    };
    let list = cms
        .list(&ListParams::default().at(&(now + 1).to_string()))
        .await
        .unwrap();
    let waited = started.elapsed();
    let late_rv = later.await.unwrap();
    let list_rv: u64 = list.metadata.resource_version.unwrap().parse().unwrap();
    assert!(list_rv > now, "{list_rv} {now}");
    let has_late = list
        .items
        .iter()
        .any(|c| c.metadata.name.as_deref() == Some("late"));
    // The real server's own writes may reach that version first; without them (the emulator has
    // none) the list waited for "late".
    assert_eq!(has_late, list_rv >= late_rv, "{list_rv} {late_rv}");
    if !has_late {
        assert!(server.is_real(), "only a real server writes by itself");
    } else {
        assert!(waited >= Duration::from_millis(400), "{waited:?}");
    }
    let now = cms.list_rv().await.parse::<u64>().unwrap();

    // ...and then, as a GET does, fails with the real server's "Too large resource version"; a
    // watch with sendInitialEvents (whose initial state must be that fresh) fails the same way, as an
    // ERROR event.
    let too_large = |r: &Value| {
        assert_eq!(r["code"], 504, "{r}");
        assert_eq!(r["reason"], "Timeout", "{r}");
        let message = r["message"].as_str().unwrap();
        let prefix = format!(
            "Timeout: Too large resource version: {}, current: ",
            now + 100
        );
        let current: u64 = message
            .strip_prefix(&prefix)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{r}"));
        assert!(current >= now && current < now + 100, "{r}");
        assert_eq!(
            r["details"]["causes"][0]["reason"], "ResourceVersionTooLarge",
            "{r}"
        );
        assert_eq!(r["details"]["retryAfterSeconds"], 1, "{r}");
    };
    let started = std::time::Instant::now();
    let base = "/api/v1/namespaces/default/configmaps";
    let future = now + 100;
    let list_path = format!("{base}?resourceVersion={future}");
    let get_path = format!("{base}/c1?resourceVersion={future}");
    let watch_path = format!(
        "{base}?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&resourceVersion={future}"
    );
    let (list, get, watch) = tokio::join!(
        raw(&no_retry, "GET", &list_path, None, b""),
        raw(&no_retry, "GET", &get_path, None, b""),
        raw(&no_retry, "GET", &watch_path, None, b""),
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(2500) && waited < Duration::from_secs(10),
        "{waited:?}"
    );
    assert_status(&list, 504, "Timeout");
    too_large(&list.body);
    assert_status(&get, 504, "Timeout");
    assert_eq!(list.headers.get("retry-after").unwrap(), "1");
    assert_eq!(watch.status, 200, "{}", watch.text);
    assert_eq!(watch.body["type"], "ERROR", "{}", watch.text);
    too_large(&watch.body["object"]);
}

/// `watch` and the other boolean parameters are read as the real server converts them: absent, `0`
/// or `false` in any case is false; any other value, an empty one included, is true, and none is
/// refused. The first of repeated values counts.
async fn boolean_parameters_are_false_only_for_false_or_zero(server: Server) {
    let client = server.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create_json(json!({"metadata": {"name": "c"}})).await;
    let base = "/api/v1/namespaces/default/configmaps";
    for list in [
        "watch=false",
        "watch=FALSE",
        "watch=False",
        "watch=0",
        "watch=false&watch=true",
    ] {
        let r = raw(&client, "GET", &format!("{base}?{list}"), None, b"").await;
        assert_eq!(r.status, 200, "{list}: {}", r.text);
        assert_eq!(r.body["kind"], "ConfigMapList", "{list}: a list");
    }
    for watch in [
        "watch=true",
        "watch=1",
        "watch=yes",
        "watch=TRUE",
        "watch=",
        "watch",
    ] {
        let r = raw(
            &client,
            "GET",
            &format!("{base}?{watch}&resourceVersion=0&timeoutSeconds=1"),
            None,
            b"",
        )
        .await;
        assert_eq!(r.status, 200, "{watch}: {}", r.text);
        let first: Value = serde_json::from_str(r.text.lines().next().unwrap_or("")).unwrap();
        assert_eq!(first["type"], "ADDED", "{watch}: a watch, {}", r.text);
        assert_eq!(first["object"]["metadata"]["name"], "c");
    }
    // allowWatchBookmarks likewise: `yes` and an empty value ask for the initial-events-end bookmark.
    for (bookmarks, expected) in [("yes", true), ("", true), ("FALSE", false), ("0", false)] {
        let r = raw(
            &client,
            "GET",
            &format!(
                "{base}?watch=true&allowWatchBookmarks={bookmarks}&resourceVersion=0&timeoutSeconds=1"
            ),
            None,
            b"",
        )
        .await;
        assert_eq!(r.status, 200, "{bookmarks}: {}", r.text);
        let has_bookmark = r
            .text
            .lines()
            .any(|l| serde_json::from_str::<Value>(l).is_ok_and(|e| e["type"] == "BOOKMARK"));
        assert_eq!(
            has_bookmark, expected,
            "allowWatchBookmarks={bookmarks}: {}",
            r.text
        );
    }
}

async fn watch_timeout_ends_cleanly(server: Server) {
    let client = server.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let started = std::time::Instant::now();
    let mut s = cms.events(&WatchParams::default().timeout(1), "0").await;
    // Nothing exists: only the bookmark that ends the (empty) initial state, then the end.
    let first = s.try_next().await.unwrap();
    assert!(matches!(first, Some(WatchEvent::Bookmark(_))), "{first:?}");
    let next = s.try_next().await.unwrap();
    assert!(next.is_none(), "{next:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(900)
            && started.elapsed() < Duration::from_secs(5)
    );
}

crate::on_both_servers!(
    watch_streams_added_modified_deleted_and_bookmarks,
    watch_from_a_resource_version_replays_in_order_and_from_zero_lists_first,
    a_watch_with_a_selector_sees_objects_enter_and_leave,
    a_watch_on_a_named_path_watches_that_object_only,
    reads_from_a_resource_version_not_reached_yet,
    watch_timeout_ends_cleanly,
    boolean_parameters_are_false_only_for_false_or_zero,
);
