//! The host observer: one task per flintlock host *and credentials* lists all its microVMs at a poll
//! interval (faster while a microVM there is being created or deleted), keeps the answer, reports
//! reachability, and wakes the objects whose microVM or host changed. Steady-state reconciles read these
//! snapshots, so flintlock traffic grows with hosts, not machines.
//!
//! Observers are keyed by the whole connection config (endpoint, token, TLS material, proxy): a
//! MicrovmCluster sees a host only through its own credentials, so a cluster without a valid token never
//! reads what another tenant's token listed, and two clusters with different credentials for one host
//! each keep a steady observer. MicrovmClusters declare the configs they use ([`Hosts::declare`]); an
//! observer nobody declares any more stops, and its gauges go with it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use capmvm_flintlock::{ClientPool, ErrorKind, FlintlockClient, HostConfig, Microvm, MicrovmState};
use capmvm_reconcile::cloudinit::{Marker, marker_from_metadata};
use capmvm_reconcile::{HostFacts, ObservedVm, Reachability, RunningSpec, VmState};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::metrics::Metrics;

mod in_flight;
mod reservations;

use in_flight::InFlight;
use reservations::HostReservations;

/// Who to wake when a host's microVMs or reachability change.
pub trait Wake: Send + Sync {
    /// The microVM named `namespace/name` changed (appeared, changed state, or vanished).
    fn microvm_changed(&self, namespace: &str, name: &str);
    /// A microVM without our marker named `namespace/name` changed: another provider's, which a
    /// MicrovmMachine of that name may have adopted (the Go provider names them so). Only that
    /// machine is woken: such a microVM left behind is not ours to report.
    fn unmarked_microvm_changed(&self, namespace: &str, name: &str);
    /// The host's reachability changed, or it answered for the first time.
    fn host_changed(&self, endpoint: &str);
}

/// One microVM on a host, with the resources it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostVm {
    /// The microVM as the engine sees it.
    pub vm: ObservedVm,
    /// vCPUs.
    pub vcpu: i64,
    /// Memory in MiB.
    pub memory_mb: i64,
}

/// What a host answered last.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Whether the last list answered.
    pub reachability: Reachability,
    /// Every microVM on the host (all namespaces), as of the last successful list.
    pub vms: Arc<ListedVms>,
}

/// The microVMs one list showed, with the totals placement reads. The totals are computed once per
/// list (or per create or delete recorded), not per placement decision: a decision reads every
/// host's allocation, and summing each host's microVMs there made placing M machines cost O(M²).
#[derive(Clone, Debug, Default)]
pub struct ListedVms {
    vms: Vec<HostVm>,
    /// vCPUs and MiB held by the microVMs not being deleted.
    vcpu: i64,
    memory_mb: i64,
    /// The machine uids those microVMs carry (their reservations are counted through them).
    machine_uids: HashSet<String>,
}

impl ListedVms {
    /// The microVMs `vms`, with their totals.
    pub fn new(vms: Vec<HostVm>) -> Self {
        let (mut vcpu, mut memory_mb) = (0, 0);
        let mut machine_uids = HashSet::new();
        for hv in vms.iter().filter(|hv| hv.vm.state != VmState::Deleting) {
            vcpu += hv.vcpu;
            memory_mb += hv.memory_mb;
            if let Some(uid) = &hv.vm.machine_uid {
                machine_uids.insert(uid.clone());
            }
        }
        Self {
            vms,
            vcpu,
            memory_mb,
            machine_uids,
        }
    }
}

impl std::ops::Deref for ListedVms {
    type Target = [HostVm];

    fn deref(&self) -> &[HostVm] {
        &self.vms
    }
}

struct HostState {
    snapshot: RwLock<Snapshot>,
    /// The microVMs in flight (pending or deleting). While any is, the observer asks the host about
    /// these alone at the busy interval (a Get each) and lists the whole host at the poll interval
    /// only: listing a busy host whole every second cost O(microVMs on it) per second.
    in_flight: Mutex<InFlight>,
    kick: Notify,
}

struct HostEntry {
    state: Arc<HostState>,
    task: JoinHandle<()>,
    /// Last time a reconcile asked for this observer ([`Hosts::ensure`]).
    wanted_at: Instant,
}

