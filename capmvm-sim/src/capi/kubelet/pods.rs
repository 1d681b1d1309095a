//! What hollow kubelets do in a workload cluster that schedules (the real stack's: a kube-scheduler
//! and a kube-controller-manager run beside its API server):
//!
//! - **Leases**: each kubelet renews its Node's Lease in `kube-node-lease` every 10 s, as a real
//!   kubelet does; the node lifecycle controller reads them, lifts the `not-ready` taint the API
//!   server puts on every new Node, and marks a Node whose Lease goes stale `Unknown`.
//! - **Pods**: a Pod bound to one of their Nodes runs: its containers start at once (no image to
//!   pull), it gets a Pod IP from the Node's `podCIDR` (node IPAM's), and it turns `Running` and
//!   `Ready`. A Pod being deleted (by its owner, an eviction, a drain) is removed for good once its
//!   containers "stop", which is at once.
//!
//! One watch of bound Pods per workload cluster serves all its kubelets.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, ResourceExt as _};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tracing::{debug, info};

use super::KubeletControl;
use super::node::digest;
use crate::capi::workload::{ClusterKey, WorkloadClusters};

/// How often a kubelet renews its Lease (a real kubelet: a quarter of the 40 s duration).
pub(super) const LEASE_RENEW: Duration = Duration::from_secs(10);
/// The Lease's duration, as a real kubelet sets it.
const LEASE_DURATION_SECONDS: i32 = 40;
/// The namespace of Node Leases.
const LEASE_NAMESPACE: &str = "kube-node-lease";
/// How often the Pods of a cluster are looked at again without a watch event (a Pod bound before
/// its Node's kubelet was known, a failed write).
const RESYNC: Duration = Duration::from_secs(1);
/// How long a write about a Pod is not repeated while the watch has not shown its effect.
const REPEAT_AFTER: Duration = Duration::from_secs(3);

/// The Pod watchers (one per workload cluster with kubelets) and the Leases' renewal times.
#[derive(Default)]
pub(super) struct PodWorkers {
    tasks: HashMap<ClusterKey, (u64, JoinHandle<()>)>,
    renewed: HashMap<(ClusterKey, String), Instant>,
}

impl Drop for PodWorkers {
    fn drop(&mut self) {
        for (_, (_, task)) in self.tasks.drain() {
            task.abort();
        }
    }
}

impl PodWorkers {
    /// Watches the Pods of every cluster that has kubelets, stops watching the others.
    pub(super) fn sync(&mut self, control: &KubeletControl, workloads: &WorkloadClusters) {
        let clusters: BTreeSet<ClusterKey> = control
            .registered()
            .into_iter()
            .map(|n| n.cluster)
            .collect();
        self.tasks.retain(|cluster, (serial, task)| {
            let current = workloads.client_and_serial(cluster).map(|(_, s)| s);
            let keep = clusters.contains(cluster) && current == Some(*serial);
            if !keep {
                task.abort();
            }
            keep
        });
        for cluster in clusters {
            if self.tasks.contains_key(&cluster) {
                continue;
            }
            let Some((client, serial)) = workloads.client_and_serial(&cluster) else {
                continue;
            };
            let task = tokio::spawn(run_pods(
                client,
                cluster.clone(),
                control.clone(),
                workloads.clone(),
            ));
            self.tasks.insert(cluster, (serial, task));
        }
    }

    /// Renews the Lease of every registered Node whose last renewal is [`LEASE_RENEW`] old.
    pub(super) async fn renew_leases(
        &mut self,
        control: &KubeletControl,
        workloads: &WorkloadClusters,
    ) {
        let nodes = control.registered();
        let live: BTreeSet<(ClusterKey, String)> = nodes
            .iter()
            .map(|n| (n.cluster.clone(), n.node.clone()))
            .collect();
        self.renewed.retain(|k, _| live.contains(k));
        let now = Instant::now();
        for key in live {
            if self
                .renewed
                .get(&key)
                .is_some_and(|at| now.duration_since(*at) < LEASE_RENEW)
            {
                continue;
            }
            let Some(client) = workloads.client(&key.0) else {
                continue;
            };
            match renew_lease(client, &key.1).await {
                Ok(()) => {
                    self.renewed.insert(key, now);
                }
                Err(e) => {
                    debug!(node = %key.1, error = %e, "hollow kubelet: renewing the Lease failed; retrying")
                }
            }
        }
    }
}

