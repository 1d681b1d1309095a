//! The stand-in's Cluster, MachineDeployment and Machine controllers, and the start of all of them
//! (KubeadmControlPlane in `kcp`, KubeadmConfig in `bootstrap`). Writes are merge patches sent only
//! when something changes.

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

pub(crate) fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(MANAGER.to_string()),
        ..Default::default()
    }
}

pub(crate) fn owner_ref<K: Resource<DynamicType = ()>>(
    obj: &K,
    controller: bool,
) -> OwnerReference {
    OwnerReference {
        api_version: K::api_version(&()).to_string(),
        kind: K::kind(&()).to_string(),
        name: obj.name_any(),
        uid: obj.uid().unwrap_or_default(),
        controller: controller.then_some(true),
        block_owner_deletion: controller.then_some(true),
    }
}

pub(crate) async fn ensure_finalizer<K>(
    api: &Api<K>,
    obj: &K,
    finalizer: &str,
) -> Result<(), kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    if obj.finalizers().iter().any(|f| f == finalizer) {
        return Ok(());
    }
    let mut finalizers = obj.finalizers().to_vec();
    finalizers.push(finalizer.to_string());
    let body =
        json!({"metadata": {"finalizers": finalizers, "resourceVersion": obj.resource_version()}});
    api.patch(&obj.name_any(), &params(), &Patch::Merge(&body))
        .await
        .map(|_| ())
}

pub(crate) async fn remove_finalizer<K>(
    api: &Api<K>,
    obj: &K,
    finalizer: &str,
) -> Result<(), kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let finalizers: Vec<&String> = obj
        .finalizers()
        .iter()
        .filter(|f| *f != finalizer)
        .collect();
    if finalizers.len() == obj.finalizers().len() {
        return Ok(());
    }
    let body =
        json!({"metadata": {"finalizers": finalizers, "resourceVersion": obj.resource_version()}});
    match api
        .patch(&obj.name_any(), &params(), &Patch::Merge(&body))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

pub(crate) async fn delete_quietly<K>(api: &Api<K>, name: &str) -> Result<(), kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Merges `want` into the object's status if any of its fields differ.
async fn patch_status_if_changed<K>(
    api: &Api<K>,
    obj: &K,
    current: &Value,
    want: Value,
) -> Result<(), kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let differs = want
        .as_object()
        .is_some_and(|w| w.iter().any(|(k, v)| current.get(k) != Some(v)));
    if differs {
        api.patch_status(
            &obj.name_any(),
            &params(),
            &Patch::Merge(&json!({"status": want})),
        )
        .await?;
    }
    Ok(())
}

// --- Cluster ---

