//! End to end on the real stack: etcd, kube-apiserver and kube-controller-manager, Cluster API
//! v1.14's own core and kubeadm bootstrap managers, our components rendered by the real clusterctl
//! and applied with the real kubectl, the operator as its ServiceAccount, hollow flintlock hosts.
//! Each test asserts what a user sees, and that the API server's audit log holds no 403 for our
//! ServiceAccount.
//!
//! Needs the upstream binaries (`hack/upstream.sh build`): under CI a missing one fails the test,
//! locally the test is reported as skipped.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../real_support/mod.rs"]
mod real_support;

mod deletions;
mod evacuation;
mod moves;
mod pools;
mod shards;

use std::collections::BTreeSet;
use std::time::Duration;

use capmvm_api::MicrovmMachine;
use capmvm_api::capi::Machine;
use capmvm_api::keys::{DELETE_MACHINE_ANNOTATION, POOL_NAME_LABEL};
use capmvm_flintlock::Method;
use capmvm_sim::real::components;
use capmvm_sim::real::{BINARIES, RealStack};
use capmvm_sim::stack::{self, Stack};
use capmvm_sim::world::HostAuth;
use capmvm_sim::world::{DEMO_CLUSTER, MACHINEPOOL_CLUSTER, wait_for};
use capmvm_upstream::Binaries;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use real_support::least_privilege::{self, SecretNames};
use real_support::{
    POLL, WAIT, assert_no_forbidden, live_vms, options, wait_no_vms_in, wait_ready_with_nodes,
};
use serde_json::json;

/// One real stack at a time: each is an etcd, two kube-apiservers and four controllers, and the
/// machine has two cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A real stack with its operator running, or `None` (the test skipped) without the binaries.
async fn real_stack(test: &str) -> Option<RealStack> {
    Binaries::for_test(test, BINARIES)?;
    let mut real = RealStack::start(options())
        .await
        .expect("the real stack starts");
    real.start_operator(&[]).expect("the operator starts");
    Some(real)
}

/// Applies the demo template (and the pool flavor's pool when `pool` > 0) for Cluster `ns/name`.
async fn apply_cluster(
    real: &mut RealStack,
    ns: &str,
    name: &str,
    control_planes: usize,
    workers: usize,
    pool: usize,
) {
    apply_cluster_with(real, ns, name, [control_planes, workers, pool], |_| {}).await;
}

/// [`apply_cluster`] with `[control planes, workers, pool]`, the hosts' credentials (when they
/// need any) created and named in the MicrovmCluster, and `edit` applied to both templates' objects.
async fn apply_cluster_with(
    real: &mut RealStack,
    ns: &str,
    name: &str,
    [control_planes, workers, pool]: [usize; 3],
    edit: impl Fn(&mut Vec<DynamicObject>),
) {
    let vip = real.prepare_cluster(ns, name).await.unwrap();
    let credentials = stack::create_credentials(&*real, ns, name).await.unwrap();
    let vars = |workers: usize| {
        vec![
            ("CLUSTER_NAME", name.to_string()),
            ("NAMESPACE", ns.to_string()),
            ("CONTROL_PLANE_VIP", vip.to_string()),
            ("CONTROL_PLANE_MACHINE_COUNT", control_planes.to_string()),
            ("WORKER_MACHINE_COUNT", workers.to_string()),
        ]
    };
    stack::apply_template(&*real, DEMO_CLUSTER, &vars(workers), |objects| {
        stack::use_credentials(objects, &credentials);
        edit(objects)
    })
    .await
    .unwrap();
    if pool > 0 {
        stack::apply_template(&*real, MACHINEPOOL_CLUSTER, &vars(pool), |objects| {
            objects.retain(|o| {
                o.types.as_ref().is_some_and(|t| {
                    matches!(
                        t.kind.as_str(),
                        "MachinePool" | "MicrovmMachinePool" | "KubeadmConfig"
                    )
                })
            });
            edit(objects)
        })
        .await
        .unwrap();
    }
}

async fn machines_in(real: &RealStack, ns: &str) -> Vec<Machine> {
    Api::<Machine>::namespaced(real.client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
}

/// The kinds a cluster's deletion must leave none of in its namespace.
const CLUSTER_KINDS: &str =
    "clusters.cluster.x-k8s.io,machines.cluster.x-k8s.io,microvmmachines,microvmclusters";

/// `kubectl get` of [`CLUSTER_KINDS`] in `ns`, as `output` (`name`, `yaml`).
async fn cluster_objects(real: &RealStack, ns: &str, output: &str) -> anyhow::Result<String> {
    Ok(real
        .kubectl
        .run(&["get", CLUSTER_KINDS, "-n", ns, "-o", output])
        .await?)
}

/// Waits until `ns` holds none of [`CLUSTER_KINDS`]: every finalizer released.
async fn wait_cluster_objects_gone(real: &RealStack, ns: &str) -> anyhow::Result<()> {
    wait_for(
        &format!("{ns}'s cluster objects gone"),
        WAIT,
        POLL,
        || async {
            let left = cluster_objects(real, ns, "name").await?;
            Ok(left.trim().is_empty().then_some(()))
        },
    )
    .await
}
