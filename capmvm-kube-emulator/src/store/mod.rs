//! The store: one ordered map of objects per resource behind one lock, a global revision counter (as
//! etcd's), a bounded history of changes for watch resumption and consistent pagination, and the
//! watchers, each fed through a bounded channel with the serialised object shared among them.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use axum::body::Bytes;
use serde_json::{Value, json};

use super::error::ApiError;
use super::meta;
use super::registry::{Builtin, Registry, ResourceDef, defs_from_crd, storage_key};

mod watch;
use watch::WatcherSlot;
pub(crate) use watch::{Event, EventType, Filter, WatchMsg};

/// An object as stored: the value (with its `resourceVersion`) and its JSON encoding, shared by every
/// reader and watcher.
#[derive(Debug)]
pub(crate) struct Stored {
    /// The parsed object: set at write time for current objects; history copies parse their bytes on
    /// first use, so superseded versions cost their bytes only.
    value: std::sync::OnceLock<Value>,
    pub(crate) bytes: Bytes,
    pub(crate) rv: u64,
    /// Watch event lines (ADDED, MODIFIED, DELETED), built once on first use and shared by all watchers.
    frames: [std::sync::OnceLock<Bytes>; 3],
}

impl Stored {
    fn new(mut value: Value, rv: u64) -> Self {
        meta::metadata_mut(&mut value)
            .insert("resourceVersion".into(), Value::String(rv.to_string()));
        let bytes = encode(&value);
        Self {
            value: std::sync::OnceLock::from(value),
            bytes,
            rv,
            frames: Default::default(),
        }
    }

    /// An object that is not in the store (the answer to a dry run).
    pub(crate) fn detached(value: Value, bytes: Bytes) -> Self {
        Self {
            value: std::sync::OnceLock::from(value),
            bytes,
            rv: 0,
            frames: Default::default(),
        }
    }

    /// The copy the history keeps: the same bytes, no parsed value.
    fn history_copy(&self) -> Self {
        Self {
            value: std::sync::OnceLock::new(),
            bytes: self.bytes.clone(),
            rv: self.rv,
            frames: Default::default(),
        }
    }

    /// The object. Stored bytes are always valid JSON (they were encoded from a value).
    pub(crate) fn value(&self) -> &Value {
        self.value
            .get_or_init(|| serde_json::from_slice(&self.bytes).unwrap_or(Value::Null))
    }

    /// The watch event line `{"type":...,"object":...}` for this object as stored.
    pub(crate) fn frame(&self, ty: EventType) -> Bytes {
        let idx = match ty {
            EventType::Added => 0,
            EventType::Modified => 1,
            EventType::Deleted => 2,
        };
        self.frames[idx]
            .get_or_init(|| event_line(ty.as_str(), &self.bytes))
            .clone()
    }
}

/// `{"type":"<ty>","object":<object>}` and a newline.
pub(crate) fn event_line(ty: &str, object: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(object.len() + ty.len() + 24);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(ty.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    out.extend_from_slice(object);
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

/// Serialises a value; a `Value` always serialises.
pub(crate) fn encode(v: &Value) -> Bytes {
    Bytes::from(serde_json::to_vec(v).unwrap_or_else(|_| b"{}".to_vec()))
}

/// The key of an object in its collection; cluster-scoped objects have an empty namespace. Ordered as
/// etcd orders `/registry/<resource>/<namespace>/<name>`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ObjKey {
    pub(crate) ns: String,
    pub(crate) name: String,
}

impl ObjKey {
    pub(crate) fn new(ns: &str, name: &str) -> Self {
        Self {
            ns: ns.to_string(),
            name: name.to_string(),
        }
    }
}

/// One resource's objects and watchers.
pub(crate) struct Collection {
    pub(crate) def: Arc<ResourceDef>,
    pub(crate) objects: BTreeMap<ObjKey, Arc<Stored>>,
    watchers: Vec<WatcherSlot>,
    /// Set while the defining CRD is being deleted: no new objects.
    pub(crate) terminating: bool,
}

/// Background work: garbage collection, namespace and CRD cleanup.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum GcItem {
    OwnerGone(String),
    Dependent(Arc<str>, ObjKey),
    Namespace(String),
    Crd(String),
    Orphan(Arc<str>, ObjKey),
    Foreground(Arc<str>, ObjKey),
}

/// How a delete treats dependents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Propagation {
    Background,
    Foreground,
    Orphan,
}

/// The outcome of a write.
#[derive(Debug, Clone)]
pub(crate) enum Written {
    /// Stored (created, or changed).
    Stored(Arc<Stored>),
    /// Nothing changed: no new revision.
    Unchanged(Arc<Stored>),
    /// Removed from the store; the object carries the deletion's revision.
    Removed(Arc<Stored>),
}

