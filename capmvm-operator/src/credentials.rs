//! How to reach each host of a MicrovmCluster: endpoint, basic-auth token, TLS material, proxy.
//!
//! The operator watches the *metadata* of Secrets (never their content, so no Secret data sits in a
//! cache), and reads a Secret's content with one GET per new resourceVersion: a corrected token or CA is
//! picked up as soon as the watch sees it, and Secret reads grow with changes, not with machines.
//! Problems are reported as text naming the Secret and key, never their content.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use capmvm_api::keys::{
    BOOTSTRAP_DATA_KEY, BOOTSTRAP_FORMAT_KEY, CAPI_SECRET_TYPE, TLS_CA_KEY, TLS_CERT_KEY,
    TLS_KEY_KEY,
};
use capmvm_api::{HostEndpoint, MicrovmCluster};
use capmvm_flintlock::{HostConfig, SecretBytes, SecretString, TlsMaterial};
use capmvm_reconcile::{BootstrapData, Sensitive};
use k8s_openapi::api::core::v1::Secret;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt};

type SecretKey = (String, String);

/// The connection config of each valid host endpoint of a MicrovmCluster's pool, by canonical
/// endpoint, or why it cannot be built.
pub type HostConfigs = BTreeMap<String, Result<HostConfig, String>>;

/// What a MicrovmCluster's host configs were built from: its spec (generation) and the versions of
/// the Secrets it names.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ConfigStamp {
    uid: Option<String>,
    generation: Option<i64>,
    basic_auth: Option<String>,
    tls: Option<String>,
}

/// Reads and caches the Secrets named by MicrovmClusters.
pub struct Credentials {
    client: kube::Client,
    /// The watched metadata of every Secret in scope but Cluster API's own: which exist, at which
    /// resourceVersion.
    index: Store<PartialObjectMeta<Secret>>,
    /// Content read per Secret, with the resourceVersion it was read at.
    cache: Mutex<HashMap<SecretKey, (String, Secret)>>,
    /// Host configs per MicrovmCluster (`namespace`, `name`), with what they were built from: every
    /// placement reads its whole pool's, and building them is O(hosts).
    configs: Mutex<HashMap<SecretKey, (ConfigStamp, Arc<HostConfigs>)>>,
}

impl Credentials {
    /// A reader using `client`, told of Secret changes by the metadata store `index`.
    pub fn new(client: kube::Client, index: Store<PartialObjectMeta<Secret>>) -> Self {
        Self {
            client,
            index,
            cache: Mutex::new(HashMap::new()),
            configs: Mutex::new(HashMap::new()),
        }
    }

    /// The connection config of every valid host endpoint of `mc`'s pool, or why it cannot be built;
    /// built again only when `mc`'s spec or a Secret it names changed.
    pub async fn host_configs(&self, mc: &MicrovmCluster) -> Result<Arc<HostConfigs>, kube::Error> {
        let ns = mc.namespace().unwrap_or_default();
        let key = (ns.clone(), mc.name_any());
        let version = |name: Option<&String>| {
            name.and_then(|n| self.index.get(&ObjectRef::new(n).within(&ns)))
                .and_then(|meta| meta.resource_version())
        };
        let stamp = ConfigStamp {
            uid: mc.uid(),
            generation: mc.metadata.generation,
            basic_auth: version(
                mc.spec
                    .placement
                    .static_pool
                    .as_ref()
                    .and_then(|p| p.basic_auth_secret.as_ref()),
            ),
            tls: version(mc.spec.tls_secret_ref.as_ref()),
        };
        if stamp.generation.is_some()
            && let Ok(configs) = self.configs.lock()
            && let Some((built_from, built)) = configs.get(&key)
            && *built_from == stamp
        {
            return Ok(built.clone());
        }
        let mut out = BTreeMap::new();
        if let Some(pool) = &mc.spec.placement.static_pool {
            for host in &pool.hosts {
                if let Ok(endpoint) = host.endpoint.parse::<HostEndpoint>() {
                    let config = self.host_config(mc, &endpoint).await?;
                    out.insert(endpoint.to_string(), config);
                }
            }
        }
        let built = Arc::new(out);
        if let Ok(mut configs) = self.configs.lock() {
            configs.insert(key, (stamp, built.clone()));
        }
        Ok(built)
    }

