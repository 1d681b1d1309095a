//! Table tests of the MicrovmCluster and MicrovmMachineTemplate decisions.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;

use capmvm_api::conditions::reasons;
use capmvm_api::keys::{MANAGED_BY_ANNOTATION, PAUSED_ANNOTATION};
use capmvm_api::{
    MicrovmMachineTemplate, MicrovmMachineTemplateResource, MicrovmMachineTemplateSpec,
    TemplateMeta,
};
use capmvm_reconcile::*;
use support::cluster_condition as condition;
use support::*;

fn provisioned(plan: &ClusterPlan) -> bool {
    plan.status
        .as_ref()
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.provisioned)
        == Some(true)
}

#[test]
fn a_valid_cluster_is_provisioned_with_grouped_failure_domains() {
    let plan = decide_cluster(&observed_cluster(), now());
    assert!(provisioned(&plan));
    let fds: Vec<_> = plan
        .status
        .as_ref()
        .unwrap()
        .failure_domains
        .iter()
        .map(|f| (f.name.as_str(), f.control_plane))
        .collect();
    // host-a and host-b share r1 (a allows control planes, so the domain does); host-c is its own.
    assert_eq!(fds, [("host-c", Some(true)), ("r1", Some(true))]);
    assert_eq!(
        condition(&plan, "Ready"),
        (
            "True".into(),
            "Ready".into(),
            "3 of 3 hosts reachable".into()
        )
    );
    assert_eq!(condition(&plan, "HostsReachable").0, "True");
}

#[test]
fn externally_managed_clusters_are_left_alone() {
    let mut obs = observed_cluster();
    obs.microvm_cluster.metadata.annotations =
        Some(BTreeMap::from([(MANAGED_BY_ANNOTATION.into(), "x".into())]));
    let plan = decide_cluster(&obs, now());
    assert_eq!(plan.status, None);
    assert!(plan.has_no_effects());
}

#[test]
fn cluster_gates() {
    let mut obs = observed_cluster();
    obs.owner = None;
    let plan = decide_cluster(&obs, now());
    assert_eq!(condition(&plan, "Ready").1, reasons::WAITING_FOR_OWNER);
    assert!(!provisioned(&plan));

    let mut obs = observed_cluster();
    obs.microvm_cluster.metadata.annotations =
        Some(BTreeMap::from([(PAUSED_ANNOTATION.into(), String::new())]));
    let plan = decide_cluster(&obs, now());
    assert_eq!(condition(&plan, "Paused").0, "True");
    assert!(!provisioned(&plan), "paused: nothing else happens");

    // Pausing the Cluster pauses its MicrovmCluster too.
    let mut obs = observed_cluster();
    obs.owner.as_mut().unwrap().paused = true;
    let plan = decide_cluster(&obs, now());
    assert_eq!(condition(&plan, "Paused").0, "True");
    assert!(!provisioned(&plan));

    let mut obs = observed_cluster();
    obs.microvm_cluster.spec.control_plane_endpoint = None;
    let plan = decide_cluster(&obs, now());
    assert_eq!(
        condition(&plan, "Ready").1,
        reasons::WAITING_FOR_CONTROL_PLANE_ENDPOINT
    );
    assert!(!provisioned(&plan));
    // The Cluster's own endpoint is enough.
    obs.owner.as_mut().unwrap().control_plane_endpoint = Some(capmvm_api::ApiEndpoint {
        host: Some("vip".into()),
        port: Some(6443),
    });
    assert!(provisioned(&decide_cluster(&obs, now())));

    let mut obs = observed_cluster();
    static_pool(&mut obs).hosts[0].endpoint = "nope".into();
    let plan = decide_cluster(&obs, now());
    let (_, reason, message) = condition(&plan, "Ready");
    assert_eq!(reason, reasons::INVALID_SPEC);
    assert!(
        message.contains("spec.placement.staticPool.hosts[0].endpoint"),
        "{message}"
    );
}

#[test]
fn reachability_summary() {
    let mut obs = observed_cluster();
    obs.hosts.get_mut(HOSTS[1]).unwrap().reachability =
        Reachability::Unreachable("connection refused".into());
    let plan = decide_cluster(&obs, now());
    assert_eq!(
        condition(&plan, "Ready"),
        (
            "True".into(),
            "Ready".into(),
            "2 of 3 hosts reachable".into()
        )
    );
    let (s, r, m) = condition(&plan, "HostsReachable");
    assert_eq!(
        (s.as_str(), r.as_str()),
        ("False", reasons::HOSTS_UNREACHABLE)
    );
    assert!(
        m.contains("host-b (10.0.0.2:9090): connection refused"),
        "{m}"
    );

    for h in HOSTS {
        obs.hosts.get_mut(h).unwrap().reachability = Reachability::Unreachable("refused".into());
    }
    let plan = decide_cluster(&obs, now());
    assert_eq!(condition(&plan, "Ready").1, reasons::HOSTS_UNREACHABLE);
    assert!(
        provisioned(&plan),
        "provisioning does not depend on reachability"
    );

    obs.hosts.clear();
    let plan = decide_cluster(&obs, now());
    assert_eq!(condition(&plan, "HostsReachable").0, "Unknown");
    assert_eq!(condition(&plan, "Ready").0, "True");
}

#[test]
fn provisioned_is_never_unset() {
    let mut obs = observed_cluster();
    obs.microvm_cluster.status = decide_cluster(&obs, now()).status;
    obs.microvm_cluster.spec.control_plane_endpoint = None;
    assert!(provisioned(&decide_cluster(&obs, later())));
}

#[test]
fn basic_auth_without_tls_warns_once() {
    let mut obs = observed_cluster();
    static_pool(&mut obs).basic_auth_secret = Some("tokens".into());
    let plan = decide_cluster(&obs, now());
    assert_eq!(
        condition(&plan, "HostTransportSecure").1,
        "BasicAuthWithoutTLS"
    );
    let ev = plan.events.first().unwrap();
    assert_eq!(
        (ev.kind, ev.reason),
        (EventKind::Warning, "InsecureTransport")
    );
    obs.microvm_cluster.status = plan.status;
    assert_eq!(
        decide_cluster(&obs, later()).events.len(),
        0,
        "only on the transition"
    );
    obs.microvm_cluster.spec.tls_secret_ref = Some("tls".into());
    assert_eq!(
        condition(&decide_cluster(&obs, later()), "HostTransportSecure").0,
        "True"
    );
}

#[test]
fn deciding_twice_gives_the_same_status() {
    let mut obs = observed_cluster();
    let first = decide_cluster(&obs, now());
    obs.microvm_cluster.status = first.status.clone();
    assert_eq!(decide_cluster(&obs, later()).status, first.status);
}

#[test]
fn template_capacity_is_strings() {
    let mut t = MicrovmMachineTemplate::new(
        "t",
        MicrovmMachineTemplateSpec {
            template: MicrovmMachineTemplateResource {
                metadata: None,
                spec: machine_spec(),
            },
        },
    );
    let status = decide_template(&t);
    assert_eq!(
        serde_json::to_value(&status).unwrap(),
        serde_json::json!({"capacity": {"cpu": "2", "memory": "2048Mi"}, "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux"}})
    );
    t.spec.template.metadata = Some(TemplateMeta {
        labels: BTreeMap::from([("kubernetes.io/arch".into(), "arm64".into())]),
        annotations: BTreeMap::new(),
    });
    assert_eq!(
        decide_template(&t)
            .node_info
            .unwrap()
            .architecture
            .as_deref(),
        Some("arm64")
    );
}
