//! The API operations (get, list, create, update, patch, delete, watch setup) with the rules of the real
//! server's generic registry, and the background worker that garbage-collects dependents and empties
//! deleted namespaces and CRDs.

use std::borrow::Cow;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Map, Value, json};
use tokio::sync::{Notify, mpsc};

use super::builtin;
use super::counters::Counters;
use super::error::{ApiError, FieldError};
use super::meta;
use super::patch::{self, PatchType};
use super::registry::{self, Builtin, Conversion, ResourceDef};
use super::store::{
    CRD_CLEANUP_FINALIZER, CRDS, CommitError, Filter, GcItem, NAMESPACES, ObjKey, Propagation,
    Store, Stored, WatchMsg, Written, removable,
};

/// State shared by the HTTP handlers, the watch streams and the background tasks.
pub(crate) struct Shared {
    store: Mutex<Store>,
    pub(crate) counters: Counters,
    pub(crate) faults: super::faults::Faults,
    /// Defaulting and validation registered in-process (webhooks' role).
    pub(crate) admission: super::admission::Admission,
    pub(crate) gc_notify: Notify,
    pub(crate) default_watch_timeout: Duration,
    /// Whether writes other than apply record their fields (`EmulatorOptions::managed_fields`).
    pub(crate) track_updates: bool,
    pub(crate) shutdown: tokio::sync::watch::Receiver<bool>,
}

impl Shared {
    pub(crate) fn new(
        store: Store,
        default_watch_timeout: Duration,
        track_updates: bool,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        Self {
            store: Mutex::new(store),
            counters: Counters::default(),
            faults: super::faults::Faults::default(),
            admission: super::admission::Admission::default(),
            gc_notify: Notify::new(),
            default_watch_timeout,
            track_updates,
            shutdown,
        }
    }

    /// The store; a panic elsewhere while holding the lock leaves consistent data (every write is
    /// completed under the lock before it is published), so a poisoned lock is still used.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Store> {
        self.store
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn finish(&self, store: MutexGuard<'_, Store>) {
        let pending = store.has_background_work();
        drop(store);
        if pending {
            self.gc_notify.notify_one();
        }
    }
}

/// `fieldValidation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

/// Query parameters shared by writes.
#[derive(Debug, Clone)]
pub(crate) struct WriteParams {
    pub(crate) dry_run: bool,
    pub(crate) field_validation: FieldValidation,
    /// `fieldManager` (or the client's user agent's product) that field ownership records the write
    /// under.
    pub(crate) field_manager: Option<String>,
    /// The subresource the write is recorded under when its path does not say (`scale`).
    pub(crate) subresource: Option<&'static str>,
    /// Whether `metadata.managedFields` was already worked out (server-side apply does it).
    pub(crate) managed_fields_set: bool,
}

/// Whether a write targets the object or its `status` subresource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sub {
    Main,
    Status,
}

/// The result of a write: the object, warnings for the `Warning` header, and whether it was created.
#[derive(Debug)]
pub(crate) struct WriteResult {
    pub(crate) written: Written,
    pub(crate) warnings: Vec<String>,
    pub(crate) created: bool,
}

/// The served form of a stored object.
pub(crate) fn view<'a>(def: &ResourceDef, value: &'a Value) -> Cow<'a, Value> {
    match &def.conversion {
        Conversion::None => Cow::Borrowed(value),
        Conversion::ApiVersion { .. } => {
            let mut v = value.clone();
            if let Value::Object(m) = &mut v {
                m.insert("apiVersion".into(), Value::String(def.api_version()));
            }
            Cow::Owned(v)
        }
        Conversion::EventsV1 => Cow::Owned(builtin::event_to_v1(value)),
    }
}

/// The served form's bytes (shared with the store when no conversion is needed).
pub(crate) fn view_bytes(def: &ResourceDef, stored: &Stored) -> axum::body::Bytes {
    match &def.conversion {
        Conversion::None => stored.bytes.clone(),
        _ => super::store::encode(&view(def, stored.value())),
    }
}

