//! The stand-in's three controllers. Writes are merge patches sent only when something changes.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use capmvm_api::capi::{Cluster, ContractVersionedObjectReference, Machine};
use capmvm_api::keys::{
    BOOTSTRAP_DATA_KEY, BOOTSTRAP_FORMAT_KEY, CLONED_FROM_GROUPKIND_ANNOTATION,
    CLONED_FROM_NAME_ANNOTATION, CLUSTER_NAME_LABEL,
};
use capmvm_api::{GROUP, MicrovmCluster, MicrovmMachine, MicrovmMachineTemplate};
use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Api, Resource, ResourceExt};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use super::crds::MachineDeployment;
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
}

struct Ctx {
    client: kube::Client,
    /// The status fields this stand-in last wrote, per object uid. The operator's views of Cluster
    /// and Machine model only what the provider reads, so the stand-in compares with its own writes.
    written: Mutex<HashMap<String, Value>>,
    /// The Clusters' workload APIs and their Nodes.
    workloads: WorkloadClusters,
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
}

impl StandIn {
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
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        written: Mutex::default(),
        workloads: workloads.clone(),
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
        // Machine changes matter to a Cluster only while it waits for them to go.
        .watches(Api::<Machine>::all(client.clone()), cfg(), |m| {
            let ns = m.namespace().unwrap_or_default();
            m.meta()
                .deletion_timestamp
                .is_some()
                .then(|| ObjectRef::new(&m.spec.cluster_name).within(&ns))
        })
        .run(reconcile_cluster, error_policy, ctx.clone())
        .for_each(|_| async {});
    let deployments = Controller::new(Api::<MachineDeployment>::all(client.clone()), cfg())
        .with_config(conc())
        .owns(Api::<Machine>::all(client.clone()), cfg())
        .run(reconcile_deployment, error_policy, ctx.clone())
        .for_each(|_| async {});
    let machines = Controller::new(Api::<Machine>::all(client.clone()), cfg())
        .with_config(conc())
        .watches(Api::<MicrovmMachine>::all(client.clone()), cfg(), |mm| {
            let ns = mm.namespace().unwrap_or_default();
            // Before adoption the clone's Machine has the same name (CAPI names them alike).
            Some(ObjectRef::new(&mm.name_any()).within(&ns))
        })
        // Issue 13: a Node registering (or changing) wakes the Machine with its providerID.
        .reconcile_on(workloads.machine_wakeups())
        .run(reconcile_machine, error_policy, ctx)
        .for_each(|_| async {});
    StandIn {
        tasks: vec![
            tokio::spawn(clusters),
            tokio::spawn(deployments),
            tokio::spawn(machines),
            super::nodes::run_health_checks(client, workloads.clone()),
        ],
        workloads,
    }
}

fn error_policy<K>(_: Arc<K>, error: &Error, _: Arc<Ctx>) -> Action {
    debug!(error = %error, "stand-in reconcile failed; retrying");
    Action::requeue(Duration::from_millis(500))
}

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(MANAGER.to_string()),
        ..Default::default()
    }
}

fn owner_ref<K: Resource<DynamicType = ()>>(obj: &K, controller: bool) -> OwnerReference {
    OwnerReference {
        api_version: K::api_version(&()).to_string(),
        kind: K::kind(&()).to_string(),
        name: obj.name_any(),
        uid: obj.uid().unwrap_or_default(),
        controller: controller.then_some(true),
        block_owner_deletion: controller.then_some(true),
    }
}

async fn ensure_finalizer<K>(api: &Api<K>, obj: &K, finalizer: &str) -> Result<(), kube::Error>
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

async fn remove_finalizer<K>(api: &Api<K>, obj: &K, finalizer: &str) -> Result<(), kube::Error>
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

