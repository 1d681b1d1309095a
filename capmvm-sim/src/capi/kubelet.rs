//! Hollow kubelets: kubemark's idea at the node layer. When a microVM on a hollow host is running
//! (CREATED), it "boots" its cloud-init ([`boot`]) and its kubelet registers a Node in its cluster's
//! workload API: the name and `--provider-id` kubeadm gives it, `status.nodeInfo` as a real kubelet
//! reports it, capacity from the microVM's vCPUs and memory, and a Ready condition. A microVM whose
//! user-data gives no valid provider-id registers a Node that matches no Machine, as on a real
//! cluster; one whose user-data runs no kubeadm registers nothing.
//!
//! One task serves every kubelet: each tick it reads the hosts' records in memory (no flintlock
//! call), registers the microVMs that became CREATED, applies the disruptor's wishes, and marks the
//! Node of a microVM that went away `Ready=Unknown` (the node lifecycle controller's verdict once a
//! kubelet stops posting). Registration reads the stand-in's caches of the management cluster (the
//! MicrovmMachine and its Machine: the cluster and the Kubernetes version) and costs one create on
//! the workload API.

pub mod boot;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash as _, Hasher as _};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use capmvm_api::MicrovmMachine;
use capmvm_api::capi::Machine;
use capmvm_api::keys::CLUSTER_NAME_LABEL;
use capmvm_flintlock::hollow::{HostControl, VmSnapshot};
use capmvm_flintlock::{Microvm, MicrovmState};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{
    Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus, NodeSystemInfo,
    Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt as _};
use serde_json::json;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use self::boot::{Boot, KubeletBoot};
use super::workload::{ClusterKey, WorkloadClusters};

/// How often the kubelets look at the hosts.
pub const TICK: Duration = Duration::from_millis(500);
/// The kubelet version when the Machine names none.
pub const DEFAULT_KUBELET_VERSION: &str = "v1.33.0";
/// Registrations in flight at once.
const CONCURRENT_REGISTRATIONS: usize = 16;
/// How long a microVM waits before trying to register again (no workload API yet, API errors).
const RETRY: Duration = Duration::from_secs(1);

/// A Node a hollow kubelet registered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisteredNode {
    /// The Cluster whose workload API holds it.
    pub cluster: ClusterKey,
    /// The Node's name.
    pub node: String,
    /// Its `spec.providerID`.
    pub provider_id: Option<String>,
    /// The microVM's flintlock uid.
    pub vm_uid: String,
    /// Whether its Ready condition is True.
    pub ready: bool,
}

#[derive(Default)]
struct Disruptions {
    not_ready: HashSet<String>,
    never_register: HashSet<String>,
}

struct Registered {
    node: RegisteredNode,
    /// The workload API it was registered in (a re-created Cluster gets a new one).
    serial: u64,
}

#[derive(Default)]
struct State {
    disruptions: Disruptions,
    registered: HashMap<String, Registered>,
}

/// Drives the kubelets from a test or the demo (cheap to clone).
#[derive(Clone, Default)]
pub struct KubeletControl {
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for KubeletControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletControl").finish_non_exhaustive()
    }
}

impl KubeletControl {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `true`: the kubelet of Node `node` reports `Ready=False` (now, or once it registers);
    /// `false`: Ready again.
    pub fn set_not_ready(&self, node: &str, not_ready: bool) {
        let mut state = self.state();
        if not_ready {
            state.disruptions.not_ready.insert(node.to_string());
        } else {
            state.disruptions.not_ready.remove(node);
        }
    }

    /// `true`: the kubelet of Node `node` never registers (until set back to `false`).
    pub fn set_never_register(&self, node: &str, never: bool) {
        let mut state = self.state();
        if never {
            state.disruptions.never_register.insert(node.to_string());
        } else {
            state.disruptions.never_register.remove(node);
        }
    }

    /// The Nodes registered by kubelets that still run, sorted by cluster and name.
    pub fn registered(&self) -> Vec<RegisteredNode> {
        let mut nodes: Vec<RegisteredNode> = self
            .state()
            .registered
            .values()
            .map(|r| r.node.clone())
            .collect();
        nodes.sort_by(|a, b| (&a.cluster, &a.node).cmp(&(&b.cluster, &b.node)));
        nodes
    }
}

/// The running kubelets; dropping stops them.
pub struct Kubelets {
    control: KubeletControl,
    task: JoinHandle<()>,
}

