//! Creating a Machine as CAPI's MachineSet and KubeadmControlPlane controllers do: clone the
//! MicrovmMachine from its template, create the bootstrap KubeadmConfig, then the Machine naming both.
//! The Machine controller then adopts both (controller owner references).
//!
//! A create whose reply is lost may still have landed (a 504 or a cut connection after the commit):
//! each create is checked by name before it is tried again, and what was made for a Machine that
//! could not be created is deleted again, as CAPI's MachineSet cleans up after itself.

use std::collections::BTreeMap;

use capmvm_api::capi::{ContractVersionedObjectReference, Machine};
use capmvm_api::keys::{
    CLONED_FROM_GROUPKIND_ANNOTATION, CLONED_FROM_NAME_ANNOTATION, CLUSTER_NAME_LABEL,
};
use capmvm_api::{GROUP, MicrovmMachine, MicrovmMachineTemplate};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use tracing::warn;

use super::MACHINE_FINALIZER;
use super::StandInPlays;
use super::bootstrap::{BOOTSTRAP_GROUP, kubeadm_config_resource};
use super::controllers::{Ctx, Error};

/// Where a new Machine's bootstrap data comes from.
#[derive(Debug, Clone)]
pub(crate) enum NewBootstrap {
    /// A KubeadmConfig with this spec, created for the Machine.
    Kubeadm(Value),
    /// A Secret the user names (`dataSecretName`).
    Secret(String),
}

/// A Machine to create.
#[derive(Debug, Clone)]
pub(crate) struct NewMachine {
    pub(crate) name: String,
    pub(crate) namespace: String,
    pub(crate) cluster: String,
    /// The creating controller (MachineDeployment or KubeadmControlPlane).
    pub(crate) owner: OwnerReference,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) annotations: BTreeMap<String, String>,
    /// The MicrovmMachineTemplate's name.
    pub(crate) infra_template: String,
    pub(crate) bootstrap: NewBootstrap,
    pub(crate) version: Option<String>,
    pub(crate) failure_domain: Option<String>,
}

/// Creates the MicrovmMachine clone, the KubeadmConfig (if any) and the Machine. Returns false (and
/// logs) when the template does not exist.
pub(crate) async fn create_machine(ctx: &Ctx, new: NewMachine) -> Result<bool, Error> {
    let owner = OwnerReference {
        controller: None,
        block_owner_deletion: None,
        ..new.owner.clone()
    };
    let cloned = if ctx.options.plays == StandInPlays::ControlPlaneOnly {
        clone_at_contract_version(ctx, &new, &owner).await?
    } else {
        clone_from_cache(ctx, &new, &owner).await?
    };
    let Some(infra_api) = cloned else {
        return Ok(false);
    };
    let ns = new.namespace.clone();
    let name = new.name.clone();
    let config_api =
        Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &ns, &kubeadm_config_resource());
    match create_config_and_machine(ctx, new, owner, &config_api).await {
        Ok(()) => Ok(true),
        Err(e) => {
            // Nothing may be left without its Machine: it would wait for an owner for ever.
            let _ = infra_api.delete(&name, &Default::default()).await;
            let _ = config_api.delete(&name, &Default::default()).await;
            Err(e)
        }
    }
}

/// How often a create is tried before its error is returned.
const CREATE_ATTEMPTS: usize = 3;

