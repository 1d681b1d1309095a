//! Watch caches and mappers: one watch per kind feeds a cache (read by reconciles instead of GETs) and
//! wakes the objects a change concerns:
//!
//! - MicrovmMachine → itself;
//! - Machine → its infrastructure MicrovmMachine;
//! - Cluster → its MicrovmCluster, and its MicrovmMachines on pause and provisioned transitions;
//! - MicrovmCluster → itself, and its MicrovmMachines when its spec changes;
//! - a MicrovmMachine gone → the MicrovmClusters of its namespace (a deleted one waits for it);
//! - Secret metadata → the MicrovmClusters naming it and their MicrovmMachines (credentials changed);
//! - a host's microVMs or reachability ([`Wake`]) → the affected MicrovmMachines and MicrovmClusters;
//! - pools: a MicrovmMachinePool → itself; its MachinePool → it and its instances (bootstrap data);
//!   an instance (spec or status) and its Machine (delete mark, remediation, deletion) → the pool;
//!   Cluster and MicrovmCluster transitions → the cluster's pools.
//!
//! Status-only updates wake nobody: each cache keeps a fingerprint of the parts that matter and
//! compares. Neither do versions of a MicrovmMachine that our own writes produced.

use std::hash::Hash;
use std::sync::Arc;

use capmvm_api::capi::{CAPI_GROUP, Cluster, Machine, MachinePool};
use capmvm_api::keys::{
    CAPI_SECRET_TYPE, CLUSTER_NAME_LABEL, DELETE_MACHINE_ANNOTATION, WATCH_FILTER_LABEL,
};
use capmvm_api::{GROUP, HostEndpoint, MicrovmCluster, MicrovmMachine, MicrovmMachinePool};
use capmvm_reconcile::machine::instance_pool;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use crate::context::OwnWrites;

