//! The bootstrap provider's role (CABPK): for each KubeadmConfig owned by a Machine or a MachinePool,
//! render a cloud-config into the bootstrap Secret (`value`, `format: cloud-config`, named as the
//! config) and report it in `status.dataSecretName`; the Machine (MachinePool) controller copies that
//! to the Machine's `spec.bootstrap.dataSecretName` (the pool's `spec.template.spec.bootstrap`). A
//! MachinePool's config is rendered again with a new join token every
//! `StandInOptions::bootstrap_token_rotation`, rewriting the same Secret, as CABPK refreshes pool
//! tokens.
//!
//! One difference from CABPK, on purpose: a join configuration is rendered as soon as the Cluster has
//! its control-plane endpoint, without waiting for the control plane to be initialized (hollow
//! machines never run kubeadm; waiting would serialize workers behind the control plane and leave
//! worker-only test clusters without bootstrap data).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use capmvm_api::capi::Cluster;
use capmvm_api::keys::{BOOTSTRAP_DATA_KEY, BOOTSTRAP_FORMAT_KEY, CLUSTER_NAME_LABEL};
use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PostParams};
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use tracing::{debug, warn};

use super::controllers::{Ctx, Error, params};

/// The bootstrap provider's API group.
pub const BOOTSTRAP_GROUP: &str = "bootstrap.cluster.x-k8s.io";

/// `KubeadmConfig` (v1beta2), as a dynamic resource.
pub fn kubeadm_config_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(BOOTSTRAP_GROUP, "v1beta2", "KubeadmConfig"),
        "kubeadmconfigs",
    )
}

/// `KubeadmConfigTemplate` (v1beta2), as a dynamic resource.
pub fn kubeadm_config_template_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(BOOTSTRAP_GROUP, "v1beta2", "KubeadmConfigTemplate"),
        "kubeadmconfigtemplates",
    )
}

/// What kubeadm does on the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `kubeadm init`: the first control-plane machine.
    Init,
    /// `kubeadm join`: every other machine.
    Join,
}

/// Where the rendered kubeadm configuration is written on the machine (as CABPK writes it).
pub const KUBEADM_CONFIG_PATH: &str = "/run/kubeadm/kubeadm.yaml";

