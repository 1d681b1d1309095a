//! Table tests of the MicrovmMachine decision's delete path: the microVM first, the finalizer last.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use capmvm_api::conditions::reasons;
use capmvm_api::keys::{ABANDON_MICROVM_ANNOTATION, MACHINE_FINALIZER, PAUSED_ANNOTATION};
use capmvm_reconcile::*;
use kube::ResourceExt as _;
use support::*;

#[test]
fn deletion_deletes_the_vm_then_waits_then_releases() {
    let mut obs = observed();
    with_provider_id(&mut obs, HOSTS[0], "01A");
    deleting(&mut obs);
    obs.recorded_host = answered(vec![vm("01A", VmState::Created, true)]);
    let plan = decide(&obs, now());
    assert_eq!(deletes(&plan), [(HOSTS[0].to_string(), "01A".to_string())]);
    assert!(!plan.remove_finalizer);
    assert_eq!(ready(&plan).1, reasons::DELETING);

    obs.recorded_host = answered(vec![vm("01A", VmState::Deleting, true)]);
    let plan = decide(&obs, now());
    assert!(deletes(&plan).is_empty(), "no second delete while DELETING");
    assert!(
        !plan.remove_finalizer,
        "the finalizer stays until the VM is gone"
    );

    obs.recorded_host = answered(vec![]);
    let plan = decide(&obs, now());
    assert!(plan.remove_finalizer);
    assert!(plan.host_calls.is_empty());
    assert_eq!(event_reasons(&plan), ["MicrovmDeleted"]);
}

#[test]
fn deletion_of_a_never_placed_machine_holds_nothing_up() {
    // The finalizer comes with the host: a machine never placed has none, and goes at once.
    let mut obs = observed();
    deleting(&mut obs);
    obs.owner = None;
    obs.cluster = None;
    let plan = decide(&obs, now());
    assert!(plan.has_no_effects(), "{plan:?}");
    assert!(
        !obs.machine
            .finalizers()
            .contains(&MACHINE_FINALIZER.to_string())
    );
}

#[test]
fn deletion_of_a_placed_machine_without_provider_id_deletes_what_carries_its_uid() {
    let mut obs = observed();
    with_recorded_host(&mut obs, HOSTS[1]);
    deleting(&mut obs);
    obs.recorded_host = answered(vec![
        vm("01A", VmState::Pending, true),
        vm("01Z", VmState::Created, false),
    ]);
    let plan = decide(&obs, now());
    assert_eq!(
        deletes(&plan),
        [(HOSTS[1].to_string(), "01A".to_string())],
        "only ours"
    );
}

#[test]
fn deletion_of_a_moved_machine_without_provider_id_deletes_what_carries_its_origin_uid() {
    let mut obs = observed();
    with_recorded_host(&mut obs, HOSTS[1]);
    moved(&mut obs);
    deleting(&mut obs);
    obs.recorded_host = answered(vec![vm("01A", VmState::Created, true)]);
    let plan = decide(&obs, now());
    assert_eq!(deletes(&plan), [(HOSTS[1].to_string(), "01A".to_string())]);
    assert!(
        !plan.remove_finalizer,
        "the finalizer stays until the microVM is gone"
    );
}

#[test]
fn deletion_keeps_the_finalizer_while_the_host_is_unreachable() {
    let mut obs = observed();
    with_provider_id(&mut obs, HOSTS[0], "01A");
    deleting(&mut obs);
    obs.recorded_host = HostLookup::Unreachable("connection refused".into());
    let plan = decide(&obs, now());
    let (_, reason, message) = ready(&plan);
    assert_eq!(reason, reasons::HOST_UNREACHABLE);
    assert!(
        message.contains(HOSTS[0]) && message.contains(ABANDON_MICROVM_ANNOTATION),
        "{message}"
    );
    assert!(!plan.remove_finalizer);
    assert!(plan.host_calls.is_empty());
}