/// Creates `obj` once: a create that failed is checked by name before it is tried again (its reply
/// may have been lost after it landed), and AlreadyExists means it landed (the names are new).
async fn create_once<K>(api: &Api<K>, obj: &K) -> Result<(), Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let name = obj.name_any();
    let mut attempt = 0;
    loop {
        attempt += 1;
        match api.create(&PostParams::default(), obj).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => return Ok(()),
            Err(e) => {
                if let Ok(Some(_)) = api.get_opt(&name).await {
                    return Ok(());
                }
                if attempt >= CREATE_ATTEMPTS {
                    return Err(e.into());
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

/// The bootstrap KubeadmConfig (if any) and the Machine of `new`, after its MicrovmMachine.
async fn create_config_and_machine(
    ctx: &Ctx,
    new: NewMachine,
    owner: OwnerReference,
    config_api: &Api<DynamicObject>,
) -> Result<(), Error> {
    let ns = new.namespace.as_str();

    let bootstrap = match &new.bootstrap {
        NewBootstrap::Kubeadm(spec) => {
            let resource = kubeadm_config_resource();
            let mut config = DynamicObject::new(&new.name, &resource).data(json!({"spec": spec}));
            config.metadata = ObjectMeta {
                name: Some(new.name.clone()),
                namespace: Some(ns.to_string()),
                labels: Some(
                    new.labels
                        .clone()
                        .into_iter()
                        .chain([(CLUSTER_NAME_LABEL.to_string(), new.cluster.clone())])
                        .collect(),
                ),
                owner_references: Some(vec![owner]),
                ..Default::default()
            };
            create_once(config_api, &config).await?;
            json!({"configRef": {"apiGroup": BOOTSTRAP_GROUP, "kind": "KubeadmConfig", "name": new.name}})
        }
        NewBootstrap::Secret(name) => json!({"dataSecretName": name}),
    };

    // Created from JSON: the operator's Machine view does not model `version`.
    let mut spec = json!({
        "clusterName": new.cluster,
        "bootstrap": bootstrap,
        "infrastructureRef": ContractVersionedObjectReference {
            api_group: GROUP.to_string(),
            kind: "MicrovmMachine".to_string(),
            name: new.name.clone(),
        },
    });
    if let Some(v) = &new.version {
        spec["version"] = json!(v);
    }
    if let Some(fd) = &new.failure_domain {
        spec["failureDomain"] = json!(fd);
    }
    let resource = ApiResource::erase::<Machine>(&());
    let mut machine = DynamicObject::new(&new.name, &resource).data(json!({ "spec": spec }));
    let mut machine_labels = new.labels;
    machine_labels.insert(CLUSTER_NAME_LABEL.to_string(), new.cluster.clone());
    machine.metadata = ObjectMeta {
        name: Some(new.name.clone()),
        namespace: Some(ns.to_string()),
        labels: Some(machine_labels),
        annotations: (!new.annotations.is_empty()).then_some(new.annotations),
        owner_references: Some(vec![new.owner]),
        finalizers: Some(vec![MACHINE_FINALIZER.to_string()]),
        ..Default::default()
    };
    create_once(
        &Api::<DynamicObject>::namespaced_with(ctx.client.clone(), ns, &resource),
        &machine,
    )
    .await
}

/// The clone's labels and annotations: the template's, the creating controller's, the cluster name
/// and where it was cloned from.
fn clone_meta(
    new: &NewMachine,
    template: &str,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    owner: &OwnerReference,
) -> ObjectMeta {
    let mut labels = labels;
    labels.extend(new.labels.clone());
    labels.insert(CLUSTER_NAME_LABEL.to_string(), new.cluster.clone());
    let mut annotations = annotations;
    annotations.extend(new.annotations.clone());
    annotations.insert(
        CLONED_FROM_NAME_ANNOTATION.to_string(),
        template.to_string(),
    );
    annotations.insert(
        CLONED_FROM_GROUPKIND_ANNOTATION.to_string(),
        format!("MicrovmMachineTemplate.{GROUP}"),
    );
    ObjectMeta {
        name: Some(new.name.clone()),
        namespace: Some(new.namespace.clone()),
        labels: Some(labels),
        annotations: Some(annotations),
        owner_references: Some(vec![owner.clone()]),
        ..Default::default()
    }
}

/// On the API emulator: the template from the watch cache, the clone at our version.
async fn clone_from_cache(
    ctx: &Ctx,
    new: &NewMachine,
    owner: &OwnerReference,
) -> Result<Option<Api<DynamicObject>>, Error> {
    let ns = new.namespace.as_str();
    let Some(template) = ctx
        .caches
        .microvm_machine_templates
        .get(ns, &new.infra_template)
        .await
    else {
        warn!(template = %new.infra_template, "the MicrovmMachineTemplate named does not exist");
        return Ok(None);
    };
    let meta = template.spec.template.metadata.clone().unwrap_or_default();
    let mut infra = MicrovmMachine::new(&new.name, template.spec.template.spec.clone());
    infra.metadata = clone_meta(
        new,
        &template.name_any(),
        meta.labels,
        meta.annotations,
        owner,
    );
    create_once(
        &Api::<MicrovmMachine>::namespaced(ctx.client.clone(), ns),
        &infra,
    )
    .await?;
    Ok(Some(Api::namespaced_with(
        ctx.client.clone(),
        ns,
        &ApiResource::erase::<MicrovmMachine>(&()),
    )))
}

/// Beside real CAPI: as CAPI clones, the template read and the clone written as they are, at the
/// version the template CRD's contract label names (`cluster.x-k8s.io/v1beta2`, else the v1beta1
/// contract's): v1alpha1 for the Go provider's CRDs, v1alpha2 for ours.
async fn clone_at_contract_version(
    ctx: &Ctx,
    new: &NewMachine,
    owner: &OwnerReference,
) -> Result<Option<Api<DynamicObject>>, Error> {
    let ns = new.namespace.as_str();
    let Some(version) = contract_version(ctx).await? else {
        warn!("the MicrovmMachineTemplate CRD has no contract label; cannot clone");
        return Ok(None);
    };
    let resource = |kind: &str, plural: &str| {
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, &version, kind), plural)
    };
    let templates = resource("MicrovmMachineTemplate", "microvmmachinetemplates");
    let template = match Api::<DynamicObject>::namespaced_with(ctx.client.clone(), ns, &templates)
        .get(&new.infra_template)
        .await
    {
        Ok(t) => t,
        Err(kube::Error::Api(s)) if s.code == 404 => {
            warn!(template = %new.infra_template, "the MicrovmMachineTemplate named does not exist");
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    let string_map = |v: Option<&Value>| -> BTreeMap<String, String> {
        v.and_then(|m| serde_json::from_value(m.clone()).ok())
            .unwrap_or_default()
    };
    let meta = template.data.pointer("/spec/template/metadata");
    let machines = resource("MicrovmMachine", "microvmmachines");
    let spec = template
        .data
        .pointer("/spec/template/spec")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let mut infra = DynamicObject::new(&new.name, &machines).data(json!({ "spec": spec }));
    infra.metadata = clone_meta(
        new,
        &new.infra_template,
        string_map(meta.and_then(|m| m.get("labels"))),
        string_map(meta.and_then(|m| m.get("annotations"))),
        owner,
    );
    let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), ns, &machines);
    create_once(&api, &infra).await?;
    Ok(Some(api))
}

/// The version of our kinds CAPI reads, as the template CRD's contract label names it
/// (`cluster.x-k8s.io/v1beta2`, else the v1beta1 contract's); None without a label.
async fn contract_version(ctx: &Ctx) -> Result<Option<String>, Error> {
    let crd = Api::<CustomResourceDefinition>::all(ctx.client.clone())
        .get(&format!("microvmmachinetemplates.{GROUP}"))
        .await?;
    let labels = crd.metadata.labels.unwrap_or_default();
    Ok(["cluster.x-k8s.io/v1beta2", "cluster.x-k8s.io/v1beta1"]
        .iter()
        .find_map(|l| labels.get(*l))
        // A label may list versions (`v1alpha1_v1alpha2`): the last is the newest.
        .and_then(|v| v.rsplit('_').next().map(str::to_string)))
}

/// The Cluster `owner` made an owner of the MicrovmMachineTemplate `name`, as the real
/// KubeadmControlPlane does for the template it clones from (`reconcileExternalReference`): deleting
/// the Cluster then deletes the template. A missing template is left to the clone to report.
pub(crate) async fn own_template(
    ctx: &Ctx,
    ns: &str,
    name: &str,
    owner: &OwnerReference,
) -> Result<(), Error> {
    let owns = |refs: &[OwnerReference]| refs.iter().any(|r| r.uid == owner.uid);
    // Every other owner kept, one of the same kind and name replaced (CAPI's EnsureOwnerRef); the
    // resourceVersion makes a concurrent change of the list a conflict, retried, not a loss.
    let patch = |meta: &ObjectMeta| {
        let mut refs: Vec<OwnerReference> = meta
            .owner_references
            .iter()
            .flatten()
            .filter(|r| !(r.kind == owner.kind && r.name == owner.name))
            .cloned()
            .collect();
        refs.push(owner.clone());
        json!({"metadata": {"ownerReferences": refs, "resourceVersion": meta.resource_version}})
    };
    let resource = if ctx.options.plays == StandInPlays::ControlPlaneOnly {
        // Beside real CAPI our CRDs may serve only the Go provider's version: read at the one the
        // contract label names, as the clone does.
        let Some(version) = contract_version(ctx).await? else {
            return Ok(());
        };
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(GROUP, &version, "MicrovmMachineTemplate"),
            "microvmmachinetemplates",
        )
    } else {
        ApiResource::erase::<MicrovmMachineTemplate>(&())
    };
    let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), ns, &resource);
    let meta = if ctx.options.plays == StandInPlays::ControlPlaneOnly {
        match api.get_opt(name).await? {
            Some(t) => t.metadata,
            None => return Ok(()),
        }
    } else {
        // On the emulator templates come from the watch cache (no GET per reconcile).
        match ctx.caches.microvm_machine_templates.get(ns, name).await {
            Some(t) => t.metadata.clone(),
            None => return Ok(()),
        }
    };
    if owns(meta.owner_references.as_deref().unwrap_or_default()) {
        return Ok(());
    }
    api.patch(
        name,
        &super::controllers::params(),
        &Patch::Merge(&patch(&meta)),
    )
    .await?;
    Ok(())
}

/// A short random-looking suffix of `n` characters, as CAPI's generated names have.
pub(crate) fn suffix_of(n: usize) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let seed = k8s_openapi::jiff::Timestamp::now().as_nanosecond() as u64;
    let mut x = seed ^ count.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let alphabet = b"bcdfghjklmnpqrstvwxz2456789";
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            alphabet[((x >> 33) % alphabet.len() as u64) as usize] as char
        })
        .collect()
}
