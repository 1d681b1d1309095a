#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Benchmark of the Kubernetes API emulator (not a timed test): creates/s, merge patches/s, list latency
//! at 10 000 objects and watch event latency with 20 watchers, all through kube-rs over loopback HTTP
//! with the clients in the same process (so the numbers include the client's own work).
//!
//! Run: `cargo bench -p capmvm-kube-emulator --bench kube_emulator` (set `KUBE_BENCH_OBJECTS` to change 10 000,
//! `KUBE_BENCH_MANAGED_FIELDS=0` to leave out the managedFields entries).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use capmvm_kube_emulator::{Emulator, EmulatorOptions};
use futures::{StreamExt, TryStreamExt};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
    WatchEvent, WatchParams,
};
use serde_json::{Value, json};

const CONCURRENCY: usize = 16;
const WATCHERS: usize = 20;

/// The store's current resourceVersion, from a one-item list (where a watch starts).
async fn current_rv(api: &Api<DynamicObject>) -> String {
    api.list(&ListParams::default().limit(1))
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap()
}

fn machine_ar() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "infrastructure.cluster.x-k8s.io",
            "v1alpha2",
            "MicrovmMachine",
        ),
        "microvmmachines",
    )
}

fn machine(name: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha2",
        "kind": "MicrovmMachine",
        "metadata": {"name": name, "labels": {"cluster.x-k8s.io/cluster-name": "bench"}},
        "spec": {
            "kernel": {"image": "ghcr.io/liquidmetal-dev/flintlock-kernel:6.1.55", "filename": "boot/vmlinux"},
            "kernelCmdline": {"console": "ttyS0", "reboot": "k", "panic": "1"},
            "memoryMb": 2048,
            "vcpu": 2,
            "rootVolume": {"id": "root", "image": "ghcr.io/liquidmetal-dev/capmvm-k8s-os:1.33.0"},
            "networkInterfaces": [{"guestDeviceName": "eth1", "type": "tap"}],
            "sshPublicKeys": [{"user": "root", "authorizedKeys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBenchmarkKeyBenchmarkKeyBenchmarkKey bench"]}]
        }
    }))
    .unwrap()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

async fn install_crds(client: &kube::Client) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/crd/bases");
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
        "customresourcedefinitions",
    );
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for f in files {
        let v: Value = serde_saphyr::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
        api.create(&PostParams::default(), &serde_json::from_value(v).unwrap())
            .await
            .unwrap();
    }
}

