//! The stand-in's writes: merge patches under its field manager, sent only when they change
//! something.

use super::*;

/// Every write's parameters: the stand-in's field manager.
pub(crate) fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(MANAGER.to_string()),
        ..Default::default()
    }
}

/// An ownerReference to `obj`; a controller one also blocks the owner's deletion.
pub(crate) fn owner_ref<K: Resource<DynamicType = ()>>(
    obj: &K,
    controller: bool,
) -> OwnerReference {
    OwnerReference {
        api_version: K::api_version(&()).to_string(),
        kind: K::kind(&()).to_string(),
        name: obj.name_any(),
        uid: obj.uid().unwrap_or_default(),
        controller: controller.then_some(true),
        block_owner_deletion: controller.then_some(true),
    }
}

/// Adds `finalizer` to the object unless it carries it already.
pub(crate) async fn ensure_finalizer<K>(
    api: &Api<K>,
    obj: &K,
    finalizer: &str,
) -> Result<(), kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    if obj.finalizers().iter().any(|f| f == finalizer) {
        return Ok(());
    }
    let mut finalizers = obj.finalizers().to_vec();
    finalizers.push(finalizer.to_string());
    write_finalizers(api, obj, &finalizers).await
}

/// Removes `finalizer` from the object if it carries it; an object already gone is fine.
pub(crate) async fn remove_finalizer<K>(
    api: &Api<K>,
    obj: &K,
    finalizer: &str,
) -> Result<(), kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let finalizers: Vec<String> = obj
        .finalizers()
        .iter()
        .filter(|f| *f != finalizer)
        .cloned()
        .collect();
    if finalizers.len() == obj.finalizers().len() {
        return Ok(());
    }
    match write_finalizers(api, obj, &finalizers).await {
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        written => written,
    }
}

/// Writes the object's finalizers, on the condition that it is still at the version read: a
/// finalizer list is never merged, so a concurrent change must not be overwritten.
async fn write_finalizers<K>(
    api: &Api<K>,
    obj: &K,
    finalizers: &[String],
) -> Result<(), kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let body =
        json!({"metadata": {"finalizers": finalizers, "resourceVersion": obj.resource_version()}});
    api.patch(&obj.name_any(), &params(), &Patch::Merge(&body))
        .await
        .map(|_| ())
}

/// Deletes `name` in the background; one already gone is fine.
pub(crate) async fn delete_quietly<K>(api: &Api<K>, name: &str) -> Result<(), kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Merges `want` into the object's status if any of its fields differ.
pub(super) async fn patch_status_if_changed<K>(
    api: &Api<K>,
    obj: &K,
    current: &Value,
    want: Value,
) -> Result<(), kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let differs = want
        .as_object()
        .is_some_and(|w| w.iter().any(|(k, v)| current.get(k) != Some(v)));
    if differs {
        api.patch_status(
            &obj.name_any(),
            &params(),
            &Patch::Merge(&json!({"status": want})),
        )
        .await?;
    }
    Ok(())
}
