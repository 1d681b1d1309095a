//! Table tests of the MicrovmMachine decision: every gate, placement rule, adoption and create (what
//! it reports is in `machine_status.rs`, its delete path in `machine_deletion.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use capmvm_api::VmState as ApiVmState;
use capmvm_api::conditions::reasons;
use capmvm_api::keys::{MACHINE_FINALIZER, PAUSED_ANNOTATION};
use capmvm_reconcile::cloudinit::machine_uid_from_metadata;
use capmvm_reconcile::*;
use kube::ResourceExt as _;
use support::*;

/// One gate: a change to the open observation, and the Ready reason and message fragment it must give.
struct Gate {
    name: &'static str,
    change: fn(&mut ObservedMachine),
    reason: &'static str,
    message: &'static str,
}

#[test]
fn each_waiting_gate_has_its_own_reason_and_no_host_effect() {
    let gates = [
        Gate {
            name: "no owner Machine",
            change: |o| o.owner = None,
            reason: reasons::WAITING_FOR_OWNER,
            message: "Cluster API Machine",
        },
        Gate {
            name: "no Cluster",
            change: |o| o.cluster = None,
            reason: reasons::WAITING_FOR_CLUSTER,
            message: "Cluster \"demo\" not found",
        },
        Gate {
            name: "paused by annotation",
            change: |o| {
                o.machine.metadata.annotations =
                    Some([(PAUSED_ANNOTATION.to_string(), String::new())].into());
            },
            reason: reasons::PAUSED,
            message: "annotation cluster.x-k8s.io/paused",
        },
        Gate {
            name: "paused by Cluster",
            change: |o| o.cluster.as_mut().unwrap().paused = true,
            reason: reasons::PAUSED,
            message: "Cluster spec.paused",
        },
        Gate {
            name: "infrastructure not provisioned",
            change: |o| o.cluster.as_mut().unwrap().infrastructure_provisioned = false,
            reason: reasons::WAITING_FOR_CLUSTER_INFRASTRUCTURE,
            message: "to be provisioned",
        },
        Gate {
            name: "MicrovmCluster missing",
            change: |o| o.infra_cluster = None,
            reason: reasons::WAITING_FOR_CLUSTER_INFRASTRUCTURE,
            message: "MicrovmCluster",
        },
        Gate {
            name: "invalid spec",
            change: |o| o.machine.spec.vcpu = 99,
            reason: reasons::INVALID_SPEC,
            message: "spec.vcpu: 99 is out of range",
        },
        Gate {
            name: "no bootstrap secret named",
            change: |o| o.owner.as_mut().unwrap().bootstrap_data_secret_name = None,
            reason: reasons::WAITING_FOR_BOOTSTRAP_DATA,
            message: "no bootstrap data secret yet",
        },
        Gate {
            name: "bootstrap secret missing",
            change: |o| o.bootstrap = BootstrapData::SecretNotFound,
            reason: reasons::WAITING_FOR_BOOTSTRAP_DATA,
            message: "\"m1-bootstrap\" not found",
        },
        Gate {
            name: "bootstrap secret without value",
            change: |o| {
                o.bootstrap = BootstrapData::Found {
                    value: None,
                    format: None,
                }
            },
            reason: reasons::WAITING_FOR_BOOTSTRAP_DATA,
            message: "no key \"value\"",
        },
        Gate {
            name: "ignition bootstrap data",
            change: |o| {
                o.bootstrap = BootstrapData::Found {
                    value: Some(Sensitive::new(b"{}".to_vec())),
                    format: Some("ignition".into()),
                }
            },
            reason: reasons::INVALID_BOOTSTRAP_FORMAT,
            message: "format \"ignition\"",
        },
        Gate {
            name: "no eligible host",
            change: |o| o.hosts.clear(),
            reason: reasons::NO_ELIGIBLE_HOST,
            message: "not observed yet",
        },
    ];
    for gate in gates {
        let mut obs = observed();
        (gate.change)(&mut obs);
        let plan = decide(&obs, now());
        let (status, reason, message) = ready(&plan);
        assert_eq!(status, "False", "{}", gate.name);
        assert_eq!(reason, gate.reason, "{}: {message}", gate.name);
        assert!(
            message.contains(gate.message),
            "{}: {message:?} lacks {:?}",
            gate.name,
            gate.message
        );
        assert_eq!(
            plan.host_calls.len(),
            0,
            "{}: no host call while a gate is closed",
            gate.name
        );
    }
}

