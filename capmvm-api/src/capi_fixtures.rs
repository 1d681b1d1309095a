//! Test support: objects that fill every field of a CRD's schema, generated from CAPI's real CRDs.
//!
//! Hand-picked fixtures miss what CAPI adds in a release (a Node's `nodeInfo.swap` reached
//! `Machine.status` that way); an object generated from the schema has every field, each with a value
//! of the declared type, so a view that cannot read some shape fails a test instead of a watch.
//!
//! The CRDs are read from `$CAPMVM_SHARED_DIR/capi-crds/<version>/`, else from `../shared` next to the
//! workspace root. Enabled by the `test-support` feature; never part of the operator.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

/// The CAPI release whose CRDs the fixtures are generated from.
pub const CAPI_CRD_RELEASE: &str = "v1.14.0";

/// Why a CRD could not be turned into a fixture.
#[derive(Debug, thiserror::Error)]
pub enum FixtureError {
    /// The CRD file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The CRD file is not YAML.
    #[error("parsing {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// The CRD has no schema for the version asked for.
    #[error("{path} has no openAPIV3Schema for version {version}")]
    NoSchema {
        /// The file.
        path: PathBuf,
        /// The version asked for.
        version: String,
    },
}

/// Where CAPI's CRDs are expected: `$CAPMVM_SHARED_DIR/capi-crds/<release>`, else
/// `<workspace>/../shared/capi-crds/<release>`.
pub fn capi_crd_dir() -> PathBuf {
    let shared = std::env::var_os("CAPMVM_SHARED_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared"));
    shared.join("capi-crds").join(CAPI_CRD_RELEASE)
}

