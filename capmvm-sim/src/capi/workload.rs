//! Workload clusters: one API emulator per CAPI Cluster (its own port), served from the moment the
//! Cluster controller first sees the Cluster until its deletion completes, with the
//! `<cluster>-kubeconfig` Secret written as CAPI writes it (key `value`, type `cluster.x-k8s.io/secret`,
//! label `cluster.x-k8s.io/cluster-name`, owned by the Cluster).
//!
//! Each workload cluster keeps a watch cache of its Nodes: the Machine controller matches Nodes by
//! providerID from it, the MachineHealthCheck reads their conditions from it, and a Node change wakes
//! the Machine waiting for that providerID.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use capmvm_api::capi::{Cluster, Machine};
use capmvm_api::keys::CLUSTER_NAME_LABEL;
use futures::StreamExt as _;
use futures::channel::mpsc;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::PostParams;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Resource as _, ResourceExt as _};
use tokio::task::JoinHandle;

use crate::kube::{Emulator, EmulatorHandle, EmulatorOptions};

/// The type CAPI gives its cluster Secrets.
pub const CLUSTER_SECRET_TYPE: &str = "cluster.x-k8s.io/secret";
/// The key of the kubeconfig in the `<cluster>-kubeconfig` Secret.
pub const KUBECONFIG_KEY: &str = "value";

/// Why a workload cluster could not be served.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// Its API emulator did not start.
    #[error("starting the workload API of Cluster {cluster}: {source}")]
    Emulator {
        /// `namespace/name` of the Cluster.
        cluster: String,
        /// What failed.
        source: crate::kube::Error,
    },
    /// Its kubeconfig file could not be written.
    #[error("writing the workload kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The management API refused the kubeconfig Secret.
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

/// `namespace/name` of a Cluster.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClusterKey {
    /// The Cluster's namespace.
    pub namespace: String,
    /// The Cluster's name.
    pub name: String,
}

impl ClusterKey {
    /// The key of `namespace/name`.
    pub fn new(namespace: &str, name: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }
}

impl std::fmt::Display for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What serves a workload cluster's API.
enum WorkloadServer {
    /// An API emulator in this process.
    Emulated(EmulatorHandle),
    /// A server run by someone else (the real-stack harness's kube-apiserver): stopping the
    /// workload cluster only forgets it.
    External {
        /// Its URL.
        url: String,
    },
}

impl WorkloadServer {
    fn url(&self) -> String {
        match self {
            WorkloadServer::Emulated(e) => e.base_url(),
            WorkloadServer::External { url } => url.clone(),
        }
    }
}

/// One running workload cluster.
struct Workload {
    server: WorkloadServer,
    /// The kubeconfig of its API (the `<cluster>-kubeconfig` Secret's `value`).
    kubeconfig: String,
    client: kube::Client,
    kubeconfig_path: PathBuf,
    nodes: Store<Node>,
    /// The names of the Nodes by `spec.providerID`, kept by the watch beside `nodes`, so a Machine
    /// finds its Node without scanning every Node (a hint: the answer is checked against `nodes`).
    node_names: NodeNames,
    watch: JoinHandle<()>,
    /// Distinguishes a Cluster re-created under the same name.
    serial: u64,
}

/// Node names by providerID.
type NodeNames = Arc<Mutex<HashMap<String, String>>>;

#[derive(Default)]
struct Registry {
    clusters: HashMap<ClusterKey, Workload>,
    next_serial: u64,
    /// Machines waiting for a Node with this providerID (the Machine controller's wake-ups).
    waiting: HashMap<String, ObjectRef<Machine>>,
}

/// The workload clusters of a management cluster (cheap to clone; all clones share them).
#[derive(Clone)]
pub struct WorkloadClusters {
    dir: PathBuf,
    registry: Arc<Mutex<Registry>>,
    wake_tx: mpsc::UnboundedSender<ObjectRef<Machine>>,
    wake_rx: Arc<Mutex<Option<mpsc::UnboundedReceiver<ObjectRef<Machine>>>>>,
}

impl std::fmt::Debug for WorkloadClusters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkloadClusters")
            .field("dir", &self.dir)
            .field("clusters", &self.clusters())
            .finish()
    }
}