/// The microVMs of a host as the first of its observers whose last list answered saw them.
fn listed_of(by_config: &HashMap<HostConfig, HostEntry>) -> Arc<ListedVms> {
    by_config
        .values()
        .filter_map(|e| {
            let snapshot = e.state.snapshot.read().ok()?;
            (snapshot.reachability == Reachability::Reachable).then(|| snapshot.vms.clone())
        })
        .next()
        .unwrap_or_default()
}

/// vCPUs and MiB allocated on a host: what its last answered list showed plus its placements not
/// listed yet. A listed microVM is counted by the list; its reservation is kept a little longer in
/// case a list that raced the create publishes a snapshot without it.
fn allocated(
    listed: &Arc<ListedVms>,
    reservations: Option<&mut HostReservations>,
    now: Instant,
) -> (i64, i64) {
    let (v, m) = reservations.map_or((0, 0), |host| host.unlisted(listed, now));
    (listed.vcpu + v, listed.memory_mb + m)
}

/// How long an observer that no MicrovmCluster declares is kept after a reconcile last asked for it
/// (a machine reconciled before its cluster declared, a rotated Secret's old config).
const UNDECLARED_GRACE: Duration = Duration::from_secs(60);

/// A host chosen for a machine, reserved at the moment of choosing (see [`Hosts::place`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The host's canonical endpoint: capacity is physical, so reservations are per endpoint.
    pub endpoint: String,
    /// The uid the machine's microVM will carry (its origin uid).
    pub machine_uid: String,
    /// vCPUs asked for.
    pub vcpu: i64,
    /// Memory asked for, in MiB.
    pub memory_mb: i64,
}

/// The registry of observed hosts.
pub struct Hosts {
    pool: ClientPool,
    metrics: Arc<Metrics>,
    wake: Arc<dyn Wake>,
    poll: Duration,
    busy_poll: Duration,
    /// Observers by endpoint, then by config: allocation and updates are per endpoint, and a
    /// decision reads every pool host's, so finding them must not scan all observers.
    entries: Mutex<HashMap<String, HashMap<HostConfig, HostEntry>>>,
    /// Which configs each MicrovmCluster (`namespace/name`) uses.
    declared: Mutex<HashMap<String, HashSet<HostConfig>>>,
    /// Machines placed on a host whose microVM the host does not list yet, by endpoint. Keeps a
    /// burst of placements from piling onto one host.
    reservations: Mutex<HashMap<String, HostReservations>>,
    /// Held while one placement reads the allocation, decides and reserves (see [`Hosts::place`]).
    placing: Mutex<()>,
}

