//! The read-only CAPI views read objects that fill every field of CAPI v1.14's CRD schemas, and a
//! field of any unexpected shape reads as absent instead of failing the object (one unreadable Machine
//! fails a watch's whole list, and the operator with it).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code

use std::path::Path;

use capmvm_api::capi::{Cluster, Machine, MachinePool};
use capmvm_api::capi_fixtures::{
    capi_crd_dir, crd_schema, full_object, has_path, schema_paths, with_wrong_shape,
};
use serde_json::Value;

const MACHINES: &str = "cluster.x-k8s.io_machines.yaml";
const CLUSTERS: &str = "cluster.x-k8s.io_clusters.yaml";
const MACHINE_POOLS: &str = "cluster.x-k8s.io_machinepools.yaml";

/// CAPI's CRD directory, or `None` with the test skipped (said past the harness's capture, counted
/// under its summary, a failure under CI: `capmvm_upstream::skip`).
fn capi_crd_dir_or_skip(test: &str) -> Option<std::path::PathBuf> {
    let dir = capi_crd_dir();
    if dir.is_dir() {
        return Some(dir);
    }
    capmvm_upstream::skip::skip(
        test,
        &format!(
            "CAPI's CRDs are not at {}: set CAPMVM_SHARED_DIR to the directory holding capi-crds/",
            dir.display()
        ),
    );
    None
}

/// A generated object of `file`, checked to hold every path of its schema.
fn generated(dir: &Path, file: &str) -> (Value, Vec<String>) {
    let path = dir.join(file);
    let object = full_object(&path, "v1beta2", "generated").unwrap();
    let paths = schema_paths(&crd_schema(&path, "v1beta2").unwrap());
    let missing: Vec<&String> = paths.iter().filter(|p| !has_path(&object, p)).collect();
    assert!(
        missing.is_empty(),
        "{file}: generated object lacks {missing:?}"
    );
    (object, paths)
}

#[test]
fn a_machine_with_every_v1beta2_field_reads() {
    let Some(dir) = capi_crd_dir_or_skip("a_machine_with_every_v1beta2_field_reads") else {
        return;
    };
    let (object, _) = generated(&dir, MACHINES);
    // What Kubernetes 1.33 kubelets report and CAPI copies from the Node.
    assert!(object["status"]["nodeInfo"]["swap"]["capacity"].is_i64());

    let machine: Machine = serde_json::from_value(object.clone())
        .unwrap_or_else(|e| panic!("a full v1beta2 Machine does not read: {e}"));
    let spec = &object["spec"];
    assert_eq!(machine.spec.cluster_name, spec["clusterName"]);
    assert_eq!(
        machine.spec.bootstrap.data_secret_name.as_deref(),
        spec["bootstrap"]["dataSecretName"].as_str()
    );
    assert_eq!(
        machine.spec.infrastructure_ref.api_group,
        spec["infrastructureRef"]["apiGroup"]
    );
    assert_eq!(
        machine.spec.infrastructure_ref.kind,
        spec["infrastructureRef"]["kind"]
    );
    assert_eq!(
        machine.spec.infrastructure_ref.name,
        spec["infrastructureRef"]["name"]
    );
    assert_eq!(
        machine.spec.failure_domain.as_deref(),
        spec["failureDomain"].as_str()
    );
    assert_eq!(
        machine.spec.provider_id.as_deref(),
        spec["providerID"].as_str()
    );
    assert_eq!(
        machine
            .status
            .and_then(|s| s.initialization)
            .and_then(|i| i.infrastructure_provisioned),
        object["status"]["initialization"]["infrastructureProvisioned"].as_bool()
    );
}

