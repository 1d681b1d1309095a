//! Workload clusters on the real stack: one kube-apiserver per Cluster, on the management cluster's
//! etcd under a prefix of its own, listening on an address of its own (127.0.0.x:6443, so the
//! template's `CONTROL_PLANE_VIP` is all that differs from a real cluster). Its CA is the Cluster's:
//! `<cluster>-ca` is created before the Cluster, so Cluster API (CABPK's join configuration, the
//! ClusterCache's kubeconfig) trusts and reaches this server, and `<cluster>-kubeconfig` is written
//! from it as the control-plane provider writes it.
//!
//! Beside each workload API run a kube-scheduler and a kube-controller-manager, as on a kubeadm
//! control plane: Deployments become Pods, the scheduler binds them to Nodes, the node lifecycle
//! controller lifts the `not-ready` taint the API server puts on every new Node (and watches the
//! hollow kubelets' Leases), the ServiceAccount controller makes each namespace's `default`
//! account, and node IPAM gives each Node the pod CIDR its kubelet takes Pod IPs from.

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Mutex;

use anyhow::Context as _;
use base64::Engine as _;
use capmvm_api::keys::CLUSTER_NAME_LABEL;
use capmvm_upstream::pki::Ca;
use capmvm_upstream::{ApiServerOptions, ControlPlaneComponent, KubeApiServer};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;

use crate::capi::workload::{CLUSTER_SECRET_TYPE, ClusterKey, KUBECONFIG_KEY};

/// The port every workload API listens on, each on its own loopback address.
pub const WORKLOAD_PORT: u16 = 6443;

/// Loopback addresses taken by workload clusters of this process.
static TAKEN: Mutex<Option<HashSet<Ipv4Addr>>> = Mutex::new(None);

/// A loopback address (127.0.0.2 and up) whose port 6443 is free.
pub fn free_vip() -> anyhow::Result<Ipv4Addr> {
    let mut taken = TAKEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let taken = taken.get_or_insert_with(HashSet::new);
    for last in 2..=254u8 {
        let ip = Ipv4Addr::new(127, 0, 0, last);
        if taken.contains(&ip) {
            continue;
        }
        if std::net::TcpListener::bind((ip, WORKLOAD_PORT)).is_ok() {
            taken.insert(ip);
            return Ok(ip);
        }
    }
    anyhow::bail!("no loopback address 127.0.0.2-254 has port {WORKLOAD_PORT} free")
}

/// Gives a loopback address back.
pub fn release_vip(ip: Ipv4Addr) {
    if let Some(taken) = TAKEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .as_mut()
    {
        taken.remove(&ip);
    }
}

/// The pod network Nodes get their `podCIDR` from (kubeadm's usual Flannel/Calico range).
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";

/// A workload cluster's API, started before its Cluster exists, with its scheduler and
/// controller-manager.
pub struct WorkloadApi {
    /// The Cluster it serves.
    pub cluster: ClusterKey,
    /// Its address: the template's `CONTROL_PLANE_VIP`.
    pub vip: Ipv4Addr,
    /// The server.
    pub server: KubeApiServer,
    /// Its kube-scheduler.
    pub scheduler: ControlPlaneComponent,
    /// Its kube-controller-manager (every default controller, node IPAM on).
    pub controller_manager: ControlPlaneComponent,
}

