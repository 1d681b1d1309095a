//! The real cluster-autoscaler (1.36.1, `--cloud-provider=clusterapi`, as its own ServiceAccount
//! under the ClusterRole our components ship) drives microVM pools on ONE shared real stack:
//!
//! 1. scale from zero on a MachineDeployment (our template's `status.capacity` alone): 5 Pods,
//!    exactly 3 microVMs, all Pods Running;
//! 2. scale from zero on a MachinePool (the MicrovmMachinePool's own status), the MachineDeployment
//!    held at its max: 4 more Pods, exactly 2 instances;
//! 3. max size holds: 2 Pods stay Pending, the Pod's `NotTriggerScaleUp` event and the status
//!    ConfigMap say why;
//! 4. scale down by Node: the autoscaler marks Machines with `delete-machine`, and exactly those
//!    microVMs go;
//! 5. a microVM that never registers a Node is a failed scale-up after
//!    `--max-node-provision-time`, removed, and the group recovers;
//! 6. the autoscaler's log holds no error about our objects, and RBAC refused it nothing.
//!
//! Then, beside the autoscaler's story, what the workload cluster shows a user: the Pods Running
//! with Pod IPs from their Node's `podCIDR`, Nodes without the `not-ready` taint, and the
//! namespace's `default` ServiceAccount (a kube-controller-manager runs).
//!
//! Needs the upstream binaries with cluster-autoscaler (`hack/upstream.sh build`): under CI a
//! missing one fails the test, locally the test is reported as skipped.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use capmvm_sim::autoscale::scenarios::{CLUSTER, NAMESPACE};
use capmvm_sim::autoscale::{self, AutoscaleArgs};
use capmvm_sim::capi::workload::ClusterKey;
use capmvm_sim::real::RealStack;
use capmvm_sim::stack::Stack as _;
use capmvm_upstream::Binaries;
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::Api;
use kube::api::ListParams;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cluster_autoscaler_drives_microvm_pools() {
    let Some(_) = Binaries::for_test(
        "the_cluster_autoscaler_drives_microvm_pools",
        &autoscale::binaries(),
    ) else {
        return;
    };
    let args = AutoscaleArgs::defaults();
    let mut real = RealStack::start(autoscale::stack_options(
        &args,
        PathBuf::from(env!("CARGO_BIN_EXE_capmvm-sim")),
    ))
    .await
    .expect("the real stack starts");
    real.start_operator(&[]).expect("the operator starts");
    let report = autoscale::run_on(&mut real, &args, false).await;
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            real.keep_dir();
            panic!("the run failed: {e:#}; logs in {}", real.dir.display());
        }
    };
    autoscale::summary(&report);
    let mut failed = Vec::new();
    for o in &report.outcomes {
        if !o.held {
            failed.push(format!("{}: {}", o.name, o.detail));
        }
    }
    if let Some(why) = &report.stopped {
        failed.push(format!("stopped: {why}"));
    }
    if report.outcomes.len() < 6 {
        failed.push(format!("only {} of 6 scenarios ran", report.outcomes.len()));
    }

    // What kubectl shows in the workload cluster after the run: 6 Pods Running, each with an IP
    // of its Node's podCIDR; no Node keeps the not-ready taint; `default` has its ServiceAccount.
    let workload = real
        .workloads()
        .client(&ClusterKey::new(NAMESPACE, CLUSTER))
        .unwrap();
    let pods = Api::<Pod>::namespaced(workload.clone(), NAMESPACE)
        .list(&ListParams::default().labels("app=load"))
        .await
        .unwrap()
        .items;
    let nodes = Api::<Node>::all(workload.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let running: Vec<&Pod> = pods
        .iter()
        .filter(|p| autoscale::observe::is_running(p))
        .collect();
    if running.len() != 6 {
        failed.push(format!(
            "{} of the load's Pods Running, 6 expected",
            running.len()
        ));
    }
    for p in &running {
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap();
        let cidr = nodes
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(node.as_str()))
            .and_then(|n| n.spec.as_ref()?.pod_cidr.clone())
            .unwrap_or_default();
        let ip = p.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap();
        let prefix = cidr.trim_end_matches("0/24");
        if cidr.is_empty() || !ip.starts_with(prefix) {
            failed.push(format!(
                "Pod IP {ip} on {node} is not in its podCIDR {cidr:?}"
            ));
        }
    }
    for n in &nodes {
        let tainted = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| ts.iter().any(|t| t.key == "node.kubernetes.io/not-ready"));
        if tainted {
            failed.push(format!("{:?} keeps the not-ready taint", n.metadata.name));
        }
    }
    let default_sa = Api::<ServiceAccount>::namespaced(workload, NAMESPACE)
        .get_opt("default")
        .await
        .unwrap();
    if default_sa.is_none() {
        failed.push("no default ServiceAccount in the workload cluster".to_string());
    }
    if !failed.is_empty() {
        real.keep_dir();
        eprintln!("logs kept in {}", real.dir.display());
    }
    real.shutdown().await;
    assert!(failed.is_empty(), "{failed:#?}");
}
