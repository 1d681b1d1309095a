//! Table tests of the judgements the operator carries out but does not make: whose placement claim
//! is waited out, when a cached list is confirmed by a direct Get and what its answer means, what a
//! host call's error amounts to, which hosts a MicrovmCluster observes, when a pool waits for its
//! caches, and which of a pool's writes are done when their object is gone.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use capmvm_api::capi::Machine;
use capmvm_api::keys::{DELETE_MACHINE_ANNOTATION, PLACEMENT_CLAIM_ANNOTATION};
use capmvm_api::{HostEndpoint, MicrovmMachineStatus, VmState as ApiVmState};
use capmvm_reconcile::cluster::hosts_to_observe;
use capmvm_reconcile::host_call::{CallOutcome, HostErrorKind, judge_host_error};
use capmvm_reconcile::machine::{
    HostCallFailure, after_direct_get, concerns, foreign_claim, wants_direct_get,
};
use capmvm_reconcile::pool::{
    CachedMachine, EXPECTATION_TTL, ExpectationsSeen, InstanceMachine, PoolWrite, caches_behind,
    done_when_gone,
};
use capmvm_reconcile::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use support::*;

const OTHER: &str = "capmvm-1_99_5";

fn claim(obs: &mut ObservedMachine, value: &str) {
    obs.machine
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(PLACEMENT_CLAIM_ANNOTATION.to_string(), value.to_string());
}

#[test]
fn only_another_process_claim_on_a_machine_without_provider_id_is_foreign() {
    let at = now().to_string();
    let other = format!("{at} {OTHER}");
    // (case, claim annotation, providerID set, foreign claim)
    let cases: [(&str, Option<String>, bool, Option<&str>); 6] = [
        (
            "another process",
            Some(other.clone()),
            false,
            Some(other.as_str()),
        ),
        (
            "this process",
            Some(format!("{at} {OPERATOR}")),
            false,
            None,
        ),
        ("none", None, false, None),
        ("unreadable", Some("yesterday someone".into()), false, None),
        ("no process named", Some(at.clone()), false, None),
        (
            "another process, but the microVM is made",
            Some(other.clone()),
            true,
            None,
        ),
    ];
    for (case, value, pid, expected) in cases {
        let mut obs = observed();
        if pid {
            with_provider_id(&mut obs, HOSTS[0], "01A");
        }
        if let Some(v) = &value {
            claim(&mut obs, v);
        }
        assert_eq!(foreign_claim(&obs.machine, OPERATOR), expected, "{case}");
    }
}

fn running(obs: &mut ObservedMachine) {
    obs.machine
        .status
        .get_or_insert_with(MicrovmMachineStatus::default)
        .vm_state = Some(ApiVmState::Running);
}

#[test]
fn a_cached_list_is_confirmed_by_a_direct_get_where_it_may_be_behind() {
    // (case, status records Running, state the cached list shows, ask the host directly)
    let cases = [
        ("missing from the list (or no list yet)", false, None, true),
        ("missing, status says running", true, None, true),
        (
            "starting in a list older than the status",
            true,
            Some(VmState::Pending),
            true,
        ),
        (
            "starting, and the status agrees",
            false,
            Some(VmState::Pending),
            false,
        ),
        ("running in the list", true, Some(VmState::Created), false),
        ("failed in the list", true, Some(VmState::Failed), false),
        (
            "being deleted in the list",
            true,
            Some(VmState::Deleting),
            false,
        ),
    ];
    for (case, recorded_running, listed, expected) in cases {
        let mut obs = observed();
        with_provider_id(&mut obs, HOSTS[0], "01A");
        if recorded_running {
            running(&mut obs);
        }
        assert_eq!(wants_direct_get(&obs.machine, listed), expected, "{case}");
    }
}