async fn reconcile_cluster(cluster: Arc<Cluster>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let api: Api<Cluster> = Api::namespaced(ctx.client.clone(), &ns);
    let mcs: Api<MicrovmCluster> = Api::namespaced(ctx.client.clone(), &ns);
    let infra_name = cluster
        .spec
        .infrastructure_ref
        .as_ref()
        .filter(|r| r.api_group == GROUP && r.kind == "MicrovmCluster")
        .map(|r| r.name.clone());
    // The operator's Cluster view does not model the control plane reference.
    let kcps = Api::<DynamicObject>::namespaced_with(
        ctx.client.clone(),
        &ns,
        &kubeadm_control_plane_resource(),
    );
    let control_plane = control_plane_of(&ctx, &ns, &name).await?;

    if cluster.meta().deletion_timestamp.is_some() {
        // Descendants first: MachineDeployments, the control plane and Machines, then the
        // infrastructure, then the Cluster.
        let mds: Api<MachineDeployment> = Api::namespaced(ctx.client.clone(), &ns);
        for md in mds.list(&ListParams::default()).await? {
            if md.spec.cluster_name == name && md.meta().deletion_timestamp.is_none() {
                delete_quietly(&mds, &md.name_any()).await?;
            }
        }
        if let Some(kcp) = &control_plane {
            delete_quietly(&kcps, kcp).await?;
        }
        let pools_remain = super::machinepool::delete_pools_of(&ctx, &ns, &name).await?;
        let machines: Api<Machine> = Api::namespaced(ctx.client.clone(), &ns);
        let mine: Vec<Machine> = machines
            .list(&ListParams::default())
            .await?
            .into_iter()
            .filter(|m| m.spec.cluster_name == name)
            .collect();
        for m in &mine {
            // A MachinePool's Machines are its provider's to delete (it is being deleted above).
            let pool_owned = m
                .owner_references()
                .iter()
                .any(|o| o.kind == "MachinePool" && o.controller == Some(true));
            if m.meta().deletion_timestamp.is_none() && !pool_owned {
                delete_quietly(&machines, &m.name_any()).await?;
            }
        }
        if !mine.is_empty() || pools_remain {
            return Ok(Action::requeue(Duration::from_millis(500)));
        }
        if let Some(infra) = &infra_name
            && let Some(mc) = mcs.get_opt(infra).await?
        {
            if mc.meta().deletion_timestamp.is_none() {
                delete_quietly(&mcs, infra).await?;
            }
            return Ok(Action::requeue(Duration::from_millis(500)));
        }
        // Issue 13: the workload API goes with the Cluster.
        ctx.workloads.stop(&ClusterKey::new(&ns, &name)).await;
        remove_finalizer(&api, &cluster, CLUSTER_FINALIZER).await?;
        return Ok(Action::await_change());
    }

    ensure_finalizer(&api, &cluster, CLUSTER_FINALIZER).await?;
    // The control plane: owned by and labelled with the Cluster; its initialization is the Cluster's.
    let mut control_plane_initialized = false;
    if let Some(kcp_name) = &control_plane
        && let Some(kcp) = kcps.get_opt(kcp_name).await?
    {
        let owned = kcp
            .owner_references()
            .iter()
            .any(|o| o.kind == "Cluster" && o.uid == cluster.uid().unwrap_or_default());
        if !owned || kcp.labels().get(CLUSTER_NAME_LABEL) != Some(&name) {
            let mut owners = kcp.owner_references().to_vec();
            if !owned {
                owners.push(owner_ref(cluster.as_ref(), false));
            }
            let body = json!({"metadata": {"ownerReferences": owners, "labels": {CLUSTER_NAME_LABEL: name}}});
            kcps.patch(kcp_name, &params(), &Patch::Merge(&body))
                .await?;
        }
        control_plane_initialized = kcp
            .data
            .pointer("/status/initialization/controlPlaneInitialized")
            .and_then(Value::as_bool)
            == Some(true);
    }
    // Issue 13: the Cluster's workload API and its `<cluster>-kubeconfig` Secret.
    ctx.workloads.ensure(&ctx.client, cluster.as_ref()).await?;
    let Some(infra) = infra_name else {
        return Ok(Action::await_change());
    };
    let Some(mc) = mcs.get_opt(&infra).await? else {
        return Ok(Action::requeue(Duration::from_secs(5)));
    };
    // Ownership and label (since CAPI v1.13 a plain, non-controller owner reference).
    let mut owners = mc.owner_references().to_vec();
    let has_owner = owners
        .iter()
        .any(|o| o.kind == "Cluster" && o.uid == cluster.uid().unwrap_or_default());
    if !has_owner || mc.labels().get(CLUSTER_NAME_LABEL) != Some(&name) {
        if !has_owner {
            owners.push(owner_ref(cluster.as_ref(), false));
        }
        let body =
            json!({"metadata": {"ownerReferences": owners, "labels": {CLUSTER_NAME_LABEL: name}}});
        mcs.patch(&infra, &params(), &Patch::Merge(&body)).await?;
    }
    let provisioned = mc
        .status
        .as_ref()
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.provisioned)
        == Some(true);
    if provisioned {
        // The Cluster's own endpoint wins; ours is copied only when it has none.
        let has_endpoint = cluster
            .spec
            .control_plane_endpoint
            .as_ref()
            .is_some_and(|e| e.is_complete());
        if !has_endpoint
            && let Some(ep) = mc
                .spec
                .control_plane_endpoint
                .as_ref()
                .filter(|e| e.is_complete())
        {
            api.patch(
                &name,
                &params(),
                &Patch::Merge(&json!({"spec": {"controlPlaneEndpoint": ep}})),
            )
            .await?;
        }
        let mut fds = mc
            .status
            .as_ref()
            .map(|s| s.failure_domains.clone())
            .unwrap_or_default();
        fds.sort_by(|a, b| a.name.cmp(&b.name));
        let fds: Vec<Value> = fds
            .iter()
            .map(|f| json!({"name": f.name, "controlPlane": f.control_plane.unwrap_or(false), "attributes": f.attributes}))
            .collect();
        let mut want = json!({
            "initialization": {
                "infrastructureProvisioned": true,
                "controlPlaneInitialized": control_plane_initialized,
            },
            "phase": "Provisioned",
        });
        // CAPI's schema wants at least one item when the list is there.
        if !fds.is_empty() {
            want["failureDomains"] = json!(fds);
        }
        ctx.write_status(&api, cluster.as_ref(), want).await?;
    } else {
        ctx.write_status(&api, cluster.as_ref(), json!({"phase": "Provisioning"}))
            .await?;
    }
    Ok(Action::requeue(Duration::from_secs(60)))
}

