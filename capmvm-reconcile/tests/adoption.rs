//! Adoption of the Go provider's machines and clusters, as they read after a move: table tests.
//!
//! The machines are built the way they reach the engine: a v1alpha1 object as the Go provider
//! stores it (providerID `microvm://<host endpoint>/<uid>`, `status.ready`, its finalizer, its own
//! conditions, `cluster-name` added to `spec.labels`), converted to v1alpha2 by `capmvm_api`'s
//! conversion. Their microVMs carry none of our meta-data (no `capmvm_machine_uid`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use capmvm_api::conditions::reasons;
use capmvm_api::conversion::{cluster_to_v1alpha2, machine_to_v1alpha2};
use capmvm_api::keys::{
    ABANDON_MICROVM_ANNOTATION, CLUSTER_FINALIZER, HOST_ANNOTATION, MACHINE_FINALIZER,
};
use capmvm_api::v1alpha1;
use capmvm_reconcile::machine::{Provenance, provenance};
use capmvm_reconcile::*;
use serde_json::json;
use support::*;

const GO_UID: &str = "01KE75BHT9H6D7V5YG0KYGRXX2";
/// The Go provider's providerID for a microVM on `HOSTS[1]` (failure domain = endpoint).
const GO_PROVIDER_ID: &str = "microvm://10.0.0.2:9090/01KE75BHT9H6D7V5YG0KYGRXX2";

/// `m1` as the Go provider left it, read at v1alpha2.
fn go_machine(provider_id: Option<&str>) -> capmvm_api::MicrovmMachine {
    let mut object = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "MicrovmMachine",
        "metadata": {
            "name": "m1", "namespace": "default", "uid": MACHINE_UID, "generation": 2,
            "labels": {"cluster.x-k8s.io/cluster-name": "demo"},
            "finalizers": [MACHINE_FINALIZER],
        },
        "spec": {
            "vcpu": 2, "memoryMb": 2048,
            "rootVolume": {"id": "root", "image": "ghcr.io/liquidmetal-dev/capmvm-kubernetes:1.23.5"},
            "kernel": {"image": "ghcr.io/liquidmetal-dev/kernel-bin:5.10.77", "filename": "boot/vmlinux"},
            "networkInterfaces": [{"guestDeviceName": "eth1", "type": "tap", "address": "10.0.0.50/24"}],
            "labels": {"cluster-name": "demo"},
        },
        "status": {"ready": true, "vmState": "running", "conditions": [
            {"type": "MicrovmReady", "status": "True", "lastTransitionTime": "2026-03-01T10:00:00Z"},
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-03-01T10:00:00Z"},
        ]},
    });
    match provider_id {
        Some(id) => object["spec"]["providerID"] = json!(id),
        None => {
            object["status"] = json!({"ready": false, "conditions": [{
                "type": "MicrovmReady", "status": "False", "severity": "Info",
                "reason": "MicrovmPending", "lastTransitionTime": "2026-03-01T10:00:00Z",
            }]});
        }
    }
    let old: v1alpha1::MicrovmMachine = serde_json::from_value(object).unwrap();
    machine_to_v1alpha2(&old).unwrap()
}

fn go_observed(provider_id: Option<&str>) -> ObservedMachine {
    let mut obs = observed();
    obs.machine = go_machine(provider_id);
    obs
}

/// The Go provider's microVM: same name and namespace, no uid of ours in its meta-data.
fn go_vm(uid: &str, state: VmState) -> ObservedVm {
    vm(uid, state, false)
}

fn adoption_hosts(plan: &MachinePlan) -> Vec<String> {
    plan.record_adoption
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// One row: an observation, and what the plan must do.
struct Row {
    name: &'static str,
    obs: fn() -> ObservedMachine,
    /// Ready's status and reason.
    ready: (&'static str, &'static str),
    /// The host recorded as adopted, if any.
    adopted: Option<&'static str>,
    /// Event reasons, in order.
    events: &'static [&'static str],
    /// (host, uid) deleted.
    deletes: &'static [(&'static str, &'static str)],
}

