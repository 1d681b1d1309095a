//! Deciding for one MicrovmMachinePool: how many instances exist, which go, and what to report.
//!
//! The pool is the scale set: its instances are MicrovmMachines (MachinePool Machines), whose
//! microVMs the machine engine creates and deletes. This engine decides, in order:
//!
//! 1. the preamble and gates shared with machines and clusters ([`crate::preamble`]); a deleted pool
//!    deletes every Machine ([`reconcile_delete`]);
//! 2. **repair**: the Machine of every failed, vanished or health-check-remediated instance goes;
//! 3. **scale down**: up-to-date instances beyond the desired count go, in victim order
//!    ([`select`]); an instance whose Machine core has not created yet is waited for, never deleted
//!    in its place;
//! 4. **roll**: outdated instances go while the ready ones left stay at least
//!    `desired - maxUnavailable`, so replacements are ready before more go;
//! 5. **create** up-to-date instances up to the desired count, while every instance that exists
//!    (deleting ones included, until gone) stays within `desired + maxSurge`.
//!
//! `spec.providerIDList` is derived from every instance that still exists, so a Node leaves it only
//! after its Machine drained.

mod expectations;
mod naming;
mod observe;
mod plan;
mod select;
mod status;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use capmvm_api::conditions::{reasons, types};
use capmvm_api::keys::{
    CLUSTER_NAME_LABEL, POOL_FAILURE_DOMAIN_ANNOTATION, POOL_FINALIZER, POOL_NAME_LABEL,
    TEMPLATE_HASH_ANNOTATION, WATCH_FILTER_LABEL,
};
use capmvm_api::pool::must_format_label_value;
use capmvm_api::{MicrovmCluster, MicrovmMachinePool, validation};
use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt};

pub use expectations::{CachedMachine, EXPECTATION_TTL, ExpectationsSeen, caches_behind};
pub use naming::{new_instance_names, template_hash};
pub use observe::{InstanceHealth, InstanceMachine, ObservedInstance, ObservedPool};
pub use plan::{
    DeletionReason, InstanceMark, MachineDeletion, NewInstance, PoolPlan, PoolWrite,
    done_when_gone, events,
};

use crate::conditions::{Conditions, Status};
use crate::observe::MachinePoolFacts;
use crate::plan::{Event, EventKind, Requeue};
use crate::preamble::{self, Gates, Path, preamble};
use select::{Candidate, sort_victims};
use status::{Progress, Verdict};

/// At most one status write per pool within this interval while its counts move: a roll of 200
/// instances changed a count about 500 times in a minute. What is held back is written when the
/// interval ends (the plan asks to be reconciled then), so the last state is always written.
pub const STATUS_WRITE_INTERVAL: Duration = Duration::from_secs(1);

/// Decides what to do for one MicrovmMachinePool.
pub fn decide_pool(obs: &ObservedPool, now: Timestamp) -> PoolPlan {
    let mut plan = decide(obs, now);
    coalesce_status(obs, &mut plan, now);
    plan
}

/// Holds back a status that differs from the stored one if the last status write of this pool was
/// less than [`STATUS_WRITE_INTERVAL`] ago, and asks to decide again when the interval ends.
fn coalesce_status(obs: &ObservedPool, plan: &mut PoolPlan, now: Timestamp) {
    let (Some(status), Some(last)) = (&plan.status, obs.last_status_write) else {
        return;
    };
    if obs.pool.status.as_ref() == Some(status) {
        return;
    }
    // A clock that went back counts as the interval having passed.
    let since = Duration::try_from(now.duration_since(last)).unwrap_or(STATUS_WRITE_INTERVAL);
    let Some(left) = STATUS_WRITE_INTERVAL
        .checked_sub(since)
        .filter(|d| !d.is_zero())
    else {
        return;
    };
    plan.status = None;
    plan.requeue = match plan.requeue {
        keep @ (Requeue::Immediately | Requeue::Backoff) => keep,
        Requeue::After(d) => Requeue::After(d.min(left)),
        Requeue::Await => Requeue::After(left),
    };
}