impl WorkloadClusters {
    /// Workload clusters whose kubeconfig files go to `dir` (created when needed).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        let (wake_tx, wake_rx) = mpsc::unbounded();
        Self {
            dir: dir.into(),
            registry: Arc::default(),
            wake_tx,
            wake_rx: Arc::new(Mutex::new(Some(wake_rx))),
        }
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        // A panic while holding the lock leaves plain maps behind: still usable.
        self.registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The Clusters served now.
    pub fn clusters(&self) -> Vec<ClusterKey> {
        let mut keys: Vec<ClusterKey> = self.registry().clusters.keys().cloned().collect();
        keys.sort();
        keys
    }

    /// A client of the workload API of `cluster`, while it is served.
    pub fn client(&self, cluster: &ClusterKey) -> Option<kube::Client> {
        self.registry()
            .clusters
            .get(cluster)
            .map(|w| w.client.clone())
    }

    /// A client and the serial of the workload API of `cluster` (a re-created Cluster gets a new one).
    pub(crate) fn client_and_serial(&self, cluster: &ClusterKey) -> Option<(kube::Client, u64)> {
        self.registry()
            .clusters
            .get(cluster)
            .map(|w| (w.client.clone(), w.serial))
    }

    /// Where the kubeconfig of `cluster`'s workload API is written, while it is served (the same
    /// document as the `<cluster>-kubeconfig` Secret's `value`).
    pub fn kubeconfig_path(&self, cluster: &ClusterKey) -> Option<PathBuf> {
        self.registry()
            .clusters
            .get(cluster)
            .map(|w| w.kubeconfig_path.clone())
    }

    /// The base URL of `cluster`'s workload API, while it is served.
    pub fn url(&self, cluster: &ClusterKey) -> Option<String> {
        self.registry()
            .clusters
            .get(cluster)
            .map(|w| w.server.url())
    }

    /// The Nodes of `cluster` as its watch cache holds them (empty when it is not served).
    pub fn nodes(&self, cluster: &ClusterKey) -> Vec<Arc<Node>> {
        self.registry()
            .clusters
            .get(cluster)
            .map(|w| w.nodes.state())
            .unwrap_or_default()
    }

    /// The Node of `cluster` whose `spec.providerID` is exactly `provider_id`.
    pub fn node_by_provider_id(
        &self,
        cluster: &ClusterKey,
        provider_id: &str,
    ) -> Option<Arc<Node>> {
        let registry = self.registry();
        let w = registry.clusters.get(cluster)?;
        let name = lock(&w.node_names).get(provider_id).cloned()?;
        // The index may name a Node that has since gone or changed its providerID.
        w.nodes
            .get(&ObjectRef::new(&name))
            .filter(|n| provider_id_of(n) == Some(provider_id))
    }

    /// Wakes `machine` when a Node with `provider_id` appears or changes.
    pub(crate) fn wake_on_node(&self, provider_id: &str, machine: ObjectRef<Machine>) {
        self.registry()
            .waiting
            .insert(provider_id.to_string(), machine);
    }

    /// Stops waking anything for `provider_id`.
    pub(crate) fn forget_provider_id(&self, provider_id: &str) {
        self.registry().waiting.remove(provider_id);
    }

    /// The Machine wake-ups (Node changes of a providerID a Machine waits for). Only the first
    /// caller gets them; later ones get an empty stream.
    pub(crate) fn machine_wakeups(
        &self,
    ) -> impl futures::Stream<Item = ObjectRef<Machine>> + Send + use<> {
        let rx = self
            .wake_rx
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        match rx {
            Some(rx) => rx.left_stream(),
            None => futures::stream::empty().right_stream(),
        }
    }