/// Renders a KubeadmConfig `spec` into CABPK's cloud-config: `## template: jinja` (cloud-init renders
/// `{{ ds.meta_data.* }}` on the machine), write_files (the kubeadm configuration, then `files`),
/// runcmd (preKubeadmCommands, kubeadm init/join, postKubeadmCommands) and users.
/// `endpoint` is the Cluster's control-plane endpoint (`host:port`); `token` the bootstrap token.
pub fn render_cloud_config(
    spec: &Value,
    role: Role,
    endpoint: &str,
    version: Option<&str>,
    token: &str,
) -> Result<String, String> {
    let node_registration = |key: &str| {
        let mut nr = spec
            .pointer(&format!("/{key}/nodeRegistration"))
            .cloned()
            .unwrap_or_else(|| json!({}));
        // kubeadm v1beta4 writes kubeletExtraArgs as CAPI v1beta2 does: a list of {name, value}.
        if let Some(args) = nr.get("kubeletExtraArgs")
            && !args.is_array()
        {
            nr["kubeletExtraArgs"] = json!([]);
        }
        nr
    };
    let mut documents = Vec::new();
    match role {
        Role::Init => {
            let mut init = spec
                .get("initConfiguration")
                .cloned()
                .unwrap_or_else(|| json!({}));
            init["apiVersion"] = json!("kubeadm.k8s.io/v1beta4");
            init["kind"] = json!("InitConfiguration");
            init["nodeRegistration"] = node_registration("initConfiguration");
            documents.push(init);
            let mut cluster = spec
                .get("clusterConfiguration")
                .cloned()
                .unwrap_or_else(|| json!({}));
            cluster["apiVersion"] = json!("kubeadm.k8s.io/v1beta4");
            cluster["kind"] = json!("ClusterConfiguration");
            cluster["controlPlaneEndpoint"] = json!(endpoint);
            if let Some(v) = version {
                cluster["kubernetesVersion"] = json!(v);
            }
            documents.push(cluster);
        }
        Role::Join => {
            let mut join = spec
                .get("joinConfiguration")
                .cloned()
                .unwrap_or_else(|| json!({}));
            join["apiVersion"] = json!("kubeadm.k8s.io/v1beta4");
            join["kind"] = json!("JoinConfiguration");
            join["nodeRegistration"] = node_registration("joinConfiguration");
            join["discovery"]["bootstrapToken"]["apiServerEndpoint"] = json!(endpoint);
            join["discovery"]["bootstrapToken"]["token"] = json!(token);
            documents.push(join);
        }
    }
    let kubeadm_yaml = serde_saphyr::to_string_multiple(&documents)
        .map_err(|e| format!("rendering the kubeadm configuration: {e}"))?;

    let mut write_files = vec![json!({
        "path": KUBEADM_CONFIG_PATH,
        "owner": "root:root",
        "permissions": "0640",
        "content": kubeadm_yaml,
    })];
    for file in spec
        .get("files")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(path) = file.get("path").and_then(Value::as_str) else {
            return Err("spec.files[]: path is required".into());
        };
        let mut entry = json!({"path": path, "content": file.get("content").and_then(Value::as_str).unwrap_or("")});
        for (from, to) in [
            ("owner", "owner"),
            ("permissions", "permissions"),
            ("encoding", "encoding"),
            ("append", "append"),
        ] {
            if let Some(v) = file.get(from) {
                entry[to] = v.clone();
            }
        }
        write_files.push(entry);
    }
    let commands = |key: &str| -> Vec<Value> {
        spec.get(key)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let kubeadm = match role {
        Role::Init => format!("kubeadm init --config {KUBEADM_CONFIG_PATH}"),
        Role::Join => format!("kubeadm join --config {KUBEADM_CONFIG_PATH}"),
    };
    let mut runcmd = commands("preKubeadmCommands");
    runcmd.push(json!(format!(
        "{kubeadm} && mkdir -p /run/cluster-api && echo success > /run/cluster-api/bootstrap-success.complete"
    )));
    runcmd.extend(commands("postKubeadmCommands"));
    let mut cloud_config = json!({"write_files": write_files, "runcmd": runcmd});
    let users: Vec<Value> = spec
        .get("users")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|u| {
            let mut user = json!({"name": u.get("name").cloned().unwrap_or(Value::Null)});
            if let Some(keys) = u.get("sshAuthorizedKeys") {
                user["ssh_authorized_keys"] = keys.clone();
            }
            for (from, to) in [
                ("sudo", "sudo"),
                ("shell", "shell"),
                ("groups", "groups"),
                ("lockPassword", "lock_passwd"),
                ("homeDir", "homedir"),
                ("primaryGroup", "primary_group"),
                ("gecos", "gecos"),
            ] {
                if let Some(v) = u.get(from) {
                    user[to] = v.clone();
                }
            }
            user
        })
        .collect();
    if !users.is_empty() {
        cloud_config["users"] = Value::Array(users);
    }
    let body = serde_saphyr::to_string(&cloud_config)
        .map_err(|e| format!("rendering the cloud-config: {e}"))?;
    Ok(format!("## template: jinja\n#cloud-config\n{body}"))
}

/// A bootstrap token in kubeadm's form (`[a-z0-9]{6}.[a-z0-9]{16}`).
fn bootstrap_token() -> String {
    let id = super::clone::suffix_of(6);
    let secret = super::clone::suffix_of(16);
    format!("{id}.{secret}")
}

/// Starts the KubeadmConfig controller.
pub(crate) fn run(ctx: Arc<Ctx>) -> impl std::future::Future<Output = ()> {
    Controller::for_shared_stream_with(
        ctx.caches.kubeadm_configs.subscribe(),
        ctx.caches.kubeadm_configs.store(),
        kubeadm_config_resource(),
    )
    .run(
        |obj, ctx| super::retry::forgetting_failures(obj, ctx, reconcile),
        super::retry::error_policy,
        ctx,
    )
    .for_each(|_| async {})
}

