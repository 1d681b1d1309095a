//! Deciding for one MicrovmCluster: provisioned once valid with an endpoint, failure domains from host
//! groups, host reachability on `Ready` and `HostsReachable`, a warning for tokens sent in plaintext.
//!
//! Nothing is created for a cluster, so there is no finalizer: CAPI deletes the MicrovmCluster only after
//! every machine of the cluster is gone.

use std::collections::BTreeMap;

use capmvm_api::conditions::{reasons, types};
use capmvm_api::keys::{MANAGED_BY_ANNOTATION, PAUSED_ANNOTATION};
use capmvm_api::{FailureDomain, HostEndpoint, Initialization, MicrovmClusterStatus, validation};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::conditions::{self, Status};
use crate::observe::{ObservedCluster, Reachability};
use crate::plan::{Effect, Event, EventKind, Plan, Requeue, reasons as events};

/// Condition type: whether host connections are protected by TLS.
pub const HOST_TRANSPORT_SECURE: &str = "HostTransportSecure";

/// Decides what to do for one MicrovmCluster.
pub fn decide_cluster(obs: &ObservedCluster, now: Timestamp) -> Plan<MicrovmClusterStatus> {
    let mc = &obs.microvm_cluster;
    // Externally managed: someone else owns status; we must not touch the object.
    if mc.annotations().contains_key(MANAGED_BY_ANNOTATION) {
        return Plan {
            effects: Vec::new(),
            status: None,
            requeue: Requeue::Await,
        };
    }
    let generation = mc.metadata.generation;
    let mut status = mc.status.clone().unwrap_or_default();
    let mut effects = Vec::new();
    let set = |status: &mut MicrovmClusterStatus, t: &str, s: Status, r: &str, m: String| {
        conditions::set(&mut status.conditions, t, s, r, m, generation, now);
    };

    let paused = if mc.annotations().contains_key(PAUSED_ANNOTATION) {
        Some(format!("annotation {PAUSED_ANNOTATION} is set"))
    } else if obs.owner.as_ref().is_some_and(|c| c.is_paused()) {
        Some("Cluster spec.paused is set to true".to_string())
    } else {
        None
    };
    match &paused {
        Some(why) => set(
            &mut status,
            types::PAUSED,
            Status::True,
            reasons::PAUSED,
            why.clone(),
        ),
        None => set(
            &mut status,
            types::PAUSED,
            Status::False,
            reasons::NOT_PAUSED,
            String::new(),
        ),
    }

    let Some(owner) = &obs.owner else {
        set(
            &mut status,
            types::READY,
            Status::False,
            reasons::WAITING_FOR_OWNER,
            "waiting for a Cluster API Cluster to own this MicrovmCluster".into(),
        );
        return plan(mc, status, effects);
    };
    if paused.is_some() {
        return plan(mc, status, effects);
    }

    // Transport security: tokens without TLS travel in plaintext (flintlock allows it).
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
            "basic-auth tokens are sent to the hosts in plaintext; set tlsSecretRef".to_string(),
        ),
        (false, false) => (
            Status::False,
            "Plaintext",
            "hosts are reached without TLS or authentication".to_string(),
        ),
    };
    let was = conditions::reason(&status.conditions, HOST_TRANSPORT_SECURE).map(str::to_string);
    if reason == "BasicAuthWithoutTLS" && was.as_deref() != Some(reason) {
        effects.push(Effect::Event(Event {
            kind: EventKind::Warning,
            reason: events::INSECURE_TRANSPORT,
            action: "Reconcile",
            note: message.clone(),
        }));
    }
    set(&mut status, HOST_TRANSPORT_SECURE, secure, reason, message);

    if let Err(errors) = validation::validate_cluster(mc) {
        set(
            &mut status,
            types::READY,
            Status::False,
            reasons::INVALID_SPEC,
            errors.to_string(),
        );
        return plan(mc, status, effects);
    }
    let endpoint_known = owner
        .spec
        .control_plane_endpoint
        .as_ref()
        .is_some_and(|e| e.is_complete())
        || mc
            .spec
            .control_plane_endpoint
            .as_ref()
            .is_some_and(|e| e.is_complete());
    if !endpoint_known {
        set(
            &mut status,
            types::READY,
            Status::False,
            reasons::WAITING_FOR_CONTROL_PLANE_ENDPOINT,
            "set spec.controlPlaneEndpoint (host and port) on the Cluster or the MicrovmCluster"
                .into(),
        );
        return plan(mc, status, effects);
    }

    // Validation passed, so the pool exists.
    let hosts = mc
        .spec
        .placement
        .static_pool
        .as_ref()
        .map(|p| p.hosts.as_slice())
        .unwrap_or_default();
    let mut domains: BTreeMap<&str, bool> = BTreeMap::new();
    for host in hosts {
        *domains.entry(host.failure_domain_name()).or_insert(false) |= host.controlplane_allowed;
    }
    status.failure_domains = domains
        .into_iter()
        .map(|(name, control_plane)| FailureDomain {
            name: name.to_string(),
            control_plane: Some(control_plane),
            attributes: BTreeMap::new(),
        })
        .collect();
    status.initialization = Some(Initialization {
        provisioned: Some(true),
    });

    // Reachability summary.
    let mut reachable = 0;
    let mut unknown = 0;
    let mut unreachable = Vec::new();
    for host in hosts {
        let key = host
            .endpoint
            .parse::<HostEndpoint>()
            .map(|e| e.to_string())
            .unwrap_or_default();
        match obs.hosts.get(&key).map(|f| &f.reachability) {
            Some(Reachability::Reachable) => reachable += 1,
            Some(Reachability::Unreachable(why)) => {
                unreachable.push(format!(
                    "{} ({}): {why}",
                    host.display_name(),
                    host.endpoint
                ));
            }
            Some(Reachability::Unknown) | None => unknown += 1,
        }
    }
    let total = hosts.len();
    let summary = format!("{reachable} of {total} hosts reachable");
    if !unreachable.is_empty() {
        let message = format!("{summary}; unreachable: {}", unreachable.join("; "));
        set(
            &mut status,
            types::HOSTS_REACHABLE,
            Status::False,
            reasons::HOSTS_UNREACHABLE,
            message,
        );
    } else if unknown > 0 {
        set(
            &mut status,
            types::HOSTS_REACHABLE,
            Status::Unknown,
            reasons::HOSTS_NOT_OBSERVED,
            format!("{unknown} of {total} hosts not observed yet"),
        );
    } else {
        set(
            &mut status,
            types::HOSTS_REACHABLE,
            Status::True,
            reasons::HOSTS_REACHABLE,
            summary.clone(),
        );
    }
    if reachable == 0 && !unreachable.is_empty() && unknown == 0 {
        set(
            &mut status,
            types::READY,
            Status::False,
            reasons::HOSTS_UNREACHABLE,
            format!("no host is reachable: {}", unreachable.join("; ")),
        );
    } else {
        set(
            &mut status,
            types::READY,
            Status::True,
            reasons::READY,
            summary,
        );
    }
    plan(mc, status, effects)
}

fn plan(
    mc: &capmvm_api::MicrovmCluster,
    status: MicrovmClusterStatus,
    effects: Vec<Effect>,
) -> Plan<MicrovmClusterStatus> {
    // Never un-provision (CAPI contract: provisioned is one-shot).
    let mut status = status;
    if mc
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
    Plan {
        effects,
        status: Some(status),
        requeue: Requeue::Await,
    }
}
