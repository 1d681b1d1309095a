//! Table tests of exactly-once creation under races and refusals: the placement-attempt
//! compare-and-swap, unknown same-name microVMs on the recorded host, and a create the host refuses.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use capmvm_api::conditions::reasons;
use capmvm_api::keys::{PLACEMENT_ATTEMPT_ANNOTATION, PLACEMENT_CLAIM_ANNOTATION};
use std::time::Duration;

use capmvm_reconcile::machine::CREATE_CLAIM_TTL;
use capmvm_reconcile::machine::{HostCallFailure, record_host_call_failure};
use capmvm_reconcile::*;
use support::*;

fn with_attempts(obs: &mut ObservedMachine, attempts: &str) {
    obs.machine
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(
            PLACEMENT_ATTEMPT_ANNOTATION.to_string(),
            attempts.to_string(),
        );
}

fn recorded_attempt(plan: &MachinePlan) -> Option<u64> {
    plan.record_host.as_ref().map(|r| r.attempt)
}

#[test]
fn every_create_counts_one_more_placement_attempt() {
    // The first placement is attempt 1.
    let obs = observed();
    assert_eq!(recorded_attempt(&decide(&obs, now())), Some(1));
    // A retried create on the recorded host counts on from the value read, so the conditional
    // write changes the object even though host and uid stay the same.
    let mut obs = observed();
    with_recorded_host(&mut obs, HOSTS[1]);
    with_attempts(&mut obs, "3");
    obs.recorded_host = answered(vec![]);
    let plan = decide(&obs, now());
    assert_eq!(creates(&plan)[0].0, HOSTS[1]);
    assert_eq!(recorded_attempt(&plan), Some(4));
    // An unreadable count (edited by hand) is replaced: still a change.
    with_attempts(&mut obs, "three");
    assert_eq!(recorded_attempt(&decide(&obs, now())), Some(1));
    with_attempts(&mut obs, &u64::MAX.to_string());
    assert_eq!(
        recorded_attempt(&decide(&obs, now())),
        Some(1),
        "never the value read"
    );
}

fn claimed(obs: &mut ObservedMachine, by: &str, seconds_ago: i64) {
    let at = now() - k8s_openapi::jiff::SignedDuration::from_secs(seconds_ago);
    obs.machine
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(PLACEMENT_CLAIM_ANNOTATION.to_string(), format!("{at} {by}"));
}

#[test]
fn the_record_names_who_claims_the_placement_and_when() {
    let plan = decide(&observed(), now());
    let claim = plan.record_host.as_ref().map(|r| r.claim.clone()).unwrap();
    assert_eq!(claim, format!("{} {OPERATOR}", now()));
}

#[test]
fn a_placement_another_process_claimed_moments_ago_is_waited_out() {
    // Another operator process recorded the host and is creating: its create may not have reached
    // the host when this process listed it. Creating now would make a second microVM.
    let mut obs = placed_on(HOSTS[1], vec![]);
    claimed(&mut obs, "capmvm-1_99_5", 3);
    obs.claim_seen_for = Some(Duration::from_secs(3));
    let plan = decide(&obs, now());
    assert!(creates(&plan).is_empty(), "{:?}", plan);
    assert!(plan.has_no_effects(), "not even the record: {:?}", plan);
    assert_eq!(plan.status, None, "a short wait writes nothing");
    assert_eq!(
        plan.requeue,
        Requeue::After(CREATE_CLAIM_TTL - Duration::from_secs(3))
    );
    // A claim this process has not seen before is waited out whole.
    obs.claim_seen_for = None;
    assert_eq!(
        decide(&obs, now()).requeue,
        Requeue::After(CREATE_CLAIM_TTL)
    );
    // Once a create could no longer be under way, this process creates (a crashed one's claim).
    obs.claim_seen_for = Some(CREATE_CLAIM_TTL + Duration::from_secs(1));
    assert_eq!(creates(&decide(&obs, now())).len(), 1);
    // Its own claim does not hold it back: its own create is over when it decides again.
    claimed(&mut obs, OPERATOR, 1);
    obs.claim_seen_for = None;
    assert_eq!(creates(&decide(&obs, now())).len(), 1);
    // The microVM showed up: adopted, whoever claimed.
    claimed(&mut obs, "capmvm-1_99_5", 1);
    obs.recorded_host = answered(vec![vm("01A", VmState::Pending, true)]);
    let plan = decide(&obs, now());
    assert_adopted(&plan, HOSTS[1], "01A");
}

