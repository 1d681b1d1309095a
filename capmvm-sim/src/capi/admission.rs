//! CAPI's defaulting and validating webhooks, the effects manifests rely on, registered in-process on
//! the emulator (CAPI v1.14 `internal/webhooks`): a manifest written for a real management cluster is
//! accepted, defaulted and refused here as it is there.

use capmvm_api::keys::CLUSTER_NAME_LABEL;
use serde_json::{Map, Value, json};

use crate::kube::{Admission, Operation};

use super::DEPLOYMENT_NAME_LABEL;

/// Autoscaler annotations CAPI's MachineDeployment webhook reads to default `replicas`.
const AUTOSCALER_MIN: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size";
const AUTOSCALER_MAX: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size";

/// Registers the webhooks' effects for MachineDeployment, MachineSet, Machine, MachinePool and
/// KubeadmControlPlane.
pub fn register(admission: &Admission) {
    admission.register(
        "cluster.x-k8s.io",
        "MachineDeployment",
        "default.machinedeployment.cluster.x-k8s.io",
        |obj, op| {
            default_replica_set(obj, op, true);
            Ok(())
        },
    );
    admission.register(
        "cluster.x-k8s.io",
        "MachineDeployment",
        "validation.machinedeployment.cluster.x-k8s.io",
        |obj, _| validate_replica_set(obj, "MachineDeployment"),
    );
    admission.register(
        "cluster.x-k8s.io",
        "MachineSet",
        "default.machineset.cluster.x-k8s.io",
        |obj, op| {
            default_replica_set(obj, op, false);
            Ok(())
        },
    );
    admission.register(
        "cluster.x-k8s.io",
        "MachineSet",
        "validation.machineset.cluster.x-k8s.io",
        |obj, _| validate_replica_set(obj, "MachineSet"),
    );
    admission.register(
        "cluster.x-k8s.io",
        "Machine",
        "default.machine.cluster.x-k8s.io",
        |obj, _| {
            let cluster = str_at(obj, "/spec/clusterName").to_string();
            if !cluster.is_empty() {
                set_label(obj, "/metadata", CLUSTER_NAME_LABEL, &cluster);
            }
            normalize_version(obj, "/spec/version");
            Ok(())
        },
    );
    admission.register(
        "cluster.x-k8s.io",
        "Machine",
        "validation.machine.cluster.x-k8s.io",
        |obj, _| validate_bootstrap(obj, "/spec/bootstrap", "spec.bootstrap"),
    );
    admission.register(
        "cluster.x-k8s.io",
        "MachinePool",
        "default.machinepool.cluster.x-k8s.io",
        |obj, op| {
            default_machine_pool(obj, op);
            Ok(())
        },
    );
    admission.register(
        "cluster.x-k8s.io",
        "MachinePool",
        "validation.machinepool.cluster.x-k8s.io",
        |obj, _| validate_machine_pool(obj),
    );
    admission.register(
        "controlplane.cluster.x-k8s.io",
        "KubeadmControlPlane",
        "default.kubeadmcontrolplane.controlplane.cluster.x-k8s.io",
        |obj, _| {
            if obj.pointer("/spec/replicas").is_none_or(Value::is_null) {
                obj["spec"]["replicas"] = json!(1);
            }
            normalize_version(obj, "/spec/version");
            Ok(())
        },
    );
    admission.register(
        "controlplane.cluster.x-k8s.io",
        "KubeadmControlPlane",
        "validation.kubeadmcontrolplane.controlplane.cluster.x-k8s.io",
        |obj, _| {
            let replicas = obj.pointer("/spec/replicas").and_then(Value::as_i64);
            let external_etcd = obj
                .pointer("/spec/kubeadmConfigSpec/clusterConfiguration/etcd/external")
                .is_some();
            match replicas {
                Some(n) if n <= 0 => Err(format!(
                    "KubeadmControlPlane.controlplane.cluster.x-k8s.io {:?} is invalid: spec.replicas: Forbidden: replicas cannot be 0 (a control plane needs at least one machine)",
                    str_at(obj, "/metadata/name")
                )),
                Some(n) if n % 2 == 0 && !external_etcd => Err(format!(
                    "KubeadmControlPlane.controlplane.cluster.x-k8s.io {:?} is invalid: spec.replicas: Forbidden: cannot be an even number when etcd is stacked (use 1, 3 or 5)",
                    str_at(obj, "/metadata/name")
                )),
                _ => Ok(()),
            }
        },
    );
}

fn str_at<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// Sets label `key` in the metadata at `pointer` (made an object if it is not one; nothing if its parent
/// is missing).
fn set_label(obj: &mut Value, pointer: &str, key: &str, value: &str) {
    let Some(meta) = obj.pointer_mut(pointer) else {
        return;
    };
    if !meta.is_object() {
        *meta = json!({});
    }
    if !meta["labels"].is_object() {
        meta["labels"] = json!({});
    }
    meta["labels"][key] = json!(value);
}

