//! Machines and their Nodes, as CAPI's Machine controller and MachineHealthCheck handle them:
//!
//! - A Machine with a providerID is matched to the Node of its Cluster's workload API whose
//!   `spec.providerID` is exactly equal; it then gets `status.nodeRef` (`{name}`) and
//!   `status.nodeInfo` (the Node's whole `nodeInfo`) and phase Running (Provisioned until then).
//! - Once a deleted Machine's InfraMachine is gone, its Node is deleted.
//! - A MachineHealthCheck (`cluster.x-k8s.io/v1beta2`) remediates the Machines it selects whose Node
//!   has had a condition of `spec.checks.unhealthyNodeConditions` for longer than its
//!   `timeoutSeconds`, whose Node went away, or that got no Node within `nodeStartupTimeoutSeconds`
//!   (600 s unless set; 0 turns it off). As CAPI's, it marks them `HealthCheckSucceeded=False` and
//!   `OwnerRemediated=False` for their owner to replace; a MachinePool's Machines stay marked (core
//!   leaves them to the infrastructure pool), the others are deleted at once, standing in for the
//!   MachineSet or KubeadmControlPlane the stand-in does not have. Only Machines with a controller
//!   owner are remediated, and none while more are unhealthy than
//!   `spec.remediation.triggerIf.unhealthyLessThanOrEqualTo` allows (an integer or a percentage).

use std::time::Duration;

use capmvm_api::capi::Machine;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt as _};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tracing::{debug, info};

use super::workload::{ClusterKey, WorkloadClusters};

/// How often MachineHealthChecks are evaluated.
pub const HEALTH_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// CAPI's default `nodeStartupTimeoutSeconds`.
pub const DEFAULT_NODE_STARTUP_TIMEOUT: Duration = Duration::from_secs(600);

/// Adds to `machine`'s wanted status (`want`) what its Node says: `nodeRef`, `nodeInfo` and phase
/// Running when the Node is there; phase Provisioned (and a wake-up when the Node shows) otherwise.
pub(crate) fn merge_node_status(
    workloads: &WorkloadClusters,
    machine: &Machine,
    provider_id: &str,
    want: &mut Value,
) {
    let cluster = ClusterKey::new(
        &machine.namespace().unwrap_or_default(),
        &machine.spec.cluster_name,
    );
    let ns = machine.namespace().unwrap_or_default();
    workloads.wake_on_node(provider_id, ObjectRef::new(&machine.name_any()).within(&ns));
    match workloads.node_by_provider_id(&cluster, provider_id) {
        Some(node) => {
            want["nodeRef"] = json!({"name": node.name_any()});
            if let Some(info) = node.status.as_ref().and_then(|s| s.node_info.as_ref()) {
                want["nodeInfo"] = serde_json::to_value(info).unwrap_or(Value::Null);
            }
            want["phase"] = json!("Running");
        }
        None => want["phase"] = json!("Provisioned"),
    }
}