async fn delete_quietly<K>(api: &Api<K>, name: &str) -> Result<(), kube::Error>
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

    if cluster.meta().deletion_timestamp.is_some() {
        // Descendants first: MachineDeployments and Machines, then the infrastructure, then the Cluster.
        let mds: Api<MachineDeployment> = Api::namespaced(ctx.client.clone(), &ns);
        for md in mds.list(&ListParams::default()).await? {
            if md.spec.cluster_name == name && md.meta().deletion_timestamp.is_none() {
                delete_quietly(&mds, &md.name_any()).await?;
            }
        }
        let machines: Api<Machine> = Api::namespaced(ctx.client.clone(), &ns);
        let mine: Vec<Machine> = machines
            .list(&ListParams::default())
            .await?
            .into_iter()
            .filter(|m| m.spec.cluster_name == name)
            .collect();
        for m in &mine {
            if m.meta().deletion_timestamp.is_none() {
                delete_quietly(&machines, &m.name_any()).await?;
            }
        }
        if !mine.is_empty() {
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
        let want = json!({
            "initialization": {"infrastructureProvisioned": true},
            "failureDomains": fds,
            "phase": "Provisioned",
        });
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
    let mut mine: Vec<Machine> = machines
        .list(&ListParams::default().labels(&format!("{DEPLOYMENT_NAME_LABEL}={name}")))
        .await?
        .into_iter()
        .filter(|m| m.meta().deletion_timestamp.is_none())
        .collect();
    let want = usize::try_from(md.spec.replicas.unwrap_or(1).max(0)).unwrap_or(0);

    if mine.len() < want {
        for _ in mine.len()..want {
            create_machine(&ctx, &md, &ns).await?;
        }
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

    let ready = mine
        .iter()
        .filter(|m| {
            m.status
                .as_ref()
                .and_then(|s| s.initialization.as_ref())
                .and_then(|i| i.infrastructure_provisioned)
                == Some(true)
        })
        .count();
    let mds: Api<MachineDeployment> = Api::namespaced(ctx.client.clone(), &ns);
    let status = md.status.clone().unwrap_or(Value::Null);
    let want = json!({"replicas": mine.len(), "readyReplicas": ready});
    patch_status_if_changed(&mds, md.as_ref(), &status, want).await?;
    Ok(Action::requeue(Duration::from_secs(60)))
}

/// A short random-looking suffix, as CAPI's generated names have.
fn suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let seed = k8s_openapi::jiff::Timestamp::now().as_nanosecond() as u64;
    let mut x = seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let alphabet = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            alphabet[((x >> 33) % alphabet.len() as u64) as usize] as char
        })
        .collect()
}