#[test]
fn a_failed_delete_call_gives_the_same_advice_as_an_unreachable_host() {
    let mut obs = observed();
    with_provider_id(&mut obs, HOSTS[0], "01A");
    deleting(&mut obs);
    let mut status = obs.machine.status.clone().unwrap();
    let failure = format!("host {}: unavailable: connection refused", HOSTS[0]);
    let verdict = capmvm_reconcile::machine::record_host_call_failure(
        &obs.machine,
        &mut status,
        &HostCall::Delete {
            host: HOSTS[0].parse().unwrap(),
            uid: "01A".into(),
        },
        capmvm_reconcile::machine::HostCallFailure::Unreachable,
        &failure,
        now(),
    );
    assert!(verdict.retry_with_backoff);
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.reason, reasons::HOST_UNREACHABLE);
    assert!(
        ready.message.contains(&failure) && ready.message.contains(ABANDON_MICROVM_ANNOTATION),
        "{}",
        ready.message
    );
}

#[test]
fn the_abandon_annotation_releases_with_a_warning() {
    let mut obs = observed();
    with_provider_id(&mut obs, HOSTS[0], "01A");
    deleting(&mut obs);
    obs.recorded_host = HostLookup::Unreachable("no route to host".into());
    obs.machine.metadata.annotations =
        Some([(ABANDON_MICROVM_ANNOTATION.to_string(), "true".to_string())].into());
    let plan = decide(&obs, now());
    assert!(plan.remove_finalizer);
    let ev = plan.events.first().unwrap();
    assert_eq!(
        (ev.kind, ev.reason),
        (EventKind::Warning, "MicrovmAbandoned")
    );
    assert!(ev.note.contains("01A") && ev.note.contains(HOSTS[0]));
}

#[test]
fn deletion_without_our_finalizer_does_nothing() {
    let mut obs = observed();
    deleting(&mut obs);
    obs.machine.metadata.finalizers = Some(vec!["other".into()]);
    assert!(decide(&obs, now()).has_no_effects());
}

#[test]
fn paused_deletion_waits() {
    let mut obs = observed();
    with_provider_id(&mut obs, HOSTS[0], "01A");
    deleting(&mut obs);
    obs.recorded_host = answered(vec![vm("01A", VmState::Created, true)]);
    obs.machine.metadata.annotations =
        Some([(PAUSED_ANNOTATION.to_string(), String::new())].into());
    assert!(decide(&obs, now()).has_no_effects());
}

#[test]
fn a_machine_deleted_after_its_microvm_cluster_says_so() {
    let mut obs = observed();
    with_provider_id(&mut obs, HOSTS[0], "01UID");
    deleting(&mut obs);
    obs.infra_cluster = None;
    obs.recorded_host = HostLookup::NotAsked;
    let plan = decide(&obs, now());
    let message = expect_condition(ready(&plan), ("False", "Deleting"));
    assert!(
        message.contains("MicrovmCluster of this machine is gone")
            && message.contains("abandon-microvm"),
        "{message}"
    );
    assert!(!plan.remove_finalizer);
}

/// What a deletion of a placed machine without providerID does when its recorded host lists nothing
/// of it, by whose placement claim it carries and how long this process has seen that claim.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// The finalizer goes now.
    Released,
    /// The finalizer stays; decide again after this long.
    Waits(std::time::Duration),
}

fn outcome(plan: &MachinePlan) -> Outcome {
    if plan.remove_finalizer {
        return Outcome::Released;
    }
    match plan.requeue {
        Requeue::After(d) => Outcome::Waits(d),
        other => panic!("neither released nor waiting: {other:?} {plan:?}"),
    }
}

