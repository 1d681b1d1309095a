//! The Go provider (`cluster-api-provider-microvm` v0.10), reproduced from its code for the move
//! to us: it cannot be built here (the Go module proxy answers 403 for it and for its flintlock
//! modules, docs/real-stack.md), so this is not the program, but what its code writes, step by
//! step, beside real Cluster API:
//!
//! - [`install`]: its CRDs as `clusterctl init` installed them: `v1alpha1` alone, the v1beta1
//!   contract label, clusterctl's labels and inventory entry;
//! - [`GoProvider`]: its two controllers, one object at a time (its concurrency is 1). MicrovmCluster:
//!   `status.ready`, one failure domain per host keyed by the host's endpoint, `LoadBalancerAvailable`
//!   once the workload cluster lists a Node, no finalizer. MicrovmMachine: wait for the Cluster's
//!   infrastructure and the bootstrap data; failure domain from the Machine, else the providerID,
//!   else crc32 of the name over the Cluster's sorted failure domains; finalizer; CreateMicroVM on
//!   that endpoint with its meta-data (`local_hostname`, `platform: liquid_metal`, `vm_host`: no uid
//!   of ours) and a fresh random MAC where none is given; providerID
//!   `microvm://<failure domain>/<uid>`; `status.ready`, `vmState` and v1beta1 conditions; its
//!   `cluster-name` label written into `spec.labels` when the spec had labels;
//! - [`register_stopped_webhooks`]: its admission webhook configurations, left behind when its Pods
//!   are scaled to zero, which then refuse writes to its kinds.
//!
//! Split by responsibility: this file installs it and runs its cluster controller; `machine.rs` is
//! its machine controller (and its failure-domain choice); `create.rs` the flintlock requests it
//! builds.

mod create;
mod machine;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context as _;
use capmvm_api::keys::PAUSED_ANNOTATION;
use capmvm_api::v1alpha1::{self, Condition, conditions};
use capmvm_flintlock::{ClientPool, PoolOptions};
use capmvm_upstream::capi::{record_provider, wait_crds_established};
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{
    ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube::{Api, ResourceExt as _};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tracing::debug;

use crate::capi::workload::{ClusterKey, WorkloadClusters};

/// Where clusterctl installed it (its kustomization's namespace).
pub const NAMESPACE: &str = "capmvm-system";
/// Its newest release, as clusterctl's inventory records it.
pub const VERSION: &str = "v0.10.1";
/// Its admission webhook configurations (kustomize's `capmvm-` prefix on its manifests' names).
pub const WEBHOOK_CONFIGURATIONS: [&str; 2] = [
    "capmvm-mutating-webhook-configuration",
    "capmvm-validating-webhook-configuration",
];
/// How long it waits before looking again at a pending or deleting microVM.
const REQUEUE: Duration = Duration::from_millis(500);

/// Installs its CRDs as clusterctl did: `v1alpha1` only, `cluster.x-k8s.io/v1beta1: v1alpha1`,
/// clusterctl's labels, and its Provider entry in clusterctl's inventory.
pub async fn install(client: &kube::Client) -> anyhow::Result<()> {
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?;
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e).context("creating the Go provider's namespace"),
    }
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for mut crd in v1alpha1::crds() {
        let labels = crd.metadata.labels.get_or_insert_default();
        labels.insert(
            "cluster.x-k8s.io/provider".into(),
            "infrastructure-microvm".into(),
        );
        labels.insert("clusterctl.cluster.x-k8s.io".into(), String::new());
        crds.create(&PostParams::default(), &crd)
            .await
            .with_context(|| format!("creating CRD {}", crd.name_any()))?;
    }
    tokio::time::timeout(Duration::from_secs(60), wait_crds_established(&crds))
        .await
        .context("the Go provider's CRDs were not Established within 60 s")??;
    record_provider(
        client,
        NAMESPACE,
        "infrastructure-microvm",
        "microvm",
        "InfrastructureProvider",
        VERSION,
    )
    .await
    .context("recording the Go provider in clusterctl's inventory")?;
    Ok(())
}