    /// Serves `cluster`'s workload API if it is not served yet, and writes its kubeconfig Secret in
    /// the management cluster `management` (kept as it is when it exists).
    pub async fn ensure(
        &self,
        management: &kube::Client,
        cluster: &Cluster,
    ) -> Result<(), WorkloadError> {
        let key = ClusterKey::new(
            &cluster.namespace().unwrap_or_default(),
            &cluster.name_any(),
        );
        let kubeconfig = match self.kubeconfig_of(&key) {
            Some(k) => k,
            None => self.start(&key).await?,
        };
        let secrets: Api<Secret> = Api::namespaced(management.clone(), &key.namespace);
        let name = format!("{}-kubeconfig", key.name);
        if secrets.get_metadata_opt(&name).await?.is_some() {
            return Ok(());
        }
        let secret = kubeconfig_secret(cluster, &name, &kubeconfig);
        match secrets.create(&PostParams::default(), &secret).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn kubeconfig_of(&self, key: &ClusterKey) -> Option<String> {
        let registry = self.registry();
        registry.clusters.get(key).map(|w| w.kubeconfig.clone())
    }

    async fn start(&self, key: &ClusterKey) -> Result<String, WorkloadError> {
        let emulator = Emulator::start(EmulatorOptions::default())
            .await
            .map_err(|source| WorkloadError::Emulator {
                cluster: key.to_string(),
                source,
            })?;
        // The stand-in and the hollow kubelets share the emulator's process: no socket between them.
        let client = emulator.in_process_client();
        let kubeconfig = capi_kubeconfig(&key.name, &emulator.base_url());
        self.insert(key, WorkloadServer::Emulated(emulator), client, kubeconfig)
    }

    /// Serves `cluster`'s workload cluster from an API server run elsewhere (the real-stack
    /// harness's kube-apiserver at `url`), reached with `client` and `kubeconfig`: the hollow
    /// kubelets register their Nodes there. Nothing else of the stand-in runs for it.
    pub fn register_external(
        &self,
        cluster: &ClusterKey,
        url: &str,
        client: kube::Client,
        kubeconfig: String,
    ) -> Result<(), WorkloadError> {
        self.insert(
            cluster,
            WorkloadServer::External {
                url: url.to_string(),
            },
            client,
            kubeconfig,
        )
        .map(|_| ())
    }

    fn insert(
        &self,
        key: &ClusterKey,
        server: WorkloadServer,
        client: kube::Client,
        kubeconfig: String,
    ) -> Result<String, WorkloadError> {
        let kubeconfig_path = write_kubeconfig(&self.dir, key, &kubeconfig)?;
        let (nodes, writer) = reflector::store();
        let node_names = NodeNames::default();
        let stream = reflector::reflector(
            writer,
            watcher(Api::<Node>::all(client.clone()), watcher::Config::default()),
        )
        .default_backoff();
        let this = self.clone();
        let names = node_names.clone();
        let watch = tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)) => {
                        if let Some(pid) = provider_id_of(&node) {
                            lock(&names).insert(pid.to_string(), node.name_any());
                        }
                        this.node_changed(&node);
                    }
                    Ok(watcher::Event::Delete(node)) => {
                        if let Some(pid) = provider_id_of(&node) {
                            let mut names = lock(&names);
                            if names.get(pid) == Some(&node.name_any()) {
                                names.remove(pid);
                            }
                        }
                        this.node_changed(&node);
                    }
                    Ok(watcher::Event::Init | watcher::Event::InitDone) | Err(_) => {}
                }
            }
        });
        tracing::info!(cluster = %key, url = %server.url(), "workload cluster API serving");
        let mut registry = self.registry();
        registry.next_serial += 1;
        let serial = registry.next_serial;
        // Another reconcile may have started one meanwhile: keep the first, drop ours.
        if let Some(existing) = registry.clusters.get(key) {
            watch.abort();
            return Ok(existing.kubeconfig.clone());
        }
        registry.clusters.insert(
            key.clone(),
            Workload {
                server,
                kubeconfig: kubeconfig.clone(),
                client,
                kubeconfig_path,
                nodes,
                node_names,
                watch,
                serial,
            },
        );
        Ok(kubeconfig)
    }

    fn node_changed(&self, node: &Node) {
        let Some(pid) = provider_id_of(node) else {
            return;
        };
        let machine = self.registry().waiting.get(pid).cloned();
        if let Some(machine) = machine {
            let _ = self.wake_tx.unbounded_send(machine);
        }
    }

    /// Stops serving `cluster`'s workload API (its Nodes go with it).
    pub async fn stop(&self, cluster: &ClusterKey) {
        let removed = self.registry().clusters.remove(cluster);
        if let Some(w) = removed {
            w.watch.abort();
            let _ = std::fs::remove_file(&w.kubeconfig_path);
            if let WorkloadServer::Emulated(emulator) = w.server {
                emulator.shutdown().await;
            }
            tracing::info!(%cluster, "workload cluster API stopped");
        }
    }

    /// Stops every workload API.
    pub async fn stop_all(&self) {
        for cluster in self.clusters() {
            self.stop(&cluster).await;
        }
    }
}

fn provider_id_of(node: &Node) -> Option<&str> {
    node.spec.as_ref()?.provider_id.as_deref()
}

