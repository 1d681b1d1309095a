//! What the demo and the end-to-end checks need of a running system, whichever serves the API: the
//! embedded emulator with the CAPI stand-in ([`crate::world::World`]) or the real kube-apiserver with
//! Cluster API's own managers ([`crate::real::RealStack`]).

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;

use capmvm_flintlock::Method;
use capmvm_flintlock::hollow::pki::TestPki;
use capmvm_flintlock::hollow::{HollowHandle, VmSnapshot};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, PostParams};

use crate::capi::workload::WorkloadClusters;
use crate::world::HostAuth;

/// API requests counted by verb and resource (`<group, or core>/<plural>[/<subresource>]`, as the
/// emulator's counters name them), from the emulator's counters or the real server's audit log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestCounts {
    counts: BTreeMap<(String, String), u64>,
}

impl RequestCounts {
    /// Counts `n` more requests of `verb` on `resource`.
    pub fn add(&mut self, verb: &str, resource: &str, n: u64) {
        *self
            .counts
            .entry((verb.to_string(), resource.to_string()))
            .or_default() += n;
    }

    /// Every (verb, resource, count), ordered by verb then resource.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str, u64)> {
        self.counts
            .iter()
            .map(|((v, r), n)| (v.as_str(), r.as_str(), *n))
    }

    /// Requests by verb.
    pub fn by_verb(&self) -> BTreeMap<String, u64> {
        let mut by_verb = BTreeMap::new();
        for ((verb, _), n) in &self.counts {
            *by_verb.entry(verb.clone()).or_default() += n;
        }
        by_verb
    }

    /// Requests of one verb.
    pub fn verb_total(&self, verb: &str) -> u64 {
        self.iter()
            .filter(|(v, _, _)| *v == verb)
            .map(|(_, _, n)| n)
            .sum()
    }

    /// Every request.
    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }

    /// Requests that change state.
    pub fn writes(&self) -> u64 {
        self.iter()
            .filter(|(v, _, _)| is_write(v))
            .map(|(_, _, n)| n)
            .sum()
    }

    /// What was counted since `before`.
    pub fn since(&self, before: &RequestCounts) -> RequestCounts {
        RequestCounts {
            counts: self
                .counts
                .iter()
                .map(|(k, n)| {
                    (
                        k.clone(),
                        n.saturating_sub(before.counts.get(k).copied().unwrap_or(0)),
                    )
                })
                .filter(|(_, n)| *n > 0)
                .collect(),
        }
    }
}

/// Whether a verb changes state.
pub fn is_write(verb: &str) -> bool {
    matches!(
        verb,
        "create" | "update" | "patch" | "delete" | "deletecollection"
    )
}

