//! The MicrovmMachine controller: gather an observation, let the engine decide, carry out the plan.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use capmvm_api::capi::{CAPI_GROUP, Cluster};
use capmvm_api::keys::{
    CLUSTER_NAME_LABEL, HOST_ANNOTATION, MACHINE_FINALIZER, ORIGIN_UID_ANNOTATION,
    PLACEMENT_ATTEMPT_ANNOTATION, PLACEMENT_CLAIM_ANNOTATION,
};
use capmvm_api::{
    GROUP, HostEndpoint, MicrovmCluster, MicrovmMachine, MicrovmMachineStatus,
    VmState as ApiVmState,
};
use capmvm_flintlock::{ErrorKind, HostConfig};
use capmvm_reconcile::machine::{
    HostCallFailure, placement_claim, provider_id, record_host_call_failure, recorded_host,
    wants_bootstrap_data, wants_fresh_lookup, wants_pool_facts,
};
use capmvm_reconcile::{
    BootstrapData, Effect, HostFacts, HostLookup, ObservedMachine, ObservedVm, Plan, Requeue,
    VmState, decide,
};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use tracing::{debug, info, instrument, warn};

use super::{Error, publish};
use crate::context::Ctx;
use crate::convert::to_flintlock;
use crate::fault::Point;
use crate::hosts::{Claim, observed_vm};
use crate::metrics::ReconcileResult;
use crate::{credentials, patch};

/// Controller name in metrics and events.
pub const CONTROLLER: &str = "microvmmachine";

/// How soon to look again when the cache still holds a version our own writes replaced.
const STALE_CACHE_RETRY: Duration = Duration::from_millis(200);

/// Most decide-and-carry-out rounds in one reconcile (place+create, adopt, and one spare).
const MAX_ROUNDS: usize = 4;

/// Reconciles one MicrovmMachine.
#[instrument(skip_all, fields(machine = %format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())))]
pub async fn reconcile(obj: Arc<MicrovmMachine>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let started = Instant::now();
    let key = super::key(obj.as_ref());
    if ctx
        .writes
        .is_stale(&key, &obj.resource_version().unwrap_or_default())
    {
        // The cache still holds a version our own writes replaced: deciding on it would only earn a
        // 409. The wake that brought us here may carry news the object does not (a host became
        // reachable), so look again as soon as the cache has caught up rather than drop it.
        return Ok(Action::requeue(STALE_CACHE_RETRY));
    }
    let result = reconcile_rounds(obj.as_ref().clone(), &ctx).await;
    let outcome = match &result {
        Ok((_, outcome)) => {
            ctx.backoff.reset(&key);
            *outcome
        }
        Err(_) => ReconcileResult::Error,
    };
    ctx.metrics
        .reconciled(CONTROLLER, outcome, started.elapsed());
    result.map(|(action, _)| action)
}

/// Decides and carries out until the engine waits for the world; remembers which versions its
/// writes superseded.
async fn reconcile_rounds(
    machine: MicrovmMachine,
    ctx: &Ctx,
) -> Result<(Action, ReconcileResult), Error> {
    let key = super::key(&machine);
    let mut versions = vec![machine.resource_version().unwrap_or_default()];
    let result = rounds(machine, ctx, &mut versions).await;
    ctx.writes.record(&key, &versions);
    result
}

