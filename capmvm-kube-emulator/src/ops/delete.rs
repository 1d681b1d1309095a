//! DELETE: deletion held by finalizers or carried out at once, shared by the API and the garbage
//! collector.

use super::*;

/// DELETE options: propagation and preconditions.
#[derive(Debug, Clone)]
pub(crate) struct DeleteOpts {
    pub(crate) propagation: Propagation,
    pub(crate) uid: Option<String>,
    pub(crate) resource_version: Option<String>,
    pub(crate) dry_run: bool,
}

/// DELETE of one object.
pub(crate) fn delete(
    shared: &Shared,
    def: &ResourceDef,
    ns: Option<&str>,
    name: &str,
    opts: &DeleteOpts,
) -> Result<Written, ApiError> {
    if def.builtin == Some(Builtin::Namespace)
        && ["default", "kube-system", "kube-public"].contains(&name)
    {
        return Err(ApiError::forbidden(
            "namespaces",
            "",
            name,
            "this namespace may not be deleted",
        ));
    }
    let mut store = shared.lock();
    let out = delete_locked(&mut store, &def.storage, &key_for(def, ns, name), opts)?;
    shared.finish(store);
    Ok(out)
}

/// Deletion under the lock, shared by the API and the garbage collector.
pub(crate) fn delete_locked(
    store: &mut Store,
    storage: &Arc<str>,
    key: &ObjKey,
    opts: &DeleteOpts,
) -> Result<Written, ApiError> {
    let Some(col) = store.collections.get(storage) else {
        return Err(ApiError::path_not_found());
    };
    let def = col.def.clone();
    let Some(current) = col.objects.get(key).cloned() else {
        return Err(ApiError::not_found(&def.plural, &def.group, &key.name));
    };
    let uid = meta::meta_str(current.value(), "uid");
    if let Some(want) = &opts.uid
        && want != uid
    {
        return Err(ApiError::conflict(
            &def.plural,
            &def.group,
            &key.name,
            &format!("Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"),
        ));
    }
    if let Some(want) = &opts.resource_version
        && *want != current.rv.to_string()
    {
        return Err(ApiError::conflict(
            &def.plural,
            &def.group,
            &key.name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {want}, ResourceVersion in object meta: {}",
                current.rv
            ),
        ));
    }
    let mut next = current.value().clone();
    let mut fins = meta::finalizers(&next);
    let add = match opts.propagation {
        Propagation::Orphan => Some("orphan"),
        Propagation::Foreground => Some("foregroundDeletion"),
        Propagation::Background => None,
    };
    if let Some(f) = add
        && !fins.iter().any(|x| x == f)
    {
        fins.push(f.to_string());
    }
    let deleting = meta::is_deleting(&next);
    // An object that nothing holds (no finalizers, none added by the propagation policy, not a
    // Namespace with its `spec.finalizers`) is removed as it is: the real registry deletes it from etcd
    // without first writing `deletionTimestamp`, so neither the answer nor the DELETED event carries
    // one, and `generation` is unchanged.
    if !deleting && fins.is_empty() && removable(storage, &mark_deleting(next.clone())) {
        if opts.dry_run {
            return Ok(Written::Removed(current));
        }
        return Ok(Written::Removed(store.remove(storage, key, next)));
    }
    {
        let m = meta::metadata_mut(&mut next);
        if !fins.is_empty() {
            m.insert("finalizers".into(), json!(fins));
        }
        if !deleting {
            if def.has_generation {
                let g = m.get("generation").and_then(Value::as_i64).unwrap_or(0);
                m.insert("generation".into(), json!(g + 1));
            }
            m.insert(
                "deletionTimestamp".into(),
                Value::String(meta::now_rfc3339()),
            );
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
        }
    }
    if &**storage == NAMESPACES
        && let Value::Object(m) = &mut next
    {
        m.insert("status".into(), json!({"phase": "Terminating"}));
    }
    if opts.dry_run {
        return Ok(if removable(storage, &next) {
            Written::Removed(current)
        } else {
            Written::Unchanged(Arc::new(dry_run_stored(next)))
        });
    }
    if deleting && next == *current.value() {
        return Ok(Written::Unchanged(current));
    }
    match store.replace(storage, key, &current, next) {
        Ok(w) => Ok(w),
        Err(CommitError::Stale) => Err(ApiError::modified_conflict(
            &def.plural,
            &def.group,
            &key.name,
        )),
        Err(CommitError::Api(e)) => Err(e),
    }
}

/// The object with the marks of a deletion in progress, to ask [`removable`] whether it would stay.
fn mark_deleting(mut v: Value) -> Value {
    meta::metadata_mut(&mut v).insert(
        "deletionTimestamp".into(),
        Value::String(meta::now_rfc3339()),
    );
    v
}

/// A server-side update of metadata (garbage collector, namespace and CRD controllers).
pub(crate) fn update_locked(
    store: &mut Store,
    storage: &Arc<str>,
    key: &ObjKey,
    f: impl FnOnce(&mut Value),
) -> Option<Written> {
    let current = store.get(storage, key)?;
    let mut next = current.value().clone();
    f(&mut next);
    store.replace(storage, key, &current, next).ok()
}
