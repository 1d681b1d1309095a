//! ClusterClass on the real stack (CAPI core with its ClusterTopology feature gate): the
//! `clusterclass` flavor rendered by the real clusterctl from a provider repository as users have
//! it, applied with the real kubectl; CAPI's topology controller makes the cluster; a variable
//! change rolls exactly the workers it concerns; replicas in the topology scale microVMs; the
//! Cluster's deletion leaves no microVM. The KubeadmControlPlane is the stand-in, as in every
//! real-stack test.
//!
//! Needs the upstream binaries (`hack/upstream.sh build`): under CI a missing one fails the test,
//! locally the test is reported as skipped.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod real_support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use capmvm_api::MicrovmMachineTemplate;
use capmvm_flintlock::Method;
use capmvm_sim::real::{BINARIES, RealStack};
use capmvm_sim::stack::{self, Stack};
use capmvm_sim::world::{template_variables, wait_for};
use capmvm_upstream::Binaries;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::{Api, ResourceExt};
use real_support::{
    POLL, WAIT, assert_no_forbidden, live_vms, options, wait_no_vms_in, wait_ready_with_nodes,
};
use serde_json::{Value, json};

const CLASS: &str = include_str!("../../templates/clusterclass-microvm.yaml");
const FLAVOR: &str = include_str!("../../templates/cluster-template-clusterclass.yaml");
const METADATA: &str = include_str!("../../metadata.yaml");

/// Our components, metadata and the flavor in a local provider repository, clusterctl's layout
/// (`infrastructure-microvm/<version>/`), and clusterctl's configuration naming it, as the README
/// tells a user to set it up.
fn provider_repository(real: &RealStack) {
    let version = capmvm_sim::real::components::VERSION;
    let dir = real
        .dir
        .join("repository/infrastructure-microvm")
        .join(version);
    std::fs::create_dir_all(&dir).unwrap();
    for (file, text) in [
        (
            "infrastructure-components.yaml",
            capmvm_sim::real::components::COMPONENTS,
        ),
        ("metadata.yaml", METADATA),
        ("cluster-template-clusterclass.yaml", FLAVOR),
        ("clusterclass-microvm.yaml", CLASS),
    ] {
        std::fs::write(dir.join(file), text).unwrap();
    }
    let config = format!(
        "providers:\n  - name: microvm\n    url: file://{}/infrastructure-components.yaml\n    type: InfrastructureProvider\n",
        dir.display()
    );
    std::fs::write(real.clusterctl.config_file(), config).unwrap();
}

fn cluster_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Cluster"),
        "clusters",
    )
}

/// Each role's MicrovmMachines by name: `control-plane`, `worker` (the MachineDeployment) or
/// `pool`, read from the CAPI Machine whose infrastructureRef names it.
async fn roles(real: &RealStack, ns: &str) -> BTreeMap<String, &'static str> {
    let machines = Api::<DynamicObject>::namespaced_with(
        real.client.clone(),
        ns,
        &ApiResource::erase::<capmvm_api::capi::Machine>(&()),
    )
    .list(&ListParams::default())
    .await
    .unwrap()
    .items;
    machines
        .iter()
        .map(|m| {
            let labels = m.labels();
            let role = if labels.contains_key("cluster.x-k8s.io/control-plane") {
                "control-plane"
            } else if labels.contains_key("cluster.x-k8s.io/deployment-name") {
                "worker"
            } else {
                "pool"
            };
            let infra = m
                .data
                .pointer("/spec/infrastructureRef/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            (infra, role)
        })
        .collect()
}

/// The live microVMs of `ns` by role: (uid, memory in MiB).
async fn vms_by_role(
    real: &RealStack,
    ns: &str,
) -> BTreeMap<&'static str, BTreeSet<(String, i32)>> {
    let roles = roles(real, ns).await;
    let memory: BTreeMap<String, i32> = real
        .all_vms()
        .into_iter()
        .map(|(_, vm)| (vm.uid().to_string(), vm.microvm.spec.memory_mb))
        .collect();
    let mut out: BTreeMap<&'static str, BTreeSet<(String, i32)>> = BTreeMap::new();
    for (_, uid, id) in live_vms(real) {
        let Some(name) = id.strip_prefix(&format!("{ns}/")) else {
            continue;
        };
        let role = roles.get(name).copied().unwrap_or("unknown");
        let mem = memory.get(&uid).copied().unwrap_or_default();
        out.entry(role).or_default().insert((uid, mem));
    }
    out
}