/// Returns the action and how controller-runtime would label the result: a timed look again is
/// `requeue_after`, waiting for changes (with the resync as safety net) is `success`.
async fn rounds(
    mut machine: MicrovmMachine,
    ctx: &Ctx,
    versions: &mut Vec<String>,
) -> Result<(Action, ReconcileResult), Error> {
    let timed = |d: Duration| Ok((Action::requeue(d), ReconcileResult::RequeueAfter));
    let mut known_after_create: Option<Vec<ObservedVm>> = None;
    for round in 0..MAX_ROUNDS {
        let mut obs = gather(ctx, &machine, known_after_create.take()).await?;
        let plan = decide_and_reserve(ctx, &mut obs);
        debug!(round, effects = plan.effects.len(), requeue = ?plan.requeue, "decided");
        let carried = match execute(ctx, &mut machine, &obs, &plan, versions).await {
            Err(e) if e.is_conflict() && round + 1 < MAX_ROUNDS => {
                // Another writer changed the object since it was read (core adopting it, another
                // replica placing it): expected, not a failure. Decide again at once from the fresh
                // object; nothing reached a host on a write that lost (the record precedes the
                // create), and a create whose providerID write lost is adopted from the fresh list.
                debug!(
                    round,
                    "write conflict; deciding again from the fresh object"
                );
                let api: Api<MicrovmMachine> =
                    Api::namespaced(ctx.client.clone(), &machine.namespace().unwrap_or_default());
                match api.get_opt(&machine.name_any()).await? {
                    Some(fresh) => machine = fresh,
                    None => return Ok((Action::await_change(), ReconcileResult::Success)),
                }
                continue;
            }
            carried => carried?,
        };
        let created = match carried {
            Carried::Out { created } => created,
            // Gone: the finalizer was the last thing holding it.
            Carried::Gone => return Ok((Action::await_change(), ReconcileResult::Success)),
            // Final until the spec changes, which wakes the machine: no backoff.
            Carried::SpecRejected => {
                return Ok((Action::requeue(ctx.sync_period), ReconcileResult::Success));
            }
        };
        if !created.is_empty() {
            // The host just answered the create; with the fresh list before it, that is a fresh answer.
            let mut vms = match obs.recorded_host {
                HostLookup::Answered { vms } => vms,
                _ => Vec::new(),
            };
            vms.extend(created);
            known_after_create = Some(vms);
        }
        match plan.requeue {
            Requeue::Immediately if round + 1 < MAX_ROUNDS => continue,
            Requeue::Immediately => return timed(Duration::from_secs(1)),
            Requeue::Await => {
                return Ok((Action::requeue(ctx.sync_period), ReconcileResult::Success));
            }
            Requeue::After(d) => return timed(d.min(ctx.sync_period)),
        }
    }
    timed(Duration::from_secs(1))
}

/// Decides; a decision that may place the machine runs under the hosts' placement turn, with the
/// hosts' allocation read there, and the host it records is reserved before the turn passes,
/// so concurrent placements see each other and a burst spreads like a trickle.
fn decide_and_reserve(ctx: &Ctx, obs: &mut ObservedMachine) -> Plan<MicrovmMachineStatus> {
    let placing =
        obs.machine.spec.provider_id.is_none() && obs.machine.metadata.deletion_timestamp.is_none();
    if !placing {
        return decide(obs, ctx.fault.now());
    }
    ctx.hosts.place(|| {
        // Reachability was read through this cluster's credentials moments ago; allocation is read
        // under the turn, so it counts every placement made before.
        ctx.hosts.fill_allocation(&mut obs.hosts);
        let plan = decide(obs, ctx.fault.now());
        let claim = plan.effects.iter().find_map(|e| match e {
            Effect::RecordHost {
                host, origin_uid, ..
            } => Some(Claim {
                endpoint: host.to_string(),
                machine_uid: origin_uid.clone(),
                vcpu: obs.machine.spec.vcpu,
                memory_mb: obs.machine.spec.memory_mb,
            }),
            _ => None,
        });
        (plan, claim)
    })
}