/// Registers its admission webhooks as its manifests declare them (failure policy Fail; the
/// machine's rules name the singular `microvmmachine`, as its manifests do), calling `port` on
/// loopback, where nothing listens: its Pods are gone. Returns the configurations' names.
pub async fn register_stopped_webhooks(
    client: &kube::Client,
    port: u16,
) -> anyhow::Result<Vec<String>> {
    let hook = |name: &str, path: &str, resource: &str, review: &str| {
        json!({
            "name": name,
            "clientConfig": {"url": format!("https://127.0.0.1:{port}{path}")},
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": [review],
            "rules": [{
                "apiGroups": [capmvm_api::GROUP],
                "apiVersions": [v1alpha1::VERSION],
                "operations": ["CREATE", "UPDATE"],
                "resources": [resource],
            }],
        })
    };
    let path =
        |verb: &str, kind: &str| format!("/{verb}-infrastructure-cluster-x-k8s-io-v1alpha1-{kind}");
    let mutating = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_CONFIGURATIONS[0]},
        "webhooks": [
            hook("default.microvmcluster.infrastructure.cluster.x-k8s.io", &path("mutate", "microvmcluster"), "microvmclusters", "v1beta1"),
            hook("default.microvmmachine.infrastructure.cluster.x-k8s.io", &path("mutate", "microvmmachine"), "microvmmachine", "v1beta1"),
        ],
    });
    let validating = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_CONFIGURATIONS[1]},
        "webhooks": [
            hook("validation.microvmcluster.infrastructure.cluster.x-k8s.io", &path("validate", "microvmcluster"), "microvmclusters", "v1beta1"),
            hook("validation.microvmmachine.infrastructure.cluster.x-k8s.io", &path("validate", "microvmmachine"), "microvmmachine", "v1beta1"),
            hook("validation.microvmmachinetemplate.infrastructure.cluster.x-k8s.io", &path("validate", "microvmmachinetemplate"), "microvmmachinetemplates", "v1"),
        ],
    });
    Api::<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration>::all(
        client.clone(),
    )
    .create(&PostParams::default(), &serde_json::from_value(mutating)?)
    .await
    .context("registering the Go provider's mutating webhooks")?;
    Api::<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration>::all(
        client.clone(),
    )
    .create(&PostParams::default(), &serde_json::from_value(validating)?)
    .await
    .context("registering the Go provider's validating webhooks")?;
    Ok(WEBHOOK_CONFIGURATIONS.map(str::to_string).to_vec())
}

/// Its controllers, running until [`GoProvider::stop`] (its Deployment scaled to zero).
pub struct GoProvider {
    task: JoinHandle<()>,
}

impl GoProvider {
    /// Starts its controllers with an administrator's `client`.
    pub fn start(client: kube::Client, workloads: WorkloadClusters) -> GoProvider {
        let ctx = Ctx {
            client,
            workloads,
            hosts: ClientPool::new(PoolOptions::default()),
        };
        let task = tokio::spawn(async move {
            loop {
                ctx.reconcile_all().await;
                tokio::time::sleep(REQUEUE).await;
            }
        });
        GoProvider { task }
    }

    /// Stops it at once, as scaling its Deployment to zero does.
    pub fn stop(self) {
        self.task.abort();
    }
}

struct Ctx {
    client: kube::Client,
    workloads: WorkloadClusters,
    hosts: ClientPool,
}

fn capi(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", kind),
        plural,
    )
}

/// CAPI v1beta1's `conditions.Set`: the transition time moves only when the status does.
fn set_condition(
    all: &mut Vec<Condition>,
    type_: &str,
    status: &str,
    severity: &str,
    reason: &str,
    message: &str,
) {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let new = Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        severity: severity.to_string(),
        last_transition_time: now,
        reason: reason.to_string(),
        message: message.to_string(),
    };
    match all.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            let time = if c.status == status {
                c.last_transition_time.clone()
            } else {
                new.last_transition_time.clone()
            };
            *c = Condition {
                last_transition_time: time,
                ..new
            };
        }
        None => all.push(new),
    }
}

/// CAPI v1beta1's `conditions.SetSummary` over one condition: `Ready` mirrors it.
fn summarize(all: &mut Vec<Condition>, of: &str) {
    let Some(c) = all.iter().find(|c| c.type_ == of).cloned() else {
        return;
    };
    set_condition(
        all,
        conditions::READY,
        &c.status,
        &c.severity,
        &c.reason,
        &c.message,
    );
}