/// A JSON patch of the Cluster's `spec.topology` with the real kubectl, as a user edits it.
async fn patch_topology(real: &RealStack, ns: &str, name: &str, patch: Value) {
    real.kubectl
        .run(&[
            "patch",
            "cluster",
            name,
            "-n",
            ns,
            "--type=json",
            "-p",
            &patch.to_string(),
        ])
        .await
        .unwrap();
}

/// The index of variable `name` in the Cluster's `spec.topology.variables`.
async fn variable_index(real: &RealStack, ns: &str, cluster: &str, name: &str) -> usize {
    let c = Api::<DynamicObject>::namespaced_with(real.client.clone(), ns, &cluster_resource())
        .get(cluster)
        .await
        .unwrap();
    c.data
        .pointer("/spec/topology/variables")
        .and_then(Value::as_array)
        .and_then(|vs| vs.iter().position(|v| v["name"] == name))
        .unwrap_or_else(|| panic!("no variable {name} in the topology"))
}

/// The MicrovmMachineTemplate the cluster's MachineDeployment points at.
async fn worker_template(real: &RealStack, ns: &str) -> Option<String> {
    let md = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "MachineDeployment"),
        "machinedeployments",
    );
    let mds = Api::<DynamicObject>::namespaced_with(real.client.clone(), ns, &md)
        .list(&ListParams::default())
        .await
        .ok()?
        .items;
    mds.first()?
        .data
        .pointer("/spec/template/spec/infrastructureRef/name")
        .and_then(Value::as_str)
        .map(String::from)
}