/// Gathers everything the engine needs, from caches where possible.
async fn gather(
    ctx: &Ctx,
    machine: &MicrovmMachine,
    known_after_create: Option<Vec<ObservedVm>>,
) -> Result<ObservedMachine, Error> {
    let ns = machine.namespace().unwrap_or_default();
    let owner = machine
        .owner_references()
        .iter()
        .find(|o| o.kind == "Machine" && crate::watch::api_group(&o.api_version) == CAPI_GROUP)
        .and_then(|o| {
            ctx.stores
                .capi_machines
                .get(&ObjectRef::new(&o.name).within(&ns))
        })
        .map(|m| m.as_ref().clone());
    let cluster_name = machine
        .labels()
        .get(CLUSTER_NAME_LABEL)
        .cloned()
        .or_else(|| owner.as_ref().map(|o| o.spec.cluster_name.clone()))
        .unwrap_or_default();
    let cluster = ctx
        .stores
        .clusters
        .get(&ObjectRef::new(&cluster_name).within(&ns))
        .map(|c| c.as_ref().clone());
    let infra = infra_cluster(ctx, &ns, &cluster_name, cluster.as_ref());
    // A pool's instance: its MachinePool owns it until core creates its Machine, and holds its
    // bootstrap data.
    let machine_pool = capmvm_reconcile::machine::instance_pool(machine)
        .and_then(|pool| super::pool::machine_pool_of_instance(ctx, &ns, pool));

    // The bootstrap Secret is read only when a microVM may be created now.
    let gates_open = cluster
        .as_ref()
        .is_some_and(|c| c.infrastructure_provisioned() && !c.is_paused())
        && infra.is_some();
    // Right after a create the next round adopts; it needs no bootstrap data.
    let bootstrap = match wants_bootstrap_data(machine, owner.as_ref(), machine_pool.as_ref()) {
        Some(secret) if gates_open && known_after_create.is_none() => {
            credentials::bootstrap_data(&ctx.client, &ns, secret).await?
        }
        _ => BootstrapData::NotAsked,
    };

    let mut obs = ObservedMachine {
        machine: machine.clone(),
        owner,
        machine_pool,
        cluster,
        infra_cluster: infra,
        bootstrap,
        hosts: BTreeMap::new(),
        recorded_host: HostLookup::NotAsked,
        operator: operator_identity().to_string(),
        claim_seen_for: ctx
            .claims
            .seen_for(&super::key(machine), foreign_claim(machine)),
    };
    let Some(mc) = obs.infra_cluster.clone() else {
        return Ok(obs);
    };
    let recorded = recorded_host(machine).map(|h| h.to_string());
    let mut recorded_config = None;
    // The whole pool only when the engine may place the machine now; else its recorded host.
    if wants_pool_facts(&obs) {
        let configs = ctx.credentials.host_configs(&mc).await?;
        for (endpoint, config) in configs.iter() {
            obs.hosts
                .insert(endpoint.clone(), facts_of(ctx, config.as_ref()));
            if recorded.as_deref() == Some(endpoint) {
                recorded_config = Some(config.clone());
            }
        }
    }
    if let Some(host) = recorded_host(machine)
        && recorded_config.is_none()
    {
        let config = ctx.credentials.host_config(&mc, &host).await?;
        obs.hosts
            .insert(host.to_string(), facts_of(ctx, config.as_ref()));
        recorded_config = Some(config);
    }

    obs.recorded_host = match (&recorded, recorded_config) {
        (None, _) | (Some(_), None) => HostLookup::NotAsked,
        (Some(_), Some(Err(problem))) => HostLookup::Unreachable(problem),
        (Some(_), Some(Ok(config))) => match known_after_create {
            Some(vms) => HostLookup::Answered { vms },
            None => lookup(ctx, machine, &config).await,
        },
    };
    Ok(obs)
}

/// A host's facts, or the problem with its credentials.
fn facts_of(ctx: &Ctx, config: Result<&HostConfig, &String>) -> HostFacts {
    match config {
        // Allocation is read under the placement turn (`decide_and_reserve`).
        Ok(c) => HostFacts {
            reachability: ctx.hosts.observed_reachability(c),
            ..HostFacts::default()
        },
        Err(problem) => HostFacts {
            credentials_problem: Some(problem.clone()),
            ..HostFacts::default()
        },
    }
}

/// The machine's placement claim, if another operator process made it and the machine is still
/// to be placed: only such a claim is waited out.
fn foreign_claim(machine: &MicrovmMachine) -> Option<&str> {
    if machine.spec.provider_id.is_some() {
        return None;
    }
    let (_, by) = placement_claim(machine)?;
    (by != operator_identity())
        .then(|| {
            machine
                .annotations()
                .get(PLACEMENT_CLAIM_ANNOTATION)
                .map(String::as_str)
        })
        .flatten()
}

/// When this process first saw each machine's current placement claim from another process, by
/// its own monotonic clock: how old a claim is to this process, whatever the clocks of the
/// processes say (see `capmvm_reconcile::ObservedMachine::claim_seen_for`).
#[derive(Default)]
pub struct ClaimSightings(Mutex<HashMap<String, (String, Instant)>>);

/// How long a sighting is kept: far beyond the claim TTL, so a machine still waiting is not made
/// to wait again, and bounded, so machines placed or gone since are forgotten.
const CLAIM_SIGHTING_KEPT: Duration = Duration::from_secs(600);