/// Clones a MicrovmMachine from the template and creates its Machine, as a MachineSet does.
async fn create_machine(ctx: &Ctx, md: &MachineDeployment, ns: &str) -> Result<(), Error> {
    let name = format!("{}-{}", md.name_any(), suffix());
    let template_spec = &md.spec.template.spec;
    let infra_ref: ContractVersionedObjectReference = serde_json::from_value(
        template_spec
            .get("infrastructureRef")
            .cloned()
            .unwrap_or_default(),
    )
    .unwrap_or_default();
    let templates: Api<MicrovmMachineTemplate> = Api::namespaced(ctx.client.clone(), ns);
    let Some(template) = templates.get_opt(&infra_ref.name).await? else {
        warn!(template = %infra_ref.name, "MachineDeployment names a MicrovmMachineTemplate that does not exist");
        return Ok(());
    };

    let mut labels: BTreeMap<String, String> = template
        .spec
        .template
        .metadata
        .as_ref()
        .map(|m| m.labels.clone())
        .unwrap_or_default();
    labels.extend(md.spec.template.metadata.labels.clone());
    labels.insert(CLUSTER_NAME_LABEL.to_string(), md.spec.cluster_name.clone());
    labels.insert(DEPLOYMENT_NAME_LABEL.to_string(), md.name_any());
    let mut annotations: BTreeMap<String, String> = template
        .spec
        .template
        .metadata
        .as_ref()
        .map(|m| m.annotations.clone())
        .unwrap_or_default();
    annotations.extend(md.spec.template.metadata.annotations.clone());
    annotations.insert(CLONED_FROM_NAME_ANNOTATION.to_string(), template.name_any());
    annotations.insert(
        CLONED_FROM_GROUPKIND_ANNOTATION.to_string(),
        format!("MicrovmMachineTemplate.{GROUP}"),
    );

    let mut infra = MicrovmMachine::new(&name, template.spec.template.spec.clone());
    infra.metadata = ObjectMeta {
        name: Some(name.clone()),
        namespace: Some(ns.to_string()),
        labels: Some(labels.clone()),
        annotations: Some(annotations),
        owner_references: Some(vec![owner_ref(md, false)]),
        ..Default::default()
    };
    Api::<MicrovmMachine>::namespaced(ctx.client.clone(), ns)
        .create(&PostParams::default(), &infra)
        .await?;

    // Created from JSON: the operator's Machine view does not model `version`.
    let mut spec = json!({
        "clusterName": md.spec.cluster_name,
        "bootstrap": {},
        "infrastructureRef": ContractVersionedObjectReference {
            api_group: GROUP.to_string(),
            kind: "MicrovmMachine".to_string(),
            name: name.clone(),
        },
    });
    for field in ["version", "failureDomain"] {
        if let Some(value) = template_spec.get(field).filter(|v| v.is_string()) {
            spec[field] = value.clone();
        }
    }
    let machine_labels: BTreeMap<String, String> = md
        .spec
        .template
        .metadata
        .labels
        .clone()
        .into_iter()
        .chain([
            (CLUSTER_NAME_LABEL.to_string(), md.spec.cluster_name.clone()),
            (DEPLOYMENT_NAME_LABEL.to_string(), md.name_any()),
        ])
        .collect();
    let resource = ApiResource::erase::<Machine>(&());
    let mut machine = DynamicObject::new(&name, &resource).data(json!({ "spec": spec }));
    machine.metadata = ObjectMeta {
        name: Some(name.clone()),
        namespace: Some(ns.to_string()),
        labels: Some(machine_labels),
        owner_references: Some(vec![owner_ref(md, true)]),
        finalizers: Some(vec![MACHINE_FINALIZER.to_string()]),
        ..Default::default()
    };
    Api::<DynamicObject>::namespaced_with(ctx.client.clone(), ns, &resource)
        .create(&PostParams::default(), &machine)
        .await?;
    Ok(())
}

// --- Machine ---

