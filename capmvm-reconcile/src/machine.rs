//! Deciding for one MicrovmMachine.
//!
//! Gates, in order (each waiting gate has its own reason on `Ready`): owner Machine, Cluster, paused,
//! Cluster infrastructure provisioned; then, for a machine without microVM, a valid spec and the
//! bootstrap data. The finalizer is not a gate of its own: it is added in the same conditional write
//! that records the host, before the first create (nothing exists on a host before that, and one write
//! does both). Then the machine either observes its microVM (it has a providerID), or creates one
//! exactly once:
//!
//! 1. choose a host and record it, with the machine's origin uid, in annotations (written before any
//!    create, and re-asserted before every create by a compare-and-swap: a write conditional on the
//!    resourceVersion that also counts the placement attempt, so it always changes the object);
//! 2. ask the recorded host, freshly, for microVMs with this namespace/name that carry the machine's
//!    origin uid in their meta-data; adopt the oldest (ULIDs sort by creation) and delete extra ones;
//!    a same-name microVM that is not ours (unreadable or another uid) blocks creation instead;
//! 3. only if there is none, create one, then adopt it (step 2) to set the providerID. A create the
//!    host refuses as invalid is not sent again until the spec's generation changes.
//!
//! A crash anywhere in between ends in step 2 on the next pass, never in a second microVM; so does a
//! `clusterctl move` (a new uid, the same annotations). A machine with a providerID is never created
//! again: a vanished microVM is reported, not replaced.
//!
//! A machine another provider placed (the Go provider's, after a move) is adopted as it is, or, if
//! that provider stopped in the middle of a create, left alone until a person decides: see
//! [`adoption`].

use capmvm_api::conditions::{reasons, types};
use capmvm_api::keys::{
    CLUSTER_NAME_LABEL, MACHINE_FINALIZER, POOL_FAILURE_DOMAIN_ANNOTATION, POOL_NAME_LABEL,
};
use capmvm_api::{GROUP, HostEndpoint, MicrovmMachine, MicrovmMachineStatus};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use std::time::Duration;

mod adoption;
mod deletion;
mod evacuation;
mod lookup;
mod normal;
mod ours;
mod record;
mod report;

pub use adoption::{
    PREVIOUS_PROVIDER_CONDITIONS, Provenance, drop_previous_provider_conditions, provenance,
};

pub(crate) use evacuation::canonical as canonical_endpoint;
pub use evacuation::wants_evacuation_group;
pub use lookup::{MachineVms, after_direct_get, concerns, wants_direct_get, wants_fresh_lookup};
pub use record::{
    foreign_claim, origin_uid, placement_attempts, placement_claim, provider_id, recorded_host,
};

use crate::conditions::{self, Status};
pub use crate::host_call::{
    CallOutcome, HostCallFailure, HostCallVerdict, HostErrorKind, judge_host_error,
    record_host_call_failure, spec_rejected_at_this_generation,
};
use crate::observe::{FailedHostCall, HostLookup, MachineFacts, MachinePoolFacts, ObservedMachine};
use crate::plan::{Event, EventKind, MachinePlan, Requeue, reasons as events};
use crate::preamble::{self, Gates, Path, Report, Waiting};

/// How long to wait before looking again at a microVM that is still pending or being deleted, as a
/// safety net behind the host observer, which wakes the machine when its microVM changes.
pub const PENDING_RECHECK: Duration = Duration::from_secs(60);

/// How long a brand-new MicrovmMachine may wait on CAPI (owner, Cluster, bootstrap data) before the
/// wait is reported on `Ready`: the machine's settle grace ([`crate::preamble::settle_left`]).
pub const CAPI_SETTLE_GRACE: Duration = Duration::from_secs(10);

/// How long a microVM may be starting after its placement before its pending state is reported on
/// `Ready`. Past its youth grace (real CABPK gives bootstrap data seconds after the Machine, often
/// more than ten at scale), a start within this grace goes straight to Ready, saving a status write
/// per machine; a slower start (an image pull on a fresh host) is reported.
pub const MICROVM_START_GRACE: Duration = Duration::from_secs(10);

/// How long to wait before looking again at missing credentials (Secrets are not watched).
pub const CREDENTIALS_RECHECK: Duration = Duration::from_secs(10);