/// Two replicas without leader election whose clocks differ by an hour: the claim one wrote a
/// moment ago, by its clock, is an hour old by the other's. The other still waits it out (its age is
/// how long this replica has seen it), whichever way the clocks are apart.
#[test]
fn a_claim_is_waited_out_whatever_the_replicas_clocks_say() {
    let mut obs = placed_on(HOSTS[1], vec![]);
    // Written by the other replica just now, by its clock.
    claimed(&mut obs, "capmvm-1_99_5", 0);
    obs.claim_seen_for = Some(Duration::from_secs(2));
    for skew in [3600, -3600, 25, 0] {
        let this_clock = now() + k8s_openapi::jiff::SignedDuration::from_secs(skew);
        let plan = decide(&obs, this_clock);
        assert!(
            creates(&plan).is_empty(),
            "clock {skew:+} s from the writer's: {:?}",
            plan
        );
        assert_eq!(
            plan.requeue,
            Requeue::After(CREATE_CLAIM_TTL - Duration::from_secs(2)),
            "clock {skew:+} s from the writer's"
        );
    }
}

fn foreign(uid: &str, state: VmState, machine_uid: Option<&str>) -> ObservedVm {
    ObservedVm {
        machine_uid: machine_uid.map(str::to_string),
        cluster: None,
        ..vm(uid, state, false)
    }
}

#[test]
fn an_unknown_same_name_microvm_on_the_recorded_host_blocks_creation() {
    for (listed, names) in [
        (
            foreign("01C", VmState::Created, None),
            "microVM 01C has no readable MicrovmMachine uid",
        ),
        (
            foreign("01D", VmState::Pending, Some("another-uid")),
            "microVM 01D carries MicrovmMachine uid another-uid",
        ),
        (
            foreign("01E", VmState::Failed, None),
            "microVM 01E has no readable",
        ),
    ] {
        let mut obs = placed_on(HOSTS[2], vec![listed.clone()]);
        let plan = decide(&obs, now());
        assert!(
            plan.host_calls.is_empty(),
            "no create, and someone else's microVM is not deleted: {listed:?}"
        );
        assert!(plan.record_host.is_none());
        let message = expect_condition(ready(&plan), ("False", reasons::UNKNOWN_MICROVM_ON_HOST));
        for part in [HOSTS[2], "default/m1", names, "delete it"] {
            assert!(message.contains(part), "{part:?} missing from {message}");
        }
        if listed.machine_uid.is_some() {
            assert!(message.contains(MACHINE_UID), "{message}");
        }
        assert!(matches!(plan.requeue, Requeue::After(_)));
        // A Warning event the first time; the same condition again publishes none.
        let warned: Vec<_> = plan
            .events
            .iter()
            .filter(|e| e.kind == EventKind::Warning && e.reason == "UnknownMicrovmOnHost")
            .collect();
        assert_eq!(warned.len(), 1, "{:?}", plan);
        obs.machine.status = plan.status.clone();
        let again = decide(&obs, now());
        assert!(again.has_no_effects(), "{:?}", again);
        assert_eq!(again.status, obs.machine.status);
    }
}

#[test]
fn an_unknown_microvm_being_deleted_or_next_to_ours_does_not_block() {
    // Being deleted: it is going away, so the machine creates.
    let mut obs = placed_on(HOSTS[0], vec![foreign("01A", VmState::Deleting, None)]);
    assert_eq!(creates(&decide(&obs, now())).len(), 1);
    // Ours is there too: it is adopted, the unknown one left alone.
    obs.recorded_host = answered(vec![
        foreign("01A", VmState::Created, None),
        vm("01B", VmState::Created, true),
    ]);
    let plan = decide(&obs, now());
    assert!(plan.host_calls.is_empty());
    assert_adopted(&plan, HOSTS[0], "01B");
}

fn refused_create(obs: &ObservedMachine) -> (capmvm_api::MicrovmMachineStatus, bool, Event) {
    let mut status = obs.machine.status.clone().unwrap_or_default();
    let create = decide(obs, now())
        .host_calls
        .into_iter()
        .find(|c| matches!(c, HostCall::Create { .. }))
        .expect("a create");
    let verdict = record_host_call_failure(
        &obs.machine,
        &mut status,
        &create,
        HostCallFailure::Refused,
        "host 10.0.0.1:9090: invalid_argument: Key: 'MicroVM.Spec.Kernel.Image' Error:Field validation for 'Image' failed on the 'imageURI' tag",
        now(),
    );
    (status, verdict.retry_with_backoff, verdict.event)
}

