//! The MicrovmMachinePool controller: gather the pool, its MachinePool, its instances and their
//! Machines from the watch caches, let `decide_pool` decide, and carry the plan out in its field
//! order, stopping at the first failure (the next decision starts from what then exists).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use capmvm_api::capi::{CAPI_GROUP, Machine, MachinePool};
use capmvm_api::keys::{
    CLUSTER_NAME_LABEL, DELETE_MACHINE_ANNOTATION, POOL_FAILURE_DOMAIN_ANNOTATION, POOL_FINALIZER,
    TEMPLATE_HASH_ANNOTATION,
};
use capmvm_api::{GROUP, MicrovmMachine, MicrovmMachinePool};
use capmvm_reconcile::Requeue;
use capmvm_reconcile::pool::{
    InstanceHealth, InstanceMachine, NewInstance, ObservedInstance, ObservedPool, PoolPlan,
    decide_pool,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, info, instrument};

use super::{Error, publish};
use crate::context::Ctx;
use crate::metrics::ReconcileResult;
use crate::patch;
use crate::watch::api_group;

/// Controller name in metrics and events.
pub const CONTROLLER: &str = "microvmmachinepool";

/// How soon to look again while the caches have not caught up with our own writes.
const CACHE_CATCH_UP_RETRY: Duration = Duration::from_millis(200);

/// How long to wait for the caches to show our own creates and deletes before deciding anyway (a
/// watch that lost an event relists well within this).
const EXPECTATION_TTL: Duration = Duration::from_secs(30);

/// What the last reconcile of each pool created and deleted, until the caches show it: a decision
/// from a cache that misses an instance just created would create another under a new name.
#[derive(Default)]
pub struct Expectations(Mutex<HashMap<String, Expected>>);

struct Expected {
    at: Instant,
    /// Instances created: must appear in the instance cache.
    created: BTreeSet<String>,
    /// Machines deleted: must show as deleting, or be gone, in the Machine cache.
    deleted: BTreeSet<String>,
}

impl Expectations {
    fn expect(&self, key: &str, created: BTreeSet<String>, deleted: BTreeSet<String>) {
        if created.is_empty() && deleted.is_empty() {
            return;
        }
        if let Ok(mut map) = self.0.lock() {
            map.insert(
                key.to_string(),
                Expected {
                    at: Instant::now(),
                    created,
                    deleted,
                },
            );
        }
    }

    /// Whether `key` still waits for the caches: `seen(name)` tells whether an instance created is
    /// cached, `leaving(name)` whether a Machine deleted shows as deleting or gone.
    fn pending(
        &self,
        key: &str,
        seen: impl Fn(&str) -> bool,
        leaving: impl Fn(&str) -> bool,
    ) -> bool {
        let Ok(mut map) = self.0.lock() else {
            return false;
        };
        let Some(expected) = map.get(key) else {
            return false;
        };
        let met =
            expected.created.iter().all(|n| seen(n)) && expected.deleted.iter().all(|n| leaving(n));
        if met || expected.at.elapsed() > EXPECTATION_TTL {
            map.remove(key);
            return false;
        }
        true
    }
}

/// When this process last wrote each pool's status, by pool key: the engine holds a status back
/// within [`capmvm_reconcile::pool::STATUS_WRITE_INTERVAL`] of the last write.
#[derive(Default)]
pub struct StatusWrites(Mutex<HashMap<String, Timestamp>>);

impl StatusWrites {
    fn last(&self, key: &str) -> Option<Timestamp> {
        self.0.lock().ok()?.get(key).copied()
    }

    fn wrote(&self, key: &str, at: Timestamp) {
        if let Ok(mut map) = self.0.lock() {
            map.insert(key.to_string(), at);
        }
    }

    fn forget(&self, key: &str) {
        if let Ok(mut map) = self.0.lock() {
            map.remove(key);
        }
    }
}

