//! Table tests of a MicrovmCluster's lifecycle: its finalizer and its credential Secrets' finalizers
//! (so a namespace deletion cannot strand machines), credentials on `Ready`, the Warning events of
//! cluster-level problems, and microVMs left behind.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use capmvm_api::conditions::reasons;
use capmvm_api::keys::CLUSTER_FINALIZER;
use capmvm_reconcile::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use support::cluster_condition as condition;
use support::*;

/// The fixture as it stands once the operator has added the finalizer.
fn observed_cluster() -> ObservedCluster {
    let mut obs = support::observed_cluster();
    obs.microvm_cluster.metadata.finalizers = Some(vec![CLUSTER_FINALIZER.into()]);
    obs
}

fn warnings(plan: &ClusterPlan) -> Vec<&'static str> {
    plan.events
        .iter()
        .filter(|e| e.kind == EventKind::Warning)
        .map(|e| e.reason)
        .collect()
}

fn secret(name: &str, protected: bool, other_users: usize) -> CredentialSecret {
    CredentialSecret {
        name: name.into(),
        exists: true,
        protected,
        other_users,
    }
}

fn deleting(obs: &mut ObservedCluster) {
    obs.microvm_cluster.metadata.deletion_timestamp = Some(Time(now()));
}

#[test]
fn the_finalizer_and_the_secrets_finalizers_are_added_first() {
    let mut obs = observed_cluster();
    obs.microvm_cluster.metadata.finalizers = None;
    obs.credential_secrets = vec![secret("tokens", false, 0), secret("tls", true, 0)];
    let plan = decide_cluster(&obs, now());
    assert!(plan.add_finalizer);
    assert_eq!(
        plan.protect_secrets,
        ["tokens"],
        "the already protected Secret is left alone"
    );
    assert!(plan.release_secrets.is_empty() && !plan.remove_finalizer);
    // A Secret that does not exist cannot be protected (the cluster reports it missing instead).
    obs.credential_secrets = vec![CredentialSecret {
        exists: false,
        ..secret("tokens", false, 0)
    }];
    assert!(
        !decide_cluster(&obs, now())
            .protect_secrets
            .contains(&("tokens".into()))
    );
}

#[test]
fn a_deleted_cluster_waits_for_its_machines_then_releases_everything() {
    let mut obs = observed_cluster();
    deleting(&mut obs);
    obs.credential_secrets = vec![secret("tokens", true, 0), secret("shared", true, 1)];
    obs.machines = vec!["demo-md-1".into(), "demo-cp-0".into()];
    let plan = decide_cluster(&obs, now());
    let message = expect_condition(
        condition(&plan, "Ready"),
        ("False", reasons::WAITING_FOR_MACHINES),
    );
    assert!(
        message.contains("2 MicrovmMachine(s)") && message.contains("demo-cp-0, demo-md-1"),
        "{message}"
    );
    assert!(
        !plan.remove_finalizer && plan.release_secrets.is_empty(),
        "nothing is released while a machine may still need the hosts: {:?}",
        plan
    );
    assert!(matches!(plan.requeue, Requeue::After(_)));

    obs.machines.clear();
    let plan = decide_cluster(&obs, now());
    assert_eq!(
        (
            plan.release_secrets.as_slice(),
            plan.remove_finalizer,
            plan.add_finalizer,
            plan.protect_secrets.as_slice()
        ),
        (
            ["tokens".to_string()].as_slice(),
            true,
            false,
            [].as_slice()
        ),
        "a Secret another MicrovmCluster still names stays protected"
    );
}

#[test]
fn a_deleted_cluster_without_its_finalizer_or_paused_does_nothing() {
    let mut obs = observed_cluster();
    deleting(&mut obs);
    obs.microvm_cluster.metadata.finalizers = None;
    assert!(decide_cluster(&obs, now()).has_no_effects());

    let mut obs = observed_cluster();
    deleting(&mut obs);
    obs.owner.as_mut().unwrap().paused = true;
    assert!(decide_cluster(&obs, now()).has_no_effects());
}