mod answers;
mod fingerprint;
mod trim;
use crate::hosts::Wake;
pub use answers::reporting_answers;
use fingerprint::{Fingerprints, fingerprint, hash_of};

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

    /// The MicrovmMachinePools of Cluster `namespace/cluster`.
    pub fn pools_of(&self, namespace: &str, cluster: &str) -> Vec<ObjectRef<MicrovmMachinePool>> {
        self.pools
            .state()
            .iter()
            .filter(|p| p.namespace().as_deref() == Some(namespace))
            .filter(|p| p.labels().get(CLUSTER_NAME_LABEL).map(String::as_str) == Some(cluster))
            .map(|p| ObjectRef::from_obj(p.as_ref()))
            .collect()
    }

    /// The MicrovmMachinePools MachinePool `namespace/name` owns.
    pub fn pools_owned_by(&self, namespace: &str, name: &str) -> Vec<Arc<MicrovmMachinePool>> {
        self.pools
            .state()
            .into_iter()
            .filter(|p| p.namespace().as_deref() == Some(namespace))
            .filter(|p| {
                p.owner_references().iter().any(|o| {
                    o.kind == "MachinePool"
                        && api_group(&o.api_version) == CAPI_GROUP
                        && o.name == name
                })
            })
            .collect()
    }

    /// The instances (MicrovmMachines) of MicrovmMachinePool `namespace/pool`, deleting ones included.
    pub fn instances_of(&self, namespace: &str, pool: &str) -> Vec<Arc<MicrovmMachine>> {
        self.machines
            .state()
            .into_iter()
            .filter(|m| m.namespace().as_deref() == Some(namespace))
            .filter(|m| instance_pool(m) == Some(pool))
            .collect()
    }

    /// The MicrovmClusters of `namespace` that name Secret `name` for credentials.
    pub fn clusters_naming_secret(&self, namespace: &str, name: &str) -> Vec<Arc<MicrovmCluster>> {
        self.microvm_clusters
            .state()
            .into_iter()
            .filter(|mc| mc.namespace().as_deref() == Some(namespace))
            .filter(|mc| credential_secret_names(mc).contains(&name))
            .collect()
    }

    /// The MicrovmMachines of Cluster `namespace/cluster`.
    pub fn machines_of(&self, namespace: &str, cluster: &str) -> Vec<ObjectRef<MicrovmMachine>> {
        self.machines
            .state()
            .iter()
            .filter(|m| m.namespace().as_deref() == Some(namespace))
            .filter(|m| m.labels().get(CLUSTER_NAME_LABEL).map(String::as_str) == Some(cluster))
            .map(|m| ObjectRef::from_obj(m.as_ref()))
            .collect()
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

impl Triggers {
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
    let mut tasks = Vec::new();

    // MicrovmMachine → itself, except for versions our own writes produced (the reconcile that wrote
    // them already acted; waking again would only re-stamp observedGeneration, a write per machine).
    // One gone → the MicrovmClusters of its namespace (a deleted cluster waits for its machines).
    {
        let t = triggers.clone();
        let s = stores.clone();
        let seen = Fingerprints::default();
        let as_instance = Fingerprints::default();
        tasks.push(spawn_trimmed_watch(
            scope.api::<MicrovmMachine>(client),
            scope.watcher_config(),
            scope,
            machines_w,
            trim::microvm_machine,
            move |m: &MicrovmMachine| {
                // An instance's spec or status (its health) → its pool.
                if let Some(pool) = instance_pool(m)
                    && as_instance.changed(m, fingerprint(m, &(&m.spec, &m.status)))
                {
                    t.pool(ObjectRef::new(pool).within(&m.namespace().unwrap_or_default()));
                }
                if m.meta().deletion_timestamp.is_some() && m.finalizers().is_empty() {
                    let ns = m.namespace().unwrap_or_default();
                    for mc in s.microvm_clusters.state() {
                        if mc.namespace().as_deref() == Some(ns.as_str()) {
                            t.cluster(ObjectRef::from_obj(mc.as_ref()));
                        }
                    }
                }
                let changed = seen.changed(m, fingerprint(m, &m.spec));
                let own = own_writes.is_own(
                    &crate::controllers::key(m),
                    &m.resource_version().unwrap_or_default(),
                );
                if changed && !own {
                    t.machine(ObjectRef::from_obj(m));
                }
            },
        ));
    }
    // Machine → its MicrovmMachine; a pool instance's Machine → the pool (what it reads of it).
    {
        let t = triggers.clone();
        let s = stores.clone();
        let seen = Fingerprints::default();
        let for_pool = Fingerprints::default();
        tasks.push(spawn_trimmed_watch(
            scope.api::<Machine>(client),
            scope.watcher_config(),
            scope,
            capi_machines_w,
            trim::machine,
            move |m: &Machine| {
                let ns = m.namespace().unwrap_or_default();
                let owning_pool = m
                    .owner_references()
                    .iter()
                    .find(|o| o.kind == "MachinePool" && api_group(&o.api_version) == CAPI_GROUP);
                if let Some(mp) = owning_pool {
                    let read = hash_of(&(
                        m.annotations().contains_key(DELETE_MACHINE_ANNOTATION),
                        m.owner_remediation_requested(),
                    ));
                    if for_pool.changed(m, read) {
                        for p in s.pools_owned_by(&ns, &mp.name) {
                            t.pool(ObjectRef::from_obj(p.as_ref()));
                        }
                    }
                }
                let infra = &m.spec.infrastructure_ref;
                if infra.api_group == GROUP
                    && infra.kind == "MicrovmMachine"
                    && seen.changed(m, fingerprint(m, &m.spec))
                {
                    t.machine(
                        ObjectRef::new(&infra.name).within(&m.namespace().unwrap_or_default()),
                    );
                }
            },
        ));
    }
    // Cluster → its MicrovmCluster; its MicrovmMachines on pause or provisioned transitions.
    {
        let t = triggers.clone();
        let s = stores.clone();
        let seen = Fingerprints::default();
        let transitions = Fingerprints::default();
        tasks.push(spawn_watch(
            scope.api::<Cluster>(client),
            scope.watcher_config(),
            scope,
            clusters_w,
            move |c: &Cluster| {
                let ns = c.namespace().unwrap_or_default();
                if seen.changed(c, fingerprint(c, &c.spec))
                    && let Some(infra) = &c.spec.infrastructure_ref
                    && infra.api_group == GROUP
                    && infra.kind == "MicrovmCluster"
                {
                    t.cluster(ObjectRef::new(&infra.name).within(&ns));
                }
                let gates = hash_of(&(
                    c.is_paused(),
                    c.infrastructure_provisioned(),
                    c.meta().deletion_timestamp.is_some(),
                ));
                if transitions.changed(c, gates) {
                    for m in s.machines_of(&ns, &c.name_any()) {
                        t.machine(m);
                    }
                    for p in s.pools_of(&ns, &c.name_any()) {
                        t.pool(p);
                    }
                }
            },
        ));
    }
    // MicrovmCluster → itself; its MicrovmMachines when its spec changes.
    {
        let t = triggers.clone();
        let s = stores.clone();
        let seen = Fingerprints::default();
        let specs = Fingerprints::default();
        tasks.push(spawn_watch(
            scope.api::<MicrovmCluster>(client),
            scope.watcher_config(),
            scope,
            microvm_clusters_w,
            move |mc: &MicrovmCluster| {
                if seen.changed(mc, fingerprint(mc, &mc.spec)) {
                    t.cluster(ObjectRef::from_obj(mc));
                }
                if specs.changed(mc, hash_of(&mc.meta().generation))
                    && let Some(cluster) = owner_cluster_name(mc)
                {
                    let ns = mc.namespace().unwrap_or_default();
                    for m in s.machines_of(&ns, &cluster) {
                        t.machine(m);
                    }
                    for p in s.pools_of(&ns, &cluster) {
                        t.pool(p);
                    }
                }
            },
        ));
    }
    // MicrovmMachinePool → itself (its spec: a template change rolls; metadata: deletion, pause).
    {
        let t = triggers.clone();
        let seen = Fingerprints::default();
        tasks.push(spawn_watch(
            scope.api::<MicrovmMachinePool>(client),
            scope.watcher_config(),
            scope,
            pools_w,
            move |p: &MicrovmMachinePool| {
                if seen.changed(p, fingerprint(p, &p.spec)) {
                    t.pool(ObjectRef::from_obj(p));
                }
            },
        ));
    }
    // MachinePool → the pools it owns (replicas, failure domains), and their instances still to be
    // created (the bootstrap Secret they boot with).
    {
        let t = triggers.clone();
        let s = stores.clone();
        let seen = Fingerprints::default();
        tasks.push(spawn_watch(
            scope.api::<MachinePool>(client),
            scope.watcher_config(),
            scope,
            machine_pools_w,
            move |mp: &MachinePool| {
                if !seen.changed(mp, fingerprint(mp, &mp.spec)) {
                    return;
                }
                let ns = mp.namespace().unwrap_or_default();
                for p in s.pools_owned_by(&ns, &mp.name_any()) {
                    t.pool(ObjectRef::from_obj(p.as_ref()));
                    for m in s.instances_of(&ns, &p.name_any()) {
                        if m.spec.provider_id.is_none() {
                            t.machine(ObjectRef::from_obj(m.as_ref()));
                        }
                    }
                }
            },
        ));
    }
    // Secret metadata → the MicrovmClusters naming it, and their MicrovmMachines. Secrets are not
    // labelled for the watch filter: all of them in scope, metadata only, but for Cluster API's own
    // (one per machine, and never a credential; a credential Secret of that type is refused with
    // a message saying so, see `credentials`).
    {
        let t = triggers.clone();
        let s = stores.clone();
        let seen = Fingerprints::default();
        tasks.push(spawn_trimmed_watch(
            scope.api::<PartialObjectMeta<Secret>>(client),
            {
                let mut config = scope.watcher_config();
                // Not labelled for the watch filter (see above): every Secret in scope.
                config.label_selector = None;
                config.fields(&format!("type!={CAPI_SECRET_TYPE}"))
            },
            scope,
            secrets_w,
            trim::secret,
            move |secret: &PartialObjectMeta<Secret>| {
                if !seen.changed(secret, hash_of(&secret.resource_version())) {
                    return;
                }
                let ns = secret.namespace().unwrap_or_default();
                for mc in s.clusters_naming_secret(&ns, &secret.name_any()) {
                    t.cluster(ObjectRef::from_obj(mc.as_ref()));
                    if let Some(cluster) = owner_cluster_name(&mc) {
                        for m in s.machines_of(&ns, &cluster) {
                            t.machine(m);
                        }
                    }
                }
            },
        ));
    }
    (stores, tasks)
}

/// Routes host observations to the objects they concern.
pub struct HostWake {
    /// Where to send wake-ups.
    pub triggers: Triggers,
    /// The caches, to find who lives on a host.
    pub stores: Stores,
}

impl Wake for HostWake {
    fn microvm_changed(&self, namespace: &str, name: &str) {
        let machine = ObjectRef::new(name).within(namespace);
        if self.stores.machines.get(&machine).is_none() {
            // No object for it: a microVM left behind, or its cleanup; the clusters report those.
            for mc in self.stores.microvm_clusters.state() {
                if mc.namespace().as_deref() == Some(namespace) {
                    self.triggers.cluster(ObjectRef::from_obj(mc.as_ref()));
                }
            }
            return;
        }
        self.triggers.machine(machine);
    }

    fn unmarked_microvm_changed(&self, namespace: &str, name: &str) {
        // An adopted machine's microVM has no marker of ours: without this wake its deletion was
        // seen only at the next safety-net recheck (a minute per machine in a rollout).
        let machine = ObjectRef::new(name).within(namespace);
        if self.stores.machines.get(&machine).is_some() {
            self.triggers.machine(machine);
        }
    }

    fn host_changed(&self, endpoint: &str) {
        // Machines recorded on the host, and machines still waiting for a host.
        for m in self.stores.machines.state() {
            let recorded = capmvm_reconcile::machine::recorded_host(&m).map(|h| h.to_string());
            if recorded.as_deref() == Some(endpoint) || recorded.is_none() {
                self.triggers.machine(ObjectRef::from_obj(m.as_ref()));
            }
        }
        for mc in self.stores.microvm_clusters.state() {
            let uses = mc
                .spec
                .placement
                .static_pool
                .iter()
                .flat_map(|p| &p.hosts)
                .any(|h| {
                    h.endpoint
                        .parse::<HostEndpoint>()
                        .is_ok_and(|e| e.to_string() == endpoint)
                });
            if uses {
                self.triggers.cluster(ObjectRef::from_obj(mc.as_ref()));
            }
        }
    }
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

fn spawn_watch<K>(
    api: Api<K>,
    config: watcher::Config,
    scope: &Scope,
    writer: reflector::store::Writer<K>,
    on_change: impl Fn(&K) + Send + 'static,
) -> JoinHandle<()>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    spawn_trimmed_watch(api, config, scope, writer, |_| {}, on_change)
}

/// [`spawn_watch`], with `trim` applied to each object before the cache keeps it.
fn spawn_trimmed_watch<K>(
    api: Api<K>,
    config: watcher::Config,
    scope: &Scope,
    writer: reflector::store::Writer<K>,
    trim: impl Fn(&mut K) + Send + Sync + 'static,
    on_change: impl Fn(&K) + Send + 'static,
) -> JoinHandle<()>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let kind = K::kind(&Default::default()).to_string();
    let readiness = scope.readiness.clone();
    let route = format!(
        "{}/{}",
        K::group(&Default::default()),
        K::plural(&Default::default())
    );
    readiness.cache_started(&kind, &route);
    // managedFields are read by nothing here; dropping them before the cache keeps the caches
    // smaller (a MicrovmMachine carries an entry per writer) and every clone of a cached object cheaper.
    let cache = writer.as_reader();
    let stream = watcher(api, config)
        .default_backoff()
        .modify(move |obj| {
            obj.meta_mut().managed_fields = None;
            trim(obj);
        })
        .reflect(writer);
    tokio::spawn(follow(stream, cache, kind, readiness, on_change))
}