/// How long after another operator process claimed a placement a create of its may still reach the
/// host: the flintlock client's connect timeout (5 s) and call deadline (10 s), with a margin. Until
/// then a process that finds no microVM waits instead of creating a second one.
pub const CREATE_CLAIM_TTL: Duration = Duration::from_secs(20);

/// How often a machine waiting its turn to leave an evacuating host looks again at its group: the
/// peers' changes (a replacement's Node turning Ready) do not wake it.
pub const EVACUATION_TURN_RECHECK: Duration = Duration::from_secs(10);

/// How long to wait when the operator has not gathered something the decision needs.
pub const NOT_OBSERVED_RECHECK: Duration = Duration::from_secs(5);

/// Whether a decision for this machine may create a microVM: it has no providerID, is not being
/// deleted and is not one another provider left unfinished ([`Provenance::Unfinished`]: nothing is
/// created until a person decides). Such a decision runs under the operator's placement turn, so
/// concurrent placements see each other's reservations.
pub fn may_create(machine: &MicrovmMachine) -> bool {
    machine.spec.provider_id.is_none()
        && machine.metadata.deletion_timestamp.is_none()
        && provenance(machine) != Provenance::Unfinished
}

/// Whether the decision reads the facts of every host of the pool (to choose one) rather than only
/// the recorded host's: only when it may place the machine now, that is no host is recorded yet, it
/// may create, and the preamble and gates before placement (pause, owner, Cluster, MicrovmCluster)
/// let it through in `obs` (gathered without hosts). Gathering a whole pool for every reconcile of a
/// placed machine, or of one still waiting for its owner, cost O(hosts) each for nothing.
pub fn wants_pool_facts(obs: &ObservedMachine) -> bool {
    may_create(&obs.machine) && recorded_host(&obs.machine).is_none() && gates_open(obs)
}

/// The bootstrap Secret the operator should read for this machine, if any: only while a microVM may
/// be created now (no providerID, not deleting, not paused, the gates open) and the recorded host's
/// answer, if gathered, holds no microVM of ours to adopt instead (right after a create). For a
/// pool's instance it is always the MachinePool's (core gives MachinePool Machines an empty
/// `dataSecretName`).
pub fn wants_bootstrap_data(obs: &ObservedMachine) -> Option<&str> {
    if !may_create(&obs.machine) || !gates_open(obs) {
        return None;
    }
    if let HostLookup::Answered { vms } = &obs.recorded_host
        && vms.iter().any(|v| ours::is_ours(&obs.machine, v))
    {
        return None;
    }
    bootstrap_secret_name(&obs.machine, obs.owner.as_ref(), obs.machine_pool.as_ref())
}

/// Whether the preamble lets the machine through and every gate is open.
fn gates_open(obs: &ObservedMachine) -> bool {
    preamble::paused(obs.machine.annotations(), obs.cluster.as_ref()).is_none()
        && gates(obs, &owner_wait(obs), &machine_cluster_name(obs))
            .with_infrastructure(obs.infra_cluster.as_deref())
            .is_ok()
}

/// What the gates see of a machine.
fn gates<'a>(obs: &'a ObservedMachine, owner_wait: &'a str, cluster_name: &'a str) -> Gates<'a> {
    Gates {
        // A pool's instance is placed only once core's Machine owns it, as CAPD's DockerMachine
        // waits: core adopts a new instance (an ownerReference write) moments after the pool
        // creates it, and a placement decided before would lose its compare-and-swap to that write.
        // Once placed, its MachinePool speaks for it until core's Machine shows.
        has_owner: obs.owner.is_some()
            || (instance_pool(&obs.machine).is_some()
                && obs.machine_pool.is_some()
                && recorded_host(&obs.machine).is_some()),
        owner_wait,
        cluster_name,
        cluster: obs.cluster.as_ref(),
    }
}

/// What a machine without its owner says it waits for.
fn owner_wait(obs: &ObservedMachine) -> String {
    match (instance_pool(&obs.machine), &obs.machine_pool) {
        (Some(pool), None) => {
            format!("waiting for the Cluster API MachinePool that owns MicrovmMachinePool {pool:?}")
        }
        (Some(_), Some(mp)) => format!(
            "waiting for Cluster API to create the Machine of this instance of MachinePool {:?}",
            mp.name
        ),
        (None, _) => "waiting for a Cluster API Machine to own this MicrovmMachine".to_string(),
    }
}

