//! The scale subresource of custom resources: `{resource}/{name}/scale` as an `autoscaling/v1` Scale
//! read from the CRD's `specReplicasPath`, `statusReplicasPath` and `labelSelectorPath`, and written
//! through to `specReplicasPath` (what `kubectl scale` and cluster-autoscaler use).

use serde_json::{Map, Value, json};

use super::error::{ApiError, FieldError};
use super::meta;
use super::ops::{self, Shared, Sub, WriteParams};
use super::patch::{self, PatchType};
use super::registry::{ResourceDef, ScalePaths};

/// How often a write without a resourceVersion precondition is retried when another writer wins.
const RETRIES: usize = 8;

fn paths(def: &ResourceDef) -> Result<&ScalePaths, ApiError> {
    def.scale.as_ref().ok_or_else(ApiError::path_not_found)
}

/// `.spec.replicas` → `["spec", "replicas"]`, as apiextensions-apiserver splits these paths.
fn segments(path: &str) -> impl Iterator<Item = &str> {
    path.trim_start_matches('.').split('.')
}

fn nested<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    segments(path).try_fold(obj, |v, seg| v.get(seg))
}

/// An integer at `path`, 0 when absent; another type is the real server's accessor error (500).
fn replicas_at(obj: &Value, path: &str) -> Result<i64, ApiError> {
    match nested(obj, path) {
        None | Some(Value::Null) => Ok(0),
        Some(v) => v.as_i64().ok_or_else(|| {
            ApiError::internal(format!(
                "{path} accessor error: {v} is of the type {}, expected int64",
                json_type(v)
            ))
        }),
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Bool(_) => "bool",
        Value::Number(_) => "float64",
        Value::String(_) => "string",
        Value::Array(_) => "[]interface {}",
        Value::Object(_) => "map[string]interface {}",
        Value::Null => "nil",
    }
}

fn set_nested(obj: &mut Value, path: &str, value: Value) -> Result<(), ApiError> {
    let segs: Vec<&str> = segments(path).collect();
    let mut cur = obj;
    for (i, seg) in segs.iter().enumerate() {
        let Value::Object(map) = cur else {
            return Err(ApiError::internal(format!(
                "{path}: value cannot be set because {} is not a map",
                segs[..i].join(".")
            )));
        };
        if i + 1 == segs.len() {
            map.insert((*seg).to_string(), value);
            return Ok(());
        }
        cur = map
            .entry((*seg).to_string())
            .or_insert_with(|| Value::Object(Map::new()));
    }
    Ok(())
}

/// The Scale of a custom resource, as apiextensions-apiserver's `scaleFromCustomResource` builds it.
fn scale_of(def: &ResourceDef, obj: &Value) -> Result<Value, ApiError> {
    let paths = paths(def)?;
    let mut md = Map::new();
    for key in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        if let Some(v) = obj.pointer(&format!("/metadata/{key}")) {
            md.insert(key.into(), v.clone());
        }
    }
    let mut status = Map::new();
    status.insert(
        "replicas".into(),
        json!(replicas_at(obj, &paths.status_replicas)?),
    );
    if let Some(selector) = paths
        .label_selector
        .as_deref()
        .and_then(|p| nested(obj, p))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    {
        status.insert("selector".into(), json!(selector));
    }
    let mut spec = Map::new();
    let replicas = replicas_at(obj, &paths.spec_replicas)?;
    if replicas != 0 {
        spec.insert("replicas".into(), json!(replicas));
    }
    Ok(json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": md,
        "spec": spec,
        "status": status,
    }))
}

/// GET: the object's Scale.
pub(crate) fn get(
    shared: &Shared,
    def: &ResourceDef,
    ns: Option<&str>,
    name: &str,
) -> Result<Value, ApiError> {
    let stored = ops::get(shared, def, ns, name)?;
    scale_of(def, stored.value())
}

/// PUT: the replicas of `scale` written to the object (its resourceVersion, when given, is a
/// precondition).
pub(crate) fn update(
    shared: &Shared,
    def: &std::sync::Arc<ResourceDef>,
    ns: Option<&str>,
    name: &str,
    scale: &Value,
    params: &WriteParams,
) -> Result<Value, ApiError> {
    let (replicas, precondition) = checked(scale, name)?;
    write(shared, def, ns, name, replicas, precondition, params)
}

