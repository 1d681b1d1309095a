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

use std::collections::BTreeMap;
use std::hash::{BuildHasher as _, Hasher as _};
use std::time::Duration;

use anyhow::Context as _;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use capmvm_api::capi::Machine;
use capmvm_api::keys::{CLUSTER_NAME_LABEL, MACHINE_FINALIZER, PAUSED_ANNOTATION};
use capmvm_api::v1alpha1::{self, Condition, conditions, vm_states};
use capmvm_flintlock::{
    ClientPool, FlintlockClient, HostConfig, IfaceType, Initrd, Kernel, MicrovmSpec,
    MicrovmState, NetworkInterface, PoolOptions, SecretBytes, SecretString, StaticAddress,
    TlsMaterial, Volume, VolumeSource,
};
use capmvm_upstream::capi::{record_provider, wait_crds_established};
use k8s_openapi::api::core::v1::{Namespace, Node, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{
    ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube::{Api, ResourceExt as _};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tracing::{debug, info};

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
    let path = |verb: &str, kind: &str| {
        format!("/{verb}-infrastructure-cluster-x-k8s-io-v1alpha1-{kind}")
    };
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

/// CRC-32 (IEEE), as Go's `crc32.ChecksumIEEE`.
fn crc32_ieee(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for b in bytes {
        crc ^= u32::from(*b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A fresh random locally administered unicast MAC, as its `macpot` makes one per create.
fn random_mac() -> String {
    let mut bytes = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
        .to_be_bytes();
    bytes[0] = (bytes[0] | 0x02) & 0xfe;
    bytes[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
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

    async fn reconcile_machine(&self, mvm: &v1alpha1::MicrovmMachine) -> anyhow::Result<()> {
        let ns = mvm.namespace().unwrap_or_default();
        let name = mvm.name_any();
        let Some(owner) = mvm
            .owner_references()
            .iter()
            .find(|o| o.kind == "Machine" && o.api_version.starts_with("cluster.x-k8s.io/"))
        else {
            return Ok(());
        };
        let machine = match Api::<Machine>::namespaced(self.client.clone(), &ns)
            .get(&owner.name)
            .await
        {
            Ok(m) => m,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let Some(cluster_name) = machine.labels().get(CLUSTER_NAME_LABEL).cloned() else {
            return Ok(());
        };
        let Some(cluster) = self
            .get_dynamic(&capi("Cluster", "clusters"), &ns, &cluster_name)
            .await?
        else {
            return Ok(());
        };
        if cluster.data.pointer("/spec/paused") == Some(&json!(true))
            || mvm.annotations().contains_key(PAUSED_ANNOTATION)
        {
            return Ok(());
        }
        let infra_name = cluster
            .data
            .pointer("/spec/infrastructureRef/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let mc = match Api::<v1alpha1::MicrovmCluster>::namespaced(self.client.clone(), &ns)
            .get(infra_name)
            .await
        {
            Ok(mc) => mc,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let api = Api::<v1alpha1::MicrovmMachine>::namespaced(self.client.clone(), &ns);
        let mut status = mvm.status.clone().unwrap_or_default();
        let write_status = |status: v1alpha1::MicrovmMachineStatus| {
            let api = api.clone();
            let name = name.clone();
            let mut status = status;
            summarize(&mut status.conditions, conditions::MICROVM_READY);
            async move {
                api.patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "status": status })),
                )
                .await
            }
        };

        if mvm.metadata.deletion_timestamp.is_some() {
            let domain = failure_domain(&machine, mvm, &cluster)?;
            let client = self.flintlock(&mc, &domain).await?;
            let uid = instance_id(mvm);
            let vm = match client.get(&uid).await {
                Ok(vm) => Some(vm),
                Err(e) if e.to_string().contains("not found") => None,
                Err(e) => return Err(e.into()),
            };
            match vm {
                Some(vm) => {
                    set_condition(
                        &mut status.conditions,
                        conditions::MICROVM_READY,
                        "False",
                        conditions::SEVERITY_INFO,
                        conditions::MICROVM_DELETING,
                        "",
                    );
                    status.ready = false;
                    write_status(status).await?;
                    if vm.status.state != MicrovmState::Deleting {
                        client.delete(&uid).await?;
                    }
                }
                None => {
                    let rest: Vec<String> = mvm
                        .finalizers()
                        .iter()
                        .filter(|f| *f != MACHINE_FINALIZER)
                        .cloned()
                        .collect();
                    api.patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"finalizers": rest}})),
                    )
                    .await?;
                    info!(machine = %name, "Go provider: microvm deleted");
                }
            }
            return Ok(());
        }

        let infrastructure_ready = cluster
            .data
            .pointer("/status/initialization/infrastructureProvisioned")
            == Some(&json!(true));
        if !infrastructure_ready {
            set_condition(
                &mut status.conditions,
                conditions::MICROVM_READY,
                "False",
                conditions::SEVERITY_INFO,
                conditions::WAITING_FOR_CLUSTER_INFRA,
                "",
            );
            write_status(status).await?;
            return Ok(());
        }
        let Some(secret_name) = machine.spec.bootstrap.data_secret_name.clone() else {
            set_condition(
                &mut status.conditions,
                conditions::MICROVM_READY,
                "False",
                conditions::SEVERITY_INFO,
                conditions::WAITING_FOR_BOOTSTRAP_DATA,
                "",
            );
            write_status(status).await?;
            return Ok(());
        };
        let domain = failure_domain(&machine, mvm, &cluster)?;
        let client = self.flintlock(&mc, &domain).await?;
        let mut vm = None;
        if mvm.spec.provider_id.is_some() {
            match client.get(&instance_id(mvm)).await {
                Ok(found) => vm = Some(found),
                Err(e) if e.to_string().contains("not found") => {}
                Err(e) => return Err(e.into()),
            }
        }
        if !mvm.finalizers().iter().any(|f| f == MACHINE_FINALIZER) {
            let mut finalizers = mvm.finalizers().to_vec();
            finalizers.push(MACHINE_FINALIZER.to_string());
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": finalizers}})),
            )
            .await?;
        }
        let vm = match vm {
            Some(vm) => vm,
            None => {
                let secret = Api::<Secret>::namespaced(self.client.clone(), &ns)
                    .get(&secret_name)
                    .await?;
                let value = secret
                    .data
                    .as_ref()
                    .and_then(|d| d.get("value"))
                    .context("missing bootstrap secrey value key")?;
                let spec = self.microvm_spec(mvm, &mc, &cluster_name, &domain, &value.0)?;
                let created = client.create(spec).await?;
                info!(machine = %name, host = %domain, uid = %created.uid(), "Go provider: microvm created");
                created
            }
        };
        let provider_id = format!("microvm://{domain}/{}", vm.uid());
        // Its GetLabels adds cluster-name to the spec's own label map, which the next patch keeps.
        let mut labels = mvm.spec.labels.clone();
        if !labels.is_empty() {
            labels.insert("cluster-name".into(), cluster_name.clone());
        }
        if mvm.spec.provider_id.as_deref() != Some(provider_id.as_str()) || labels != mvm.spec.labels
        {
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"providerID": provider_id, "labels": labels}})),
            )
            .await?;
        }
        match vm.status.state {
            MicrovmState::Created => {
                status.vm_state = Some(vm_states::RUNNING.into());
                set_condition(
                    &mut status.conditions,
                    conditions::MICROVM_READY,
                    "True",
                    "",
                    "",
                    "",
                );
                status.ready = true;
            }
            MicrovmState::Pending => {
                status.vm_state = Some(vm_states::PENDING.into());
                set_condition(
                    &mut status.conditions,
                    conditions::MICROVM_READY,
                    "False",
                    conditions::SEVERITY_INFO,
                    conditions::MICROVM_PENDING,
                    "",
                );
                status.ready = false;
            }
            MicrovmState::Failed => {
                status.vm_state = Some(vm_states::FAILED.into());
                set_condition(
                    &mut status.conditions,
                    conditions::MICROVM_READY,
                    "False",
                    "Error",
                    "MicrovmProvisionFailed",
                    "microvm is in a failed state",
                );
                status.ready = false;
            }
            MicrovmState::Deleting => return Ok(()),
            _ => {
                status.vm_state = Some(vm_states::UNKNOWN.into());
                set_condition(
                    &mut status.conditions,
                    conditions::MICROVM_READY,
                    "False",
                    "Error",
                    "MicrovmUnknownState",
                    "microvm is in an unknown/unsupported state",
                );
                status.ready = false;
            }
        }
        let mut summarized = status.clone();
        summarize(&mut summarized.conditions, conditions::MICROVM_READY);
        if mvm.status.as_ref() != Some(&summarized) {
            write_status(status).await?;
        }
        Ok(())
    }

    /// A flintlock client for `endpoint` with the MicrovmCluster's credentials: the basic-auth token
    /// under the host without its port, the TLS Secret's three keys.
    async fn flintlock(
        &self,
        mc: &v1alpha1::MicrovmCluster,
        endpoint: &str,
    ) -> anyhow::Result<FlintlockClient> {
        let ns = mc.namespace().unwrap_or_default();
        let secrets = Api::<Secret>::namespaced(self.client.clone(), &ns);
        let mut host = HostConfig::new(endpoint);
        if let Some(pool) = &mc.spec.placement.static_pool
            && !pool.basic_auth_secret.is_empty()
        {
            let secret = secrets.get(&pool.basic_auth_secret).await?;
            let key = endpoint.split(':').next().unwrap_or_default();
            let token = secret
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|t| String::from_utf8_lossy(&t.0).to_string())
                .unwrap_or_default();
            host.basic_auth_token = (!token.is_empty()).then(|| SecretString::new(token));
        }
        if !mc.spec.tls_secret_ref.is_empty() {
            let secret = secrets.get(&mc.spec.tls_secret_ref).await?;
            let data = secret.data.unwrap_or_default();
            let key = |k: &str| {
                data.get(k)
                    .map(|v| v.0.clone())
                    .with_context(|| format!("required key missing from TLS config data: {k}"))
            };
            host.tls = Some(TlsMaterial {
                ca_pem: Some(key("ca.crt")?),
                client_cert_pem: Some(key("tls.crt")?),
                client_key_pem: Some(SecretBytes::new(key("tls.key")?)),
            });
        }
        if let Some(proxy) = &mc.spec.microvm_proxy {
            host.proxy = Some(proxy.endpoint.clone());
        }
        Ok(self.hosts.client(&host)?)
    }

    /// The CreateMicroVM request its convert.go and service.go build.
    fn microvm_spec(
        &self,
        mvm: &v1alpha1::MicrovmMachine,
        mc: &v1alpha1::MicrovmCluster,
        cluster_name: &str,
        vm_host: &str,
        bootstrap: &[u8],
    ) -> anyhow::Result<MicrovmSpec> {
        let spec = &mvm.spec;
        let name = mvm.name_any();
        let mut labels = spec.labels.clone();
        labels.insert("cluster-name".into(), cluster_name.to_string());
        let keys = if spec.ssh_public_keys.is_empty() {
            &mc.spec.ssh_public_keys
        } else {
            &spec.ssh_public_keys
        };
        let users: Vec<Value> = keys
            .iter()
            .map(|k| json!({"name": k.user, "ssh_authorized_keys": k.authorized_keys}))
            .collect();
        let mut vendor = serde_json::Map::new();
        vendor.insert("hostname".into(), json!(name));
        if !users.is_empty() {
            vendor.insert("users".into(), json!(users));
        }
        vendor.insert(
            "final_message".into(),
            json!("The Liquid Metal booted system is good to go after $UPTIME seconds"),
        );
        vendor.insert(
            "bootcmd".into(),
            json!(["ln -sf /run/systemd/resolve/stub-resolv.conf /etc/resolv.conf"]),
        );
        let vendor_data = format!(
            "#cloud-config\n{}",
            serde_saphyr::to_string(&Value::Object(vendor))?
        );
        let meta_data = serde_saphyr::to_string(&BTreeMap::from([
            ("local_hostname", name.as_str()),
            ("platform", "liquid_metal"),
            ("vm_host", vm_host),
        ]))?;
        let metadata = BTreeMap::from([
            // Its GetRawBootstrapData base64-encodes the Secret's value.
            ("user-data".to_string(), STANDARD.encode(bootstrap)),
            ("vendor-data".to_string(), STANDARD.encode(vendor_data)),
            ("meta-data".to_string(), STANDARD.encode(meta_data)),
        ]);
        let volume = |v: &v1alpha1::Volume| Volume {
            id: v.id.clone(),
            is_read_only: v.read_only,
            mount_point: (!v.mount_point.is_empty()).then(|| v.mount_point.clone()),
            source: VolumeSource {
                container_source: Some(v.image.clone()),
                virtiofs_source: (!v.virtiofs_path.is_empty()).then(|| v.virtiofs_path.clone()),
            },
            ..Volume::default()
        };
        Ok(MicrovmSpec {
            id: name.clone(),
            namespace: mvm.namespace().unwrap_or_default(),
            labels,
            vcpu: i32::try_from(spec.vcpu).unwrap_or(i32::MAX),
            memory_mb: i32::try_from(spec.memory_mb).unwrap_or(i32::MAX),
            kernel: Kernel {
                image: spec.kernel.image.clone(),
                filename: Some(spec.kernel.filename.clone()),
                cmdline: spec.kernel_cmdline.clone(),
                add_network_config: true,
            },
            initrd: spec.initrd.as_ref().map(|i| Initrd {
                image: i.image.clone(),
                filename: Some(i.filename.clone()),
            }),
            root_volume: Some(Volume {
                mount_point: None,
                ..volume(&spec.root_volume)
            }),
            additional_volumes: spec.volumes.iter().map(volume).collect(),
            interfaces: spec
                .network_interfaces
                .iter()
                .map(|n| NetworkInterface {
                    device_id: n.guest_device_name.clone(),
                    iface_type: match n.iface_type {
                        v1alpha1::IfaceType::Macvtap => IfaceType::Macvtap,
                        v1alpha1::IfaceType::Tap => IfaceType::Tap,
                    },
                    guest_mac: Some(if n.guest_mac.is_empty() {
                        random_mac()
                    } else {
                        n.guest_mac.clone()
                    }),
                    address: (!n.address.is_empty()).then(|| StaticAddress {
                        address: n.address.clone(),
                        gateway: None,
                        nameservers: Vec::new(),
                    }),
                })
                .collect(),
            metadata,
            uid: None,
            provider: (!spec.provider.is_empty()).then(|| spec.provider.clone()),
            allow_guest_agent: false,
        })
    }
}