#[test]
fn a_brand_new_machine_waits_on_capi_quietly_then_reports() {
    use capmvm_reconcile::machine::CAPI_SETTLE_GRACE;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let mut obs = observed();
    obs.machine.status = None;
    obs.machine.metadata.creation_timestamp = Some(Time(now()));
    obs.owner = None;
    // Just created, never reported on: nothing is written while CAPI assembles it.
    let plan = decide(&obs, now());
    assert_eq!(plan.status, None);
    assert!(plan.has_no_effects());
    assert_eq!(plan.requeue, Requeue::After(CAPI_SETTLE_GRACE));
    // Still waiting after the grace: the wait is reported with its reason.
    let later = k8s_openapi::jiff::Timestamp::from_second(now().as_second() + 11).unwrap();
    assert_eq!(ready(&decide(&obs, later)).1, reasons::WAITING_FOR_OWNER);
    // Actionable problems are reported at once, grace or not.
    obs.owner = Some((&owner()).into());
    obs.machine.spec.vcpu = 0;
    assert_eq!(ready(&decide(&obs, now())).1, reasons::INVALID_SPEC);
}

#[test]
fn invalid_spec_lists_every_field_error() {
    let mut obs = observed();
    obs.machine.spec.vcpu = 0;
    obs.machine.spec.network_interfaces[0].guest_mac = Some("zz".into());
    let (_, reason, message) = ready(&decide(&obs, now()));
    assert_eq!(reason, reasons::INVALID_SPEC);
    assert!(
        message.contains("spec.vcpu: 0 is out of range"),
        "{message}"
    );
    assert!(
        message.contains("spec.networkInterfaces[0].guestMac: \"zz\" is not a MAC address"),
        "{message}"
    );
    assert!(event_reasons(&decide(&obs, now())).contains(&"InvalidSpec"));
}

#[test]
fn finalizer_is_added_only_once_an_owner_exists() {
    let mut obs = observed();
    obs.machine.metadata.finalizers = None;
    obs.owner = None;
    assert!(!decide(&obs, now()).add_finalizer);
    obs.owner = Some((&owner()).into());
    // The finalizer rides in the plan's first write.
    assert!(decide(&obs, now()).add_finalizer);
}

#[test]
fn paused_keeps_a_ready_machine_ready_and_reports_paused() {
    let mut obs = observed();
    with_provider_id(&mut obs, HOSTS[0], "01A");
    obs.recorded_host = answered(vec![vm("01A", VmState::Created, true)]);
    let running = decide(&obs, now());
    assert_eq!(ready(&running).0, "True");
    obs.machine.status = running.status;
    obs.cluster.as_mut().unwrap().paused = true;
    let plan = decide(&obs, later());
    assert_eq!(
        ready(&plan).0,
        "True",
        "clusterctl move must not flip machines to not ready"
    );
    assert!(plan.has_no_effects());
    let paused = plan
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Paused")
        .unwrap();
    assert_eq!(
        (paused.status.as_str(), paused.reason.as_str()),
        ("True", "Paused")
    );
}