fn decide(obs: &ObservedPool, now: Timestamp) -> PoolPlan {
    let pool = &obs.pool;
    let mut plan = PoolPlan {
        provider_id_list: derived_provider_id_list(obs),
        mark_instances: delete_marks(obs),
        ..PoolPlan::default()
    };
    let stored = pool.status.as_ref().map(|s| s.conditions.clone());
    let mut conditions = Conditions::new(stored.unwrap_or_default(), pool.metadata.generation, now);
    let verdict = match preamble(&pool.metadata, obs.cluster.as_ref(), &mut conditions) {
        Path::Paused => Verdict::Stopped,
        Path::Delete => reconcile_delete(obs, &mut plan, &mut conditions),
        Path::Normal => reconcile_normal(obs, &mut plan, &mut conditions),
    };
    if let Verdict::Decided { .. } = &verdict {
        events_for(&mut plan);
    }
    let mut status = status::report(obs, conditions, &verdict);
    if plan.provider_id_list.is_some() {
        // The providerIDList write is conditional on the version read and changes the spec, so the
        // API server moves the generation by exactly one: conditions decided now describe that
        // generation (only our own write moved it).
        let read = pool.metadata.generation;
        for c in &mut status.conditions {
            if c.observed_generation == read {
                c.observed_generation = read.map(|g| g + 1);
            }
        }
    }
    plan.status = Some(status);
    plan
}

/// The normal path: the gates, a valid spec, then scale, roll, repair and create.
fn reconcile_normal(
    obs: &ObservedPool,
    plan: &mut PoolPlan,
    conditions: &mut Conditions,
) -> Verdict {
    let pool = &obs.pool;
    let cluster_name = pool_cluster_name(obs);
    let gates = Gates {
        has_owner: obs.machine_pool.is_some(),
        owner_wait: "waiting for a Cluster API MachinePool to own this MicrovmMachinePool",
        cluster_name: &cluster_name,
        cluster: obs.cluster.as_ref(),
    };
    let (infra_cluster, machine_pool) = match (
        gates.with_infrastructure(obs.infra_cluster.as_deref()),
        &obs.machine_pool,
    ) {
        (Ok((_, infra)), Some(machine_pool)) => (infra, machine_pool),
        (Err(waiting), _) => {
            preamble::wait(conditions, waiting, None);
            return Verdict::Stopped;
        }
        // The owner gate above waits for the MachinePool.
        (Ok(_), None) => return Verdict::Stopped,
    };
    if let Err(errors) = validation::validate_pool_spec(&pool.spec) {
        conditions.set(
            types::READY,
            Status::False,
            reasons::INVALID_SPEC,
            errors.to_string(),
        );
        return Verdict::Stopped;
    }
    plan.add_finalizer = !has_finalizer(pool);

    let desired = machine_pool.desired_replicas;
    let strategy = &pool.spec.strategy;
    let mut max_surge = strategy.max_surge(desired).unwrap_or(1);
    let max_unavailable = strategy.max_unavailable(desired).unwrap_or(0);
    if max_surge == 0 && max_unavailable == 0 {
        // Percentages can both round to 0 for a small pool; adding one keeps the roll moving.
        max_surge = 1;
    }
    let current = template_hash(&pool.spec.template);
    let progress = scale_and_roll(obs, &current, desired, max_surge, max_unavailable, plan);

    let domains = failure_domains(machine_pool.failure_domains.clone(), infra_cluster);
    let mut taken: BTreeSet<String> = obs.instances.iter().map(|i| i.name.clone()).collect();
    taken.extend(obs.reserved_names.iter().cloned());
    let names = new_instance_names(
        &pool.name_any(),
        pool.metadata.uid.as_deref().unwrap_or_default(),
        pool.metadata
            .resource_version
            .as_deref()
            .unwrap_or_default(),
        &current,
        &taken,
        progress.to_create,
    );
    let mut per_domain = instances_per_domain(obs, &domains);
    for name in names {
        let domain = least_used(&mut per_domain);
        plan.create_instances.push(new_instance(
            obs,
            machine_pool,
            &cluster_name,
            &current,
            name,
            domain,
        ));
    }
    Verdict::Decided {
        desired,
        current,
        progress,
    }
}