impl Hosts {
    /// A registry polling every `poll`, or every `busy_poll` while something is in flight.
    pub fn new(
        pool: ClientPool,
        metrics: Arc<Metrics>,
        wake: Arc<dyn Wake>,
        poll: Duration,
        busy_poll: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            pool,
            metrics,
            wake,
            poll,
            busy_poll,
            entries: Mutex::new(HashMap::new()),
            declared: Mutex::new(HashMap::new()),
            reservations: Mutex::new(HashMap::new()),
            placing: Mutex::new(()),
        })
    }

    /// A client for `config` on the shared channel pool.
    pub fn client(&self, config: &HostConfig) -> Result<FlintlockClient, capmvm_flintlock::Error> {
        self.pool.client(config)
    }

    /// Makes sure `config` (a host under one set of credentials) is observed.
    pub fn ensure(self: &Arc<Self>, config: &HostConfig) {
        let Ok(mut entries) = self.entries.lock() else {
            return;
        };
        let by_config = entries.entry(config.endpoint.clone()).or_default();
        if let Some(entry) = by_config.get_mut(config) {
            entry.wanted_at = Instant::now();
            return;
        }
        let state = Arc::new(HostState {
            snapshot: RwLock::new(Snapshot::default()),
            in_flight: Mutex::new(InFlight::default()),
            kick: Notify::new(),
        });
        let task = self.spawn(config.clone(), state.clone());
        self.metrics.host_observer_started(&config.endpoint);
        debug!(host = %config.endpoint, "observing host");
        by_config.insert(
            config.clone(),
            HostEntry {
                state,
                task,
                wanted_at: Instant::now(),
            },
        );
    }

    /// Records the configs MicrovmCluster `owner` uses now (its pool's hosts and those its machines
    /// live on), replacing what it declared before. Observers nobody declares stop at the next
    /// [`Hosts::sweep`].
    pub fn declare(self: &Arc<Self>, owner: &str, configs: impl IntoIterator<Item = HostConfig>) {
        let configs: HashSet<HostConfig> = configs.into_iter().collect();
        for config in &configs {
            self.ensure(config);
        }
        if let Ok(mut declared) = self.declared.lock() {
            declared.insert(owner.to_string(), configs);
        }
    }

    /// Forgets what MicrovmCluster `owner` declared (it is gone) and stops what nobody needs now.
    pub fn forget_owner(&self, owner: &str) {
        if let Ok(mut declared) = self.declared.lock() {
            declared.remove(owner);
        }
        self.sweep(UNDECLARED_GRACE);
    }

    /// [`Hosts::sweep`] with the default grace for observers nobody declares.
    pub fn sweep_undeclared(&self) {
        self.sweep(UNDECLARED_GRACE);
    }

    /// Stops observers no MicrovmCluster declares and no reconcile asked for within `grace`, and drops
    /// the gauges of endpoints no observer is left for.
    pub fn sweep(&self, grace: Duration) {
        let wanted: HashSet<HostConfig> = match self.declared.lock() {
            Ok(declared) => declared.values().flatten().cloned().collect(),
            Err(_) => return,
        };
        let Ok(mut entries) = self.entries.lock() else {
            return;
        };
        let mut stopped = Vec::new();
        for by_config in entries.values_mut() {
            by_config.retain(|config, entry| {
                let keep = wanted.contains(config) || entry.wanted_at.elapsed() < grace;
                if !keep {
                    entry.task.abort();
                    stopped.push(config.endpoint.clone());
                }
                keep
            });
        }
        entries.retain(|_, by_config| !by_config.is_empty());
        for endpoint in stopped {
            if !entries.contains_key(&endpoint) {
                info!(host = %endpoint, "no longer observing host: no MicrovmCluster names it");
                self.metrics.host_forgotten(&endpoint);
                if let Ok(mut reservations) = self.reservations.lock() {
                    reservations.remove(&endpoint);
                }
            }
        }
    }

    /// The last answer of the host under `config`, if it is observed.
    pub fn snapshot(&self, config: &HostConfig) -> Option<Snapshot> {
        let entries = self.entries.lock().ok()?;
        let entry = entries.get(&config.endpoint)?.get(config)?;
        entry.state.snapshot.read().ok().map(|s| s.clone())
    }

    /// Reachability of the host under `config` and its allocation (credentials problems are the
    /// caller's to fill in).
    pub fn facts(&self, config: &HostConfig) -> HostFacts {
        let Some(snapshot) = self.snapshot(config) else {
            return HostFacts::default();
        };
        let (allocated_vcpu, allocated_memory_mb) = self.allocation(&config.endpoint);
        HostFacts {
            reachability: snapshot.reachability,
            allocated_vcpu,
            allocated_memory_mb,
            ..Default::default()
        }
    }

    /// Makes sure `config` is observed ([`Hosts::ensure`]) and returns whether the host answers under
    /// it, under one look at the observers: a placement gathers this for every host of its pool. Its
    /// allocation is not read here: a placement reads it under its turn ([`Hosts::place`]), and
    /// nothing else decides by it.
    pub fn observed_reachability(self: &Arc<Self>, config: &HostConfig) -> Reachability {
        let Ok(mut entries) = self.entries.lock() else {
            return Reachability::default();
        };
        match entries
            .get_mut(&config.endpoint)
            .and_then(|by_config| by_config.get_mut(config))
        {
            Some(entry) => {
                entry.wanted_at = Instant::now();
                entry
                    .state
                    .snapshot
                    .read()
                    .ok()
                    .map(|s| s.reachability.clone())
                    .unwrap_or_default()
            }
            None => {
                drop(entries);
                self.ensure(config);
                self.snapshot(config)
                    .map(|s| s.reachability)
                    .unwrap_or_default()
            }
        }
    }

    /// vCPUs and MiB allocated on `endpoint`: the microVMs its last answered list showed (under any
    /// credentials that could list it: capacity is physical, and only numbers leave this function)
    /// plus the placements not listed yet.
    pub fn allocation(&self, endpoint: &str) -> (i64, i64) {
        let listed: Arc<ListedVms> = self
            .entries
            .lock()
            .ok()
            .and_then(|entries| entries.get(endpoint).map(listed_of))
            .unwrap_or_default();
        let mut reservations = self.reservations.lock().ok();
        allocated(
            &listed,
            reservations.as_mut().and_then(|r| r.get_mut(endpoint)),
            Instant::now(),
        )
    }

    /// What [`Hosts::allocation`] says of each host in `facts`, written into it, under one look at
    /// the observers and one at the reservations: a placement reads every host of its pool.
    pub fn fill_allocation(&self, facts: &mut BTreeMap<String, HostFacts>) {
        let listed: Vec<Arc<ListedVms>> = match self.entries.lock() {
            Ok(entries) => facts
                .keys()
                .map(|endpoint| entries.get(endpoint).map(listed_of).unwrap_or_default())
                .collect(),
            Err(_) => facts.keys().map(|_| Arc::default()).collect(),
        };
        let now = Instant::now();
        let mut reservations = self.reservations.lock().ok();
        for ((endpoint, fact), listed) in facts.iter_mut().zip(listed) {
            let host = reservations.as_mut().and_then(|r| r.get_mut(endpoint));
            (fact.allocated_vcpu, fact.allocated_memory_mb) = allocated(&listed, host, now);
        }
    }

    /// Runs one placement decision at a time: `decide` reads the hosts' allocation (through
    /// [`Hosts::fill_allocation`]), decides, and returns its outcome with the host it chose, which is reserved
    /// before the next placement decides. Concurrent reconciles therefore see each other's choices,
    /// and a burst spreads over equal hosts exactly as a slow trickle would. `decide` must be quick
    /// and must not block (it runs under a lock).
    pub fn place<T>(&self, decide: impl FnOnce() -> (T, Option<Claim>)) -> T {
        let _turn = self
            .placing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (outcome, claim) = decide();
        if let Some(c) = claim {
            self.reserve(&c.endpoint, &c.machine_uid, c.vcpu, c.memory_mb);
        }
        outcome
    }

    /// Drops the reservation of `machine_uid` on `endpoint`: the placement was not recorded after all
    /// (the write failed), or nothing will be created there for now (the host refused the spec).
    pub fn release_reservation(&self, endpoint: &str, machine_uid: &str) {
        if let Ok(mut reservations) = self.reservations.lock()
            && let Some(host) = reservations.get_mut(endpoint)
        {
            host.release(machine_uid);
        }
    }

    /// Counts a machine just placed on `endpoint` towards its allocation until its microVM shows up.
    pub fn reserve(&self, endpoint: &str, machine_uid: &str, vcpu: i64, memory_mb: i64) {
        if let Ok(mut reservations) = self.reservations.lock() {
            reservations
                .entry(endpoint.to_string())
                .or_default()
                .reserve(machine_uid, vcpu, memory_mb, Instant::now());
        }
    }

    /// Records a microVM this operator just created, so cache readers see it before the next list, and
    /// polls the host fast while it starts.
    pub fn record_created(&self, endpoint: &str, vm: &Microvm) {
        let hv = host_vm(vm, marker_from_metadata(&vm.spec.metadata));
        self.update(endpoint, &hv.vm.uid, InFlight::created, |vms| {
            vms.retain(|v| v.vm.uid != hv.vm.uid);
            vms.push(hv.clone());
        });
    }

    /// Records a delete this operator just asked for.
    pub fn record_deleting(&self, endpoint: &str, uid: &str) {
        self.update(endpoint, uid, InFlight::deleted, |vms| {
            for v in vms.iter_mut().filter(|v| v.vm.uid == uid) {
                v.vm.state = VmState::Deleting;
            }
        });
    }

    /// Applies `change` to the snapshots of `endpoint` whose credentials could list it (their last
    /// list answered): an observer refused by the host never shows what it could not list. `uid` is
    /// in flight: the observers ask the host about it at the busy interval until it settles.
    fn update(
        &self,
        endpoint: &str,
        uid: &str,
        call: fn(&mut InFlight, &str, Instant),
        change: impl Fn(&mut Vec<HostVm>),
    ) {
        let Ok(entries) = self.entries.lock() else {
            return;
        };
        for entry in entries.get(endpoint).into_iter().flat_map(HashMap::values) {
            if let Ok(mut snapshot) = entry.state.snapshot.write()
                && snapshot.reachability == Reachability::Reachable
            {
                let mut vms = snapshot.vms.vms.clone();
                change(&mut vms);
                snapshot.vms = Arc::new(ListedVms::new(vms));
            }
            if let Ok(mut in_flight) = entry.state.in_flight.lock() {
                // A host already busy is asked at the busy interval anyway: no kick per create.
                if in_flight.is_empty() {
                    entry.state.kick.notify_one();
                }
                call(&mut in_flight, uid, Instant::now());
            }
        }
    }

    fn spawn(self: &Arc<Self>, config: HostConfig, state: Arc<HostState>) -> JoinHandle<()> {
        let this = Arc::clone(self);
        tokio::spawn(async move { this.observe(config, state).await })
    }

    async fn observe(self: Arc<Self>, config: HostConfig, state: Arc<HostState>) {
        let endpoint = config.endpoint.clone();
        // The marker a microVM carries never changes: parse each microVM's meta-data once.
        let mut markers: HashMap<String, Marker> = HashMap::new();
        let mut last_list: Option<Instant> = None;
        // Observers started together would list together at every poll: their answers (every
        // microVM's spec and cloud-init) decoded at once made the operator's peak memory. Each list
        // comes a little after the poll interval, by a share that changes from list to list.
        let mut lists: u64 = 0;
        let mut list_every = self.poll;
        loop {
            if let Some(listed_at) = last_list {
                let busy = state.in_flight.lock().is_ok_and(|f| !f.is_empty());
                let until_list = list_every.saturating_sub(listed_at.elapsed());
                let interval = if busy {
                    self.busy_poll.min(until_list)
                } else {
                    until_list
                };
                tokio::select! {
                    () = tokio::time::sleep(interval) => {}
                    () = state.kick.notified() => {
                        // Let a burst of creates land before asking.
                        tokio::time::sleep(self.busy_poll.min(Duration::from_millis(200))).await;
                    }
                }
            }
            let list_due = last_list.is_none_or(|t| t.elapsed() >= list_every)
                || state
                    .snapshot
                    .read()
                    .map_or(true, |s| s.reachability != Reachability::Reachable);
            let client = self.pool.client(&config);
            if !list_due && let Ok(client) = &client {
                let (due, busy) = match state.in_flight.lock() {
                    Ok(in_flight) => (in_flight.due(Instant::now()), !in_flight.is_empty()),
                    Err(_) => (Vec::new(), false),
                };
                // In flight, but too new to ask about yet: nothing to call.
                if due.is_empty() && busy {
                    continue;
                }
                if let Some(vms) = self.ask_in_flight(client, &state, due, &mut markers).await {
                    self.publish(&endpoint, &state, Reachability::Reachable, Some(vms));
                    continue;
                }
            }
            last_list = Some(Instant::now());
            lists += 1;
            list_every = self.poll + self.poll.mul_f64(list_delay_share(&endpoint, lists));
            let listed = match client {
                Ok(client) => client.list("", None).await,
                Err(e) => Err(e),
            };
            let (reachability, vms) = match listed {
                Ok(vms) => {
                    let mut seen = HashSet::new();
                    let vms: Vec<HostVm> = vms
                        .iter()
                        .map(|vm| {
                            seen.insert(vm.uid().to_string());
                            let marker = markers
                                .entry(vm.uid().to_string())
                                .or_insert_with(|| marker_from_metadata(&vm.spec.metadata))
                                .clone();
                            host_vm(vm, marker)
                        })
                        .collect();
                    markers.retain(|uid, _| seen.contains(uid));
                    if let Ok(mut in_flight) = state.in_flight.lock() {
                        in_flight.listed(
                            vms.iter().map(|hv| (hv.vm.uid.as_str(), hv.vm.state)),
                            Instant::now(),
                        );
                    }
                    (Reachability::Reachable, Some(vms))
                }
                Err(e) if e.kind() == ErrorKind::Unauthenticated => {
                    debug!(host = %endpoint, error = %e, "host refused the credentials");
                    (Reachability::Refused(e.to_string()), None)
                }
                Err(e) => {
                    debug!(host = %endpoint, error = %e, "host list failed");
                    (Reachability::Unreachable(e.to_string()), None)
                }
            };
            self.publish(&endpoint, &state, reachability, vms);
        }
    }

    /// Asks the host about each microVM of `uids` (in flight; a Get each) and returns the snapshot's
    /// microVMs with the answers applied: a settled one leaves the in-flight set, a gone one the
    /// snapshot. `None` when a call failed otherwise than NotFound: the caller lists the host
    /// instead, which reports reachability.
    async fn ask_in_flight(
        &self,
        client: &FlintlockClient,
        state: &HostState,
        uids: Vec<String>,
        markers: &mut HashMap<String, Marker>,
    ) -> Option<Vec<HostVm>> {
        if uids.is_empty() {
            return None;
        }
        let mut answers: HashMap<String, Option<HostVm>> = HashMap::new();
        for uid in uids {
            match client.get(&uid).await {
                Ok(vm) => {
                    let marker = markers
                        .entry(uid.clone())
                        .or_insert_with(|| marker_from_metadata(&vm.spec.metadata))
                        .clone();
                    answers.insert(uid, Some(host_vm(&vm, marker)));
                }
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    markers.remove(&uid);
                    answers.insert(uid, None);
                }
                Err(_) => return None,
            }
        }
        if let Ok(mut in_flight) = state.in_flight.lock() {
            let now = Instant::now();
            for (uid, answer) in &answers {
                let settled = answer
                    .as_ref()
                    .is_none_or(|hv| !in_flight::is_in_flight(hv.vm.state));
                in_flight.answered(uid, settled, now);
            }
        }
        // Applied to the snapshot as it is now: a create recorded meanwhile stays in it.
        let mut vms: Vec<HostVm> = state.snapshot.read().ok()?.vms.to_vec();
        vms.retain(|hv| !matches!(answers.get(&hv.vm.uid), Some(None)));
        for hv in &mut vms {
            if let Some(Some(answer)) = answers.remove(&hv.vm.uid) {
                *hv = answer;
            }
        }
        vms.extend(answers.into_values().flatten());
        Some(vms)
    }

    /// Stores a list result and wakes whoever it concerns.
    fn publish(
        &self,
        endpoint: &str,
        state: &HostState,
        reachability: Reachability,
        vms: Option<Vec<HostVm>>,
    ) {
        let (old_reachability, old_vms) = match state.snapshot.read() {
            Ok(s) => (s.reachability.clone(), s.vms.clone()),
            Err(_) => return,
        };
        let reachable_now = reachability == Reachability::Reachable;
        let reachability_changed =
            std::mem::discriminant(&old_reachability) != std::mem::discriminant(&reachability);
        if reachability_changed {
            match &reachability {
                Reachability::Reachable => info!(host = %endpoint, "host reachable"),
                Reachability::Unreachable(why) => {
                    warn!(host = %endpoint, reason = %why, "host unreachable")
                }
                Reachability::Refused(why) => {
                    warn!(host = %endpoint, reason = %why, "host refused the credentials")
                }
                Reachability::Unknown => {}
            }
        }
        // (namespace, name, carries our marker)
        let mut changed: Vec<(String, String, bool)> = Vec::new();
        if let Some(new_vms) = &vms {
            let before: HashMap<&str, &HostVm> =
                old_vms.iter().map(|v| (v.vm.uid.as_str(), v)).collect();
            let after: HashMap<&str, &HostVm> =
                new_vms.iter().map(|v| (v.vm.uid.as_str(), v)).collect();
            for (uid, v) in &after {
                let moved = before
                    .get(uid)
                    .is_none_or(|b| b.vm.state != v.vm.state || b.vm.retry != v.vm.retry);
                if moved {
                    changed.push((
                        v.vm.namespace.clone(),
                        v.vm.name.clone(),
                        v.vm.machine_uid.is_some(),
                    ));
                }
            }
            for (uid, v) in &before {
                if !after.contains_key(uid) {
                    changed.push((
                        v.vm.namespace.clone(),
                        v.vm.name.clone(),
                        v.vm.machine_uid.is_some(),
                    ));
                }
            }
            let mut by_state: BTreeMap<&'static str, i64> =
                ["pending", "created", "failed", "deleting", "unknown"]
                    .into_iter()
                    .map(|s| (s, 0))
                    .collect();
            for v in new_vms {
                *by_state.entry(state_label(v.vm.state)).or_default() += 1;
            }
            self.metrics
                .host_observed(endpoint, true, &by_state.into_iter().collect::<Vec<_>>());
        } else if !self.reachable_elsewhere(endpoint, state) {
            // Another observer of the endpoint (other credentials) that answers speaks for the host.
            self.metrics.host_observed(endpoint, false, &[]);
        }
        if let Ok(mut s) = state.snapshot.write() {
            if matches!(reachability, Reachability::Refused(_)) {
                // What these credentials listed before they were refused is theirs to see no more.
                s.vms = Arc::default();
            }
            s.reachability = reachability;
            if let Some(vms) = vms {
                s.vms = Arc::new(ListedVms::new(vms));
            }
        }
        changed.sort();
        changed.dedup();
        for (ns, name, ours) in changed {
            if ours {
                self.wake.microvm_changed(&ns, &name);
            } else {
                self.wake.unmarked_microvm_changed(&ns, &name);
            }
        }
        if reachability_changed {
            debug!(host = %endpoint, reachable = reachable_now, "waking objects of host");
            self.wake.host_changed(endpoint);
        }
    }
}

