//! Decoding CAPI's objects into the read-only views, as the operator's watches do for every event.
//!
//! `cargo bench -p capmvm-api --bench capi_views` (seconds per measurement: `CAPMVM_BENCH_SECS`,
//! default 2). The object is a worker Machine as Cluster API v1.14 keeps it once its Node is ready
//! (status conditions, the deprecated v1beta1 ones, addresses and node info; no managedFields, which
//! the operator's watches skip in the parser). It prints the time per decode of the view and, for
//! scale, of a `serde_json::Value` of the same text.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use capmvm_api::capi::Machine;

fn condition(kind: &str, status: &str, reason: &str, message: &str) -> serde_json::Value {
    serde_json::json!({
        "type": kind, "status": status, "reason": reason, "message": message,
        "lastTransitionTime": "2026-11-27T10:00:00Z", "observedGeneration": 3
    })
}

fn machine_text() -> String {
    let conditions: Vec<_> = [
        ("Available", "True", "Available", ""),
        ("BootstrapConfigReady", "True", "Ready", ""),
        ("Deleting", "False", "NotDeleting", ""),
        ("HealthCheckSucceeded", "True", "Succeeded", ""),
        ("InfrastructureReady", "True", "Ready", ""),
        ("NodeHealthy", "True", "NodeHealthy", ""),
        (
            "NodeReady",
            "True",
            "NodeReady",
            "kubelet is posting ready status",
        ),
        ("OwnerRemediated", "True", "NotRemediated", ""),
        ("Paused", "False", "NotPaused", ""),
        ("Ready", "True", "Ready", ""),
        ("UpToDate", "True", "UpToDate", ""),
        ("Updating", "False", "NotUpdating", ""),
    ]
    .iter()
    .map(|(t, s, r, m)| condition(t, s, r, m))
    .collect();
    let v1beta1: Vec<_> = [
        "Ready",
        "BootstrapReady",
        "InfrastructureReady",
        "NodeHealthy",
        "DrainingSucceeded",
    ]
    .iter()
    .map(|t| serde_json::json!({"type": t, "status": "True", "lastTransitionTime": "2026-11-27T10:00:00Z"}))
    .collect();
    serde_json::json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Machine",
        "metadata": {
            "name": "demo-md-0-8x2kq-5vz7w", "namespace": "default",
            "uid": "6d1c1f5e-0b1a-4f43-9a55-2f3e4d5c6b7a", "resourceVersion": "123456",
            "generation": 3, "creationTimestamp": "2026-11-27T10:00:00Z",
            "labels": {
                "cluster.x-k8s.io/cluster-name": "demo",
                "cluster.x-k8s.io/deployment-name": "demo-md-0",
                "cluster.x-k8s.io/set-name": "demo-md-0-8x2kq",
                "machine-template-hash": "3794125896"
            },
            "annotations": {"machine.cluster.x-k8s.io/certificates-expiry": "2027-11-27T10:00:00Z"},
            "finalizers": ["machine.cluster.x-k8s.io"],
            "ownerReferences": [{
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet",
                "name": "demo-md-0-8x2kq", "uid": "0f9e8d7c-6b5a-4c3d-2e1f-0a9b8c7d6e5f",
                "controller": true, "blockOwnerDeletion": true
            }]
        },
        "spec": {
            "clusterName": "demo",
            "bootstrap": {
                "configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfig", "name": "demo-md-0-8x2kq-5vz7w"},
                "dataSecretName": "demo-md-0-8x2kq-5vz7w"
            },
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "MicrovmMachine", "name": "demo-md-0-8x2kq-5vz7w"},
            "providerID": "microvm://host-07:9090/6d1c1f5e",
            "failureDomain": "fd-07",
            "version": "v1.33.1",
            "deletion": {"nodeDrainTimeoutSeconds": 0}
        },
        "status": {
            "phase": "Running",
            "observedGeneration": 3,
            "initialization": {"bootstrapDataSecretCreated": true, "infrastructureProvisioned": true},
            "conditions": conditions,
            "deprecated": {"v1beta1": {"conditions": v1beta1}},
            "nodeRef": {"name": "demo-md-0-8x2kq-5vz7w"},
            "addresses": [{"type": "InternalIP", "address": "10.0.7.21"}, {"type": "Hostname", "address": "demo-md-0-8x2kq-5vz7w"}],
            "nodeInfo": {
                "architecture": "amd64", "bootID": "b6c2", "containerRuntimeVersion": "containerd://2.1.0",
                "kernelVersion": "6.1.0", "kubeProxyVersion": "", "kubeletVersion": "v1.33.1",
                "machineID": "m", "operatingSystem": "linux", "osImage": "Ubuntu 24.04", "systemUUID": "s",
                "swap": {"capacity": 0}
            },
            "lastUpdated": "2026-11-27T10:01:00Z"
        }
    })
    .to_string()
}

/// Runs `f` for the set time; nanoseconds per call.
fn per_call(secs: f64, mut f: impl FnMut()) -> f64 {
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let started = Instant::now();
    let mut calls = 0u64;
    while Instant::now() < until {
        for _ in 0..100 {
            f();
        }
        calls += 100;
    }
    started.elapsed().as_nanos() as f64 / calls as f64
}

fn main() {
    let secs = std::env::var("CAPMVM_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    let text = machine_text();
    let view: Machine = serde_json::from_str(&text).unwrap();
    assert!(view.has_node() && view.status.as_ref().unwrap().conditions.len() == 12);
    println!(
        "a CAPI v1.14 Machine once ready: {} bytes of JSON",
        text.len()
    );
    let machine = per_call(secs, || {
        black_box(serde_json::from_str::<Machine>(black_box(&text)).unwrap());
    });
    println!(
        "  decoded into the Machine view: {:.1} µs",
        machine / 1000.0
    );
    let value = per_call(secs, || {
        black_box(serde_json::from_str::<serde_json::Value>(black_box(&text)).unwrap());
    });
    println!(
        "  decoded into a serde_json::Value: {:.1} µs",
        value / 1000.0
    );
}