fn has_finalizer(pool: &MicrovmMachinePool) -> bool {
    pool.finalizers().iter().any(|f| f == POOL_FINALIZER)
}

/// Scale, roll and repair: fills the plan's Machine deletions and says how many to create.
fn scale_and_roll(
    obs: &ObservedPool,
    current: &str,
    desired: i32,
    max_surge: i32,
    max_unavailable: i32,
    plan: &mut PoolPlan,
) -> Progress {
    let mut progress = Progress::default();
    let delete = |plan: &mut PoolPlan, c: &Candidate<'_>, reason| {
        plan.delete_machines.push(MachineDeletion {
            machine: c.instance.name.clone(),
            reason,
        });
    };
    // An instance on a host being evacuated is replaced like an outdated one: within the pool's
    // maxSurge and maxUnavailable, so evacuation never takes more capacity than a roll would.
    let evacuating = evacuating_hosts(obs.infra_cluster.as_deref());
    let live: Vec<Candidate<'_>> = obs
        .instances
        .iter()
        .filter(|i| !i.leaving())
        .map(|instance| Candidate {
            instance,
            up_to_date: instance.template_hash.as_deref() == Some(current),
            evacuating: instance
                .host
                .as_ref()
                .is_some_and(|h| evacuating.contains(h)),
        })
        .collect();

    // Repair: a broken instance is never counted, and goes through its Machine.
    let mut healthy = Vec::new();
    for c in live {
        match broken(c.instance) {
            Some(reason) if c.has_machine() => {
                progress.repaired.push(c.instance.name.clone());
                delete(plan, &c, reason);
            }
            Some(_) => progress.waiting_for_machines.push(c.instance.name.clone()),
            None => healthy.push(c),
        }
    }
    let policy = obs.pool.spec.strategy.delete_policy();
    let (mut new, mut old): (Vec<_>, Vec<_>) = healthy
        .into_iter()
        .partition(|c| c.up_to_date && !c.evacuating);
    sort_victims(&mut new, policy);
    sort_victims(&mut old, policy);
    let mut available = i32_len(new.iter().chain(&old).filter(|c| c.ready()).count());
    let min_ready = (desired - max_unavailable).max(0);

    // Scale down: the surplus of up-to-date instances, in victim order, never substituting another
    // for a victim whose Machine does not exist yet.
    let surplus = usize::try_from(i32_len(new.len()) - desired).unwrap_or(0);
    for c in new.iter().take(surplus) {
        if c.has_machine() {
            progress.scaled_down.push(c.instance.name.clone());
            delete(plan, c, DeletionReason::ScaleDown);
            if c.ready() {
                available -= 1;
            }
        } else {
            progress.waiting_for_machines.push(c.instance.name.clone());
        }
    }
    let kept_new = i32_len(new.len() - surplus);

    // Roll: outdated instances go while enough ready ones stay.
    for c in &old {
        if !c.has_machine() {
            progress.waiting_for_machines.push(c.instance.name.clone());
            continue;
        }
        if c.ready() {
            if available - 1 < min_ready {
                progress.roll_blocked = true;
                continue;
            }
            available -= 1;
        }
        progress.rolled.push(c.instance.name.clone());
        let reason = if c.up_to_date {
            DeletionReason::HostEvacuating
        } else {
            DeletionReason::Outdated
        };
        delete(plan, c, reason);
    }
    progress.outdated = old.len();

    // Create up to the desired count within the surge: everything that exists counts until gone.
    let existing = i32_len(obs.instances.len());
    let room = (desired + max_surge - existing).max(0);
    let wanted = (desired - kept_new).max(0);
    progress.to_create = usize::try_from(wanted.min(room)).unwrap_or(0);
    progress.surge_blocked = wanted > room;
    progress.max_surge = max_surge;
    progress.max_unavailable = max_unavailable;
    progress
}