// --- MachineDeployment ---

async fn reconcile_deployment(md: Arc<MachineDeployment>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    if md.meta().deletion_timestamp.is_some() {
        // Its Machines are garbage-collected through their owner references.
        return Ok(Action::await_change());
    }
    let ns = md.namespace().unwrap_or_default();
    let name = md.name_any();
    let machines: Api<Machine> = Api::namespaced(ctx.client.clone(), &ns);
    // From the watch cache, as CAPI's MachineSet lists its Machines.
    let mut mine: Vec<Arc<Machine>> = ctx
        .caches
        .machines
        .state()
        .await
        .into_iter()
        .filter(|m| {
            m.namespace().as_deref() == Some(ns.as_str())
                && m.labels().get(DEPLOYMENT_NAME_LABEL) == Some(&name)
                && m.meta().deletion_timestamp.is_none()
        })
        .collect();
    let want = usize::try_from(md.spec.replicas.unwrap_or(1).max(0)).unwrap_or(0);
    let mut retry_soon = false;

    if mine.len() < want {
        // As CAPI's MachineSet: every missing replica in this reconcile, then wait until the cache
        // shows them, so the next reconcile does not count them missing again.
        let mut created = Vec::with_capacity(want - mine.len());
        for _ in mine.len()..want {
            let Some(new) = deployment_machine(&ctx, &md, &ns).await? else {
                retry_soon = true;
                break;
            };
            let machine_name = new.name.clone();
            match create_machine(&ctx, new).await {
                Ok(true) => created.push(machine_name),
                Ok(false) => {
                    retry_soon = true;
                    break;
                }
                Err(e) => {
                    // The retry counts from the cache: it must show what was created so far.
                    wait_for_cache(&ctx.caches.machines, &ns, &created).await;
                    return Err(e);
                }
            }
        }
        wait_for_cache(&ctx.caches.machines, &ns, &created).await;
    } else if mine.len() > want {
        // Annotated victims first, then the newest.
        mine.sort_by(|a, b| {
            let a_marked = a.annotations().contains_key(DELETE_MACHINE_ANNOTATION);
            let b_marked = b.annotations().contains_key(DELETE_MACHINE_ANNOTATION);
            b_marked
                .cmp(&a_marked)
                .then_with(|| {
                    b.meta()
                        .creation_timestamp
                        .cmp(&a.meta().creation_timestamp)
                })
                .then_with(|| b.name_any().cmp(&a.name_any()))
        });
        for m in mine.iter().take(mine.len() - want) {
            delete_quietly(&machines, &m.name_any()).await?;
        }
    }

    let ready = mine.iter().filter(|m| machine_provisioned(m)).count();
    let mds: Api<MachineDeployment> = Api::namespaced(ctx.client.clone(), &ns);
    let status = md.status.clone().unwrap_or(Value::Null);
    let selector: Vec<String> = md
        .spec
        .selector
        .match_labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let mut want = json!({"replicas": mine.len(), "readyReplicas": ready});
    if !selector.is_empty() {
        want["selector"] = json!(selector.join(","));
    }
    patch_status_if_changed(&mds, md.as_ref(), &status, want).await?;
    // A template missing from the cache may only not have reached it yet; Machines still
    // provisioning are counted again in a second (their progress wakes nothing, see
    // `deployment_wakes`).
    Ok(Action::requeue(Duration::from_secs(
        if retry_soon || ready < mine.len() {
            1
        } else {
            60
        },
    )))
}

