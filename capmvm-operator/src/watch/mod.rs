//! Watch caches and mappers: one generic watch task per kind ([`spawn`]) feeds a cache (read by
//! reconciles instead of GETs) and hands each change to that kind's mapper (`mappers.rs`), which
//! wakes the objects the change concerns:
//!
//! - MicrovmMachine → itself;
//! - Machine → its infrastructure MicrovmMachine;
//! - Cluster → its MicrovmCluster, and its MicrovmMachines on pause and provisioned transitions;
//! - MicrovmCluster → itself, and its MicrovmMachines when its spec changes;
//! - a MicrovmMachine gone → the MicrovmClusters of its namespace (a deleted one waits for it);
//! - Secret metadata → the MicrovmClusters naming it and their MicrovmMachines (credentials changed);
//! - a host's microVMs or reachability ([`HostWake`]) → the affected MicrovmMachines and MicrovmClusters;
//! - pools: a MicrovmMachinePool → itself; its MachinePool → it and its instances (bootstrap data);
//!   an instance (spec or status) and its Machine (delete mark, remediation, the start of its
//!   deletion and its removal) → the pool;
//!   Cluster and MicrovmCluster transitions → the cluster's pools.
//!
//! Status-only updates wake nobody: each cache keeps a fingerprint of the parts that matter and
//! compares. Neither do versions of a MicrovmMachine that our own writes produced. Besides changes,
//! [`resync`] wakes every cached object once per `--sync-period`, a slice at a time.

use std::hash::Hash;
use std::sync::Arc;

use capmvm_api::capi::{Cluster, Machine, MachinePool};
use capmvm_api::keys::WATCH_FILTER_LABEL;
use capmvm_api::{MicrovmCluster, MicrovmMachine, MicrovmMachinePool};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use lean::Lean;

use crate::memory::OwnWrites;

mod answers;
mod fingerprint;
mod lean;
mod lookup;
mod mappers;
mod resync;
mod trim;
pub use answers::reporting_answers;
pub use mappers::HostWake;
use mappers::{Mapper, Route};
pub use resync::resync;

/// The watch caches reconciles read from.
#[derive(Clone)]
pub struct Stores {
    /// MicrovmMachines.
    pub machines: Store<MicrovmMachine>,
    /// CAPI Machines.
    pub capi_machines: Store<Machine>,
    /// CAPI Clusters.
    pub clusters: Store<Cluster>,
    /// MicrovmClusters.
    pub microvm_clusters: Store<MicrovmCluster>,
    /// Secrets, metadata only: which exist and at which version (credentials are read on change).
    pub secrets: Store<PartialObjectMeta<Secret>>,
    /// MicrovmMachinePools.
    pub pools: Store<MicrovmMachinePool>,
    /// CAPI MachinePools.
    pub machine_pools: Store<MachinePool>,
}

impl Stores {
    /// Waits until every cache has its first full list.
    pub async fn wait_until_ready(&self) -> Result<(), reflector::store::WriterDropped> {
        self.machines.wait_until_ready().await?;
        self.capi_machines.wait_until_ready().await?;
        self.clusters.wait_until_ready().await?;
        self.microvm_clusters.wait_until_ready().await?;
        self.pools.wait_until_ready().await?;
        self.machine_pools.wait_until_ready().await?;
        self.secrets.wait_until_ready().await
    }
}

/// Where wake-ups go: the controllers' `reconcile_on` streams.
#[derive(Clone)]
pub struct Triggers {
    /// MicrovmMachines to reconcile.
    pub machine: UnboundedSender<ObjectRef<MicrovmMachine>>,
    /// MicrovmClusters to reconcile.
    pub cluster: UnboundedSender<ObjectRef<MicrovmCluster>>,
    /// MicrovmMachinePools to reconcile.
    pub pool: UnboundedSender<ObjectRef<MicrovmMachinePool>>,
}

/// The controllers' ends of [`Triggers`].
pub struct TriggerReceivers {
    /// MicrovmMachines to reconcile.
    pub machine: UnboundedReceiver<ObjectRef<MicrovmMachine>>,
    /// MicrovmClusters to reconcile.
    pub cluster: UnboundedReceiver<ObjectRef<MicrovmCluster>>,
    /// MicrovmMachinePools to reconcile.
    pub pool: UnboundedReceiver<ObjectRef<MicrovmMachinePool>>,
}