/// A version without its `v` gets it (`1.33.0` → `v1.33.0`), as CAPI's webhooks write it.
fn normalize_version(obj: &mut Value, pointer: &str) {
    if let Some(Value::String(v)) = obj.pointer_mut(pointer)
        && !v.is_empty()
        && !v.starts_with('v')
    {
        v.insert(0, 'v');
    }
}

/// `replicas` when unset: the autoscaler's min size on create when both its annotations are set,
/// else 1 (CAPI's `calculate*Replicas`; without the old object, an update defaults like a create
/// without annotations).
fn default_replicas(obj: &Value, op: Operation) -> i64 {
    let annotation = |key: &str| {
        obj.pointer(&format!("/metadata/annotations/{}", key.replace('/', "~1")))
            .and_then(Value::as_str)
            .and_then(|s| s.parse::<i64>().ok())
    };
    match (annotation(AUTOSCALER_MIN), annotation(AUTOSCALER_MAX)) {
        (Some(min), Some(_)) if op == Operation::Create => min,
        _ => 1,
    }
}

/// MachinePool's Default: the `cluster-name` label, `replicas`, the template's version with its `v`.
fn default_machine_pool(obj: &mut Value, op: Operation) {
    if !obj["spec"].is_object() {
        return;
    }
    let cluster = str_at(obj, "/spec/clusterName").to_string();
    set_label(obj, "/metadata", CLUSTER_NAME_LABEL, &cluster);
    if obj.pointer("/spec/replicas").is_none_or(Value::is_null) {
        obj["spec"]["replicas"] = json!(default_replicas(obj, op));
    }
    normalize_version(obj, "/spec/template/spec/version");
}

/// MachinePool's validation: bootstrap data for its instances, a semantic version.
fn validate_machine_pool(obj: &Value) -> Result<(), String> {
    let name = str_at(obj, "/metadata/name");
    let invalid = |e: String| format!("MachinePool.cluster.x-k8s.io {name:?} is invalid: {e}");
    validate_bootstrap(
        obj,
        "/spec/template/spec/bootstrap",
        "spec.template.spec.bootstrap",
    )
    .map_err(invalid)?;
    let version = str_at(obj, "/spec/template/spec/version");
    if !version.is_empty() && !is_kube_semver(version) {
        return Err(invalid(format!(
            "spec.template.spec.version: Invalid value: {version:?}: must be a valid semantic version (such as v1.33.0)"
        )));
    }
    Ok(())
}