/// The uid in the providerID: its last path segment.
fn instance_id(mvm: &v1alpha1::MicrovmMachine) -> String {
    mvm.spec
        .provider_id
        .as_deref()
        .and_then(|p| p.rsplit('/').next())
        .unwrap_or_default()
        .to_string()
}

/// Its GetFailureDomain: the Machine's, else the providerID's, else crc32 of the machine's name
/// over the Cluster's failure domains in sorted order.
fn failure_domain(
    machine: &Machine,
    mvm: &v1alpha1::MicrovmMachine,
    cluster: &DynamicObject,
) -> anyhow::Result<String> {
    if let Some(fd) = machine.spec.failure_domain.as_ref().filter(|f| !f.is_empty()) {
        return Ok(fd.clone());
    }
    if let Some(pid) = &mvm.spec.provider_id {
        let rest = pid.replace("microvm://", "");
        return Ok(rest.split('/').next().unwrap_or_default().to_string());
    }
    let mut names: Vec<String> = cluster
        .data
        .pointer("/status/failureDomains")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|f| f.get("name").and_then(Value::as_str).map(str::to_string))
        .collect();
    anyhow::ensure!(!names.is_empty(), "no failure domains found on the cluster");
    names.sort();
    let at = crc32_ieee(mvm.name_any().as_bytes()) as usize % names.len();
    Ok(names.swap_remove(at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_is_ieee() {
        // Go: crc32.ChecksumIEEE([]byte("123456789")) == 0xcbf43926.
        assert_eq!(crc32_ieee(b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32_ieee(b""), 0);
    }

    #[test]
    fn macs_are_local_unicast() {
        for _ in 0..50 {
            let mac = random_mac();
            let first = u8::from_str_radix(&mac[..2], 16).unwrap_or(1);
            assert_eq!(first & 0x03, 0x02, "{mac}");
            assert_eq!(mac.len(), 17);
        }
    }
}
