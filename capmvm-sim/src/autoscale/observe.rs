//! What the autoscale run watches, as a user would with kubectl: the node groups (their min/max
//! annotations and replicas), their Nodes and microVMs, the load's Pods, and which Machines the
//! autoscaler marked for deletion; shown as a live table.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{IsTerminal as _, Write as _};
use std::time::{Duration, Instant};

use anyhow::bail;
use capmvm_api::MicrovmMachine;
use capmvm_api::keys::DELETE_MACHINE_ANNOTATION;
use capmvm_flintlock::MicrovmState;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::core::GroupVersionKind;
use kube::{Api, ResourceExt as _};

use crate::capi::machinepool::machine_pool_resource;
use crate::capi::workload::ClusterKey;
use crate::demo::group_of;
use crate::real::RealStack;
use crate::stack::Stack as _;

/// CAPI's annotation of a node group's minimum size.
pub const MIN_SIZE: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size";
/// CAPI's annotation of a node group's maximum size.
pub const MAX_SIZE: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size";
/// A node group's own `--max-node-provision-time` (the clusterapi provider's per-group
/// autoscaling options, read from the scalable resource's annotations on every loop).
pub const MAX_PROVISION_TIME: &str = "cluster.x-k8s.io/autoscaling-options-maxnodeprovisiontime";
/// The label of the load's Pods.
pub const LOAD_LABEL: (&str, &str) = ("app", "load");

/// `MachineDeployment` (cluster.x-k8s.io/v1beta2).
pub fn machine_deployment_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "MachineDeployment"),
        "machinedeployments",
    )
}

/// `Machine` (cluster.x-k8s.io/v1beta2).
fn machine_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Machine"),
        "machines",
    )
}

/// One group of machines: a MachineDeployment, a MachinePool or the control plane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// `md/<name>`, `mp/<name>` or `control-plane`.
    pub key: String,
    /// Its min-size annotation (none: not a node group).
    pub min: Option<i64>,
    /// Its max-size annotation.
    pub max: Option<i64>,
    /// `spec.replicas`.
    pub replicas: i64,
    /// Its Ready Nodes.
    pub nodes: usize,
    /// Its microVMs on the hosts (not being deleted).
    pub vms: usize,
}

/// The load's Pods.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pods {
    /// Not yet running (unscheduled, or bound and not started).
    pub pending: usize,
    /// Running and Ready, with a Pod IP.
    pub running: usize,
}

/// One look at everything.
#[derive(Clone, Debug)]
pub struct Observed {
    /// By key.
    pub groups: BTreeMap<String, Group>,
    /// The load's Pods.
    pub pods: Pods,
    /// Every microVM not being deleted: uid -> (MicrovmMachine name, group key).
    pub vms: BTreeMap<String, (String, String)>,
}

impl Observed {
    /// The group `key` (an empty one when absent).
    pub fn group(&self, key: &str) -> Group {
        self.groups.get(key).cloned().unwrap_or(Group {
            key: key.to_string(),
            min: None,
            max: None,
            replicas: 0,
            nodes: 0,
            vms: 0,
        })
    }

    /// The uids of the microVMs of group `key`.
    pub fn vms_of(&self, key: &str) -> BTreeSet<String> {
        self.vms
            .iter()
            .filter(|(_, (_, g))| g == key)
            .map(|(u, _)| u.clone())
            .collect()
    }
}

/// Watches the run: observations, the table, and what was seen along the way.
pub struct Watch<'a> {
    /// The stack.
    pub real: &'a RealStack,
    /// The autoscaled Cluster.
    pub cluster: ClusterKey,
    /// An administrator's client of its workload API.
    pub workload: kube::Client,
    /// Print the table (the command) or not (the test).
    pub show: bool,
    /// MicrovmMachines whose Machine the autoscaler marked with `delete-machine` -> that Machine.
    pub marked: BTreeMap<String, String>,
    /// The highest `replicas` seen per group since [`Watch::reset_peaks`].
    pub peaks: BTreeMap<String, i64>,
    /// Node groups the status ConfigMap showed in `Backoff`.
    pub backoff_seen: BTreeSet<String>,
    table: Table,
}

