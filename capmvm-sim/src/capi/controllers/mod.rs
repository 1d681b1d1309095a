//! The start of the stand-in's controllers and what they share (the context, the caches): Cluster in
//! `cluster`, MachineDeployment in `deployment`, Machine in `machine` (KubeadmControlPlane in `kcp`,
//! KubeadmConfig in `bootstrap`). Writes (`writes`) are merge patches sent only when something changes.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use capmvm_api::capi::{Cluster, Machine};
use capmvm_api::keys::CLUSTER_NAME_LABEL;
use capmvm_api::{GROUP, MicrovmCluster, MicrovmMachine, MicrovmMachineTemplate};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, watcher};
use kube::{Api, Resource, ResourceExt};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tracing::warn;

mod cluster;
mod deployment;
mod machine;
mod writes;

use cluster::reconcile_cluster;
use deployment::{deployment_wakes, reconcile_deployment};
use machine::reconcile_machine;
use writes::patch_status_if_changed;
pub(crate) use writes::{delete_quietly, ensure_finalizer, owner_ref, params, remove_finalizer};

use super::bootstrap::{
    BOOTSTRAP_GROUP, kubeadm_config_resource, kubeadm_config_template_resource,
};
use super::clone::{NewBootstrap, NewMachine, create_machine, suffix_of};
use super::crds::MachineDeployment;
use super::informers::Informer;
use super::kcp::{CONTROL_PLANE_GROUP, kubeadm_control_plane_resource};
use super::retry::{error_policy, forgetting_failures};
use super::workload::{ClusterKey, WorkloadClusters};
use super::{
    CLUSTER_FINALIZER, DELETE_MACHINE_ANNOTATION, DEPLOYMENT_NAME_LABEL, MACHINE_FINALIZER,
};

const MANAGER: &str = "capi-stand-in";

/// Why a stand-in reconcile failed (it is retried shortly).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// A Kubernetes API call failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// A workload cluster could not be served.
    #[error(transparent)]
    Workload(#[from] super::workload::WorkloadError),
    /// A lock was poisoned by a panic elsewhere.
    #[error("a stand-in lock was poisoned")]
    Poisoned,
}

pub(crate) struct Ctx {
    pub(crate) client: kube::Client,
    /// The status fields this stand-in last wrote, per object uid. The operator's views of Cluster
    /// and Machine model only what the provider reads, so the stand-in compares with its own writes.
    written: Mutex<HashMap<String, Value>>,
    /// The Clusters' workload APIs and their Nodes.
    pub(crate) workloads: WorkloadClusters,
    /// Options the stand-in was started with.
    pub(crate) options: StandInOptions,
    /// When each MachinePool's bootstrap Secret was last rendered, by KubeadmConfig uid (the join
    /// token rotation's clock).
    pub(crate) token_rendered_at: Mutex<HashMap<String, std::time::Instant>>,
    /// The watch caches the controllers share.
    pub(crate) caches: Caches,
    /// The Machines (by uid) whose bootstrap Secret name this stand-in copied: a reconcile that
    /// starts from a cache not showing the copy yet does not copy it again.
    bootstrap_copied: Mutex<HashSet<String>>,
    /// The uids of the infrastructure machine and bootstrap config each Machine adopted, by Machine
    /// uid: a reconcile that starts from a cache not showing the adoption yet does not send it again.
    adopted: Mutex<HashMap<String, Vec<String>>>,
    /// Consecutive failed reconciles per object, for the retry backoff (see [`super::retry`]).
    pub(crate) failures: super::retry::Failures,
}

/// The stand-in's controllers share one retry policy ([`super::retry`]) over this context, reached
/// directly or through a wrapper such as the MachinePool controller's.
impl AsRef<Ctx> for Ctx {
    fn as_ref(&self) -> &Ctx {
        self
    }
}

impl Ctx {
    fn has_adopted(&self, machine: &Machine, uid: &str) -> bool {
        lock(&self.adopted)
            .get(&machine.uid().unwrap_or_default())
            .is_some_and(|uids| uids.iter().any(|u| u == uid))
    }

    fn adopted(&self, machine: &Machine, uid: String) {
        lock(&self.adopted)
            .entry(machine.uid().unwrap_or_default())
            .or_default()
            .push(uid);
    }
}

/// A plain map behind a lock a panic may have poisoned: still usable.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The watch caches the controllers share (CAPI's informers): Machines and their infrastructure
/// and bootstrap objects, and the templates Machines are created from.
pub(crate) struct Caches {
    pub(crate) clusters: Informer<Cluster>,
    pub(crate) machines: Informer<Machine>,
    pub(crate) microvm_machines: Informer<MicrovmMachine>,
    pub(crate) microvm_machine_templates: Informer<MicrovmMachineTemplate>,
    pub(crate) kubeadm_configs: Informer<DynamicObject>,
    pub(crate) kubeadm_config_templates: Informer<DynamicObject>,
}