/// Which Machine changes wake their MachineDeployment: a Machine's arrival, its deletion's start and
/// end, and its marking for deletion; not its progress (status, references), which only moves
/// `readyReplicas` and is counted by the requeue while Machines provision. Its reconcile scans every
/// cached Machine: woken by each Machine's provisioning as well, it ran about 120 times a second at
/// 10 000 machines, 8 % of the simulators' CPU.
fn deployment_wakes(
    machines: Store<Machine>,
) -> impl Fn(Arc<Machine>) -> Option<ObjectRef<MachineDeployment>> + Send + Sync + 'static {
    let seen: Mutex<HashMap<String, (bool, bool)>> = Mutex::default();
    move |m| {
        let meta = m.meta();
        let owner = meta
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.kind == "MachineDeployment" && o.controller == Some(true))?;
        let uid = meta.uid.clone().unwrap_or_default();
        // The cache is updated before its subscribers hear of a change: a Machine it no longer
        // holds (or holds under another uid) is gone.
        let cached = machines
            .get(&ObjectRef::from_obj(m.as_ref()))
            .is_some_and(|c| c.meta().uid == meta.uid);
        let changed = if cached {
            let read = (
                meta.deletion_timestamp.is_some(),
                m.annotations().contains_key(DELETE_MACHINE_ANNOTATION),
            );
            lock(&seen).insert(uid, read) != Some(read)
        } else {
            lock(&seen).remove(&uid);
            true
        };
        changed.then(|| {
            ObjectRef::new(&owner.name).within(meta.namespace.as_deref().unwrap_or_default())
        })
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