#[test]
fn a_new_machine_is_placed_recorded_and_created_in_one_plan() {
    let mut obs = observed();
    obs.machine.metadata.finalizers = None;
    let plan = decide(&obs, now());
    let created = creates(&plan);
    assert_eq!(created.len(), 1);
    let host: capmvm_api::HostEndpoint = created[0].0.parse().unwrap();
    assert!(
        plan.add_finalizer,
        "the finalizer comes with the first microVM"
    );
    assert!(
        plan.record_host
            == Some(HostRecord {
                host: host.clone(),
                origin_uid: MACHINE_UID.into(),
                attempt: 1,
                claim: format!("{} {OPERATOR}", now()),
            }),
        "the host is recorded with the create"
    );
    assert_eq!(
        plan.status, None,
        "the status is written by the adoption right after"
    );
    assert_eq!(
        plan.requeue,
        Requeue::Immediately,
        "adopt the created microVM right after"
    );
    assert_eq!(event_reasons(&plan), ["MicrovmCreated"]);

    // Adopting the created microVM: the providerID and one status write.
    let mut next = obs.clone();
    next.machine.metadata.finalizers = Some(vec![MACHINE_FINALIZER.to_string()]);
    with_recorded_host(&mut next, &created[0].0);
    next.recorded_host = answered(vec![vm("01A", VmState::Pending, true)]);
    let adopt = decide(&next, later());
    assert_eq!(
        adopt.provider_id,
        Some(format!("microvm://{}/01A", created[0].0))
    );
    assert!(
        !adopt.add_finalizer
            && adopt.record_host.is_none()
            && adopt.host_calls.is_empty()
            && adopt.events.is_empty()
            && !adopt.remove_finalizer,
        "only the providerID: {adopt:?}"
    );
    let status = adopt.status.as_ref().unwrap();
    assert_eq!(status.host.as_deref(), Some(created[0].0.as_str()));
    assert!(status.failure_domain.is_some());
    assert_eq!(status.vm_state, Some(ApiVmState::Pending));
    assert_eq!(ready(&adopt).1, reasons::MICROVM_PENDING);

    // The request is the Go provider's mapping.
    let spec = &created[0].1;
    assert_eq!(
        (spec.id.as_str(), spec.namespace.as_str()),
        ("m1", "default")
    );
    assert_eq!((spec.vcpu, spec.memory_mb), (2, 2048));
    assert_eq!(
        spec.labels.get("cluster-name").map(String::as_str),
        Some("demo")
    );
    assert!(
        obs.machine.spec.labels.is_empty(),
        "the object's labels are not mutated"
    );
    assert!(spec.kernel.add_network_config);
    assert_eq!(spec.kernel.filename.as_deref(), Some("boot/vmlinux"));
    let nic = &spec.interfaces[0];
    assert_eq!(
        nic.guest_mac.as_deref(),
        Some(capmvm_reconcile::microvm::derived_mac(MACHINE_UID, 0).as_str())
    );
    assert_eq!(
        nic.address.as_ref().unwrap().gateway.as_deref(),
        Some("10.0.0.1/24")
    );
    assert_eq!(
        capmvm_reconcile::cloudinit::machine_uid_from_metadata(&spec.metadata).as_deref(),
        Some(MACHINE_UID)
    );
    let shown = format!("{spec:?} {plan:?}");
    for key in ["user-data", "vendor-data", "meta-data"] {
        let value = &spec.metadata[key];
        assert!(
            !shown.contains(value.as_str()),
            "Debug never shows {key} (bootstrap data, keys)"
        );
    }
    assert!(!shown.contains("kubeadm"));
}

#[test]
fn every_create_is_preceded_by_a_conditional_record_of_the_host() {
    // A retried create on an already recorded host (the first create call failed, or the operator
    // crashed before it) re-records the same host and uid with one more placement attempt: the
    // operator writes that conditionally on the resourceVersion read, so a stale read (one missing a
    // providerID) never reaches the host, and the write always changes the object.
    let obs = placed_on(HOSTS[2], vec![]);
    let plan = decide(&obs, now());
    assert_eq!(
        plan.record_host,
        Some(HostRecord {
            host: HOSTS[2].parse().unwrap(),
            origin_uid: MACHINE_UID.into(),
            attempt: 1,
            claim: format!("{} {OPERATOR}", now()),
        }),
        "the host is re-recorded"
    );
    // The record is the plan's first step, the create its fourth: the order is in the type.
    assert_eq!(creates(&plan).len(), 1, "a create");
}