fn machine_cluster_name(obs: &ObservedMachine) -> String {
    cluster_name(&obs.machine, obs.owner.as_ref(), obs.machine_pool.as_ref())
}

/// The machine's Cluster: its cluster-name label, else its owner Machine's, else (a pool's instance
/// before core's Machine shows) its MachinePool's. The operator looks the Cluster up by this name.
pub fn cluster_name(
    machine: &MicrovmMachine,
    owner: Option<&MachineFacts>,
    machine_pool: Option<&MachinePoolFacts>,
) -> String {
    machine
        .labels()
        .get(CLUSTER_NAME_LABEL)
        .cloned()
        .or_else(|| owner.map(|o| o.cluster_name.clone()))
        .or_else(|| machine_pool.map(|p| p.cluster_name.clone()))
        .unwrap_or_default()
}

/// The MicrovmMachinePool a machine is an instance of: it carries the `cluster.x-k8s.io/pool-name`
/// label and an ownerReference to a MicrovmMachinePool (the pool made it; core adds its Machine later).
pub fn instance_pool(machine: &MicrovmMachine) -> Option<&str> {
    if !machine.labels().contains_key(POOL_NAME_LABEL) {
        return None;
    }
    machine
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| {
            o.kind == "MicrovmMachinePool"
                && o.api_version.rsplit_once('/').map(|(g, _)| g) == Some(GROUP)
        })
        .map(|o| o.name.as_str())
}

/// Where a machine's bootstrap data comes from: the MachinePool's Secret for a pool's instance (read
/// afresh for every create, so a rotated join token reaches new instances), else its Machine's.
fn bootstrap_secret_name<'a>(
    machine: &MicrovmMachine,
    owner: Option<&'a MachineFacts>,
    machine_pool: Option<&'a MachinePoolFacts>,
) -> Option<&'a str> {
    if instance_pool(machine).is_some() {
        return machine_pool
            .and_then(|p| p.bootstrap_data_secret_name.as_deref())
            .filter(|s| !s.is_empty());
    }
    owner.and_then(|o| o.bootstrap_data_secret_name.as_deref())
}

/// Decides what to do for one MicrovmMachine.
pub fn decide(obs: &ObservedMachine, now: Timestamp) -> MachinePlan {
    let mut d = Decision::new(obs, now);
    d.plan.requeue = d.run();
    d.finish()
}

struct Decision<'a> {
    obs: &'a ObservedMachine,
    machine: &'a MicrovmMachine,
    now: Timestamp,
    generation: Option<i64>,
    status: MicrovmMachineStatus,
    plan: MachinePlan,
    /// Leave the status unwritten: a brand-new object is still being assembled by CAPI, or the status
    /// is written by the adoption that follows a create.
    quiet: bool,
    /// The status reports a failed host call, with its own event: no transition event.
    failure_reported: bool,
}

impl Report for Decision<'_> {
    fn condition(&mut self, type_: &str, status: Status, reason: &str, message: String) {
        Decision::condition(self, type_, status, reason, message);
    }

    fn is_ready(&self) -> bool {
        conditions::is_true(&self.status.conditions, types::READY)
    }

    fn hold_status(&mut self) {
        self.quiet = true;
    }
}

impl<'a> Decision<'a> {
    fn new(obs: &'a ObservedMachine, now: Timestamp) -> Self {
        let machine = &obs.machine;
        Self {
            obs,
            machine,
            now,
            generation: machine.metadata.generation,
            status: machine.status.clone().unwrap_or_default(),
            plan: MachinePlan::default(),
            quiet: false,
            failure_reported: false,
        }
    }

    /// The preamble every kind shares, then the delete or the normal path. A host call of the last
    /// plan that failed is reported first: it is what the operator observed last.
    fn run(&mut self) -> Requeue {
        let path = preamble::preamble(&self.machine.metadata, self.obs.cluster.as_ref(), self);
        if let Some(failed) = &self.obs.failed_host_call {
            return self.report_failed_call(failed);
        }
        match path {
            Path::Paused => Requeue::Await,
            Path::Delete => self.reconcile_delete(),
            Path::Normal => self.reconcile_normal(),
        }
    }