impl<'a> Watch<'a> {
    /// A watch of Cluster `cluster` on `real`.
    pub fn new(
        real: &'a RealStack,
        cluster: ClusterKey,
        workload: kube::Client,
        show: bool,
    ) -> Self {
        Self {
            real,
            cluster,
            workload,
            show,
            marked: BTreeMap::new(),
            peaks: BTreeMap::new(),
            backoff_seen: BTreeSet::new(),
            table: Table::new(),
        }
    }

    /// Forgets the peaks.
    pub fn reset_peaks(&mut self) {
        self.peaks.clear();
    }

    /// Looks at everything once.
    pub async fn observe(&mut self) -> anyhow::Result<Observed> {
        let ns = self.cluster.namespace.clone();
        let client = self.real.client().clone();
        let mut groups = BTreeMap::new();
        for (prefix, resource) in [
            ("md", machine_deployment_resource()),
            ("mp", machine_pool_resource()),
        ] {
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &resource);
            for o in api.list(&ListParams::default()).await?.items {
                let annotations = o.annotations();
                let size = |k: &str| annotations.get(k).and_then(|v| v.parse().ok());
                let key = format!("{prefix}/{}", o.name_any());
                groups.insert(
                    key.clone(),
                    Group {
                        key,
                        min: size(MIN_SIZE),
                        max: size(MAX_SIZE),
                        replicas: o.data["spec"]["replicas"].as_i64().unwrap_or(0),
                        nodes: 0,
                        vms: 0,
                    },
                );
            }
        }
        let machines = Api::<MicrovmMachine>::namespaced(client.clone(), &ns)
            .list(&ListParams::default())
            .await?
            .items;
        let mut group_of_machine = BTreeMap::new();
        for m in &machines {
            let key = group_of(m);
            let entry = groups.entry(key.clone()).or_insert_with(|| Group {
                key: key.clone(),
                min: None,
                max: None,
                replicas: 0,
                nodes: 0,
                vms: 0,
            });
            if key == "control-plane" {
                entry.replicas += 1;
            }
            let ready = m
                .spec
                .provider_id
                .as_deref()
                .and_then(|pid| {
                    self.real
                        .workloads()
                        .node_by_provider_id(&self.cluster, pid)
                })
                .is_some_and(|n| node_ready(&n));
            if ready {
                entry.nodes += 1;
            }
            group_of_machine.insert(m.name_any(), key);
        }
        let mut vms = BTreeMap::new();
        for (_, vm) in self.real.all_vms() {
            if vm.state() == MicrovmState::Deleting || vm.microvm.spec.namespace != ns {
                continue;
            }
            let name = vm.microvm.spec.id.clone();
            let key = group_of_machine
                .get(&name)
                .cloned()
                .unwrap_or_else(|| "-".to_string());
            if let Some(g) = groups.get_mut(&key) {
                g.vms += 1;
            }
            vms.insert(vm.uid().to_string(), (name, key));
        }
        // Which Machines the autoscaler marked (they go once deleted: remember them).
        let capi: Api<DynamicObject> = Api::namespaced_with(client, &ns, &machine_resource());
        for m in capi.list(&ListParams::default()).await?.items {
            if m.annotations().contains_key(DELETE_MACHINE_ANNOTATION)
                && let Some(infra) = m.data["spec"]["infrastructureRef"]["name"].as_str()
            {
                self.marked.insert(infra.to_string(), m.name_any());
            }
        }
        let pods = load_pods(&self.workload, &ns).await?;
        for g in groups.values() {
            let peak = self.peaks.entry(g.key.clone()).or_insert(g.replicas);
            *peak = (*peak).max(g.replicas);
        }
        for group in status_backoff(&self.workload).await {
            self.backoff_seen.insert(group);
        }
        let observed = Observed { groups, pods, vms };
        if self.show {
            self.table.show(&observed);
        }
        Ok(observed)
    }

    /// Observes every 250 ms until `done` holds; fails after `timeout` naming `what`.
    pub async fn until(
        &mut self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&Observed) -> bool,
    ) -> anyhow::Result<Observed> {
        let deadline = Instant::now() + timeout;
        loop {
            let o = self.observe().await?;
            if done(&o) {
                return Ok(o);
            }
            if Instant::now() > deadline {
                bail!(
                    "timed out after {timeout:?} waiting for {what}; last seen: {}",
                    brief(&o)
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// One line: every group's replicas, nodes and microVMs, and the Pods.
pub fn brief(o: &Observed) -> String {
    let groups: Vec<String> = o
        .groups
        .values()
        .map(|g| {
            format!(
                "{} replicas {} nodes {} microVMs {}",
                g.key, g.replicas, g.nodes, g.vms
            )
        })
        .collect();
    format!(
        "{}; pods pending {} running {}",
        groups.join(", "),
        o.pods.pending,
        o.pods.running
    )
}

fn node_ready(n: &k8s_openapi::api::core::v1::Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The load's Pods in `namespace` of the workload cluster.
async fn load_pods(workload: &kube::Client, namespace: &str) -> anyhow::Result<Pods> {
    let pods: Api<Pod> = Api::namespaced(workload.clone(), namespace);
    let list = pods
        .list(&ListParams::default().labels(&format!("{}={}", LOAD_LABEL.0, LOAD_LABEL.1)))
        .await?
        .items;
    let mut counts = Pods::default();
    for p in list
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        if is_running(p) {
            counts.running += 1;
        } else {
            counts.pending += 1;
        }
    }
    Ok(counts)
}

/// Running, Ready and with an IP: what `kubectl get pods -o wide` shows as `1/1 Running <ip>`.
pub fn is_running(p: &Pod) -> bool {
    p.status.as_ref().is_some_and(|s| {
        s.phase.as_deref() == Some("Running")
            && s.pod_ip.is_some()
            && s.conditions
                .as_ref()
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    })
}

/// The autoscaler's status ConfigMap (`kube-system/cluster-autoscaler-status`), parsed.
pub async fn autoscaler_status(workload: &kube::Client) -> Option<serde_json::Value> {
    let cm = Api::<ConfigMap>::namespaced(workload.clone(), "kube-system")
        .get_opt(capmvm_upstream::autoscaler::STATUS_CONFIG_MAP)
        .await
        .ok()??;
    let text = cm.data?.get("status")?.clone();
    serde_saphyr::from_str(&text).ok()
}

/// The node groups whose scale-up the status ConfigMap shows in `Backoff`.
async fn status_backoff(workload: &kube::Client) -> Vec<String> {
    let Some(status) = autoscaler_status(workload).await else {
        return Vec::new();
    };
    status["nodeGroups"]
        .as_array()
        .map(|groups| {
            groups
                .iter()
                .filter(|g| g["scaleUp"]["status"] == "Backoff")
                .filter_map(|g| g["name"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// A live table, redrawn in place on a terminal, printed on change otherwise.
struct Table {
    last: String,
    lines: usize,
    tty: bool,
}

impl Table {
    fn new() -> Self {
        Self {
            last: String::new(),
            lines: 0,
            tty: std::io::stdout().is_terminal(),
        }
    }

    fn show(&mut self, o: &Observed) {
        let size = |v: Option<i64>| v.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
        let mut rows: Vec<[String; 6]> = vec![[
            "GROUP".into(),
            "MIN".into(),
            "MAX".into(),
            "REPLICAS".into(),
            "NODES".into(),
            "MICROVMS".into(),
        ]];
        rows.extend(o.groups.values().map(|g| {
            [
                g.key.clone(),
                size(g.min),
                size(g.max),
                g.replicas.to_string(),
                g.nodes.to_string(),
                g.vms.to_string(),
            ]
        }));
        let widths: Vec<usize> = (0..6)
            .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
            .collect();
        let mut text = String::new();
        for row in &rows {
            let cells: Vec<String> = row
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect();
            text.push_str(cells.join("   ").trim_end());
            text.push('\n');
        }
        text.push_str(&format!(
            "PODS   pending {}   running {}\n",
            o.pods.pending, o.pods.running
        ));
        if text == self.last {
            return;
        }
        let mut out = std::io::stdout().lock();
        if self.tty && self.lines > 0 {
            let _ = write!(out, "\x1b[{}A\x1b[J", self.lines);
        } else if self.lines > 0 {
            let _ = writeln!(out);
        }
        let _ = write!(out, "{text}");
        let _ = out.flush();
        self.lines = text.lines().count();
        self.last = text;
    }

    /// Lets the next table print below whatever was printed since.
    fn detach(&mut self) {
        self.lines = 0;
        self.last.clear();
    }
}

impl Watch<'_> {
    /// Prints a line of narration below the table (the table starts again beneath it).
    pub fn say(&mut self, line: &str) {
        if self.show {
            println!("\n{line}");
            self.table.detach();
        }
    }
}