impl Kubelets {
    /// Starts the kubelets of the microVMs on `hosts`, registering in `workloads`; `management` is
    /// what they read of the management cluster (each microVM's Cluster and Kubernetes version).
    pub fn start(
        management: ManagementView,
        hosts: Vec<HostControl>,
        workloads: WorkloadClusters,
    ) -> Kubelets {
        let control = KubeletControl::default();
        let task = tokio::spawn(run(management, hosts, workloads, control.clone()));
        Kubelets { control, task }
    }

    /// The disruptor and the registered Nodes.
    pub fn control(&self) -> &KubeletControl {
        &self.control
    }
}

impl Drop for Kubelets {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What one microVM's kubelet is doing, between ticks.
enum Progress {
    /// Try (again) at this instant.
    RetryAt(Instant),
    /// Nothing to register (no kubelet starts); remembered so it is not booted again.
    NoKubelet,
}

/// What hollow kubelets read of the management cluster: the CAPI stand-in's watch caches of
/// MicrovmMachines and Machines ([`super::StandIn::management_view`]). A real kubelet learns its
/// cluster from its bootstrap data; reading the caches instead of two GETs per microVM keeps the
/// simulation's own cost out of what a benchmark measures.
#[derive(Clone)]
pub struct ManagementView {
    pub(crate) microvm_machines: Store<MicrovmMachine>,
    pub(crate) machines: Store<Machine>,
}

impl std::fmt::Debug for ManagementView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagementView").finish_non_exhaustive()
    }
}

struct Kubelet<'a> {
    management: &'a ManagementView,
    workloads: &'a WorkloadClusters,
    control: &'a KubeletControl,
}

async fn run(
    management: ManagementView,
    hosts: Vec<HostControl>,
    workloads: WorkloadClusters,
    control: KubeletControl,
) {
    let mut progress: HashMap<String, Progress> = HashMap::new();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let kubelet = Kubelet {
        management: &management,
        workloads: &workloads,
        control: &control,
    };
    loop {
        tick.tick().await;
        let now = Instant::now();
        let mut running = HashSet::new();
        let mut to_boot = Vec::new();
        {
            let state = control.state();
            // States only: copying every record (and its cloud-init) each tick cost O(microVMs).
            for host in &hosts {
                for (uid, vm_state) in host.vm_states() {
                    if vm_state != MicrovmState::Created {
                        continue;
                    }
                    let due = match progress.get(&uid) {
                        Some(Progress::NoKubelet) => false,
                        Some(Progress::RetryAt(at)) => *at <= now,
                        None => true,
                    };
                    if due
                        && !state.registered.contains_key(&uid)
                        && let Some(vm) = host.vm(&uid)
                    {
                        to_boot.push(vm);
                    }
                    running.insert(uid);
                }
            }
        }
        progress.retain(|uid, _| running.contains(uid));

        let outcomes: Vec<(String, Option<Progress>)> = futures::stream::iter(to_boot)
            .map(|vm| async {
                let uid = vm.uid().to_string();
                (uid, kubelet.register(vm).await)
            })
            .buffer_unordered(CONCURRENT_REGISTRATIONS)
            .collect()
            .await;
        for (uid, outcome) in outcomes {
            match outcome {
                Some(p) => {
                    progress.insert(uid, p);
                }
                None => {
                    progress.remove(&uid);
                }
            }
        }
        kubelet.stop_gone(&running).await;
        kubelet.apply_disruptions().await;
    }
}