/// A plain map behind a lock a panic may have poisoned: still usable.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A kubeconfig as CAPI writes it for a Cluster: cluster `<name>`, user `<name>-admin`, context
/// `<name>-admin@<name>`. The emulator serves plain HTTP without authentication, so the user has
/// no credentials (CAPI's carries a client certificate).
pub fn capi_kubeconfig(cluster: &str, server: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {cluster}\n  cluster:\n    server: {server}\ncontexts:\n- name: {cluster}-admin@{cluster}\n  context:\n    cluster: {cluster}\n    user: {cluster}-admin\ncurrent-context: {cluster}-admin@{cluster}\nusers:\n- name: {cluster}-admin\n  user: {{}}\npreferences: {{}}\n"
    )
}

fn write_kubeconfig(
    dir: &Path,
    key: &ClusterKey,
    kubeconfig: &str,
) -> Result<PathBuf, WorkloadError> {
    let path = dir.join(format!("{}-{}.kubeconfig", key.namespace, key.name));
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&path, kubeconfig))
        .map_err(|source| WorkloadError::Kubeconfig {
            path: path.clone(),
            source,
        })?;
    Ok(path)
}

/// The `<cluster>-kubeconfig` Secret as CAPI writes it.
fn kubeconfig_secret(cluster: &Cluster, name: &str, kubeconfig: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: cluster.namespace(),
            labels: Some(BTreeMap::from([(
                CLUSTER_NAME_LABEL.to_string(),
                cluster.name_any(),
            )])),
            owner_references: Some(vec![OwnerReference {
                api_version: Cluster::api_version(&()).to_string(),
                kind: Cluster::kind(&()).to_string(),
                name: cluster.name_any(),
                uid: cluster.uid().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..Default::default()
        },
        type_: Some(CLUSTER_SECRET_TYPE.to_string()),
        data: Some(BTreeMap::from([(
            KUBECONFIG_KEY.to_string(),
            ByteString(kubeconfig.as_bytes().to_vec()),
        )])),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use kube::api::{DeleteParams, Patch, PatchParams};

    fn node(name: &str, provider_id: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::core::v1::NodeSpec {
                provider_id: Some(provider_id.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The name of the Node `node_by_provider_id` finds, once the watch has caught up with `want`.
    async fn found(
        w: &WorkloadClusters,
        key: &ClusterKey,
        pid: &str,
        want: Option<&str>,
    ) -> Option<String> {
        let mut got = None;
        for _ in 0..100 {
            got = w.node_by_provider_id(key, pid).map(|n| n.name_any());
            if got.as_deref() == want {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        got
    }

    #[tokio::test]
    async fn a_node_is_found_by_its_current_provider_id_only() {
        let dir = std::env::temp_dir().join(format!("capmvm-workload-test-{}", std::process::id()));
        let w = WorkloadClusters::new(&dir);
        let key = ClusterKey::new("default", "c1");
        w.start(&key).await.unwrap();
        let nodes: Api<Node> = Api::all(w.client(&key).unwrap());
        nodes
            .create(&PostParams::default(), &node("a", "microvm://h/1"))
            .await
            .unwrap();
        assert_eq!(
            found(&w, &key, "microvm://h/1", Some("a")).await.as_deref(),
            Some("a")
        );
        // A Node whose providerID changes is found by the new one, no longer by the old one.
        nodes
            .patch(
                "a",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"providerID": "microvm://h/2"}})),
            )
            .await
            .unwrap();
        assert_eq!(
            found(&w, &key, "microvm://h/2", Some("a")).await.as_deref(),
            Some("a")
        );
        assert_eq!(found(&w, &key, "microvm://h/1", None).await, None);
        // Another Node takes the old providerID; then it is deleted.
        nodes
            .create(&PostParams::default(), &node("b", "microvm://h/1"))
            .await
            .unwrap();
        assert_eq!(
            found(&w, &key, "microvm://h/1", Some("b")).await.as_deref(),
            Some("b")
        );
        nodes.delete("b", &DeleteParams::default()).await.unwrap();
        assert_eq!(found(&w, &key, "microvm://h/1", None).await, None);
        assert_eq!(
            found(&w, &key, "microvm://h/2", Some("a")).await.as_deref(),
            Some("a")
        );
        assert_eq!(found(&w, &key, "microvm://h/3", None).await, None);
        w.stop_all().await;
        let _ = std::fs::remove_dir_all(&dir);
    }
}
