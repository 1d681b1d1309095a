//! The MicrovmMachine controller: gather an observation, let the engine decide, carry out the plan.
//! It decides nothing: what to gather (`wants_*`, `concerns`), whose placement claim it times
//! (`foreign_claim`), whether a decision runs under the placement turn (`may_create`), what a host's
//! error amounts to (`judge_host_error`, `after_direct_get`) and everything that follows a failed
//! host call are the engine's.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use capmvm_api::capi::{CAPI_GROUP, CAPI_VERSION};
use capmvm_api::keys::{
    HOST_ANNOTATION, MACHINE_FINALIZER, ORIGIN_UID_ANNOTATION, PLACEMENT_ATTEMPT_ANNOTATION,
    PLACEMENT_CLAIM_ANNOTATION,
};
use capmvm_api::{HostEndpoint, MicrovmMachine};
use capmvm_flintlock::{ErrorKind, HostConfig};
use capmvm_reconcile::machine::{
    CallOutcome, HostCallFailure, MachineVms, after_direct_get, cluster_name, foreign_claim,
    instance_pool, judge_host_error, may_create, provider_id, recorded_host, wants_bootstrap_data,
    wants_direct_get, wants_evacuation_group, wants_fresh_lookup, wants_pool_facts,
};
use capmvm_reconcile::{
    BootstrapData, ClusterFacts, EvacuationGroup, FailedHostCall, HostCall, HostFacts, HostLookup,
    MachinePlan, ObservedMachine, ObservedVm, Requeue, decide,
};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use tracing::{debug, info, instrument, warn};

use super::{Error, Outcome, Reconciled, note_version, publish, wrap};
use crate::context::Ctx;
use crate::convert::{host_error_kind, to_flintlock};
use crate::fault::Point;
use crate::hosts::{Claim, observed_vm};
use crate::{credentials, patch};

/// Controller name in metrics and events.
pub const CONTROLLER: &str = "microvmmachine";

/// Most decide-and-carry-out rounds in one reconcile (place+create, adopt, and one spare).
const MAX_ROUNDS: usize = 4;

/// How soon to look again when a reconcile's rounds ran out with the engine still asking for more.
const ROUNDS_EXHAUSTED_RETRY: Duration = Duration::from_secs(1);

/// Reconciles one MicrovmMachine.
#[instrument(skip_all, fields(machine = %format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())))]
pub async fn reconcile(obj: Arc<MicrovmMachine>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    wrap(
        CONTROLLER,
        obj,
        ctx,
        |_, _| false,
        |machine, ctx| async move {
            let mut versions = vec![machine.resource_version().unwrap_or_default()];
            let result = rounds(machine, &ctx, &mut versions).await;
            Reconciled { result, versions }
        },
    )
    .await
}

/// Decides and carries out until the engine waits for the world: what one plan did (a create, a
/// failed host call, a lost write) is part of the next observation.
async fn rounds(
    mut machine: MicrovmMachine,
    ctx: &Ctx,
    versions: &mut Vec<String>,
) -> Result<Outcome, Error> {
    let mut known_after_create: Option<Vec<ObservedVm>> = None;
    let mut failed: Option<(ObservedMachine, FailedHostCall)> = None;
    for round in 0..MAX_ROUNDS {
        let (mut obs, plan) = match failed.take() {
            // What the engine decides after a failed host call needs no new look at the host.
            Some((mut obs, failure)) => {
                obs.machine = machine.clone();
                obs.failed_host_call = Some(failure);
                let plan = decide(&obs, ctx.fault.now());
                (obs, plan)
            }
            None => {
                let mut obs = gather(ctx, &machine, known_after_create.take()).await?;
                let plan = decide_and_reserve(ctx, &mut obs);
                (obs, plan)
            }
        };
        debug!(round, plan = ?PlanSummary(&plan), "decided");
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
                    None => return Ok(Outcome::Gone),
                }
                continue;
            }
            carried => carried?,
        };
        match carried {
            Carried::Out { created } if !created.is_empty() => {
                // The host just answered the create; with the fresh list before it, that is a
                // fresh answer.
                let mut vms = match std::mem::take(&mut obs.recorded_host) {
                    HostLookup::Answered { vms } => vms,
                    _ => Vec::new(),
                };
                vms.extend(created);
                known_after_create = Some(vms);
            }
            Carried::Out { .. } => {}
            Carried::Gone => return Ok(Outcome::Gone),
            Carried::HostCallFailed(failure) => {
                failed = Some((obs, failure));
                continue;
            }
        }
        match plan.requeue {
            Requeue::Immediately if round + 1 < MAX_ROUNDS => continue,
            Requeue::Immediately => {
                return Ok(Outcome::Requeue(Requeue::After(ROUNDS_EXHAUSTED_RETRY)));
            }
            requeue => return Ok(Outcome::Requeue(requeue)),
        }
    }
    Ok(Outcome::Requeue(Requeue::After(ROUNDS_EXHAUSTED_RETRY)))
}