impl Triggers {
    /// A channel per controller: the triggers the watches send on, and the controllers' ends.
    pub fn channels() -> (Triggers, TriggerReceivers) {
        let (machine_tx, machine) = tokio::sync::mpsc::unbounded_channel();
        let (cluster_tx, cluster) = tokio::sync::mpsc::unbounded_channel();
        let (pool_tx, pool) = tokio::sync::mpsc::unbounded_channel();
        let triggers = Triggers {
            machine: machine_tx,
            cluster: cluster_tx,
            pool: pool_tx,
        };
        (
            triggers,
            TriggerReceivers {
                machine,
                cluster,
                pool,
            },
        )
    }

    fn machine(&self, r: ObjectRef<MicrovmMachine>) {
        // A closed channel means the controller stopped (shutdown): nothing to wake.
        let _ = self.machine.send(r);
    }

    fn cluster(&self, r: ObjectRef<MicrovmCluster>) {
        let _ = self.cluster.send(r);
    }

    fn pool(&self, r: ObjectRef<MicrovmMachinePool>) {
        let _ = self.pool.send(r);
    }
}

/// Which objects the operator sees: one namespace or all, and the watch-filter label.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    /// Namespace, or empty for all.
    pub namespace: String,
    /// Value of `cluster.x-k8s.io/watch-filter`, or empty for no filter.
    pub watch_filter: String,
    /// Where each watch reports its first list and its errors (for `/readyz`).
    pub readiness: crate::server::Readiness,
    /// How long each watch request lasts before the server ends it and it is renewed (zero: the
    /// client's default).
    pub watch_timeout: std::time::Duration,
    /// Where each watch counts the events it receives (`capmvm_watch_events_total`), if anywhere.
    pub metrics: Option<Arc<crate::metrics::Metrics>>,
}

impl Scope {
    /// The Api for `K` in scope.
    pub fn api<K>(&self, client: &kube::Client) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        if self.namespace.is_empty() {
            Api::all(client.clone())
        } else {
            Api::namespaced(client.clone(), &self.namespace)
        }
    }

    /// Every watch's configuration: the watch timeout, and the watch-filter label selector.
    pub fn watcher_config(&self) -> watcher::Config {
        let mut config = watcher::Config::default().any_semantic();
        if !self.watch_timeout.is_zero() {
            let secs = u32::try_from(self.watch_timeout.as_secs()).unwrap_or(u32::MAX);
            config = config.timeout(secs.max(1));
        }
        if self.watch_filter.is_empty() {
            config
        } else {
            config.labels(&format!("{WATCH_FILTER_LABEL}={}", self.watch_filter))
        }
    }
}

/// Starts the watches; returns the caches and the tasks feeding them.
pub fn start(
    client: &kube::Client,
    scope: &Scope,
    triggers: &Triggers,
    own_writes: Arc<OwnWrites>,
) -> (Stores, Vec<JoinHandle<()>>) {
    let (machines, machines_w) = reflector::store();
    let (capi_machines, capi_machines_w) = reflector::store();
    let (clusters, clusters_w) = reflector::store();
    let (microvm_clusters, microvm_clusters_w) = reflector::store();
    let (secrets, secrets_w) = reflector::store();
    let (pools, pools_w) = reflector::store();
    let (machine_pools, machine_pools_w) = reflector::store();
    let stores = Stores {
        machines,
        capi_machines,
        clusters,
        microvm_clusters,
        secrets,
        pools,
        machine_pools,
    };
    let route = Route {
        to: triggers.clone(),
        stores: stores.clone(),
        own_writes,
    };
    let tasks = vec![
        spawn(
            client,
            scope,
            &route,
            machines_w,
            mappers::MicrovmMachines::default(),
        ),
        spawn(
            client,
            scope,
            &route,
            capi_machines_w,
            mappers::Machines::default(),
        ),
        spawn(
            client,
            scope,
            &route,
            clusters_w,
            mappers::Clusters::default(),
        ),
        spawn(
            client,
            scope,
            &route,
            microvm_clusters_w,
            mappers::MicrovmClusters::default(),
        ),
        spawn(client, scope, &route, pools_w, mappers::Pools::default()),
        spawn(
            client,
            scope,
            &route,
            machine_pools_w,
            mappers::MachinePools::default(),
        ),
        spawn(
            client,
            scope,
            &route,
            secrets_w,
            mappers::Secrets::default(),
        ),
    ];
    (stores, tasks)
}

