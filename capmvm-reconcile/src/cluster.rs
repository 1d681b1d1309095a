//! Deciding for one MicrovmCluster: provisioned once valid with an endpoint, failure domains from host
//! groups, host reachability and credentials on `Ready` and `HostsReachable`, microVMs left behind on
//! `OrphanedMicrovms`, a warning for tokens sent in plaintext, and a Warning event for every
//! cluster-level problem when it appears.
//!
//! The MicrovmCluster holds a finalizer, and puts one on the Secrets it names for credentials, until
//! none of its MicrovmMachines exists. CAPI deletes it last, but a namespace deletion (or a user)
//! deletes everything at once: its machines still need its hosts and credentials to delete their
//! microVMs.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use capmvm_api::conditions::{reasons, types};
use capmvm_api::keys::{CLUSTER_FINALIZER, MANAGED_BY_ANNOTATION};
use capmvm_api::{
    FailureDomain, HostEndpoint, HostMaintenance, HostState, HostStatus, Initialization,
    MicrovmCluster, MicrovmClusterStatus, validation,
};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::conditions::{self, Conditions, Status};
use crate::observe::{HostedVm, ObservedCluster, Reachability, VmState};
use crate::plan::{ClusterPlan, Event, EventKind, Requeue, reasons as events};
use crate::preamble::{self, Gates, Path, preamble};

/// Condition type: whether host connections are protected by TLS.
pub const HOST_TRANSPORT_SECURE: &str = "HostTransportSecure";

/// How soon a deleted MicrovmCluster looks again at its remaining machines, behind the wake-up their
/// removal sends.
pub const MACHINES_GONE_RECHECK: Duration = Duration::from_secs(10);

/// A microVM left behind on one of the cluster's hosts (see [`orphans`]).
#[derive(Debug, PartialEq, Eq)]
pub struct Orphan<'a> {
    /// The microVM and its host.
    pub hosted: &'a HostedVm,
    /// The other Clusters whose MicrovmClusters list its host and report it too, when its meta-data
    /// does not name a cluster of the host: empty unless it is reported by more than one.
    pub shared_with: Vec<&'a str>,
}

/// The microVMs on the cluster's hosts that carry the uid of a MicrovmMachine that no longer exists:
/// in the cluster's namespace, not being deleted. Reported, never deleted: only a person can tell a
/// leak from a machine restored from a backup without its annotations. Each is reported once, by
/// the cluster its meta-data names; one whose meta-data names no cluster that lists its host (made
/// before the name was written, or by a cluster gone since) is reported by every MicrovmCluster of
/// the namespace listing the host, each saying the host is shared.
pub fn orphans(obs: &ObservedCluster) -> Vec<Orphan<'_>> {
    let namespace = obs.microvm_cluster.namespace().unwrap_or_default();
    let mine = own_cluster_name(obs);
    let mut out: Vec<Orphan<'_>> = obs
        .microvms
        .iter()
        .filter(|h| h.vm.namespace == namespace && h.vm.state != VmState::Deleting)
        .filter(|h| {
            h.vm.machine_uid
                .as_ref()
                .is_some_and(|uid| !obs.known_machine_uids.contains(uid))
        })
        .filter_map(|h| {
            let sharers = obs.shared_hosts.get(&h.host);
            match h.vm.cluster.as_deref() {
                Some(c) if Some(c) == mine => Some(Orphan {
                    hosted: h,
                    shared_with: Vec::new(),
                }),
                // Another cluster on the host made it: that one reports it.
                Some(c) if sharers.is_some_and(|s| s.contains(c)) => None,
                _ => Some(Orphan {
                    hosted: h,
                    shared_with: sharers.into_iter().flatten().map(String::as_str).collect(),
                }),
            }
        })
        .collect();
    out.sort_by(|a, b| (&a.hosted.host, &a.hosted.vm.uid).cmp(&(&b.hosted.host, &b.hosted.vm.uid)));
    out.dedup_by(|a, b| a.hosted.vm.uid == b.hosted.vm.uid);
    out
}

