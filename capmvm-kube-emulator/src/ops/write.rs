//! PUT and PATCH: the registry strategies applied to the new object, then one commit path.

use super::*;

/// The common part of PUT and PATCH: what the registry strategies do with the new object.
#[allow(clippy::too_many_arguments)]
pub(crate) fn prepare_update(
    shared: &Shared,
    def: &ResourceDef,
    sub: Sub,
    current: &Stored,
    mut new: Value,
    mut unknown: Vec<String>,
    params: &WriteParams,
    warnings: &mut Vec<String>,
) -> Result<Value, ApiError> {
    unknown_fields(def, &mut new, &mut unknown);
    let old_view = view(def, current.value());
    let old: &Value = &old_view;
    if def.status_subresource || sub == Sub::Status {
        match sub {
            Sub::Main => {
                if let Value::Object(m) = &mut new {
                    match old.get("status") {
                        Some(s) => m.insert("status".into(), s.clone()),
                        None => m.remove("status"),
                    };
                }
            }
            Sub::Status => {
                let status = new.get("status").cloned();
                // Apply has worked out the ownership of a /status write already.
                let managed = meta::metadata(&new)
                    .and_then(|m| m.get("managedFields"))
                    .filter(|_| params.managed_fields_set)
                    .cloned();
                new = old.clone();
                if let Some(managed) = managed {
                    meta::metadata_mut(&mut new).insert("managedFields".into(), managed);
                }
                if let Value::Object(m) = &mut new {
                    match status {
                        Some(s) => m.insert("status".into(), s),
                        None => m.remove("status"),
                    };
                }
            }
        }
    }
    {
        let old_meta = meta::metadata(old);
        let m = meta::metadata_mut(&mut new);
        for f in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "namespace",
            "name",
        ] {
            match old_meta.and_then(|o| o.get(f)) {
                Some(v) => m.insert(f.into(), v.clone()),
                None => m.remove(f),
            };
        }
        m.remove("selfLink");
    }
    if meta::is_deleting(old) {
        let old_fins = meta::finalizers(old);
        let added: Vec<String> = meta::finalizers(&new)
            .into_iter()
            .filter(|f| !old_fins.contains(f))
            .collect();
        if !added.is_empty() {
            let errs = [FieldError::forbidden(
                "metadata.finalizers",
                &format!(
                    "no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                ),
            )];
            return Err(ApiError::invalid(
                &def.kind,
                &def.group,
                meta::meta_str(old, "name"),
                &errs,
            ));
        }
    }
    if let Some(b) = def.builtin {
        builtin::prepare(b, &mut new, Some(old))?;
    }
    if sub == Sub::Main {
        shared
            .admission
            .admit(def, &mut new, crate::admission::Operation::Update)?;
    }
    apply_schema(
        def,
        &mut new,
        Some(old),
        unknown,
        params.field_validation,
        warnings,
    )?;
    if let Some(b) = def.builtin {
        let errs = builtin::validate_update(b, &new, old);
        if !errs.is_empty() {
            return Err(ApiError::invalid(
                &def.kind,
                &def.group,
                meta::meta_str(old, "name"),
                &errs,
            ));
        }
    }
    if def.builtin == Some(Builtin::Crd) {
        if sub == Sub::Main {
            prepare_crd(&mut new, Some(old), warnings)?;
        }
    } else if def.has_generation && !same_apart_from_metadata(&new, old, def.status_subresource) {
        let g = meta::metadata(old)
            .and_then(|m| m.get("generation"))
            .and_then(Value::as_i64)
            .unwrap_or(0);
        meta::metadata_mut(&mut new).insert("generation".into(), json!(g + 1));
    }
    if def.builtin == Some(Builtin::Crd)
        && sub == Sub::Main
        && !same_apart_from_metadata(&new, old, true)
    {
        let g = meta::metadata(old)
            .and_then(|m| m.get("generation"))
            .and_then(Value::as_i64)
            .unwrap_or(0);
        meta::metadata_mut(&mut new).insert("generation".into(), json!(g + 1));
    }
    if !params.managed_fields_set {
        if shared.track_updates {
            crate::apply::track_update(def, sub, params, Some(old), &mut new);
        } else {
            crate::apply::keep_entries(old, &mut new);
        }
    }
    Ok(to_storage(def, new))
}