/// Reconciles one MicrovmMachinePool.
#[instrument(skip_all, fields(pool = %format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())))]
pub async fn reconcile(obj: Arc<MicrovmMachinePool>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let started = Instant::now();
    let key = super::key(obj.as_ref());
    let ns = obj.namespace().unwrap_or_default();
    let version = obj.resource_version().unwrap_or_default();
    let behind = ctx.writes.is_stale(&key, &version)
        || ctx.pool_expectations.pending(
            &key,
            |name| {
                ctx.stores
                    .machines
                    .get(&ObjectRef::new(name).within(&ns))
                    .is_some()
            },
            |name| {
                ctx.stores
                    .capi_machines
                    .get(&ObjectRef::new(name).within(&ns))
                    .is_none_or(|m| m.meta().deletion_timestamp.is_some())
            },
        );
    if behind {
        debug!("the caches are behind this pool's last writes; retrying shortly");
        return Ok(Action::requeue(CACHE_CATCH_UP_RETRY));
    }
    let mut versions = vec![version];
    let result = reconcile_once(obj.as_ref().clone(), &ctx, &key, &mut versions).await;
    ctx.writes.record(&key, &versions);
    let outcome = match &result {
        Ok(_) => {
            ctx.backoff.reset(&key);
            ReconcileResult::Success
        }
        Err(_) => ReconcileResult::Error,
    };
    ctx.metrics
        .reconciled(CONTROLLER, outcome, started.elapsed());
    result
}

async fn reconcile_once(
    pool: MicrovmMachinePool,
    ctx: &Ctx,
    key: &str,
    versions: &mut Vec<String>,
) -> Result<Action, Error> {
    let obs = gather(ctx, &pool);
    let plan = decide_pool(&obs, Timestamp::now());
    debug!(
        instances = obs.instances.len(),
        create = plan.create_instances.len(),
        delete_machines = plan.delete_machines.len(),
        requeue = ?plan.requeue,
        "decided"
    );
    let gone = execute(ctx, pool, &obs, &plan, key, versions).await?;
    if gone {
        ctx.pool_status_writes.forget(key);
        return Ok(Action::await_change());
    }
    Ok(match plan.requeue {
        Requeue::After(d) => Action::requeue(d.min(ctx.sync_period)),
        Requeue::Immediately => Action::requeue(Duration::ZERO),
        Requeue::Await => Action::requeue(ctx.sync_period),
    })
}

/// Everything `decide_pool` decides from, read from the watch caches.
pub fn gather(ctx: &Ctx, pool: &MicrovmMachinePool) -> ObservedPool {
    let ns = pool.namespace().unwrap_or_default();
    let machine_pool = machine_pool_of(ctx, pool);
    let cluster_name = pool
        .labels()
        .get(CLUSTER_NAME_LABEL)
        .cloned()
        .or_else(|| machine_pool.as_ref().map(|m| m.spec.cluster_name.clone()))
        .unwrap_or_default();
    let cluster = ctx
        .stores
        .clusters
        .get(&ObjectRef::new(&cluster_name).within(&ns))
        .map(|c| c.as_ref().clone());
    let infra_cluster = super::machine::infra_cluster(ctx, &ns, &cluster_name, cluster.as_ref());
    let instances: Vec<ObservedInstance> = ctx
        .stores
        .instances_of(&ns, &pool.name_any())
        .iter()
        .map(|m| observe_instance(ctx, &ns, m))
        .collect();
    let names: BTreeSet<&str> = instances.iter().map(|i| i.name.as_str()).collect();
    // Machines of the MachinePool without an instance (theirs is gone, they are being deleted):
    // core would take a new instance of that name for theirs.
    let reserved_names = match &machine_pool {
        Some(mp) => ctx
            .stores
            .capi_machines
            .state()
            .iter()
            .filter(|m| m.namespace().as_deref() == Some(ns.as_str()))
            .filter(|m| {
                m.owner_references().iter().any(|o| {
                    o.kind == "MachinePool"
                        && api_group(&o.api_version) == CAPI_GROUP
                        && o.name == mp.name_any()
                })
            })
            .map(|m| m.name_any())
            .filter(|n| !names.contains(n.as_str()))
            .collect(),
        None => BTreeSet::new(),
    };
    ObservedPool {
        pool: pool.clone(),
        machine_pool,
        cluster,
        infra_cluster,
        instances,
        reserved_names,
        last_status_write: ctx.pool_status_writes.last(&super::key(pool)),
    }
}