/// The next Machine of a MachineDeployment (as its MachineSet makes it), or None (logged) when its
/// bootstrap template is missing.
async fn deployment_machine(
    ctx: &Ctx,
    md: &MachineDeployment,
    ns: &str,
) -> Result<Option<NewMachine>, Error> {
    let template_spec = &md.spec.template.spec;
    let bootstrap = &template_spec["bootstrap"];
    let bootstrap = match (
        bootstrap.get("dataSecretName").and_then(Value::as_str),
        bootstrap.get("configRef"),
    ) {
        (Some(secret), _) => NewBootstrap::Secret(secret.to_string()),
        (None, Some(r))
            if r["apiGroup"] == BOOTSTRAP_GROUP && r["kind"] == "KubeadmConfigTemplate" =>
        {
            let name = r["name"].as_str().unwrap_or_default();
            let Some(template) = ctx.caches.kubeadm_config_templates.get(ns, name).await else {
                warn!(template = %name, deployment = %md.name_any(), "the KubeadmConfigTemplate named does not exist");
                return Ok(None);
            };
            NewBootstrap::Kubeadm(
                template
                    .data
                    .pointer("/spec/template/spec")
                    .cloned()
                    .unwrap_or_else(|| json!({})),
            )
        }
        _ => {
            warn!(deployment = %md.name_any(), "spec.template.spec.bootstrap names no KubeadmConfigTemplate and no dataSecretName");
            return Ok(None);
        }
    };
    let mut labels = md.spec.template.metadata.labels.clone();
    labels.insert(CLUSTER_NAME_LABEL.to_string(), md.spec.cluster_name.clone());
    labels.insert(DEPLOYMENT_NAME_LABEL.to_string(), md.name_any());
    let text = |field: &str| {
        template_spec
            .get(field)
            .and_then(Value::as_str)
            .map(String::from)
    };
    Ok(Some(NewMachine {
        name: format!("{}-{}", md.name_any(), suffix_of(5)),
        namespace: ns.to_string(),
        cluster: md.spec.cluster_name.clone(),
        owner: owner_ref(md, true),
        labels,
        annotations: md.spec.template.metadata.annotations.clone(),
        infra_template: template_spec
            .pointer("/infrastructureRef/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        bootstrap,
        version: text("version"),
        failure_domain: text("failureDomain"),
    }))
}

/// The KubeadmControlPlane a Cluster names in `spec.controlPlaneRef`, if any.
async fn control_plane_of(ctx: &Ctx, ns: &str, cluster: &str) -> Result<Option<String>, Error> {
    let clusters = Api::<DynamicObject>::namespaced_with(
        ctx.client.clone(),
        ns,
        &ApiResource::erase::<Cluster>(&()),
    );
    Ok(clusters.get_opt(cluster).await?.and_then(|c| {
        let r = c.data.pointer("/spec/controlPlaneRef")?;
        (r["apiGroup"] == CONTROL_PLANE_GROUP && r["kind"] == "KubeadmControlPlane")
            .then(|| r["name"].as_str().map(String::from))
            .flatten()
    }))
}

// --- Machine ---

async fn reconcile_machine(machine: Arc<Machine>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = machine.namespace().unwrap_or_default();
    let name = machine.name_any();
    let api: Api<Machine> = Api::namespaced(ctx.client.clone(), &ns);
    let infras: Api<MicrovmMachine> = Api::namespaced(ctx.client.clone(), &ns);
    let infra_name = machine.spec.infrastructure_ref.name.clone();

    if machine.meta().deletion_timestamp.is_some() {
        // CAPI's order: delete the infrastructure machine and wait for it to be gone.
        if !infra_name.is_empty()
            && let Some(infra) = ctx.caches.microvm_machines.get(&ns, &infra_name).await
        {
            if infra.meta().deletion_timestamp.is_none() {
                delete_quietly(&infras, &infra_name).await?;
            }
            return Ok(Action::requeue(Duration::from_secs(2)));
        }
        // Issue 13: the Node goes once the InfraMachine is gone.
        super::nodes::delete_node(&ctx.workloads, machine.as_ref()).await?;
        remove_finalizer(&api, machine.as_ref(), MACHINE_FINALIZER).await?;
        lock(&ctx.bootstrap_copied).remove(&machine.uid().unwrap_or_default());
        lock(&ctx.adopted).remove(&machine.uid().unwrap_or_default());
        return Ok(Action::await_change());
    }
    ensure_finalizer(&api, machine.as_ref(), MACHINE_FINALIZER).await?;

    // Bootstrap data: the KubeadmConfig's Secret, once the bootstrap provider wrote it.
    let bootstrap_ready = match &machine.spec.bootstrap.data_secret_name {
        Some(_) => true,
        None => adopt_bootstrap_config(&ctx, &machine, &ns).await?,
    };

    let Some(infra) = ctx.caches.microvm_machines.get(&ns, &infra_name).await else {
        ctx.write_status(&api, machine.as_ref(), json!({"phase": "Pending"}))
            .await?;
        return Ok(Action::requeue(Duration::from_secs(5)));
    };
    // Controller ownership of the infrastructure machine moves from the deployment to the Machine.
    let is_controlled = infra.owner_references().iter().any(|o| {
        o.kind == "Machine" && o.controller == Some(true) && Some(&o.uid) == machine.uid().as_ref()
    });
    let infra_uid = infra.uid().unwrap_or_default();
    if (!is_controlled
        || infra.labels().get(CLUSTER_NAME_LABEL) != Some(&machine.spec.cluster_name))
        && !ctx.has_adopted(machine.as_ref(), &infra_uid)
    {
        // A pool's instance keeps its owner reference to the pool (capi-contract 5.3), so the
        // pool's deletion still collects instances whose Machine never appeared.
        let mut owners = vec![owner_ref(machine.as_ref(), true)];
        owners.extend(
            infra
                .owner_references()
                .iter()
                .filter(|o| o.kind == "MicrovmMachinePool" && o.controller != Some(true))
                .cloned(),
        );
        let body = json!({"metadata": {
            "ownerReferences": owners,
            "labels": {CLUSTER_NAME_LABEL: machine.spec.cluster_name},
        }});
        infras
            .patch(&infra_name, &params(), &Patch::Merge(&body))
            .await?;
        ctx.adopted(machine.as_ref(), infra_uid);
    }
    let infra_status = infra.status.clone().unwrap_or_default();
    let provisioned = infra_status
        .initialization
        .as_ref()
        .and_then(|i| i.provisioned)
        == Some(true);
    match (&infra.spec.provider_id, provisioned) {
        (Some(pid), true) => {
            if machine.spec.provider_id.as_ref() != Some(pid) {
                api.patch(
                    &name,
                    &params(),
                    &Patch::Merge(&json!({"spec": {"providerID": pid}})),
                )
                .await?;
            }
            let mut want = json!({
                "initialization": {"infrastructureProvisioned": true, "bootstrapDataSecretCreated": bootstrap_ready},
                "phase": "Running",
                "addresses": infra_status.addresses,
                "failureDomain": infra_status.failure_domain,
            });
            // Issue 13: nodeRef, nodeInfo and the phase from the matching Node.
            super::nodes::merge_node_status(&ctx.workloads, machine.as_ref(), pid, &mut want);
            ctx.write_status(&api, machine.as_ref(), want).await?;
        }
        _ => {
            // CAPI's phases: Provisioning once the bootstrap data is there, Pending before. One
            // status write per reconcile, as CAPI's patch helper makes: writing Pending and then
            // Provisioning in the same reconcile changed the Machine twice, and each change
            // triggered another reconcile until the bootstrap data came.
            let phase = if bootstrap_ready {
                "Provisioning"
            } else {
                "Pending"
            };
            ctx.write_status(&api, machine.as_ref(), json!({"phase": phase}))
                .await?;
        }
    }
    Ok(Action::requeue(Duration::from_secs(60)))
}

/// Adopts the Machine's KubeadmConfig (controller owner reference, as CAPI's Machine controller sets)
/// and copies its `status.dataSecretName` to the Machine's `spec.bootstrap.dataSecretName`. True once
/// the Machine has its bootstrap data.
async fn adopt_bootstrap_config(ctx: &Ctx, machine: &Machine, ns: &str) -> Result<bool, Error> {
    let uid = machine.uid().unwrap_or_default();
    if lock(&ctx.bootstrap_copied).contains(&uid) {
        return Ok(true);
    }
    let Some(config_ref) = &machine.spec.bootstrap.config_ref else {
        return Ok(false);
    };
    if config_ref.api_group != BOOTSTRAP_GROUP || config_ref.kind != "KubeadmConfig" {
        // Another bootstrap provider's object: nothing in this stand-in renders it.
        return Ok(false);
    }
    let name = config_ref.name.as_str();
    let configs =
        Api::<DynamicObject>::namespaced_with(ctx.client.clone(), ns, &kubeadm_config_resource());
    // A config the MachineDeployment has just created may not be in the cache yet, and until this
    // Machine adopts it no change of the config wakes the Machine. CAPI reads bootstrap objects
    // live (unstructured reads bypass its cache), so a cache miss reads live here too.
    let config = match ctx.caches.kubeadm_configs.get(ns, name).await {
        Some(config) => config,
        None => match configs.get_opt(name).await? {
            Some(config) => Arc::new(config),
            None => return Ok(false),
        },
    };
    let adopted = config.owner_references().iter().any(|o| {
        o.kind == "Machine" && o.controller == Some(true) && Some(&o.uid) == machine.uid().as_ref()
    });
    let config_uid = config.uid().unwrap_or_default();
    if !adopted && !ctx.has_adopted(machine, &config_uid) {
        let body = json!({"metadata": {"ownerReferences": [owner_ref(machine, true)]}});
        configs.patch(name, &params(), &Patch::Merge(&body)).await?;
        ctx.adopted(machine, config_uid);
    }
    let Some(secret) = config
        .data
        .pointer("/status/dataSecretName")
        .and_then(Value::as_str)
    else {
        return Ok(false);
    };
    let body = json!({"spec": {"bootstrap": {"dataSecretName": secret}}});
    Api::<Machine>::namespaced(ctx.client.clone(), ns)
        .patch(&machine.name_any(), &params(), &Patch::Merge(&body))
        .await?;
    // Reconciles that start from a Machine the cache has not updated yet need not copy it again.
    lock(&ctx.bootstrap_copied).insert(uid);
    Ok(true)
}