impl Caches {
    fn new(client: &kube::Client) -> Self {
        Self {
            clusters: Informer::new(Api::all(client.clone())),
            machines: Informer::new(Api::all(client.clone())),
            microvm_machines: Informer::new(Api::all(client.clone())),
            microvm_machine_templates: Informer::new(Api::all(client.clone())),
            kubeadm_configs: super::informers::dynamic(client, &kubeadm_config_resource()),
            kubeadm_config_templates: super::informers::dynamic(
                client,
                &kubeadm_config_template_resource(),
            ),
        }
    }

    /// Starts the watches (after the controllers subscribed).
    fn start(&self) -> Vec<JoinHandle<()>> {
        [
            self.clusters.start(),
            self.machines.start(),
            self.microvm_machines.start(),
            self.microvm_machine_templates.start(),
            self.kubeadm_configs.start(),
            self.kubeadm_config_templates.start(),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// How the stand-in behaves where CAPI is configurable.
#[derive(Clone, Debug)]
pub struct StandInOptions {
    /// How often CABPK rotates the join token of a MachinePool's KubeadmConfig and rewrites its
    /// Secret (CABPK's `--bootstrap-token-ttl` refresh); `None` never rotates. Default
    /// [`DEFAULT_TOKEN_ROTATION`].
    pub bootstrap_token_rotation: Option<Duration>,
    /// Which of CAPI's controllers the stand-in plays.
    pub plays: StandInPlays,
}

/// Which of CAPI's controllers the stand-in plays.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StandInPlays {
    /// All of them: Cluster, MachineDeployment, Machine, MachinePool, MachineHealthCheck,
    /// KubeadmControlPlane, kubeadm bootstrap (on the API emulator).
    #[default]
    All,
    /// Only the KubeadmControlPlane, beside CAPI's real core and kubeadm bootstrap managers: the
    /// real KubeadmControlPlane needs etcd inside the workload cluster, reached through a kubelet's
    /// port-forward (docs/real-stack.md).
    ControlPlaneOnly,
}

/// CABPK's token refresh, compressed for simulations (CABPK's own TTL is 15 minutes).
pub const DEFAULT_TOKEN_ROTATION: Duration = Duration::from_secs(60);

impl Default for StandInOptions {
    fn default() -> Self {
        Self {
            bootstrap_token_rotation: Some(DEFAULT_TOKEN_ROTATION),
            plays: StandInPlays::All,
        }
    }
}

impl Ctx {
    /// Merges `want` into `obj`'s status unless this stand-in already wrote exactly those fields.
    async fn write_status<K>(&self, api: &Api<K>, obj: &K, want: Value) -> Result<(), kube::Error>
    where
        K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let key = obj.uid().unwrap_or_else(|| obj.name_any());
        let current = self
            .written
            .lock()
            .map(|w| w.get(&key).cloned().unwrap_or(Value::Null))
            .unwrap_or(Value::Null);
        patch_status_if_changed(api, obj, &current, want.clone()).await?;
        if let (Ok(mut written), Value::Object(fields)) = (self.written.lock(), want) {
            let entry = written.entry(key).or_insert_with(|| json!({}));
            if let Value::Object(map) = entry {
                map.extend(fields);
            }
        }
        Ok(())
    }
}

/// The running stand-in.
pub struct StandIn {
    tasks: Vec<JoinHandle<()>>,
    workloads: WorkloadClusters,
    management: super::kubelet::ManagementView,
}

impl StandIn {
    /// Its caches of MicrovmMachines and Machines, for the hollow kubelets.
    pub fn management_view(&self) -> super::kubelet::ManagementView {
        self.management.clone()
    }

    /// The workload clusters it serves.
    pub fn workloads(&self) -> &WorkloadClusters {
        &self.workloads
    }

    /// Stops the controllers (as dropping does).
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Starts the Cluster, MachineDeployment and Machine controllers on `client` (all namespaces), with
/// the workload clusters' kubeconfigs in a directory of the system's temporary directory.
pub fn run(client: kube::Client) -> StandIn {
    let dir = std::env::temp_dir().join(format!("capmvm-workloads-{}", std::process::id()));
    run_with(client, WorkloadClusters::new(dir))
}

/// [`run`], serving the Clusters' workload APIs in `workloads`.
pub fn run_with(client: kube::Client, workloads: WorkloadClusters) -> StandIn {
    run_with_options(client, workloads, StandInOptions::default())
}

/// [`run_with`], with `options`.
pub fn run_with_options(
    client: kube::Client,
    workloads: WorkloadClusters,
    options: StandInOptions,
) -> StandIn {
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        written: Mutex::default(),
        workloads: workloads.clone(),
        options,
        token_rendered_at: Mutex::default(),
        caches: Caches::new(&client),
        bootstrap_copied: Mutex::default(),
        adopted: Mutex::default(),
        failures: super::retry::Failures::default(),
    });
    let cfg = || watcher::Config::default().any_semantic();
    let conc = || ControllerConfig::default().concurrency(32);