/// The MachinePool owning `pool` (ownerReference kind MachinePool, group cluster.x-k8s.io).
pub fn machine_pool_of(ctx: &Ctx, pool: &MicrovmMachinePool) -> Option<MachinePool> {
    let ns = pool.namespace().unwrap_or_default();
    pool.owner_references()
        .iter()
        .find(|o| o.kind == "MachinePool" && api_group(&o.api_version) == CAPI_GROUP)
        .and_then(|o| {
            ctx.stores
                .machine_pools
                .get(&ObjectRef::new(&o.name).within(&ns))
        })
        .map(|m| m.as_ref().clone())
}

/// The MachinePool of the pool `pool_name` in `ns`, for one of its instances.
pub fn machine_pool_of_instance(ctx: &Ctx, ns: &str, pool_name: &str) -> Option<MachinePool> {
    let pool = ctx
        .stores
        .pools
        .get(&ObjectRef::new(pool_name).within(ns))?;
    machine_pool_of(ctx, &pool)
}

fn observe_instance(ctx: &Ctx, ns: &str, m: &MicrovmMachine) -> ObservedInstance {
    let name = m.name_any();
    // Core creates the Machine with the instance's name and points it at the instance.
    let machine = ctx
        .stores
        .capi_machines
        .get(&ObjectRef::new(&name).within(ns))
        .filter(|mach| {
            let infra = &mach.spec.infrastructure_ref;
            infra.api_group == GROUP && infra.kind == "MicrovmMachine" && infra.name == name
        })
        .map(|mach| InstanceMachine {
            delete_requested: mach.annotations().contains_key(DELETE_MACHINE_ANNOTATION),
            owner_remediation_requested: mach.owner_remediation_requested(),
            deleting: mach.meta().deletion_timestamp.is_some(),
        });
    ObservedInstance {
        machine,
        template_hash: m.annotations().get(TEMPLATE_HASH_ANNOTATION).cloned(),
        health: InstanceHealth::of(m),
        deleting: m.meta().deletion_timestamp.is_some(),
        created: m
            .meta()
            .creation_timestamp
            .as_ref()
            .map_or(Timestamp::UNIX_EPOCH, |t| t.0),
        provider_id: m.spec.provider_id.clone(),
        failure_domain: m.annotations().get(POOL_FAILURE_DOMAIN_ANNOTATION).cloned(),
        delete_annotated: m.annotations().contains_key(DELETE_MACHINE_ANNOTATION),
        name,
    }
}

/// The MicrovmMachine of a new instance, with a non-controller ownerReference to the pool (core
/// makes its Machine the controller; the pool's deletion collects instances whose Machine never
/// appeared).
fn instance_object(pool: &MicrovmMachinePool, new: &NewInstance) -> MicrovmMachine {
    let mut owner = pool.controller_owner_ref(&()).unwrap_or_default();
    owner.controller = Some(false);
    let mut instance = MicrovmMachine::new(&new.name, new.spec.clone());
    instance.metadata = ObjectMeta {
        name: Some(new.name.clone()),
        namespace: pool.namespace(),
        labels: Some(new.labels.clone()),
        annotations: Some(new.annotations.clone()),
        owner_references: Some(vec![owner]),
        ..ObjectMeta::default()
    };
    instance
}

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(patch::FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    }
}

fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Carries out `plan` in its field order; `true` when the pool is gone (its finalizer released).
async fn execute(
    ctx: &Ctx,
    mut pool: MicrovmMachinePool,
    obs: &ObservedPool,
    plan: &PoolPlan,
    key: &str,
    versions: &mut Vec<String>,
) -> Result<bool, Error> {
    let ns = pool.namespace().unwrap_or_default();
    let pools: Api<MicrovmMachinePool> = Api::namespaced(ctx.client.clone(), &ns);
    let instances: Api<MicrovmMachine> = Api::namespaced(ctx.client.clone(), &ns);
    let machines: Api<Machine> = Api::namespaced(ctx.client.clone(), &ns);
    let mut note = |p: &MicrovmMachinePool| {
        let v = p.resource_version().unwrap_or_default();
        if versions.last() != Some(&v) {
            versions.push(v);
        }
    };

    // 1. The finalizer, before any instance exists.
    if plan.add_finalizer {
        pool = patch::add_metadata(&pools, &pool, Some(POOL_FINALIZER), &[]).await?;
        note(&pool);
    }
    // 2. New instances; 3. Machines; 4. instances whose Machine never appeared. What was done is
    // remembered until the caches show it, also when a later step fails.
    let mut created = BTreeSet::new();
    let mut deleted = BTreeSet::new();
    let result = async {
        let post = PostParams {
            field_manager: Some(patch::FIELD_MANAGER.to_string()),
            ..PostParams::default()
        };
        for new in &plan.create_instances {
            instances
                .create(&post, &instance_object(&pool, new))
                .await?;
            created.insert(new.name.clone());
        }
        if !created.is_empty() {
            info!(instances = ?created, "instances created");
        }
        for mark in &plan.mark_instances {
            let value = mark.delete_requested.then_some("true");
            let body = json!({"metadata": {"annotations": {DELETE_MACHINE_ANNOTATION: value}}});
            match instances
                .patch(&mark.instance, &params(), &Patch::Merge(&body))
                .await
            {
                Ok(_) => {}
                Err(e) if not_found(&e) => {}
                Err(e) => return Err(e),
            }
        }
        for d in &plan.delete_machines {
            // Only the Machine we decided about: not a namesake created since.
            let uid = ctx
                .stores
                .capi_machines
                .get(&ObjectRef::new(&d.machine).within(&ns))
                .and_then(|m| m.meta().uid.clone());
            let dp = DeleteParams {
                preconditions: uid.map(|uid| Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match machines.delete(&d.machine, &dp).await {
                Ok(_) => {
                    info!(machine = %d.machine, reason = d.reason.describe(), "Machine deleted")
                }
                Err(e) if not_found(&e) => {}
                Err(e) => return Err(e),
            }
            deleted.insert(d.machine.clone());
        }
        for name in &plan.delete_instances {
            match instances.delete(name, &DeleteParams::default()).await {
                Ok(_) => info!(instance = %name, "instance without Machine deleted"),
                Err(e) if not_found(&e) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
    .await;
    ctx.pool_expectations.expect(key, created, deleted);
    result?;

    // 5. spec.providerIDList, conditional on the version read.
    let generation_before = pool.metadata.generation;
    if let Some(list) = &plan.provider_id_list {
        let body = json!({
            "metadata": {"resourceVersion": pool.resource_version()},
            "spec": {"providerIDList": list},
        });
        pool = pools
            .patch(&pool.name_any(), &params(), &Patch::Merge(&body))
            .await?;
        note(&pool);
    }
    // 6. The status; conditions decided at the old generation describe the new one (only our own
    // providerIDList write moved it).
    if let Some(status) = &plan.status {
        let mut status = status.clone();
        if pool.metadata.generation != generation_before {
            for c in &mut status.conditions {
                if c.observed_generation == generation_before {
                    c.observed_generation = pool.metadata.generation;
                }
            }
        }
        if let Some(updated) = patch::status(&pools, &pool, pool.status.as_ref(), &status).await? {
            ctx.pool_status_writes.wrote(key, Timestamp::now());
            pool = updated;
            note(&pool);
        }
    }
    // 7. Events.
    for event in &plan.events {
        publish(ctx, &pool, event).await;
    }
    // 8. The finalizer, once no instance exists.
    if plan.remove_finalizer {
        patch::remove_finalizer(&pools, &pool, POOL_FINALIZER).await?;
        info!(
            instances = obs.instances.len(),
            "every instance is gone; finalizer released"
        );
        return Ok(pool.meta().deletion_timestamp.is_some());
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn a_pool_waits_until_the_caches_show_its_creates_and_deletes() {
        let e = Expectations::default();
        e.expect("p", set(&["a", "b"]), set(&["old"]));
        assert!(e.pending("p", |n| n == "a", |_| true), "b not cached yet");
        assert!(e.pending("p", |_| true, |_| false), "old still looks live");
        assert!(!e.pending("other", |_| false, |_| false), "per pool");
        assert!(!e.pending("p", |_| true, |_| true));
        assert!(
            !e.pending("p", |_| false, |_| false),
            "forgotten once met: later decisions are not held"
        );
    }

    #[test]
    fn nothing_done_expects_nothing() {
        let e = Expectations::default();
        e.expect("p", BTreeSet::new(), BTreeSet::new());
        assert!(!e.pending("p", |_| false, |_| false));
    }
}
