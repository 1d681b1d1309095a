//! The background tasks of a running emulator: the garbage collector (dependents of removed owners,
//! orphaning, foreground deletion, the contents of deleted namespaces and CRDs), as the real
//! kube-controller-manager's controllers do it, and the periodic watch bookmarks.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::meta;
use super::ops::{DeleteOpts, Shared, delete_locked, update_locked};
use super::registry;
use super::store::{CRD_CLEANUP_FINALIZER, CRDS, GcItem, NAMESPACES, ObjKey, Propagation, Store};

/// Runs garbage collection and namespace/CRD cleanup until shutdown.
pub(crate) async fn gc_worker(shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.clone();
    loop {
        tokio::select! {
            () = shared.gc_notify.notified() => {}
            _ = shutdown.changed() => return,
        }
        while gc_step(&shared) {
            // Let requests in between items.
            tokio::task::yield_now().await;
        }
    }
}

/// Processes one queued item; false when the queue is empty.
fn gc_step(shared: &Shared) -> bool {
    let mut store = shared.lock();
    let Some(item) = store.dequeue() else {
        return false;
    };
    process_gc(&mut store, item);
    true
}

fn background() -> DeleteOpts {
    DeleteOpts {
        propagation: Propagation::Background,
        uid: None,
        resource_version: None,
        dry_run: false,
    }
}

fn process_gc(store: &mut Store, item: GcItem) {
    match item {
        GcItem::OwnerGone(uid) => {
            for (s, k) in store.dependents_of(&uid) {
                store.enqueue(GcItem::Dependent(s, k));
            }
        }
        GcItem::Dependent(storage, key) => {
            let Some(obj) = store.get(&storage, &key) else {
                return;
            };
            let owners = meta::owner_uids(obj.value());
            if owners.is_empty() {
                return;
            }
            let alive: Vec<&String> = owners
                .iter()
                .filter(|u| store.owner_alive(u, &key.ns))
                .collect();
            if alive.is_empty() {
                tracing::debug!(resource = %storage, namespace = %key.ns, name = %key.name, "garbage collecting an object whose owners are gone");
                let _ = delete_locked(store, &storage, &key, &background());
            } else if alive.len() < owners.len() {
                let alive: Vec<String> = alive.into_iter().cloned().collect();
                update_locked(store, &storage, &key, |v| {
                    if let Some(Value::Array(refs)) =
                        meta::metadata_mut(v).get_mut("ownerReferences")
                    {
                        refs.retain(|r| {
                            r.get("uid")
                                .and_then(Value::as_str)
                                .is_some_and(|u| alive.iter().any(|a| a == u))
                        });
                    }
                });
            }
        }
        GcItem::Orphan(storage, key) => {
            let Some(obj) = store.get(&storage, &key) else {
                return;
            };
            let uid = meta::meta_str(obj.value(), "uid").to_string();
            for (s, k) in store.dependents_of(&uid) {
                update_locked(store, &s, &k, |v| {
                    let m = meta::metadata_mut(v);
                    if let Some(Value::Array(refs)) = m.get_mut("ownerReferences") {
                        refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid.as_str()));
                        if refs.is_empty() {
                            m.remove("ownerReferences");
                        }
                    }
                });
            }
            remove_finalizer(store, &storage, &key, "orphan");
        }
        GcItem::Foreground(storage, key) => {
            let Some(obj) = store.get(&storage, &key) else {
                return;
            };
            if !meta::is_deleting(obj.value()) {
                return;
            }
            let uid = meta::meta_str(obj.value(), "uid").to_string();
            let mut blocking = false;
            for (s, k) in store.dependents_of(&uid) {
                let Some(dep) = store.get(&s, &k) else {
                    continue;
                };
                let blocks = meta::metadata(dep.value())
                    .and_then(|m| m.get("ownerReferences"))
                    .and_then(Value::as_array)
                    .is_some_and(|refs| {
                        refs.iter().any(|r| {
                            r.get("uid").and_then(Value::as_str) == Some(uid.as_str())
                                && r.get("blockOwnerDeletion").and_then(Value::as_bool)
                                    == Some(true)
                        })
                    });
                blocking |= blocks;
                let _ = delete_locked(store, &s, &k, &background());
            }
            if !blocking {
                remove_finalizer(store, &storage, &key, "foregroundDeletion");
            }
        }
        GcItem::Namespace(ns) => {
            if store.namespace_state(&ns) != Some(true) {
                return;
            }
            let objects = store.objects_in_namespace(&ns);
            for (s, k) in &objects {
                let _ = delete_locked(store, s, k, &background());
            }
            if store.objects_in_namespace(&ns).is_empty() {
                let ns_storage: Arc<str> = Arc::from(NAMESPACES);
                update_locked(store, &ns_storage, &ObjKey::new("", &ns), |v| {
                    if let Some(Value::Array(f)) = v.pointer_mut("/spec/finalizers") {
                        f.retain(|x| x != "kubernetes");
                    }
                });
            }
        }
        GcItem::Crd(name) => {
            let crds: Arc<str> = Arc::from(CRDS);
            let key = ObjKey::new("", &name);
            let Some(crd) = store.get(&crds, &key) else {
                return;
            };
            if !meta::is_deleting(crd.value()) {
                return;
            }
            let group = crd
                .value()
                .pointer("/spec/group")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let plural = crd
                .value()
                .pointer("/spec/names/plural")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let storage = registry::storage_key(&group, &plural);
            store.crd_terminating(&storage);
            let keys: Vec<ObjKey> = store
                .collections
                .get(&storage)
                .map(|c| c.objects.keys().cloned().collect())
                .unwrap_or_default();
            for k in keys {
                let _ = delete_locked(store, &storage, &k, &background());
            }
            if store.crd_terminating(&storage) {
                remove_finalizer(store, &crds, &key, CRD_CLEANUP_FINALIZER);
            }
        }
    }
}

fn remove_finalizer(store: &mut Store, storage: &Arc<str>, key: &ObjKey, finalizer: &str) {
    update_locked(store, storage, key, |v| {
        let m = meta::metadata_mut(v);
        if let Some(Value::Array(f)) = m.get_mut("finalizers") {
            f.retain(|x| x != finalizer);
            if f.is_empty() {
                m.remove("finalizers");
            }
        }
    });
}

/// Sends bookmarks periodically until shutdown.
pub(crate) async fn bookmark_ticker(shared: Arc<Shared>, every: Duration) {
    let mut shutdown = shared.shutdown.clone();
    // The first tick of an interval is immediate; bookmarks start one interval after the server.
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => shared.lock().send_bookmarks(),
            _ = shutdown.changed() => return,
        }
    }
}
