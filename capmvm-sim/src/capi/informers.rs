//! Shared watch caches, as CAPI's controllers share informers: one watch per kind, whose cache every
//! controller reads and whose changes (additions, updates and deletions) each subscribed controller
//! gets, instead of a watch per controller and a live GET per reconcile. What the stand-in writes,
//! and when, does not change; only its reads come from the caches, as CAPI's do.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use futures::channel::mpsc;
use futures::{Stream, StreamExt as _};
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::{ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;

/// One kind's watch cache and the controllers that follow its changes.
pub(crate) struct Informer<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    store: Store<K>,
    dyntype: K::DynamicType,
    subscribers: Arc<Mutex<Vec<mpsc::UnboundedSender<Arc<K>>>>>,
    /// The watch, until `start`.
    pending: Mutex<Option<(Api<K>, Writer<K>)>>,
}

impl<K> Informer<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default + Send + Sync,
{
    /// An informer of `api`'s objects of a kind known at compile time.
    pub(crate) fn new(api: Api<K>) -> Self {
        Self::new_with(api, K::DynamicType::default())
    }
}

impl<K> Informer<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    /// An informer of `api`'s objects of the kind `dyntype` names.
    pub(crate) fn new_with(api: Api<K>, dyntype: K::DynamicType) -> Self {
        let writer = Writer::new(dyntype.clone());
        Self {
            store: writer.as_reader(),
            dyntype,
            subscribers: Arc::default(),
            pending: Mutex::new(Some((api, writer))),
        }
    }

    /// The cache.
    pub(crate) fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// The cached object `name` of `namespace`, once the cache has been filled.
    pub(crate) async fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        // An error only when the writer is gone: then there is nothing to wait for.
        let _ = self.store.wait_until_ready().await;
        self.store
            .get(&ObjectRef::new_with(name, self.dyntype.clone()).within(namespace))
    }

    /// Every cached object, once the cache has been filled.
    pub(crate) async fn state(&self) -> Vec<Arc<K>> {
        let _ = self.store.wait_until_ready().await;
        self.store.state()
    }

    /// The objects that change from now on (each addition, update and deletion). Subscribe before
    /// `start` to see the initial list too.
    pub(crate) fn subscribe(&self) -> impl Stream<Item = Arc<K>> + Send + use<K> {
        let (tx, rx) = mpsc::unbounded();
        lock(&self.subscribers).push(tx);
        rx
    }

    /// Starts the watch (once; later calls do nothing).
    pub(crate) fn start(&self) -> Option<JoinHandle<()>> {
        let (api, writer) = lock(&self.pending).take()?;
        let subscribers = self.subscribers.clone();
        let events = watcher(api, watcher::Config::default().any_semantic())
            .default_backoff()
            .reflect(writer)
            .touched_objects();
        Some(tokio::spawn(async move {
            futures::pin_mut!(events);
            while let Some(event) = events.next().await {
                let Ok(obj) = event else {
                    continue;
                };
                let obj = Arc::new(obj);
                lock(&subscribers).retain(|tx| tx.unbounded_send(obj.clone()).is_ok());
            }
        }))
    }
}

/// The informer of a dynamic resource.
pub(crate) fn dynamic(client: &kube::Client, resource: &ApiResource) -> Informer<DynamicObject> {
    Informer::new_with(Api::all_with(client.clone(), resource), resource.clone())
}

/// A plain list behind a lock a panic may have poisoned: still usable.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