fn to_storage(def: &ResourceDef, value: Value) -> Value {
    match &def.conversion {
        Conversion::None => value,
        Conversion::ApiVersion { stored } => {
            let mut v = value;
            if let Value::Object(m) = &mut v {
                m.insert("apiVersion".into(), Value::String(stored.clone()));
            }
            v
        }
        Conversion::EventsV1 => builtin::event_from_v1(value),
    }
}

fn cannot_handle(def: &ResourceDef) -> String {
    format!(
        "{} in version {:?} cannot be handled as a {}",
        def.kind, def.version, def.kind
    )
}

/// The checks the real decoder makes on `apiVersion` and `kind`, and on `metadata`'s types.
fn decode_body(def: &ResourceDef, obj: &mut Value) -> Result<Vec<String>, ApiError> {
    let Some(m) = obj.as_object() else {
        return Err(ApiError::bad_request(format!(
            "{}: json: cannot unmarshal {} into Go value of type {}",
            cannot_handle(def),
            meta::json_type(obj),
            def.kind
        )));
    };
    let kind = m.get("kind").and_then(Value::as_str).unwrap_or("");
    let api_version = m.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    if kind.is_empty() {
        return Err(ApiError::bad_request(format!(
            "Object 'Kind' is missing in '{}'",
            truncate(&obj.to_string())
        )));
    }
    if api_version.is_empty() {
        return Err(ApiError::bad_request(format!(
            "Object 'apiVersion' is missing in '{}'",
            truncate(&obj.to_string())
        )));
    }
    if api_version != def.api_version() {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({})",
            def.api_version()
        )));
    }
    if kind != def.kind {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({kind}) does not match the expected kind ({})",
            def.kind
        )));
    }
    meta::decode_metadata(obj, &cannot_handle(def))
}

fn truncate(s: &str) -> String {
    s.chars().take(200).collect()
}

/// The unknown fields of a decoded request body, found on the whole body (and pruned from it) before
/// any rule of the status subresource drops parts of it, as the real server finds them while decoding.
fn unknown_fields(def: &ResourceDef, body: &mut Value, unknown: &mut Vec<String>) {
    if let Some(schema) = &def.schema {
        schema.prune(body, unknown);
    }
}

/// Prunes, defaults and validates against the served version's schema; the request's unknown fields
/// (from `decode_body` and [`unknown_fields`]) are handled as `fieldValidation` says.
fn apply_schema(
    def: &ResourceDef,
    obj: &mut Value,
    old: Option<&Value>,
    unknown: Vec<String>,
    fv: FieldValidation,
    warnings: &mut Vec<String>,
) -> Result<(), ApiError> {
    if let Some(schema) = &def.schema {
        // What this pruning finds came from the stored object or the server, not from the request
        // (whose unknown fields were already collected): it is dropped silently.
        schema.prune(obj, &mut Vec::new());
        schema.default_and_drop_nulls(obj);
    }
    if !unknown.is_empty() {
        match fv {
            FieldValidation::Strict => {
                let list: Vec<String> = unknown
                    .iter()
                    .map(|u| format!("unknown field {u:?}"))
                    .collect();
                return Err(ApiError::bad_request(format!(
                    "{}: strict decoding error: {}",
                    cannot_handle(def),
                    list.join(", ")
                )));
            }
            FieldValidation::Warn => {
                warnings.extend(unknown.iter().map(|u| format!("unknown field {u:?}")))
            }
            FieldValidation::Ignore => {}
        }
    }
    let mut errs = def
        .schema
        .as_ref()
        .map(|s| s.validate_root(obj, old))
        .unwrap_or_default();
    if let Some(old) = old {
        // Ratcheting: a field that was already invalid and did not change is not an error.
        errs.retain(|e| {
            let path = if e.field == "body" {
                ""
            } else {
                e.field.as_str()
            };
            let now = super::schema::value_at(obj, path);
            now.is_none() || now != super::schema::value_at(old, path)
        });
    }
    errs.extend(meta::validate_common(obj));
    if errs.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(
            &def.kind,
            &def.group,
            meta::meta_str(obj, "name"),
            &errs,
        ))
    }
}

