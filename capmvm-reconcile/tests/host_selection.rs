//! Table tests of host selection and maintenance as a machine, a pool and a cluster see them:
//! `hostSelector` narrows placement and never widens it (`NoMatchingHost`), a label added later lets
//! the machine proceed, cordoned hosts take nothing new, an evacuating host's machines say so on
//! Ready (MachineDeployments) and a pool's instances there are replaced within its roll limits, and
//! the MicrovmCluster reports each host's state and microVM count.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;

use capmvm_api::conditions::reasons;
use capmvm_api::{HostMaintenance, HostState};
use capmvm_reconcile::machine::{EVACUATION_TURN_RECHECK, wants_evacuation_group};
use capmvm_reconcile::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use support::*;

fn selector(key: &str, value: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some([(key.to_string(), value.to_string())].into()),
        match_expressions: None,
    }
}

/// The fixture's cluster with `labels` on host `index` and `maintenance` on it.
fn bend_host(
    obs: &mut ObservedMachine,
    index: usize,
    labels: &[(&str, &str)],
    maintenance: Option<HostMaintenance>,
) {
    let mut mc = (**obs.infra_cluster.as_ref().unwrap()).clone();
    let host = &mut mc.spec.placement.static_pool.as_mut().unwrap().hosts[index];
    host.labels = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    host.maintenance = maintenance;
    obs.infra_cluster = Some(Arc::new(mc));
}

#[test]
fn a_selector_places_only_on_matching_hosts() {
    // Over many machines the selector's one host takes them all.
    for i in 0..20 {
        let mut obs = observed();
        obs.machine.metadata.name = Some(format!("m{i}"));
        bend_host(&mut obs, 2, &[("disk", "nvme")], None);
        obs.machine.spec.host_selector = Some(selector("disk", "nvme"));
        let plan = decide(&obs, now());
        let record = plan.record_host.as_ref().expect("placed");
        assert_eq!(record.host.to_string(), HOSTS[2], "machine m{i}");
    }
}

#[test]
fn no_matching_host_waits_names_the_selector_and_the_hosts_then_proceeds_when_labelled() {
    let mut obs = observed();
    obs.machine.spec.host_selector = Some(selector("disk", "nvme"));
    let plan = decide(&obs, now());
    assert!(plan.record_host.is_none(), "never placed elsewhere");
    assert_eq!(creates(&plan).len(), 0);
    let message = expect_condition(ready(&plan), ("False", reasons::NO_MATCHING_HOST));
    assert!(message.contains("disk=nvme"), "{message}");
    assert!(message.contains("0 of 3 considered match"), "{message}");
    for host in ["host-a", "host-b", "host-c"] {
        assert!(
            message.contains(&format!("{host}: labels <none> do not match")),
            "{message}"
        );
    }
    assert_eq!(
        plan.requeue,
        Requeue::Await,
        "the MicrovmCluster's change wakes it"
    );

    // A label added to a host (a new MicrovmCluster generation) lets it proceed, no restart.
    bend_host(&mut obs, 0, &[("disk", "nvme")], None);
    let plan = decide(&obs, now());
    assert_eq!(plan.record_host.unwrap().host.to_string(), HOSTS[0]);
}

#[test]
fn a_matching_host_in_maintenance_is_no_match_for_a_selector() {
    let mut obs = observed();
    bend_host(
        &mut obs,
        2,
        &[("disk", "nvme")],
        Some(HostMaintenance::Cordon),
    );
    obs.machine.spec.host_selector = Some(selector("disk", "nvme"));
    let plan = decide(&obs, now());
    assert!(plan.record_host.is_none());
    let message = expect_condition(ready(&plan), ("False", reasons::NO_MATCHING_HOST));
    assert!(message.contains("1 of 3 considered match"), "{message}");
    assert!(
        message.contains("host-c: cordoned for maintenance"),
        "{message}"
    );
}

#[test]
fn cordoned_and_evacuating_hosts_take_no_new_machine() {
    for maintenance in [HostMaintenance::Cordon, HostMaintenance::Evacuate] {
        for i in 0..20 {
            let mut obs = observed();
            obs.machine.metadata.name = Some(format!("m{i}"));
            bend_host(&mut obs, 0, &[], Some(maintenance));
            let plan = decide(&obs, now());
            let host = plan.record_host.expect("placed").host.to_string();
            assert_ne!(host, HOSTS[0], "{maintenance:?} machine m{i}");
        }
    }
}

#[test]
fn a_running_machine_on_an_evacuating_host_says_so_and_keeps_its_microvm() {
    let mut obs = placed_on(HOSTS[0], vec![vm("01A", VmState::Created, true)]);
    with_provider_id(&mut obs, HOSTS[0], "01A");

    // Cordoned: stays Ready.
    bend_host(&mut obs, 0, &[], Some(HostMaintenance::Cordon));
    let plan = decide(&obs, now());
    expect_condition(ready(&plan), ("True", reasons::READY));

    bend_host(&mut obs, 0, &[], Some(HostMaintenance::Evacuate));
    let plan = decide(&obs, now());
    let message = expect_condition(ready(&plan), ("False", reasons::HOST_EVACUATING));
    assert!(message.contains("host-a"), "{message}");
    assert!(message.contains("MachineHealthCheck"), "{message}");
    assert_eq!(deletes(&plan), vec![], "the microVM keeps running");
    assert_eq!(creates(&plan).len(), 0);
    let status = plan.status.as_ref().unwrap();
    assert_eq!(
        status.initialization.as_ref().and_then(|i| i.provisioned),
        Some(true),
        "provisioned is never unset"
    );

    // Maintenance lifted: Ready again.
    bend_host(&mut obs, 0, &[], None);
    let plan = decide(&obs, now());
    expect_condition(ready(&plan), ("True", reasons::READY));
}