#[test]
fn adoption_skips_a_microvm_being_deleted() {
    let mut obs = placed_on(
        HOSTS[1],
        vec![
            vm("01A", VmState::Deleting, true),
            vm("01B", VmState::Pending, true),
        ],
    );
    let plan = decide(&obs, now());
    assert!(
        plan.provider_id
            .eq(&Some(format!("microvm://{}/01B", HOSTS[1]))),
        "{:?}",
        plan
    );
    assert!(creates(&plan).is_empty() && deletes(&plan).is_empty());

    // Only a dying one: wait for it to go, then create anew (never adopt it, never create beside it).
    obs.recorded_host = answered(vec![vm("01A", VmState::Deleting, true)]);
    let plan = decide(&obs, now());
    assert!(plan.host_calls.is_empty());
    assert!(plan.provider_id.is_none());
    let (_, reason, message) = ready(&plan);
    assert_eq!(reason, reasons::MICROVM_DELETING);
    assert!(message.contains("01A"), "{message}");
}

#[test]
fn an_invalid_spec_does_not_stop_adopting_an_existing_microvm() {
    // The spec was edited into an invalid one after the host was recorded and the microVM created.
    adopts_but_creates_nothing(
        VmState::Created,
        |obs| obs.machine.spec.vcpu = 0,
        reasons::INVALID_SPEC,
    );
}

/// With `blocker` applied to a machine placed on `HOSTS[1]`, its microVM there (in `state`) is
/// still adopted; with nothing to adopt, the blocker stops the create and Ready says `reason`.
#[track_caller]
fn adopts_but_creates_nothing(
    state: VmState,
    blocker: impl Fn(&mut ObservedMachine),
    reason: &str,
) {
    let mut obs = placed_on(HOSTS[1], vec![vm("01A", state, true)]);
    blocker(&mut obs);
    let plan = decide(&obs, now());
    assert_adopted(&plan, HOSTS[1], "01A");
    obs.recorded_host = answered(vec![]);
    let plan = decide(&obs, now());
    assert!(creates(&plan).is_empty());
    assert_eq!(ready(&plan).1, reason);
}

#[test]
fn an_empty_failure_domain_means_none() {
    let mut obs = observed();
    obs.owner.as_mut().unwrap().failure_domain = Some(String::new());
    assert_eq!(creates(&decide(&obs, now())).len(), 1);
}

#[test]
fn an_object_without_uid_creates_nothing() {
    let mut obs = observed();
    obs.machine.metadata.uid = None;
    let plan = decide(&obs, now());
    assert!(plan.host_calls.is_empty());
    let (_, reason, message) = ready(&plan);
    assert_eq!(reason, reasons::INVALID_SPEC);
    assert!(message.contains("metadata.uid"), "{message}");
}

#[test]
fn a_brand_new_machine_reports_pending_only_if_it_lasts() {
    // Adopting right after the create: the microVM is still starting and the machine is seconds old.
    let mut obs = observed();
    with_recorded_host(&mut obs, HOSTS[1]);
    obs.machine.metadata.creation_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
    obs.recorded_host = answered(vec![vm("01A", VmState::Pending, true)]);
    let soon = now()
        .checked_add(std::time::Duration::from_secs(3))
        .unwrap();
    let plan = decide(&obs, soon);
    assert!(
        plan.provider_id
            .eq(&Some(format!("microvm://{}/01A", HOSTS[1]))),
        "the providerID is written at once"
    );
    assert_eq!(plan.status, None, "a start within the grace is not written");
    assert_eq!(
        plan.requeue,
        Requeue::After(std::time::Duration::from_secs(7)),
        "look again when the grace ends"
    );
    // Still pending after the grace: reported.
    let late = now()
        .checked_add(std::time::Duration::from_secs(11))
        .unwrap();
    let plan = decide(&obs, late);
    assert_eq!(ready(&plan).1, reasons::MICROVM_PENDING);
    // Failed within the grace: reported at once.
    obs.recorded_host = answered(vec![vm("01A", VmState::Failed, true)]);
    assert_eq!(
        ready(&decide(&obs, soon)).1,
        reasons::MICROVM_PROVISION_FAILED
    );
}