/// Another operator process (no leader election, a failover, a restart) claimed the placement and
/// its create may still reach the host after this process listed it: the finalizer waits until
/// that create could no longer land, or its microVM would outlive the machine (reported orphaned,
/// never deleted). The claim's age is how long this process has seen it (its monotonic clock).
#[test]
fn deletion_waits_out_a_create_another_process_may_still_make() {
    use capmvm_api::keys::PLACEMENT_CLAIM_ANNOTATION;
    use capmvm_reconcile::machine::CREATE_CLAIM_TTL;
    use std::time::Duration;
    const OTHER: &str = "capmvm-1_99_5";
    let secs = Duration::from_secs;
    // (case, claimed by, seen for, providerID set, expected)
    type Case = (
        &'static str,
        Option<&'static str>,
        Option<Duration>,
        bool,
        Outcome,
    );
    let cases: [Case; 8] = [
        (
            "never seen before: waited out whole",
            Some(OTHER),
            None,
            false,
            Outcome::Waits(CREATE_CLAIM_TTL),
        ),
        (
            "seen 3 s ago",
            Some(OTHER),
            Some(secs(3)),
            false,
            Outcome::Waits(CREATE_CLAIM_TTL - secs(3)),
        ),
        (
            "seen 19 s ago",
            Some(OTHER),
            Some(secs(19)),
            false,
            Outcome::Waits(secs(1)),
        ),
        (
            "seen as long as a create can take",
            Some(OTHER),
            Some(CREATE_CLAIM_TTL),
            false,
            Outcome::Released,
        ),
        (
            "seen longer: that create cannot land any more",
            Some(OTHER),
            Some(secs(600)),
            false,
            Outcome::Released,
        ),
        (
            "its own claim: its create is over",
            Some(OPERATOR),
            None,
            false,
            Outcome::Released,
        ),
        (
            "no claim (placed by an older version)",
            None,
            None,
            false,
            Outcome::Released,
        ),
        (
            "a providerID: the claimed create is the one it names",
            Some(OTHER),
            None,
            true,
            Outcome::Released,
        ),
    ];
    for (case, by, seen_for, with_pid, expected) in cases {
        let mut obs = observed();
        if with_pid {
            with_provider_id(&mut obs, HOSTS[1], "01A");
        } else {
            with_recorded_host(&mut obs, HOSTS[1]);
        }
        deleting(&mut obs);
        if let Some(by) = by {
            obs.machine
                .metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(
                    PLACEMENT_CLAIM_ANNOTATION.to_string(),
                    format!("{} {by}", now()),
                );
        }
        obs.claim_seen_for = seen_for;
        obs.recorded_host = answered(vec![]);
        let plan = decide(&obs, now());
        assert!(plan.host_calls.is_empty(), "{case}: {plan:?}");
        assert_eq!(outcome(&plan), expected, "{case}");
        match expected {
            Outcome::Released => assert_eq!(event_reasons(&plan), ["MicrovmDeleted"], "{case}"),
            Outcome::Waits(_) => {
                assert!(plan.events.is_empty(), "{case}: {plan:?}");
                let message = expect_condition(ready(&plan), ("False", reasons::DELETING));
                for part in [OTHER, HOSTS[1], "finalizer"] {
                    assert!(
                        message.contains(part),
                        "{case}: {part:?} missing from {message}"
                    );
                }
            }
        }
    }

    // The other process's create landed: its microVM is deleted like any of the machine's.
    let mut obs = observed();
    with_recorded_host(&mut obs, HOSTS[1]);
    deleting(&mut obs);
    obs.machine
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(
            PLACEMENT_CLAIM_ANNOTATION.to_string(),
            format!("{} {OTHER}", now()),
        );
    obs.claim_seen_for = Some(secs(6));
    obs.recorded_host = answered(vec![vm("01A", VmState::Pending, true)]);
    let plan = decide(&obs, now());
    assert_eq!(deletes(&plan), [(HOSTS[1].to_string(), "01A".to_string())]);
    assert!(!plan.remove_finalizer);
    // The abandon annotation still releases at once: a person decided.
    obs.recorded_host = answered(vec![]);
    obs.machine
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(ABANDON_MICROVM_ANNOTATION.to_string(), "true".to_string());
    assert_eq!(outcome(&decide(&obs, now())), Outcome::Released);
}