/// Whether `a` and `b` are equal apart from `metadata` (and `status` when `skip_status`), compared
/// in place (a spec can be large; copying both for each update was a share of the write's cost).
fn same_apart_from_metadata(a: &Value, b: &Value, skip_status: bool) -> bool {
    let counted = |k: &String| k.as_str() != "metadata" && !(skip_status && k.as_str() == "status");
    let empty = Map::new();
    let (a, b) = (
        a.as_object().unwrap_or(&empty),
        b.as_object().unwrap_or(&empty),
    );
    a.keys().filter(|k| counted(k)).count() == b.keys().filter(|k| counted(k)).count()
        && a.iter()
            .filter(|(k, _)| counted(k))
            .all(|(k, v)| b.get(k) == Some(v))
}

/// CRD-specific work on create and update: validation, defaults, the served status.
fn prepare_crd(
    obj: &mut Value,
    old: Option<&Value>,
    warnings: &mut Vec<String>,
) -> Result<(), ApiError> {
    if let Err(e) = serde_json::from_value::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>(obj.clone()) {
        return Err(ApiError::bad_request(format!(
            "CustomResourceDefinition in version \"v1\" cannot be handled as a CustomResourceDefinition: {e}"
        )));
    }
    registry::default_crd(obj);
    let errs = registry::validate_crd(obj);
    if !errs.is_empty() {
        return Err(ApiError::invalid(
            "CustomResourceDefinition",
            "apiextensions.k8s.io",
            meta::meta_str(obj, "name"),
            &errs,
        ));
    }
    if let Some(old) = old {
        let field = |v: &Value, p: &str| v.pointer(p).cloned();
        for (path, name) in [
            ("/spec/group", "spec.group"),
            ("/spec/names/plural", "spec.names.plural"),
            ("/spec/scope", "spec.scope"),
        ] {
            if field(obj, path) != field(old, path) {
                let errs = [FieldError::invalid(
                    name,
                    &field(obj, path).unwrap_or(Value::Null),
                    "field is immutable",
                )];
                return Err(ApiError::invalid(
                    "CustomResourceDefinition",
                    "apiextensions.k8s.io",
                    meta::meta_str(obj, "name"),
                    &errs,
                ));
            }
        }
    }
    if obj
        .pointer("/spec/conversion/strategy")
        .and_then(Value::as_str)
        == Some("Webhook")
    {
        warnings.push("conversion webhooks are not called by the API emulator: versions differ only in apiVersion".into());
    }
    let status = registry::crd_status(obj, old);
    if let Value::Object(m) = obj {
        m.insert("status".into(), status);
    }
    if old.is_none() {
        let fins = meta::metadata_mut(obj)
            .entry("finalizers")
            .or_insert_with(|| json!([]));
        if let Value::Array(a) = fins
            && !a.iter().any(|f| f == CRD_CLEANUP_FINALIZER)
        {
            a.push(Value::String(CRD_CLEANUP_FINALIZER.into()));
        }
    }
    Ok(())
}

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
        .admit(def, &mut obj, super::admission::Operation::Create)?;
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
    if !name_errs.is_empty() {
        return Err(ApiError::invalid(&def.kind, &def.group, &name, &name_errs));
    }
    if def.builtin == Some(Builtin::Crd) {
        prepare_crd(&mut obj, None, &mut warnings)?;
    }
    if !params.managed_fields_set && shared.track_updates {
        super::apply::track_update(def, Sub::Main, params, None, &mut obj);
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

fn dry_run_stored(value: Value) -> Stored {
    // A dry run shows the object as it would be stored, without a resourceVersion.
    let bytes = super::store::encode(&value);
    super::store::Stored::detached(value, bytes)
}

fn check_namespace(
    store: &Store,
    def: &ResourceDef,
    ns: Option<&str>,
    name: &str,
) -> Result<(), ApiError> {
    if !def.namespaced {
        return Ok(());
    }
    let ns = ns.unwrap_or("");
    match store.namespace_state(ns) {
        None => Err(ApiError::not_found("namespaces", "", ns)),
        Some(true) => {
            let mut e = ApiError::forbidden(
                &def.plural,
                &def.group,
                name,
                &format!(
                    "unable to create new content in namespace {ns} because it is being terminated"
                ),
            );
            if let Some(d) = &mut e.details {
                d.insert(
                    "causes".into(),
                    json!([{"reason": "NamespaceTerminating", "message": format!("namespace {ns} is being terminated"), "field": "metadata.namespace"}]),
                );
            }
            Err(e)
        }
        Some(false) => Ok(()),
    }
}

fn key_for(def: &ResourceDef, ns: Option<&str>, name: &str) -> ObjKey {
    ObjKey::new(if def.namespaced { ns.unwrap_or("") } else { "" }, name)
}

/// GET of one object.
pub(crate) fn get(
    shared: &Shared,
    def: &ResourceDef,
    ns: Option<&str>,
    name: &str,
) -> Result<Arc<Stored>, ApiError> {
    let store = shared.lock();
    store
        .get(&def.storage, &key_for(def, ns, name))
        .ok_or_else(|| ApiError::not_found(&def.plural, &def.group, name))
}

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
            .admit(def, &mut new, super::admission::Operation::Update)?;
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
            super::apply::track_update(def, sub, params, Some(old), &mut new);
        } else {
            super::apply::keep_entries(old, &mut new);
        }
    }
    Ok(to_storage(def, new))
}