/// The name of the CAPI Cluster this MicrovmCluster belongs to: its owner, else its
/// ownerReference, else its cluster-name label.
pub fn own_cluster_name(obs: &ObservedCluster) -> Option<&str> {
    if let Some(owner) = &obs.owner {
        return Some(owner.name.as_str());
    }
    cluster_name_of(&obs.microvm_cluster)
}

/// The name of the CAPI Cluster owning `mc` (ownerReference kind Cluster), else its cluster-name
/// label.
pub fn cluster_name_of(mc: &MicrovmCluster) -> Option<&str> {
    mc.owner_references()
        .iter()
        .find(|o| {
            o.kind == "Cluster"
                && o.api_version.rsplit_once('/').map(|(g, _)| g)
                    == Some(capmvm_api::capi::CAPI_GROUP)
        })
        .map(|o| o.name.as_str())
        .or_else(|| {
            mc.labels()
                .get(capmvm_api::keys::CLUSTER_NAME_LABEL)
                .map(String::as_str)
        })
}

/// The hosts a MicrovmCluster observes through its own credentials (the operator keeps one observer
/// per host and credentials, and gathers the cluster's facts and microVMs from them): every valid
/// endpoint of its static pool, and the hosts its machines are recorded on (a host removed from the
/// pool still holds their microVMs), as canonical endpoints.
///
/// A paused or deleted cluster observes them too. A pause stops changes, not reading: its machines
/// and its orphaned-microVM gauge keep reading current lists, and when the pause ends they decide
/// from those. A deleted cluster's machines need their hosts observed to see their microVMs go:
/// the observer wakes a machine when its microVM vanishes (without it each deletion would be
/// confirmed only at the next safety-net recheck, a minute later).
pub fn hosts_to_observe(
    mc: &MicrovmCluster,
    machine_hosts: impl IntoIterator<Item = HostEndpoint>,
) -> BTreeSet<String> {
    let pool = mc
        .spec
        .placement
        .static_pool
        .iter()
        .flat_map(|p| &p.hosts)
        .filter_map(|h| h.endpoint.parse::<HostEndpoint>().ok());
    pool.chain(machine_hosts).map(|h| h.to_string()).collect()
}

/// Decides what to do for one MicrovmCluster.
pub fn decide_cluster(obs: &ObservedCluster, now: Timestamp) -> ClusterPlan {
    let mc = &obs.microvm_cluster;
    // Externally managed: someone else owns status; we must not touch the object.
    if mc.annotations().contains_key(MANAGED_BY_ANNOTATION) {
        return ClusterPlan::default();
    }
    let stored = mc.status.clone().unwrap_or_default();
    let mut d = ClusterDecision {
        obs,
        conditions: Conditions::new(stored.conditions.clone(), mc.metadata.generation, now),
        status: stored,
        plan: ClusterPlan::default(),
    };
    match preamble(&mc.metadata, obs.owner.as_ref(), &mut d.conditions) {
        Path::Paused => {}
        Path::Delete => d.reconcile_delete(),
        Path::Normal => d.reconcile_normal(),
    }
    d.finish()
}

struct ClusterDecision<'a> {
    obs: &'a ObservedCluster,
    conditions: Conditions,
    status: MicrovmClusterStatus,
    plan: ClusterPlan,
}