async fn reconcile(config: Arc<DynamicObject>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    if config.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = config.namespace().unwrap_or_default();
    let name = config.name_any();
    // CABPK renders only for a config a Machine or a MachinePool owns.
    let Some(owner) = config
        .owner_references()
        .iter()
        .find(|o| o.kind == "Machine" || o.kind == "MachinePool")
        .cloned()
    else {
        return Ok(Action::await_change());
    };
    let rendered = config
        .data
        .pointer("/status/dataSecretName")
        .is_some_and(Value::is_string);
    // A MachinePool's config is rendered again with a new join token on an interval (CABPK
    // refreshes the token of pool configs before it expires and rewrites the Secret).
    let rotation = (owner.kind == "MachinePool")
        .then_some(ctx.options.bootstrap_token_rotation)
        .flatten();
    let uid = config.uid().unwrap_or_default();
    if rendered {
        let Some(every) = rotation else {
            return Ok(Action::await_change());
        };
        let last = *ctx
            .token_rendered_at
            .lock()
            .map_err(|_| Error::Poisoned)?
            .entry(uid.clone())
            .or_insert_with(Instant::now);
        let age = last.elapsed();
        if age < every {
            return Ok(Action::requeue(every - age));
        }
    }
    let Some(cluster_name) = config.labels().get(CLUSTER_NAME_LABEL).cloned() else {
        warn!(config = %name, "KubeadmConfig has no {CLUSTER_NAME_LABEL} label; waiting");
        return Ok(Action::await_change());
    };
    // From the cache, as CABPK reads it; live when the cache has not seen a new Cluster yet.
    let cluster = match ctx.caches.clusters.get(&ns, &cluster_name).await {
        Some(cluster) => cluster,
        None => match Api::<Cluster>::namespaced(ctx.client.clone(), &ns)
            .get_opt(&cluster_name)
            .await?
        {
            Some(cluster) => Arc::new(cluster),
            None => return Ok(Action::requeue(Duration::from_secs(2))),
        },
    };
    let Some(endpoint) = cluster
        .spec
        .control_plane_endpoint
        .as_ref()
        .filter(|e| e.is_complete())
        .map(|e| {
            format!(
                "{}:{}",
                e.host.clone().unwrap_or_default(),
                e.port.unwrap_or(6443)
            )
        })
    else {
        // Infrastructure not provisioned yet.
        return Ok(Action::requeue(Duration::from_secs(1)));
    };
    let spec = config
        .data
        .get("spec")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let role = if spec.get("joinConfiguration").is_some() || spec.get("initConfiguration").is_none()
    {
        Role::Join
    } else {
        Role::Init
    };
    let version = owner_version(&ctx, &ns, &owner).await?;
    let user_data = match render_cloud_config(
        &spec,
        role,
        &endpoint,
        version.as_deref(),
        &bootstrap_token(),
    ) {
        Ok(text) => text,
        Err(message) => {
            warn!(config = %name, %message, "KubeadmConfig cannot be rendered");
            return Ok(Action::await_change());
        }
    };
    let data = BTreeMap::from([
        (
            BOOTSTRAP_DATA_KEY.to_string(),
            ByteString(user_data.into_bytes()),
        ),
        (
            BOOTSTRAP_FORMAT_KEY.to_string(),
            ByteString(b"cloud-config".to_vec()),
        ),
    ]);
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), &ns);
    if rendered {
        // The rotation: same Secret, new token (its value never reaches a log).
        let body = json!({"data": data});
        secrets
            .patch(&name, &params(), &Patch::Merge(&body))
            .await?;
        debug!(config = %name, "rotated the MachinePool's join token and rewrote its bootstrap Secret");
    } else {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(ns.clone()),
                labels: Some(BTreeMap::from([(
                    CLUSTER_NAME_LABEL.to_string(),
                    cluster_name,
                )])),
                owner_references: Some(vec![OwnerReference {
                    api_version: format!("{BOOTSTRAP_GROUP}/v1beta2"),
                    kind: "KubeadmConfig".into(),
                    name: name.clone(),
                    uid: uid.clone(),
                    controller: Some(true),
                    block_owner_deletion: None,
                }]),
                ..Default::default()
            },
            type_: Some("cluster.x-k8s.io/secret".to_string()),
            data: Some(data),
            ..Default::default()
        };
        match secrets.create(&PostParams::default(), &secret).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &ns, &kubeadm_config_resource())
            .patch_status(
                &name,
                &params(),
                &Patch::Merge(&json!({"status": {
                    "dataSecretName": name,
                    "initialization": {"dataSecretCreated": true},
                }})),
            )
            .await?;
    }
    match rotation {
        Some(every) => {
            if let Ok(mut at) = ctx.token_rendered_at.lock() {
                at.insert(uid, Instant::now());
            }
            Ok(Action::requeue(every))
        }
        None => Ok(Action::await_change()),
    }
}

