//! One mapper per watched kind: what the cache keeps of an object, and which objects a change of it
//! wakes. The watch around them is one generic task ([`super::spawn`]); the routes are listed in the
//! module header of [`super`].

use std::sync::Arc;

use capmvm_api::capi::{CAPI_GROUP, Cluster, Machine, MachinePool};
use capmvm_api::keys::CAPI_SECRET_TYPE;
use capmvm_api::{GROUP, HostEndpoint, MicrovmCluster, MicrovmMachine, MicrovmMachinePool};
use capmvm_reconcile::machine::instance_pool;
use capmvm_reconcile::pool::InstanceMachine;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::Secret;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::fingerprint::{Fingerprints, fingerprint, hash_of};
use super::{Scope, Stores, Triggers, api_group, owner_cluster_name, trim};
use crate::hosts::Wake;
use crate::memory::OwnWrites;

/// What every mapper reads and wakes through: the caches, the controllers' queues, and the versions
/// our own writes produced.
#[derive(Clone)]
pub(super) struct Route {
    pub(super) to: Triggers,
    pub(super) stores: Stores,
    pub(super) own_writes: Arc<OwnWrites>,
}

/// The watch of one kind: what its cache keeps, and whom a change wakes.
pub(super) trait Mapper: Send + 'static {
    /// The kind watched.
    type Kind: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static;

    /// The watch's configuration: the scope's, for kinds labelled for the watch filter.
    fn config(scope: &Scope) -> watcher::Config {
        scope.watcher_config()
    }

    /// Drops what nothing reads before the cache keeps the object (managedFields go for every kind).
    fn trim(_obj: &mut Self::Kind) {}

    /// Wakes the objects a change of `obj` concerns; called once the cache shows the change.
    fn wake(&self, obj: &Self::Kind, route: &Route);
}

/// MicrovmMachine → itself, except for versions our own writes produced (the reconcile that wrote
/// them already acted; waking again would only re-stamp observedGeneration, a write per machine).
/// An instance's spec or status (its health) → its pool. One gone → the MicrovmClusters of its
/// namespace (a deleted cluster waits for its machines).
#[derive(Default)]
pub(super) struct MicrovmMachines {
    seen: Fingerprints,
    as_instance: Fingerprints,
}

impl Mapper for MicrovmMachines {
    type Kind = MicrovmMachine;

    fn trim(obj: &mut MicrovmMachine) {
        trim::microvm_machine(obj);
    }

    fn wake(&self, m: &MicrovmMachine, route: &Route) {
        let ns = m.namespace().unwrap_or_default();
        if let Some(pool) = instance_pool(m)
            && self
                .as_instance
                .changed(m, fingerprint(m, &(&m.spec, &m.status)))
        {
            route.to.pool(ObjectRef::new(pool).within(&ns));
        }
        if m.meta().deletion_timestamp.is_some() && m.finalizers().is_empty() {
            for mc in route.stores.microvm_clusters.state() {
                if mc.namespace().as_deref() == Some(ns.as_str()) {
                    route.to.cluster(ObjectRef::from_obj(mc.as_ref()));
                }
            }
        }
        let changed = self.seen.changed(m, fingerprint(m, &m.spec));
        // Also tells the record of our writes that the cache caught up (it is pruned soon after).
        let own = route.own_writes.note_cached(
            &crate::memory::key(m),
            &m.resource_version().unwrap_or_default(),
        );
        if changed && !own {
            route.to.machine(ObjectRef::from_obj(m));
        }
    }
}

/// Machine → its MicrovmMachine; a pool instance's Machine → the pool when what the pool reads of
/// it changes ([`InstanceMachine`]: its delete mark, remediation request and deletion).
#[derive(Default)]
pub(super) struct Machines {
    seen: Fingerprints,
    for_pool: Fingerprints,
}

impl Mapper for Machines {
    type Kind = Machine;

    fn trim(obj: &mut Machine) {
        trim::machine(obj);
    }

    fn wake(&self, m: &Machine, route: &Route) {
        let ns = m.namespace().unwrap_or_default();
        let owning_pool = m
            .owner_references()
            .iter()
            .find(|o| o.kind == "MachinePool" && api_group(&o.api_version) == CAPI_GROUP);
        if let Some(mp) = owning_pool
            && self.for_pool.changed(m, hash_of(&InstanceMachine::from(m)))
        {
            for p in route.stores.pools_owned_by(&ns, &mp.name) {
                route.to.pool(ObjectRef::from_obj(p.as_ref()));
            }
        }
        let infra = &m.spec.infrastructure_ref;
        if infra.api_group == GROUP
            && infra.kind == "MicrovmMachine"
            && self.seen.changed(m, fingerprint(m, &m.spec))
        {
            route.to.machine(ObjectRef::new(&infra.name).within(&ns));
        }
    }
}

