//! The soaks' monitors, shared by the emulator soak and the real-stack soak: what they count is
//! read from the hosts (every microVM and the machine uid in its meta-data) and from the API (a
//! MicrovmMachine's disappearance), never from the operator's own account of itself.
//!
//! - **duplicates**: a machine (its origin uid, carried in the microVM's meta-data) that ever had
//!   more than one microVM on the hosts;
//! - **early releases**: a MicrovmMachine that disappeared (its finalizer released) while a
//!   microVM carrying its uid was still on a host;
//! - **leaks** ([`leaks`]): microVMs on the hosts that no MicrovmMachine accounts for.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use capmvm_api::MicrovmMachine;
use capmvm_flintlock::hollow::HostControl;
use capmvm_reconcile::cloudinit::machine_uid_from_metadata;
use capmvm_reconcile::machine::origin_uid;
use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A small seeded generator (splitmix64): a chaos schedule replays with its seed.
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A duration in `[lo, hi)` milliseconds.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next_u64() % (hi - lo).max(1))
    }

    /// A number in `[0, n)`.
    pub fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next_u64() % (n.max(1) as u64)).unwrap_or(0)
    }
}

/// What the monitors found.
#[derive(Debug, Default)]
pub struct Findings {
    /// Machines that had more than one microVM: origin uid → microVM uids.
    pub duplicates: BTreeMap<String, BTreeSet<String>>,
    /// MicrovmMachines whose finalizer went while their microVM was still on a host.
    pub early_releases: Vec<String>,
}

impl Findings {
    /// MicroVMs created beyond one per machine.
    pub fn duplicate_vms(&self) -> usize {
        self.duplicates.values().map(|v| v.len() - 1).sum()
    }
}

/// What the monitors share.
#[derive(Default)]
struct Seen {
    /// Origin uid → every microVM uid seen carrying it.
    vms_of_machine: BTreeMap<String, BTreeSet<String>>,
    early_releases: Vec<String>,
}

/// The running monitors.
pub struct Monitors {
    seen: Arc<Mutex<Seen>>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Monitors {
    /// Starts sampling `hosts` and watching the MicrovmMachines of `machines` (one namespace or
    /// all) through a client the chaos never touches.
    pub fn start(machines: Api<MicrovmMachine>, hosts: Vec<HostControl>) -> Monitors {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (stop, stopped) = watch::channel(false);
        let tasks = vec![
            tokio::spawn(sample_hosts(hosts.clone(), seen.clone(), stopped.clone())),
            tokio::spawn(watch_releases(machines, hosts, seen.clone(), stopped)),
        ];
        Monitors { seen, stop, tasks }
    }

    /// Stops the monitors; what they found.
    pub async fn finish(self) -> anyhow::Result<Findings> {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
        let seen = std::mem::take(
            &mut *self
                .seen
                .lock()
                .map_err(|_| anyhow::anyhow!("a monitor panicked"))?,
        );
        Ok(Findings {
            duplicates: seen
                .vms_of_machine
                .into_iter()
                .filter(|(_, vms)| vms.len() > 1)
                .collect(),
            early_releases: seen.early_releases,
        })
    }
}

/// Every microVM on `hosts` (`host: uid (id)`) whose machine uid is not in `machines` (the origin
/// uids of the MicrovmMachines that exist); with an empty `machines`, everything left.
pub fn leaks(hosts: &[HostControl], machines: &BTreeSet<String>) -> Vec<String> {
    hosts
        .iter()
        .flat_map(|h| {
            h.vms().into_iter().filter_map(move |vm| {
                let owner = machine_uid_from_metadata(&vm.microvm.spec.metadata);
                (!owner.is_some_and(|o| machines.contains(&o))).then(|| {
                    format!(
                        "{}: {} ({}/{})",
                        h.endpoint(),
                        vm.uid(),
                        vm.microvm.spec.namespace,
                        vm.microvm.spec.id
                    )
                })
            })
        })
        .collect()
}

/// Records, every 50 ms, which microVMs carry which machine's uid. A microVM stays listed while it
/// is deleted (hundreds of milliseconds), so even a duplicate deleted at once is seen.
async fn sample_hosts(
    hosts: Vec<HostControl>,
    seen: Arc<Mutex<Seen>>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let mut batch: Vec<(String, String)> = Vec::new();
        for h in &hosts {
            for vm in h.vms() {
                if let Some(machine) = machine_uid_from_metadata(&vm.microvm.spec.metadata) {
                    batch.push((machine, vm.uid().to_string()));
                }
            }
        }
        if let Ok(mut seen) = seen.lock() {
            for (machine, vm) in batch {
                seen.vms_of_machine.entry(machine).or_default().insert(vm);
            }
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Watches MicrovmMachines: when one is gone, no microVM carrying its uid may be left on any host.
/// A deletion the watch missed (the API server or etcd was down, the watch expired) shows when
/// the watcher lists again: whatever the new list lacks is gone too.
async fn watch_releases(
    api: Api<MicrovmMachine>,
    hosts: Vec<HostControl>,
    seen: Arc<Mutex<Seen>>,
    mut stop: watch::Receiver<bool>,
) {
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    // Object uid → (name, origin uid) of every MicrovmMachine seen and not yet gone.
    let mut known: BTreeMap<String, (String, String)> = BTreeMap::new();
    let mut relisted: Option<BTreeMap<String, (String, String)>> = None;
    let entry = |m: &MicrovmMachine| {
        let uid = m.uid()?;
        let origin = origin_uid(m)?.to_string();
        Some((uid, (m.name_any(), origin)))
    };
    loop {
        let event = tokio::select! {
            e = stream.next() => e,
            _ = stop.changed() => return,
        };
        match event {
            None => return,
            Some(Ok(watcher::Event::Apply(m))) => known.extend(entry(&m)),
            Some(Ok(watcher::Event::Init)) => relisted = Some(BTreeMap::new()),
            Some(Ok(watcher::Event::InitApply(m))) => {
                if let (Some(list), Some(e)) = (relisted.as_mut(), entry(&m)) {
                    list.insert(e.0, e.1);
                }
            }
            Some(Ok(watcher::Event::InitDone)) => {
                let list = relisted.take().unwrap_or_default();
                for (uid, (name, origin)) in &known {
                    if !list.contains_key(uid) {
                        check_gone(&hosts, &seen, name, origin);
                    }
                }
                known = list;
            }
            Some(Ok(watcher::Event::Delete(m))) => {
                if let Some((uid, (name, origin))) = entry(&m) {
                    known.remove(&uid);
                    check_gone(&hosts, &seen, &name, &origin);
                }
            }
            Some(Err(_)) => {}
        }
    }
}

/// Records an early release if a microVM of machine `origin` (MicrovmMachine `name`, now gone) is
/// still on a host.
fn check_gone(hosts: &[HostControl], seen: &Mutex<Seen>, name: &str, origin: &str) {
    let left: Vec<String> = hosts
        .iter()
        .flat_map(|h| {
            h.vms().into_iter().filter_map(|vm| {
                (machine_uid_from_metadata(&vm.microvm.spec.metadata).as_deref() == Some(origin))
                    .then(|| format!("{}: {} ({:?})", h.endpoint(), vm.uid(), vm.state()))
            })
        })
        .collect();
    if !left.is_empty()
        && let Ok(mut seen) = seen.lock()
    {
        seen.early_releases
            .push(format!("{name} left {}", left.join(", ")));
    }
}
