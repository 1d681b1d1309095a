//! POST: a create as the real registry makes it (defaults, admission, schema, names, generated names).

use super::*;

/// POST: creates an object.
pub(crate) fn create(
    shared: &Shared,
    def: &Arc<ResourceDef>,
    ns: Option<&str>,
    mut obj: Value,
    params: &WriteParams,
) -> Result<WriteResult, ApiError> {
    let mut warnings: Vec<String> = def.deprecation_warning.iter().cloned().collect();
    let mut unknown = decode_body(def, &mut obj)?;
    unknown_fields(def, &mut obj, &mut unknown);
    {
        let m = meta::metadata_mut(&mut obj);
        match (def.namespaced, ns) {
            (true, Some(ns)) => match m.get("namespace").and_then(Value::as_str) {
                None | Some("") => {
                    m.insert("namespace".into(), Value::String(ns.into()));
                }
                Some(other) if other != ns => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                Some(_) => {}
            },
            (true, None) => return Err(ApiError::method_not_allowed()),
            (false, _) => {
                m.remove("namespace");
            }
        }
        if m.get("resourceVersion")
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
        {
            // The real registry raises this as a plain error: a 500 without a reason.
            return Err(ApiError::new(
                500,
                "",
                "resourceVersion should not be set on objects to be created",
            ));
        }
        m.insert("uid".into(), Value::String(meta::new_uid()));
        m.insert(
            "creationTimestamp".into(),
            Value::String(meta::now_rfc3339()),
        );
        for f in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
            "generation",
        ] {
            m.remove(f);
        }
        if def.has_generation {
            m.insert("generation".into(), json!(1));
        }
    }
    let name = meta::meta_str(&obj, "name").to_string();
    let generate = meta::meta_str(&obj, "generateName").to_string();
    if name.is_empty() && generate.is_empty() {
        return Err(ApiError::invalid(
            &def.kind,
            &def.group,
            "",
            &[FieldError::required_detail(
                "metadata.name",
                "name or generateName is required",
            )],
        ));
    }
    if def.status_subresource
        && def.builtin.is_none()
        && let Value::Object(m) = &mut obj
    {
        m.remove("status");
    }
    if let Some(b) = def.builtin {
        builtin::prepare(b, &mut obj, None)?;
    }
    // The generated name keeps at most 58 characters of the prefix, as the real name generator does.
    let generate = meta::generated_name_base(&generate).to_string();
    let probe_name = if name.is_empty() {
        format!("{generate}xxxxx")
    } else {
        name.clone()
    };
    meta::metadata_mut(&mut obj).insert("name".into(), Value::String(probe_name.clone()));
    shared
        .admission
        .admit(def, &mut obj, crate::admission::Operation::Create)?;
    apply_schema(
        def,
        &mut obj,
        None,
        unknown,
        params.field_validation,
        &mut warnings,
    )?;
    let mut name_errs = meta::name_errors(def.name_rule, &probe_name, "metadata.name");
    if name.is_empty() {
        for e in &mut name_errs {
            e.field = "metadata.generateName".into();
        }
    }
    // The metadata's errors come first, then the kind's own, in one answer, as `ValidateNode` orders them.
    if def.builtin == Some(Builtin::Node) {
        name_errs.extend(crate::node::validate_create(&obj));
    }
    if !name_errs.is_empty() {
        return Err(ApiError::invalid(&def.kind, &def.group, &name, &name_errs));
    }
    if def.builtin == Some(Builtin::Crd) {
        prepare_crd(&mut obj, None, &mut warnings)?;
    }
    if !params.managed_fields_set && shared.track_updates {
        crate::apply::track_update(def, Sub::Main, params, None, &mut obj);
    }
    let obj = to_storage(def, obj);
    let storage = def.storage.clone();
    let mut store = shared.lock();
    check_namespace(&store, def, ns, &name)?;
    if let Some(col) = store.collections.get(&storage)
        && col.terminating
    {
        return Err(ApiError::new(
            405,
            "MethodNotAllowed",
            "create not allowed while custom resource definition is terminating",
        ));
    }
    for attempt in 0..8 {
        let final_name = if name.is_empty() {
            format!("{generate}{}", meta::generated_suffix())
        } else {
            name.clone()
        };
        let mut candidate = obj.clone();
        meta::metadata_mut(&mut candidate).insert("name".into(), Value::String(final_name.clone()));
        let key = ObjKey::new(
            if def.namespaced { ns.unwrap_or("") } else { "" },
            &final_name,
        );
        if params.dry_run {
            if store.get(&storage, &key).is_some() {
                return Err(ApiError::already_exists(
                    &def.plural,
                    &def.group,
                    &final_name,
                ));
            }
            let stored = Arc::new(dry_run_stored(candidate));
            return Ok(WriteResult {
                written: Written::Stored(stored),
                warnings,
                created: true,
            });
        }
        match store.insert(&storage, key, candidate) {
            Ok(stored) => {
                shared.finish(store);
                return Ok(WriteResult {
                    written: Written::Stored(stored),
                    warnings,
                    created: true,
                });
            }
            Err(e) if e.reason == "AlreadyExists" && name.is_empty() && attempt < 7 => continue,
            Err(e) => return Err(e),
        }
    }
    Err(ApiError::already_exists(&def.plural, &def.group, &name))
}