#[test]
fn a_direct_get_corrects_the_list_and_not_found_means_gone() {
    let listed = || {
        vec![
            vm("01A", VmState::Pending, true),
            vm("01Z", VmState::Created, false),
        ]
    };
    // The host's answer replaces what the list showed.
    let lookup = after_direct_get(listed(), "01A", Ok(vm("01A", VmState::Created, true)));
    let HostLookup::Answered { vms } = lookup else {
        panic!("{lookup:?}")
    };
    let states: Vec<_> = vms.iter().map(|v| (v.uid.as_str(), v.state)).collect();
    assert_eq!(
        states,
        [("01Z", VmState::Created), ("01A", VmState::Created)]
    );
    // NotFound: the microVM is gone (what a machine with a providerID reports as MicrovmNotFound).
    let lookup = after_direct_get(
        listed(),
        "01A",
        Err((HostErrorKind::NotFound, "not found".into())),
    );
    assert_eq!(lookup, answered(vec![vm("01Z", VmState::Created, false)]));
    // Any other error: the host did not answer, whatever the list showed.
    for kind in [
        HostErrorKind::Unavailable,
        HostErrorKind::DeadlineExceeded,
        HostErrorKind::Unauthenticated,
        HostErrorKind::InvalidConfig,
        HostErrorKind::Other,
    ] {
        assert_eq!(
            after_direct_get(listed(), "01A", Err((kind, "host 1: refused".into()))),
            HostLookup::Unreachable("host 1: refused".into()),
            "{kind:?}"
        );
    }
}

#[test]
fn a_machine_concerns_its_name_and_its_provider_ids_microvm() {
    let mut obs = observed();
    with_provider_id(&mut obs, HOSTS[0], "01A");
    let mut adopted = vm("01A", VmState::Created, false);
    adopted.name = "named-by-another-provider".into();
    let mut elsewhere = vm("01B", VmState::Created, true);
    elsewhere.namespace = "other".into();
    let mut namesake = vm("01C", VmState::Created, false);
    namesake.name = "m2".into();
    assert!(concerns(&obs.machine, &vm("01Z", VmState::Created, false)));
    assert!(concerns(&obs.machine, &adopted), "its providerID's");
    assert!(!concerns(&obs.machine, &elsewhere), "another namespace");
    assert!(!concerns(&obs.machine, &namesake), "another name");
}

#[test]
fn a_host_error_is_judged_by_call_and_kind() {
    let create = HostCall::Create {
        host: HOSTS[0].parse::<HostEndpoint>().unwrap(),
        spec: Box::new(creates(&decide(&observed(), now()))[0].1.as_ref().clone()),
    };
    let delete = HostCall::Delete {
        host: HOSTS[0].parse().unwrap(),
        uid: "01A".into(),
    };
    use CallOutcome::{Done, Failed};
    use HostCallFailure::{Failed as Retry, Refused, Unreachable};
    // (kind, a create's outcome, a delete's outcome)
    let cases = [
        (HostErrorKind::NotFound, Failed(Retry), Done),
        (
            HostErrorKind::Unavailable,
            Failed(Unreachable),
            Failed(Unreachable),
        ),
        (
            HostErrorKind::DeadlineExceeded,
            Failed(Unreachable),
            Failed(Unreachable),
        ),
        (
            HostErrorKind::InvalidArgument,
            Failed(Refused),
            Failed(Refused),
        ),
        (HostErrorKind::Unauthenticated, Failed(Retry), Failed(Retry)),
        (HostErrorKind::InvalidConfig, Failed(Retry), Failed(Retry)),
        (HostErrorKind::Other, Failed(Retry), Failed(Retry)),
    ];
    for (kind, on_create, on_delete) in cases {
        assert_eq!(
            judge_host_error(&create, kind),
            on_create,
            "create, {kind:?}"
        );
        assert_eq!(
            judge_host_error(&delete, kind),
            on_delete,
            "delete, {kind:?}"
        );
    }
    // What follows a failure: only a create the host refused waits for a new spec; the rest back off.
    let obs = observed();
    for (call, failure, backoff) in [
        (&create, Refused, false),
        (&create, Unreachable, true),
        (&create, Retry, true),
        (&delete, Refused, true),
        (&delete, Unreachable, true),
    ] {
        let mut status = MicrovmMachineStatus::default();
        let verdict = capmvm_reconcile::machine::record_host_call_failure(
            &obs.machine,
            &mut status,
            call,
            failure,
            "host said no",
            now(),
        );
        assert_eq!(verdict.retry_with_backoff, backoff, "{failure:?}");
    }
}