#[test]
fn unclaimed_protected_secrets_are_released() {
    let mut obs = observed_cluster();
    obs.protected_secrets = vec!["old-tokens".into()];
    assert!(
        decide_cluster(&obs, now())
            .release_secrets
            .contains(&("old-tokens".into()))
    );
}

/// A protected Secret is released only when no MicrovmCluster the operator sees names it, and only
/// when it sees them all (behind a watch filter another operator's clusters may name it).
#[test]
fn protected_secrets_someone_may_name_stay_protected() {
    let mut obs = observed_cluster();
    obs.credential_secrets = vec![CredentialSecret {
        name: "own-tokens".into(),
        exists: true,
        protected: true,
        other_users: 0,
    }];
    obs.named_by_others = ["their-tokens".to_string()].into();
    obs.protected_secrets = vec!["own-tokens".into(), "their-tokens".into(), "old".into()];
    assert_eq!(decide_cluster(&obs, now()).release_secrets, ["old"]);

    obs.sees_every_cluster = false;
    assert!(decide_cluster(&obs, now()).release_secrets.is_empty());
}

#[test]
fn missing_credentials_make_the_cluster_not_ready_with_a_warning() {
    let mut obs = observed_cluster();
    for h in HOSTS {
        obs.hosts.get_mut(h).unwrap().credentials_problem =
            Some("basic-auth Secret \"tokens\" not found".into());
    }
    let plan = decide_cluster(&obs, now());
    let message = expect_condition(
        condition(&plan, "Ready"),
        ("False", reasons::MISSING_CREDENTIALS),
    );
    assert!(
        message.contains("cannot call 3 of 3 hosts") && message.contains("\"tokens\" not found"),
        "{message}"
    );
    assert_eq!(
        condition(&plan, "HostsReachable").1,
        reasons::MISSING_CREDENTIALS
    );
    assert_eq!(warnings(&plan), ["MissingCredentials"]);

    // Once: the same problem seen again is not a new event.
    obs.microvm_cluster.status = plan.status.clone();
    assert!(warnings(&decide_cluster(&obs, later())).is_empty());

    // Fixed: Ready again, with a Normal event marking the recovery.
    obs.hosts = reachable_hosts();
    let plan = decide_cluster(&obs, later());
    assert_eq!(condition(&plan, "Ready").0, "True");
    assert_eq!(
        plan.events
            .iter()
            .map(|e| (e.kind, e.reason))
            .collect::<Vec<_>>(),
        [(EventKind::Normal, "ClusterReady")]
    );
}

#[test]
fn a_refused_token_is_an_authentication_failure_not_unreachable() {
    let mut obs = observed_cluster();
    obs.hosts.get_mut(HOSTS[0]).unwrap().reachability =
        Reachability::Refused("host refused the credentials: invalid token".into());
    let plan = decide_cluster(&obs, now());
    let message = expect_condition(
        condition(&plan, "Ready"),
        ("False", reasons::HOST_AUTHENTICATION_FAILED),
    );
    assert!(
        message.contains("1 of 3 hosts refused the credentials")
            && message.contains("host-a (10.0.0.1:9090)"),
        "{message}"
    );
    assert!(!message.contains("unreachable"), "{message}");
    assert_eq!(warnings(&plan), ["HostAuthenticationFailed"]);
}

fn orphan(uid: &str, machine_uid: &str) -> HostedVm {
    HostedVm {
        host: HOSTS[1].into(),
        vm: ObservedVm {
            uid: uid.into(),
            namespace: "default".into(),
            name: "demo-md-x".into(),
            state: VmState::Created,
            retry: 0,
            machine_uid: Some(machine_uid.into()),
            cluster: None,
            running: None,
        },
    }
}

fn made_by(cluster: Option<&str>, hosted: HostedVm) -> HostedVm {
    HostedVm {
        vm: ObservedVm {
            cluster: cluster.map(str::to_string),
            ..hosted.vm
        },
        ..hosted
    }
}

