//! Owners and clusters, looked up in the watch caches: the one place every controller and mapper
//! finds a MicrovmMachine's Machine, a pool's MachinePool, a Cluster and its MicrovmCluster, and
//! every mapper the members of a Cluster, a pool or a Secret's users.

use std::sync::Arc;

use capmvm_api::capi::{CAPI_GROUP, Cluster, Machine};
use capmvm_api::conditions::types;
use capmvm_api::keys::{CLUSTER_NAME_LABEL, DEPLOYMENT_NAME_LABEL};
use capmvm_api::{GROUP, MicrovmCluster, MicrovmMachine, MicrovmMachinePool};
use capmvm_reconcile::machine::{instance_pool, recorded_host};
use capmvm_reconcile::{ClusterFacts, EvacuationPeer, MachineFacts, MachinePoolFacts};
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use super::{Stores, api_group, credential_secret_names, owner_cluster_name};

impl Stores {
    /// The CAPI Machine owning `machine` (ownerReference kind Machine, group cluster.x-k8s.io), as
    /// the engine reads it.
    pub fn owner_machine(&self, machine: &MicrovmMachine) -> Option<MachineFacts> {
        let ns = machine.namespace().unwrap_or_default();
        machine
            .owner_references()
            .iter()
            .find(|o| o.kind == "Machine" && api_group(&o.api_version) == CAPI_GROUP)
            .and_then(|o| self.capi_machines.get(&ObjectRef::new(&o.name).within(&ns)))
            .map(|m| MachineFacts::from(m.as_ref()))
    }

    /// The other Machines of the group `machine` is released within when its host is evacuated:
    /// those of its MachineDeployment, or its cluster's control-plane Machines; `None` for a
    /// Machine in neither (nothing to keep whole). Read from the caches, only while the engine asks
    /// ([`capmvm_reconcile::machine::wants_evacuation_group`]).
    pub fn evacuation_peers(
        &self,
        machine: &MicrovmMachine,
        owner: &MachineFacts,
    ) -> Option<Vec<EvacuationPeer>> {
        if owner.deployment.is_none() && !owner.control_plane {
            return None;
        }
        let ns = machine.namespace().unwrap_or_default();
        let own = machine
            .owner_references()
            .iter()
            .find(|o| o.kind == "Machine" && api_group(&o.api_version) == CAPI_GROUP)
            .map(|o| o.name.clone());
        let in_group = |m: &Machine| match &owner.deployment {
            Some(deployment) => m.labels().get(DEPLOYMENT_NAME_LABEL) == Some(deployment),
            None => m.is_control_plane() && m.spec.cluster_name == owner.cluster_name,
        };
        let peers = self
            .capi_machines
            .state()
            .into_iter()
            .filter(|m| m.namespace().as_deref() == Some(ns.as_str()))
            .filter(|m| own.as_deref() != m.metadata.name.as_deref())
            .filter(|m| in_group(m))
            .map(|m| {
                let reference = &m.spec.infrastructure_ref;
                let infra_name = (reference.api_group == GROUP
                    && reference.kind == "MicrovmMachine")
                    .then(|| reference.name.clone());
                let infra = infra_name
                    .as_ref()
                    .and_then(|n| self.machines.get(&ObjectRef::new(n).within(&ns)));
                EvacuationPeer {
                    name: infra_name.unwrap_or_else(|| m.name_any()),
                    deleting: m.metadata.deletion_timestamp.is_some(),
                    ready: m.status.as_ref().is_some_and(|s| {
                        s.conditions
                            .iter()
                            .any(|c| c.r#type == types::READY && c.status == "True")
                    }),
                    host: infra
                        .as_deref()
                        .and_then(recorded_host)
                        .map(|h| h.to_string()),
                    ready_reason: infra.as_deref().and_then(|i| {
                        let conditions = &i.status.as_ref()?.conditions;
                        capmvm_reconcile::conditions::reason(conditions, types::READY)
                            .map(str::to_string)
                    }),
                }
            })
            .collect();
        Some(peers)
    }

    /// The CAPI MachinePool owning `pool` (ownerReference kind MachinePool, group cluster.x-k8s.io),
    /// as the engines read it.
    pub fn machine_pool_of(&self, pool: &MicrovmMachinePool) -> Option<MachinePoolFacts> {
        let ns = pool.namespace().unwrap_or_default();
        pool.owner_references()
            .iter()
            .find(|o| o.kind == "MachinePool" && api_group(&o.api_version) == CAPI_GROUP)
            .and_then(|o| self.machine_pools.get(&ObjectRef::new(&o.name).within(&ns)))
            .map(|m| MachinePoolFacts::from(m.as_ref()))
    }

    /// The MachinePool of the pool `pool_name` in `ns`, for one of its instances.
    pub fn machine_pool_of_instance(&self, ns: &str, pool_name: &str) -> Option<MachinePoolFacts> {
        let pool = self.pools.get(&ObjectRef::new(pool_name).within(ns))?;
        self.machine_pool_of(&pool)
    }

    /// The Cluster `ns/name`.
    pub fn cluster(&self, ns: &str, name: &str) -> Option<Arc<Cluster>> {
        self.clusters.get(&ObjectRef::new(name).within(ns))
    }

    /// The Cluster owning MicrovmCluster `mc` (ownerReference kind Cluster), as the engine reads it.
    pub fn owner_cluster(&self, mc: &MicrovmCluster) -> Option<ClusterFacts> {
        let ns = mc.namespace().unwrap_or_default();
        mc.owner_references()
            .iter()
            .find(|o| o.kind == "Cluster" && api_group(&o.api_version) == CAPI_GROUP)
            .and_then(|o| self.cluster(&ns, &o.name))
            .map(|c| ClusterFacts::from(c.as_ref()))
    }

    /// The MicrovmCluster of a cluster: by the Cluster's infrastructureRef, else (the Cluster is
    /// gone, as during teardown) the one owned by or labelled for that cluster name.
    pub fn infra_cluster(
        &self,
        ns: &str,
        cluster_name: &str,
        cluster: Option<&Cluster>,
    ) -> Option<Arc<MicrovmCluster>> {
        if let Some(r) = cluster.and_then(|c| c.spec.infrastructure_ref.as_ref())
            && r.api_group == GROUP
            && r.kind == "MicrovmCluster"
        {
            return self
                .microvm_clusters
                .get(&ObjectRef::new(&r.name).within(ns));
        }
        self.microvm_clusters.state().into_iter().find(|mc| {
            mc.namespace().as_deref() == Some(ns)
                && owner_cluster_name(mc).as_deref() == Some(cluster_name)
        })
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