impl ClaimSightings {
    /// How long this process has seen `claim` on machine `key` (zero the first time); forgets the
    /// machine's earlier claim, and the machine when it has none.
    pub fn seen_for(&self, key: &str, claim: Option<&str>) -> Option<Duration> {
        let mut seen = self.0.lock().ok()?;
        let Some(claim) = claim else {
            seen.remove(key);
            return None;
        };
        match seen.get(key) {
            Some((c, at)) if c == claim => Some(at.elapsed()),
            _ => {
                seen.insert(key.to_string(), (claim.to_string(), Instant::now()));
                Some(Duration::ZERO)
            }
        }
    }

    /// Forgets sightings older than [`CLAIM_SIGHTING_KEPT`].
    pub fn prune(&self) {
        if let Ok(mut seen) = self.0.lock() {
            seen.retain(|_, (_, at)| at.elapsed() < CLAIM_SIGHTING_KEPT);
        }
    }
}

/// This process's identity in placement claims: fixed for its lifetime, different after a restart
/// (a restarted process cannot know whether its predecessor's create reached the host).
fn operator_identity() -> &'static str {
    static IDENTITY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    IDENTITY.get_or_init(crate::leader::identity)
}

/// The MicrovmCluster of a cluster: by the Cluster's infrastructureRef, else (the Cluster is gone, as
/// during teardown) the one owned by or labelled for that cluster name.
pub(crate) fn infra_cluster(
    ctx: &Ctx,
    ns: &str,
    cluster_name: &str,
    cluster: Option<&Cluster>,
) -> Option<Arc<MicrovmCluster>> {
    if let Some(r) = cluster.and_then(|c| c.spec.infrastructure_ref.as_ref())
        && r.api_group == GROUP
        && r.kind == "MicrovmCluster"
    {
        return ctx
            .stores
            .microvm_clusters
            .get(&ObjectRef::new(&r.name).within(ns));
    }
    ctx.stores.microvm_clusters.state().into_iter().find(|mc| {
        mc.namespace().as_deref() == Some(ns)
            && crate::watch::owner_cluster_name(mc).as_deref() == Some(cluster_name)
    })
}

/// Asks the recorded host about this machine's microVMs: freshly while it has no providerID (that
/// answer decides whether to create), else from the host observer's last list, confirming with a
/// direct get before reporting the microVM missing.
async fn lookup(ctx: &Ctx, machine: &MicrovmMachine, config: &HostConfig) -> HostLookup {
    let client = match ctx.hosts.client(config) {
        Ok(c) => c,
        Err(e) => return HostLookup::Unreachable(e.to_string()),
    };
    let ns = machine.namespace().unwrap_or_default();
    let name = machine.name_any();
    if wants_fresh_lookup(machine) {
        return match client.list(&ns, Some(&name)).await {
            Ok(vms) => HostLookup::Answered {
                vms: vms
                    .iter()
                    .map(|vm| {
                        observed_vm(
                            vm,
                            capmvm_reconcile::cloudinit::marker_from_metadata(&vm.spec.metadata),
                        )
                    })
                    .collect(),
            },
            Err(e) => HostLookup::Unreachable(e.to_string()),
        };
    }
    let uid = provider_id(machine).map(|p| p.uid).unwrap_or_default();
    let snapshot = ctx.hosts.snapshot(config).unwrap_or_default();
    let mut vms: Vec<ObservedVm> = match &snapshot.reachability {
        capmvm_reconcile::Reachability::Unreachable(why)
        | capmvm_reconcile::Reachability::Refused(why) => {
            return HostLookup::Unreachable(why.clone());
        }
        capmvm_reconcile::Reachability::Unknown => Vec::new(),
        capmvm_reconcile::Reachability::Reachable => snapshot
            .vms
            .iter()
            .filter(|hv| hv.vm.uid == uid || (hv.vm.namespace == ns && hv.vm.name == name))
            .map(|hv| hv.vm.clone())
            .collect(),
    };
    let listed = vms.iter().find(|v| v.uid == uid).map(|v| v.state);
    // Missing from a list that may predate it (or no list yet), or still starting in a list that
    // predates what the status records (another replica, or this process before a restart, saw it
    // running): ask the host directly, so a status is never set back on a stale list.
    let recorded_running =
        machine.status.as_ref().and_then(|s| s.vm_state) == Some(ApiVmState::Running);
    if listed.is_none() || (recorded_running && listed == Some(VmState::Pending)) {
        match client.get(&uid).await {
            Ok(vm) => {
                vms.retain(|v| v.uid != uid);
                vms.push(observed_vm(
                    &vm,
                    capmvm_reconcile::cloudinit::marker_from_metadata(&vm.spec.metadata),
                ));
            }
            Err(e) if e.kind() == ErrorKind::NotFound => vms.retain(|v| v.uid != uid),
            Err(e) => return HostLookup::Unreachable(e.to_string()),
        }
    }
    HostLookup::Answered { vms }
}

