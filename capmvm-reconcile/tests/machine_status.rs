//! Table tests of what the MicrovmMachine decision reports: microVM states, addresses, events,
//! specs edited after create, vanished and duplicate microVMs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use capmvm_api::VmState as ApiVmState;
use capmvm_api::conditions::reasons;
use capmvm_reconcile::*;
use support::*;

#[test]
fn states_map_to_status() {
    let cases = [
        (
            VmState::Pending,
            "False",
            reasons::MICROVM_PENDING,
            ApiVmState::Pending,
            false,
        ),
        (
            VmState::Created,
            "True",
            reasons::READY,
            ApiVmState::Running,
            true,
        ),
        (
            VmState::Failed,
            "False",
            reasons::MICROVM_PROVISION_FAILED,
            ApiVmState::Failed,
            false,
        ),
        (
            VmState::Deleting,
            "False",
            reasons::MICROVM_DELETING,
            ApiVmState::Deleting,
            false,
        ),
        (
            VmState::Unknown(7),
            "False",
            reasons::MICROVM_UNKNOWN_STATE,
            ApiVmState::Unknown,
            false,
        ),
    ];
    for (state, ready_status, reason, vm_state, provisioned) in cases {
        let mut obs = observed();
        with_provider_id(&mut obs, HOSTS[0], "01A");
        let mut v = vm("01A", state, true);
        v.retry = 11;
        obs.recorded_host = answered(vec![v]);
        let plan = decide(&obs, now());
        let (s, r, message) = ready(&plan);
        assert_eq!(
            (s.as_str(), r.as_str()),
            (ready_status, reason),
            "{state:?}"
        );
        let status = plan.status.as_ref().unwrap();
        assert_eq!(status.vm_state, Some(vm_state));
        assert_eq!(
            status.initialization.as_ref().and_then(|i| i.provisioned) == Some(true),
            provisioned
        );
        match state {
            VmState::Failed => assert!(message.contains("after 11 retries"), "{message}"),
            VmState::Pending => assert!(message.contains("retried 11 times"), "{message}"),
            _ => {}
        }
        assert!(
            plan.host_calls.is_empty(),
            "{state:?}: observing makes no host call"
        );
    }
}

#[test]
fn ready_reports_addresses_and_failure_domain() {
    let mut obs = observed();
    with_provider_id(&mut obs, HOSTS[2], "01A");
    obs.machine.status.as_mut().unwrap().failure_domain = None; // e.g. after clusterctl move
    obs.recorded_host = answered(vec![vm("01A", VmState::Created, true)]);
    let plan = decide(&obs, now());
    let status = plan.status.as_ref().unwrap();
    assert_eq!(status.failure_domain.as_deref(), Some("host-c"));
    let addrs: Vec<_> = status
        .addresses
        .iter()
        .map(|a| a.address.as_str())
        .collect();
    assert_eq!(addrs, ["m1", "10.0.0.50"]);
    assert!(
        event_reasons(&plan).is_empty(),
        "reaching Ready is on the condition; no event"
    );
}

#[test]
fn ready_after_a_problem_is_an_event() {
    let mut obs = observed();
    with_provider_id(&mut obs, HOSTS[2], "01A");
    obs.recorded_host = HostLookup::Unreachable("connection refused".into());
    let unreachable = decide(&obs, now());
    assert_eq!(event_reasons(&unreachable), ["HostUnreachable"]);
    obs.machine.status = unreachable.status;
    obs.recorded_host = answered(vec![vm("01A", VmState::Created, true)]);
    let back = decide(&obs, later());
    assert_eq!(ready(&back).1, reasons::READY);
    assert_eq!(event_reasons(&back), ["MicrovmReady"]);
}

#[test]
fn provisioned_is_never_unset() {
    let mut obs = observed();
    with_provider_id(&mut obs, HOSTS[0], "01A");
    obs.recorded_host = answered(vec![vm("01A", VmState::Created, true)]);
    obs.machine.status = decide(&obs, now()).status;
    obs.recorded_host = HostLookup::Unreachable("timeout".into());
    let status = decide(&obs, later()).status.unwrap();
    assert_eq!(status.initialization.unwrap().provisioned, Some(true));
}

fn up_to_date(plan: &MachinePlan) -> Option<(String, String, String)> {
    plan.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "MicrovmUpToDate")
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[test]
fn a_spec_edited_after_create_is_reported_and_not_applied() {
    let mut obs = observed();
    with_provider_id(&mut obs, HOSTS[0], "01A");
    obs.recorded_host = answered(vec![vm("01A", VmState::Created, true)]);
    let plan = decide(&obs, now());
    assert_eq!(up_to_date(&plan).unwrap().0, "True");
    obs.machine.status = plan.status.clone();

    // Someone edits the size and the root image of the running machine.
    obs.machine.spec.vcpu = 4;
    obs.machine.spec.memory_mb = 4096;
    obs.machine.spec.root_volume.image = Some("ghcr.io/example/root:2".into());
    let plan = decide(&obs, now());
    let message = expect_condition(
        up_to_date(&plan).unwrap(),
        ("False", reasons::SPEC_CHANGED_AFTER_CREATE),
    );
    for expected in [
        "spec.vcpu is 4, the microVM has 2",
        "spec.memoryMb is 4096, the microVM has 2048",
        "spec.rootVolume.image is \"ghcr.io/example/root:2\"",
        "replace the Machine",
    ] {
        assert!(message.contains(expected), "{expected:?} in {message}");
    }
    assert!(!message.contains("kernel"), "only what changed: {message}");
    assert_eq!(ready(&plan).0, "True", "the machine still works");
    assert!(plan.host_calls.is_empty(), "nothing is re-created");
    assert_eq!(event_reasons(&plan), ["SpecChangeNotApplied"]);

    // Reported once: deciding again on the written status gives no new event.
    obs.machine.status = plan.status.clone();
    let again = decide(&obs, now());
    assert!(again.has_no_effects(), "{:?}", again);
    assert_eq!(again.status, obs.machine.status);

    // Reverting the edit makes it up to date again.
    obs.machine.spec = machine_spec();
    obs.machine.spec.provider_id = Some(format!("microvm://{}/01A", HOSTS[0]));
    assert_eq!(up_to_date(&decide(&obs, now())).unwrap().0, "True");
}

#[test]
fn a_vanished_microvm_is_reported_and_never_recreated() {
    let mut obs = observed();
    with_provider_id(&mut obs, HOSTS[0], "01A");
    obs.recorded_host = answered(vec![]);
    let plan = decide(&obs, now());
    assert_eq!(ready(&plan).1, reasons::MICROVM_NOT_FOUND);
    assert!(creates(&plan).is_empty());
    assert_eq!(event_reasons(&plan), ["MicrovmNotFound"]);
}

#[test]
fn a_duplicate_next_to_the_provider_id_vm_is_deleted() {
    let mut obs = observed();
    with_provider_id(&mut obs, HOSTS[0], "01A");
    obs.recorded_host = answered(vec![
        vm("01A", VmState::Created, true),
        vm("01B", VmState::Created, true),
    ]);
    let plan = decide(&obs, now());
    assert_eq!(deletes(&plan), [(HOSTS[0].to_string(), "01B".to_string())]);
}
