//! CAPI core's MachinePool controller as v1.14 runs it (capi-contract 5.2 to 5.6), not more
//! convenient:
//!
//! - Ownership: the MachinePool gets the Cluster's owner reference; its bootstrap config and its
//!   InfraMachinePool get the MachinePool's controller reference and the `cluster-name` label.
//! - Bootstrap: a KubeadmConfig's `status.dataSecretName` is copied into
//!   `spec.template.spec.bootstrap.dataSecretName` (one Secret for the pool, rewritten when CABPK
//!   rotates the join token); a `dataSecretName` given directly is used as it is.
//! - Infrastructure readiness is the InfraMachinePool's `status.ready` only, written to
//!   `status.initialization.infrastructureProvisioned` (once true, it stays). Its
//!   `spec.providerIDList` and `status.replicas` are copied only while it is ready.
//! - MachinePool Machines ([`super::machinepool_machines`]) when it sets
//!   `status.infrastructureMachineKind`.
//! - Nodes: `status.nodeRefs` and the ready, available and up-to-date counts from the workload
//!   cluster's Nodes whose providerID is exactly in the list; a Node of `status.nodeRefs` whose
//!   providerID left the list is deleted, undrained (`deleteRetiredNodes`).
//! - Deletion: the bootstrap config and InfraMachinePool are deleted and waited for, then the Nodes
//!   left, then the finalizer goes.
//!
//! It never scales anything: the InfraMachinePool converges its instances to `spec.replicas`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use capmvm_api::capi::Cluster;
use capmvm_api::keys::CLUSTER_NAME_LABEL;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch};
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use tracing::{info, warn};

use super::bootstrap::{BOOTSTRAP_GROUP, kubeadm_config_resource};
use super::controllers::{Ctx, Error, delete_quietly, params};
use super::workload::ClusterKey;

/// Finalizer CAPI puts on MachinePools.
pub const MACHINE_POOL_FINALIZER: &str = "machinepool.cluster.x-k8s.io";

/// The CAPI contract label on a provider's CRD naming the versions that speak v1beta2.
const CONTRACT_LABEL: &str = "cluster.x-k8s.io/v1beta2";

/// `MachinePool` (v1beta2), as a dynamic resource.
pub fn machine_pool_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "MachinePool"),
        "machinepools",
    )
}

/// The MachinePool controller's own state: the provider kinds resolved through their CRDs.
pub(crate) struct PoolCtx {
    pub(crate) ctx: Arc<Ctx>,
    /// `(group, kind)` → the resource at the version the CRD's contract label names.
    kinds: Mutex<HashMap<(String, String), ApiResource>>,
}

impl AsRef<Ctx> for PoolCtx {
    fn as_ref(&self) -> &Ctx {
        &self.ctx
    }
}

impl PoolCtx {
    /// The resource of `kind` in `group` at the version its CRD's contract label names, as core
    /// resolves a `ContractVersionedObjectReference`; `None` when no such CRD exists.
    pub(crate) async fn resource_of(
        &self,
        group: &str,
        kind: &str,
    ) -> Result<Option<ApiResource>, Error> {
        let key = (group.to_string(), kind.to_string());
        if let Some(found) = self.kinds.lock().map_err(|_| Error::Poisoned)?.get(&key) {
            return Ok(Some(found.clone()));
        }
        let plural = format!("{}s", kind.to_lowercase());
        let crds: Api<CustomResourceDefinition> = Api::all(self.ctx.client.clone());
        let Some(crd) = crds.get_opt(&format!("{plural}.{group}")).await? else {
            return Ok(None);
        };
        // `v1alpha1_v1alpha2`: the last is the newest.
        let Some(version) = crd
            .labels()
            .get(CONTRACT_LABEL)
            .and_then(|v| v.split('_').next_back())
            .map(String::from)
        else {
            warn!(crd = %crd.name_any(), "the CRD has no {CONTRACT_LABEL} label; core cannot use it");
            return Ok(None);
        };
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, &version, kind),
            &crd.spec.names.plural,
        );
        self.kinds
            .lock()
            .map_err(|_| Error::Poisoned)?
            .insert(key, resource.clone());
        Ok(Some(resource))
    }
}