/// The Secrets `mc` names for host credentials (basic-auth tokens, TLS material).
pub fn credential_secret_names(mc: &MicrovmCluster) -> Vec<&str> {
    let mut names: Vec<&str> = mc
        .spec
        .placement
        .static_pool
        .as_ref()
        .and_then(|p| p.basic_auth_secret.as_deref())
        .into_iter()
        .chain(mc.spec.tls_secret_ref.as_deref())
        .collect();
    names.dedup();
    names
}

/// The name of the CAPI Cluster owning `mc` (ownerReference kind Cluster), else its cluster-name label.
pub fn owner_cluster_name(mc: &MicrovmCluster) -> Option<String> {
    capmvm_reconcile::cluster::cluster_name_of(mc).map(str::to_string)
}

/// The group of an `apiVersion` (`group/version`, or `version` for the core group).
pub fn api_group(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(g, _)| g)
}

/// The one watch task: lists and watches `M::Kind` in scope, keeps the trimmed objects in the cache
/// `writer` feeds, and hands each change to the mapper once the cache shows it.
fn spawn<M: Mapper>(
    client: &kube::Client,
    scope: &Scope,
    route: &Route,
    writer: reflector::store::Writer<M::Kind>,
    mapper: M,
) -> JoinHandle<()> {
    let kind = M::Kind::kind(&()).to_string();
    let readiness = scope.readiness.clone();
    let route_path = format!("{}/{}", M::Kind::group(&()), M::Kind::plural(&()));
    readiness.cache_started(&kind, &route_path);
    // managedFields are read by nothing here: they are skipped while decoding (`Lean`), which
    // also keeps the caches smaller (a MicrovmMachine carries an entry per writer).
    let cache = writer.as_reader();
    let stream = watcher(scope.api::<Lean<M::Kind>>(client), M::config(scope))
        .default_backoff()
        .map_ok(unlean)
        .modify(|obj| {
            // Left by a kind whose decoding does not go through `Lean`'s filter (none known).
            obj.meta_mut().managed_fields = None;
            M::trim(obj);
        })
        .reflect(writer);
    let route = route.clone();
    let events = scope.metrics.as_ref().map(|m| m.watch_events_of(&kind));
    tokio::spawn(follow(stream, cache, kind, readiness, move |obj, event| {
        if event && let Some(events) = &events {
            events.inc();
        }
        mapper.wake(obj, &route);
    }))
}