/// The canonical endpoints of the MicrovmCluster's hosts under `maintenance: Evacuate`.
pub(crate) fn evacuating_hosts(infra: Option<&MicrovmCluster>) -> BTreeSet<String> {
    infra
        .and_then(|c| c.spec.placement.static_pool.as_ref())
        .map(|pool| {
            pool.hosts
                .iter()
                .filter(|h| h.evacuating())
                .filter_map(|h| crate::machine::canonical_endpoint(&h.endpoint))
                .collect()
        })
        .unwrap_or_default()
}

/// Why an instance must be replaced, if it must.
fn broken(instance: &ObservedInstance) -> Option<DeletionReason> {
    match instance.health {
        InstanceHealth::Failed => Some(DeletionReason::Failed),
        InstanceHealth::Vanished => Some(DeletionReason::Vanished),
        _ if instance
            .machine
            .as_ref()
            .is_some_and(|m| m.owner_remediation_requested) =>
        {
            Some(DeletionReason::Remediated)
        }
        _ => None,
    }
}

/// The delete path: every Machine goes (core drains each), then every instance whose Machine never
/// appeared; the finalizer goes once none exists.
fn reconcile_delete(
    obs: &ObservedPool,
    plan: &mut PoolPlan,
    conditions: &mut Conditions,
) -> Verdict {
    for instance in &obs.instances {
        match &instance.machine {
            Some(m) if !m.deleting => plan.delete_machines.push(MachineDeletion {
                machine: instance.name.clone(),
                reason: DeletionReason::PoolDeleted,
            }),
            None if !instance.deleting => plan.delete_instances.push(instance.name.clone()),
            _ => {}
        }
    }
    if obs.instances.is_empty() {
        plan.remove_finalizer = has_finalizer(&obs.pool);
    } else {
        conditions.set(
            types::READY,
            Status::False,
            reasons::DELETING,
            format!(
                "waiting for {} instance(s) to be deleted",
                obs.instances.len()
            ),
        );
    }
    Verdict::Stopped
}

/// The instances whose delete-machine annotation differs from their Machine's (cluster-autoscaler
/// sets it on the Machine; CAPZ #4941 read it from the wrong object).
fn delete_marks(obs: &ObservedPool) -> Vec<InstanceMark> {
    obs.instances
        .iter()
        .filter(|i| !i.deleting)
        .filter_map(|i| {
            let requested = i.machine.as_ref().is_some_and(|m| m.delete_requested);
            (requested != i.delete_annotated).then(|| InstanceMark {
                instance: i.name.clone(),
                delete_requested: requested,
            })
        })
        .collect()
}