#[test]
fn a_cluster_observes_its_pool_and_its_machines_hosts_paused_or_deleted() {
    let removed: HostEndpoint = "10.0.0.9:9090".parse().unwrap();
    let expected: Vec<String> = HOSTS
        .iter()
        .map(|h| h.to_string())
        .chain([removed.to_string()])
        .collect();
    let mut mc = microvm_cluster();
    let observed = |mc: &capmvm_api::MicrovmCluster| {
        hosts_to_observe(mc, [removed.clone(), HOSTS[1].parse().unwrap()])
            .into_iter()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        observed(&mc),
        expected,
        "the pool, and a host removed from it"
    );
    // Paused: a pause stops changes, not reads.
    mc.metadata.annotations = Some(
        [(
            capmvm_api::keys::PAUSED_ANNOTATION.to_string(),
            String::new(),
        )]
        .into(),
    );
    assert_eq!(observed(&mc), expected, "paused");
    // Deleted: its machines must see their microVMs go.
    mc.metadata.deletion_timestamp = Some(Time(now()));
    assert_eq!(observed(&mc), expected, "deleted");
    // An endpoint that does not parse is not a host (validation reports it on the cluster).
    static_pool_of(&mut mc).hosts[0].endpoint = "not a host".into();
    assert_eq!(hosts_to_observe(&mc, []).len(), 2);
}

fn static_pool_of(mc: &mut capmvm_api::MicrovmCluster) -> &mut capmvm_api::StaticPoolPlacement {
    mc.spec.placement.static_pool.as_mut().unwrap()
}

#[test]
fn a_pool_waits_until_the_caches_show_its_creates_and_deletes() {
    let seen =
        |created: &[(&str, bool)], deleted: &[(&str, CachedMachine)], age: u64| ExpectationsSeen {
            age: Duration::from_secs(age),
            created: created.iter().map(|(n, c)| (n.to_string(), *c)).collect(),
            deleted: deleted.iter().map(|(n, m)| (n.to_string(), *m)).collect(),
        };
    use CachedMachine::{Absent, Deleting, Live};
    // (case, what the caches show, wait)
    let cases = [
        (
            "all cached, all gone",
            seen(&[("a", true)], &[("old", Absent)], 1),
            false,
        ),
        (
            "a deleted Machine still deleting",
            seen(&[("a", true)], &[("old", Deleting)], 1),
            false,
        ),
        (
            "an instance not cached yet",
            seen(&[("a", true), ("b", false)], &[], 1),
            true,
        ),
        (
            "a deleted Machine still looks live",
            seen(&[], &[("old", Live)], 1),
            true,
        ),
        (
            "behind, but at the limit",
            seen(&[("b", false)], &[], EXPECTATION_TTL.as_secs()),
            true,
        ),
        (
            "behind for too long: decide anyway",
            seen(
                &[("b", false)],
                &[("old", Live)],
                EXPECTATION_TTL.as_secs() + 1,
            ),
            false,
        ),
        ("nothing expected", seen(&[], &[], 0), false),
    ];
    for (case, seen, wait) in cases {
        assert_eq!(caches_behind(&seen), wait, "{case}");
    }
}

#[test]
fn a_pools_delete_or_mark_of_an_object_already_gone_is_done_a_create_is_not() {
    let cases = [
        (PoolWrite::CreateInstance, false),
        (PoolWrite::MarkInstance, true),
        (PoolWrite::DeleteMachine, true),
        (PoolWrite::DeleteInstance, true),
    ];
    for (write, done) in cases {
        assert_eq!(done_when_gone(write), done, "{write:?}");
    }
}

#[test]
fn a_pool_reads_a_machines_mark_remediation_and_deletion() {
    let mut m = Machine::new("workers-1", Default::default());
    assert_eq!(InstanceMachine::from(&m), InstanceMachine::default());
    m.metadata.annotations = Some([(DELETE_MACHINE_ANNOTATION.to_string(), "true".into())].into());
    m.metadata.deletion_timestamp = Some(Time(now()));
    assert_eq!(
        InstanceMachine::from(&m),
        InstanceMachine {
            delete_requested: true,
            owner_remediation_requested: false,
            deleting: true,
            joined: false,
        }
    );
}