/// Deletes the Node of a Machine whose InfraMachine is gone (nothing when there is none).
pub(crate) async fn delete_node(
    workloads: &WorkloadClusters,
    machine: &Machine,
) -> Result<(), kube::Error> {
    let Some(pid) = machine.spec.provider_id.as_deref() else {
        return Ok(());
    };
    workloads.forget_provider_id(pid);
    let cluster = ClusterKey::new(
        &machine.namespace().unwrap_or_default(),
        &machine.spec.cluster_name,
    );
    let (Some(node), Some(client)) = (
        workloads.node_by_provider_id(&cluster, pid),
        workloads.client(&cluster),
    ) else {
        return Ok(());
    };
    match Api::<Node>::all(client)
        .delete(&node.name_any(), &DeleteParams::background())
        .await
    {
        Ok(_) => {
            info!(machine = %machine.name_any(), node = %node.name_any(), "deleted the Node of a deleted Machine");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// The MachineHealthCheck CRD (v1beta2, CAPI's names and printer columns; the schema keeps every
/// field).
pub fn machine_health_check_crd() -> CustomResourceDefinition {
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "machinehealthchecks.cluster.x-k8s.io"},
        "spec": {
            "group": "cluster.x-k8s.io",
            "names": {
                "kind": "MachineHealthCheck",
                "listKind": "MachineHealthCheckList",
                "plural": "machinehealthchecks",
                "singular": "machinehealthcheck",
                "shortNames": ["mhc", "mhcs"],
                "categories": ["cluster-api"],
            },
            "scope": "Namespaced",
            "versions": [{
                "name": "v1beta2",
                "served": true,
                "storage": true,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Cluster", "type": "string", "jsonPath": ".spec.clusterName"},
                    {"name": "Replicas", "type": "integer", "jsonPath": ".status.expectedMachines"},
                    {"name": "Healthy", "type": "integer", "jsonPath": ".status.currentHealthy"},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                ],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {"type": "object", "required": ["clusterName", "selector"], "x-kubernetes-preserve-unknown-fields": true},
                        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    },
                }},
            }],
        },
    });
    // A literal known to match the CRD type.
    serde_json::from_value(crd).unwrap_or_default()
}

/// Adds the CRDs of this module that `crds` lacks (the MachineHealthCheck), so a stand-in that
/// installs CAPI's own CRDs keeps them.
pub fn add_missing_crds(crds: &mut Vec<CustomResourceDefinition>) {
    let mhc = machine_health_check_crd();
    if !crds.iter().any(|c| c.name_any() == mhc.name_any()) {
        crds.push(mhc);
    }
}

fn mhc_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "MachineHealthCheck"),
        "machinehealthchecks",
    )
}

/// Evaluates every MachineHealthCheck each [`HEALTH_CHECK_INTERVAL`].
pub(crate) fn run_health_checks(
    client: kube::Client,
    workloads: WorkloadClusters,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(HEALTH_CHECK_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = check_all(&client, &workloads).await {
                debug!(error = %e, "MachineHealthCheck round failed; retrying");
            }
        }
    })
}

async fn check_all(client: &kube::Client, workloads: &WorkloadClusters) -> Result<(), kube::Error> {
    let mhcs = match Api::<DynamicObject>::all_with(client.clone(), &mhc_resource())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items,
        // Not installed: nothing to check.
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
        Err(e) => return Err(e),
    };
    for mhc in mhcs {
        if mhc.metadata.deletion_timestamp.is_none() {
            check(client, workloads, &mhc).await?;
        }
    }
    Ok(())
}

/// A Machine's verdict.
enum Health {
    Healthy,
    /// Unhealthy, with the reason.
    Unhealthy(String),
}