/// Creates or renews Node `node`'s Lease (server-side apply, as the kubelet's field manager).
async fn renew_lease(client: kube::Client, node: &str) -> Result<(), kube::Error> {
    let leases: Api<Lease> = Api::namespaced(client, LEASE_NAMESPACE);
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(node.to_string()),
            namespace: Some(LEASE_NAMESPACE.to_string()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(node.to_string()),
            lease_duration_seconds: Some(LEASE_DURATION_SECONDS),
            renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            ..Default::default()
        }),
    };
    leases
        .patch(
            node,
            &PatchParams::apply("kubelet").force(),
            &Patch::Apply(&lease),
        )
        .await
        .map(|_| ())
}

/// Runs the Pods bound to the kubelets' Nodes in `cluster`, until aborted.
async fn run_pods(
    client: kube::Client,
    cluster: ClusterKey,
    control: KubeletControl,
    workloads: WorkloadClusters,
) {
    let pods: Api<Pod> = Api::all(client.clone());
    let (store, writer) = reflector::store();
    let mut events = reflector(
        writer,
        watcher(
            pods.clone(),
            watcher::Config::default().fields("spec.nodeName!="),
        ),
    )
    .default_backoff()
    .boxed();
    let mut resync = tokio::time::interval(RESYNC);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut attempts: HashMap<String, Instant> = HashMap::new();
    loop {
        tokio::select! {
            event = events.next() => {
                if event.is_none() {
                    return;
                }
            }
            _ = resync.tick() => {}
        }
        let ours: BTreeSet<String> = control
            .registered()
            .into_iter()
            .filter(|n| n.cluster == cluster && n.ready)
            .map(|n| n.node)
            .collect();
        if ours.is_empty() {
            continue;
        }
        let nodes: HashMap<String, Arc<Node>> = workloads
            .nodes(&cluster)
            .into_iter()
            .map(|n| (n.name_any(), n))
            .collect();
        sync_pods(&pods, &store, &ours, &nodes, &mut attempts).await;
    }
}

/// One pass over the bound Pods: start what should run, finish what is being deleted.
async fn sync_pods(
    pods: &Api<Pod>,
    store: &Store<Pod>,
    ours: &BTreeSet<String>,
    nodes: &HashMap<String, Arc<Node>>,
    attempts: &mut HashMap<String, Instant>,
) {
    let all = store.state();
    let now = Instant::now();
    attempts.retain(|_, at| now.duration_since(*at) < REPEAT_AFTER);
    for pod in &all {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue;
        };
        if !ours.contains(&node) {
            continue;
        }
        let uid = pod.uid().unwrap_or_default();
        if attempts.contains_key(&uid) {
            continue;
        }
        let namespaced: Api<Pod> = Api::namespaced(
            pods.clone().into_client(),
            &pod.namespace().unwrap_or_default(),
        );
        if pod.metadata.deletion_timestamp.is_some() {
            attempts.insert(uid.clone(), now);
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match namespaced.delete(&pod.name_any(), &params).await {
                Ok(_) => {
                    debug!(pod = %pod.name_any(), %node, "hollow kubelet: Pod stopped and removed")
                }
                Err(e) => {
                    debug!(pod = %pod.name_any(), error = %e, "hollow kubelet: removing a Pod failed; retrying")
                }
            }
            continue;
        }
        if is_running(pod) {
            continue;
        }
        let Some(ip) = nodes.get(&node).and_then(|n| free_pod_ip(n, &node, &all)) else {
            // No podCIDR yet (node IPAM has not reached this Node): the network is not ready.
            continue;
        };
        attempts.insert(uid, now);
        match namespaced
            .patch_status(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Merge(running_status(pod, ip)),
            )
            .await
        {
            Ok(_) => {
                info!(pod = %pod.name_any(), %node, %ip, "hollow kubelet: Pod running")
            }
            Err(e) => {
                debug!(pod = %pod.name_any(), error = %e, "hollow kubelet: updating a Pod's status failed; retrying")
            }
        }
    }
}

/// Whether the Pod runs (or ran: a finished Pod is left as it is).
fn is_running(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Running" | "Succeeded" | "Failed")
    )
}