#[test]
fn a_start_soon_after_placement_is_not_reported_pending() {
    // The machine is past its youth grace with nothing reported; this process placed it 4 s ago
    // and its microVM is starting.
    let mut obs = observed();
    with_recorded_host(&mut obs, HOSTS[1]);
    obs.machine.status = Some(Default::default());
    obs.machine.annotations_mut().insert(
        capmvm_api::keys::PLACEMENT_CLAIM_ANNOTATION.to_string(),
        format!("{} operator-a", now()),
    );
    obs.recorded_host = answered(vec![vm("01A", VmState::Pending, true)]);
    let at = |secs| {
        now()
            .checked_add(std::time::Duration::from_secs(secs))
            .unwrap()
    };
    let plan = decide(&obs, at(4));
    assert!(
        plan.provider_id.is_some(),
        "the providerID is written at once"
    );
    assert_eq!(
        plan.status, None,
        "a start soon after placement is not written"
    );
    assert_eq!(
        plan.requeue,
        Requeue::After(std::time::Duration::from_secs(6)),
        "look again when the start grace ends"
    );
    // Running within the grace: straight to Ready.
    obs.recorded_host = answered(vec![vm("01A", VmState::Created, true)]);
    assert_eq!(ready(&decide(&obs, at(8))).1, reasons::READY);
    // Still starting after the grace: reported.
    obs.recorded_host = answered(vec![vm("01A", VmState::Pending, true)]);
    assert_eq!(ready(&decide(&obs, at(11))).1, reasons::MICROVM_PENDING);
    // Failed within the grace: reported at once.
    obs.recorded_host = answered(vec![vm("01A", VmState::Failed, true)]);
    assert_eq!(
        ready(&decide(&obs, at(4))).1,
        reasons::MICROVM_PROVISION_FAILED
    );
    // A reported wait on CAPI (bootstrap data) ended with the create: it stands for the grace,
    // then gives way (a wait and Ready are the two status writes of a machine). Anything else on
    // Ready is corrected at once.
    obs.recorded_host = answered(vec![vm("01A", VmState::Pending, true)]);
    let reporting = |reason: &str| {
        let mut o = obs.clone();
        o.machine.status = Some(capmvm_api::MicrovmMachineStatus {
            conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: "Ready".into(),
                status: "False".into(),
                reason: reason.into(),
                message: "before the create".into(),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()),
                observed_generation: None,
            }],
            ..Default::default()
        });
        o
    };
    let plan = decide(&reporting(reasons::WAITING_FOR_BOOTSTRAP_DATA), at(4));
    assert_eq!(plan.status, None, "the wait stands for the grace");
    assert_eq!(
        ready(&decide(
            &reporting(reasons::WAITING_FOR_BOOTSTRAP_DATA),
            at(11)
        ))
        .1,
        reasons::MICROVM_PENDING
    );
    assert_eq!(
        ready(&decide(
            &reporting(reasons::MICROVM_PROVISION_FAILED),
            at(4)
        ))
        .1,
        reasons::MICROVM_PENDING,
        "an earlier failure is corrected at once"
    );
    // A microVM this provider did not place (no claim): its pending state is reported at once.
    obs.machine
        .annotations_mut()
        .remove(capmvm_api::keys::PLACEMENT_CLAIM_ANNOTATION);
    obs.recorded_host = answered(vec![vm("01A", VmState::Pending, true)]);
    assert_eq!(ready(&decide(&obs, at(4))).1, reasons::MICROVM_PENDING);
}

#[test]
fn a_provider_id_without_host_annotation_is_observed() {
    // Machines created by the Go provider carry only a providerID and its finalizer (tests/adoption.rs
    // has the rest of their story).
    let mut obs = observed();
    obs.machine.spec.provider_id = Some(format!("microvm://{}/01A", HOSTS[0]));
    obs.machine.metadata.finalizers = Some(vec![MACHINE_FINALIZER.to_string()]);
    assert_eq!(
        capmvm_reconcile::machine::recorded_host(&obs.machine).map(|h| h.to_string()),
        Some(HOSTS[0].to_string())
    );
    obs.recorded_host = answered(vec![vm("01A", VmState::Created, false)]);
    let plan = decide(&obs, now());
    assert_eq!(ready(&plan).1, reasons::READY);
    assert!(plan.host_calls.is_empty());
    // Deleting it deletes that microVM (it carries no uid of ours) and no other.
    deleting(&mut obs);
    obs.recorded_host = answered(vec![
        vm("01A", VmState::Created, false),
        vm("01B", VmState::Created, false),
    ]);
    assert_eq!(
        deletes(&decide(&obs, now())),
        [(HOSTS[0].to_string(), "01A".to_string())]
    );
}