/// How far a plan was carried out.
enum Carried {
    /// All of it; the microVMs it created.
    Out { created: Vec<ObservedVm> },
    /// The object is gone (the finalizer was released on a deleted object).
    Gone,
    /// The host refused to create this spec; the rest of the plan was dropped.
    SpecRejected,
}

/// Carries out a plan in the engine's order.
async fn execute(
    ctx: &Ctx,
    machine: &mut MicrovmMachine,
    obs: &ObservedMachine,
    plan: &Plan<MicrovmMachineStatus>,
    versions: &mut Vec<String>,
) -> Result<Carried, Error> {
    let mut note = |m: &MicrovmMachine| {
        let version = m.resource_version().unwrap_or_default();
        if versions.last() != Some(&version) {
            versions.push(version);
        }
    };
    let api: Api<MicrovmMachine> =
        Api::namespaced(ctx.client.clone(), &machine.namespace().unwrap_or_default());
    // 1. The finalizer and the chosen host, in one conditional metadata write.
    // The host and uid, with the next placement attempt: always a change, so with the
    // resourceVersion test a compare-and-swap.
    let recorded = plan.effects.iter().find_map(|e| match e {
        Effect::RecordHost {
            host,
            origin_uid,
            attempt,
            claim,
        } => Some((
            host.to_string(),
            origin_uid.as_str(),
            attempt.to_string(),
            claim.as_str(),
        )),
        _ => None,
    });
    // Or, for a machine another provider placed, its providerID's host: it is ours from now on.
    let adopted = plan.effects.iter().find_map(|e| match e {
        Effect::RecordAdoption { host } => Some(host.to_string()),
        _ => None,
    });
    let add_finalizer = plan.effects.contains(&Effect::AddFinalizer);
    if add_finalizer || recorded.is_some() || adopted.is_some() {
        let annotations = match (&recorded, &adopted) {
            (Some((host, origin_uid, attempt, claim)), _) => vec![
                (HOST_ANNOTATION, host.as_str()),
                (ORIGIN_UID_ANNOTATION, *origin_uid),
                (PLACEMENT_ATTEMPT_ANNOTATION, attempt.as_str()),
                (PLACEMENT_CLAIM_ANNOTATION, *claim),
            ],
            (None, Some(host)) => vec![(HOST_ANNOTATION, host.as_str())],
            (None, None) => Vec::new(),
        };
        let written = patch::add_metadata(
            &api,
            machine,
            add_finalizer.then_some(MACHINE_FINALIZER),
            &annotations,
        )
        .await;
        *machine = match written {
            Ok(m) => m,
            Err(e) => {
                // Not placed after all: the host's reservation from the decision goes.
                if let Some((host, origin_uid, _, _)) = &recorded {
                    ctx.hosts.release_reservation(host, origin_uid);
                }
                return Err(e.into());
            }
        };
        note(machine);
        if recorded.is_some() {
            ctx.fault.reached(Point::AfterHostRecorded);
        }
    }
    // 2. The providerID.
    let generation_before = machine.metadata.generation;
    for effect in &plan.effects {
        if let Effect::SetProviderId(id) = effect {
            *machine = patch::provider_id(&api, machine, id).await?;
            note(machine);
            info!(provider_id = %id, "providerID set");
        }
    }
    // 3. The status; conditions decided at the old generation describe the new one (only our own
    // providerID write moved it).
    if let Some(status) = &plan.status {
        let mut status = status.clone();
        if machine.metadata.generation != generation_before {
            for c in &mut status.conditions {
                if c.observed_generation == generation_before {
                    c.observed_generation = machine.metadata.generation;
                }
            }
        }
        if let Some(updated) =
            patch::status(&api, machine, machine.status.as_ref(), &status).await?
        {
            *machine = updated;
            note(machine);
        }
    }

    let mut created = Vec::new();
    for effect in plan.host_calls() {
        let (host, result) = match effect {
            Effect::CreateMicrovm { host, spec } => {
                let result = match host_client(ctx, obs, host).await {
                    Ok(client) => client.create(to_flintlock(spec)).await.map(|vm| {
                        info!(host = %host, uid = vm.uid(), "microVM created");
                        ctx.hosts.record_created(&host.to_string(), &vm);
                        created.push(observed_vm(
                            &vm,
                            capmvm_reconcile::cloudinit::marker_from_metadata(&vm.spec.metadata),
                        ));
                    }),
                    Err(e) => Err(e),
                };
                if result.is_ok() {
                    ctx.fault.reached(Point::AfterCreate);
                }
                (host, result)
            }
            Effect::DeleteMicrovm { host, uid } => {
                let result = match host_client(ctx, obs, host).await {
                    Ok(client) => match client.delete(uid).await {
                        Ok(()) => Ok(()),
                        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
                        Err(e) => Err(e),
                    },
                    Err(e) => Err(e),
                };
                if result.is_ok() {
                    info!(host = %host, uid = %uid, "microVM delete requested");
                    ctx.hosts.record_deleting(&host.to_string(), uid);
                }
                (host, result)
            }
            _ => continue,
        };
        if let Err(e) = result {
            // Returns only when the failure is final (the host refused the spec).
            host_call_failed(ctx, &api, machine, effect, host, &e).await?;
            if let Effect::CreateMicrovm { .. } = effect
                && let Some((_, origin_uid, _, _)) = &recorded
            {
                // Nothing will be created there until the spec changes: free the capacity.
                ctx.hosts.release_reservation(&host.to_string(), origin_uid);
            }
            return Ok(Carried::SpecRejected);
        }
    }

    for event in plan.events() {
        publish(ctx, machine, event).await;
    }

    if plan.effects.contains(&Effect::RemoveFinalizer) {
        let deleting = machine.meta().deletion_timestamp.is_some();
        if let Some(updated) = patch::remove_finalizer(&api, machine, MACHINE_FINALIZER).await? {
            *machine = updated;
        }
        if deleting {
            info!("finalizer released");
            return Ok(Carried::Gone);
        }
    }
    Ok(Carried::Out { created })
}