    let clusters = Controller::new(Api::<Cluster>::all(client.clone()), cfg())
        .with_config(conc())
        .watches(Api::<MicrovmCluster>::all(client.clone()), cfg(), |mc| {
            let ns = mc.namespace().unwrap_or_default();
            mc.labels()
                .get(CLUSTER_NAME_LABEL)
                .map(|c| ObjectRef::new(c).within(&ns))
        })
        // Its control plane's initialization is the Cluster's.
        .watches_with(
            Api::<DynamicObject>::all_with(client.clone(), &kubeadm_control_plane_resource()),
            kubeadm_control_plane_resource(),
            cfg(),
            |kcp| {
                let ns = kcp.namespace().unwrap_or_default();
                kcp.labels()
                    .get(CLUSTER_NAME_LABEL)
                    .map(|c| ObjectRef::new(c).within(&ns))
            },
        )
        // Machine changes matter to a Cluster only while it waits for them to go.
        .watches_shared_stream(ctx.caches.machines.subscribe(), |m| {
            let ns = m.namespace().unwrap_or_default();
            m.meta()
                .deletion_timestamp
                .is_some()
                .then(|| ObjectRef::new(&m.spec.cluster_name).within(&ns))
        })
        .run(
            |c, ctx| forgetting_failures(c, ctx, reconcile_cluster),
            error_policy,
            ctx.clone(),
        )
        .for_each(|_| async {});
    let deployments = Controller::new(Api::<MachineDeployment>::all(client.clone()), cfg())
        .with_config(conc())
        .watches_shared_stream(
            ctx.caches.machines.subscribe(),
            deployment_wakes(ctx.caches.machines.store()),
        )
        .run(
            |md, ctx| forgetting_failures(md, ctx, reconcile_deployment),
            error_policy,
            ctx.clone(),
        )
        .for_each(|_| async {});
    let machines =
        Controller::for_shared_stream(ctx.caches.machines.subscribe(), ctx.caches.machines.store())
            .with_config(conc())
            .watches_shared_stream(ctx.caches.microvm_machines.subscribe(), |mm| {
                let ns = mm.namespace().unwrap_or_default();
                // Before adoption the clone's Machine has the same name (CAPI names them alike).
                Some(ObjectRef::new(&mm.name_any()).within(&ns))
            })
            // Its bootstrap config's changes (CAPI's Machine controller watches the bootstrap object):
            // the KubeadmConfig's `status.dataSecretName` is copied to the Machine.
            .watches_shared_stream_with(
                ctx.caches.kubeadm_configs.subscribe(),
                |config: Arc<DynamicObject>| {
                    let ns = config.namespace().unwrap_or_default();
                    config
                        .owner_references()
                        .iter()
                        .find(|o| o.kind == "Machine" && o.controller == Some(true))
                        .map(|o| ObjectRef::new(&o.name).within(&ns))
                },
                kubeadm_config_resource(),
            )
            // Issue 13: a Node registering (or changing) wakes the Machine with its providerID.
            .reconcile_on(workloads.machine_wakeups())
            .run(
                |m, ctx| forgetting_failures(m, ctx, reconcile_machine),
                error_policy,
                ctx.clone(),
            )
            .for_each(|_| async {});
    let mut tasks = match ctx.options.plays {
        StandInPlays::All => vec![
            tokio::spawn(clusters),
            tokio::spawn(deployments),
            tokio::spawn(machines),
            super::nodes::run_health_checks(ctx.client.clone(), workloads.clone()),
            tokio::spawn(super::kcp::run(ctx.clone())),
            tokio::spawn(super::machinepool::run(ctx.clone())),
            tokio::spawn(super::bootstrap::run(ctx.clone())),
        ],
        StandInPlays::ControlPlaneOnly => vec![tokio::spawn(super::kcp::run(ctx.clone()))],
    };
    // Every controller has subscribed: the watches may start.
    tasks.extend(ctx.caches.start());
    let management = super::kubelet::ManagementView {
        microvm_machines: ctx.caches.microvm_machines.store(),
        machines: ctx.caches.machines.store(),
    };
    StandIn {
        tasks,
        workloads,
        management,
    }
}

/// How long a controller waits for the cache to show the objects it created (CAPI's MachineSet
/// waits the same before it reconciles again).
const CACHE_CONFIRMATION_TIMEOUT: Duration = Duration::from_secs(10);

/// Waits until `cache` holds each of `names` in `ns` (at most [`CACHE_CONFIRMATION_TIMEOUT`]).
async fn wait_for_cache<K>(cache: &Informer<K>, ns: &str, names: &[String])
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    let deadline = tokio::time::Instant::now() + CACHE_CONFIRMATION_TIMEOUT;
    for name in names {
        while cache.get(ns, name).await.is_none() {
            if tokio::time::Instant::now() > deadline {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Whether CAPI marked a Machine's infrastructure provisioned.
pub(crate) fn machine_provisioned(m: &Machine) -> bool {
    m.status
        .as_ref()
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.infrastructure_provisioned)
        == Some(true)
}