impl ClusterDecision<'_> {
    fn set(&mut self, t: &str, s: Status, r: &str, m: impl Into<String>) {
        self.conditions.set(t, s, r, m);
    }

    /// The normal path: the finalizers, the owner gate, a valid spec and a control-plane endpoint,
    /// then failure domains, hosts and orphans.
    fn reconcile_normal(&mut self) {
        let obs = self.obs;
        let mc = &obs.microvm_cluster;
        self.protect();
        self.release_unclaimed_secrets();

        let cluster_name = own_cluster_name(obs).unwrap_or_default().to_string();
        let gates = Gates {
            has_owner: obs.owner.is_some(),
            owner_wait: "waiting for a Cluster API Cluster to own this MicrovmCluster",
            cluster_name: &cluster_name,
            cluster: obs.owner.as_ref(),
        };
        let owner = match gates.owner_and_cluster() {
            Ok(owner) => owner,
            Err(waiting) => {
                preamble::wait(&mut self.conditions, waiting, None);
                return;
            }
        };
        self.transport_security();
        if let Err(errors) = validation::validate_cluster(mc) {
            self.set(
                types::READY,
                Status::False,
                reasons::INVALID_SPEC,
                errors.to_string(),
            );
            return;
        }
        let endpoint_known = owner
            .control_plane_endpoint
            .as_ref()
            .is_some_and(|e| e.is_complete())
            || mc
                .spec
                .control_plane_endpoint
                .as_ref()
                .is_some_and(|e| e.is_complete());
        if !endpoint_known {
            self.set(
                types::READY,
                Status::False,
                reasons::WAITING_FOR_CONTROL_PLANE_ENDPOINT,
                "set spec.controlPlaneEndpoint (host and port) on the Cluster or the MicrovmCluster",
            );
            return;
        }
        self.failure_domains();
        self.hosts();
        self.host_statuses(&cluster_name);
        self.orphaned_microvms();
    }

    /// The finalizer, and the credentials finalizer on the Secrets it names.
    fn protect(&mut self) {
        if !self
            .obs
            .microvm_cluster
            .finalizers()
            .iter()
            .any(|f| f == CLUSTER_FINALIZER)
        {
            self.plan.add_finalizer = true;
        }
        for secret in &self.obs.credential_secrets {
            if secret.exists && !secret.protected {
                self.plan.protect_secrets.push(secret.name.clone());
            }
        }
    }

    /// Credentials finalizers on Secrets no MicrovmCluster of the namespace names any more (the spec
    /// was changed to name another Secret). Only an operator that sees every MicrovmCluster of the
    /// namespace can tell: behind a watch filter, another operator's clusters may name them.
    fn release_unclaimed_secrets(&mut self) {
        let obs = self.obs;
        if !obs.sees_every_cluster {
            return;
        }
        let unclaimed = obs.protected_secrets.iter().filter(|name| {
            !obs.named_by_others.contains(name.as_str())
                && !obs.credential_secrets.iter().any(|own| own.name == **name)
        });
        for name in unclaimed {
            self.plan.release_secrets.push(name.clone());
        }
    }

    /// The delete path: the finalizer stays while machines exist; then the Secrets only this
    /// cluster named are released, and the finalizer last.
    fn reconcile_delete(&mut self) {
        let obs = self.obs;
        if !obs
            .microvm_cluster
            .finalizers()
            .iter()
            .any(|f| f == CLUSTER_FINALIZER)
        {
            return;
        }
        if !obs.machines.is_empty() {
            let mut names: Vec<&str> = obs.machines.iter().map(String::as_str).collect();
            names.sort_unstable();
            let shown = names.iter().take(5).copied().collect::<Vec<_>>().join(", ");
            let more = names.len().saturating_sub(5);
            let message = format!(
                "waiting for {} MicrovmMachine(s) to delete their microVMs with this cluster's hosts and credentials: {shown}{}",
                names.len(),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            );
            self.set(
                types::READY,
                Status::False,
                reasons::WAITING_FOR_MACHINES,
                message,
            );
            self.plan.requeue = Requeue::After(MACHINES_GONE_RECHECK);
            return;
        }
        for secret in &obs.credential_secrets {
            if secret.exists && secret.protected && secret.other_users == 0 {
                self.plan.release_secrets.push(secret.name.clone());
            }
        }
        self.release_unclaimed_secrets();
        self.set(
            types::READY,
            Status::False,
            reasons::DELETING,
            "every MicrovmMachine is gone",
        );
        self.plan.remove_finalizer = true;
    }

    /// Transport security: tokens without TLS travel in plaintext (flintlock allows it).
    fn transport_security(&mut self) {
        let mc = &self.obs.microvm_cluster;
        let has_tls = mc.spec.tls_secret_ref.is_some();
        let has_token = mc
            .spec
            .placement
            .static_pool
            .as_ref()
            .is_some_and(|p| p.basic_auth_secret.is_some());
        let (secure, reason, message) = match (has_tls, has_token) {
            (true, _) => (Status::True, "TLS", String::new()),
            (false, true) => (
                Status::False,
                "BasicAuthWithoutTLS",
                "basic-auth tokens are sent to the hosts in plaintext; set tlsSecretRef"
                    .to_string(),
            ),
            (false, false) => (
                Status::False,
                "Plaintext",
                "hosts are reached without TLS or authentication".to_string(),
            ),
        };
        let was =
            conditions::reason(&self.conditions.list, HOST_TRANSPORT_SECURE).map(str::to_string);
        if reason == "BasicAuthWithoutTLS" && was.as_deref() != Some(reason) {
            self.event(
                EventKind::Warning,
                events::INSECURE_TRANSPORT,
                message.clone(),
            );
        }
        self.set(HOST_TRANSPORT_SECURE, secure, reason, message);
    }

    fn pool_hosts(&self) -> &[capmvm_api::MicrovmHost] {
        self.obs
            .microvm_cluster
            .spec
            .placement
            .static_pool
            .as_ref()
            .map(|p| p.hosts.as_slice())
            .unwrap_or_default()
    }

    /// One failure domain per group of hosts in service. A domain whose every host is cordoned or
    /// evacuating is left out: CAPI (a MachineSet, KubeadmControlPlane) and our pools put new
    /// machines in the domain with the fewest, which would be exactly the one being emptied, where
    /// no host takes them. Machines already there keep their domain.
    fn failure_domains(&mut self) {
        let mut domains: BTreeMap<&str, bool> = BTreeMap::new();
        for host in self.pool_hosts().iter().filter(|h| h.schedulable()) {
            *domains.entry(host.failure_domain_name()).or_insert(false) |=
                host.controlplane_allowed;
        }
        let failure_domains = domains
            .into_iter()
            .map(|(name, control_plane)| FailureDomain {
                name: name.to_string(),
                control_plane: Some(control_plane),
                attributes: BTreeMap::new(),
            })
            .collect();
        self.status.failure_domains = failure_domains;
        self.status.initialization = Some(Initialization {
            provisioned: Some(true),
        });
    }

    /// `status.hosts`: each host's state (maintenance first, then what the host observer saw) and
    /// how many of this cluster's microVMs it runs. A microVM whose meta-data names no cluster (made
    /// before the name was written) counts for every cluster listing it.
    fn host_statuses(&mut self, cluster_name: &str) {
        let statuses = self
            .pool_hosts()
            .iter()
            .map(|host| {
                let key = host
                    .endpoint
                    .parse::<HostEndpoint>()
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                let facts = self.obs.hosts.get(&key);
                let unreachable = facts.and_then(|f| {
                    f.credentials_problem.clone().or(match &f.reachability {
                        Reachability::Unreachable(why) => Some(why.clone()),
                        Reachability::Refused(why) => Some(format!("credentials refused: {why}")),
                        Reachability::Reachable | Reachability::Unknown => None,
                    })
                });
                let observed =
                    facts.is_some_and(|f| !matches!(f.reachability, Reachability::Unknown));
                let state = match (host.maintenance, &unreachable) {
                    (Some(HostMaintenance::Evacuate), _) => HostState::Evacuating,
                    (Some(HostMaintenance::Cordon), _) => HostState::Cordoned,
                    (None, Some(_)) => HostState::Unreachable,
                    (None, None) if observed => HostState::Ready,
                    (None, None) => HostState::Unknown,
                };
                let microvms = self
                    .obs
                    .microvms
                    .iter()
                    .filter(|hv| hv.host == key)
                    .filter(|hv| hv.vm.cluster.as_deref().is_none_or(|c| c == cluster_name))
                    .count();
                HostStatus {
                    name: host.display_name().to_string(),
                    endpoint: host.endpoint.clone(),
                    state,
                    reason: unreachable,
                    microvms: i32::try_from(microvms).unwrap_or(i32::MAX),
                }
            })
            .collect();
        self.status.hosts = statuses;
    }

    /// Reachability and credentials of every host, on `HostsReachable` and `Ready`.
    fn hosts(&mut self) {
        let mut reachable = 0;
        let mut unknown = 0;
        let mut unreachable = Vec::new();
        let mut missing = Vec::new();
        let mut refused = Vec::new();
        for host in self.pool_hosts() {
            let key = host
                .endpoint
                .parse::<HostEndpoint>()
                .map(|e| e.to_string())
                .unwrap_or_default();
            let name = format!("{} ({})", host.display_name(), host.endpoint);
            let facts = self.obs.hosts.get(&key);
            if let Some(problem) = facts.and_then(|f| f.credentials_problem.as_ref()) {
                missing.push(format!("{name}: {problem}"));
                continue;
            }
            match facts.map(|f| &f.reachability) {
                Some(Reachability::Reachable) => reachable += 1,
                Some(Reachability::Unreachable(why)) => unreachable.push(format!("{name}: {why}")),
                Some(Reachability::Refused(why)) => refused.push(format!("{name}: {why}")),
                Some(Reachability::Unknown) | None => unknown += 1,
            }
        }
        let total = self.pool_hosts().len();
        let summary = format!("{reachable} of {total} hosts reachable");
        let mut problems = Vec::new();
        if !missing.is_empty() {
            problems.push(format!("missing credentials: {}", missing.join("; ")));
        }
        if !refused.is_empty() {
            problems.push(format!("authentication failed: {}", refused.join("; ")));
        }
        if !unreachable.is_empty() {
            problems.push(format!("unreachable: {}", unreachable.join("; ")));
        }
        if !problems.is_empty() {
            let reason = if !missing.is_empty() {
                reasons::MISSING_CREDENTIALS
            } else if !refused.is_empty() {
                reasons::HOST_AUTHENTICATION_FAILED
            } else {
                reasons::HOSTS_UNREACHABLE
            };
            let message = format!("{summary}; {}", problems.join("; "));
            self.set(types::HOSTS_REACHABLE, Status::False, reason, message);
        } else if unknown > 0 {
            self.set(
                types::HOSTS_REACHABLE,
                Status::Unknown,
                reasons::HOSTS_NOT_OBSERVED,
                format!("{unknown} of {total} hosts not observed yet"),
            );
        } else {
            self.set(
                types::HOSTS_REACHABLE,
                Status::True,
                reasons::HOSTS_REACHABLE,
                summary.clone(),
            );
        }
        // Credentials are configuration a person must fix: not Ready while any is missing or
        // refused. An unreachable host is weather: Ready while another answers.
        if !missing.is_empty() {
            self.set(
                types::READY,
                Status::False,
                reasons::MISSING_CREDENTIALS,
                format!(
                    "cannot call {} of {total} hosts: {}; create the Secret or add the key (one token per host, under the host's address)",
                    missing.len(),
                    missing.join("; ")
                ),
            );
        } else if !refused.is_empty() {
            self.set(
                types::READY,
                Status::False,
                reasons::HOST_AUTHENTICATION_FAILED,
                format!(
                    "{} of {total} hosts refused the credentials: {}; check the basic-auth token for each host (or the client certificate) in the Secrets this MicrovmCluster names",
                    refused.len(),
                    refused.join("; ")
                ),
            );
        } else if reachable == 0 && !unreachable.is_empty() && unknown == 0 {
            self.set(
                types::READY,
                Status::False,
                reasons::HOSTS_UNREACHABLE,
                format!("no host is reachable: {}", unreachable.join("; ")),
            );
        } else {
            self.set(types::READY, Status::True, reasons::READY, summary);
        }
    }

    fn orphaned_microvms(&mut self) {
        let found = orphans(self.obs);
        if found.is_empty() {
            self.set(
                types::ORPHANED_MICROVMS,
                Status::False,
                reasons::NO_ORPHANED_MICROVMS,
                "",
            );
            return;
        }
        let described: Vec<String> = found
            .iter()
            .map(|o| {
                let h = o.hosted;
                let mut text = format!(
                    "microVM {}/{} (uid {}) on host {}",
                    h.vm.namespace, h.vm.name, h.vm.uid, h.host
                );
                if !o.shared_with.is_empty() {
                    let made_by = match &h.vm.cluster {
                        Some(c) => format!(
                            "its meta-data names Cluster {c:?}, which no longer lists that host"
                        ),
                        None => "its meta-data does not say which cluster made it".to_string(),
                    };
                    text.push_str(&format!(
                        " (a host shared with Cluster(s) {}, which report it too: {made_by})",
                        o.shared_with.join(", ")
                    ));
                }
                text
            })
            .collect();
        let message = format!(
            "{} microVM(s) carry the uid of a MicrovmMachine that no longer exists: {}; check whether anything still needs them, then delete them on their hosts (they are never deleted automatically)",
            found.len(),
            described.join("; ")
        );
        let before: BTreeSet<&str> = self
            .obs
            .microvm_cluster
            .status
            .as_ref()
            .and_then(|s| conditions::get(&s.conditions, types::ORPHANED_MICROVMS))
            .map(|c| {
                found
                    .iter()
                    .filter(|o| c.message.contains(o.hosted.vm.uid.as_str()))
                    .map(|o| o.hosted.vm.uid.as_str())
                    .collect()
            })
            .unwrap_or_default();
        for (o, text) in found.iter().zip(&described) {
            if !before.contains(o.hosted.vm.uid.as_str()) {
                self.event(
                    EventKind::Warning,
                    events::ORPHANED_MICROVM,
                    format!(
                        "{text} carries the uid of a MicrovmMachine that no longer exists; it is left running"
                    ),
                );
            }
        }
        self.set(
            types::ORPHANED_MICROVMS,
            Status::True,
            reasons::ORPHANED_MICROVMS_FOUND,
            message,
        );
    }

    fn event(&mut self, kind: EventKind, reason: &'static str, note: String) {
        self.plan.events.push(Event {
            kind,
            reason,
            action: "Reconcile",
            note,
        });
    }

    /// A Warning event when `Ready` turns False for a problem a person should look at, and a Normal
    /// one when it recovers from such a problem.
    fn transition_events(&mut self) {
        let before = self
            .obs
            .microvm_cluster
            .status
            .as_ref()
            .and_then(|s| conditions::get(&s.conditions, types::READY))
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()));
        let Some(after) = conditions::get(&self.conditions.list, types::READY).cloned() else {
            return;
        };
        let event_reason = match after.reason.as_str() {
            reasons::MISSING_CREDENTIALS => Some(events::MISSING_CREDENTIALS),
            reasons::HOST_AUTHENTICATION_FAILED => Some(events::HOST_AUTHENTICATION_FAILED),
            reasons::HOSTS_UNREACHABLE => Some(events::HOST_UNREACHABLE),
            reasons::INVALID_SPEC => Some(events::INVALID_SPEC),
            _ => None,
        };
        // On a change of reason only: messages of unreachable hosts vary from poll to poll.
        let changed = before
            .as_ref()
            .is_none_or(|(s, r, _)| *s != after.status || *r != after.reason);
        if !changed {
            return;
        }
        if let Some(reason) = event_reason {
            self.event(EventKind::Warning, reason, after.message.clone());
        } else if after.reason == reasons::READY
            && before.as_ref().is_some_and(|(_, r, _)| {
                matches!(
                    r.as_str(),
                    reasons::MISSING_CREDENTIALS
                        | reasons::HOST_AUTHENTICATION_FAILED
                        | reasons::HOSTS_UNREACHABLE
                        | reasons::INVALID_SPEC
                )
            })
        {
            self.event(
                EventKind::Normal,
                events::CLUSTER_RECOVERED,
                after.message.clone(),
            );
        }
    }

    fn finish(mut self) -> ClusterPlan {
        self.transition_events();
        let mut status = self.status;
        status.conditions = self.conditions.list;
        // The Go provider's LoadBalancerAvailable, on a cluster it made, is updated by nobody now.
        crate::machine::drop_previous_provider_conditions(&mut status.conditions);
        // Never un-provision (CAPI contract: provisioned is one-shot).
        if self
            .obs
            .microvm_cluster
            .status
            .as_ref()
            .and_then(|s| s.initialization.as_ref())
            .and_then(|i| i.provisioned)
            == Some(true)
        {
            status.initialization = Some(Initialization {
                provisioned: Some(true),
            });
        }
        self.plan.status = Some(status);
        self.plan
    }
}