fn main() {
    let objects: usize = std::env::var("KUBE_BENCH_OBJECTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(objects));
}

async fn run(objects: usize) {
    // KUBE_BENCH_MANAGED_FIELDS=0 leaves out the managedFields entries every write records.
    let managed_fields = std::env::var("KUBE_BENCH_MANAGED_FIELDS").map_or(true, |v| v != "0");
    let emu = Emulator::start(
        EmulatorOptions::default()
            .history_limit(20_000)
            .managed_fields(managed_fields),
    )
    .await
    .unwrap();
    let client = emu.client().unwrap();
    install_crds(&client).await;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &machine_ar());
    println!(
        "Kubernetes API emulator benchmark: {objects} MicrovmMachines, {CONCURRENCY} requests in flight, kube-rs clients in the same process, 2 tokio workers"
    );

    // Creates.
    let started = Instant::now();
    futures::stream::iter(0..objects)
        .map(|i| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &machine(&format!("m{i:05}")))
                    .await
                    .unwrap()
            }
        })
        .buffer_unordered(CONCURRENCY)
        .for_each(|_| async {})
        .await;
    let create_secs = started.elapsed().as_secs_f64();
    let creates_per_s = objects as f64 / create_secs;
    println!("creates:        {creates_per_s:>9.0}/s ({objects} in {create_secs:.2} s)");

    // Merge patches of status without a resourceVersion precondition (the emulator retries them on a
    // concurrent write, as a real server does), each changing the object once.
    let started = Instant::now();
    futures::stream::iter(0..objects)
        .map(|i| {
            let api = api.clone();
            async move {
                let name = format!("m{i:05}");
                let patch = json!({"status": {"host": "10.0.0.1:9090", "vmState": "running", "conditions": [
                    {"type": "Ready", "status": "True", "reason": "Running", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(patch)).await.unwrap()
            }
        })
        .buffer_unordered(CONCURRENCY)
        .for_each(|_| async {})
        .await;
    let patch_secs = started.elapsed().as_secs_f64();
    let patches_per_s = objects as f64 / patch_secs;
    println!("merge patches:  {patches_per_s:>9.0}/s ({objects} in {patch_secs:.2} s)");
    let rss_after_writes = rss_mib();

    // List latency at `objects` objects: whole lists, and paginated by 500 as kube-runtime's watcher does.
    let mut full = Vec::new();
    for _ in 0..30 {
        let t = Instant::now();
        let list = api.list(&ListParams::default()).await.unwrap();
        full.push(t.elapsed());
        assert_eq!(list.items.len(), objects);
    }
    full.sort();
    let mut paged = Vec::new();
    for _ in 0..10 {
        let t = Instant::now();
        let mut n = 0;
        let mut token: Option<String> = None;
        loop {
            let mut lp = ListParams::default().limit(500);
            if let Some(c) = &token {
                lp = lp.continue_token(c);
            }
            let page = api.list(&lp).await.unwrap();
            n += page.items.len();
            token = page.metadata.continue_;
            if token.is_none() {
                break;
            }
        }
        paged.push(t.elapsed());
        assert_eq!(n, objects);
    }
    paged.sort();
    // The same list as raw bytes (what the server does, without the client decoding 10 000 objects).
    let mut raw = Vec::new();
    for _ in 0..30 {
        let t = Instant::now();
        let req = axum::http::Request::get(
            "/apis/infrastructure.cluster.x-k8s.io/v1alpha2/namespaces/default/microvmmachines",
        )
        .body(kube::client::Body::empty())
        .unwrap();
        let bytes = client
            .send(req)
            .await
            .unwrap()
            .into_body()
            .collect_bytes()
            .await
            .unwrap();
        raw.push(t.elapsed());
        assert!(bytes.len() > objects * 500);
    }
    raw.sort();
    let mut selected = Vec::new();
    for _ in 0..30 {
        let t = Instant::now();
        let list = api
            .list(
                &ListParams::default()
                    .labels("cluster.x-k8s.io/cluster-name=bench")
                    .fields("metadata.name=m00042"),
            )
            .await
            .unwrap();
        selected.push(t.elapsed());
        assert_eq!(list.items.len(), 1);
    }
    selected.sort();
    println!(
        "list {objects} objects:   p50 {}  p99 {}  (kube-rs decoding included; raw bytes: p50 {}  p99 {}; paged by 500: p50 {}  p99 {}; one by field selector: p50 {})",
        ms(percentile(&full, 0.5)),
        ms(percentile(&full, 0.99)),
        ms(percentile(&raw, 0.5)),
        ms(percentile(&raw, 0.99)),
        ms(percentile(&paged, 0.5)),
        ms(percentile(&paged, 0.99)),
        ms(percentile(&selected, 0.5)),
    );

    // Watch event latency with 20 watchers: from just before the write is sent to each watcher's receipt.
    let rv = current_rv(&api).await;
    let sent: Arc<Mutex<HashMap<u64, Instant>>> = Arc::new(Mutex::new(HashMap::new()));
    let writes: u64 = 2_000;
    let mut handles = Vec::new();
    for _ in 0..WATCHERS {
        // Every watcher has its own connection, as separate controllers would.
        let wclient = emu.client().unwrap();
        let wapi: Api<DynamicObject> = Api::namespaced_with(wclient, "default", &machine_ar());
        let stream = wapi.watch(&WatchParams::default(), &rv).await.unwrap();
        let sent = sent.clone();
        handles.push(tokio::spawn(async move {
            let mut stream = stream.boxed();
            let mut lat = Vec::with_capacity(writes as usize);
            while (lat.len() as u64) < writes {
                match stream.try_next().await.unwrap() {
                    Some(WatchEvent::Modified(o)) => {
                        let seq = o
                            .metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get("bench/seq"))
                            .and_then(|s| s.parse::<u64>().ok());
                        let Some(seq) = seq else { continue };
                        let at = sent.lock().unwrap().get(&seq).copied();
                        if let Some(at) = at {
                            lat.push(at.elapsed());
                        }
                    }
                    Some(_) => {}
                    None => break,
                }
            }
            lat
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Paced writes (one every 2 ms, 500/s) so latency is measured below saturation.
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(2));
    for seq in 0..writes {
        tick.tick().await;
        let name = format!("m{:05}", seq as usize % objects);
        sent.lock().unwrap().insert(seq, Instant::now());
        let patch = json!({"metadata": {"annotations": {"bench/seq": seq.to_string()}}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .unwrap();
    }
    let mut lat = Vec::new();
    for h in handles {
        lat.extend(h.await.unwrap());
    }
    let watch_secs = started.elapsed().as_secs_f64();
    lat.sort();
    println!(
        "watch latency:  p50 {}  p99 {}  ({} events to {WATCHERS} watchers, {writes} writes at 500/s, {watch_secs:.1} s)",
        ms(percentile(&lat, 0.5)),
        ms(percentile(&lat, 0.99)),
        lat.len()
    );
    lifecycle(&emu, 2_000).await;
    let stats = emu.stats();
    println!(
        "process RSS after {objects} creates and patches: {rss_after_writes:.0} MiB; now {:.0} MiB (history {} events, {} watchers closed for slowness)",
        rss_mib(),
        stats.history,
        stats.slow_watchers_closed
    );
    emu.shutdown().await;
}

/// A 2000-machine lifecycle as the operator drives it, with 10 watchers: create, finalizer added by a JSON
/// patch with a `test`, three conditional status merge patches, an Event, delete (held by the
/// finalizer), finalizer removed (the object goes).
async fn lifecycle(emu: &capmvm_kube_emulator::EmulatorHandle, machines: usize) {
    let client = emu.client().unwrap();
    let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    ns.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "life"}})).unwrap(),
    )
    .await
    .unwrap();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "life", &machine_ar());
    let rv = current_rv(&api).await;
    let mut watchers = Vec::new();
    for _ in 0..10 {
        let wapi: Api<DynamicObject> =
            Api::namespaced_with(emu.client().unwrap(), "life", &machine_ar());
        let stream = wapi.watch(&WatchParams::default(), &rv).await.unwrap();
        watchers.push(tokio::spawn(async move {
            let mut stream = stream.boxed();
            let mut deleted = 0;
            let mut events = 0u64;
            while deleted < machines {
                match stream.try_next().await.unwrap() {
                    Some(WatchEvent::Deleted(_)) => {
                        deleted += 1;
                        events += 1;
                    }
                    Some(WatchEvent::Bookmark(_)) => {}
                    Some(_) => events += 1,
                    None => break,
                }
            }
            events
        }));
    }
    let before = emu.counters();
    let started = Instant::now();
    futures::stream::iter(0..machines)
        .map(|i| {
            let api = api.clone();
            let client = client.clone();
            async move {
                let name = format!("life{i:05}");
                api.create(&PostParams::default(), &machine(&name)).await.unwrap();
                let fin: json_patch::Patch = serde_json::from_value(json!([
                    {"op": "test", "path": "/metadata/finalizers", "value": null},
                    {"op": "add", "path": "/metadata/finalizers", "value": ["microvmmachine.infrastructure.cluster.x-k8s.io"]}
                ]))
                .unwrap();
                let mut obj = api.patch(&name, &PatchParams::default(), &Patch::<()>::Json(fin)).await.unwrap();
                for state in ["pending", "running", "running"] {
                    let patch = json!({"metadata": {"resourceVersion": obj.metadata.resource_version}, "status": {"vmState": state, "host": "10.0.0.1:9090"}});
                    obj = api.patch_status(&name, &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
                }
                let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client, "life");
                let ev = json!({"metadata": {"name": format!("{name}.1")}, "eventTime": "2026-01-01T00:00:00.000000Z",
                    "reportingController": "capmvm", "reportingInstance": "capmvm-0", "action": "Provision", "reason": "Created",
                    "type": "Normal", "note": "microVM created", "regarding": {"kind": "MicrovmMachine", "name": name, "namespace": "life"}});
                events.create(&PostParams::default(), &serde_json::from_value(ev).unwrap()).await.unwrap();
                api.delete(&name, &kube::api::DeleteParams::default()).await.unwrap();
                let unfin: json_patch::Patch = serde_json::from_value(json!([
                    {"op": "test", "path": "/metadata/finalizers/0", "value": "microvmmachine.infrastructure.cluster.x-k8s.io"},
                    {"op": "remove", "path": "/metadata/finalizers/0"}
                ]))
                .unwrap();
                api.patch(&name, &PatchParams::default(), &Patch::<()>::Json(unfin)).await.unwrap();
            }
        })
        .buffer_unordered(CONCURRENCY)
        .for_each(|_| async {})
        .await;
    let writes = emu.counters().since(&before).total();
    let mut delivered = 0;
    for w in watchers {
        delivered += w.await.unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{machines}-machine lifecycle: {writes} requests in {secs:.2} s ({:.0}/s), {delivered} events to 10 watchers",
        writes as f64 / secs
    );
}