/// A plan in a log line: its steps, never its specs (cloud-init holds secrets).
struct PlanSummary<'a>(&'a MachinePlan);

impl std::fmt::Debug for PlanSummary<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = self.0;
        f.debug_struct("MachinePlan")
            .field("add_finalizer", &p.add_finalizer)
            .field(
                "record_host",
                &p.record_host.as_ref().map(|r| r.host.to_string()),
            )
            .field("provider_id", &p.provider_id)
            .field("status", &p.status.is_some())
            .field("host_calls", &p.host_calls.len())
            .field("events", &p.events.len())
            .field("remove_finalizer", &p.remove_finalizer)
            .field("requeue", &p.requeue)
            .finish()
    }
}

/// Decides; a decision that may create a microVM ([`may_create`]) runs under the hosts' placement
/// turn, with the hosts' allocation read there, and the host it records is reserved before the turn
/// passes, so concurrent placements see each other and a burst spreads like a trickle.
fn decide_and_reserve(ctx: &Ctx, obs: &mut ObservedMachine) -> MachinePlan {
    if !may_create(&obs.machine) {
        return decide(obs, ctx.fault.now());
    }
    ctx.hosts.place(|| {
        // Reachability was read through this cluster's credentials moments ago; allocation is read
        // under the turn, so it counts every placement made before.
        ctx.hosts.fill_allocation(&mut obs.hosts);
        let plan = decide(obs, ctx.fault.now());
        let claim = plan.record_host.as_ref().map(|r| Claim {
            endpoint: r.host.to_string(),
            machine_uid: r.origin_uid.clone(),
            vcpu: obs.machine.spec.vcpu,
            memory_mb: obs.machine.spec.memory_mb,
        });
        (plan, claim)
    })
}

/// Gathers everything the engine needs, from caches where possible; the engine says what
/// (`wants_pool_facts`, `wants_fresh_lookup`, `wants_bootstrap_data`).
async fn gather(
    ctx: &Ctx,
    machine: &MicrovmMachine,
    known_after_create: Option<Vec<ObservedVm>>,
) -> Result<ObservedMachine, Error> {
    let ns = machine.namespace().unwrap_or_default();
    let owner = ctx.stores.owner_machine(machine);
    // A pool's instance: its MachinePool owns it until core creates its Machine, and holds its
    // bootstrap data.
    let machine_pool =
        instance_pool(machine).and_then(|pool| ctx.stores.machine_pool_of_instance(&ns, pool));
    let cluster_name = cluster_name(machine, owner.as_ref(), machine_pool.as_ref());
    let cluster = ctx.stores.cluster(&ns, &cluster_name);
    let infra = ctx
        .stores
        .infra_cluster(&ns, &cluster_name, cluster.as_deref());
    let mut obs = ObservedMachine {
        machine: machine.clone(),
        owner,
        machine_pool,
        cluster: cluster.as_deref().map(ClusterFacts::from),
        infra_cluster: infra,
        bootstrap: BootstrapData::NotAsked,
        hosts: BTreeMap::new(),
        recorded_host: HostLookup::NotAsked,
        operator: operator_identity().to_string(),
        claim_seen_for: ctx.claims.seen_for(
            &super::key(machine),
            foreign_claim(machine, operator_identity()),
        ),
        failed_host_call: None,
        evacuation: None,
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
    // A machine on an evacuating host is released one at a time within its group.
    if wants_evacuation_group(&obs)
        && let Some(owner) = &obs.owner
        && let Some(peers) = ctx.stores.evacuation_peers(machine, owner)
    {
        let desired = match &owner.deployment {
            Some(deployment) => deployment_replicas(&ctx.client, &ns, deployment).await,
            None => None,
        };
        obs.evacuation = Some(EvacuationGroup { desired, peers });
    }
    // The bootstrap Secret is read only when the engine may create a microVM now.
    if let Some(secret) = wants_bootstrap_data(&obs) {
        obs.bootstrap = credentials::bootstrap_data(&ctx.client, &ns, secret).await?;
    }
    Ok(obs)
}

/// A MachineDeployment's `spec.replicas`, read by name (the operator caches no MachineDeployment:
/// only a machine on an evacuating host asks). `None` when it cannot be read: the engine then judges
/// the group by its Machines alone.
async fn deployment_replicas(client: &kube::Client, ns: &str, name: &str) -> Option<i32> {
    let gvk = GroupVersionKind::gvk(CAPI_GROUP, CAPI_VERSION, "MachineDeployment");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "machinedeployments");
    let deployments: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource);
    match deployments.get(name).await {
        Ok(deployment) => deployment
            .data
            .pointer("/spec/replicas")
            .and_then(serde_json::Value::as_i64)
            .and_then(|r| i32::try_from(r).ok()),
        Err(e) => {
            warn!(namespace = ns, deployment = name, error = %e, "reading the MachineDeployment of a machine on an evacuating host");
            None
        }
    }
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