impl Kubelet<'_> {
    /// Boots `vm` and registers its Node; `None` once registered.
    async fn register(&self, vm: VmSnapshot) -> Option<Progress> {
        let retry = Some(Progress::RetryAt(Instant::now() + RETRY));
        let microvm = &vm.microvm;
        let meta = match boot::meta_data(&microvm.spec.metadata) {
            Ok(m) => m,
            Err(e) => {
                warn!(uid = %vm.uid(), error = %e, "hollow kubelet: the microVM's meta-data is unreadable; no kubelet starts");
                return Some(Progress::NoKubelet);
            }
        };
        let user_data = boot::user_data(&microvm.spec.metadata).unwrap_or_default();
        let kubelet = match boot::boot(&user_data, &meta) {
            Ok(Boot::Kubelet(k)) => k,
            Ok(Boot::NoKubelet(why)) => {
                info!(uid = %vm.uid(), why, "hollow kubelet: no kubelet starts on this microVM");
                return Some(Progress::NoKubelet);
            }
            Err(e) => {
                // cloud-init logs this and ignores the user-data: kubeadm never runs.
                warn!(uid = %vm.uid(), error = %e, "hollow kubelet: cloud-init cannot render the user-data; no kubelet starts");
                return Some(Progress::NoKubelet);
            }
        };
        if self
            .control
            .state()
            .disruptions
            .never_register
            .contains(&kubelet.node_name)
        {
            return retry;
        }
        let Some((cluster, version)) = self.cluster_of(microvm) else {
            return retry;
        };
        let Some((client, serial)) = self.workloads.client_and_serial(&cluster) else {
            return retry;
        };
        let not_ready = self
            .control
            .state()
            .disruptions
            .not_ready
            .contains(&kubelet.node_name);
        let node = node_object(&kubelet, microvm, &version, !not_ready);
        let nodes: Api<Node> = Api::all(client);
        match nodes.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {
                // A Node of that name exists: ours from before (keep it), or a stale one the
                // kubelet replaces, as a real kubelet does when the provider ID differs.
                let existing = nodes.get_opt(&kubelet.node_name).await.ok().flatten();
                let same = existing
                    .as_ref()
                    .and_then(|n| n.spec.as_ref())
                    .and_then(|s| s.provider_id.as_ref())
                    == kubelet.provider_id.as_ref();
                if !same {
                    let _ = nodes
                        .delete(&kubelet.node_name, &DeleteParams::default())
                        .await;
                    return retry;
                }
            }
            Err(e) => {
                debug!(node = %kubelet.node_name, error = %e, "hollow kubelet: registering failed; retrying");
                return retry;
            }
        }
        info!(node = %kubelet.node_name, %cluster, provider_id = ?kubelet.provider_id, "hollow kubelet: Node registered");
        self.control.state().registered.insert(
            vm.uid().to_string(),
            Registered {
                node: RegisteredNode {
                    cluster,
                    node: kubelet.node_name,
                    provider_id: kubelet.provider_id,
                    vm_uid: vm.uid().to_string(),
                    ready: !not_ready,
                },
                serial,
            },
        );
        None
    }

    /// The Cluster of a microVM (its MicrovmMachine's `cluster-name` label) and the Kubernetes
    /// version of its Machine. `None` while they are not there yet.
    fn cluster_of(&self, microvm: &Microvm) -> Option<(ClusterKey, String)> {
        let ns = if microvm.spec.namespace.is_empty() {
            "default"
        } else {
            &microvm.spec.namespace
        };
        let version = |m: &Machine| {
            m.spec
                .version
                .clone()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| DEFAULT_KUBELET_VERSION.to_string())
        };
        let Some(infra) = self
            .management
            .microvm_machines
            .get(&ObjectRef::new(&microvm.spec.id).within(ns))
        else {
            // Not in the cache of our version (another provider's objects, at its own version):
            // the Machine that names it says the cluster.
            let machine = self.management.machines.state().into_iter().find(|m| {
                m.namespace().as_deref() == Some(ns)
                    && m.spec.infrastructure_ref.kind == "MicrovmMachine"
                    && m.spec.infrastructure_ref.name == microvm.spec.id
            })?;
            return Some((
                ClusterKey::new(ns, &machine.spec.cluster_name),
                version(&machine),
            ));
        };
        let cluster = infra.labels().get(CLUSTER_NAME_LABEL)?;
        let version = infra
            .owner_references()
            .iter()
            .find(|o| o.kind == "Machine")
            .and_then(|o| {
                self.management
                    .machines
                    .get(&ObjectRef::new(&o.name).within(ns))
            })
            .map(|m| version(&m))
            .unwrap_or_else(|| DEFAULT_KUBELET_VERSION.to_string());
        Some((ClusterKey::new(ns, cluster), version))
    }

    /// Kubelets whose microVM is no longer running stop posting: their Node becomes
    /// `Ready=Unknown`, as the node lifecycle controller marks it.
    async fn stop_gone(&self, running: &HashSet<String>) {
        let gone: Vec<Registered> = {
            let mut state = self.control.state();
            let uids: Vec<String> = state
                .registered
                .keys()
                .filter(|u| !running.contains(*u))
                .cloned()
                .collect();
            uids.iter()
                .filter_map(|u| state.registered.remove(u))
                .collect()
        };
        for r in gone {
            if let Some(client) = self.client_of(&r) {
                let _ = set_ready(
                    &client,
                    &r.node.node,
                    "Unknown",
                    "NodeStatusUnknown",
                    "Kubelet stopped posting node status.",
                )
                .await;
            }
        }
    }

    fn client_of(&self, r: &Registered) -> Option<kube::Client> {
        self.workloads
            .client_and_serial(&r.node.cluster)
            .filter(|(_, serial)| *serial == r.serial)
            .map(|(c, _)| c)
    }

    /// Moves Ready to what the disruptor asks for.
    async fn apply_disruptions(&self) {
        let changes: Vec<(String, bool)> = {
            let state = self.control.state();
            state
                .registered
                .iter()
                .filter_map(|(uid, r)| {
                    let want = !state.disruptions.not_ready.contains(&r.node.node);
                    (want != r.node.ready).then(|| (uid.clone(), want))
                })
                .collect()
        };
        for (uid, ready) in changes {
            let Some((client, node)) = ({
                let state = self.control.state();
                state
                    .registered
                    .get(&uid)
                    .and_then(|r| self.client_of(r).map(|c| (c, r.node.node.clone())))
            }) else {
                continue;
            };
            let result = if ready {
                set_ready(
                    &client,
                    &node,
                    "True",
                    "KubeletReady",
                    "kubelet is posting ready status",
                )
                .await
            } else {
                set_ready(
                    &client,
                    &node,
                    "False",
                    "KubeletNotReady",
                    "container runtime is down",
                )
                .await
            };
            match result {
                Ok(()) => {
                    if let Some(r) = self.control.state().registered.get_mut(&uid) {
                        r.node.ready = ready;
                    }
                }
                Err(e) => {
                    debug!(%node, error = %e, "hollow kubelet: updating Ready failed; retrying")
                }
            }
        }
    }
}