fn parse_rv(s: &str) -> Result<u64, ApiError> {
    parse_rv_for(s, RvUse::List)
}

/// Where an unparsable resourceVersion was given: the real server answers a LIST with 400, and a
/// GET, a watch or an update's precondition with its storage layer's plain error (a 500 without a
/// reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RvUse {
    List,
    Read,
    Precondition,
}

pub(crate) fn parse_rv_for(s: &str, use_: RvUse) -> Result<u64, ApiError> {
    s.parse::<u64>().map_err(|e| {
        let why = format!("strconv.ParseUint: parsing {s:?}: {}", go_parse_error(&e));
        match use_ {
            RvUse::List => ApiError::bad_request(format!(
                "invalid resource version: resourceVersion: Invalid value: {s:?}: {why}"
            )),
            RvUse::Read => ApiError::new(
                500,
                "",
                format!("resourceVersion: Invalid value: {s:?}: {why}"),
            ),
            RvUse::Precondition => ApiError::new(500, "", why),
        }
    })
}

/// Go's words for a failed unsigned integer parse.
fn go_parse_error(e: &std::num::ParseIntError) -> &'static str {
    match e.kind() {
        std::num::IntErrorKind::PosOverflow => "value out of range",
        _ => "invalid syntax",
    }
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
    let mut warnings: Vec<String> = def.deprecation_warning.iter().cloned().collect();
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
        if params.dry_run {
            return Ok(WriteResult {
                written: Written::Stored(Arc::new(dry_run_stored(new))),
                warnings,
                created: false,
            });
        }
        let mut store = shared.lock();
        match store.replace(&def.storage, &key, &current, new) {
            Ok(written) => {
                shared.finish(store);
                return Ok(WriteResult {
                    written,
                    warnings,
                    created: false,
                });
            }
            Err(CommitError::Stale) if body_rv.is_empty() => {
                warnings.truncate(usize::from(def.deprecation_warning.is_some()));
                continue;
            }
            Err(CommitError::Stale) => {
                return Err(ApiError::modified_conflict(&def.plural, &def.group, name));
            }
            Err(CommitError::Api(e)) => return Err(e),
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
        if params.dry_run {
            return Ok(WriteResult {
                written: Written::Stored(Arc::new(dry_run_stored(new))),
                warnings,
                created: false,
            });
        }
        let mut store = shared.lock();
        match store.replace(&def.storage, &key, &current, new) {
            Ok(written) => {
                shared.finish(store);
                return Ok(WriteResult {
                    written,
                    warnings,
                    created: false,
                });
            }
            // Patches without a precondition are retried on a fresh read, as the real server does.
            Err(CommitError::Stale) if attempts < 64 => continue,
            Err(CommitError::Stale) => {
                return Err(ApiError::modified_conflict(&def.plural, &def.group, name));
            }
            Err(CommitError::Api(e)) => return Err(e),
        }
    }
}

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
fn update_locked(
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

/// LIST options.
#[derive(Debug, Clone, Default)]
pub(crate) struct ListOpts {
    pub(crate) limit: Option<usize>,
    pub(crate) continue_token: Option<String>,
    pub(crate) resource_version: Option<String>,
    pub(crate) resource_version_match: Option<String>,
}

/// A page of a list.
#[derive(Debug)]
pub(crate) struct ListPage {
    pub(crate) items: Vec<Arc<Stored>>,
    pub(crate) resource_version: u64,
    pub(crate) continue_token: Option<String>,
    pub(crate) remaining: Option<u64>,
}

fn encode_continue(rv: u64, key: &ObjKey) -> String {
    let start = format!("{}/{}\u{0}", key.ns, key.name);
    let doc = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": start});
    // Unpadded, as the real server's tokens.
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(doc.to_string())
}

fn decode_continue(token: &str) -> Result<(u64, ObjKey), ApiError> {
    let bad = |why: &str| ApiError::bad_request(format!("continue key is not valid: {why}"));
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .or_else(|_| base64::engine::general_purpose::URL_SAFE.decode(token))
        .or_else(|_| base64::engine::general_purpose::STANDARD.decode(token))
        .map_err(|_| bad("illegal base64 data"))?;
    let doc: Value = serde_json::from_slice(&raw).map_err(|_| bad("not a JSON document"))?;
    if doc.get("v").and_then(Value::as_str) != Some("meta.k8s.io/v1") {
        return Err(bad(
            "incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
        ));
    }
    let rv = doc
        .get("rv")
        .and_then(Value::as_u64)
        .filter(|r| *r > 0)
        .ok_or_else(|| bad("incorrect encoded start resourceVersion"))?;
    let start = doc
        .get("start")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("missing start"))?;
    let start = start.strip_suffix('\u{0}').unwrap_or(start);
    let (ns, name) = start
        .split_once('/')
        .ok_or_else(|| bad("malformed start key"))?;
    Ok((rv, ObjKey::new(ns, name)))
}