#[test]
fn a_create_the_host_refused_is_final_until_the_spec_changes() {
    let mut obs = placed_on(HOSTS[0], vec![]);
    let (status, retry, event) = refused_create(&obs);
    assert!(!retry, "no backoff retry of a refused spec");
    assert_eq!(
        (event.kind, event.reason),
        (EventKind::Warning, "MicrovmSpecRejected")
    );
    let rejected = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(
        (rejected.status.as_str(), rejected.reason.as_str()),
        ("False", reasons::MICROVM_SPEC_REJECTED)
    );
    assert!(
        rejected.message.contains("'imageURI' tag") && rejected.message.contains("spec changes"),
        "{}",
        rejected.message
    );
    assert_eq!(
        rejected.observed_generation,
        obs.machine.metadata.generation
    );

    // The same generation: nothing is sent again, no event, the condition stays.
    obs.machine.status = Some(status);
    let plan = decide(&obs, now());
    assert!(plan.has_no_effects(), "{:?}", plan);
    assert_eq!(ready(&plan).1, reasons::MICROVM_SPEC_REJECTED);
    assert_eq!(plan.requeue, Requeue::Await);
    // Once that status is written, deciding again writes nothing.
    obs.machine.status = plan.status.clone();
    assert_eq!(decide(&obs, now()).status, obs.machine.status);

    // The spec changed (a new generation): the create is tried again.
    obs.machine.metadata.generation = Some(2);
    let plan = decide(&obs, now());
    assert_eq!(creates(&plan).len(), 1);
}

#[test]
fn other_failures_and_refused_deletes_are_retried() {
    let obs = placed_on(HOSTS[0], vec![]);
    let create = decide(&obs, now())
        .host_calls
        .into_iter()
        .find(|c| matches!(c, HostCall::Create { .. }))
        .unwrap();
    for (effect, failure, reason) in [
        (
            create.clone(),
            HostCallFailure::Unreachable,
            reasons::HOST_UNREACHABLE,
        ),
        (
            create,
            HostCallFailure::Failed,
            reasons::MICROVM_CREATE_FAILED,
        ),
        (
            HostCall::Delete {
                host: HOSTS[0].parse().unwrap(),
                uid: "01A".into(),
            },
            HostCallFailure::Refused,
            reasons::MICROVM_CREATE_FAILED,
        ),
    ] {
        let mut status = obs.machine.status.clone().unwrap_or_default();
        let verdict =
            record_host_call_failure(&obs.machine, &mut status, &effect, failure, "boom", now());
        assert!(verdict.retry_with_backoff, "{failure:?} {effect:?}");
        assert_eq!(verdict.event.reason, "HostCallFailed");
        let ready = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.reason, reason, "{failure:?}");
        // Not final: the next decision creates again.
        let mut retried = obs.clone();
        retried.machine.status = Some(status);
        assert_eq!(creates(&decide(&retried, now())).len(), 1);
    }
}

/// A host call that failed is part of the next observation: the engine reports it and says whether
/// the operator retries with backoff (a host that did not answer) or waits for the spec to change
/// (a create the host refused), without sending anything again in between.
#[test]
fn a_failed_host_call_in_the_observation_is_reported_and_not_repeated() {
    let obs = placed_on(HOSTS[0], vec![]);
    let create = decide(&obs, now())
        .host_calls
        .into_iter()
        .next()
        .expect("a create");
    for (failure, requeue, reason) in [
        (
            HostCallFailure::Unreachable,
            Requeue::Backoff,
            reasons::HOST_UNREACHABLE,
        ),
        (
            HostCallFailure::Refused,
            Requeue::Await,
            reasons::MICROVM_SPEC_REJECTED,
        ),
    ] {
        let mut failed = obs.clone();
        failed.failed_host_call = Some(capmvm_reconcile::FailedHostCall {
            call: create.clone(),
            failure,
            message: "boom".into(),
        });
        let plan = decide(&failed, now());
        assert_eq!(plan.requeue, requeue, "{failure:?}");
        assert!(plan.host_calls.is_empty() && plan.record_host.is_none());
        assert_eq!(ready(&plan).1, reason);
        let warned: Vec<&str> = plan.events.iter().map(|e| e.reason).collect();
        assert_eq!(
            warned.len(),
            1,
            "one Warning, no transition event: {warned:?}"
        );
    }
}