/// A client for `host` with the credentials the observation resolved (or resolves now).
async fn host_client(
    ctx: &Ctx,
    obs: &ObservedMachine,
    host: &HostEndpoint,
) -> Result<capmvm_flintlock::FlintlockClient, capmvm_flintlock::Error> {
    let config = match &obs.infra_cluster {
        Some(mc) => match ctx.credentials.host_config(mc, host).await {
            Ok(Ok(config)) => config,
            Ok(Err(problem)) => {
                return Err(capmvm_flintlock::Error::new(
                    ErrorKind::InvalidConfig,
                    problem,
                ));
            }
            Err(e) => {
                return Err(capmvm_flintlock::Error::new(
                    ErrorKind::InvalidConfig,
                    format!("reading credentials: {e}"),
                ));
            }
        },
        None => HostConfig::new(host.to_string()),
    };
    ctx.hosts.client(&config)
}

/// Shows a failed host call on `Ready` and as a Warning event, as the engine decides. `Err` (the
/// error goes to the backoff) unless the engine made the failure final: a create the host refused,
/// which is `Ok` and is not retried until the spec changes.
async fn host_call_failed(
    ctx: &Ctx,
    api: &Api<MicrovmMachine>,
    machine: &mut MicrovmMachine,
    effect: &Effect,
    host: &HostEndpoint,
    error: &capmvm_flintlock::Error,
) -> Result<(), Error> {
    warn!(host = %host, error = %error, "host call failed");
    let failure = match error.kind() {
        ErrorKind::Unavailable | ErrorKind::DeadlineExceeded => HostCallFailure::Unreachable,
        ErrorKind::InvalidArgument => HostCallFailure::Refused,
        _ => HostCallFailure::Failed,
    };
    let message = format!("host {host}: {error}");
    let mut status = machine.status.clone().unwrap_or_default();
    let verdict = record_host_call_failure(
        machine,
        &mut status,
        effect,
        failure,
        &message,
        Timestamp::now(),
    );
    match patch::status(api, machine, machine.status.as_ref(), &status).await {
        Ok(Some(updated)) => *machine = updated,
        Ok(None) => {}
        Err(e) => debug!(error = %e, "could not record the failed host call in status"),
    }
    publish(ctx, machine, &verdict.event).await;
    if verdict.retry_with_backoff {
        return Err(Error::HostCall(message));
    }
    Ok(())
}
