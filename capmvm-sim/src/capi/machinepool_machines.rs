//! MachinePool Machines (capi-contract 5.3): when the InfraMachinePool sets
//! `status.infrastructureMachineKind`, core lists that kind at the pool's apiVersion, in the pool's
//! namespace, by both labels (`pool-name` = `MustFormatValue(name)`, `cluster-name`), and creates for
//! each instance without one a Machine of the same name: controller owner reference to the
//! MachinePool, the template's labels and annotations plus both labels,
//! `spec.bootstrap.dataSecretName: ""` (bootstrap counts as done), `spec.infrastructureRef` to the
//! instance, and the version of its Node when one matches its providerID. The Machine controller
//! then takes over (adoption, drain on delete, the InfraMachine deleted and gone, the Node deleted).

use std::collections::{BTreeMap, HashMap, HashSet};

use capmvm_api::capi::Machine;
use capmvm_api::keys::{CLUSTER_NAME_LABEL, POOL_NAME_LABEL};
use capmvm_api::pool::must_format_label_value;
use k8s_openapi::api::core::v1::Node;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use tracing::{info, warn};

use super::controllers::Error;
use super::machinepool::{PoolCtx, text_at};

/// Creates the missing Machines of the pool's instances of `kind`.
pub(crate) async fn reconcile(
    pctx: &PoolCtx,
    mp: &DynamicObject,
    pool_resource: &ApiResource,
    kind: &str,
    cluster: &str,
    nodes: &HashMap<&str, &Node>,
) -> Result<(), Error> {
    let client = pctx.ctx.client.clone();
    let ns = mp.namespace().unwrap_or_default();
    let pool_label = must_format_label_value(&mp.name_any());
    let selector = format!("{POOL_NAME_LABEL}={pool_label},{CLUSTER_NAME_LABEL}={cluster}");
    // The instance kind at the pool's own apiVersion (its plural from its CRD, when served).
    let plural = match pctx.resource_of(&pool_resource.group, kind).await? {
        Some(r) => r.plural,
        None => {
            warn!(pool = %mp.name_any(), %kind, "no CRD serves the pool's infrastructureMachineKind");
            return Ok(());
        }
    };
    let instance_resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&pool_resource.group, &pool_resource.version, kind),
        &plural,
    );
    let instances = Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &instance_resource)
        .list(&ListParams::default().labels(&selector))
        .await?
        .items;
    if instances.is_empty() {
        return Ok(());
    }
    let machine_resource = ApiResource::erase::<Machine>(&());
    let machines = Api::<DynamicObject>::namespaced_with(client, &ns, &machine_resource);
    let existing = machines
        .list(&ListParams::default().labels(&selector))
        .await?
        .items;
    let mut covered: HashSet<String> = existing.iter().map(|m| m.name_any()).collect();
    covered.extend(
        existing
            .iter()
            .filter_map(|m| text_at(&m.data, "/spec/infrastructureRef/name").map(String::from)),
    );
    for instance in instances {
        let name = instance.name_any();
        if covered.contains(&name) || instance.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let machine = machine_for(
            mp,
            &instance,
            (&pool_resource.group, kind),
            cluster,
            &pool_label,
            nodes,
        );
        match machines.create(&PostParams::default(), &machine).await {
            Ok(_) => {
                info!(pool = %mp.name_any(), machine = %name, "created the MachinePool Machine of an instance");
            }
            // Created meanwhile (a reconcile from a stale list).
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The Machine core creates for `instance`.
fn machine_for(
    mp: &DynamicObject,
    instance: &DynamicObject,
    (group, kind): (&str, &str),
    cluster: &str,
    pool_label: &str,
    nodes: &HashMap<&str, &Node>,
) -> DynamicObject {
    let name = instance.name_any();
    let string_map = |pointer: &str| -> BTreeMap<String, String> {
        mp.data
            .pointer(pointer)
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect()
    };
    let mut labels = string_map("/spec/template/metadata/labels");
    labels.insert(POOL_NAME_LABEL.to_string(), pool_label.to_string());
    labels.insert(CLUSTER_NAME_LABEL.to_string(), cluster.to_string());
    let annotations = string_map("/spec/template/metadata/annotations");
    let mut spec = json!({
        "clusterName": cluster,
        "bootstrap": {"dataSecretName": ""},
        "infrastructureRef": {
            "apiGroup": group,
            "kind": kind,
            "name": name,
        },
    });
    let version = text_at(&instance.data, "/spec/providerID")
        .and_then(|pid| nodes.get(pid))
        .and_then(|n| n.status.as_ref()?.node_info.as_ref())
        .map(|info| info.kubelet_version.clone());
    if let Some(v) = version {
        spec["version"] = json!(v);
    }
    let owner = json!([{
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "MachinePool",
        "name": mp.name_any(),
        "uid": mp.uid().unwrap_or_default(),
        "controller": true,
        "blockOwnerDeletion": true,
    }]);
    let resource = ApiResource::erase::<Machine>(&());
    let mut machine = DynamicObject::new(&name, &resource).data(json!({"spec": spec}));
    machine.metadata.namespace = mp.namespace();
    machine.metadata.labels = Some(labels);
    machine.metadata.annotations = (!annotations.is_empty()).then_some(annotations);
    machine.metadata.owner_references = serde_json::from_value(owner).ok();
    machine
}