/// Cluster → its MicrovmCluster; its MicrovmMachines and pools on pause, provisioned and deletion
/// transitions.
#[derive(Default)]
pub(super) struct Clusters {
    seen: Fingerprints,
    transitions: Fingerprints,
}

impl Mapper for Clusters {
    type Kind = Cluster;

    fn wake(&self, c: &Cluster, route: &Route) {
        let ns = c.namespace().unwrap_or_default();
        if self.seen.changed(c, fingerprint(c, &c.spec))
            && let Some(infra) = &c.spec.infrastructure_ref
            && infra.api_group == GROUP
            && infra.kind == "MicrovmCluster"
        {
            route.to.cluster(ObjectRef::new(&infra.name).within(&ns));
        }
        let gates = hash_of(&(
            c.is_paused(),
            c.infrastructure_provisioned(),
            c.meta().deletion_timestamp.is_some(),
        ));
        if self.transitions.changed(c, gates) {
            route.wake_cluster_members(&ns, &c.name_any());
        }
    }
}

/// MicrovmCluster → itself; its MicrovmMachines and pools when its spec changes.
#[derive(Default)]
pub(super) struct MicrovmClusters {
    seen: Fingerprints,
    specs: Fingerprints,
}

impl Mapper for MicrovmClusters {
    type Kind = MicrovmCluster;

    fn wake(&self, mc: &MicrovmCluster, route: &Route) {
        if self.seen.changed(mc, fingerprint(mc, &mc.spec)) {
            route.to.cluster(ObjectRef::from_obj(mc));
        }
        if self.specs.changed(mc, hash_of(&mc.meta().generation))
            && let Some(cluster) = owner_cluster_name(mc)
        {
            route.wake_cluster_members(&mc.namespace().unwrap_or_default(), &cluster);
        }
    }
}

/// MicrovmMachinePool → itself (its spec: a template change rolls; metadata: deletion, pause).
#[derive(Default)]
pub(super) struct Pools {
    seen: Fingerprints,
}

impl Mapper for Pools {
    type Kind = MicrovmMachinePool;

    fn wake(&self, p: &MicrovmMachinePool, route: &Route) {
        if self.seen.changed(p, fingerprint(p, &p.spec)) {
            route.to.pool(ObjectRef::from_obj(p));
        }
    }
}

/// MachinePool → the pools it owns (replicas, failure domains), and their instances still to be
/// created (the bootstrap Secret they boot with).
#[derive(Default)]
pub(super) struct MachinePools {
    seen: Fingerprints,
}

impl Mapper for MachinePools {
    type Kind = MachinePool;

    fn wake(&self, mp: &MachinePool, route: &Route) {
        if !self.seen.changed(mp, fingerprint(mp, &mp.spec)) {
            return;
        }
        let ns = mp.namespace().unwrap_or_default();
        for p in route.stores.pools_owned_by(&ns, &mp.name_any()) {
            route.to.pool(ObjectRef::from_obj(p.as_ref()));
            for m in route.stores.instances_of(&ns, &p.name_any()) {
                if m.spec.provider_id.is_none() {
                    route.to.machine(ObjectRef::from_obj(m.as_ref()));
                }
            }
        }
    }
}

/// Secret metadata → the MicrovmClusters naming it, and their MicrovmMachines (credentials changed).
#[derive(Default)]
pub(super) struct Secrets {
    seen: Fingerprints,
}

impl Mapper for Secrets {
    type Kind = PartialObjectMeta<Secret>;

    /// Secrets are not labelled for the watch filter: all of them in scope, metadata only, but for
    /// Cluster API's own (one per machine, and never a credential; a credential Secret of that type
    /// is refused with a message saying so, see `credentials`).
    fn config(scope: &Scope) -> watcher::Config {
        let mut config = scope.watcher_config();
        config.label_selector = None;
        config.fields(&format!("type!={CAPI_SECRET_TYPE}"))
    }

    fn trim(obj: &mut PartialObjectMeta<Secret>) {
        trim::secret(obj);
    }

