//! Workload clusters on the real stack: one kube-apiserver per Cluster, on the management cluster's
//! etcd under a prefix of its own, listening on an address of its own (127.0.0.x:6443, so the
//! template's `CONTROL_PLANE_VIP` is all that differs from a real cluster). Its CA is the Cluster's:
//! `<cluster>-ca` is created before the Cluster, so Cluster API (CABPK's join configuration, the
//! ClusterCache's kubeconfig) trusts and reaches this server, and `<cluster>-kubeconfig` is written
//! from it as the control-plane provider writes it.

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Mutex;

use anyhow::Context as _;
use base64::Engine as _;
use capmvm_api::keys::CLUSTER_NAME_LABEL;
use capmvm_upstream::pki::Ca;
use capmvm_upstream::{ApiServerOptions, KubeApiServer};
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

/// A workload cluster's API, started before its Cluster exists.
pub struct WorkloadApi {
    /// The Cluster it serves.
    pub cluster: ClusterKey,
    /// Its address: the template's `CONTROL_PLANE_VIP`.
    pub vip: Ipv4Addr,
    /// The server.
    pub server: KubeApiServer,
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