/// A watch event of lean objects as one of the objects themselves.
fn unlean<K>(event: watcher::Event<Lean<K>>) -> watcher::Event<K> {
    match event {
        watcher::Event::Apply(Lean(k)) => watcher::Event::Apply(k),
        watcher::Event::Delete(Lean(k)) => watcher::Event::Delete(k),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(Lean(k)) => watcher::Event::InitApply(k),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// Calls `on_change` for each object a watch applied to `cache`, once `cache` shows it, saying
/// whether a watch event brought it (`true`) or a list (`false`).
///
/// A (re)list fills a buffer that the cache swaps in only at `InitDone`: an object woken at its
/// `InitApply` would be reconciled against the cache as it was before the list, which may not hold
/// it yet (a Machine created while the watch was down). Its reconcile would then wait for a change
/// that never comes. So the objects of a list are woken when the list is done.
async fn follow<K, S>(
    stream: S,
    cache: Store<K>,
    kind: String,
    readiness: crate::server::Readiness,
    on_change: impl Fn(&K, bool),
) where
    K: Resource + Clone + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut stream = std::pin::pin!(stream);
    let mut listed: Vec<ObjectRef<K>> = Vec::new();
    while let Some(item) = stream.next().await {
        match item {
            Ok(watcher::Event::Apply(obj)) => {
                readiness.cache_contact(&kind);
                on_change(&obj, true);
            }
            Ok(watcher::Event::Delete(obj)) => {
                readiness.cache_contact(&kind);
                on_change(&as_gone(obj), true);
            }
            Ok(watcher::Event::Init) => listed.clear(),
            Ok(watcher::Event::InitApply(obj)) => {
                listed.push(ObjectRef::from_obj_with(&obj, Default::default()));
            }
            Ok(watcher::Event::InitDone) => {
                readiness.cache_synced(&kind);
                for r in listed.drain(..) {
                    if let Some(obj) = cache.get(&r) {
                        on_change(&obj, false);
                    }
                }
            }
            // The watcher retries with backoff. Before the first list, the first error is worth a
            // line and the cache reporter repeats why once per interval; after it, each one is (and
            // `/readyz` fails once the cache has gone too long without a successful answer).
            Err(e) => {
                let before = readiness.cache_error(&kind, e.to_string());
                if before.synced || before.last_error.is_none() {
                    warn!(%kind, error = %e, "watch error");
                } else {
                    debug!(%kind, error = %e, "watch error");
                }
            }
        }
    }
}

/// A deleted object as the handlers test for "gone": a deletion timestamp and no finalizers. The
/// real API server's DELETED event carries the last stored state, so an object whose last finalizer
/// was just removed still shows that finalizer there (the emulator showed none): handlers that
/// waited for "deleting with no finalizers" never saw the deletion, and a pool stopped mid-roll on
/// the real stack.
fn as_gone<K: Resource>(mut obj: K) -> K {
    let meta = obj.meta_mut();
    meta.finalizers = None;
    if meta.deletion_timestamp.is_none() {
        meta.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        ));
    }
    obj
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Mutex;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::ResourceExt;
    use kube::api::ObjectMeta;

    use super::fingerprint::{Fingerprints, fingerprint};
    use super::*;

    /// A ConfigMap `name` in namespace `ns`: the object the watch tests follow.
    pub(super) fn config_map(name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some("ns".to_string()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// Every wake-up, a relist's included, finds its object in the cache: a reconcile it starts reads
    /// what woke it.
    #[tokio::test]
    async fn objects_are_woken_once_the_cache_shows_them() {
        let (cache, writer) = reflector::store::<ConfigMap>();
        let events = vec![
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(config_map("a"))),
            Ok(watcher::Event::InitDone),
            Ok(watcher::Event::Apply(config_map("b"))),
            // The watch expired and relists: "c" was created meanwhile.
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(config_map("a"))),
            Ok(watcher::Event::InitApply(config_map("b"))),
            Ok(watcher::Event::InitApply(config_map("c"))),
            Ok(watcher::Event::InitDone),
        ];
        let stream = futures::stream::iter(events).reflect(writer);
        let woken = Mutex::new(Vec::new());
        let reader = cache.clone();
        follow(
            stream,
            cache,
            "ConfigMap".to_string(),
            crate::server::Readiness::default(),
            |cm: &ConfigMap, event: bool| {
                let cached = reader.get(&ObjectRef::from_obj(cm)).is_some();
                woken.lock().unwrap().push((cm.name_any(), cached, event));
            },
        )
        .await;
        let woken = woken.into_inner().unwrap();
        let names: Vec<&str> = woken.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "b", "a", "b", "c"]);
        assert!(
            woken.iter().all(|(_, cached, _)| *cached),
            "woken before the cache showed it: {woken:?}"
        );
        // Only "b" came by a watch event (what `capmvm_watch_events_total` counts); the rest by lists.
        let events: Vec<bool> = woken.iter().map(|(_, _, e)| *e).collect();
        assert_eq!(events, [false, true, false, false, false]);
    }

    /// A DELETED event wakes as a deletion, whatever state it carries: the real API server sends the
    /// last stored one, the finalizer just removed still on it.
    #[tokio::test]
    async fn a_deleted_object_is_seen_gone_though_its_event_shows_the_last_finalizer() {
        let (cache, writer) = reflector::store::<ConfigMap>();
        let mut deleting = config_map("a");
        deleting.metadata.finalizers = Some(vec!["ours".into()]);
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        let events = vec![
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitDone),
            Ok(watcher::Event::Apply(deleting.clone())),
            // The finalizer is removed: the server deletes the object and sends its last stored state.
            Ok(watcher::Event::Delete(deleting)),
            // One deleted without finalizers carries no deletion timestamp.
            Ok(watcher::Event::Delete(config_map("b"))),
        ];
        let stream = futures::stream::iter(events).reflect(writer);
        let seen = Fingerprints::default();
        let changes = Mutex::new(Vec::new());
        follow(
            stream,
            cache,
            "ConfigMap".to_string(),
            crate::server::Readiness::default(),
            |cm: &ConfigMap, _event: bool| {
                let gone = cm.meta().deletion_timestamp.is_some()
                    && cm.meta().finalizers.as_ref().is_none_or(Vec::is_empty);
                let changed = seen.changed(cm, fingerprint(cm, &cm.data));
                changes.lock().unwrap().push((cm.name_any(), gone, changed));
            },
        )
        .await;
        assert_eq!(
            changes.into_inner().unwrap(),
            [
                ("a".to_string(), false, true),
                ("a".to_string(), true, true),
                ("b".to_string(), true, true),
            ]
        );
    }
}