#[test]
fn a_machine_on_an_evacuating_host_waits_its_turn_while_its_deployment_is_not_whole() {
    let mut obs = placed_on(HOSTS[0], vec![vm("01A", VmState::Created, true)]);
    with_provider_id(&mut obs, HOSTS[0], "01A");
    obs.owner.as_mut().unwrap().deployment = Some("md-0".into());
    bend_host(&mut obs, 0, &[], Some(HostMaintenance::Evacuate));
    assert!(
        wants_evacuation_group(&obs),
        "the operator is asked for the group"
    );
    let replacement_not_ready = EvacuationPeer {
        name: "md-0-new".into(),
        deleting: false,
        ready: false,
        host: Some(HOSTS[1].into()),
        ready_reason: None,
    };
    obs.evacuation = Some(EvacuationGroup {
        desired: Some(2),
        peers: vec![replacement_not_ready.clone()],
    });
    let plan = decide(&obs, now());
    let message = expect_condition(ready(&plan), ("True", reasons::READY));
    assert!(
        message.contains("waits its turn: md-0-new is not Ready"),
        "{message}"
    );
    assert_eq!(plan.requeue, Requeue::After(EVACUATION_TURN_RECHECK));
    assert_eq!(deletes(&plan), vec![]);

    // The replacement's Node is Ready: this one goes.
    obs.evacuation = Some(EvacuationGroup {
        desired: Some(2),
        peers: vec![EvacuationPeer {
            ready: true,
            ..replacement_not_ready
        }],
    });
    let plan = decide(&obs, now());
    expect_condition(ready(&plan), ("False", reasons::HOST_EVACUATING));
}

#[test]
fn the_cluster_reports_each_hosts_state_and_microvm_count() {
    let mut obs = observed_cluster();
    {
        let pool = static_pool(&mut obs);
        pool.hosts[0].maintenance = Some(HostMaintenance::Cordon);
        pool.hosts[1].maintenance = Some(HostMaintenance::Evacuate);
    }
    obs.hosts.insert(
        HOSTS[2].to_string(),
        HostFacts {
            reachability: Reachability::Unreachable("connection refused".into()),
            ..Default::default()
        },
    );
    let mut ours = vm("vm-1", VmState::Created, true);
    ours.cluster = Some("demo".into());
    let mut other_cluster = vm("vm-2", VmState::Created, true);
    other_cluster.cluster = Some("someone-else".into());
    obs.microvms = vec![
        HostedVm {
            host: HOSTS[1].into(),
            vm: ours.clone(),
        },
        HostedVm {
            host: HOSTS[1].into(),
            vm: vm("vm-3", VmState::Deleting, true),
        },
        HostedVm {
            host: HOSTS[1].into(),
            vm: other_cluster,
        },
    ];
    let plan = decide_cluster(&obs, now());
    let hosts = &plan.status.as_ref().unwrap().hosts;
    let seen: Vec<(&str, HostState, i32)> = hosts
        .iter()
        .map(|h| (h.name.as_str(), h.state, h.microvms))
        .collect();
    assert_eq!(
        seen,
        [
            ("host-a", HostState::Cordoned, 0),
            ("host-b", HostState::Evacuating, 2),
            ("host-c", HostState::Unreachable, 0),
        ]
    );
    assert_eq!(hosts[2].reason.as_deref(), Some("connection refused"));
    assert_eq!(hosts[0].endpoint, HOSTS[0]);
}

/// CAPI and pools put a new machine in the failure domain with the fewest machines: a domain whose
/// every host is in maintenance must not be offered, or replacements would be sent to the host
/// being emptied. A domain with one host still in service stays.
#[test]
fn failure_domains_whose_hosts_are_all_in_maintenance_are_not_offered() {
    let domains = |obs: &ObservedCluster| -> Vec<String> {
        decide_cluster(obs, now())
            .status
            .unwrap()
            .failure_domains
            .into_iter()
            .map(|d| d.name)
            .collect()
    };
    let mut obs = observed_cluster();
    assert_eq!(domains(&obs), ["host-c", "r1"]);
    static_pool(&mut obs).hosts[0].maintenance = Some(HostMaintenance::Evacuate);
    assert_eq!(
        domains(&obs),
        ["host-c", "r1"],
        "host-b keeps r1 in service"
    );
    static_pool(&mut obs).hosts[1].maintenance = Some(HostMaintenance::Cordon);
    assert_eq!(domains(&obs), ["host-c"]);
    static_pool(&mut obs).hosts[0].maintenance = None;
    assert_eq!(domains(&obs), ["host-c", "r1"]);
}