#[test]
fn placement_honours_failure_domain_control_plane_and_load() {
    // Control-plane machine in r1: host-b refuses control planes, so host-a even though it is busier.
    let mut obs = observed();
    obs.owner = Some((&control_plane_owner()).into());
    obs.owner.as_mut().unwrap().failure_domain = Some("r1".into());
    obs.hosts.get_mut(HOSTS[0]).unwrap().allocated_vcpu = 30;
    assert_eq!(creates(&decide(&obs, now()))[0].0, HOSTS[0]);
    // A worker goes to the least allocated host.
    let mut obs = observed();
    obs.hosts.get_mut(HOSTS[0]).unwrap().allocated_memory_mb = 8192;
    obs.hosts.get_mut(HOSTS[2]).unwrap().allocated_memory_mb = 4096;
    assert_eq!(creates(&decide(&obs, now()))[0].0, HOSTS[1]);
    // Unreachable hosts are skipped.
    let mut obs = observed();
    obs.hosts.get_mut(HOSTS[1]).unwrap().reachability = Reachability::Unreachable("refused".into());
    obs.hosts.get_mut(HOSTS[2]).unwrap().reachability = Reachability::Unreachable("refused".into());
    assert_eq!(creates(&decide(&obs, now()))[0].0, HOSTS[0]);
    // A failure domain with no usable host waits, naming why.
    let mut obs = observed();
    obs.owner = Some((&control_plane_owner()).into());
    obs.owner.as_mut().unwrap().failure_domain = Some("r1".into());
    obs.hosts.get_mut(HOSTS[0]).unwrap().reachability = Reachability::Unreachable("refused".into());
    let plan = decide(&obs, now());
    let (_, reason, message) = ready(&plan);
    assert_eq!(reason, reasons::NO_ELIGIBLE_HOST);
    assert!(
        message.contains("host-a: unreachable")
            && message.contains("host-b: control planes not allowed"),
        "{message}"
    );
    assert!(creates(&plan).is_empty());
}

#[test]
fn a_recorded_machine_adopts_its_microvm_instead_of_creating() {
    let obs = placed_on(
        HOSTS[1],
        vec![
            vm("01B", VmState::Pending, true),
            vm("01A", VmState::Created, true),
            vm("01C", VmState::Created, false), // same name, someone else's: left alone
        ],
    );
    let plan = decide(&obs, now());
    assert!(creates(&plan).is_empty());
    assert_adopted(&plan, HOSTS[1], "01A");
    assert_eq!(
        deletes(&plan),
        [(HOSTS[1].to_string(), "01B".to_string())],
        "the newer duplicate goes"
    );
    assert!(event_reasons(&plan).contains(&"DuplicateMicrovm"));
    assert_eq!(ready(&plan).0, "True");
}

#[test]
fn a_moved_machine_adopts_the_microvm_carrying_its_origin_uid() {
    // Moved between its create and its providerID write: a new uid, the annotations kept.
    let mut obs = observed();
    with_recorded_host(&mut obs, HOSTS[1]);
    moved(&mut obs);
    obs.recorded_host = answered(vec![vm("01A", VmState::Created, true)]);
    let plan = decide(&obs, now());
    assert!(creates(&plan).is_empty(), "no second microVM");
    assert_adopted(&plan, HOSTS[1], "01A");
    assert_eq!(ready(&plan).0, "True");
}