/// This process's identity in placement claims: fixed for its lifetime, different after a restart
/// (a restarted process cannot know whether its predecessor's create reached the host).
fn operator_identity() -> &'static str {
    static IDENTITY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    IDENTITY.get_or_init(crate::leader::identity)
}

/// Asks the recorded host about this machine's microVMs as the engine says: freshly while it has no
/// providerID (`wants_fresh_lookup`), else from the host observer's last list, confirmed by a direct
/// Get where that list may be behind (`wants_direct_get`, `after_direct_get`).
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
    let mine = MachineVms::of(machine);
    let vms: Vec<ObservedVm> = match &snapshot.reachability {
        capmvm_reconcile::Reachability::Unreachable(why)
        | capmvm_reconcile::Reachability::Refused(why) => {
            return HostLookup::Unreachable(why.clone());
        }
        capmvm_reconcile::Reachability::Unknown => Vec::new(),
        capmvm_reconcile::Reachability::Reachable => snapshot
            .vms
            .iter()
            .filter(|hv| mine.contains(&hv.vm))
            .map(|hv| hv.vm.clone())
            .collect(),
    };
    let listed = vms.iter().find(|v| v.uid == uid).map(|v| v.state);
    if !wants_direct_get(machine, listed) {
        return HostLookup::Answered { vms };
    }
    let answer = client
        .get(&uid)
        .await
        .map(|vm| {
            observed_vm(
                &vm,
                capmvm_reconcile::cloudinit::marker_from_metadata(&vm.spec.metadata),
            )
        })
        .map_err(|e| (host_error_kind(e.kind()), e.to_string()));
    after_direct_get(vms, &uid, answer)
}

/// How far a plan was carried out.
enum Carried {
    /// All of it; the microVMs it created.
    Out { created: Vec<ObservedVm> },
    /// The object is gone (the finalizer was released on a deleted object).
    Gone,
    /// A host call failed; the rest of the plan was dropped.
    HostCallFailed(FailedHostCall),
}