    fn wake(&self, secret: &PartialObjectMeta<Secret>, route: &Route) {
        if !self
            .seen
            .changed(secret, hash_of(&secret.resource_version()))
        {
            return;
        }
        let ns = secret.namespace().unwrap_or_default();
        for mc in route.stores.clusters_naming_secret(&ns, &secret.name_any()) {
            route.to.cluster(ObjectRef::from_obj(mc.as_ref()));
            if let Some(cluster) = owner_cluster_name(&mc) {
                for m in route.stores.machines_of(&ns, &cluster) {
                    route.to.machine(m);
                }
            }
        }
    }
}

impl Route {
    /// The MicrovmMachines and pools of Cluster `ns/cluster`: their gates moved.
    fn wake_cluster_members(&self, ns: &str, cluster: &str) {
        for m in self.stores.machines_of(ns, cluster) {
            self.to.machine(m);
        }
        for p in self.stores.pools_of(ns, cluster) {
            self.to.pool(p);
        }
    }
}

/// Routes host observations to the objects they concern: a host's microVMs → their MicrovmMachines
/// (or, with none, the namespace's MicrovmClusters); its reachability → the machines recorded on it
/// or waiting for a host, and the MicrovmClusters listing it.
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use capmvm_api::capi::MachineSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
    use kube::runtime::reflector;
    use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

    use super::*;

    fn owned_by_machine_pool() -> Vec<OwnerReference> {
        vec![OwnerReference {
            api_version: format!("{CAPI_GROUP}/v1beta2"),
            kind: "MachinePool".into(),
            name: "mp".into(),
            uid: "mp-uid".into(),
            ..Default::default()
        }]
    }

    /// A route whose pool cache holds MicrovmMachinePool `ns/workers` of MachinePool `mp`, and the
    /// queue of the pools it wakes.
    fn route() -> (Route, UnboundedReceiver<ObjectRef<MicrovmMachinePool>>) {
        let (pools, mut pools_w) = reflector::store();
        let pool: MicrovmMachinePool = serde_json::from_value(serde_json::json!({
            "apiVersion": format!("{GROUP}/v1alpha2"),
            "kind": "MicrovmMachinePool",
            "metadata": {"name": "workers", "namespace": "ns", "ownerReferences": owned_by_machine_pool()},
            "spec": {"template": {
                "vcpu": 2, "memoryMb": 2048, "rootVolume": {"id": "root"},
                "kernel": {"image": "ghcr.io/example/kernel:1", "filename": "boot/vmlinux"},
                "networkInterfaces": [],
            }},
        }))
        .unwrap();
        pools_w.apply_watcher_event(&watcher::Event::Apply(pool));
        let (machine, _) = unbounded_channel();
        let (cluster, _) = unbounded_channel();
        let (pool, woken) = unbounded_channel();
        let route = Route {
            to: Triggers {
                machine,
                cluster,
                pool,
            },
            stores: Stores {
                machines: reflector::store().0,
                capi_machines: reflector::store().0,
                clusters: reflector::store().0,
                microvm_clusters: reflector::store().0,
                secrets: reflector::store().0,
                pools,
                machine_pools: reflector::store().0,
            },
            own_writes: Arc::default(),
        };
        (route, woken)
    }

    fn woken(queue: &mut UnboundedReceiver<ObjectRef<MicrovmMachinePool>>) -> Vec<String> {
        std::iter::from_fn(|| queue.try_recv().ok())
            .map(|r| r.name)
            .collect()
    }

    /// What the pool reads of its Machines wakes it, the start of a Machine's deletion (core
    /// drains the Node first) included, as the watch module says; nothing else does.
    #[test]
    fn a_pool_machine_wakes_its_pool_when_what_the_pool_reads_changes() {
        let (route, mut queue) = route();
        let mapper = Machines::default();
        let mut m = Machine::new(
            "workers-1",
            MachineSpec {
                cluster_name: "demo".into(),
                ..Default::default()
            },
        );
        m.metadata.namespace = Some("ns".into());
        m.metadata.uid = Some("m-uid".into());
        m.metadata.owner_references = Some(owned_by_machine_pool());
        m.metadata.finalizers = Some(vec!["machine.cluster.x-k8s.io".into()]);
        mapper.wake(&m, &route);
        assert_eq!(woken(&mut queue), ["workers"], "first sight");
        m.metadata.labels = Some([("unrelated".to_string(), "1".to_string())].into());
        mapper.wake(&m, &route);
        assert!(woken(&mut queue).is_empty(), "nothing the pool reads");
        m.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        mapper.wake(&m, &route);
        assert_eq!(woken(&mut queue), ["workers"], "its deletion began");
        m.metadata.finalizers = None;
        mapper.wake(&m, &route);
        assert_eq!(woken(&mut queue), ["workers"], "it is gone");
    }
}