impl Written {
    pub(crate) fn object(&self) -> &Arc<Stored> {
        match self {
            Self::Stored(s) | Self::Unchanged(s) | Self::Removed(s) => s,
        }
    }
}

/// Whether a write found the object as the caller read it.
#[derive(Debug)]
pub(crate) enum CommitError {
    /// Changed since it was read: read again and retry (or 409 for a conditional write).
    Stale,
    Api(ApiError),
}

impl From<ApiError> for CommitError {
    fn from(e: ApiError) -> Self {
        Self::Api(e)
    }
}

pub(crate) const NAMESPACES: &str = "/namespaces";
pub(crate) const CRDS: &str = "apiextensions.k8s.io/customresourcedefinitions";
pub(crate) const CRD_CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// The store's state; always used behind the emulator's one lock.
pub(crate) struct Store {
    pub(crate) rev: u64,
    pub(crate) registry: Registry,
    pub(crate) collections: HashMap<Arc<str>, Collection>,
    history: VecDeque<Arc<Event>>,
    history_limit: usize,
    /// The newest revision dropped from the history: watches and snapshots need a later one.
    compacted: u64,
    uids: HashMap<String, (Arc<str>, ObjKey)>,
    dependents: HashMap<String, HashSet<(Arc<str>, ObjKey)>>,
    gc_queue: VecDeque<GcItem>,
    /// What `gc_queue` holds, so that an item is queued once (deleting a namespace's objects would
    /// otherwise queue the namespace once per object).
    gc_queued: HashSet<GcItem>,
    next_watcher_id: u64,
    watch_buffer: usize,
    /// Watchers closed because they did not keep up.
    pub(crate) slow_watchers_closed: u64,
    /// The current revision, for requests waiting for a resourceVersion to be reached.
    rev_tx: tokio::sync::watch::Sender<u64>,
}