async fn check(
    client: &kube::Client,
    workloads: &WorkloadClusters,
    mhc: &DynamicObject,
) -> Result<(), kube::Error> {
    let ns = mhc.namespace().unwrap_or_default();
    let spec = mhc.data.get("spec").cloned().unwrap_or(Value::Null);
    let cluster_name = spec
        .get("clusterName")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let Some(selector) = label_selector(spec.get("selector")) else {
        debug!(mhc = %mhc.name_any(), "MachineHealthCheck selector has an operator the stand-in does not know; skipped");
        return Ok(());
    };
    let machine_resource = ApiResource::erase::<Machine>(&());
    let machines_api =
        Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &machine_resource);
    let machines: Vec<DynamicObject> = machines_api
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
        .into_iter()
        .filter(|m| {
            m.data.pointer("/spec/clusterName").and_then(Value::as_str) == Some(cluster_name)
        })
        .filter(|m| m.metadata.deletion_timestamp.is_none())
        .collect();
    let cluster = ClusterKey::new(&ns, cluster_name);
    let checks = spec.get("checks").cloned().unwrap_or(Value::Null);
    let now = k8s_openapi::jiff::Timestamp::now();
    let verdicts: Vec<(&DynamicObject, Health)> = machines
        .iter()
        .map(|m| (m, health(workloads, &cluster, &checks, m, now)))
        .collect();
    let unhealthy: Vec<(&DynamicObject, &String)> = verdicts
        .iter()
        .filter_map(|(m, h)| match h {
            Health::Unhealthy(why) => Some((*m, why)),
            Health::Healthy => None,
        })
        .collect();
    let max_unhealthy = max_unhealthy(
        spec.pointer("/remediation/triggerIf/unhealthyLessThanOrEqualTo"),
        machines.len(),
    );
    let allowed = unhealthy.len() <= max_unhealthy;
    if allowed {
        for (m, why) in &unhealthy {
            let Some(owner) = m
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.controller == Some(true))
            else {
                continue;
            };
            if owner.kind == "MachinePool" {
                mark_for_owner_remediation(&machines_api, m, why).await?;
                continue;
            }
            info!(mhc = %mhc.name_any(), machine = %m.name_any(), reason = %why, "MachineHealthCheck: remediating an unhealthy Machine by deleting it");
            match machines_api
                .delete(&m.name_any(), &DeleteParams::background())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
    } else if !unhealthy.is_empty() {
        info!(mhc = %mhc.name_any(), unhealthy = unhealthy.len(), max_unhealthy, "MachineHealthCheck: too many unhealthy Machines; remediation held");
    }
    let mut targets: Vec<String> = machines.iter().map(|m| m.name_any()).collect();
    targets.sort();
    let want = json!({
        "expectedMachines": machines.len(),
        "currentHealthy": machines.len() - unhealthy.len(),
        "remediationsAllowed": max_unhealthy.saturating_sub(unhealthy.len()),
        "targets": targets,
    });
    let current = mhc.data.get("status").cloned().unwrap_or(Value::Null);
    let differs = want
        .as_object()
        .is_some_and(|w| w.iter().any(|(k, v)| current.get(k) != Some(v)));
    if differs {
        Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &mhc_resource())
            .patch_status(
                &mhc.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"status": want})),
            )
            .await?;
    }
    Ok(())
}

/// Marks `machine` `HealthCheckSucceeded=False` and `OwnerRemediated=False` (reason
/// `WaitingForRemediation`), as CAPI's MachineHealthCheck does, keeping its other conditions; nothing
/// is written when it is marked already.
async fn mark_for_owner_remediation(
    machines: &Api<DynamicObject>,
    machine: &DynamicObject,
    why: &str,
) -> Result<(), kube::Error> {
    let mut conditions: Vec<Value> = machine
        .data
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let marked = |conditions: &[Value], t: &str| {
        conditions
            .iter()
            .any(|c| c["type"] == t && c["status"] == "False")
    };
    if marked(&conditions, "OwnerRemediated") && marked(&conditions, "HealthCheckSucceeded") {
        return Ok(());
    }
    info!(machine = %machine.name_any(), reason = %why, "MachineHealthCheck: marking an unhealthy Machine for its owner to replace");
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let generation = machine.metadata.generation.unwrap_or_default();
    conditions.retain(|c| c["type"] != "OwnerRemediated" && c["type"] != "HealthCheckSucceeded");
    conditions.push(json!({
        "type": "HealthCheckSucceeded", "status": "False", "reason": "UnhealthyNode",
        "message": why, "lastTransitionTime": now, "observedGeneration": generation,
    }));
    conditions.push(json!({
        "type": "OwnerRemediated", "status": "False", "reason": "WaitingForRemediation",
        "message": "Waiting for remediation", "lastTransitionTime": now,
        "observedGeneration": generation,
    }));
    match machines
        .patch_status(
            &machine.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"resourceVersion": machine.metadata.resource_version},
                "status": {"conditions": conditions},
            })),
        )
        .await
    {
        // Changed meanwhile: the next round marks it from the newer version.
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(()),
        other => other.map(|_| ()),
    }
}