/// A Cluster of the `clusterclass` flavor, rendered by the real clusterctl with `--flavor
/// clusterclass` from a provider repository (the ClusterClass added because the namespace has
/// none), becomes Ready with Nodes; a new `workerMemoryMb` rolls the MachineDeployment onto a new
/// MicrovmMachineTemplate and replaces exactly its microVMs; replicas in the topology scale the
/// workers and the pool; the templates refuse edits but let the topology controller's dry runs
/// through; deleting the Cluster leaves no microVM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_from_the_clusterclass_rolls_scales_and_deletes_on_real_capi() {
    const TEST: &str = "a_cluster_from_the_clusterclass_rolls_scales_and_deletes_on_real_capi";
    if Binaries::for_test(TEST, BINARIES).is_none() {
        return;
    }
    let started = Instant::now();
    let mut real = RealStack::start(options()).await.unwrap();
    real.start_operator(&[]).unwrap();
    let stack_up = started.elapsed();
    let (ns, name) = ("default", "topo");
    let vip = real.prepare_cluster(ns, name).await.unwrap();
    provider_repository(&real);

    // clusterctl: the flavor's required variables, then the cluster rendered with the class.
    let listed = real
        .clusterctl
        .run(
            &[
                "generate",
                "cluster",
                name,
                "--infrastructure",
                "microvm:v0.1.0",
                "--flavor",
                "clusterclass",
                "--target-namespace",
                ns,
                "--list-variables",
            ],
            &[],
        )
        .await
        .unwrap();
    let required: BTreeSet<&str> = listed
        .split("Optional Variables:")
        .next()
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- "))
        .map(str::trim)
        .collect();
    assert_eq!(
        required,
        BTreeSet::from(["CONTROL_PLANE_VIP", "FLINTLOCK_HOSTS", "SSH_PUBLIC_KEY"]),
        "{listed}"
    );
    let mut vars = template_variables(&real.endpoints());
    vars.insert("CONTROL_PLANE_VIP".into(), vip.to_string());
    vars.insert("POOL_MACHINE_COUNT".into(), "2".into());
    let vars: Vec<(String, String)> = vars.into_iter().collect();
    let kubeconfig = real.kubeconfig().display().to_string();
    let rendered = real
        .clusterctl
        .run(
            &[
                "generate",
                "cluster",
                name,
                "--infrastructure",
                "microvm:v0.1.0",
                "--flavor",
                "clusterclass",
                "--target-namespace",
                ns,
                "--kubeconfig",
                &kubeconfig,
                "--control-plane-machine-count",
                "1",
                "--worker-machine-count",
                "2",
            ],
            &vars,
        )
        .await
        .unwrap();
    let objects = capmvm_sim::manifest::parse(&rendered).unwrap();
    let kinds: BTreeSet<String> = objects
        .iter()
        .filter_map(|o| o.types.as_ref().map(|t| t.kind.clone()))
        .collect();
    for kind in [
        "ClusterClass",
        "MicrovmClusterTemplate",
        "MicrovmMachineTemplate",
        "MicrovmMachinePoolTemplate",
        "KubeadmControlPlaneTemplate",
        "KubeadmConfigTemplate",
        "Cluster",
    ] {
        assert!(kinds.contains(kind), "{kind} rendered: {kinds:?}");
    }
    assert!(
        objects.iter().all(|o| o.namespace().as_deref() == Some(ns)),
        "every object in the target namespace"
    );
    real.kubectl.apply(&rendered, &[]).await.unwrap();

    // Ready with Nodes: 1 control plane, 2 workers, 2 pool instances, all made by the topology.
    let applied = Instant::now();
    wait_ready_with_nodes(&real, ns, name, 5).await;
    let to_ready = applied.elapsed();
    let before = vms_by_role(&real, ns).await;
    assert_eq!(
        before
            .iter()
            .map(|(r, v)| (*r, v.len()))
            .collect::<Vec<_>>(),
        vec![("control-plane", 1), ("pool", 2), ("worker", 2)],
        "{before:?}"
    );
    assert!(
        before.values().flatten().all(|(_, mem)| *mem == 2048),
        "every microVM has the class's default memory: {before:?}"
    );
    let mc = Api::<capmvm_api::MicrovmCluster>::namespaced(real.client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert_eq!(mc.len(), 1);
    let spec = &mc[0].spec;
    assert_eq!(
        spec.control_plane_endpoint
            .as_ref()
            .and_then(|e| e.host.clone()),
        Some(vip.to_string()),
        "the VIP variable patched into the MicrovmCluster"
    );
    let hosts: Vec<&str> = spec
        .placement
        .static_pool
        .as_ref()
        .unwrap()
        .hosts
        .iter()
        .map(|h| h.endpoint.as_str())
        .collect();
    assert_eq!(hosts, real.endpoints(), "the hosts variable");

    // The templates are immutable, but the topology controller's dry run goes through.
    let old_template = worker_template(&real, ns).await.unwrap();
    let edit = json!({"spec": {"template": {"spec": {"memoryMb": 4096}}}}).to_string();
    let refused = real
        .kubectl
        .run(&[
            "patch",
            "microvmmachinetemplate",
            &old_template,
            "-n",
            ns,
            "--type=merge",
            "-p",
            &edit,
        ])
        .await
        .expect_err("a template's spec.template is immutable")
        .to_string();
    assert!(refused.contains("is immutable"), "{refused}");
    let dry_run = json!({
        "metadata": {"annotations": {capmvm_api::template::TOPOLOGY_DRY_RUN_ANNOTATION: ""}},
        "spec": {"template": {"spec": {"memoryMb": 4096}}},
    })
    .to_string();
    real.kubectl
        .run(&[
            "patch",
            "microvmmachinetemplate",
            &old_template,
            "-n",
            ns,
            "--type=merge",
            "--dry-run=server",
            "-p",
            &dry_run,
        ])
        .await
        .expect("the topology controller's dry run is let through");

    // workerMemoryMb 2048 -> 3072: a new MicrovmMachineTemplate, exactly the workers replaced.
    let creates = |real: &RealStack| stack::host_calls(&real.hosts, Method::Create);
    let deletes = |real: &RealStack| stack::host_calls(&real.hosts, Method::Delete);
    let (c0, d0) = (creates(&real), deletes(&real));
    let index = variable_index(&real, ns, name, "workerMemoryMb").await;
    let rolled = Instant::now();
    patch_topology(
        &real,
        ns,
        name,
        json!([{"op": "replace", "path": format!("/spec/topology/variables/{index}/value"), "value": 3072}]),
    )
    .await;
    let new_template = wait_for(
        "the MachineDeployment on a new template",
        WAIT,
        POLL,
        || async {
            Ok(worker_template(&real, ns)
                .await
                .filter(|t| *t != old_template))
        },
    )
    .await
    .unwrap();
    let template = Api::<MicrovmMachineTemplate>::namespaced(real.client.clone(), ns)
        .get(&new_template)
        .await
        .unwrap();
    assert_eq!(template.spec.template.spec.memory_mb, 3072);
    let after = wait_for(
        "every worker at 3072 MiB, nothing else touched",
        WAIT,
        POLL,
        || async {
            let vms = vms_by_role(&real, ns).await;
            let workers = vms.get("worker").cloned().unwrap_or_default();
            let done = workers.len() == 2
                && workers.iter().all(|(_, m)| *m == 3072)
                && live_vms(&real).len() == 5;
            Ok(done.then_some(vms))
        },
    )
    .await
    .unwrap();
    wait_ready_with_nodes(&real, ns, name, 5).await;
    let roll_time = rolled.elapsed();
    assert_eq!(
        after.get("control-plane"),
        before.get("control-plane"),
        "control plane untouched"
    );
    assert_eq!(after.get("pool"), before.get("pool"), "pool untouched");
    let old_workers: BTreeSet<&String> = before["worker"].iter().map(|(u, _)| u).collect();
    assert!(
        after["worker"]
            .iter()
            .all(|(u, _)| !old_workers.contains(u)),
        "every worker replaced: {before:?} -> {after:?}"
    );
    assert_eq!(
        (creates(&real) - c0, deletes(&real) - d0),
        (2, 2),
        "exactly the two workers' microVMs created anew and deleted"
    );

    // Scaling through the topology: the MachineDeployment 2 -> 3, the MachinePool 2 -> 1.
    let (c1, d1) = (creates(&real), deletes(&real));
    patch_topology(
        &real,
        ns,
        name,
        json!([
            {"op": "replace", "path": "/spec/topology/workers/machineDeployments/0/replicas", "value": 3},
            {"op": "replace", "path": "/spec/topology/workers/machinePools/0/replicas", "value": 1},
        ]),
    )
    .await;
    wait_for("3 workers and 1 pool instance", WAIT, POLL, || async {
        let vms = vms_by_role(&real, ns).await;
        let counts: Vec<(&str, usize)> = vms.iter().map(|(r, v)| (*r, v.len())).collect();
        Ok((counts == vec![("control-plane", 1), ("pool", 1), ("worker", 3)]).then_some(()))
    })
    .await
    .unwrap();
    wait_ready_with_nodes(&real, ns, name, 5).await;
    assert_eq!(
        (creates(&real) - c1, deletes(&real) - d1),
        (1, 1),
        "one microVM created for the worker, one deleted for the pool"
    );

    // The Cluster's deletion takes everything it made with it.
    real.kubectl
        .run(&["delete", "cluster", name, "-n", ns, "--wait=false"])
        .await
        .unwrap();
    wait_no_vms_in(&real, ns).await;
    let left = wait_for("the cluster's objects gone", WAIT, POLL, || async {
        let left = real
            .kubectl
            .run(&[
                "get",
                "clusters.cluster.x-k8s.io,machines.cluster.x-k8s.io,microvmmachines,microvmclusters,microvmmachinepools",
                "-n",
                ns,
                "-o",
                "name",
            ])
            .await?;
        Ok(left.trim().is_empty().then_some(()))
    })
    .await;
    if let Err(e) = left {
        real.keep_dir();
        panic!("{e}; logs in {}", real.dir.display());
    }
    assert!(real.all_vms().is_empty(), "{:?}", live_vms(&real));
    assert_no_forbidden(&real);
    eprintln!(
        "clusterclass e2e: stack up {stack_up:?}, applied to 5 ready with Nodes {to_ready:?}, roll of 2 workers {roll_time:?}, total {:?}",
        started.elapsed()
    );
    real.shutdown().await;
}