/// Calls `on_change` for each object a watch applied to `cache`, once `cache` shows it.
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
    on_change: impl Fn(&K),
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
                on_change(&obj);
            }
            Ok(watcher::Event::Delete(obj)) => {
                readiness.cache_contact(&kind);
                on_change(&as_gone(obj));
            }
            Ok(watcher::Event::Init) => listed.clear(),
            Ok(watcher::Event::InitApply(obj)) => {
                listed.push(ObjectRef::from_obj_with(&obj, Default::default()));
            }
            Ok(watcher::Event::InitDone) => {
                readiness.cache_synced(&kind);
                for r in listed.drain(..) {
                    if let Some(obj) = cache.get(&r) {
                        on_change(&obj);
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
    use kube::api::ObjectMeta;

    use super::*;

    fn config_map(name: &str) -> ConfigMap {
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
            |cm: &ConfigMap| {
                let cached = reader.get(&ObjectRef::from_obj(cm)).is_some();
                woken.lock().unwrap().push((cm.name_any(), cached));
            },
        )
        .await;
        let woken = woken.into_inner().unwrap();
        let names: Vec<&str> = woken.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "b", "a", "b", "c"]);
        assert!(
            woken.iter().all(|(_, cached)| *cached),
            "woken before the cache showed it: {woken:?}"
        );
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
            |cm: &ConfigMap| {
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
