//! What the real-stack tests share: the stack's options, and waits and checks of what a user sees.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub(crate) mod least_privilege;

use std::path::PathBuf;
use std::time::Duration;

use capmvm_api::MicrovmMachine;
use capmvm_api::capi::Machine;
use capmvm_flintlock::MicrovmState;
use capmvm_sim::real::RealStack;
use capmvm_sim::stack::Stack;
use capmvm_sim::world::{WorldOptions, wait_for};
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::{Api, ResourceExt};

/// How long a wait for machines, Nodes or deletions may take.
pub(crate) const WAIT: Duration = Duration::from_secs(180);
/// How often a wait looks.
pub(crate) const POLL: Duration = Duration::from_millis(500);

/// Three hollow hosts provisioning in 0.5 s, polled every 2 s (every 200 ms while busy).
pub(crate) fn options() -> WorldOptions {
    let mut o = WorldOptions::new(
        3,
        Duration::from_millis(500),
        PathBuf::from(env!("CARGO_BIN_EXE_capmvm-sim")),
    );
    o.operator_flags = vec![
        "--host-poll-interval=2s".into(),
        "--host-poll-interval-busy=200ms".into(),
    ];
    o
}

pub(crate) fn is_ready(m: &MicrovmMachine) -> bool {
    m.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

/// Waits until `ns` has exactly `n` MicrovmMachines, all Ready, each with a CAPI Machine of the
/// same providerID whose `status.nodeRef` names a Node with that providerID in the workload cluster.
pub(crate) async fn wait_ready_with_nodes(
    real: &RealStack,
    ns: &str,
    cluster: &str,
    n: usize,
) -> Vec<MicrovmMachine> {
    let key = capmvm_sim::capi::workload::ClusterKey::new(ns, cluster);
    let log = real.operator_log();
    wait_for(
        &format!(
            "{n} ready machines with Nodes in {ns} (operator log {})",
            log.display()
        ),
        WAIT,
        POLL,
        || async {
            let ms = Api::<MicrovmMachine>::namespaced(real.client.clone(), ns)
                .list(&ListParams::default())
                .await?
                .items;
            if ms.len() != n || !ms.iter().all(is_ready) {
                return Ok(None);
            }
            // Machines as CAPI writes them (the provider's view of a Machine leaves out nodeRef).
            let machines = Api::<DynamicObject>::namespaced_with(
                real.client.clone(),
                ns,
                &ApiResource::erase::<Machine>(&()),
            )
            .list(&ListParams::default())
            .await?
            .items;
            let all_matched = ms.iter().all(|m| {
                let Some(pid) = m.spec.provider_id.as_deref() else {
                    return false;
                };
                let node = real.workloads().node_by_provider_id(&key, pid);
                machines.iter().any(|capi| {
                    capi.data
                        .pointer("/spec/providerID")
                        .and_then(|v| v.as_str())
                        == Some(pid)
                        && node.as_ref().is_some_and(|node| {
                            capi.data
                                .pointer("/status/nodeRef/name")
                                .and_then(|v| v.as_str())
                                == Some(node.name_any().as_str())
                        })
                })
            });
            Ok(all_matched.then_some(ms))
        },
    )
    .await
    .unwrap()
}

/// The microVMs on the hosts that are not being deleted: (host, uid, namespace/name).
pub(crate) fn live_vms(real: &RealStack) -> Vec<(String, String, String)> {
    real.all_vms()
        .into_iter()
        .filter(|(_, vm)| vm.state() != MicrovmState::Deleting)
        .map(|(h, vm)| {
            let id = format!("{}/{}", vm.microvm.spec.namespace, vm.microvm.spec.id);
            (h, vm.uid().to_string(), id)
        })
        .collect()
}

/// Waits until no microVM of namespace `ns` is left on any host.
pub(crate) async fn wait_no_vms_in(real: &RealStack, ns: &str) {
    wait_for(
        &format!("every microVM of {ns} gone"),
        WAIT,
        POLL,
        || async {
            let left: Vec<_> = real
                .all_vms()
                .into_iter()
                .filter(|(_, vm)| vm.microvm.spec.namespace == ns)
                .collect();
            Ok(left.is_empty().then_some(()))
        },
    )
    .await
    .unwrap();
}

/// No request of our ServiceAccount was refused by RBAC in the whole run.
pub(crate) fn assert_no_forbidden(real: &RealStack) {
    let audit = real.audit().expect("the management API keeps an audit log");
    let forbidden = audit.forbidden_for(&RealStack::operator_user()).unwrap();
    let requests = audit.counts_for(&RealStack::operator_user()).unwrap();
    assert!(
        requests.requests > 0,
        "the audit log holds the operator's requests"
    );
    assert!(
        forbidden.is_empty(),
        "403s for our ServiceAccount: {:?}",
        forbidden
            .iter()
            .map(|e| format!("{} {}", e.verb, e.request_uri))
            .collect::<Vec<_>>()
    );
}
