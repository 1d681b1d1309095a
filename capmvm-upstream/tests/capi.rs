//! Cluster API v1.14's own managers on a real kube-apiserver, installed as this crate does it:
//! its webhooks answer (a MachineDeployment is defaulted and a bad one refused) and its conversion
//! webhook serves v1beta1.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use capmvm_upstream::Binaries;
use capmvm_upstream::capi::{Capi, CapiOptions};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use support::Management;

#[tokio::test]
async fn capi_webhooks_default_validate_and_convert() {
    let Some(binaries) = Binaries::for_test(
        "capi",
        &[
            "etcd",
            "kube-apiserver",
            "capi-manager",
            "capi-kubeadm-bootstrap-manager",
        ],
    ) else {
        return;
    };
    let management = Management::start(&binaries, "capi").await;
    let server = &management.server;
    let capi = Capi::install(&binaries, server, &management.dir, &CapiOptions::default())
        .await
        .unwrap();
    let client = server.client().await.unwrap();

    let v1beta2 = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "MachineDeployment"),
        "machinedeployments",
    );
    let mds: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &v1beta2);
    let md: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "MachineDeployment",
        "metadata": {"name": "md", "namespace": "default"},
        "spec": {
            "clusterName": "c",
            "template": {"spec": {
                "clusterName": "c",
                "bootstrap": {"dataSecretName": "x"},
                "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "MicrovmMachineTemplate", "name": "t"}
            }}
        }
    }))
    .unwrap();
    let created = mds.create(&PostParams::default(), &md).await.unwrap();
    // CAPI's defaulting webhook fills the selector and the cluster-name label.
    assert_eq!(
        created.data["spec"]["selector"]["matchLabels"]["cluster.x-k8s.io/cluster-name"], "c",
        "{:#}",
        created.data
    );

    // Its validating webhook refuses a second MachineDeployment naming neither configRef nor a
    // data Secret.
    let mut bad = md.clone();
    bad.metadata.name = Some("bad".into());
    bad.data["spec"]["template"]["spec"]["bootstrap"] = serde_json::json!({});
    let refused = mds.create(&PostParams::default(), &bad).await.unwrap_err();
    assert!(
        matches!(refused, kube::Error::Api(ref s) if s.code == 422 || s.code == 400),
        "{refused:?}"
    );

    // The conversion webhook serves objects at v1beta1 (a MachineHealthCheck: converting a
    // MachineDeployment looks up its infrastructure template's CRD, absent here).
    let mhc = |version: &str| {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("cluster.x-k8s.io", version, "MachineHealthCheck"),
            "machinehealthchecks",
        )
    };
    let check: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "MachineHealthCheck",
        "metadata": {"name": "mhc", "namespace": "default"},
        "spec": {"clusterName": "c", "selector": {"matchLabels": {"a": "b"}}}
    }))
    .unwrap();
    Api::<DynamicObject>::namespaced_with(client.clone(), "default", &mhc("v1beta2"))
        .create(&PostParams::default(), &check)
        .await
        .unwrap();
    let old = Api::<DynamicObject>::namespaced_with(client, "default", &mhc("v1beta1"))
        .get("mhc")
        .await
        .unwrap();
    assert_eq!(old.types.unwrap().api_version, "cluster.x-k8s.io/v1beta1");
    assert_eq!(old.data["spec"]["clusterName"], "c");
    capi.stop().await;
    management.stop().await;
}