impl Store {
    pub(crate) fn new(history_limit: usize, watch_buffer: usize) -> Self {
        let registry = Registry::with_builtins();
        let mut collections = HashMap::new();
        for def in registry.all() {
            if def.builtin == Some(Builtin::EventV1) {
                continue;
            }
            collections.insert(
                def.storage.clone(),
                Collection {
                    def: def.clone(),
                    objects: BTreeMap::new(),
                    watchers: Vec::new(),
                    terminating: false,
                },
            );
        }
        let mut store = Self {
            rev: 0,
            registry,
            collections,
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            compacted: 0,
            uids: HashMap::new(),
            dependents: HashMap::new(),
            gc_queue: VecDeque::new(),
            gc_queued: HashSet::new(),
            next_watcher_id: 0,
            watch_buffer: watch_buffer.max(1),
            slow_watchers_closed: 0,
            rev_tx: tokio::sync::watch::Sender::new(0),
        };
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let obj = json!({
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": ns,
                    "uid": meta::new_uid(),
                    "creationTimestamp": meta::now_rfc3339(),
                    "labels": {"kubernetes.io/metadata.name": ns}
                },
                "spec": {"finalizers": ["kubernetes"]},
                "status": {"phase": "Active"}
            });
            let ns_key: Arc<str> = Arc::from(NAMESPACES);
            // The collection exists: it was built from the built-in definitions above.
            let _ = store.insert(&ns_key, ObjKey::new("", ns), obj);
        }
        store
    }

    /// Queues background work (once).
    pub(crate) fn enqueue(&mut self, item: GcItem) {
        if self.gc_queued.insert(item.clone()) {
            self.gc_queue.push_back(item);
        }
    }

    /// The next background work item.
    pub(crate) fn dequeue(&mut self) -> Option<GcItem> {
        let item = self.gc_queue.pop_front()?;
        self.gc_queued.remove(&item);
        Some(item)
    }

    /// Follows the revision (subscribed under the lock, so no later write is missed).
    pub(crate) fn revisions(&self) -> tokio::sync::watch::Receiver<u64> {
        self.rev_tx.subscribe()
    }

    pub(crate) fn has_background_work(&self) -> bool {
        !self.gc_queue.is_empty()
    }

    pub(crate) fn get(&self, storage: &str, key: &ObjKey) -> Option<Arc<Stored>> {
        self.collections
            .get(storage)
            .and_then(|c| c.objects.get(key))
            .cloned()
    }

    pub(crate) fn object_count(&self) -> usize {
        self.collections.values().map(|c| c.objects.len()).sum()
    }

    /// Forgets the history up to the current revision, as etcd's compaction does: watches and
    /// continued lists from an older resourceVersion get 410 Gone.
    pub(crate) fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.rev;
    }

    pub(crate) fn history_len(&self) -> usize {
        self.history.len()
    }

    pub(crate) fn watcher_count(&self) -> usize {
        self.collections.values().map(|c| c.watchers.len()).sum()
    }

    /// Whether a namespace exists, and whether it is terminating.
    pub(crate) fn namespace_state(&self, ns: &str) -> Option<bool> {
        self.get(NAMESPACES, &ObjKey::new("", ns))
            .map(|s| meta::is_deleting(s.value()))
    }

    fn index_owners(
        &mut self,
        storage: &Arc<str>,
        key: &ObjKey,
        old: Option<&Value>,
        new: Option<&Value>,
    ) {
        let old_owners = old.map(meta::owner_uids).unwrap_or_default();
        let new_owners = new.map(meta::owner_uids).unwrap_or_default();
        if old_owners == new_owners && new.is_some() {
            if !new_owners.is_empty() && new_owners.iter().any(|u| !self.owner_alive(u, &key.ns)) {
                self.enqueue(GcItem::Dependent(storage.clone(), key.clone()));
            }
            return;
        }
        for u in &old_owners {
            if let Some(set) = self.dependents.get_mut(u) {
                set.remove(&(storage.clone(), key.clone()));
                if set.is_empty() {
                    self.dependents.remove(u);
                }
            }
        }
        for u in &new_owners {
            self.dependents
                .entry(u.clone())
                .or_default()
                .insert((storage.clone(), key.clone()));
        }
        if new.is_some() && new_owners.iter().any(|u| !self.owner_alive(u, &key.ns)) {
            self.enqueue(GcItem::Dependent(storage.clone(), key.clone()));
        }
    }

    /// Whether an owner uid names an existing object a dependent in `ns` may refer to.
    pub(crate) fn owner_alive(&self, uid: &str, ns: &str) -> bool {
        self.uids
            .get(uid)
            .is_some_and(|(_, k)| k.ns.is_empty() || k.ns == ns)
    }

    /// Stores a new object at the next revision.
    pub(crate) fn insert(
        &mut self,
        storage: &Arc<str>,
        key: ObjKey,
        value: Value,
    ) -> Result<Arc<Stored>, ApiError> {
        let Some(col) = self.collections.get(storage) else {
            return Err(ApiError::path_not_found());
        };
        if col.objects.contains_key(&key) {
            return Err(ApiError::already_exists(
                &col.def.plural,
                &col.def.group,
                &key.name,
            ));
        }
        self.rev += 1;
        let stored = Arc::new(Stored::new(value, self.rev));
        let uid = meta::meta_str(stored.value(), "uid").to_string();
        if let Some(col) = self.collections.get_mut(storage) {
            col.objects.insert(key.clone(), stored.clone());
        }
        self.uids.insert(uid, (storage.clone(), key.clone()));
        self.index_owners(storage, &key, None, Some(stored.value()));
        self.after_write(storage, &key, stored.value(), None);
        self.push_event(EventType::Added, storage, key, stored.clone(), None);
        Ok(stored)
    }

    /// Replaces an object read at `prev`, removing it instead when it is being deleted and has no
    /// finalizers left. An identical object is not written.
    pub(crate) fn replace(
        &mut self,
        storage: &Arc<str>,
        key: &ObjKey,
        prev: &Arc<Stored>,
        mut value: Value,
    ) -> Result<Written, CommitError> {
        let Some(col) = self.collections.get(storage) else {
            return Err(CommitError::Api(ApiError::path_not_found()));
        };
        let Some(current) = col.objects.get(key).cloned() else {
            return Err(CommitError::Api(ApiError::not_found(
                &col.def.plural,
                &col.def.group,
                &key.name,
            )));
        };
        if current.rv != prev.rv {
            return Err(CommitError::Stale);
        }
        meta::metadata_mut(&mut value).insert(
            "resourceVersion".into(),
            Value::String(current.rv.to_string()),
        );
        if removable(storage, &value) {
            // The real registry never stores this write: it deletes the object from etcd as it was
            // last stored, so the DELETED event carries that state (deletionTimestamp, and the
            // finalizers just removed still on it), while the writer is answered with what it wrote.
            let removed = self.remove(storage, key, current.value().clone());
            return Ok(Written::Removed(Arc::new(Stored::new(value, removed.rv))));
        }
        if value == *current.value() {
            return Ok(Written::Unchanged(current));
        }
        self.rev += 1;
        let stored = Arc::new(Stored::new(value, self.rev));
        if let Some(col) = self.collections.get_mut(storage) {
            col.objects.insert(key.clone(), stored.clone());
        }
        self.index_owners(storage, key, Some(current.value()), Some(stored.value()));
        self.after_write(storage, key, stored.value(), Some(current.value()));
        self.push_event(
            EventType::Modified,
            storage,
            key.clone(),
            stored.clone(),
            Some(current),
        );
        Ok(Written::Stored(stored))
    }

    /// Removes an object; `last` is the state its DELETED event carries (given the deletion's
    /// revision).
    pub(crate) fn remove(&mut self, storage: &Arc<str>, key: &ObjKey, last: Value) -> Arc<Stored> {
        self.rev += 1;
        let stored = Arc::new(Stored::new(last, self.rev));
        let prev = self
            .collections
            .get_mut(storage)
            .and_then(|c| c.objects.remove(key));
        let uid = meta::meta_str(stored.value(), "uid").to_string();
        self.uids.remove(&uid);
        self.index_owners(storage, key, prev.as_ref().map(|p| p.value()), None);
        if self.dependents.contains_key(&uid) {
            self.enqueue(GcItem::OwnerGone(uid));
        }
        // Owners waiting in foreground deletion may now be done.
        for owner in meta::owner_uids(stored.value()) {
            if let Some((s, k)) = self.uids.get(&owner).cloned()
                && let Some(o) = self.get(&s, &k)
                && meta::finalizers(o.value())
                    .iter()
                    .any(|f| f == "foregroundDeletion")
            {
                self.enqueue(GcItem::Foreground(s, k));
            }
        }
        if !key.ns.is_empty() && self.namespace_state(&key.ns) == Some(true) {
            self.enqueue(GcItem::Namespace(key.ns.clone()));
        }
        if let Some(col) = self.collections.get(storage)
            && col.terminating
            && col.def.builtin.is_none()
        {
            self.enqueue(GcItem::Crd(format!("{}.{}", col.def.plural, col.def.group)));
        }
        if &**storage == CRDS {
            self.unregister_crd(stored.value());
        }
        self.push_event(
            EventType::Deleted,
            storage,
            key.clone(),
            stored.clone(),
            prev,
        );
        stored
    }

    /// Follow-up of a stored write: CRDs change what is served; deletions start background work.
    fn after_write(
        &mut self,
        storage: &Arc<str>,
        key: &ObjKey,
        value: &Value,
        old: Option<&Value>,
    ) {
        let deleting = meta::is_deleting(value);
        let was_deleting = old.is_some_and(meta::is_deleting);
        if &**storage == CRDS {
            if deleting {
                if !was_deleting {
                    self.enqueue(GcItem::Crd(key.name.clone()));
                }
            } else {
                self.register_crd(value);
            }
        }
        if &**storage == NAMESPACES && deleting && !was_deleting {
            self.enqueue(GcItem::Namespace(key.name.clone()));
        }
        if deleting {
            let fins = meta::finalizers(value);
            let old_fins = old.map(meta::finalizers).unwrap_or_default();
            if fins.iter().any(|f| f == "orphan") && !old_fins.iter().any(|f| f == "orphan") {
                self.enqueue(GcItem::Orphan(storage.clone(), key.clone()));
            }
            if fins.iter().any(|f| f == "foregroundDeletion")
                && !old_fins.iter().any(|f| f == "foregroundDeletion")
            {
                self.enqueue(GcItem::Foreground(storage.clone(), key.clone()));
            }
        }
    }

    fn register_crd(&mut self, crd: &Value) {
        let defs = defs_from_crd(crd);
        let Some(first) = defs.first() else { return };
        let group = first.group.clone();
        let plural = first.plural.clone();
        let storage = first.storage.clone();
        self.registry.set_crd(&group, &plural, defs);
        // The storage version need not be served; any served version describes the collection.
        let def = self
            .registry
            .lookup(&group, &storage_version(crd), &plural)
            .or_else(|| {
                self.registry
                    .all()
                    .into_iter()
                    .find(|d| d.storage == storage)
            });
        let Some(def) = def else { return };
        match self.collections.get_mut(&storage) {
            Some(col) => col.def = def,
            None => {
                self.collections.insert(
                    storage,
                    Collection {
                        def,
                        objects: BTreeMap::new(),
                        watchers: Vec::new(),
                        terminating: false,
                    },
                );
            }
        }
    }

    fn unregister_crd(&mut self, crd: &Value) {
        let group = crd
            .pointer("/spec/group")
            .and_then(Value::as_str)
            .unwrap_or("");
        let plural = crd
            .pointer("/spec/names/plural")
            .and_then(Value::as_str)
            .unwrap_or("");
        self.registry.set_crd(group, plural, Vec::new());
        let storage = storage_key(group, plural);
        if let Some(col) = self.collections.remove(&storage) {
            for (_, obj) in col.objects {
                self.uids.remove(meta::meta_str(obj.value(), "uid"));
            }
            // Dropping the senders ends every watch of the resource.
            drop(col.watchers);
        }
    }

    /// Marks a CRD's resource as terminating (no creates) and reports whether it is empty.
    pub(crate) fn crd_terminating(&mut self, storage: &Arc<str>) -> bool {
        match self.collections.get_mut(storage) {
            Some(col) => {
                col.terminating = true;
                col.objects.is_empty()
            }
            None => true,
        }
    }

    /// Objects of a namespace across every namespaced collection.
    pub(crate) fn objects_in_namespace(&self, ns: &str) -> Vec<(Arc<str>, ObjKey)> {
        let mut out = Vec::new();
        for (storage, col) in &self.collections {
            if !col.def.namespaced {
                continue;
            }
            for (k, _) in col.objects.range(ObjKey::new(ns, "")..) {
                if k.ns != ns {
                    break;
                }
                out.push((storage.clone(), k.clone()));
            }
        }
        out
    }

    pub(crate) fn dependents_of(&self, uid: &str) -> Vec<(Arc<str>, ObjKey)> {
        self.dependents
            .get(uid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// Whether a written object is done: being deleted with no finalizers left (for a Namespace, none in
/// `spec.finalizers` either).
pub(crate) fn removable(storage: &str, value: &Value) -> bool {
    meta::is_deleting(value)
        && meta::finalizers(value).is_empty()
        && (storage != NAMESPACES
            || value
                .pointer("/spec/finalizers")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty))
}

fn storage_version(crd: &Value) -> String {
    crd.pointer("/spec/versions")
        .and_then(Value::as_array)
        .and_then(|vs| {
            vs.iter()
                .find(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        })
        .and_then(|v| v.get("name").and_then(Value::as_str))
        .unwrap_or("")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": "default", "uid": meta::new_uid()}})
    }

    #[test]
    fn snapshot_reconstructs_the_past() {
        let mut s = Store::new(100, 10);
        let storage = storage_key("", "secrets");
        s.insert(&storage, ObjKey::new("default", "a"), secret("a"))
            .unwrap();
        let at = s.rev;
        s.insert(&storage, ObjKey::new("default", "b"), secret("b"))
            .unwrap();
        let a = s.get(&storage, &ObjKey::new("default", "a")).unwrap();
        let mut changed = a.value().clone();
        changed["type"] = json!("x");
        s.replace(&storage, &ObjKey::new("default", "a"), &a, changed)
            .unwrap();
        let mut names = Vec::new();
        s.snapshot(&storage, Some(at), None, None, |_, o| {
            names.push((meta::meta_str(o.value(), "name").to_string(), o.rv));
            true
        })
        .unwrap();
        assert_eq!(names, vec![("a".to_string(), at)]);
    }

    #[test]
    fn history_is_bounded_and_old_watches_get_gone() {
        let mut s = Store::new(3, 10);
        let storage = storage_key("", "secrets");
        for i in 0..10 {
            s.insert(
                &storage,
                ObjKey::new("default", &format!("s{i}")),
                secret(&format!("s{i}")),
            )
            .unwrap();
        }
        assert_eq!(s.history_len(), 3);
        assert_eq!(
            s.watch(&storage, Filter::default(), Some(1), false, false)
                .unwrap_err()
                .code,
            410
        );
        let (backlog, _rx) = s
            .watch(&storage, Filter::default(), Some(s.rev - 2), false, false)
            .unwrap();
        assert_eq!(backlog.len(), 2);
    }

    #[test]
    fn slow_watchers_are_closed() {
        let mut s = Store::new(100, 2);
        let storage = storage_key("", "secrets");
        let (_b, mut rx) = s
            .watch(&storage, Filter::default(), None, false, false)
            .unwrap();
        for i in 0..5 {
            s.insert(
                &storage,
                ObjKey::new("default", &format!("s{i}")),
                secret(&format!("s{i}")),
            )
            .unwrap();
        }
        assert_eq!(s.slow_watchers_closed, 1);
        assert!(rx.try_recv().is_ok());
        assert!(rx.try_recv().is_ok());
        assert!(matches!(
            rx.try_recv(),
            Err(tokio::sync::mpsc::error::TryRecvError::Disconnected)
        ));
    }
}
