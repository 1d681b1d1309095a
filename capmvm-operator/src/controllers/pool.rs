//! The MicrovmMachinePool controller: gather the pool, its MachinePool, its instances and their
//! Machines from the watch caches, let `decide_pool` decide, and carry the plan out in its field
//! order, stopping at the first failure (the next decision starts from what then exists).

use std::collections::BTreeSet;
use std::sync::Arc;

use capmvm_api::capi::{CAPI_GROUP, Machine};
use capmvm_api::keys::{
    DELETE_MACHINE_ANNOTATION, HOST_ANNOTATION, POOL_FAILURE_DOMAIN_ANNOTATION, POOL_FINALIZER,
    TEMPLATE_HASH_ANNOTATION,
};
use capmvm_api::{GROUP, MicrovmMachine, MicrovmMachinePool};
use capmvm_reconcile::ClusterFacts;
use capmvm_reconcile::pool::{
    CachedMachine, ExpectationsSeen, InstanceHealth, InstanceMachine, NewInstance,
    ObservedInstance, ObservedPool, PoolPlan, PoolWrite, decide_pool, done_when_gone,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, info, instrument};

use super::{Error, Outcome, Reconciled, note_version, publish, wrap};
use crate::context::Ctx;
use crate::patch;
use crate::watch::api_group;

/// Controller name in metrics and events.
pub const CONTROLLER: &str = "microvmmachinepool";

/// Reconciles one MicrovmMachinePool.
#[instrument(skip_all, fields(pool = %format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())))]
pub async fn reconcile(obj: Arc<MicrovmMachinePool>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    wrap(
        CONTROLLER,
        obj,
        ctx,
        caches_behind,
        |pool, ctx| async move {
            let key = super::key(&pool);
            let mut versions = vec![pool.resource_version().unwrap_or_default()];
            let result = reconcile_once(pool, &ctx, &key, &mut versions).await;
            Reconciled { result, versions }
        },
    )
    .await
}

/// Whether the caches do not show yet what the pool's last reconcile created and deleted (the
/// engine judges it: `caches_behind`); expectations met or given up on are forgotten.
fn caches_behind(pool: &MicrovmMachinePool, ctx: &Ctx) -> bool {
    let key = super::key(pool);
    let Some(expecting) = ctx.pool_expectations.get(&key) else {
        return false;
    };
    let ns = pool.namespace().unwrap_or_default();
    let seen = ExpectationsSeen {
        age: expecting.age,
        created: expecting
            .created
            .into_iter()
            .map(|name| {
                let cached = ctx
                    .stores
                    .machines
                    .get(&ObjectRef::new(&name).within(&ns))
                    .is_some();
                (name, cached)
            })
            .collect(),
        deleted: expecting
            .deleted
            .into_iter()
            .map(|name| {
                let cached = match ctx
                    .stores
                    .capi_machines
                    .get(&ObjectRef::new(&name).within(&ns))
                {
                    None => CachedMachine::Absent,
                    Some(m) if m.meta().deletion_timestamp.is_some() => CachedMachine::Deleting,
                    Some(_) => CachedMachine::Live,
                };
                (name, cached)
            })
            .collect(),
    };
    let behind = capmvm_reconcile::pool::caches_behind(&seen);
    if !behind {
        ctx.pool_expectations.forget(&key);
    }
    behind
}

async fn reconcile_once(
    pool: MicrovmMachinePool,
    ctx: &Ctx,
    key: &str,
    versions: &mut Vec<String>,
) -> Result<Outcome, Error> {
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
        return Ok(Outcome::Gone);
    }
    Ok(Outcome::Requeue(plan.requeue))
}

/// Everything `decide_pool` decides from, read from the watch caches.
pub fn gather(ctx: &Ctx, pool: &MicrovmMachinePool) -> ObservedPool {
    let ns = pool.namespace().unwrap_or_default();
    let machine_pool = ctx.stores.machine_pool_of(pool);
    let cluster_name = capmvm_reconcile::pool::cluster_name(pool, machine_pool.as_ref());
    let cluster = ctx.stores.cluster(&ns, &cluster_name);
    let infra_cluster = ctx
        .stores
        .infra_cluster(&ns, &cluster_name, cluster.as_deref());
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
                        && o.name == mp.name
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
        cluster: cluster.as_deref().map(ClusterFacts::from),
        infra_cluster,
        instances,
        reserved_names,
        last_status_write: ctx.pool_status_writes.last(&super::key(pool)),
    }
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
        .map(|mach| InstanceMachine::from(mach.as_ref()));
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
        host: m.annotations().get(HOST_ANNOTATION).cloned(),
        name,
    }
}

/// The MicrovmMachine of a new instance, as the engine describes it.
fn instance_object(pool: &MicrovmMachinePool, new: &NewInstance) -> MicrovmMachine {
    let mut instance = MicrovmMachine::new(&new.name, new.spec.clone());
    instance.metadata = ObjectMeta {
        name: Some(new.name.clone()),
        namespace: pool.namespace(),
        labels: Some(new.labels.clone()),
        annotations: Some(new.annotations.clone()),
        owner_references: Some(vec![new.owner.clone()]),
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

/// Whether `e` answers `write` with a 404 that the engine counts as done ([`done_when_gone`]).
fn done_anyway(write: PoolWrite, e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404) && done_when_gone(write)
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

    // 1. The finalizer, before any instance exists.
    if plan.add_finalizer {
        pool = patch::add_metadata(&pools, &pool, Some(POOL_FINALIZER), &[]).await?;
        note_version(versions, &pool);
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
                Err(e) if done_anyway(PoolWrite::MarkInstance, &e) => {}
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
                Err(e) if done_anyway(PoolWrite::DeleteMachine, &e) => {}
                Err(e) => return Err(e),
            }
            deleted.insert(d.machine.clone());
        }
        for name in &plan.delete_instances {
            match instances.delete(name, &DeleteParams::default()).await {
                Ok(_) => info!(instance = %name, "instance without Machine deleted"),
                Err(e) if done_anyway(PoolWrite::DeleteInstance, &e) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
    .await;
    ctx.pool_expectations.expect(key, created, deleted);
    result?;

    // 5. spec.providerIDList, conditional on the version read.
    if let Some(list) = &plan.provider_id_list {
        let body = json!({
            "metadata": {"resourceVersion": pool.resource_version()},
            "spec": {"providerIDList": list},
        });
        pool = pools
            .patch(&pool.name_any(), &params(), &Patch::Merge(&body))
            .await?;
        note_version(versions, &pool);
    }
    // 6. The status (its conditions already name the generation a providerIDList write gives).
    if let Some(status) = &plan.status
        && let Some(updated) = patch::status(&pools, &pool, pool.status.as_ref(), status).await?
    {
        ctx.pool_status_writes.wrote(key, Timestamp::now());
        pool = updated;
        note_version(versions, &pool);
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