/// PUT: replaces an object (or its status).
pub(crate) fn update(
    shared: &Shared,
    def: &Arc<ResourceDef>,
    ns: Option<&str>,
    name: &str,
    sub: Sub,
    mut obj: Value,
    params: &WriteParams,
) -> Result<WriteResult, ApiError> {
    let unknown = decode_body(def, &mut obj)?;
    let body_name = meta::meta_str(&obj, "name");
    if body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    if def.namespaced {
        let body_ns = meta::meta_str(&obj, "namespace");
        if !body_ns.is_empty() && Some(body_ns) != ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
    }
    let body_rv = meta::meta_str(&obj, "resourceVersion").to_string();
    let key = key_for(def, ns, name);
    loop {
        let mut warnings: Vec<String> = def.deprecation_warning.iter().cloned().collect();
        let current = { shared.lock().get(&def.storage, &key) };
        let Some(current) = current else {
            if def.allow_create_on_update && sub == Sub::Main {
                let mut fresh = obj.clone();
                meta::metadata_mut(&mut fresh).remove("resourceVersion");
                return create(shared, def, ns, fresh, params);
            }
            return Err(ApiError::not_found(&def.plural, &def.group, name));
        };
        if body_rv.is_empty() {
            if !def.allow_unconditional_update {
                let errs = [FieldError::invalid(
                    "metadata.resourceVersion",
                    &json!(0),
                    "must be specified for an update",
                )];
                return Err(ApiError::invalid(&def.kind, &def.group, name, &errs));
            }
        } else if parse_rv_for(&body_rv, RvUse::Precondition)? != current.rv {
            return Err(ApiError::modified_conflict(&def.plural, &def.group, name));
        }
        let new = prepare_update(
            shared,
            def,
            sub,
            &current,
            obj.clone(),
            unknown.clone(),
            params,
            &mut warnings,
        )?;
        match commit(shared, def, &key, &current, new, params, warnings)? {
            Committed::Done(result) => return Ok(result),
            // Without a precondition the update is tried again on a fresh read.
            Committed::Stale if body_rv.is_empty() => continue,
            Committed::Stale => {
                return Err(ApiError::modified_conflict(&def.plural, &def.group, name));
            }
        }
    }
}

/// PATCH with a merge, JSON or strategic merge patch.
#[allow(clippy::too_many_arguments)]
pub(crate) fn patch(
    shared: &Shared,
    def: &Arc<ResourceDef>,
    ns: Option<&str>,
    name: &str,
    sub: Sub,
    ptype: PatchType,
    body: &[u8],
    params: &WriteParams,
) -> Result<WriteResult, ApiError> {
    match ptype {
        PatchType::Strategic if def.builtin.is_none() => {
            return Err(ApiError::unsupported_media_type(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
            ));
        }
        _ => {}
    }
    let key = key_for(def, ns, name);
    let mut attempts = 0;
    loop {
        attempts += 1;
        let mut warnings: Vec<String> = def.deprecation_warning.iter().cloned().collect();
        let current = { shared.lock().get(&def.storage, &key) };
        let Some(current) = current else {
            return Err(ApiError::not_found(&def.plural, &def.group, name));
        };
        let mut doc = view(def, current.value()).into_owned();
        match ptype {
            PatchType::Merge => patch::merge(&mut doc, body)?,
            PatchType::Json => patch::json(&mut doc, body)?,
            PatchType::Strategic => patch::strategic(&mut doc, body)?,
            PatchType::Apply => return Err(ApiError::internal("apply reached the patcher")),
        }
        let unknown = decode_body(def, &mut doc)?;
        if meta::meta_str(&doc, "name") != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                meta::meta_str(&doc, "name")
            )));
        }
        let rv = meta::meta_str(&doc, "resourceVersion").to_string();
        if !rv.is_empty() && parse_rv_for(&rv, RvUse::Precondition)? != current.rv {
            return Err(ApiError::modified_conflict(&def.plural, &def.group, name));
        }
        // Strict decoding of a patched object fails as an invalid `patch` carrying the whole patched
        // object (a 422, where a create or an update is a 400): kept only for that message.
        let patched = (params.field_validation == FieldValidation::Strict).then(|| doc.clone());
        let new = prepare_update(
            shared,
            def,
            sub,
            &current,
            doc,
            unknown,
            params,
            &mut warnings,
        )
        .map_err(|e| match patched {
            Some(patched) if e.code == 400 && e.message.contains("strict decoding error") => {
                let detail = e
                    .message
                    .split_once(": strict")
                    .map_or(e.message.as_str(), |(_, r)| r);
                ApiError::invalid(
                    "",
                    "",
                    "",
                    &[FieldError::invalid(
                        "patch",
                        &Value::String(patched.to_string()),
                        &format!("strict{detail}"),
                    )],
                )
            }
            _ => e,
        })?;
        match commit(shared, def, &key, &current, new, params, warnings)? {
            Committed::Done(result) => return Ok(result),
            // Patches without a precondition are retried on a fresh read, as the real server does.
            Committed::Stale if attempts < 64 => continue,
            Committed::Stale => {
                return Err(ApiError::modified_conflict(&def.plural, &def.group, name));
            }
        }
    }
}

/// What committing a prepared update came to.
pub(crate) enum Committed {
    /// Done: stored, unchanged, removed (its last finalizer gone), or a dry run's answer.
    Done(WriteResult),
    /// Another write came first; the caller reads again or answers 409, as its preconditions say.
    Stale,
}

/// The one commit path of PUT, PATCH and server-side apply: a dry run answers what would be stored;
/// otherwise `new` replaces `current` if that is still the stored version.
pub(crate) fn commit(
    shared: &Shared,
    def: &ResourceDef,
    key: &ObjKey,
    current: &Arc<Stored>,
    new: Value,
    params: &WriteParams,
    warnings: Vec<String>,
) -> Result<Committed, ApiError> {
    if params.dry_run {
        return Ok(Committed::Done(WriteResult {
            written: Written::Stored(Arc::new(dry_run_stored(new))),
            warnings,
            created: false,
        }));
    }
    let mut store = shared.lock();
    match store.replace(&def.storage, key, current, new) {
        Ok(written) => {
            shared.finish(store);
            Ok(Committed::Done(WriteResult {
                written,
                warnings,
                created: false,
            }))
        }
        Err(CommitError::Stale) => Ok(Committed::Stale),
        Err(CommitError::Api(e)) => Err(e),
    }
}