/// LIST: a consistent page of the objects the filter selects.
pub(crate) fn list(
    shared: &Shared,
    def: &ResourceDef,
    filter: &Filter,
    opts: &ListOpts,
) -> Result<ListPage, ApiError> {
    let rv_param = opts.resource_version.as_deref().unwrap_or("");
    if opts.resource_version_match.is_some() && rv_param.is_empty() {
        return Err(ApiError::bad_request(
            "resourceVersionMatch is forbidden unless resourceVersion is provided",
        ));
    }
    if opts.continue_token.is_some() && !rv_param.is_empty() && rv_param != "0" {
        return Err(ApiError::bad_request(
            "specifying resource version is not allowed when using continue",
        ));
    }
    let store = shared.lock();
    let (mut at, after) = match &opts.continue_token {
        Some(t) => {
            let (rv, key) = decode_continue(t)?;
            (Some(rv), Some(key))
        }
        None => (None, None),
    };
    if at.is_none() && !rv_param.is_empty() && rv_param != "0" {
        let rv = parse_rv(rv_param)?;
        match opts.resource_version_match.as_deref() {
            Some("Exact") => at = Some(rv),
            None | Some("NotOlderThan") => {
                if rv > store.rev {
                    return Err(ApiError::too_large_resource_version(rv, store.rev));
                }
            }
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "resourceVersionMatch: Unsupported value: {other:?}: supported values: \"Exact\", \"NotOlderThan\""
                )));
            }
        }
    }
    if let Some(a) = at
        && a > store.rev
    {
        return Err(ApiError::too_large_resource_version(a, store.rev));
    }
    let list_rv = at.unwrap_or(store.rev);
    let limit = opts.limit.filter(|l| *l > 0);
    let pinned = filter.fields.pinned_name().map(str::to_string);
    // `fieldSelector=metadata.name=x` in one namespace (kubectl wait and delete, kube-runtime's
    // await_condition) is one lookup, not a scan.
    if let Some(p) = &pinned
        && at.is_none_or(|a| a >= store.rev)
        && after.is_none()
        && (filter.ns.is_some() || !def.namespaced)
    {
        let key = ObjKey::new(filter.ns.as_deref().unwrap_or(""), p);
        let items: Vec<Arc<Stored>> = store
            .get(&def.storage, &key)
            .filter(|o| filter.matches(o.value()))
            .into_iter()
            .collect();
        return Ok(ListPage {
            items,
            resource_version: list_rv,
            continue_token: None,
            remaining: None,
        });
    }
    let mut items = Vec::new();
    let mut last_key: Option<ObjKey> = None;
    let mut more = false;
    let mut remaining = 0u64;
    let trivial = filter.is_trivial();
    let result = store.snapshot(
        &def.storage,
        at,
        filter.ns.as_deref(),
        after.as_ref(),
        |key, obj| {
            if pinned.as_ref().is_some_and(|p| key.name != *p) {
                return true;
            }
            if !filter.matches_stored(key, obj) {
                return true;
            }
            if limit.is_some_and(|l| items.len() >= l) {
                more = true;
                remaining += 1;
                // Counting the rest is only needed (and only reported) without selectors.
                return trivial;
            }
            last_key = Some(key.clone());
            items.push(obj.clone());
            true
        },
    );
    if let Err(e) = result {
        if opts.continue_token.is_some() {
            return Err(ApiError::gone(
                "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
            ));
        }
        return Err(e);
    }
    let continue_token = if more {
        last_key.as_ref().map(|k| encode_continue(list_rv, k))
    } else {
        None
    };
    Ok(ListPage {
        items,
        resource_version: list_rv,
        continue_token,
        remaining: (more && trivial).then_some(remaining),
    })
}