#[test]
fn go_provider_machines_are_adopted_as_they_are() {
    let rows = [
        Row {
            name: "running microVM found on its host",
            obs: || {
                let mut o = go_observed(Some(GO_PROVIDER_ID));
                o.recorded_host = answered(vec![go_vm(GO_UID, VmState::Created)]);
                o
            },
            ready: ("True", reasons::READY),
            adopted: Some("10.0.0.2:9090"),
            events: &[plan::reasons::MICROVM_ADOPTED],
            deletes: &[],
        },
        Row {
            name: "microVM still pending",
            obs: || {
                let mut o = go_observed(Some(GO_PROVIDER_ID));
                o.machine.status = None;
                o.machine.metadata.creation_timestamp = None;
                o.recorded_host = answered(vec![go_vm(GO_UID, VmState::Pending)]);
                o
            },
            ready: ("False", reasons::MICROVM_PENDING),
            adopted: Some("10.0.0.2:9090"),
            events: &[plan::reasons::MICROVM_ADOPTED],
            deletes: &[],
        },
        Row {
            name: "a second Go microVM of the same name (its create-then-crash duplicate) is left alone",
            obs: || {
                let mut o = go_observed(Some(GO_PROVIDER_ID));
                o.recorded_host = answered(vec![
                    go_vm(GO_UID, VmState::Created),
                    go_vm("01KE75BHT9H6D7V5YG0KYGRXX9", VmState::Created),
                ]);
                o
            },
            ready: ("True", reasons::READY),
            adopted: Some("10.0.0.2:9090"),
            events: &[plan::reasons::MICROVM_ADOPTED],
            deletes: &[],
        },
        Row {
            name: "host unreachable: nothing recorded yet",
            obs: || {
                let mut o = go_observed(Some(GO_PROVIDER_ID));
                o.recorded_host = HostLookup::Unreachable("connection refused".into());
                o
            },
            ready: ("False", reasons::HOST_UNREACHABLE),
            adopted: None,
            events: &[plan::reasons::HOST_UNREACHABLE],
            deletes: &[],
        },
        Row {
            name: "microVM gone from its host: reported, not re-created",
            obs: || {
                let mut o = go_observed(Some(GO_PROVIDER_ID));
                o.recorded_host = answered(vec![]);
                o
            },
            ready: ("False", reasons::MICROVM_NOT_FOUND),
            adopted: None,
            events: &[plan::reasons::MICROVM_NOT_FOUND],
            deletes: &[],
        },
        Row {
            name: "adopted before: no second record, no second event",
            obs: || {
                let mut o = go_observed(Some(GO_PROVIDER_ID));
                o.machine
                    .metadata
                    .annotations
                    .get_or_insert_default()
                    .insert(HOST_ANNOTATION.into(), "10.0.0.2:9090".into());
                o.recorded_host = answered(vec![go_vm(GO_UID, VmState::Created)]);
                o
            },
            ready: ("True", reasons::READY),
            adopted: None,
            events: &[],
            deletes: &[],
        },
        Row {
            name: "deleted before adoption: its microVM is deleted by the providerID",
            obs: || {
                let mut o = go_observed(Some(GO_PROVIDER_ID));
                deleting(&mut o);
                o.recorded_host = answered(vec![go_vm(GO_UID, VmState::Created)]);
                o
            },
            ready: ("False", reasons::DELETING),
            adopted: None,
            events: &[plan::reasons::MICROVM_DELETING],
            deletes: &[("10.0.0.2:9090", GO_UID)],
        },
    ];
    for row in rows {
        let obs = (row.obs)();
        let plan = decide(&obs, now());
        let (status, reason, message) = ready(&plan);
        assert_eq!(
            (status.as_str(), reason.as_str()),
            row.ready,
            "{}: {message}",
            row.name
        );
        let want: Vec<String> = row.adopted.iter().map(|h| h.to_string()).collect();
        assert_eq!(adoption_hosts(&plan), want, "{}", row.name);
        assert_eq!(event_reasons(&plan), row.events, "{}", row.name);
        let want: Vec<(String, String)> = row
            .deletes
            .iter()
            .map(|(h, u)| (h.to_string(), u.to_string()))
            .collect();
        assert_eq!(deletes(&plan), want, "{}", row.name);
        assert!(creates(&plan).is_empty(), "{}: never a create", row.name);
        assert!(
            plan.provider_id.is_none(),
            "{}: the providerID is never rewritten",
            row.name
        );
        // The Go provider's own condition is not carried on: nothing updates it now.
        let status = plan.status.as_ref().unwrap();
        assert!(
            !status.conditions.iter().any(|c| c.type_ == "MicrovmReady"),
            "{}: {:?}",
            row.name,
            status.conditions
        );
    }
}

