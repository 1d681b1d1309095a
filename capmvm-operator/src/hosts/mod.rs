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

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use capmvm_flintlock::{ClientPool, FlintlockClient, HostConfig, Microvm, MicrovmState};
use capmvm_reconcile::cloudinit::{Marker, marker_from_metadata};
use capmvm_reconcile::{HostFacts, ObservedVm, Reachability, RunningSpec, VmState};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::{debug, info};

use crate::metrics::Metrics;

mod in_flight;
mod observer;
mod placement;
mod reservations;
#[cfg(test)]
mod tests;

use in_flight::InFlight;
pub use placement::Claim;
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
    /// The machine uids those microVMs carry, as [`crate::memory::id_key`]s (their reservations
    /// are counted through them).
    machine_uids: HashSet<u128>,
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
                machine_uids.insert(crate::memory::id_key(uid));
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

impl ListedVms {
    /// Whether one of the microVMs carries `machine_uid`.
    pub fn carries(&self, machine_uid: &str) -> bool {
        self.machine_uids
            .contains(&crate::memory::id_key(machine_uid))
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

/// How long an observer that no MicrovmCluster declares is kept after a reconcile last asked for it
/// (a machine reconciled before its cluster declared, a rotated Secret's old config).
const UNDECLARED_GRACE: Duration = Duration::from_secs(60);

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
    ///
    /// Credentials `owner` replaced for a host it still uses (a rotated token or certificate) are
    /// stopped at once when nobody else declares them: against a host that moved to the new ones
    /// they could only fail, and would go on failing for the sweep's grace.
    pub fn declare(self: &Arc<Self>, owner: &str, configs: impl IntoIterator<Item = HostConfig>) {
        let configs: HashSet<HostConfig> = configs.into_iter().collect();
        for config in &configs {
            self.ensure(config);
        }
        let superseded: Vec<HostConfig> = match self.declared.lock() {
            Ok(mut declared) => {
                let before = declared
                    .insert(owner.to_string(), configs.clone())
                    .unwrap_or_default();
                before
                    .into_iter()
                    .filter(|old| {
                        !configs.contains(old)
                            && configs.iter().any(|new| new.endpoint == old.endpoint)
                            && !declared.values().any(|d| d.contains(old))
                    })
                    .collect()
            }
            Err(_) => return,
        };
        if superseded.is_empty() {
            return;
        }
        if let Ok(mut entries) = self.entries.lock() {
            for old in &superseded {
                if let Some(entry) = entries
                    .get_mut(&old.endpoint)
                    .and_then(|by_config| by_config.remove(old))
                {
                    entry.task.abort();
                    info!(host = %old.endpoint, "credentials replaced: observing the host under the new ones only");
                }
            }
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
            kernel_image: vm.spec.kernel.image.as_str().into(),
            root_volume_image: vm
                .spec
                .root_volume
                .as_ref()
                .and_then(|v| v.source.container_source.as_deref().map(Into::into)),
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