/// Carries out a plan, its fields top to bottom.
async fn execute(
    ctx: &Ctx,
    machine: &mut MicrovmMachine,
    obs: &ObservedMachine,
    plan: &MachinePlan,
    versions: &mut Vec<String>,
) -> Result<Carried, Error> {
    let api: Api<MicrovmMachine> =
        Api::namespaced(ctx.client.clone(), &machine.namespace().unwrap_or_default());
    // 1. The finalizer and the chosen host, in one conditional metadata write. The host and uid go
    // with the next placement attempt: always a change, so with the resourceVersion test a
    // compare-and-swap. Or, for a machine another provider placed, its providerID's host only: it
    // is ours from now on.
    if plan.add_finalizer || plan.record_host.is_some() || plan.record_adoption.is_some() {
        let attempt = plan.record_host.as_ref().map(|r| r.attempt.to_string());
        let host = plan
            .record_host
            .as_ref()
            .map(|r| &r.host)
            .or(plan.record_adoption.as_ref())
            .map(ToString::to_string);
        let annotations = match (&plan.record_host, &attempt, &host) {
            (Some(r), Some(attempt), Some(host)) => vec![
                (HOST_ANNOTATION, host.as_str()),
                (ORIGIN_UID_ANNOTATION, r.origin_uid.as_str()),
                (PLACEMENT_ATTEMPT_ANNOTATION, attempt.as_str()),
                (PLACEMENT_CLAIM_ANNOTATION, r.claim.as_str()),
            ],
            (None, _, Some(host)) => vec![(HOST_ANNOTATION, host.as_str())],
            _ => Vec::new(),
        };
        let written = patch::add_metadata(
            &api,
            machine,
            plan.add_finalizer.then_some(MACHINE_FINALIZER),
            &annotations,
        )
        .await;
        *machine = match written {
            Ok(m) => m,
            Err(e) => {
                // Not placed after all: the host's reservation from the decision goes.
                if let Some(r) = &plan.record_host {
                    ctx.hosts
                        .release_reservation(&r.host.to_string(), &r.origin_uid);
                }
                return Err(e.into());
            }
        };
        note_version(versions, machine);
        if plan.record_host.is_some() {
            ctx.fault.reached(Point::AfterHostRecorded);
        }
    }
    // 2. The providerID.
    if let Some(id) = &plan.provider_id {
        *machine = patch::provider_id(&api, machine, id).await?;
        note_version(versions, machine);
        info!(provider_id = %id, "providerID set");
    }
    // 3. The status (its conditions already name the generation a providerID write gives).
    if let Some(status) = &plan.status
        && let Some(updated) = patch::status(&api, machine, machine.status.as_ref(), status).await?
    {
        *machine = updated;
        note_version(versions, machine);
    }
    // 4. Host calls. What an error amounts to is the engine's (`judge_host_error`): a delete the
    // host answers NotFound is done.
    let mut created = Vec::new();
    for call in &plan.host_calls {
        let (host, result) = match call {
            HostCall::Create { host, spec } => {
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
                let result = judged(call, result);
                match &result {
                    Ok(()) => ctx.fault.reached(Point::AfterCreate),
                    Err(_) => {
                        // Nothing was created: the capacity is free until a decision reserves it
                        // again (every create is decided under the placement turn).
                        if let Some(r) = &plan.record_host {
                            ctx.hosts
                                .release_reservation(&host.to_string(), &r.origin_uid);
                        }
                    }
                }
                (host, result)
            }
            HostCall::Delete { host, uid } => {
                let result = match host_client(ctx, obs, host).await {
                    Ok(client) => client.delete(uid).await,
                    Err(e) => Err(e),
                };
                let result = judged(call, result);
                if result.is_ok() {
                    info!(host = %host, uid = %uid, "microVM delete requested");
                    ctx.hosts.record_deleting(&host.to_string(), uid);
                }
                (host, result)
            }
        };
        if let Err((failure, error)) = result {
            warn!(host = %host, error = %error, "host call failed");
            return Ok(Carried::HostCallFailed(FailedHostCall {
                call: call.clone(),
                failure,
                message: format!("host {host}: {error}"),
            }));
        }
    }
    // 5. Events.
    for event in &plan.events {
        publish(ctx, machine, event).await;
    }
    // 6. The finalizer, last.
    if plan.remove_finalizer {
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

/// A host call's result as the engine judges it: an error that still counts as done is success,
/// any other is the failure the next observation reports.
fn judged(
    call: &HostCall,
    result: Result<(), capmvm_flintlock::Error>,
) -> Result<(), (HostCallFailure, capmvm_flintlock::Error)> {
    let Err(error) = result else {
        return Ok(());
    };
    match judge_host_error(call, host_error_kind(error.kind())) {
        CallOutcome::Done => {
            debug!(error = %error, "the host's answer counts as done");
            Ok(())
        }
        CallOutcome::Failed(failure) => Err((failure, error)),
    }
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