/// Starts the MachinePool controller.
pub(crate) fn run(ctx: Arc<Ctx>) -> impl std::future::Future<Output = ()> {
    let client = ctx.client.clone();
    let machines = ctx.caches.machines.subscribe();
    let configs = ctx.caches.kubeadm_configs.subscribe();
    let instances = ctx.caches.microvm_machines.subscribe();
    let pool_ctx = Arc::new(PoolCtx {
        ctx,
        kinds: Mutex::default(),
    });
    let cfg = || watcher::Config::default().any_semantic();
    let resource = machine_pool_resource();
    let infra_pools = ApiResource::erase::<capmvm_api::MicrovmMachinePool>(&());
    let mapped = resource.clone();
    Controller::new_with(
        Api::<DynamicObject>::all_with(client.clone(), &resource),
        cfg(),
        resource.clone(),
    )
    .with_config(ControllerConfig::default().concurrency(8))
    .owns_shared_stream(machines)
    .watches_shared_stream_with(
        configs,
        {
            let pools = resource.clone();
            move |config: Arc<DynamicObject>| {
                let ns = config.namespace().unwrap_or_default();
                config
                    .owner_references()
                    .iter()
                    .find(|o| o.kind == "MachinePool" && o.controller == Some(true))
                    .map(|o| ObjectRef::new_with(&o.name, pools.clone()).within(&ns))
            }
        },
        kubeadm_config_resource(),
    )
    .owns_with(
        Api::<DynamicObject>::all_with(client, &infra_pools),
        infra_pools,
        cfg(),
    )
    // An instance (de)labelled or changed wakes its pool: the label is the pool's name when it is a
    // valid label value (longer names are hashed and reach the pool through their Machine).
    .watches_shared_stream(instances, move |mm| {
        let ns = mm.namespace().unwrap_or_default();
        mm.labels()
            .get(capmvm_api::keys::POOL_NAME_LABEL)
            .filter(|v| !v.starts_with("hash_"))
            .map(|pool| ObjectRef::new_with(pool, mapped.clone()).within(&ns))
    })
    .run(
        |obj, ctx| super::retry::forgetting_failures(obj, ctx, reconcile),
        super::retry::error_policy,
        pool_ctx,
    )
    .for_each(|_| async {})
}

/// Deletes the MachinePools of Cluster `ns/cluster` (the Cluster is being deleted); true while any
/// of them still exists.
pub(crate) async fn delete_pools_of(ctx: &Ctx, ns: &str, cluster: &str) -> Result<bool, Error> {
    let pools =
        Api::<DynamicObject>::namespaced_with(ctx.client.clone(), ns, &machine_pool_resource());
    let mine: Vec<DynamicObject> = match pools.list(&ListParams::default()).await {
        Ok(list) => list.items,
        // MachinePools not served (an emulator without CAPI's CRDs for them): none.
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    let mine: Vec<DynamicObject> = mine
        .into_iter()
        .filter(|p| text_at(&p.data, "/spec/clusterName") == Some(cluster))
        .collect();
    for pool in &mine {
        if pool.metadata.deletion_timestamp.is_none() {
            delete_quietly(&pools, &pool.name_any()).await?;
        }
    }
    Ok(!mine.is_empty())
}

pub(crate) fn text_at<'a>(obj: &'a Value, pointer: &str) -> Option<&'a str> {
    obj.pointer(pointer).and_then(Value::as_str)
}

/// A `ContractVersionedObjectReference` at `pointer`: `(apiGroup, kind, name)`.
/// `spec.providerIDList`, the same field on the MachinePool and on its infrastructure pool.
fn provider_ids(obj: &Value) -> Vec<String> {
    obj.pointer("/spec/providerIDList")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(String::from))
        .collect()
}

fn reference_at<'a>(obj: &'a Value, pointer: &str) -> Option<(&'a str, &'a str, &'a str)> {
    let r = obj.pointer(pointer)?;
    Some((
        r.get("apiGroup")?.as_str()?,
        r.get("kind")?.as_str()?,
        r.get("name")?.as_str()?,
    ))
}

