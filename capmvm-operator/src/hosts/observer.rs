//! The observer task of one host and credentials: list the host at the poll interval (ask about the
//! microVMs in flight at the busy interval), publish what it answered, and wake whom it concerns.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use capmvm_flintlock::{ErrorKind, FlintlockClient, HostConfig};
use capmvm_reconcile::cloudinit::{Marker, marker_from_metadata};
use capmvm_reconcile::{Reachability, VmState};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::{HostState, HostVm, Hosts, ListedVms, host_vm, in_flight};

impl Hosts {
    pub(super) fn spawn(
        self: &Arc<Self>,
        config: HostConfig,
        state: Arc<HostState>,
    ) -> JoinHandle<()> {
        let this = Arc::clone(self);
        tokio::spawn(async move { this.observe(config, state).await })
    }

    async fn observe(self: Arc<Self>, config: HostConfig, state: Arc<HostState>) {
        let endpoint = config.endpoint.clone();
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
                if let Some(vms) = self.ask_in_flight(client, &state, due).await {
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
                    let known = state.snapshot.read().ok().map(|s| Arc::clone(&s.vms));
                    let known = Known::of(known.as_deref());
                    let mut vms: Vec<HostVm> =
                        vms.iter().map(|vm| host_vm(vm, known.marker(vm))).collect();
                    share_images(&mut vms);
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
    ) -> Option<Vec<HostVm>> {
        if uids.is_empty() {
            return None;
        }
        let known = state.snapshot.read().ok().map(|s| Arc::clone(&s.vms));
        let known = Known::of(known.as_deref());
        let mut answers: HashMap<String, Option<HostVm>> = HashMap::new();
        for uid in uids {
            match client.get(&uid).await {
                Ok(vm) => {
                    answers.insert(uid, Some(host_vm(&vm, known.marker(&vm))));
                }
                Err(e) if e.kind() == ErrorKind::NotFound => {
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
    pub(super) fn publish(
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

/// Shares the image names the microVMs of one list run with: a host runs few images, and each
/// microVM's answer names them again (an allocation per name per microVM was about 3 MiB at 30 000
/// machines).
fn share_images(vms: &mut [HostVm]) {
    let mut names: HashSet<Arc<str>> = HashSet::new();
    let mut share = |name: &mut Arc<str>| match names.get(&**name) {
        Some(n) => *name = Arc::clone(n),
        None => {
            names.insert(Arc::clone(name));
        }
    };
    for running in vms.iter_mut().filter_map(|hv| hv.vm.running.as_mut()) {
        share(&mut running.kernel_image);
        if let Some(image) = &mut running.root_volume_image {
            share(image);
        }
    }
}

/// The microVMs the host's last snapshot held, by uid: the marker a microVM carries never changes
/// (flintlock cannot change a microVM's meta-data), so each one's meta-data (base64 YAML) is parsed
/// once, when it first shows in a list, a Get or our create's answer, and read from the snapshot
/// after. (A map of markers per observer kept a second copy of every microVM's uids: about
/// 6 MiB at 30 000 machines.)
struct Known<'a>(HashMap<&'a str, &'a HostVm>);

impl<'a> Known<'a> {
    fn of(vms: Option<&'a ListedVms>) -> Self {
        Self(
            vms.into_iter()
                .flat_map(|vms| vms.iter())
                .map(|hv| (hv.vm.uid.as_str(), hv))
                .collect(),
        )
    }

    /// `vm`'s marker: the snapshot's, else parsed from its meta-data.
    fn marker(&self, vm: &capmvm_flintlock::Microvm) -> Marker {
        match self.0.get(vm.uid()) {
            Some(hv) => Marker {
                machine_uid: hv.vm.machine_uid.clone(),
                cluster: hv.vm.cluster.clone(),
            },
            None => marker_from_metadata(&vm.spec.metadata),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lists come late by at most a tenth of the poll interval, never early, and hosts drift apart.
    #[test]
    fn lists_of_hosts_started_together_drift_apart() {
        let shares: Vec<f64> = (0..100)
            .map(|i| list_delay_share(&format!("10.0.0.{i}:9090"), 1))
            .collect();
        assert!(shares.iter().all(|s| (0.0..LIST_SPREAD).contains(s)));
        let distinct: std::collections::BTreeSet<u64> =
            shares.iter().map(|s| (s * 1000.0) as u64).collect();
        assert!(distinct.len() > 50, "{distinct:?}");
        assert_ne!(list_delay_share("h:1", 1), list_delay_share("h:1", 2));
    }

    /// The microVMs of one list share each image name; different names stay apart.
    #[test]
    fn a_list_shares_its_image_names() {
        let with = |uid: &str, kernel: &str| {
            let mut hv = crate::hosts::tests::vm(uid, uid, VmState::Created);
            hv.vm.running = Some(capmvm_reconcile::RunningSpec {
                kernel_image: kernel.into(),
                root_volume_image: Some("root:1".into()),
                ..Default::default()
            });
            hv
        };
        let mut vms = vec![
            with("a", "kernel:1"),
            with("b", "kernel:1"),
            with("c", "kernel:2"),
        ];
        share_images(&mut vms);
        let running: Vec<&capmvm_reconcile::RunningSpec> =
            vms.iter().filter_map(|hv| hv.vm.running.as_ref()).collect();
        assert!(Arc::ptr_eq(
            &running[0].kernel_image,
            &running[1].kernel_image
        ));
        assert!(!Arc::ptr_eq(
            &running[0].kernel_image,
            &running[2].kernel_image
        ));
        assert_eq!(&*running[2].kernel_image, "kernel:2");
        let roots: Vec<&Arc<str>> = running
            .iter()
            .filter_map(|r| r.root_volume_image.as_ref())
            .collect();
        assert!(Arc::ptr_eq(roots[0], roots[2]));
    }
}