fn health(
    workloads: &WorkloadClusters,
    cluster: &ClusterKey,
    checks: &Value,
    machine: &DynamicObject,
    now: k8s_openapi::jiff::Timestamp,
) -> Health {
    let provider_id = machine
        .data
        .pointer("/spec/providerID")
        .and_then(Value::as_str);
    let node = provider_id.and_then(|pid| workloads.node_by_provider_id(cluster, pid));
    let Some(node) = node else {
        if machine.data.pointer("/status/nodeRef/name").is_some() {
            return Health::Unhealthy("NodeDeleted: the Machine's Node is gone".into());
        }
        let timeout = checks
            .get("nodeStartupTimeoutSeconds")
            .and_then(Value::as_u64)
            .map_or(DEFAULT_NODE_STARTUP_TIMEOUT, Duration::from_secs);
        let created = machine.metadata.creation_timestamp.as_ref().map(|t| t.0);
        if !timeout.is_zero() && created.is_some_and(|c| elapsed(c, now) > timeout) {
            return Health::Unhealthy(format!(
                "NodeStartupTimeout: no Node within {}s",
                timeout.as_secs()
            ));
        }
        return Health::Healthy;
    };
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .cloned()
        .unwrap_or_default();
    for check in checks
        .get("unhealthyNodeConditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let type_ = check
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let status = check
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let timeout = Duration::from_secs(
            check
                .get("timeoutSeconds")
                .and_then(Value::as_u64)
                .unwrap_or(0),
        );
        let Some(c) = conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
        else {
            continue;
        };
        let since = c.last_transition_time.as_ref().map(|t| t.0);
        if since.is_none_or(|s| elapsed(s, now) > timeout) {
            return Health::Unhealthy(format!(
                "UnhealthyNode: condition {type_} is {status} for longer than {}s",
                timeout.as_secs()
            ));
        }
    }
    Health::Healthy
}

fn elapsed(since: k8s_openapi::jiff::Timestamp, now: k8s_openapi::jiff::Timestamp) -> Duration {
    Duration::try_from(now.duration_since(since)).unwrap_or(Duration::ZERO)
}

/// `unhealthyLessThanOrEqualTo` (an integer, or a percentage of `total` rounded down); 100 % when unset.
fn max_unhealthy(value: Option<&Value>, total: usize) -> usize {
    match value {
        Some(Value::Number(n)) => n.as_u64().map_or(total, |n| n as usize),
        Some(Value::String(s)) => match s.trim().strip_suffix('%') {
            Some(p) => p.trim().parse::<usize>().map_or(total, |p| total * p / 100),
            None => s.trim().parse().unwrap_or(total),
        },
        _ => total,
    }
}

/// A `metav1.LabelSelector` as a label selector string (`None` for an unknown operator).
fn label_selector(selector: Option<&Value>) -> Option<String> {
    let mut parts: Vec<String> = Vec::new();
    let Some(selector) = selector else {
        return Some(String::new());
    };
    if let Some(labels) = selector.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in labels {
            parts.push(format!("{k}={}", v.as_str().unwrap_or_default()));
        }
    }
    for e in selector
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let key = e.get("key").and_then(Value::as_str).unwrap_or_default();
        let values: Vec<&str> = e
            .get("values")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        parts.push(match e.get("operator").and_then(Value::as_str)? {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_string(),
            "DoesNotExist" => format!("!{key}"),
            _ => return None,
        });
    }
    Some(parts.join(","))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn selectors_and_max_unhealthy_read_as_capi_reads_them() {
        let s = json!({"matchLabels": {"a": "b"}, "matchExpressions": [{"key": "c", "operator": "In", "values": ["x", "y"]}, {"key": "d", "operator": "DoesNotExist"}]});
        assert_eq!(label_selector(Some(&s)).unwrap(), "a=b,c in (x,y),!d");
        assert_eq!(
            label_selector(Some(
                &json!({"matchExpressions": [{"key": "c", "operator": "Gt"}]})
            )),
            None
        );
        assert_eq!(max_unhealthy(None, 3), 3);
        assert_eq!(max_unhealthy(Some(&json!("40%")), 5), 2);
        assert_eq!(max_unhealthy(Some(&json!(1)), 5), 1);
    }
}