/// The CRD in the YAML file `path`.
pub fn read_crd(path: &Path) -> Result<Value, FixtureError> {
    let text = std::fs::read_to_string(path).map_err(|source| FixtureError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    serde_saphyr::from_str(&text).map_err(|e| FixtureError::Parse {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// The `openAPIV3Schema` of `version` in the CRD file `path`.
pub fn crd_schema(path: &Path, version: &str) -> Result<Value, FixtureError> {
    read_crd(path)?["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == version)
        .map(|v| v["schema"]["openAPIV3Schema"].clone())
        .filter(Value::is_object)
        .ok_or_else(|| FixtureError::NoSchema {
            path: path.to_path_buf(),
            version: version.to_string(),
        })
}

/// An object of the CRD in `path` (`version`) with every field of its schema filled, named
/// `name` in namespace `default`.
pub fn full_object(path: &Path, version: &str, name: &str) -> Result<Value, FixtureError> {
    let schema = crd_schema(path, version)?;
    let crd = read_crd(path)?;
    let mut object = fill(&schema);
    object["apiVersion"] = json!(format!(
        "{}/{version}",
        crd["spec"]["group"].as_str().unwrap_or_default()
    ));
    object["kind"] = crd["spec"]["names"]["kind"].clone();
    object["metadata"] = json!({
        "name": name,
        "namespace": "default",
        "uid": "00000000-0000-0000-0000-000000000001",
        "resourceVersion": "1",
        "generation": 1,
        "creationTimestamp": "2026-01-01T00:00:00Z",
        "labels": {"cluster.x-k8s.io/cluster-name": "demo"},
        "annotations": {"example.com/note": "generated"},
    });
    Ok(object)
}

/// A value for `schema` with every property present: enums take their first value, strings their
/// format (date-time, byte, duration) or the field's name padded to `minLength`, arrays one element
/// (or `minItems`), maps one entry, int-or-string an integer, preserved-unknown objects a nested shape.
pub fn fill(schema: &Value) -> Value {
    fill_named(schema, "value")
}

fn fill_named(schema: &Value, name: &str) -> Value {
    if schema["x-kubernetes-int-or-string"] == true {
        return json!(1);
    }
    if let Some(first) = schema["enum"].as_array().and_then(|e| e.first()) {
        return first.clone();
    }
    let ty = schema["type"].as_str().or_else(|| {
        // `anyOf`/`oneOf` without a type of their own: the first alternative decides.
        ["anyOf", "oneOf"]
            .iter()
            .find_map(|k| schema[*k].as_array()?.first()?["type"].as_str())
    });
    match ty {
        Some("object") => object(schema, name),
        None if schema["properties"].is_object() => object(schema, name),
        Some("array") => {
            let count = schema["minItems"].as_u64().unwrap_or(1).max(1);
            let item = fill_named(&schema["items"], name);
            Value::Array((0..count).map(|_| item.clone()).collect())
        }
        Some("string") => string(schema, name),
        Some("integer") => json!(schema["minimum"].as_i64().unwrap_or(0).max(1)),
        Some("number") => json!(schema["minimum"].as_f64().unwrap_or(0.0).max(1.5)),
        Some("boolean") => json!(true),
        _ if schema["x-kubernetes-preserve-unknown-fields"] == true => preserved(),
        _ => json!({}),
    }
}

fn object(schema: &Value, name: &str) -> Value {
    let mut map = Map::new();
    if let Some(properties) = schema["properties"].as_object() {
        for (key, property) in properties {
            map.insert(key.clone(), fill_named(property, key));
        }
    }
    match &schema["additionalProperties"] {
        Value::Object(values) => {
            map.insert(
                format!("{name}-key"),
                fill_named(&Value::Object(values.clone()), name),
            );
        }
        Value::Bool(true) => {
            map.insert(format!("{name}-key"), preserved());
        }
        _ => {}
    }
    if schema["x-kubernetes-preserve-unknown-fields"] == true {
        map.insert("preservedUnknownField".to_string(), preserved());
    }
    Value::Object(map)
}

fn string(schema: &Value, name: &str) -> Value {
    let text = match schema["format"].as_str() {
        Some("date-time") => "2026-01-01T00:00:00Z".to_string(),
        Some("byte") => "Y2FwbXZt".to_string(),
        Some("duration") => "1m0s".to_string(),
        _ => {
            let min = schema["minLength"].as_u64().unwrap_or(0);
            let max = schema["maxLength"].as_u64().unwrap_or(u64::MAX);
            let mut text = format!("{name}-value");
            while (text.len() as u64) < min {
                text.push('x');
            }
            text.chars()
                .take(usize::try_from(max).unwrap_or(usize::MAX))
                .collect()
        }
    };
    Value::String(text)
}

/// What a field that keeps unknown fields may hold: any shape.
fn preserved() -> Value {
    json!({"anyKey": {"nested": [1, "two", true, null, {"deep": 3.5}]}})
}

/// Every property path in `schema` (`spec.bootstrap.dataSecretName`, `status.addresses[].type`), to
/// check a generated object really has them all.
pub fn schema_paths(schema: &Value) -> Vec<String> {
    let mut paths = Vec::new();
    collect_paths(schema, "", &mut paths);
    paths
}

fn collect_paths(schema: &Value, prefix: &str, paths: &mut Vec<String>) {
    if let Some(properties) = schema["properties"].as_object() {
        for (key, property) in properties {
            let path = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            paths.push(path.clone());
            collect_paths(property, &path, paths);
        }
    }
    if schema["items"].is_object() {
        collect_paths(&schema["items"], &format!("{prefix}[]"), paths);
    }
}

/// Whether `object` holds a value at `path` (as [`schema_paths`] writes them).
pub fn has_path(object: &Value, path: &str) -> bool {
    let mut current = vec![object];
    for part in path.split('.') {
        let (key, array) = match part.strip_suffix("[]") {
            Some(key) => (key, true),
            None => (part, false),
        };
        let mut next = Vec::new();
        for value in current {
            let Some(v) = value.get(key) else {
                return false;
            };
            if array {
                match v.as_array() {
                    Some(items) if !items.is_empty() => next.extend(items),
                    _ => return false,
                }
            } else {
                next.push(v);
            }
        }
        current = next;
    }
    true
}

/// `object` with the value at `path` (as [`schema_paths`] writes them) replaced by one of another
/// shape: a string where an object or array was, an object where anything else was.
pub fn with_wrong_shape(object: &Value, path: &str) -> Value {
    let mut copy = object.clone();
    let parts: Vec<&str> = path.split('.').collect();
    replace(&mut copy, &parts);
    copy
}

fn replace(value: &mut Value, parts: &[&str]) {
    let Some((first, rest)) = parts.split_first() else {
        *value = match value {
            Value::Object(_) | Value::Array(_) => json!("an unexpected string"),
            _ => json!({"unexpected": ["shape", 1]}),
        };
        return;
    };
    let (key, array) = match first.strip_suffix("[]") {
        Some(key) => (key, true),
        None => (*first, false),
    };
    let Some(child) = value.get_mut(key) else {
        return;
    };
    match (array, child) {
        (true, Value::Array(items)) if !rest.is_empty() => {
            for item in items {
                replace(item, rest);
            }
        }
        (true, child) => replace(child, &[]),
        (false, child) => replace(child, rest),
    }
}
