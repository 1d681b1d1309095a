//! The KubeadmControlPlane controller's role (controlplane.cluster.x-k8s.io/v1beta2, the fields a
//! cluster template uses): `spec.replicas` control-plane Machines cloned from
//! `spec.machineTemplate.spec.infrastructureRef`, one KubeadmConfig each from `spec.kubeadmConfigSpec`
//! (the first `kubeadm init`, the others `kubeadm join` as control-plane members, created only once
//! the control plane is initialized), scaling up and down one Machine at a time as KCP's preflight
//! checks allow (every Machine provisioned before the next joins; a deleted one gone before the
//! next goes), and `status.replicas`, `readyReplicas`, `upToDateReplicas`, `availableReplicas`,
//! `selector`, `version` and
//! `initialization.controlPlaneInitialized` (once its first machine is provisioned: hollow machines
//! run no API server to probe).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use capmvm_api::capi::Machine;
use capmvm_api::keys::{CLUSTER_NAME_LABEL, CONTROL_PLANE_LABEL, PAUSED_ANNOTATION};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch};
use kube::runtime::controller::Action;
use kube::runtime::{Controller, watcher};
use kube::{Api, Resource, ResourceExt};
use serde_json::{Value, json};

use super::DELETE_MACHINE_ANNOTATION;
use super::clone::{NewBootstrap, NewMachine, create_machine, own_template, suffix_of};
use super::controllers::{
    Ctx, Error, delete_quietly, ensure_finalizer, machine_provisioned, params, remove_finalizer,
};

/// The control plane provider's API group.
pub const CONTROL_PLANE_GROUP: &str = "controlplane.cluster.x-k8s.io";
/// Label CAPI's KubeadmControlPlane puts on its Machines.
pub const CONTROL_PLANE_NAME_LABEL: &str = "cluster.x-k8s.io/control-plane-name";

/// `KubeadmControlPlane` (v1beta2), as a dynamic resource.
pub fn kubeadm_control_plane_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(CONTROL_PLANE_GROUP, "v1beta2", "KubeadmControlPlane"),
        "kubeadmcontrolplanes",
    )
}

/// The real KubeadmControlPlane's finalizer.
pub const CONTROL_PLANE_FINALIZER: &str = "kubeadm.controlplane.cluster.x-k8s.io";
/// How soon a deleting control plane looks again while Machines remain (the real one waits 30 s;
/// its Machines' changes wake it sooner here).
const DELETE_REQUEUE: Duration = Duration::from_secs(2);

/// How soon a paused control plane looks again.
const PAUSED_REQUEUE: Duration = Duration::from_secs(2);

/// Starts the KubeadmControlPlane controller.
pub(crate) fn run(ctx: Arc<Ctx>) -> impl std::future::Future<Output = ()> {
    let resource = kubeadm_control_plane_resource();
    let api = Api::<DynamicObject>::all_with(ctx.client.clone(), &resource);
    let cfg = || watcher::Config::default().any_semantic();
    Controller::new_with(api, cfg(), resource)
        .watches_shared_stream(ctx.caches.machines.subscribe(), |m| {
            let ns = m.namespace().unwrap_or_default();
            m.labels().get(CONTROL_PLANE_NAME_LABEL).map(|kcp| {
                kube::runtime::reflector::ObjectRef::new_with(kcp, kubeadm_control_plane_resource())
                    .within(&ns)
            })
        })
        .run(
            |obj, ctx| super::retry::forgetting_failures(obj, ctx, reconcile),
            super::retry::error_policy,
            ctx,
        )
        .for_each(|_| async {})
}