fn pool_owner_ref(mp: &DynamicObject) -> OwnerReference {
    OwnerReference {
        api_version: "cluster.x-k8s.io/v1beta2".to_string(),
        kind: "MachinePool".to_string(),
        name: mp.name_any(),
        uid: mp.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Gives `obj` the MachinePool's controller reference and the `cluster-name` label (one merge patch,
/// only when something is missing), keeping its other owners.
async fn adopt(
    api: &Api<DynamicObject>,
    obj: &DynamicObject,
    mp: &DynamicObject,
    cluster: &str,
) -> Result<(), Error> {
    let owner = pool_owner_ref(mp);
    let owned = obj.owner_references().iter().any(|o| o.uid == owner.uid);
    if owned && obj.labels().get(CLUSTER_NAME_LABEL).map(String::as_str) == Some(cluster) {
        return Ok(());
    }
    let mut owners: Vec<OwnerReference> = obj
        .owner_references()
        .iter()
        .filter(|o| o.uid != owner.uid && o.controller != Some(true))
        .cloned()
        .collect();
    owners.push(owner);
    let body =
        json!({"metadata": {"ownerReferences": owners, "labels": {CLUSTER_NAME_LABEL: cluster}}});
    api.patch(&obj.name_any(), &params(), &Patch::Merge(&body))
        .await?;
    Ok(())
}

async fn reconcile(mp: Arc<DynamicObject>, pctx: Arc<PoolCtx>) -> Result<Action, Error> {
    let ctx = &pctx.ctx;
    let ns = mp.namespace().unwrap_or_default();
    let name = mp.name_any();
    let pools =
        Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &ns, &machine_pool_resource());
    if mp.metadata.deletion_timestamp.is_some() {
        return reconcile_delete(&pctx, &pools, &mp).await;
    }
    let Some(cluster_name) = text_at(&mp.data, "/spec/clusterName").map(String::from) else {
        warn!(pool = %name, "MachinePool has no spec.clusterName");
        return Ok(Action::await_change());
    };
    let clusters: Api<Cluster> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(cluster) = clusters.get_opt(&cluster_name).await? else {
        return Ok(Action::requeue(Duration::from_secs(2)));
    };

    // The finalizer and the Cluster's owner reference, in one conditional write.
    let has_finalizer = mp.finalizers().iter().any(|f| f == MACHINE_POOL_FINALIZER);
    let cluster_uid = cluster.uid().unwrap_or_default();
    let has_owner = mp.owner_references().iter().any(|o| o.uid == cluster_uid);
    if !has_finalizer || !has_owner {
        let mut finalizers = mp.finalizers().to_vec();
        if !has_finalizer {
            finalizers.push(MACHINE_POOL_FINALIZER.to_string());
        }
        let mut owners = mp.owner_references().to_vec();
        if !has_owner {
            owners.push(super::controllers::owner_ref(&cluster, false));
        }
        let body = json!({"metadata": {
            "finalizers": finalizers,
            "ownerReferences": owners,
            "resourceVersion": mp.resource_version(),
        }});
        pools.patch(&name, &params(), &Patch::Merge(&body)).await?;
        // Our write wakes us with the new version.
        return Ok(Action::await_change());
    }

    let bootstrap_ready = reconcile_bootstrap(ctx, &pools, &mp, &ns, &cluster_name).await?;

    // The InfraMachinePool.
    let Some((group, kind, infra_name)) =
        reference_at(&mp.data, "/spec/template/spec/infrastructureRef")
    else {
        warn!(pool = %name, "MachinePool has no spec.template.spec.infrastructureRef");
        return Ok(Action::await_change());
    };
    let Some(infra_resource) = pctx.resource_of(group, kind).await? else {
        warn!(pool = %name, %group, %kind, "no CRD serves the MachinePool's infrastructureRef kind");
        return Ok(Action::requeue(Duration::from_secs(5)));
    };
    let infras = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &ns, &infra_resource);
    let mut want = json!({});
    let provisioned_before = mp
        .data
        .pointer("/status/initialization/infrastructureProvisioned")
        == Some(&json!(true));
    let Some(infra) = infras.get_opt(infra_name).await? else {
        want["initialization"] = json!({
            "infrastructureProvisioned": provisioned_before,
            "bootstrapDataSecretCreated": bootstrap_ready,
        });
        want["phase"] = json!(if bootstrap_ready {
            "Provisioning"
        } else {
            "Pending"
        });
        write_status(&pools, &mp, want).await?;
        return Ok(Action::requeue(Duration::from_secs(2)));
    };
    adopt(&infras, &infra, &mp, &cluster_name).await?;

    let key = ClusterKey::new(&ns, &cluster_name);
    let nodes = ctx.workloads.nodes(&key);
    let by_provider_id: HashMap<&str, &Node> = nodes
        .iter()
        .filter_map(|n| Some((n.spec.as_ref()?.provider_id.as_deref()?, n.as_ref())))
        .collect();

    // MachinePool Machines come before the readiness gate, as in core.
    if let Some(instance_kind) = text_at(&infra.data, "/status/infrastructureMachineKind") {
        super::machinepool_machines::reconcile(
            &pctx,
            &mp,
            &infra_resource,
            instance_kind,
            &cluster_name,
            &by_provider_id,
        )
        .await?;
    }

    // Core reads only `status.ready` (external.IsReady).
    let ready = infra.data.pointer("/status/ready") == Some(&json!(true));
    let provisioned = provisioned_before || ready;
    want["initialization"] = json!({
        "infrastructureProvisioned": provisioned,
        "bootstrapDataSecretCreated": bootstrap_ready,
    });
    if !ready {
        want["phase"] = json!(if !bootstrap_ready {
            "Pending"
        } else if provisioned {
            "Provisioned"
        } else {
            "Provisioning"
        });
        write_status(&pools, &mp, want).await?;
        return Ok(Action::requeue(Duration::from_secs(2)));
    }

    let replicas = infra
        .data
        .pointer("/status/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    want["replicas"] = json!(replicas);
    let list = provider_ids(&infra.data);
    if list.is_empty() && replicas != 0 {
        // The provider reports instances but no IDs yet: core waits.
        write_status(&pools, &mp, want).await?;
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let current_list = provider_ids(&mp.data);
    if current_list != list {
        pools
            .patch(
                &name,
                &params(),
                &Patch::Merge(&json!({"spec": {"providerIDList": list}})),
            )
            .await?;
    }

    // Nodes: exact providerID matches, and the retired ones deleted.
    delete_retired_nodes(ctx, &key, &mp, &list).await?;
    let min_ready = mp
        .data
        .pointer("/spec/template/spec/minReadySeconds")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let now = k8s_openapi::jiff::Timestamp::now();
    let mut node_refs = Vec::new();
    let (mut ready_nodes, mut available) = (0, 0);
    for pid in &list {
        let Some(node) = by_provider_id.get(pid.as_str()) else {
            continue;
        };
        node_refs.push(
            json!({"apiVersion": "v1", "kind": "Node", "name": node.name_any(), "uid": node.uid()}),
        );
        if let Some(since) = ready_since(node) {
            ready_nodes += 1;
            let for_secs = now.duration_since(since).as_secs();
            if for_secs >= 0 && for_secs as u64 >= min_ready {
                available += 1;
            }
        }
    }
    let desired = mp
        .data
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    want["nodeRefs"] = json!(node_refs);
    want["readyReplicas"] = json!(ready_nodes);
    want["availableReplicas"] = json!(available);
    // Core knows nothing of template drift: every matched instance is up to date to it.
    want["upToDateReplicas"] = json!(node_refs.len());
    want["phase"] = json!(if replicas < desired {
        "ScalingUp"
    } else if replicas > desired {
        "ScalingDown"
    } else if ready_nodes == desired && node_refs.len() == list.len() {
        "Running"
    } else {
        "Provisioned"
    });
    let settled = node_refs.len() == list.len() && ready_nodes == list.len() as i64;
    write_status(&pools, &mp, want).await?;
    // Nodes are watched by polling the workload cluster's cache: often while any is missing.
    Ok(Action::requeue(if settled {
        Duration::from_secs(10)
    } else {
        Duration::from_secs(1)
    }))
}

/// When the Node's Ready condition last became True, if it is True now.
fn ready_since(node: &Node) -> Option<k8s_openapi::jiff::Timestamp> {
    let c = node
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")?;
    Some(
        c.last_transition_time
            .as_ref()
            .map_or_else(k8s_openapi::jiff::Timestamp::now, |t| t.0),
    )
}

/// Adopts the pool's bootstrap config and copies its Secret's name into the pool's template; true
/// once the pool has bootstrap data.
async fn reconcile_bootstrap(
    ctx: &Ctx,
    pools: &Api<DynamicObject>,
    mp: &DynamicObject,
    ns: &str,
    cluster: &str,
) -> Result<bool, Error> {
    let given = text_at(&mp.data, "/spec/template/spec/bootstrap/dataSecretName");
    let Some((group, kind, config_name)) =
        reference_at(&mp.data, "/spec/template/spec/bootstrap/configRef")
    else {
        return Ok(given.is_some());
    };
    if group != BOOTSTRAP_GROUP || kind != "KubeadmConfig" {
        // Another bootstrap provider's object: nothing in this stand-in renders it.
        return Ok(given.is_some());
    }
    let configs =
        Api::<DynamicObject>::namespaced_with(ctx.client.clone(), ns, &kubeadm_config_resource());
    let Some(config) = configs.get_opt(config_name).await? else {
        return Ok(false);
    };
    adopt(&configs, &config, mp, cluster).await?;
    let Some(secret) = text_at(&config.data, "/status/dataSecretName") else {
        return Ok(false);
    };
    if given != Some(secret) {
        let body =
            json!({"spec": {"template": {"spec": {"bootstrap": {"dataSecretName": secret}}}}});
        pools
            .patch(&mp.name_any(), &params(), &Patch::Merge(&body))
            .await?;
    }
    Ok(true)
}

/// Deletes the Nodes of `status.nodeRefs` whose providerID is no longer in `list` (undrained, as
/// core does: the provider keeps an ID in the list until its Machine drained).
async fn delete_retired_nodes(
    ctx: &Ctx,
    cluster: &ClusterKey,
    mp: &DynamicObject,
    list: &[String],
) -> Result<(), Error> {
    let keep: HashSet<&str> = list.iter().map(String::as_str).collect();
    let referenced: Vec<&str> = mp
        .data
        .pointer("/status/nodeRefs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r.get("name").and_then(Value::as_str))
        .collect();
    if referenced.is_empty() {
        return Ok(());
    }
    let Some(client) = ctx.workloads.client(cluster) else {
        return Ok(());
    };
    let nodes = ctx.workloads.nodes(cluster);
    let by_name: BTreeMap<String, &Node> =
        nodes.iter().map(|n| (n.name_any(), n.as_ref())).collect();
    let api: Api<Node> = Api::all(client);
    for name in referenced {
        let Some(node) = by_name.get(name) else {
            continue;
        };
        let pid = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
        if pid.is_some_and(|p| keep.contains(p)) {
            continue;
        }
        match api.delete(name, &DeleteParams::background()).await {
            Ok(_) => {
                info!(pool = %mp.name_any(), node = %name, "deleted a Node whose providerID left the MachinePool's list")
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Core's deletion: the bootstrap config and InfraMachinePool first (and gone), then the Nodes
/// left, then the finalizer.
async fn reconcile_delete(
    pctx: &PoolCtx,
    pools: &Api<DynamicObject>,
    mp: &DynamicObject,
) -> Result<Action, Error> {
    let ctx = &pctx.ctx;
    let ns = mp.namespace().unwrap_or_default();
    write_status(pools, mp, json!({"phase": "Deleting"})).await?;
    let mut waiting = false;
    if let Some((group, kind, name)) =
        reference_at(&mp.data, "/spec/template/spec/bootstrap/configRef")
        && group == BOOTSTRAP_GROUP
        && kind == "KubeadmConfig"
    {
        let configs = Api::<DynamicObject>::namespaced_with(
            ctx.client.clone(),
            &ns,
            &kubeadm_config_resource(),
        );
        if let Some(config) = configs.get_opt(name).await? {
            waiting = true;
            if config.metadata.deletion_timestamp.is_none() {
                delete_quietly(&configs, name).await?;
            }
        }
    }
    if let Some((group, kind, name)) =
        reference_at(&mp.data, "/spec/template/spec/infrastructureRef")
        && let Some(resource) = pctx.resource_of(group, kind).await?
    {
        let infras = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &ns, &resource);
        if let Some(infra) = infras.get_opt(name).await? {
            waiting = true;
            if infra.metadata.deletion_timestamp.is_none() {
                delete_quietly(&infras, name).await?;
            }
        }
    }
    if waiting {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    // The Nodes still referenced go, unless the pool's nodeDeletionTimeout has passed.
    let timeout = mp
        .data
        .pointer("/spec/template/spec/deletion/nodeDeletionTimeoutSeconds")
        .and_then(Value::as_i64);
    let deleted_at = mp.metadata.deletion_timestamp.as_ref().map(|t| t.0);
    let timed_out = match (timeout, deleted_at) {
        (Some(t), Some(at)) if t > 0 => {
            k8s_openapi::jiff::Timestamp::now()
                .duration_since(at)
                .as_secs()
                > t
        }
        _ => false,
    };
    if let Some(cluster) = text_at(&mp.data, "/spec/clusterName")
        && !timed_out
    {
        delete_retired_nodes(ctx, &ClusterKey::new(&ns, cluster), mp, &[]).await?;
    }
    let finalizers: Vec<&String> = mp
        .finalizers()
        .iter()
        .filter(|f| *f != MACHINE_POOL_FINALIZER)
        .collect();
    if finalizers.len() != mp.finalizers().len() {
        let body = json!({"metadata": {"finalizers": finalizers, "resourceVersion": mp.resource_version()}});
        match pools
            .patch(&mp.name_any(), &params(), &Patch::Merge(&body))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Action::await_change())
}

/// Merges `want` into the pool's status if any of its fields differ from what is stored.
async fn write_status(
    pools: &Api<DynamicObject>,
    mp: &DynamicObject,
    want: Value,
) -> Result<(), Error> {
    let current = mp.data.get("status").cloned().unwrap_or(Value::Null);
    let differs = want
        .as_object()
        .is_some_and(|w| w.iter().any(|(k, v)| current.get(k) != Some(v)));
    if differs {
        match pools
            .patch_status(
                &mp.name_any(),
                &params(),
                &Patch::Merge(&json!({"status": want})),
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