    /// A host call of the last plan failed: `Ready` and a Warning event say so, and the engine says
    /// whether it is retried with backoff or waits for the spec to change ([`record_host_call_failure`]).
    fn report_failed_call(&mut self, failed: &FailedHostCall) -> Requeue {
        let verdict = record_host_call_failure(
            self.machine,
            &mut self.status,
            &failed.call,
            failed.failure,
            &failed.message,
            self.now,
        );
        self.plan.events.push(verdict.event);
        self.failure_reported = true;
        if verdict.retry_with_backoff {
            Requeue::Backoff
        } else {
            Requeue::Await
        }
    }

    /// The normal path: the gates, then a machine with a providerID follows its microVM, one without
    /// is placed, created exactly once and adopted.
    fn reconcile_normal(&mut self) -> Requeue {
        let cluster_name = machine_cluster_name(self.obs);
        let owner_wait = owner_wait(self.obs);
        let open = gates(self.obs, &owner_wait, &cluster_name)
            .with_infrastructure(self.obs.infra_cluster.as_deref());
        let (cluster, infra) = match open {
            Ok(open) => open,
            Err(waiting) => return self.wait_for_capi(waiting),
        };
        if self.machine.spec.provider_id.is_some() {
            return self.observe_existing(infra);
        }
        self.create_or_adopt(infra, &cluster.name)
    }