impl Ctx {
    async fn reconcile_all(&self) {
        let clusters = Api::<v1alpha1::MicrovmCluster>::all(self.client.clone())
            .list(&ListParams::default())
            .await;
        for c in clusters.map(|l| l.items).unwrap_or_default() {
            if let Err(e) = self.reconcile_cluster(&c).await {
                debug!(cluster = %c.name_any(), error = %e, "Go provider: MicrovmCluster not reconciled");
            }
        }
        let machines = Api::<v1alpha1::MicrovmMachine>::all(self.client.clone())
            .list(&ListParams::default())
            .await;
        for m in machines.map(|l| l.items).unwrap_or_default() {
            if let Err(e) = self.reconcile_machine(&m).await {
                debug!(machine = %m.name_any(), error = %e, "Go provider: MicrovmMachine not reconciled");
            }
        }
    }

    async fn get_dynamic(
        &self,
        resource: &ApiResource,
        ns: &str,
        name: &str,
    ) -> anyhow::Result<Option<DynamicObject>> {
        match Api::<DynamicObject>::namespaced_with(self.client.clone(), ns, resource)
            .get(name)
            .await
        {
            Ok(o) => Ok(Some(o)),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn reconcile_cluster(&self, mc: &v1alpha1::MicrovmCluster) -> anyhow::Result<()> {
        let ns = mc.namespace().unwrap_or_default();
        let Some(owner) = mc
            .owner_references()
            .iter()
            .find(|o| o.kind == "Cluster" && o.api_version.starts_with("cluster.x-k8s.io/"))
        else {
            return Ok(());
        };
        let Some(cluster) = self
            .get_dynamic(&capi("Cluster", "clusters"), &ns, &owner.name)
            .await?
        else {
            return Ok(());
        };
        if cluster.data.pointer("/spec/paused") == Some(&json!(true))
            || mc.annotations().contains_key(PAUSED_ANNOTATION)
            || mc.metadata.deletion_timestamp.is_some()
        {
            return Ok(());
        }
        let endpoint_set = cluster
            .data
            .pointer("/spec/controlPlaneEndpoint/host")
            .and_then(Value::as_str)
            .is_some_and(|h| !h.is_empty())
            || !mc.spec.control_plane_endpoint.host.is_empty();
        anyhow::ensure!(
            endpoint_set,
            "controlplane endpoint is required on cluster or mvmcluster"
        );
        let mut status = mc.status.clone().unwrap_or_default();
        status.ready = true;
        let pool = mc
            .spec
            .placement
            .static_pool
            .as_ref()
            .context("setting failuredomains: no placement specified")?;
        status.failure_domains = pool
            .hosts
            .iter()
            .map(|h| {
                (
                    h.endpoint.clone(),
                    v1alpha1::FailureDomainSpec {
                        control_plane: h.controlplane_allowed,
                        attributes: BTreeMap::new(),
                    },
                )
            })
            .collect();
        let key = ClusterKey::new(&ns, &owner.name);
        let nodes = match self.workloads.client(&key) {
            Some(client) => Api::<Node>::all(client)
                .list(&ListParams::default())
                .await
                .map(|l| l.items.len())
                .unwrap_or(0),
            None => 0,
        };
        if nodes > 0 {
            set_condition(
                &mut status.conditions,
                conditions::LOAD_BALANCER_AVAILABLE,
                "True",
                "",
                "",
                "",
            );
        } else {
            set_condition(
                &mut status.conditions,
                conditions::LOAD_BALANCER_AVAILABLE,
                "False",
                conditions::SEVERITY_INFO,
                conditions::LOAD_BALANCER_NOT_AVAILABLE,
                "control plane load balancer isn't available",
            );
        }
        summarize(&mut status.conditions, conditions::LOAD_BALANCER_AVAILABLE);
        if mc.status.as_ref() != Some(&status) {
            Api::<v1alpha1::MicrovmCluster>::namespaced(self.client.clone(), &ns)
                .patch_status(
                    &mc.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "status": status })),
                )
                .await?;
        }
        Ok(())
    }
}