/// PATCH: the patch applied to the current Scale, then written as a PUT; a patch that does not set
/// `metadata.resourceVersion` is retried on concurrent writes, as on a real server.
pub(crate) fn patch(
    shared: &Shared,
    def: &std::sync::Arc<ResourceDef>,
    ns: Option<&str>,
    name: &str,
    ptype: PatchType,
    body: &[u8],
    params: &WriteParams,
) -> Result<Value, ApiError> {
    for _ in 0..RETRIES {
        let current = get(shared, def, ns, name)?;
        let mut patched = current.clone();
        match ptype {
            PatchType::Json => patch::json(&mut patched, body)?,
            // A Scale has no lists, so a strategic merge patch merges as a merge patch does.
            PatchType::Merge | PatchType::Strategic => patch::merge(&mut patched, body)?,
            PatchType::Apply => {
                return Err(ApiError::unsupported_media_type(
                    "server-side apply is not supported by the API emulator",
                ));
            }
        }
        let (replicas, precondition) = checked(&patched, name)?;
        let precondition =
            precondition.filter(|rv| rv != meta::meta_str(&current, "resourceVersion"));
        let pinned = precondition.is_some();
        match write(shared, def, ns, name, replicas, precondition, params) {
            Err(e) if e.code == 409 && !pinned => {}
            other => return other,
        }
    }
    Err(ApiError::modified_conflict(&def.plural, &def.group, name))
}

/// The replicas and resourceVersion of a Scale body, checked as the real server checks a Scale.
fn checked(scale: &Value, name: &str) -> Result<(i64, Option<String>), ApiError> {
    if !scale.is_object() {
        return Err(ApiError::bad_request(
            "the body of a scale request must be a Scale object",
        ));
    }
    if let Some(kind) = scale.get("kind").and_then(Value::as_str)
        && kind != "Scale"
    {
        return Err(ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type Scale): kind {kind:?}"
        )));
    }
    let body_name = meta::meta_str(scale, "name");
    if !body_name.is_empty() && body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    let replicas = match scale.pointer("/spec/replicas") {
        None | Some(Value::Null) => 0,
        Some(v) => v
            .as_i64()
            .filter(|r| i32::try_from(*r).is_ok())
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "Scale in version \"v1\" cannot be handled as a Scale: spec.replicas: {v} is not a 32-bit integer"
                ))
            })?,
    };
    if replicas < 0 {
        return Err(ApiError::invalid(
            "Scale",
            "autoscaling",
            name,
            &[FieldError::invalid(
                "spec.replicas",
                &json!(replicas),
                "must be greater than or equal to 0",
            )],
        ));
    }
    let rv = meta::meta_str(scale, "resourceVersion");
    Ok((replicas, (!rv.is_empty()).then(|| rv.to_string())))
}

fn write(
    shared: &Shared,
    def: &std::sync::Arc<ResourceDef>,
    ns: Option<&str>,
    name: &str,
    replicas: i64,
    precondition: Option<String>,
    params: &WriteParams,
) -> Result<Value, ApiError> {
    let spec_path = paths(def)?.spec_replicas.clone();
    for _ in 0..RETRIES {
        let current = ops::get(shared, def, ns, name)?;
        let mut obj = ops::view(def, current.value()).into_owned();
        set_nested(&mut obj, &spec_path, json!(replicas))?;
        let rv = precondition
            .clone()
            .unwrap_or_else(|| current.rv.to_string());
        meta::metadata_mut(&mut obj).insert("resourceVersion".into(), Value::String(rv));
        match ops::update(shared, def, ns, name, Sub::Main, obj, params) {
            Ok(res) => return scale_of(def, res.written.object().value()),
            Err(e) if e.code == 409 && precondition.is_none() => {}
            Err(e) => return Err(e),
        }
    }
    Err(ApiError::modified_conflict(&def.plural, &def.group, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_paths_are_read_and_written() {
        let mut obj = json!({"spec": {"replicas": 3}, "status": {}});
        assert_eq!(replicas_at(&obj, ".spec.replicas").unwrap(), 3);
        assert_eq!(replicas_at(&obj, ".status.replicas").unwrap(), 0);
        set_nested(&mut obj, ".status.deep.replicas", json!(2)).unwrap();
        assert_eq!(obj["status"]["deep"]["replicas"], 2);
        assert_eq!(
            replicas_at(&json!({"spec": {"replicas": "x"}}), ".spec.replicas")
                .unwrap_err()
                .code,
            500
        );
        assert!(set_nested(&mut json!({"spec": 1}), ".spec.replicas", json!(1)).is_err());
    }
}