/// The Kubernetes version of a config's owner: a Machine's `spec.version`, a MachinePool's
/// `spec.template.spec.version`.
async fn owner_version(
    ctx: &Ctx,
    ns: &str,
    owner: &OwnerReference,
) -> Result<Option<String>, Error> {
    if owner.kind == "Machine"
        && let Some(machine) = ctx.caches.machines.get(ns, &owner.name).await
    {
        return Ok(machine.spec.version.clone());
    }
    let (resource, pointer) = if owner.kind == "MachinePool" {
        (
            super::machinepool::machine_pool_resource(),
            "/spec/template/spec/version",
        )
    } else {
        (
            ApiResource::erase::<capmvm_api::capi::Machine>(&()),
            "/spec/version",
        )
    };
    let owners = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), ns, &resource);
    Ok(owners.get_opt(&owner.name).await?.and_then(|o| {
        o.data
            .pointer(pointer)
            .and_then(Value::as_str)
            .map(String::from)
    }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const PROVIDER_ID: &str = "microvm://{{ ds.meta_data.vm_host }}/{{ ds.meta_data.instance_id }}";

    #[test]
    fn a_join_config_renders_cabpk_cloud_config_with_the_provider_id_template_unchanged() {
        let spec = json!({
            "files": [{"path": "/etc/motd", "content": "hello", "owner": "root:root", "permissions": "0644"}],
            "preKubeadmCommands": ["echo pre"],
            "postKubeadmCommands": ["echo post"],
            "users": [{"name": "ubuntu", "sudo": "ALL=(ALL) NOPASSWD:ALL", "sshAuthorizedKeys": ["ssh-ed25519 AAAA x"]}],
            "joinConfiguration": {"nodeRegistration": {"kubeletExtraArgs": [{"name": "provider-id", "value": PROVIDER_ID}]}},
        });
        let text = render_cloud_config(
            &spec,
            Role::Join,
            "10.0.0.1:6443",
            None,
            "abcdef.0123456789abcdef",
        )
        .unwrap();
        assert!(
            text.starts_with("## template: jinja\n#cloud-config\n"),
            "{text}"
        );
        let doc: Value = serde_saphyr::from_str(&text).unwrap();
        let runcmd: Vec<&str> = doc["runcmd"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap())
            .collect();
        assert_eq!(runcmd[0], "echo pre");
        assert!(runcmd[1].starts_with("kubeadm join --config /run/kubeadm/kubeadm.yaml"));
        assert_eq!(runcmd[2], "echo post");
        assert_eq!(doc["users"][0]["name"], "ubuntu");
        assert_eq!(
            doc["users"][0]["ssh_authorized_keys"][0],
            "ssh-ed25519 AAAA x"
        );
        assert_eq!(doc["write_files"][1]["path"], "/etc/motd");
        let kubeadm = doc["write_files"][0]["content"].as_str().unwrap();
        let join: Value = serde_saphyr::from_str(kubeadm).unwrap();
        assert_eq!(join["kind"], "JoinConfiguration");
        assert_eq!(
            join["nodeRegistration"]["kubeletExtraArgs"],
            json!([{"name": "provider-id", "value": PROVIDER_ID}])
        );
        assert_eq!(
            join["discovery"]["bootstrapToken"]["apiServerEndpoint"],
            "10.0.0.1:6443"
        );
    }

    #[test]
    fn an_init_config_runs_kubeadm_init_with_the_cluster_configuration() {
        let spec = json!({
            "initConfiguration": {"nodeRegistration": {"kubeletExtraArgs": [{"name": "provider-id", "value": PROVIDER_ID}]}},
            "clusterConfiguration": {"apiServer": {"certSANs": ["10.0.0.1"]}},
        });
        let text =
            render_cloud_config(&spec, Role::Init, "10.0.0.1:6443", Some("v1.33.0"), "t").unwrap();
        assert!(text.contains(PROVIDER_ID), "{text}");
        let doc: Value = serde_saphyr::from_str(&text).unwrap();
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(doc["write_files"][0]["content"].as_str().unwrap())
                .unwrap();
        assert_eq!(docs[0]["kind"], "InitConfiguration");
        assert_eq!(docs[1]["kind"], "ClusterConfiguration");
        assert_eq!(docs[1]["controlPlaneEndpoint"], "10.0.0.1:6443");
        assert_eq!(docs[1]["kubernetesVersion"], "v1.33.0");
        assert!(
            doc["runcmd"][0]
                .as_str()
                .unwrap()
                .starts_with("kubeadm init")
        );
    }
}