    /// The connection config for `endpoint` under `mc`'s credentials (the host need not be in the pool
    /// any more: a machine may still live on a removed host).
    pub async fn host_config(
        &self,
        mc: &MicrovmCluster,
        endpoint: &HostEndpoint,
    ) -> Result<Result<HostConfig, String>, kube::Error> {
        let ns = mc.namespace().unwrap_or_default();
        let mut config = HostConfig::new(endpoint.to_string());
        config.proxy = mc.spec.microvm_proxy.as_ref().map(|p| p.endpoint.clone());
        if let Some(name) = mc
            .spec
            .placement
            .static_pool
            .as_ref()
            .and_then(|p| p.basic_auth_secret.as_ref())
        {
            let Some(secret) = self.secret(&ns, name).await? else {
                return Ok(Err(self.unseen(&ns, name, "basic-auth").await?));
            };
            let key = endpoint.secret_key();
            let Some(token) = secret_value(&secret, &key) else {
                return Ok(Err(format!(
                    "basic-auth Secret {name:?} has no key {key:?}"
                )));
            };
            // Tokens written with `--from-file` often end in a newline that flintlock would not match.
            let token = String::from_utf8_lossy(&token)
                .trim_end_matches(['\r', '\n'])
                .to_string();
            config.basic_auth_token = Some(SecretString::new(token));
        }
        if let Some(name) = &mc.spec.tls_secret_ref {
            let Some(secret) = self.secret(&ns, name).await? else {
                return Ok(Err(self.unseen(&ns, name, "TLS").await?));
            };
            let Some(ca) = secret_value(&secret, TLS_CA_KEY) else {
                return Ok(Err(format!(
                    "TLS Secret {name:?} has no key {TLS_CA_KEY:?}"
                )));
            };
            let cert = secret_value(&secret, TLS_CERT_KEY);
            let key = secret_value(&secret, TLS_KEY_KEY);
            if cert.is_some() != key.is_some() {
                return Ok(Err(format!(
                    "TLS Secret {name:?} needs both {TLS_CERT_KEY:?} and {TLS_KEY_KEY:?} for a client certificate, or neither"
                )));
            }
            config.tls = Some(TlsMaterial {
                ca_pem: Some(ca),
                client_cert_pem: cert,
                client_key_pem: key.map(SecretBytes::new),
            });
        }
        Ok(Ok(config))
    }

    /// Why a credential Secret the watch has not shown cannot be used: it does not exist, or it has
    /// the type the watch leaves out. Read live, and only for a Secret the watch has not shown.
    async fn unseen(&self, namespace: &str, name: &str, what: &str) -> Result<String, kube::Error> {
        // The metadata does not carry the type: read the Secret, but only to look at its type.
        let secret = Api::<Secret>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await?;
        let Some(secret) = secret else {
            return Ok(format!("{what} Secret {name:?} not found"));
        };
        Ok(match secret.type_ {
            Some(t) if t == CAPI_SECRET_TYPE => format!(
                "{what} Secret {name:?} has type {CAPI_SECRET_TYPE}, which Cluster API keeps for the Secrets it writes and the operator does not watch; create the credential as type Opaque (kubectl create secret generic) or kubernetes.io/tls"
            ),
            // Created since the watch last spoke: its event wakes the clusters that name it.
            _ => format!("{what} Secret {name:?} not found yet"),
        })
    }

    /// Reads a Secret's content, reusing the last read while the watched resourceVersion is the same.
    /// `None` if the watch has not seen it (it does not exist, or was just created: its watch event
    /// wakes the clusters that name it).
    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>, kube::Error> {
        let key = (namespace.to_string(), name.to_string());
        let Some(meta) = self.index.get(&ObjectRef::new(name).within(namespace)) else {
            if let Ok(mut cache) = self.cache.lock() {
                cache.remove(&key);
            }
            return Ok(None);
        };
        let version = meta.resource_version().unwrap_or_default();
        if let Ok(cache) = self.cache.lock()
            && let Some((read_at, secret)) = cache.get(&key)
            && *read_at == version
        {
            return Ok(Some(secret.clone()));
        }
        let Some(secret) = Api::<Secret>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await?
        else {
            return Ok(None);
        };
        if let Ok(mut cache) = self.cache.lock() {
            let read_at = secret.resource_version().unwrap_or_default();
            cache.insert(key, (read_at, secret.clone()));
        }
        Ok(Some(secret))
    }
}

/// Reads a bootstrap data Secret (uncached: read once, while a microVM is created).
pub async fn bootstrap_data(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<BootstrapData, kube::Error> {
    let Some(secret) = Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?
    else {
        return Ok(BootstrapData::SecretNotFound);
    };
    Ok(BootstrapData::Found {
        value: secret_value(&secret, BOOTSTRAP_DATA_KEY).map(Sensitive::new),
        format: secret_value(&secret, BOOTSTRAP_FORMAT_KEY)
            .map(|f| String::from_utf8_lossy(&f).trim().to_string()),
    })
}

fn secret_value(secret: &Secret, key: &str) -> Option<Vec<u8>> {
    if let Some(v) = secret.data.as_ref().and_then(|d| d.get(key)) {
        return Some(v.0.clone());
    }
    secret
        .string_data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|s| s.as_bytes().to_vec())
}