#[test]
fn a_moved_machine_with_nothing_on_its_host_creates_under_its_origin_uid() {
    let mut obs = observed();
    with_recorded_host(&mut obs, HOSTS[1]);
    moved(&mut obs);
    obs.recorded_host = answered(vec![]);
    let plan = decide(&obs, now());
    let created = creates(&plan);
    assert_eq!(created.len(), 1);
    let spec = &created[0].1;
    assert_eq!(
        machine_uid_from_metadata(&spec.metadata).as_deref(),
        Some(MACHINE_UID),
        "a crash after this create still ends in adoption"
    );
    assert_eq!(
        plan.record_host,
        Some(HostRecord {
            host: HOSTS[1].parse().unwrap(),
            origin_uid: MACHINE_UID.into(),
            attempt: 1,
            claim: format!("{} {OPERATOR}", now()),
        }),
        "the recorded host and origin uid are kept (re-asserted, not changed)"
    );
}

#[test]
fn without_an_origin_uid_annotation_the_object_uid_identifies_the_microvm() {
    // Machines placed before the annotation existed.
    let mut obs = observed();
    with_recorded_host(&mut obs, HOSTS[1]);
    obs.machine
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .remove(capmvm_api::keys::ORIGIN_UID_ANNOTATION);
    obs.recorded_host = answered(vec![vm("01A", VmState::Created, true)]);
    let plan = decide(&obs, now());
    assert!(creates(&plan).is_empty());
    assert_adopted(&plan, HOSTS[1], "01A");
}

#[test]
fn adoption_needs_no_bootstrap_data() {
    // Right after a create (or after a crash), the microVM is adopted without reading the Secret
    // again. Creating, however, waits for it.
    adopts_but_creates_nothing(
        VmState::Pending,
        |obs| obs.bootstrap = BootstrapData::NotAsked,
        reasons::WAITING_FOR_BOOTSTRAP_DATA,
    );
}

#[test]
fn a_recorded_machine_with_nothing_on_its_host_creates_there() {
    let mut obs = observed();
    with_recorded_host(&mut obs, HOSTS[2]);
    obs.hosts.get_mut(HOSTS[2]).unwrap().allocated_vcpu = 60; // busiest, but recorded: no re-placement
    obs.recorded_host = answered(vec![]);
    let plan = decide(&obs, now());
    assert_eq!(creates(&plan)[0].0, HOSTS[2]);
}

#[test]
fn a_recorded_machine_waits_for_an_unreachable_or_unasked_host() {
    let mut obs = observed();
    with_recorded_host(&mut obs, HOSTS[0]);
    obs.recorded_host = HostLookup::Unreachable("connection refused".into());
    let plan = decide(&obs, now());
    assert_eq!(ready(&plan).1, reasons::HOST_UNREACHABLE);
    assert!(plan.host_calls.is_empty());
    obs.recorded_host = HostLookup::NotAsked;
    let plan = decide(&obs, now());
    assert!(plan.host_calls.is_empty());
    assert!(matches!(plan.requeue, Requeue::After(_)));
}

#[test]
fn missing_credentials_is_a_condition_not_a_call() {
    let mut obs = placed_on(HOSTS[0], vec![]);
    obs.hosts.get_mut(HOSTS[0]).unwrap().credentials_problem =
        Some("Secret \"tokens\" not found".into());
    let plan = decide(&obs, now());
    let (_, reason, message) = ready(&plan);
    assert_eq!(reason, reasons::MISSING_CREDENTIALS);
    assert!(message.contains("Secret \"tokens\" not found"));
    assert!(creates(&plan).is_empty());
}

#[test]
fn hosts_held_back_only_by_credentials_give_missing_credentials() {
    let mut obs = observed();
    for facts in obs.hosts.values_mut() {
        facts.credentials_problem = Some("basic-auth Secret \"tokens\" not found".into());
    }
    let plan = decide(&obs, now());
    let (_, reason, message) = ready(&plan);
    assert_eq!(reason, reasons::MISSING_CREDENTIALS);
    assert!(message.contains("Secret \"tokens\" not found"), "{message}");
    assert!(
        matches!(plan.requeue, Requeue::After(_)),
        "Secrets are not watched: retry"
    );
    // One host merely unreachable: that is not a credentials problem alone.
    obs.hosts.get_mut(HOSTS[0]).unwrap().credentials_problem = None;
    obs.hosts.get_mut(HOSTS[0]).unwrap().reachability = Reachability::Unreachable("refused".into());
    assert_eq!(ready(&decide(&obs, now())).1, reasons::NO_ELIGIBLE_HOST);
}