/// A running system: the management API, the hollow hosts, the workload clusters, the operator.
pub trait Stack {
    /// A client of the management API (an administrator's).
    fn client(&self) -> &kube::Client;
    /// The hollow hosts.
    fn hosts(&self) -> &[HollowHandle];
    /// How the hosts authenticate callers.
    fn host_auth(&self) -> &HostAuth;
    /// The hosts' PKI, when they use TLS.
    fn host_pki(&self) -> Option<&TestPki>;
    /// The workload clusters and the Nodes registered in them.
    fn workloads(&self) -> &WorkloadClusters;
    /// Where the operator logs.
    fn operator_log(&self) -> PathBuf;
    /// The operator's process id, while it runs.
    fn operator_pid(&self) -> Option<u32>;
    /// Where our operator serves its metrics, while it runs (none for the Go provider).
    fn operator_metrics(&self) -> Option<std::net::SocketAddr>;
    /// The hollow kubelets: the Nodes they registered.
    fn kubelets(&self) -> crate::capi::kubelet::KubeletControl;
    /// The kubeconfig a user would use for the management cluster.
    fn kubeconfig(&self) -> PathBuf;
    /// Every API request counted so far, as the API server counts them; an error when they cannot
    /// be counted (the real stack's audit log missing or unreadable), never zero.
    fn api_requests(&self) -> anyhow::Result<RequestCounts>;
    /// The operator's API requests counted so far (an error as for [`Stack::api_requests`]).
    fn operator_requests(&self) -> anyhow::Result<RequestCounts>;
    /// Requests the server answered 429 (priority and fairness) so far, of all clients and of the
    /// operator, where the server reports it (the real stack's audit log; the emulator throttles
    /// nobody unless told to).
    fn throttled(&self) -> anyhow::Result<Option<(u64, u64)>> {
        Ok(None)
    }
    /// The operator's requests so far and those of them authorization (RBAC) refused, as
    /// `verb URI`, where the server reports it (the real stack's audit log; the emulator has no
    /// RBAC).
    fn operator_denials(&self) -> anyhow::Result<Option<(u64, Vec<String>)>> {
        Ok(None)
    }
    /// Renders a cluster template with `vars` as clusterctl fills them.
    fn render(
        &self,
        template: &str,
        vars: &BTreeMap<String, String>,
    ) -> impl Future<Output = anyhow::Result<Vec<DynamicObject>>> + Send;
    /// Creates or updates `objects` as a user would; their `kind/name`s.
    fn apply(
        &self,
        objects: &[DynamicObject],
    ) -> impl Future<Output = anyhow::Result<Vec<String>>> + Send;
    /// Sets `replicas` through the scale subresource, as `kubectl scale` does.
    fn scale(
        &self,
        resource: &ApiResource,
        namespace: &str,
        name: &str,
        replicas: usize,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// Deletes an object as a user does (without waiting for it to go).
    fn delete(
        &self,
        resource: &ApiResource,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// The hosts' endpoints.
pub fn endpoints(hosts: &[HollowHandle]) -> Vec<String> {
    hosts.iter().map(HollowHandle::endpoint).collect()
}

/// Every microVM on every host, with the host's endpoint.
pub fn all_vms(hosts: &[HollowHandle]) -> Vec<(String, VmSnapshot)> {
    hosts
        .iter()
        .flat_map(|h| {
            h.control()
                .vms()
                .into_iter()
                .map(move |vm| (h.endpoint(), vm))
        })
        .collect()
}

/// Flintlock calls of `method` the hosts answered (successful or not), on all of them.
pub fn host_calls(hosts: &[HollowHandle], method: Method) -> u64 {
    hosts
        .iter()
        .map(|h| h.control().counters().of(method))
        .sum()
}

/// Flintlock calls the hosts answered, by method (methods never called left out).
pub fn flintlock_calls(hosts: &[HollowHandle]) -> BTreeMap<&'static str, u64> {
    let mut calls = BTreeMap::new();
    for host in hosts {
        let counters = host.control().counters();
        for method in [
            Method::Create,
            Method::Get,
            Method::List,
            Method::ListStream,
            Method::Delete,
        ] {
            *calls.entry(method.as_str()).or_insert(0) += counters.of(method);
        }
    }
    calls.retain(|_, n| *n > 0);
    calls
}

/// Renders `template` with `vars` over the required variables filled as a user fills them (every
/// host of `stack` in `FLINTLOCK_HOSTS`, the demo's key and VIP: [`crate::world::template_variables`]),
/// lets `edit` change the objects, and applies them. `CONTROL_PLANE_MACHINE_COUNT` and `WORKER_MACHINE_COUNT` default to 1 and 0, as clusterctl
/// sets them. With `CONTROL_PLANE_MACHINE_COUNT=0` the cluster has no control plane (no
/// KubeadmControlPlane and no `controlPlaneRef`: clusterctl refuses 0, CAPI a KubeadmControlPlane
/// of 0 replicas).
pub async fn apply_template<S: Stack + Sync>(
    stack: &S,
    template: &str,
    vars: &[(&str, String)],
    edit: impl FnOnce(&mut Vec<DynamicObject>),
) -> anyhow::Result<Vec<String>> {
    let endpoints = endpoints(stack.hosts());
    // The required variables as a user fills them (every host of the stack in the pool), then `vars`.
    let mut all: BTreeMap<String, String> = crate::world::template_variables(&endpoints);
    all.extend(vars.iter().map(|(k, v)| (k.to_string(), v.clone())));
    // clusterctl always sets these two, whatever the template's defaults say: the control plane
    // count from its flag (default 1, never below 1) and the worker count (default 0).
    let no_control_plane = all.get("CONTROL_PLANE_MACHINE_COUNT").map(String::as_str) == Some("0");
    all.insert(
        "CONTROL_PLANE_MACHINE_COUNT".to_string(),
        all.get("CONTROL_PLANE_MACHINE_COUNT")
            .filter(|c| c.as_str() != "0")
            .cloned()
            .unwrap_or_else(|| "1".to_string()),
    );
    all.entry("WORKER_MACHINE_COUNT".to_string())
        .or_insert_with(|| "0".to_string());
    let mut objects = stack.render(template, &all).await?;
    if no_control_plane {
        objects.retain(|o| {
            o.types
                .as_ref()
                .is_none_or(|t| t.kind != "KubeadmControlPlane")
        });
        for obj in &mut objects {
            if obj.types.as_ref().is_some_and(|t| t.kind == "Cluster")
                && let Some(spec) = obj.data["spec"].as_object_mut()
            {
                spec.remove("controlPlaneRef");
            }
        }
    }
    edit(&mut objects);
    stack.apply(&objects).await
}

/// Creates the Secrets the hosts' authentication needs, named `<cluster>-flintlock-token` and
/// `<cluster>-flintlock-tls`, and returns `(basicAuthSecret, tlsSecretRef)` to put in the
/// MicrovmCluster.
pub async fn create_credentials<S: Stack + Sync>(
    stack: &S,
    namespace: &str,
    cluster: &str,
) -> anyhow::Result<(Option<String>, Option<String>)> {
    let secrets: Api<Secret> = Api::namespaced(stack.client().clone(), namespace);
    let mut names = (None, None);
    let token = match stack.host_auth() {
        HostAuth::None => return Ok(names),
        HostAuth::Token(t) | HostAuth::MtlsAndToken(t) => t.clone(),
    };
    let mut data = BTreeMap::new();
    for endpoint in endpoints(stack.hosts()) {
        let ep: capmvm_api::HostEndpoint = endpoint
            .parse()
            .map_err(|e| anyhow::anyhow!("{endpoint}: {e}"))?;
        data.insert(ep.secret_key(), ByteString(token.clone().into_bytes()));
    }
    let name = format!("{cluster}-flintlock-token");
    secrets
        .create(&PostParams::default(), &secret(&name, namespace, data))
        .await?;
    names.0 = Some(name);
    if let Some(pki) = stack.host_pki() {
        let material = pki.client_tls(true);
        let data = BTreeMap::from([
            (
                "ca.crt".to_string(),
                ByteString(material.ca_pem.clone().unwrap_or_default()),
            ),
            (
                "tls.crt".to_string(),
                ByteString(material.client_cert_pem.clone().unwrap_or_default()),
            ),
            (
                "tls.key".to_string(),
                ByteString(
                    material
                        .client_key_pem
                        .as_ref()
                        .map(|k| k.expose().to_vec())
                        .unwrap_or_default(),
                ),
            ),
        ]);
        let name = format!("{cluster}-flintlock-tls");
        secrets
            .create(&PostParams::default(), &secret(&name, namespace, data))
            .await?;
        names.1 = Some(name);
    }
    Ok(names)
}

/// Points the MicrovmClusters among `objects` at the credentials Secrets
/// `(basicAuthSecret, tlsSecretRef)` [`create_credentials`] made, as a user does.
pub fn use_credentials(
    objects: &mut [DynamicObject],
    (token, tls): &(Option<String>, Option<String>),
) {
    for o in objects.iter_mut() {
        if o.types.as_ref().is_some_and(|t| t.kind == "MicrovmCluster") {
            if let Some(token) = token {
                o.data["spec"]["placement"]["staticPool"]["basicAuthSecret"] = token.clone().into();
            }
            if let Some(tls) = tls {
                o.data["spec"]["tlsSecretRef"] = tls.clone().into();
            }
        }
    }
}

/// A credentials Secret, labelled so `clusterctl move` carries it (it is referenced by name only).
fn secret(name: &str, namespace: &str, data: BTreeMap<String, ByteString>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(
                capmvm_api::keys::CLUSTERCTL_MOVE_LABEL.to_string(),
                String::new(),
            )])),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    }
}