/// Every providerID of an instance that still exists (deleting ones included), sorted; `None` when
/// the spec already has exactly these.
fn derived_provider_id_list(obs: &ObservedPool) -> Option<Vec<String>> {
    let list: Vec<String> = obs
        .instances
        .iter()
        .filter_map(|i| i.provider_id.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    (list != obs.pool.spec.provider_id_list).then_some(list)
}

fn pool_cluster_name(obs: &ObservedPool) -> String {
    cluster_name(&obs.pool, obs.machine_pool.as_ref())
}

/// The pool's Cluster: its cluster-name label, else its MachinePool's. The operator looks the
/// Cluster up by this name.
pub fn cluster_name(pool: &MicrovmMachinePool, machine_pool: Option<&MachinePoolFacts>) -> String {
    pool.labels()
        .get(CLUSTER_NAME_LABEL)
        .cloned()
        .or_else(|| machine_pool.map(|m| m.cluster_name.clone()))
        .unwrap_or_default()
}

/// The MachinePool's failure domains, or all of the cluster's when it names none.
/// The domains new instances spread over: the MachinePool's, else the cluster's; without those whose
/// every host is cordoned or evacuating (read from the spec: the cluster's status may not show the
/// maintenance yet), unless that leaves none.
fn failure_domains(named: Vec<String>, infra: &MicrovmCluster) -> Vec<String> {
    let domains: Vec<String> = if named.is_empty() {
        infra
            .status
            .as_ref()
            .map(|s| s.failure_domains.iter().map(|d| d.name.clone()).collect())
            .unwrap_or_default()
    } else {
        named
    };
    let hosts = infra
        .spec
        .placement
        .static_pool
        .as_ref()
        .map(|p| p.hosts.as_slice())
        .unwrap_or_default();
    let in_service: Vec<String> = domains
        .iter()
        .filter(|d| {
            hosts
                .iter()
                .any(|h| h.schedulable() && h.failure_domain_name() == d.as_str())
        })
        .cloned()
        .collect();
    if in_service.is_empty() {
        domains
    } else {
        in_service
    }
}

fn instances_per_domain(obs: &ObservedPool, domains: &[String]) -> BTreeMap<String, usize> {
    let mut counts: BTreeMap<String, usize> = domains.iter().map(|d| (d.clone(), 0)).collect();
    for instance in obs.instances.iter().filter(|i| !i.leaving()) {
        if let Some(n) = instance
            .failure_domain
            .as_ref()
            .and_then(|d| counts.get_mut(d))
        {
            *n += 1;
        }
    }
    counts
}

/// The domain with the fewest instances (the first by name among equals), counted as used.
fn least_used(counts: &mut BTreeMap<String, usize>) -> Option<String> {
    let (domain, n) = counts.iter_mut().min_by_key(|(_, n)| **n)?;
    *n += 1;
    Some(domain.clone())
}

fn new_instance(
    obs: &ObservedPool,
    machine_pool: &MachinePoolFacts,
    cluster_name: &str,
    current: &str,
    name: String,
    domain: Option<String>,
) -> NewInstance {
    let mut annotations =
        BTreeMap::from([(TEMPLATE_HASH_ANNOTATION.to_string(), current.to_string())]);
    if let Some(domain) = domain {
        annotations.insert(POOL_FAILURE_DOMAIN_ANNOTATION.to_string(), domain);
    }
    // Core makes the instance's Machine its controller; the pool's reference only lets the pool's
    // deletion collect instances whose Machine never appeared.
    let mut owner = obs.pool.controller_owner_ref(&()).unwrap_or_default();
    owner.controller = Some(false);
    NewInstance {
        owner,
        name,
        labels: BTreeMap::from([
            (
                POOL_NAME_LABEL.to_string(),
                must_format_label_value(&machine_pool.name),
            ),
            (CLUSTER_NAME_LABEL.to_string(), cluster_name.to_string()),
        ])
        .into_iter()
        // An operator started with --watch-filter sees only labelled objects: instances too.
        .chain(
            obs.pool
                .labels()
                .get(WATCH_FILTER_LABEL)
                .map(|v| (WATCH_FILTER_LABEL.to_string(), v.clone())),
        )
        .collect(),
        annotations,
        spec: obs.pool.spec.template.clone(),
    }
}

fn events_for(plan: &mut PoolPlan) {
    if !plan.create_instances.is_empty() {
        let names: Vec<&str> = plan
            .create_instances
            .iter()
            .map(|i| i.name.as_str())
            .collect();
        plan.events.push(Event {
            kind: EventKind::Normal,
            reason: events::INSTANCES_CREATED,
            action: "Create",
            note: format!("created instance(s) {}", names.join(", ")),
        });
    }
    let (repairs, others): (Vec<_>, Vec<_>) = plan.delete_machines.iter().partition(|d| {
        matches!(
            d.reason,
            DeletionReason::Failed | DeletionReason::Vanished | DeletionReason::Remediated
        )
    });
    for (deletions, kind, reason) in [
        (repairs, EventKind::Warning, events::INSTANCES_REPLACED),
        (others, EventKind::Normal, events::MACHINES_DELETED),
    ] {
        if deletions.is_empty() {
            continue;
        }
        let list: Vec<String> = deletions
            .iter()
            .map(|d| format!("{} ({})", d.machine, d.reason.describe()))
            .collect();
        plan.events.push(Event {
            kind,
            reason,
            action: "DeleteMachine",
            note: format!("deleting Machine(s) {}", list.join(", ")),
        });
    }
}

fn i32_len(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}
