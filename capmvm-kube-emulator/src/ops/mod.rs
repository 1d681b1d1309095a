//! The API operations with the rules of the real server's generic registry: what they share here (the
//! shared state, write parameters, decoding, schemas, resourceVersions), and one file per kind of
//! operation: `create`, `write` (update and patch, through one commit path), `delete` and `read` (get's
//! siblings: list and watch setup). The background work (garbage collector, bookmarks) is in
//! `crate::background`.

mod create;
mod delete;
mod read;
mod write;

pub(crate) use create::create;
pub(crate) use delete::{DeleteOpts, delete, delete_locked, update_locked};
pub(crate) use read::{ListOpts, WatchOpts, WatchStart, list, wait_for_read, watch};
pub(crate) use write::{Committed, commit, patch, prepare_update, update};

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
    CRD_CLEANUP_FINALIZER, CommitError, Filter, NAMESPACES, ObjKey, Propagation, Store, Stored,
    WatchMsg, Written, removable,
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
        errs.retain(|e| super::schema::still_an_error(e, obj, old));
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