#[test]
fn missing_credentials_hold_every_path_that_calls_the_host() {
    let problem = "basic-auth Secret \"tokens\" has no key \"10.0.0.1\"";
    // Observing an existing microVM, and deleting it.
    for delete in [false, true] {
        let mut obs = observed();
        with_provider_id(&mut obs, HOSTS[0], "01A");
        if delete {
            deleting(&mut obs);
        }
        obs.recorded_host = HostLookup::Unreachable(problem.into());
        obs.hosts.get_mut(HOSTS[0]).unwrap().credentials_problem = Some(problem.into());
        let plan = decide(&obs, now());
        let (_, reason, message) = ready(&plan);
        assert_eq!(reason, reasons::MISSING_CREDENTIALS, "delete={delete}");
        assert!(message.contains(problem), "{message}");
        assert!(!plan.remove_finalizer, "the finalizer stays");
    }
}

#[test]
fn conditions_carry_generation_and_stable_transition_times() {
    let mut obs = observed();
    obs.machine.metadata.generation = Some(4);
    obs.hosts.clear();
    let first = decide(&obs, now());
    obs.machine.status = first.status.clone();
    let second = decide(&obs, later());
    assert_eq!(
        first.status, second.status,
        "same observation, same status, whatever the time"
    );
    let ready = second
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.observed_generation, Some(4));
    assert_eq!(ready.last_transition_time.0, now());
}

#[test]
fn helpers_tell_the_operator_what_to_gather() {
    use capmvm_reconcile::machine::{recorded_host, wants_bootstrap_data, wants_fresh_lookup};
    let mut obs = observed();
    assert_eq!(recorded_host(&obs.machine), None);
    assert!(wants_fresh_lookup(&obs.machine));
    assert_eq!(wants_bootstrap_data(&obs), Some("m1-bootstrap"));
    with_provider_id(&mut obs, HOSTS[2], "01A");
    assert_eq!(recorded_host(&obs.machine).unwrap().to_string(), HOSTS[2]);
    assert!(!wants_fresh_lookup(&obs.machine));
    assert_eq!(wants_bootstrap_data(&obs), None);
    assert!(
        obs.machine
            .finalizers()
            .contains(&MACHINE_FINALIZER.to_string())
    );
}

/// The whole pool's facts are gathered only when the decision may place the machine: a machine still
/// waiting for its owner, its Cluster or a pause to lift, or one already placed, needs none.
#[test]
fn pool_facts_are_wanted_only_when_the_machine_may_be_placed() {
    use capmvm_reconcile::machine::wants_pool_facts;
    type Case = (&'static str, fn(&mut ObservedMachine), bool);
    let cases: [Case; 6] = [
        ("gates open, no host recorded", |_| {}, true),
        ("no owner yet", |o| o.owner = None, false),
        ("no Cluster", |o| o.cluster = None, false),
        ("no MicrovmCluster", |o| o.infra_cluster = None, false),
        (
            "paused",
            |o| {
                o.machine
                    .annotations_mut()
                    .insert("cluster.x-k8s.io/paused".into(), String::new());
            },
            false,
        ),
        ("host recorded", |o| with_recorded_host(o, HOSTS[1]), false),
    ];
    for (case, change, wanted) in cases {
        let mut obs = observed();
        obs.hosts.clear();
        change(&mut obs);
        assert_eq!(wants_pool_facts(&obs), wanted, "{case}");
    }
    // What the decision does without them when it may not place: the same as with them.
    let mut waiting = observed();
    waiting.owner = None;
    let with_hosts = decide(&waiting, now());
    waiting.hosts.clear();
    assert_eq!(decide(&waiting, now()), with_hosts);
}