/// Two Clusters of a namespace share host 10.0.0.2:9090. A microVM left there is reported once, by
/// the cluster its meta-data names; one whose meta-data names no cluster of the host (made before
/// the name was written, or by a cluster gone since) by each, saying the host is shared.
#[test]
fn an_orphan_on_a_shared_host_is_reported_by_the_cluster_that_made_it() {
    let mut obs = observed_cluster();
    obs.shared_hosts = [(HOSTS[1].to_string(), ["beta".to_string()].into())].into();
    obs.microvms = vec![
        made_by(Some("demo"), orphan("01A", "gone-a")),
        made_by(Some("beta"), orphan("01B", "gone-b")),
        made_by(None, orphan("01C", "gone-c")),
        made_by(Some("long-gone"), orphan("01D", "gone-d")),
    ];
    let reported: Vec<(&str, Vec<&str>)> = cluster::orphans(&obs)
        .into_iter()
        .map(|o| (o.hosted.vm.uid.as_str(), o.shared_with))
        .collect();
    assert_eq!(
        reported,
        [
            ("01A", vec![]),
            ("01C", vec!["beta"]),
            ("01D", vec!["beta"]),
        ],
        "beta's own microVM is beta's to report"
    );
    let (_, _, message) = condition(&decide_cluster(&obs, now()), "OrphanedMicrovms");
    assert!(!message.contains("01B"), "{message}");
    assert!(
        message.contains("uid 01C) on host 10.0.0.2:9090 (a host shared with Cluster(s) beta, which report it too: its meta-data does not say which cluster made it)"),
        "{message}"
    );
    assert!(
        message
            .contains("its meta-data names Cluster \"long-gone\", which no longer lists that host"),
        "{message}"
    );
    // Not shared: what this cluster's machines made is reported without a note.
    assert!(
        !message.contains("uid 01A) on host 10.0.0.2:9090 (a host"),
        "{message}"
    );
}

#[test]
fn microvms_of_machines_that_no_longer_exist_are_reported_never_deleted() {
    let mut obs = observed_cluster();
    obs.known_machine_uids = [MACHINE_UID.to_string()].into();
    obs.microvms = vec![
        // Belongs to a machine that exists.
        orphan("01A", MACHINE_UID),
        // Left behind.
        orphan("01B", "gone-uid"),
        // Not ours: another namespace's, no machine uid, being deleted.
        HostedVm {
            vm: ObservedVm {
                namespace: "other".into(),
                ..orphan("01C", "gone-uid").vm
            },
            ..orphan("01C", "gone-uid")
        },
        HostedVm {
            vm: ObservedVm {
                machine_uid: None,
                ..orphan("01D", "x").vm
            },
            ..orphan("01D", "x")
        },
        HostedVm {
            vm: ObservedVm {
                state: VmState::Deleting,
                ..orphan("01E", "gone-uid").vm
            },
            ..orphan("01E", "gone-uid")
        },
    ];
    let plan = decide_cluster(&obs, now());
    let message = expect_condition(
        condition(&plan, "OrphanedMicrovms"),
        ("True", reasons::ORPHANED_MICROVMS_FOUND),
    );
    assert!(
        message.contains("uid 01B") && message.contains("10.0.0.2:9090"),
        "{message}"
    );
    for other in ["01A", "01C", "01D", "01E"] {
        assert!(!message.contains(other), "{other} is no orphan: {message}");
    }
    assert_eq!(warnings(&plan), ["OrphanedMicrovm"]);
    assert!(!plan.remove_finalizer, "an orphan is reported only");
    assert_eq!(
        cluster::orphans(&obs)
            .iter()
            .map(|o| o.hosted.vm.uid.as_str())
            .collect::<Vec<_>>(),
        ["01B"]
    );

    // Reported once; a new orphan gets its own event.
    obs.microvm_cluster.status = plan.status.clone();
    assert!(warnings(&decide_cluster(&obs, later())).is_empty());
    obs.microvms.push(orphan("01F", "gone-too"));
    assert_eq!(
        warnings(&decide_cluster(&obs, later())),
        ["OrphanedMicrovm"]
    );

    // Cleaned up: the condition clears.
    obs.microvms.clear();
    assert_eq!(
        condition(&decide_cluster(&obs, later()), "OrphanedMicrovms").0,
        "False"
    );
}