/// The lowest address of Node `node`'s `podCIDR` (a /24 or wider IPv4 range) no Pod on it holds;
/// `.0` and `.1` are left out (the network and the bridge's gateway).
fn free_pod_ip(n: &Node, node: &str, pods: &[Arc<Pod>]) -> Option<Ipv4Addr> {
    let cidr = n.spec.as_ref()?.pod_cidr.as_deref()?;
    let (base, _) = cidr.split_once('/')?;
    let base: Ipv4Addr = base.parse().ok()?;
    let taken: BTreeSet<Ipv4Addr> = pods
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .filter_map(|p| p.status.as_ref()?.pod_ip.as_deref()?.parse().ok())
        .collect();
    let base = u32::from(base);
    (2..255u32)
        .map(|i| Ipv4Addr::from(base + i))
        .find(|ip| !taken.contains(ip))
}

/// The status a kubelet reports once a Pod's containers run: `Running`, every condition True,
/// its IP, each container started and ready (init containers completed).
fn running_status(pod: &Pod, ip: Ipv4Addr) -> Value {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let uid = pod.uid().unwrap_or_default();
    let mut conditions: Vec<Value> = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.type_ == "PodScheduled")
        .filter_map(|c| serde_json::to_value(c).ok())
        .collect();
    for type_ in [
        "PodReadyToStartContainers",
        "Initialized",
        "Ready",
        "ContainersReady",
    ] {
        conditions.push(json!({"type": type_, "status": "True", "lastTransitionTime": now}));
    }
    let spec = pod.spec.clone().unwrap_or_default();
    let container_id = |name: &str| format!("containerd://{}", digest(&[&uid, name]).repeat(2));
    let containers: Vec<Value> = spec
        .containers
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "image": c.image.clone().unwrap_or_default(),
                "imageID": c.image.clone().unwrap_or_default(),
                "containerID": container_id(&c.name),
                "ready": true,
                "started": true,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            })
        })
        .collect();
    let init: Vec<Value> = spec
        .init_containers
        .unwrap_or_default()
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "image": c.image.clone().unwrap_or_default(),
                "imageID": c.image.clone().unwrap_or_default(),
                "containerID": container_id(&c.name),
                "ready": true,
                "started": false,
                "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}},
            })
        })
        .collect();
    let mut status = BTreeMap::from([
        ("phase".to_string(), json!("Running")),
        ("conditions".to_string(), json!(conditions)),
        ("podIP".to_string(), json!(ip.to_string())),
        ("podIPs".to_string(), json!([{"ip": ip.to_string()}])),
        ("startTime".to_string(), json!(now)),
        ("containerStatuses".to_string(), json!(containers)),
    ]);
    if !init.is_empty() {
        status.insert("initContainerStatuses".to_string(), json!(init));
    }
    json!({ "status": status })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::core::v1::{Container, NodeSpec, PodSpec, PodStatus};

    fn pod(name: &str, node: &str, ip: Option<&str>) -> Arc<Pod> {
        Arc::new(Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                containers: vec![Container {
                    name: "app".into(),
                    image: Some("registry.k8s.io/pause:3.10".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: Some(PodStatus {
                pod_ip: ip.map(String::from),
                ..Default::default()
            }),
        })
    }

    #[test]
    fn pod_ips_come_from_the_nodes_cidr_and_are_not_shared() {
        let node = Node {
            spec: Some(NodeSpec {
                pod_cidr: Some("10.244.3.0/24".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let pods = vec![
            pod("a", "n1", Some("10.244.3.2")),
            pod("b", "n2", Some("10.244.3.3")),
        ];
        assert_eq!(
            free_pod_ip(&node, "n1", &pods),
            Some(Ipv4Addr::new(10, 244, 3, 3)),
            "another Node's Pod does not take this Node's address"
        );
        assert_eq!(free_pod_ip(&Node::default(), "n1", &pods), None);
    }

    #[test]
    fn a_running_pod_is_ready_with_its_ip_and_containers() {
        let status = running_status(&pod("a", "n1", None), Ipv4Addr::new(10, 244, 0, 2));
        let s = &status["status"];
        assert_eq!(s["phase"], "Running");
        assert_eq!(s["podIP"], "10.244.0.2");
        assert_eq!(s["containerStatuses"][0]["name"], "app");
        assert_eq!(s["containerStatuses"][0]["ready"], true);
        assert!(
            s["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        );
    }
}