/// A MachineHealthCheck's `OwnerRemediated=False` reads from a full Machine; the generated
/// conditions otherwise read as they are.
#[test]
fn a_machine_marked_for_owner_remediation_reads() {
    let Some(dir) = capi_crd_dir_or_skip("a_machine_marked_for_owner_remediation_reads") else {
        return;
    };
    let (mut object, _) = generated(&dir, MACHINES);
    let conditions = object["status"]["conditions"].as_array().unwrap().clone();
    assert!(!conditions.is_empty());
    let machine: Machine = serde_json::from_value(object.clone()).unwrap();
    let read = &machine.status.as_ref().unwrap().conditions;
    assert_eq!(read.len(), conditions.len());
    assert_eq!(read[0].r#type, conditions[0]["type"]);
    assert_eq!(read[0].status, conditions[0]["status"]);
    assert_eq!(read[0].reason, conditions[0]["reason"]);

    let mut marked = conditions[0].clone();
    marked["type"] = "OwnerRemediated".into();
    marked["status"] = "False".into();
    marked["reason"] = "WaitingForRemediation".into();
    object["status"]["conditions"] = Value::Array(vec![marked.clone()]);
    let machine: Machine = serde_json::from_value(object.clone()).unwrap();
    assert!(machine.owner_remediation_requested());

    marked["status"] = "True".into();
    object["status"]["conditions"] = Value::Array(vec![marked]);
    let machine: Machine = serde_json::from_value(object).unwrap();
    assert!(!machine.owner_remediation_requested());
}

#[test]
fn a_cluster_with_every_v1beta2_field_reads() {
    let Some(dir) = capi_crd_dir_or_skip("a_cluster_with_every_v1beta2_field_reads") else {
        return;
    };
    let (object, _) = generated(&dir, CLUSTERS);
    let cluster: Cluster = serde_json::from_value(object.clone())
        .unwrap_or_else(|e| panic!("a full v1beta2 Cluster does not read: {e}"));
    let spec = &object["spec"];
    assert_eq!(cluster.spec.paused, spec["paused"].as_bool());
    assert!(cluster.is_paused());
    let endpoint = cluster.spec.control_plane_endpoint.clone().unwrap();
    assert_eq!(
        endpoint.host.as_deref(),
        spec["controlPlaneEndpoint"]["host"].as_str()
    );
    assert_eq!(
        endpoint.port.map(i64::from),
        spec["controlPlaneEndpoint"]["port"].as_i64()
    );
    let infra = cluster.spec.infrastructure_ref.as_ref().unwrap();
    assert_eq!(infra.api_group, spec["infrastructureRef"]["apiGroup"]);
    assert_eq!(infra.kind, spec["infrastructureRef"]["kind"]);
    assert_eq!(infra.name, spec["infrastructureRef"]["name"]);
    assert!(cluster.infrastructure_provisioned());
}

/// The MachinePool view reads what a MicrovmMachinePool needs from a MachinePool with every field.
#[test]
fn a_machine_pool_with_every_v1beta2_field_reads() {
    let Some(dir) = capi_crd_dir_or_skip("a_machine_pool_with_every_v1beta2_field_reads") else {
        return;
    };
    let (object, _) = generated(&dir, MACHINE_POOLS);
    let pool: MachinePool = serde_json::from_value(object.clone())
        .unwrap_or_else(|e| panic!("a full v1beta2 MachinePool does not read: {e}"));
    let spec = &object["spec"];
    assert_eq!(pool.spec.cluster_name, spec["clusterName"]);
    assert_eq!(pool.spec.replicas.map(i64::from), spec["replicas"].as_i64());
    assert_eq!(
        pool.desired_replicas(),
        i32::try_from(spec["replicas"].as_i64().unwrap())
            .unwrap()
            .max(0)
    );
    let domains: Vec<&str> = spec["failureDomains"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    assert!(!domains.is_empty());
    assert_eq!(pool.spec.failure_domains, domains);
    assert_eq!(
        pool.bootstrap_data_secret_name(),
        spec["template"]["spec"]["bootstrap"]["dataSecretName"].as_str()
    );
    let status = pool.status.unwrap();
    assert_eq!(
        status.replicas.map(i64::from),
        object["status"]["replicas"].as_i64()
    );
    assert_eq!(
        status.ready_replicas.map(i64::from),
        object["status"]["readyReplicas"].as_i64()
    );
    assert_eq!(
        status
            .initialization
            .and_then(|i| i.infrastructure_provisioned),
        object["status"]["initialization"]["infrastructureProvisioned"].as_bool()
    );
}

/// Every field, one at a time, in a shape its schema does not allow: the object still reads, and a
/// field the operator reads comes back absent rather than failing the whole object.
#[test]
fn a_field_of_any_shape_does_not_fail_the_object() {
    let Some(dir) = capi_crd_dir_or_skip("a_field_of_any_shape_does_not_fail_the_object") else {
        return;
    };
    for (file, read) in [
        (
            MACHINES,
            (|v: Value| serde_json::from_value::<Machine>(v).map(drop))
                as fn(Value) -> Result<(), serde_json::Error>,
        ),
        (CLUSTERS, |v: Value| {
            serde_json::from_value::<Cluster>(v).map(drop)
        }),
        (MACHINE_POOLS, |v: Value| {
            serde_json::from_value::<MachinePool>(v).map(drop)
        }),
    ] {
        let (object, paths) = generated(&dir, file);
        // `spec` itself is required by the schema, and an object is what the API server stores.
        for path in paths
            .iter()
            .filter(|p| !["spec", "status", "metadata"].contains(&p.as_str()))
        {
            if path.starts_with("metadata") || path == "apiVersion" || path == "kind" {
                continue;
            }
            let bent = with_wrong_shape(&object, path);
            assert_ne!(bent, object, "{file}: {path} was not replaced");
            if let Err(e) = read(bent) {
                panic!("{file}: {path} of an unexpected shape fails the object: {e}");
            }
        }
    }

    let (machine, _) = generated(&dir, MACHINES);
    let bent = with_wrong_shape(
        &with_wrong_shape(&machine, "spec.providerID"),
        "spec.bootstrap",
    );
    let read: Machine = serde_json::from_value(bent).unwrap();
    assert_eq!(read.spec.provider_id, None);
    assert_eq!(read.spec.bootstrap.data_secret_name, None);
    assert_eq!(read.spec.cluster_name, machine["spec"]["clusterName"]);
}