/// `vMAJOR.MINOR.PATCH` with optional `-pre` and `+build` parts, as CAPI's `KubeSemver` accepts.
fn is_kube_semver(version: &str) -> bool {
    let Some(rest) = version.strip_prefix('v') else {
        return false;
    };
    let core = rest.split(['-', '+']).next().unwrap_or_default();
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

/// MachineDeployment's and MachineSet's Default: cluster-name labels, replicas, and the selector from
/// the template's labels (the deployment's name when it selects nothing).
fn default_replica_set(obj: &mut Value, op: Operation, deployment: bool) {
    if !obj["spec"].is_object() {
        return;
    }
    let cluster = str_at(obj, "/spec/clusterName").to_string();
    let name = str_at(obj, "/metadata/name").to_string();
    set_label(obj, "/metadata", CLUSTER_NAME_LABEL, &cluster);
    if obj.pointer("/spec/replicas").is_none_or(Value::is_null) {
        obj["spec"]["replicas"] = json!(default_replicas(obj, op));
    }
    if !obj["spec"]["template"].is_object() {
        obj["spec"]["template"] = json!({});
    }
    if !obj["spec"]["template"]["metadata"].is_object() {
        obj["spec"]["template"]["metadata"] = json!({});
    }
    if !obj["spec"]["selector"].is_object() {
        obj["spec"]["selector"] = json!({});
    }
    let selects_nothing = obj["spec"]["selector"]["matchLabels"]
        .as_object()
        .is_none_or(Map::is_empty)
        && obj["spec"]["selector"]["matchExpressions"]
            .as_array()
            .is_none_or(Vec::is_empty);
    if !obj["spec"]["selector"]["matchLabels"].is_object() {
        obj["spec"]["selector"]["matchLabels"] = json!({});
    }
    let own_label = if deployment {
        DEPLOYMENT_NAME_LABEL
    } else {
        "cluster.x-k8s.io/set-name"
    };
    if selects_nothing {
        obj["spec"]["selector"]["matchLabels"][own_label] = json!(name);
        set_label(obj, "/spec/template/metadata", own_label, &name);
    }
    obj["spec"]["selector"]["matchLabels"][CLUSTER_NAME_LABEL] = json!(cluster);
    set_label(obj, "/spec/template/metadata", CLUSTER_NAME_LABEL, &cluster);
    normalize_version(obj, "/spec/template/spec/version");
}

/// MachineDeployment's and MachineSet's validation: the selector matches the template's labels, the
/// Machines it makes get bootstrap data.
fn validate_replica_set(obj: &Value, kind: &str) -> Result<(), String> {
    let name = str_at(obj, "/metadata/name");
    let labels = obj
        .pointer("/spec/template/metadata/labels")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    if let Some(selector) = obj
        .pointer("/spec/selector/matchLabels")
        .and_then(Value::as_object)
    {
        for (k, v) in selector {
            if labels.get(k) != Some(v) {
                return Err(format!(
                    "{kind}.cluster.x-k8s.io {name:?} is invalid: spec.template.metadata.labels: Forbidden: must match spec.selector (label {k}={} is missing from the template's labels)",
                    v.as_str().unwrap_or_default()
                ));
            }
        }
    }
    validate_bootstrap(
        obj,
        "/spec/template/spec/bootstrap",
        "spec.template.spec.bootstrap",
    )
    .map_err(|e| format!("{kind}.cluster.x-k8s.io {name:?} is invalid: {e}"))
}

/// A Machine needs bootstrap data: a configRef to a bootstrap provider's object or a dataSecretName.
fn validate_bootstrap(obj: &Value, pointer: &str, field: &str) -> Result<(), String> {
    let bootstrap = obj.pointer(pointer);
    let has_ref = bootstrap
        .and_then(|b| b.get("configRef"))
        .is_some_and(|r| r.is_object());
    let has_secret = bootstrap
        .and_then(|b| b.get("dataSecretName"))
        .and_then(Value::as_str)
        .is_some();
    if has_ref || has_secret {
        Ok(())
    } else {
        Err(format!(
            "{field}: Required value: expected either {field}.dataSecretName or {field}.configRef to be populated (for kubeadm, a configRef to a KubeadmConfigTemplate)"
        ))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_deployment_gets_selector_labels_and_replicas_as_capi_defaults_them() {
        let mut md = json!({
            "metadata": {"name": "demo-md-0"},
            "spec": {"clusterName": "demo", "template": {"spec": {"version": "1.33.0",
                "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfigTemplate", "name": "t"}}}}},
        });
        default_replica_set(&mut md, Operation::Create, true);
        assert_eq!(md["metadata"]["labels"][CLUSTER_NAME_LABEL], "demo");
        assert_eq!(md["spec"]["replicas"], 1);
        assert_eq!(
            md["spec"]["selector"]["matchLabels"],
            json!({DEPLOYMENT_NAME_LABEL: "demo-md-0", CLUSTER_NAME_LABEL: "demo"})
        );
        assert_eq!(
            md["spec"]["template"]["metadata"]["labels"],
            json!({DEPLOYMENT_NAME_LABEL: "demo-md-0", CLUSTER_NAME_LABEL: "demo"})
        );
        assert_eq!(md["spec"]["template"]["spec"]["version"], "v1.33.0");
        validate_replica_set(&md, "MachineDeployment").unwrap();

        md["spec"]["template"]["spec"]["bootstrap"] = json!({});
        let e = validate_replica_set(&md, "MachineDeployment").unwrap_err();
        assert!(e.contains("spec.template.spec.bootstrap.configRef"), "{e}");
    }

    #[test]
    fn a_machine_pool_gets_its_label_replicas_and_version_and_needs_bootstrap_data() {
        let mut mp = json!({
            "metadata": {"name": "demo-mp-0", "annotations": {
                AUTOSCALER_MIN: "2", AUTOSCALER_MAX: "5"}},
            "spec": {"clusterName": "demo", "template": {"spec": {"clusterName": "demo", "version": "1.33.0",
                "bootstrap": {"dataSecretName": "s"}}}},
        });
        default_machine_pool(&mut mp, Operation::Create);
        assert_eq!(mp["metadata"]["labels"][CLUSTER_NAME_LABEL], "demo");
        assert_eq!(mp["spec"]["replicas"], 2);
        assert_eq!(mp["spec"]["template"]["spec"]["version"], "v1.33.0");
        validate_machine_pool(&mp).unwrap();

        mp["spec"]["template"]["spec"]["version"] = json!("v1.33");
        let e = validate_machine_pool(&mp).unwrap_err();
        assert!(e.contains("spec.template.spec.version"), "{e}");
        mp["spec"]["template"]["spec"]["version"] = json!("v1.33.0-rc.1");
        validate_machine_pool(&mp).unwrap();
        mp["spec"]["template"]["spec"]["bootstrap"] = json!({});
        let e = validate_machine_pool(&mp).unwrap_err();
        assert!(
            e.contains("spec.template.spec.bootstrap.dataSecretName"),
            "{e}"
        );
        assert!(
            e.starts_with("MachinePool.cluster.x-k8s.io \"demo-mp-0\""),
            "{e}"
        );
    }
}