/// A running adopted machine's status: the host and failure domain the Go provider's naming gives
/// (the endpoint), provisioned, the providerID's uid followed.
#[test]
fn an_adopted_machine_reports_like_one_of_ours() {
    let mut obs = go_observed(Some(GO_PROVIDER_ID));
    obs.recorded_host = answered(vec![go_vm(GO_UID, VmState::Created)]);
    // The Go provider's cluster: named hosts, each its own failure domain by endpoint.
    let go_cluster: v1alpha1::MicrovmCluster = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "MicrovmCluster",
        "metadata": {"name": "demo", "namespace": "default"},
        "spec": {"controlPlaneEndpoint": {"host": "10.0.0.100", "port": 6443},
                 "placement": {"staticPool": {"hosts": HOSTS.iter().enumerate().map(|(i, h)| json!({
                     "name": format!("host-{i}"), "endpoint": h, "controlplaneAllowed": true,
                 })).collect::<Vec<_>>()}}},
    }))
    .unwrap();
    obs.infra_cluster = Some(std::sync::Arc::new(
        cluster_to_v1alpha2(&go_cluster).unwrap(),
    ));
    let plan = decide(&obs, now());
    let status = plan.status.unwrap();
    assert_eq!(status.host.as_deref(), Some("10.0.0.2:9090"));
    assert_eq!(status.failure_domain.as_deref(), Some("10.0.0.2:9090"));
    assert_eq!(status.vm_state, Some(capmvm_api::VmState::Running));
    assert_eq!(
        status.initialization.and_then(|i| i.provisioned),
        Some(true)
    );
    // Recorded in the first write (the metadata write, step 1 of the plan).
    assert_eq!(plan.record_adoption, Some("10.0.0.2:9090".parse().unwrap()));
}

/// A providerID the Go provider wrote from an endpoint in another spelling (a leading zero in the
/// port) is kept byte for byte; the host is called at the endpoint it means.
#[test]
fn an_unusual_spelling_of_the_endpoint_is_kept() {
    let mut obs = go_observed(Some("microvm://10.0.0.2:09090/01KE75BHT9H6D7V5YG0KYGRXX2"));
    obs.recorded_host = answered(vec![go_vm(GO_UID, VmState::Created)]);
    let plan = decide(&obs, now());
    assert_eq!(adoption_hosts(&plan), ["10.0.0.2:9090"]);
    assert_eq!(ready(&plan).0, "True");
    assert!(plan.provider_id.is_none());
}

/// The Go provider stopped between adding its finalizer and writing a providerID: a microVM it may
/// have made is unrecognisable, so nothing is created or released until a person decides.
#[test]
fn an_unfinished_go_provider_machine_waits_for_a_person() {
    let obs = go_observed(None);
    assert_eq!(provenance(&obs.machine), Provenance::Unfinished);
    let plan = decide(&obs, now());
    let message = expect_condition(
        ready(&plan),
        ("False", reasons::UNFINISHED_BY_PREVIOUS_PROVIDER),
    );
    assert!(message.contains("default/m1"), "{message}");
    assert!(message.contains("spec.providerID"), "{message}");
    assert!(plan.host_calls.is_empty());
    assert!(plan.record_host.is_none(), "not even placed");
    assert_eq!(
        event_reasons(&plan),
        [plan::reasons::UNFINISHED_BY_PREVIOUS_PROVIDER]
    );
    assert!(!machine::wants_pool_facts(&obs));

    // The person found no microVM and removed the finalizer: the machine is created as ours.
    let mut cleared = go_observed(None);
    cleared.machine.metadata.finalizers = None;
    assert_eq!(provenance(&cleared.machine), Provenance::Ours);
    let plan = decide(&cleared, now());
    assert_eq!(creates(&plan).len(), 1, "{:?}", ready(&plan));

    // The person found it and set the providerID: adopted.
    let mut found = go_observed(Some(GO_PROVIDER_ID));
    found.recorded_host = answered(vec![go_vm(GO_UID, VmState::Created)]);
    assert_eq!(provenance(&found.machine), Provenance::Adopted);
    assert_eq!(adoption_hosts(&decide(&found, now())), ["10.0.0.2:9090"]);
}