fn owner_of(kcp: &DynamicObject) -> OwnerReference {
    OwnerReference {
        api_version: format!("{CONTROL_PLANE_GROUP}/v1beta2"),
        kind: "KubeadmControlPlane".into(),
        name: kcp.name_any(),
        uid: kcp.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

async fn reconcile(kcp: Arc<DynamicObject>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = kcp.namespace().unwrap_or_default();
    let name = kcp.name_any();
    let kcps = Api::<DynamicObject>::namespaced_with(
        ctx.client.clone(),
        &ns,
        &kubeadm_control_plane_resource(),
    );
    // Paused as the real KubeadmControlPlane is: by its Cluster's `spec.paused` (which
    // `clusterctl move` sets on the source) or its own annotation. Without it, the source's stand-in
    // re-created the Machines the move had just removed.
    let cluster_paused = kcp
        .labels()
        .get(CLUSTER_NAME_LABEL)
        .and_then(|c| {
            ctx.caches
                .clusters
                .store()
                .get(&kube::runtime::reflector::ObjectRef::new(c).within(&ns))
        })
        .is_some_and(|c| c.spec.paused == Some(true));
    if cluster_paused || kcp.annotations().contains_key(PAUSED_ANNOTATION) {
        // Nothing maps a Cluster's changes to its control plane here: look again shortly.
        return Ok(Action::requeue(PAUSED_REQUEUE));
    }
    if kcp.meta().deletion_timestamp.is_some() {
        return reconcile_delete(&kcp, &kcps, &ctx).await;
    }
    if !kcp
        .finalizers()
        .iter()
        .any(|f| f == CONTROL_PLANE_FINALIZER)
    {
        // As the real KubeadmControlPlane: its finalizer holds the Cluster's deletion until its
        // Machines are gone (without it, CAPI removed the Cluster under a Machine still deleting).
        ensure_finalizer(&kcps, &kcp, CONTROL_PLANE_FINALIZER).await?;
        return Ok(Action::await_change());
    }
    // The Cluster controller labels its control plane with the cluster's name.
    let Some(cluster) = kcp.labels().get(CLUSTER_NAME_LABEL).cloned() else {
        return Ok(Action::requeue(Duration::from_secs(1)));
    };
    let spec = kcp.data.get("spec").cloned().unwrap_or_else(|| json!({}));
    let cluster_owner = ctx
        .caches
        .clusters
        .store()
        .get(&kube::runtime::reflector::ObjectRef::new(&cluster).within(&ns))
        .map(|c| OwnerReference {
            api_version: "cluster.x-k8s.io/v1beta2".into(),
            kind: "Cluster".into(),
            name: cluster.clone(),
            uid: c.uid().unwrap_or_default(),
            controller: None,
            block_owner_deletion: None,
        });
    let template = spec
        .pointer("/machineTemplate/spec/infrastructureRef/name")
        .and_then(Value::as_str);
    if let (Some(owner), Some(template)) = (cluster_owner, template) {
        // A Cluster not in the cache yet is owner on a later reconcile.
        own_template(&ctx, &ns, template, &owner).await?;
    }
    let want = usize::try_from(spec["replicas"].as_i64().unwrap_or(1).max(0)).unwrap_or(0);
    let machines: Api<Machine> = Api::namespaced(ctx.client.clone(), &ns);
    let (deleting, mut mine): (Vec<Machine>, Vec<Machine>) = machines
        .list(&ListParams::default().labels(&format!("{CONTROL_PLANE_NAME_LABEL}={name}")))
        .await?
        .items
        .into_iter()
        .partition(|m| m.meta().deletion_timestamp.is_some());
    // KCP decides from the status it read: the first machine's control plane is recorded as
    // initialized (below) before any join is created, in a later reconcile. Sticky once true.
    let recorded = kcp
        .data
        .pointer("/status/initialization/controlPlaneInitialized")
        .and_then(Value::as_bool)
        == Some(true);
    let initialized = recorded || mine.iter().any(machine_provisioned);

    match scale_step(want, &mine, deleting.len(), recorded) {
        ScaleStep::Init => {
            create_machine(&ctx, new_machine(&kcp, &ns, &cluster, &spec, true)).await?;
        }
        ScaleStep::Join => {
            create_machine(&ctx, new_machine(&kcp, &ns, &cluster, &spec, false)).await?;
        }
        ScaleStep::Remove => {
            // Machines marked for deletion first, then the oldest (as KCP does).
            mine.sort_by(|a, b| {
                let marked = |m: &Machine| m.annotations().contains_key(DELETE_MACHINE_ANNOTATION);
                marked(b)
                    .cmp(&marked(a))
                    .then_with(|| {
                        a.meta()
                            .creation_timestamp
                            .cmp(&b.meta().creation_timestamp)
                    })
                    .then_with(|| a.name_any().cmp(&b.name_any()))
            });
            if let Some(m) = mine.first() {
                delete_quietly(&machines, &m.name_any()).await?;
            }
        }
        ScaleStep::Wait | ScaleStep::Settled => {}
    }
    let ready = mine.iter().filter(|m| machine_provisioned(m)).count();
    // The stand-in never rolls its Machines, so every one is up to date; a provisioned one counts
    // as available. CAPI's topology controller reads both: a control plane whose replicas,
    // upToDateReplicas, readyReplicas and availableReplicas differ from spec.replicas (or lack)
    // is scaling, and no MachineDeployment or MachinePool of a ClusterClass is created until it
    // is stable.
    let mut status = json!({
        "replicas": mine.len(),
        "readyReplicas": ready,
        "upToDateReplicas": mine.len(),
        "availableReplicas": ready,
        "selector": format!("{CLUSTER_NAME_LABEL}={cluster},{CONTROL_PLANE_LABEL},{CONTROL_PLANE_NAME_LABEL}={name}"),
    });
    if let Some(v) = spec.get("version").and_then(Value::as_str) {
        status["version"] = json!(v);
    }
    if initialized {
        status["initialization"] = json!({"controlPlaneInitialized": true});
    }
    let current = kcp.data.get("status").cloned().unwrap_or(Value::Null);
    let differs = status
        .as_object()
        .is_some_and(|w| w.iter().any(|(k, v)| current.get(k) != Some(v)));
    if differs {
        Api::<DynamicObject>::namespaced_with(
            ctx.client.clone(),
            &ns,
            &kubeadm_control_plane_resource(),
        )
        .patch_status(&name, &params(), &Patch::Merge(&json!({"status": status})))
        .await?;
    }
    Ok(Action::requeue(Duration::from_secs(60)))
}

/// Deletion as the real KubeadmControlPlane does it: while the cluster has other Machines (workers,
/// pool instances) it waits for them; then it deletes its own Machines and waits for them to go;
/// then it releases its finalizer.
async fn reconcile_delete(
    kcp: &DynamicObject,
    kcps: &Api<DynamicObject>,
    ctx: &Ctx,
) -> Result<Action, Error> {
    let ns = kcp.namespace().unwrap_or_default();
    let name = kcp.name_any();
    let machines: Api<Machine> = Api::namespaced(ctx.client.clone(), &ns);
    let mine = machines
        .list(&ListParams::default().labels(&format!("{CONTROL_PLANE_NAME_LABEL}={name}")))
        .await?
        .items;
    if mine.is_empty() {
        remove_finalizer(kcps, kcp, CONTROL_PLANE_FINALIZER).await?;
        return Ok(Action::await_change());
    }
    let cluster = kcp
        .labels()
        .get(CLUSTER_NAME_LABEL)
        .cloned()
        .unwrap_or_default();
    let all = machines
        .list(&ListParams::default().labels(&format!("{CLUSTER_NAME_LABEL}={cluster}")))
        .await?
        .items;
    if all.len() == mine.len() {
        for m in mine
            .iter()
            .filter(|m| m.meta().deletion_timestamp.is_none())
        {
            delete_quietly(&machines, &m.name_any()).await?;
        }
    }
    Ok(Action::requeue(DELETE_REQUEUE))
}

/// What KubeadmControlPlane does next towards `want` replicas, one Machine at a time.
#[derive(Debug, PartialEq, Eq)]
enum ScaleStep {
    /// Create the first Machine, which runs `kubeadm init`.
    Init,
    /// Create one Machine that joins the initialized control plane.
    Join,
    /// Delete one Machine.
    Remove,
    /// Wait: for the control plane to be initialized, for every Machine to be provisioned, or for a
    /// deletion to finish, before the next step (KCP's preflight checks).
    Wait,
    /// At `want`.
    Settled,
}

/// The next step from `live` Machines (none being deleted), `deleting` ones being deleted, and
/// whether the control plane is initialized. Real KCP never creates a join Machine before the init
/// Machine's control plane is up, scales up only while every Machine is healthy, and scales one
/// Machine at a time, waiting for a deleted one to be gone.
fn scale_step(want: usize, live: &[Machine], deleting: usize, initialized: bool) -> ScaleStep {
    if live.len() == want {
        return ScaleStep::Settled;
    }
    if deleting > 0 {
        return ScaleStep::Wait;
    }
    if live.len() > want {
        return ScaleStep::Remove;
    }
    if live.is_empty() && !initialized {
        return ScaleStep::Init;
    }
    if !initialized || !live.iter().all(machine_provisioned) {
        return ScaleStep::Wait;
    }
    ScaleStep::Join
}

/// A control-plane Machine of `kcp`: `init` renders `kubeadm init` (no joinConfiguration), otherwise
/// a control-plane `kubeadm join` (no initConfiguration).
fn new_machine(
    kcp: &DynamicObject,
    ns: &str,
    cluster: &str,
    spec: &Value,
    init: bool,
) -> NewMachine {
    let name = kcp.name_any();
    let template_meta = spec.pointer("/machineTemplate/metadata");
    let map = |key: &str| -> BTreeMap<String, String> {
        template_meta
            .and_then(|m| m.get(key))
            .and_then(|m| serde_json::from_value(m.clone()).ok())
            .unwrap_or_default()
    };
    let mut labels = map("labels");
    labels.insert(CLUSTER_NAME_LABEL.into(), cluster.into());
    labels.insert(CONTROL_PLANE_LABEL.into(), String::new());
    labels.insert(CONTROL_PLANE_NAME_LABEL.into(), name.clone());
    let mut config = spec
        .get("kubeadmConfigSpec")
        .cloned()
        .unwrap_or_else(|| json!({}));
    if let Value::Object(c) = &mut config {
        if init {
            c.remove("joinConfiguration");
            c.entry("initConfiguration").or_insert_with(|| json!({}));
        } else {
            c.remove("initConfiguration");
            let join = c.entry("joinConfiguration").or_insert_with(|| json!({}));
            join["controlPlane"] = json!({});
        }
    }
    NewMachine {
        name: format!("{name}-{}", suffix_of(5)),
        namespace: ns.to_string(),
        cluster: cluster.to_string(),
        owner: owner_of(kcp),
        labels,
        annotations: map("annotations"),
        infra_template: spec
            .pointer("/machineTemplate/spec/infrastructureRef/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        bootstrap: NewBootstrap::Kubeadm(config),
        version: spec
            .get("version")
            .and_then(Value::as_str)
            .map(String::from),
        failure_domain: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(provisioned: bool) -> Machine {
        let mut m: Machine = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Machine",
            "metadata": {"name": "cp"},
            "spec": {"clusterName": "demo", "bootstrap": {}, "infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "MicrovmMachine", "name": "cp"}},
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        if provisioned {
            m.status = serde_json::from_value(
                json!({"initialization": {"infrastructureProvisioned": true}}),
            )
            .ok();
        }
        m
    }

    #[test]
    fn init_first_joins_after_initialization_one_at_a_time() {
        let up = machine(true);
        let starting = machine(false);
        for (want, live, deleting, initialized, step) in [
            (3, vec![], 0, false, ScaleStep::Init),
            // The init machine is not up yet: no join (real KCP never joins an uninitialized plane).
            (3, vec![starting.clone()], 0, false, ScaleStep::Wait),
            (3, vec![up.clone()], 0, true, ScaleStep::Join),
            // A joining machine not provisioned yet: the next waits (preflight).
            (
                3,
                vec![up.clone(), starting.clone()],
                0,
                true,
                ScaleStep::Wait,
            ),
            (3, vec![up.clone(), up.clone()], 0, true, ScaleStep::Join),
            (
                3,
                vec![up.clone(), up.clone(), up.clone()],
                0,
                true,
                ScaleStep::Settled,
            ),
            (
                5,
                vec![up.clone(), up.clone(), up.clone()],
                0,
                true,
                ScaleStep::Join,
            ),
            (3, vec![up.clone(); 5], 0, true, ScaleStep::Remove),
            // One goes at a time: the next waits until the deleted one is gone.
            (3, vec![up.clone(); 4], 1, true, ScaleStep::Wait),
            (1, vec![up.clone(); 2], 0, true, ScaleStep::Remove),
        ] {
            assert_eq!(
                scale_step(want, &live, deleting, initialized),
                step,
                "want {want}, {} live, {deleting} deleting, initialized {initialized}",
                live.len()
            );
        }
    }
}