impl Hosts {
    /// Whether an observer of `endpoint` other than `state`'s last answered.
    fn reachable_elsewhere(&self, endpoint: &str, state: &HostState) -> bool {
        let Ok(entries) = self.entries.lock() else {
            return false;
        };
        entries
            .get(endpoint)
            .into_iter()
            .flat_map(HashMap::values)
            .filter(|e| !std::ptr::eq(e.state.as_ref(), state))
            .any(|e| {
                e.state
                    .snapshot
                    .read()
                    .is_ok_and(|s| s.reachability == Reachability::Reachable)
            })
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        if let Ok(entries) = self.entries.lock() {
            for entry in entries.values().flat_map(HashMap::values) {
                entry.task.abort();
            }
        }
    }
}

/// Converts a host's microVM, with the marker its meta-data carries, into the engine's view.
pub fn observed_vm(vm: &Microvm, marker: Marker) -> ObservedVm {
    ObservedVm {
        uid: vm.uid().to_string(),
        namespace: vm.spec.namespace.clone(),
        name: vm.spec.id.clone(),
        state: match vm.status.state {
            MicrovmState::Pending => VmState::Pending,
            MicrovmState::Created => VmState::Created,
            MicrovmState::Failed => VmState::Failed,
            MicrovmState::Deleting => VmState::Deleting,
            MicrovmState::Unknown(n) => VmState::Unknown(n),
        },
        retry: vm.status.retry,
        machine_uid: marker.machine_uid,
        cluster: marker.cluster,
        running: Some(RunningSpec {
            vcpu: i64::from(vm.spec.vcpu),
            memory_mb: i64::from(vm.spec.memory_mb),
            kernel_image: vm.spec.kernel.image.clone(),
            root_volume_image: vm
                .spec
                .root_volume
                .as_ref()
                .and_then(|v| v.source.container_source.clone()),
        }),
    }
}

fn host_vm(vm: &Microvm, marker: Marker) -> HostVm {
    HostVm {
        vm: observed_vm(vm, marker),
        vcpu: i64::from(vm.spec.vcpu),
        memory_mb: i64::from(vm.spec.memory_mb),
    }
}

/// The share of the poll interval (0 to [`LIST_SPREAD`]) by which list `n` of `endpoint` comes
/// late: different per host and per list, so lists started together drift apart. Never early, so a
/// host is listed at most once per poll interval.
fn list_delay_share(endpoint: &str, n: u64) -> f64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    (endpoint, n).hash(&mut h);
    (h.finish() % 1000) as f64 / 1000.0 * LIST_SPREAD
}

/// At most this share of the poll interval is added before a host's next list.
const LIST_SPREAD: f64 = 0.1;

fn state_label(state: VmState) -> &'static str {
    match state {
        VmState::Pending => "pending",
        VmState::Created => "created",
        VmState::Failed => "failed",
        VmState::Deleting => "deleting",
        VmState::Unknown(_) => "unknown",
    }
}

#[cfg(test)]
mod reservation_tests;