async fn reconcile_machine(machine: Arc<Machine>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = machine.namespace().unwrap_or_default();
    let name = machine.name_any();
    let api: Api<Machine> = Api::namespaced(ctx.client.clone(), &ns);
    let infras: Api<MicrovmMachine> = Api::namespaced(ctx.client.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let infra_name = machine.spec.infrastructure_ref.name.clone();

    if machine.meta().deletion_timestamp.is_some() {
        // CAPI's order: delete the infrastructure machine and wait for it to be gone.
        if !infra_name.is_empty()
            && let Some(infra) = infras.get_opt(&infra_name).await?
        {
            if infra.meta().deletion_timestamp.is_none() {
                delete_quietly(&infras, &infra_name).await?;
            }
            return Ok(Action::requeue(Duration::from_secs(2)));
        }
        if let Some(secret) = &machine.spec.bootstrap.data_secret_name {
            delete_quietly(&secrets, secret).await?;
        }
        // Issue 13: the Node goes once the InfraMachine is gone.
        super::nodes::delete_node(&ctx.workloads, machine.as_ref()).await?;
        remove_finalizer(&api, machine.as_ref(), MACHINE_FINALIZER).await?;
        return Ok(Action::await_change());
    }
    ensure_finalizer(&api, machine.as_ref(), MACHINE_FINALIZER).await?;

    // Bootstrap data, as CABPK writes it.
    if machine.spec.bootstrap.data_secret_name.is_none() {
        let secret_name = format!("{name}-bootstrap");
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(secret_name.clone()),
                namespace: Some(ns.clone()),
                labels: Some(BTreeMap::from([(
                    CLUSTER_NAME_LABEL.to_string(),
                    machine.spec.cluster_name.clone(),
                )])),
                owner_references: Some(vec![owner_ref(machine.as_ref(), true)]),
                ..Default::default()
            },
            type_: Some("cluster.x-k8s.io/secret".to_string()),
            data: Some(BTreeMap::from([
                (
                    BOOTSTRAP_DATA_KEY.to_string(),
                    ByteString(bootstrap_data(&machine).into_bytes()),
                ),
                (
                    BOOTSTRAP_FORMAT_KEY.to_string(),
                    ByteString(b"cloud-config".to_vec()),
                ),
            ])),
            ..Default::default()
        };
        match secrets.create(&PostParams::default(), &secret).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        let body = json!({"spec": {"bootstrap": {"dataSecretName": secret_name}}});
        api.patch(&name, &params(), &Patch::Merge(&body)).await?;
    }

    let Some(infra) = infras.get_opt(&infra_name).await? else {
        ctx.write_status(&api, machine.as_ref(), json!({"phase": "Pending"}))
            .await?;
        return Ok(Action::requeue(Duration::from_secs(5)));
    };
    // Controller ownership of the infrastructure machine moves from the deployment to the Machine.
    let is_controlled = infra.owner_references().iter().any(|o| {
        o.kind == "Machine" && o.controller == Some(true) && Some(&o.uid) == machine.uid().as_ref()
    });
    if !is_controlled || infra.labels().get(CLUSTER_NAME_LABEL) != Some(&machine.spec.cluster_name)
    {
        let body = json!({"metadata": {
            "ownerReferences": [owner_ref(machine.as_ref(), true)],
            "labels": {CLUSTER_NAME_LABEL: machine.spec.cluster_name},
        }});
        infras
            .patch(&infra_name, &params(), &Patch::Merge(&body))
            .await?;
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
                "initialization": {"infrastructureProvisioned": true, "bootstrapDataSecretCreated": true},
                "phase": "Running",
                "addresses": infra_status.addresses,
                "failureDomain": infra_status.failure_domain,
            });
            // Issue 13: nodeRef, nodeInfo and the phase from the matching Node.
            super::nodes::merge_node_status(&ctx.workloads, machine.as_ref(), pid, &mut want);
            ctx.write_status(&api, machine.as_ref(), want).await?;
        }
        _ => {
            ctx.write_status(&api, machine.as_ref(), json!({"phase": "Provisioning"}))
                .await?;
        }
    }
    Ok(Action::requeue(Duration::from_secs(60)))
}

/// What a kubeadm bootstrap provider would write: a cloud-config that writes kubeadm's config (with
/// the kubelet's provider-id as cluster templates give it, rendered by cloud-init's jinja) and joins
/// the node.
fn bootstrap_data(machine: &Machine) -> String {
    let (role, kind) = if machine.is_control_plane() {
        ("init", "InitConfiguration")
    } else {
        ("join", "JoinConfiguration")
    };
    format!(
        "## template: jinja\n#cloud-config\nwrite_files:\n- path: /run/kubeadm/kubeadm.yaml\n  owner: root:root\n  permissions: '0640'\n  content: |\n    apiVersion: kubeadm.k8s.io/v1beta4\n    kind: {kind}\n    nodeRegistration:\n      kubeletExtraArgs:\n      - name: provider-id\n        value: microvm://{{{{ ds.meta_data.vm_host }}}}/{{{{ ds.meta_data.instance_id }}}}\nruncmd:\n  - kubeadm {role} --config /run/kubeadm/kubeadm.yaml  # simulated for {}\n",
        machine.name_any()
    )
}