#[test]
fn an_unfinished_go_provider_machine_is_released_only_when_abandoned() {
    let mut obs = go_observed(None);
    deleting(&mut obs);
    let plan = decide(&obs, now());
    assert!(!plan.remove_finalizer);
    let (_, reason, message) = ready(&plan);
    assert_eq!(reason, reasons::UNFINISHED_BY_PREVIOUS_PROVIDER);
    assert!(message.contains(ABANDON_MICROVM_ANNOTATION), "{message}");

    obs.machine
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(ABANDON_MICROVM_ANNOTATION.into(), "true".into());
    let plan = decide(&obs, now());
    assert!(plan.remove_finalizer);
    assert_eq!(event_reasons(&plan), [plan::reasons::MICROVM_ABANDONED]);
}

/// Our own machines never read as another provider's, at any step of their life.
#[test]
fn our_machines_are_ours() {
    let fresh = observed();
    assert_eq!(provenance(&fresh.machine), Provenance::Ours);
    let mut placed = observed();
    with_recorded_host(&mut placed, HOSTS[0]);
    assert_eq!(provenance(&placed.machine), Provenance::Ours);
    let mut provisioned = observed();
    with_provider_id(&mut provisioned, HOSTS[0], GO_UID);
    assert_eq!(provenance(&provisioned.machine), Provenance::Ours);
    // A new clone without finalizer (CAPI made it, nobody placed it).
    let mut clone = observed();
    clone.machine.metadata.finalizers = None;
    assert_eq!(provenance(&clone.machine), Provenance::Ours);
}

/// The Go provider's MicrovmCluster: gets our finalizer, keeps its failure domains (host endpoints),
/// stays provisioned, and loses the Go provider's LoadBalancerAvailable condition.
#[test]
fn a_go_provider_cluster_is_taken_over() {
    let go_cluster: v1alpha1::MicrovmCluster = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "MicrovmCluster",
        "metadata": {"name": "demo", "namespace": "default", "generation": 1},
        "spec": {"controlPlaneEndpoint": {"host": "10.0.0.100", "port": 6443},
                 "placement": {"staticPool": {"hosts": [
                     {"name": "a", "endpoint": HOSTS[0], "controlplaneAllowed": true},
                     {"endpoint": HOSTS[1], "controlplaneAllowed": false},
                 ]}}},
        "status": {"ready": true,
                   "failureDomains": {HOSTS[0]: {"controlPlane": true}, HOSTS[1]: {}},
                   "conditions": [
                       {"type": "LoadBalancerAvailable", "status": "True", "lastTransitionTime": "2026-03-01T10:00:00Z"},
                       {"type": "Ready", "status": "True", "lastTransitionTime": "2026-03-01T10:00:00Z"},
                   ]},
    }))
    .unwrap();
    let mut obs = observed_cluster();
    obs.microvm_cluster = cluster_to_v1alpha2(&go_cluster).unwrap();
    let plan = decide_cluster(&obs, now());
    assert!(plan.add_finalizer, "{plan:?}");
    assert_eq!(
        CLUSTER_FINALIZER,
        "microvmcluster.infrastructure.cluster.x-k8s.io"
    );
    let status = plan.status.unwrap();
    let domains: Vec<(&str, Option<bool>)> = status
        .failure_domains
        .iter()
        .map(|f| (f.name.as_str(), f.control_plane))
        .collect();
    assert_eq!(
        domains,
        [(HOSTS[0], Some(true)), (HOSTS[1], Some(false))],
        "the Machines' failure domains are still valid"
    );
    assert_eq!(
        status.initialization.and_then(|i| i.provisioned),
        Some(true)
    );
    assert!(
        !status
            .conditions
            .iter()
            .any(|c| c.type_ == "LoadBalancerAvailable"),
        "{:?}",
        status.conditions
    );
}