    /// The failure domain the microVM must be placed in: the one the pool chose for its instance,
    /// else the Machine's. An empty one (a v1beta1 `*string` set to "") means none.
    fn failure_domain(&self) -> Option<&'a str> {
        let chosen = if instance_pool(self.machine).is_some() {
            self.machine
                .annotations()
                .get(POOL_FAILURE_DOMAIN_ANNOTATION)
                .map(String::as_str)
        } else {
            self.obs
                .owner
                .as_ref()
                .and_then(|o| o.failure_domain.as_deref())
        };
        chosen.filter(|fd| !fd.is_empty())
    }

    // --- helpers ---

    fn ensure_finalizer(&mut self) {
        let has = self
            .machine
            .finalizers()
            .iter()
            .any(|f| f == MACHINE_FINALIZER);
        if !has {
            self.plan.add_finalizer = true;
        }
    }

    /// Reports (and returns true) when the host cannot even be called: a Secret or key is missing.
    fn missing_credentials(&mut self, host: &HostEndpoint) -> bool {
        let problem = self
            .obs
            .hosts
            .get(&host.to_string())
            .and_then(|f| f.credentials_problem.clone());
        match problem {
            Some(problem) => {
                self.not_ready(
                    reasons::MISSING_CREDENTIALS,
                    format!("cannot call host {host}: {problem}"),
                );
                true
            }
            None => false,
        }
    }

    fn condition(&mut self, type_: &str, status: Status, reason: &str, message: impl Into<String>) {
        conditions::set(
            &mut self.status.conditions,
            type_,
            status,
            reason,
            message,
            self.generation,
            self.now,
        );
    }

    fn not_ready(&mut self, reason: &str, message: impl Into<String>) {
        self.condition(types::READY, Status::False, reason, message);
    }

    /// Waits for CAPI (owner, Cluster, infrastructure, bootstrap data), within the machine's settle
    /// grace unwritten ([`CAPI_SETTLE_GRACE`]).
    fn wait_for_capi(&mut self, waiting: Waiting) -> Requeue {
        let left = self.unreported_youth_left();
        preamble::wait(self, waiting, left)
    }

    /// How much of [`MICROVM_START_GRACE`] is left since this process's placement claim (written
    /// with the host, just before the create). `None` without a claim (a microVM this provider did
    /// not place), once it is over, or when `Ready` reports anything but a wait on CAPI (an earlier
    /// failure is corrected at once). A reported wait on CAPI (bootstrap data, typically) was over
    /// when the microVM was created; it stands for at most the grace, then gives way to Ready or
    /// to the pending state: a wait and Ready are the two status writes a machine is allowed.
    fn start_grace_left(&self) -> Option<Duration> {
        let reports_more_than_a_wait = self
            .machine
            .status
            .as_ref()
            .and_then(|s| conditions::get(&s.conditions, types::READY))
            .is_some_and(|ready| !preamble::is_wait_on_capi(&ready.reason));
        if reports_more_than_a_wait {
            return None;
        }
        let (at, _) = record::placement_claim(self.machine)?;
        preamble::grace_left(at, MICROVM_START_GRACE, self.now)
    }

    /// For a brand-new object whose status was never written: how much of [`CAPI_SETTLE_GRACE`] is
    /// left. Transient states of such an object (waits on CAPI, a microVM still starting) are not
    /// written while it lasts; anything that needs attention is.
    fn unreported_youth_left(&self) -> Option<Duration> {
        preamble::settle_left(
            &self.machine.metadata,
            self.machine.status.is_some(),
            CAPI_SETTLE_GRACE,
            self.now,
        )
    }

    fn event(&mut self, kind: EventKind, reason: &'static str, action: &'static str, note: String) {
        self.plan.events.push(Event {
            kind,
            reason,
            action,
            note,
        });
    }

    fn finish(mut self) -> MachinePlan {
        if self.quiet {
            return self.plan;
        }
        // The Go provider's MicrovmReady, on a machine it made, is updated by nobody now.
        drop_previous_provider_conditions(&mut self.status.conditions);
        if !self.failure_reported {
            self.transition_events();
        }
        if self.plan.provider_id.is_some() {
            // The providerID write is conditional on the version read and changes the spec, so the
            // API server moves the generation by exactly one: conditions decided now describe that
            // generation (only our own write moved it).
            let next = self.generation.map(|g| g + 1);
            for c in &mut self.status.conditions {
                if c.observed_generation == self.generation {
                    c.observed_generation = next;
                }
            }
        }
        self.plan.status = Some(self.status);
        self.plan
    }

    /// Events for `Ready` transitions users should see in `kubectl describe`.
    fn transition_events(&mut self) {
        let before = self.machine.status.as_ref().and_then(|s| {
            conditions::get(&s.conditions, types::READY)
                .map(|c| (c.status.clone(), c.reason.clone()))
        });
        let Some(after) = conditions::get(&self.status.conditions, types::READY) else {
            return;
        };
        if before
            .as_ref()
            .is_some_and(|(s, r)| *s == after.status && *r == after.reason)
        {
            return;
        }
        let (kind, reason) = match after.reason.as_str() {
            // Reaching Ready is on the condition already; an event marks only a recovery from a
            // problem that had its own Warning (a host back, credentials found).
            reasons::READY if before.as_ref().is_some_and(|(_, r)| recovers_from(r)) => {
                (EventKind::Normal, events::MICROVM_READY)
            }
            reasons::MICROVM_PROVISION_FAILED => (EventKind::Warning, events::MICROVM_FAILED),
            reasons::MICROVM_NOT_FOUND => (EventKind::Warning, events::MICROVM_NOT_FOUND),
            reasons::INVALID_SPEC => (EventKind::Warning, events::INVALID_SPEC),
            reasons::HOST_UNREACHABLE => (EventKind::Warning, events::HOST_UNREACHABLE),
            reasons::UNKNOWN_MICROVM_ON_HOST => {
                (EventKind::Warning, events::UNKNOWN_MICROVM_ON_HOST)
            }
            reasons::UNFINISHED_BY_PREVIOUS_PROVIDER => {
                (EventKind::Warning, events::UNFINISHED_BY_PREVIOUS_PROVIDER)
            }
            _ => return,
        };
        let note = if after.message.is_empty() {
            "microVM is running".to_string()
        } else {
            after.message.clone()
        };
        self.event(kind, reason, "Reconcile", note);
    }
}

/// Whether `Ready` becoming True after `reason` is a recovery worth an event.
fn recovers_from(reason: &str) -> bool {
    matches!(
        reason,
        reasons::HOST_UNREACHABLE
            | reasons::MISSING_CREDENTIALS
            | reasons::MICROVM_CREATE_FAILED
            | reasons::MICROVM_NOT_FOUND
            | reasons::MICROVM_SPEC_REJECTED
            | reasons::UNKNOWN_MICROVM_ON_HOST
    )
}
