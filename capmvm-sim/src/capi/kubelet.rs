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
//!
//! Where a scheduler and a node lifecycle controller run ([`KubeletOptions::runs_pods`], the real
//! stack's workload clusters), the kubelets also renew their Leases and run the Pods bound to their
//! Nodes ([`pods`]).

pub mod boot;
mod node;
mod pods;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use capmvm_api::MicrovmMachine;
use capmvm_api::capi::Machine;
use capmvm_api::keys::CLUSTER_NAME_LABEL;
use capmvm_flintlock::hollow::{HostControl, VmSnapshot};
use capmvm_flintlock::{Microvm, MicrovmState};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt as _};
use serde_json::json;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use self::boot::Boot;
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
    never_register_prefixes: HashSet<String>,
}

impl Disruptions {
    fn never_registers(&self, node: &str) -> bool {
        self.never_register.contains(node)
            || self
                .never_register_prefixes
                .iter()
                .any(|p| node.starts_with(p.as_str()))
    }
}

/// What the kubelets do besides registering Nodes.
#[derive(Clone, Copy, Debug, Default)]
pub struct KubeletOptions {
    /// Renew each Node's Lease and run the Pods bound to it (a workload cluster with a scheduler
    /// and a kube-controller-manager).
    pub runs_pods: bool,
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

    /// `true`: the kubelets of every Node whose name starts with `prefix` (a MachineDeployment's
    /// or a pool's machines, whatever their random suffix) never register; `false`: they do again.
    pub fn set_never_register_prefix(&self, prefix: &str, never: bool) {
        let mut state = self.state();
        if never {
            state
                .disruptions
                .never_register_prefixes
                .insert(prefix.to_string());
        } else {
            state.disruptions.never_register_prefixes.remove(prefix);
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
        Self::start_with(management, hosts, workloads, KubeletOptions::default())
    }

    /// [`Kubelets::start`] with `options`.
    pub fn start_with(
        management: ManagementView,
        hosts: Vec<HostControl>,
        workloads: WorkloadClusters,
        options: KubeletOptions,
    ) -> Kubelets {
        let control = KubeletControl::default();
        let task = tokio::spawn(run(management, hosts, workloads, control.clone(), options));
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
    options: KubeletOptions,
) {
    let mut pod_workers = pods::PodWorkers::default();
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
        if options.runs_pods {
            pod_workers.sync(&control, &workloads);
            pod_workers.renew_leases(&control, &workloads).await;
        }
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
            .never_registers(&kubelet.node_name)
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
        let node = node::node_object(&kubelet, microvm, &version, !not_ready);
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