/// Watch options.
#[derive(Debug, Clone, Default)]
pub(crate) struct WatchOpts {
    pub(crate) resource_version: Option<String>,
    pub(crate) resource_version_match: Option<String>,
    pub(crate) bookmarks: bool,
    pub(crate) send_initial_events: bool,
}

/// How a watch starts: a stream (the backlog, then the channel), or an error that the real server
/// reports as an ERROR event in a 200 stream because it arises after the request was accepted.
#[derive(Debug)]
pub(crate) enum WatchStart {
    Stream(Vec<WatchMsg>, mpsc::Receiver<WatchMsg>),
    Error(ApiError),
}

/// Registers a watch. A resourceVersion older than the history gives a 410; one newer than the
/// current revision starts a watch that sends only the changes after it (the real server "may wait
/// indefinitely", as its API documentation says), except with `sendInitialEvents`, where the initial
/// state must be at least that fresh: the watch cache waits up to [`FRESHNESS_WAIT`] for it, then
/// fails with "Too large resource version".
pub(crate) async fn watch(
    shared: &Shared,
    def: &ResourceDef,
    filter: Filter,
    opts: &WatchOpts,
) -> Result<WatchStart, ApiError> {
    let rv = opts.resource_version.as_deref().unwrap_or("");
    if opts.send_initial_events {
        if opts.resource_version_match.as_deref() != Some("NotOlderThan") {
            return Err(ApiError::invalid(
                "ListOptions",
                "meta.k8s.io",
                "",
                &[FieldError::forbidden(
                    "resourceVersionMatch",
                    "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                )],
            ));
        }
        if !opts.bookmarks {
            return Err(ApiError::invalid(
                "ListOptions",
                "meta.k8s.io",
                "",
                &[FieldError::forbidden(
                    "allowWatchBookmarks",
                    "sendInitialEvents requires setting allowWatchBookmarks to true",
                )],
            ));
        }
    } else if opts.resource_version_match.is_some() {
        return Err(ApiError::invalid(
            "ListOptions",
            "meta.k8s.io",
            "",
            &[FieldError::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
            )],
        ));
    }
    let wanted = if rv.is_empty() || rv == "0" {
        None
    } else {
        Some(parse_rv_for(rv, RvUse::Read)?)
    };
    let from = if opts.send_initial_events {
        if let Some(w) = wanted
            && let Err(e) = wait_for_revision(shared, w).await
        {
            return Ok(WatchStart::Error(e));
        }
        None
    } else {
        wanted
    };
    let mut store = shared.lock();
    // A watch that starts with the current state ends it with the `initial-events-end` bookmark
    // whenever bookmarks are allowed, with or without `sendInitialEvents`, as the real watch cache does.
    let initial_events_end = from.is_none() && opts.bookmarks;
    match store.watch(
        &def.storage,
        filter,
        from,
        opts.bookmarks,
        initial_events_end,
    ) {
        Ok((backlog, rx)) => Ok(WatchStart::Stream(backlog, rx)),
        Err(e) if e.code == 410 => Ok(WatchStart::Error(e)),
        Err(e) => Err(e),
    }
}

/// How long a read that needs a resourceVersion newer than the current one waits for it, as the real
/// watch cache's `waitUntilFreshAndBlock` (3 s) before "Too large resource version".
pub(crate) const FRESHNESS_WAIT: Duration = Duration::from_secs(3);

/// Waits (up to [`FRESHNESS_WAIT`]) until the store has reached revision `wanted`.
pub(crate) async fn wait_for_revision(shared: &Shared, wanted: u64) -> Result<(), ApiError> {
    let mut revisions = {
        let store = shared.lock();
        if store.rev >= wanted {
            return Ok(());
        }
        store.revisions()
    };
    let reached = tokio::time::timeout(FRESHNESS_WAIT, revisions.wait_for(|r| *r >= wanted)).await;
    match reached {
        Ok(Ok(_)) => Ok(()),
        _ => {
            let current = shared.lock().rev;
            if current >= wanted {
                Ok(())
            } else {
                Err(ApiError::too_large_resource_version(wanted, current))
            }
        }
    }
}

/// The wait a LIST (or GET) with a resourceVersion makes before it is served: "not older than" and
/// "exact" both need the store to have reached it. Continue tokens carry a version already served.
pub(crate) async fn wait_for_read(
    shared: &Shared,
    resource_version: Option<&str>,
    continued: bool,
    use_: RvUse,
) -> Result<(), ApiError> {
    match resource_version {
        None | Some("" | "0") => Ok(()),
        Some(_) if continued => Ok(()),
        Some(rv) => wait_for_revision(shared, parse_rv_for(rv, use_)?).await,
    }
}

/// Runs garbage collection and namespace/CRD cleanup until shutdown.
pub(crate) async fn gc_worker(shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.clone();
    loop {
        tokio::select! {
            () = shared.gc_notify.notified() => {}
            _ = shutdown.changed() => return,
        }
        while gc_step(&shared) {
            // Let requests in between items.
            tokio::task::yield_now().await;
        }
    }
}

/// Processes one queued item; false when the queue is empty.
fn gc_step(shared: &Shared) -> bool {
    let mut store = shared.lock();
    let Some(item) = store.dequeue() else {
        return false;
    };
    process_gc(&mut store, item);
    true
}

fn background() -> DeleteOpts {
    DeleteOpts {
        propagation: Propagation::Background,
        uid: None,
        resource_version: None,
        dry_run: false,
    }
}

fn process_gc(store: &mut Store, item: GcItem) {
    match item {
        GcItem::OwnerGone(uid) => {
            for (s, k) in store.dependents_of(&uid) {
                store.enqueue(GcItem::Dependent(s, k));
            }
        }
        GcItem::Dependent(storage, key) => {
            let Some(obj) = store.get(&storage, &key) else {
                return;
            };
            let owners = meta::owner_uids(obj.value());
            if owners.is_empty() {
                return;
            }
            let alive: Vec<&String> = owners
                .iter()
                .filter(|u| store.owner_alive(u, &key.ns))
                .collect();
            if alive.is_empty() {
                tracing::debug!(resource = %storage, namespace = %key.ns, name = %key.name, "garbage collecting an object whose owners are gone");
                let _ = delete_locked(store, &storage, &key, &background());
            } else if alive.len() < owners.len() {
                let alive: Vec<String> = alive.into_iter().cloned().collect();
                update_locked(store, &storage, &key, |v| {
                    if let Some(Value::Array(refs)) =
                        meta::metadata_mut(v).get_mut("ownerReferences")
                    {
                        refs.retain(|r| {
                            r.get("uid")
                                .and_then(Value::as_str)
                                .is_some_and(|u| alive.iter().any(|a| a == u))
                        });
                    }
                });
            }
        }
        GcItem::Orphan(storage, key) => {
            let Some(obj) = store.get(&storage, &key) else {
                return;
            };
            let uid = meta::meta_str(obj.value(), "uid").to_string();
            for (s, k) in store.dependents_of(&uid) {
                update_locked(store, &s, &k, |v| {
                    let m = meta::metadata_mut(v);
                    if let Some(Value::Array(refs)) = m.get_mut("ownerReferences") {
                        refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid.as_str()));
                        if refs.is_empty() {
                            m.remove("ownerReferences");
                        }
                    }
                });
            }
            remove_finalizer(store, &storage, &key, "orphan");
        }
        GcItem::Foreground(storage, key) => {
            let Some(obj) = store.get(&storage, &key) else {
                return;
            };
            if !meta::is_deleting(obj.value()) {
                return;
            }
            let uid = meta::meta_str(obj.value(), "uid").to_string();
            let mut blocking = false;
            for (s, k) in store.dependents_of(&uid) {
                let Some(dep) = store.get(&s, &k) else {
                    continue;
                };
                let blocks = meta::metadata(dep.value())
                    .and_then(|m| m.get("ownerReferences"))
                    .and_then(Value::as_array)
                    .is_some_and(|refs| {
                        refs.iter().any(|r| {
                            r.get("uid").and_then(Value::as_str) == Some(uid.as_str())
                                && r.get("blockOwnerDeletion").and_then(Value::as_bool)
                                    == Some(true)
                        })
                    });
                blocking |= blocks;
                let _ = delete_locked(store, &s, &k, &background());
            }
            if !blocking {
                remove_finalizer(store, &storage, &key, "foregroundDeletion");
            }
        }
        GcItem::Namespace(ns) => {
            if store.namespace_state(&ns) != Some(true) {
                return;
            }
            let objects = store.objects_in_namespace(&ns);
            for (s, k) in &objects {
                let _ = delete_locked(store, s, k, &background());
            }
            if store.objects_in_namespace(&ns).is_empty() {
                let ns_storage: Arc<str> = Arc::from(NAMESPACES);
                update_locked(store, &ns_storage, &ObjKey::new("", &ns), |v| {
                    if let Some(Value::Array(f)) = v.pointer_mut("/spec/finalizers") {
                        f.retain(|x| x != "kubernetes");
                    }
                });
            }
        }
        GcItem::Crd(name) => {
            let crds: Arc<str> = Arc::from(CRDS);
            let key = ObjKey::new("", &name);
            let Some(crd) = store.get(&crds, &key) else {
                return;
            };
            if !meta::is_deleting(crd.value()) {
                return;
            }
            let group = crd
                .value()
                .pointer("/spec/group")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let plural = crd
                .value()
                .pointer("/spec/names/plural")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let storage = registry::storage_key(&group, &plural);
            store.crd_terminating(&storage);
            let keys: Vec<ObjKey> = store
                .collections
                .get(&storage)
                .map(|c| c.objects.keys().cloned().collect())
                .unwrap_or_default();
            for k in keys {
                let _ = delete_locked(store, &storage, &k, &background());
            }
            if store.crd_terminating(&storage) {
                remove_finalizer(store, &crds, &key, CRD_CLEANUP_FINALIZER);
            }
        }
    }
}

fn remove_finalizer(store: &mut Store, storage: &Arc<str>, key: &ObjKey, finalizer: &str) {
    update_locked(store, storage, key, |v| {
        let m = meta::metadata_mut(v);
        if let Some(Value::Array(f)) = m.get_mut("finalizers") {
            f.retain(|x| x != finalizer);
            if f.is_empty() {
                m.remove("finalizers");
            }
        }
    });
}

/// Sends bookmarks periodically until shutdown.
pub(crate) async fn bookmark_ticker(shared: Arc<Shared>, every: Duration) {
    let mut shutdown = shared.shutdown.clone();
    // The first tick of an interval is immediate; bookmarks start one interval after the server.
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => shared.lock().send_bookmarks(),
            _ = shutdown.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip() {
        let t = encode_continue(42, &ObjKey::new("ns", "name"));
        assert_eq!(
            decode_continue(&t).unwrap(),
            (42, ObjKey::new("ns", "name"))
        );
        assert_eq!(decode_continue("garbage!").unwrap_err().code, 400);
    }
}