/// Sets the Ready condition of `node` (status subresource, as a kubelet does).
async fn set_ready(
    client: &kube::Client,
    node: &str,
    status: &str,
    reason: &str,
    message: &str,
) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let Some(current) = nodes.get_opt(node).await? else {
        return Ok(());
    };
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let mut conditions = current
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default();
    conditions.retain(|c| c.type_ != "Ready");
    conditions.push(NodeCondition {
        type_: "Ready".into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(now),
    });
    nodes
        .patch_status(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": conditions}})),
        )
        .await
        .map(|_| ())
}

/// A stable 128-bit digest of `parts`, as 32 lower-case hex digits.
fn digest(parts: &[&str]) -> String {
    let half = |seed: u64| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        seed.hash(&mut h);
        parts.hash(&mut h);
        h.finish()
    };
    format!("{:016x}{:016x}", half(1), half(2))
}

fn as_uuid(hex: &str) -> String {
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The kernel version a microVM runs: the tag of its kernel image (`kernel-bin:5.10.77`).
fn kernel_version(microvm: &Microvm) -> String {
    microvm
        .spec
        .kernel
        .image
        .rsplit_once(':')
        .map(|(_, tag)| tag)
        .filter(|t| !t.is_empty() && !t.contains('/'))
        .unwrap_or("5.10.77")
        .to_string()
}

/// The Node a kubelet registers for `microvm`.
fn node_object(kubelet: &KubeletBoot, microvm: &Microvm, version: &str, ready: bool) -> Node {
    let uid = microvm.uid();
    let vcpu = if microvm.spec.vcpu > 0 {
        microvm.spec.vcpu
    } else {
        2
    };
    let memory_kib = i64::from(if microvm.spec.memory_mb > 0 {
        microvm.spec.memory_mb
    } else {
        1024
    }) * 1024;
    // The kubelet reserves the default hard eviction threshold (memory.available < 100Mi).
    let allocatable_kib = (memory_kib - 100 * 1024).max(0);
    let quantities = |memory: i64| {
        BTreeMap::from([
            ("cpu".to_string(), Quantity(vcpu.to_string())),
            (
                "ephemeral-storage".to_string(),
                Quantity("10218772Ki".into()),
            ),
            ("hugepages-1Gi".to_string(), Quantity("0".into())),
            ("hugepages-2Mi".to_string(), Quantity("0".into())),
            ("memory".to_string(), Quantity(format!("{memory}Ki"))),
            ("pods".to_string(), Quantity("110".into())),
        ])
    };
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let condition = |type_: &str, status: &str, reason: &str, message: &str| NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
    };
    let mut labels = BTreeMap::from([
        ("beta.kubernetes.io/arch".to_string(), "amd64".to_string()),
        ("beta.kubernetes.io/os".to_string(), "linux".to_string()),
        ("kubernetes.io/arch".to_string(), "amd64".to_string()),
        (
            "kubernetes.io/hostname".to_string(),
            kubelet.node_name.clone(),
        ),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
    ]);
    let mut taints = None;
    if kubelet.control_plane {
        // What kubeadm init (or join --control-plane) puts on the Node.
        labels.insert(
            "node-role.kubernetes.io/control-plane".to_string(),
            String::new(),
        );
        taints = Some(vec![Taint {
            key: "node-role.kubernetes.io/control-plane".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }]);
    }
    let machine_id = digest(&["machine-id", uid]);
    Node {
        metadata: ObjectMeta {
            name: Some(kubelet.node_name.clone()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                "volumes.kubernetes.io/controller-managed-attach-detach".to_string(),
                "true".to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: kubelet.provider_id.clone(),
            taints,
            ..Default::default()
        }),
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "Hostname".into(),
                address: kubelet.node_name.clone(),
            }]),
            capacity: Some(quantities(memory_kib)),
            allocatable: Some(quantities(allocatable_kib)),
            conditions: Some(vec![
                condition(
                    "MemoryPressure",
                    "False",
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                ),
                condition(
                    "DiskPressure",
                    "False",
                    "KubeletHasNoDiskPressure",
                    "kubelet has no disk pressure",
                ),
                condition(
                    "PIDPressure",
                    "False",
                    "KubeletHasSufficientPID",
                    "kubelet has sufficient PID available",
                ),
                if ready {
                    condition(
                        "Ready",
                        "True",
                        "KubeletReady",
                        "kubelet is posting ready status",
                    )
                } else {
                    condition(
                        "Ready",
                        "False",
                        "KubeletNotReady",
                        "container runtime is down",
                    )
                },
            ]),
            daemon_endpoints: Some(NodeDaemonEndpoints {
                kubelet_endpoint: Some(k8s_openapi::api::core::v1::DaemonEndpoint { port: 10250 }),
            }),
            node_info: Some(NodeSystemInfo {
                architecture: "amd64".into(),
                boot_id: as_uuid(&digest(&["boot-id", uid, &now.0.to_string()])),
                container_runtime_version: "containerd://1.7.27".into(),
                kernel_version: kernel_version(microvm),
                kube_proxy_version: version.to_string(),
                kubelet_version: version.to_string(),
                machine_id: machine_id.clone(),
                operating_system: "linux".into(),
                os_image: "Ubuntu 22.04.5 LTS".into(),
                // MicroVMs have no swap device, and a kubelet without swap leaves `swap` out: the
                // real API server refuses a capacity of 0 ("must be greater than zero").
                swap: None,
                system_uuid: as_uuid(&digest(&["system-uuid", uid])),
            }),
            ..Default::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_node_reports_what_a_kubelet_reports() {
        let mut microvm = Microvm::default();
        microvm.spec.uid = Some("01KE75BHT9H6D7V5YG0KYGRXX2".into());
        microvm.spec.vcpu = 4;
        microvm.spec.memory_mb = 2048;
        microvm.spec.kernel.image = "ghcr.io/liquidmetal-dev/kernel-bin:5.10.77".into();
        let kubelet = KubeletBoot {
            node_name: "cp-0".into(),
            provider_id: Some("microvm://h:1/01KE75BHT9H6D7V5YG0KYGRXX2".into()),
            control_plane: true,
        };
        let node = node_object(&kubelet, &microvm, "v1.32.4", true);
        let status = node.status.unwrap();
        let info = status.node_info.unwrap();
        assert_eq!(info.kubelet_version, "v1.32.4");
        assert_eq!(info.kernel_version, "5.10.77");
        assert_eq!(info.swap, None, "a kubelet without swap reports none");
        assert_eq!(info.machine_id.len(), 32);
        assert_eq!(info.system_uuid.len(), 36);
        let capacity = status.capacity.unwrap();
        assert_eq!(capacity["cpu"], Quantity("4".into()));
        assert_eq!(capacity["memory"], Quantity("2097152Ki".into()));
        assert_eq!(capacity["pods"], Quantity("110".into()));
        assert_eq!(
            status.allocatable.unwrap()["memory"],
            Quantity("1994752Ki".into())
        );
        let ready = status
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.status, "True");
        assert!(
            node.metadata
                .labels
                .unwrap()
                .contains_key("node-role.kubernetes.io/control-plane")
        );
        assert_eq!(
            node.spec.unwrap().provider_id.as_deref(),
            Some("microvm://h:1/01KE75BHT9H6D7V5YG0KYGRXX2")
        );
    }
}