impl WorkloadApi {
    /// The processes' ids: the API server, the scheduler, the controller-manager.
    pub fn pids(&self) -> Vec<u32> {
        [
            self.server.pid(),
            self.scheduler.pid(),
            self.controller_manager.pid(),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// Stops the scheduler, the controller-manager, then the API server.
    pub async fn stop(self) {
        self.scheduler.stop().await;
        self.controller_manager.stop().await;
        self.server.stop().await;
        release_vip(self.vip);
    }
}

/// Starts the scheduler and controller-manager of a workload API.
async fn control_plane(
    binaries: &capmvm_upstream::Binaries,
    server: &KubeApiServer,
    cluster: &ClusterKey,
) -> anyhow::Result<(ControlPlaneComponent, ControlPlaneComponent)> {
    let scheduler = ControlPlaneComponent::scheduler(binaries, server, &[])
        .await
        .with_context(|| format!("starting the kube-scheduler of {cluster}"))?;
    let controller_manager = ControlPlaneComponent::controller_manager(
        binaries,
        server,
        "*",
        &[
            format!("--cluster-name={}", cluster.name),
            "--allocate-node-cidrs=true".to_string(),
            format!("--cluster-cidr={CLUSTER_CIDR}"),
            "--node-cidr-mask-size=24".to_string(),
            "--service-cluster-ip-range=10.96.0.0/12".to_string(),
        ],
    )
    .await
    .with_context(|| format!("starting the kube-controller-manager of {cluster}"))?;
    Ok((scheduler, controller_manager))
}

/// Creates `<cluster>-ca` and starts the workload API on a free 127.0.0.x:6443, its certificates
/// signed by that CA; writes `<cluster>-kubeconfig` as the control-plane provider does.
pub async fn start(
    management: &kube::Client,
    binaries: &capmvm_upstream::Binaries,
    etcd_url: &str,
    dir: &std::path::Path,
    cluster: &ClusterKey,
) -> anyhow::Result<WorkloadApi> {
    ensure_namespace(management, &cluster.namespace).await?;
    let ca = Ca::generate("kubernetes")?;
    let ca_pem = ca.pem();
    let admin = ca.issue_client("kubernetes-admin", &["system:masters"])?;
    let secrets: Api<Secret> = Api::namespaced(management.clone(), &cluster.namespace);
    secrets
        .create(
            &PostParams::default(),
            &cluster_secret(
                cluster,
                &format!("{}-ca", cluster.name),
                BTreeMap::from([
                    ("tls.crt".to_string(), ca_pem.cert.clone()),
                    ("tls.key".to_string(), ca_pem.key.clone()),
                ]),
            ),
        )
        .await
        .with_context(|| format!("creating {}-ca", cluster.name))?;
    let vip = free_vip()?;
    let mut options = ApiServerOptions::new(
        &format!("workload-{}-{}", cluster.namespace, cluster.name),
        dir,
        etcd_url,
    );
    options.etcd_prefix = format!("/workload/{}/{}", cluster.namespace, cluster.name);
    options.bind = IpAddr::V4(vip);
    options.port = Some(WORKLOAD_PORT);
    options.ca = Some(ca);
    options.audit = false;
    let server = match KubeApiServer::start(binaries, options).await {
        Ok(s) => s,
        Err(e) => {
            release_vip(vip);
            return Err(e).context(format!("starting the workload API of {cluster}"));
        }
    };
    let (scheduler, controller_manager) = match control_plane(binaries, &server, cluster).await {
        Ok(c) => c,
        Err(e) => {
            server.stop().await;
            release_vip(vip);
            return Err(e);
        }
    };
    let kubeconfig = capi_kubeconfig(&cluster.name, server.url(), &ca_pem.cert, &admin);
    secrets
        .create(
            &PostParams::default(),
            &cluster_secret(
                cluster,
                &format!("{}-kubeconfig", cluster.name),
                BTreeMap::from([(KUBECONFIG_KEY.to_string(), kubeconfig)]),
            ),
        )
        .await
        .with_context(|| format!("creating {}-kubeconfig", cluster.name))?;
    Ok(WorkloadApi {
        cluster: cluster.clone(),
        vip,
        server,
        scheduler,
        controller_manager,
    })
}

/// The kubeconfig CAPI writes for a Cluster: cluster `<name>`, user `<name>-admin` with a client
/// certificate of the Cluster's CA, context `<name>-admin@<name>`.
pub fn capi_kubeconfig(
    name: &str,
    server: &str,
    ca_pem: &str,
    admin: &capmvm_upstream::pki::KeyPairPem,
) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\ncontexts:\n- name: {name}-admin@{name}\n  context:\n    cluster: {name}\n    user: {name}-admin\ncurrent-context: {name}-admin@{name}\nusers:\n- name: {name}-admin\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\npreferences: {{}}\n",
        ca = b64(ca_pem),
        cert = b64(&admin.cert),
        key = b64(&admin.key),
    )
}

fn cluster_secret(cluster: &ClusterKey, name: &str, data: BTreeMap<String, String>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(cluster.namespace.clone()),
            labels: Some(BTreeMap::from([(
                CLUSTER_NAME_LABEL.to_string(),
                cluster.name.clone(),
            )])),
            ..Default::default()
        },
        type_: Some(CLUSTER_SECRET_TYPE.to_string()),
        data: Some(
            data.into_iter()
                .map(|(k, v)| (k, ByteString(v.into_bytes())))
                .collect(),
        ),
        ..Default::default()
    }
}

/// Creates `namespace` unless it exists.
pub async fn ensure_namespace(client: &kube::Client, namespace: &str) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt(namespace).await?.is_some() {
        return Ok(());
    }
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(namespace.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    match namespaces.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
