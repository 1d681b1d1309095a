//! `meta.k8s.io/v1` Table output (what `kubectl get` asks for) and `PartialObjectMetadata`.

use serde_json::{Map, Value, json};

use super::meta;
use super::registry::{CellSource, Column, ResourceDef};

/// What a Table row carries in `object` (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IncludeObject {
    None,
    Metadata,
    Object,
}

/// `duration.HumanDuration` of apimachinery, which `kubectl get` shows in `AGE` columns.
pub(crate) fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    if secs < 0 {
        return "0s".into();
    }
    if secs < 60 * 2 {
        return format!("{secs}s");
    }
    let minutes = secs / 60;
    if minutes < 10 {
        let s = secs % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = secs / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{dy}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

fn age(ts: &str) -> Value {
    match meta::parse_time(ts) {
        Some(t) => {
            let secs = jiff::Timestamp::now().as_second() - t.as_second();
            Value::String(human_duration(secs))
        }
        None => Value::String("<invalid>".into()),
    }
}

/// Formats a value the way the real table convertor prints a `string` column.
fn as_string_cell(v: &Value) -> Value {
    match v {
        Value::String(s) => Value::String(s.clone()),
        Value::Null => Value::Null,
        Value::Bool(b) => Value::String(b.to_string()),
        Value::Number(n) => Value::String(n.to_string()),
        other => Value::String(other.to_string()),
    }
}

fn cell(col: &Column, obj: &Value) -> Value {
    match &col.source {
        CellSource::DataCount => {
            let n = obj
                .get("data")
                .and_then(Value::as_object)
                .map_or(0, Map::len)
                + obj
                    .get("binaryData")
                    .and_then(Value::as_object)
                    .map_or(0, Map::len);
            json!(n)
        }
        CellSource::EventObject => {
            let r = obj.get("involvedObject").or_else(|| obj.get("regarding"));
            let kind = r
                .and_then(|r| r.get("kind"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_ascii_lowercase();
            let name = r
                .and_then(|r| r.get("name"))
                .and_then(Value::as_str)
                .unwrap_or("");
            Value::String(format!("{kind}/{name}"))
        }
        CellSource::EventLastSeen => {
            let ts = ["lastTimestamp", "deprecatedLastTimestamp", "eventTime"]
                .iter()
                .find_map(|f| obj.get(*f).and_then(Value::as_str))
                .or_else(|| {
                    meta::metadata(obj)
                        .and_then(|m| m.get("creationTimestamp"))
                        .and_then(Value::as_str)
                });
            ts.map_or(Value::String("<unknown>".into()), age)
        }
        CellSource::NodeStatus => Value::String(node_status(obj)),
        CellSource::NodeRoles => Value::String(node_roles(obj)),
        CellSource::Path(path) => {
            let found = path.find(obj);
            let Some(first) = found.first() else {
                return Value::Null;
            };
            match col.ty.as_str() {
                "date" => match first.as_str() {
                    Some(s) => age(s),
                    None => Value::String("<invalid>".into()),
                },
                "integer" => match first {
                    Value::Number(n) => n
                        .as_i64()
                        .map_or_else(|| json!(n.as_f64().unwrap_or(0.0) as i64), |i| json!(i)),
                    _ => Value::Null,
                },
                "number" => match first {
                    Value::Number(_) => (*first).clone(),
                    _ => Value::Null,
                },
                "boolean" => match first {
                    Value::Bool(_) => (*first).clone(),
                    _ => Value::Null,
                },
                _ => as_string_cell(first),
            }
        }
    }
}

/// The STATUS kubectl prints for a Node (the printer of `pkg/printers/internalversion`).
fn node_status(obj: &Value) -> String {
    let ready = obj
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.get("type").and_then(Value::as_str) == Some("Ready"))
        })
        .and_then(|c| c.get("status").and_then(Value::as_str));
    let mut status = match ready {
        Some("True") => "Ready".to_string(),
        Some(_) => "NotReady".to_string(),
        None => "Unknown".to_string(),
    };
    if obj.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
        status.push_str(",SchedulingDisabled");
    }
    status
}

/// The ROLES kubectl prints for a Node: `node-role.kubernetes.io/<role>` and `kubernetes.io/role`
/// labels, sorted and comma-separated.
fn node_roles(obj: &Value) -> String {
    let mut roles: Vec<&str> = meta::metadata(obj)
        .and_then(|m| m.get("labels"))
        .and_then(Value::as_object)
        .map(|labels| {
            labels
                .iter()
                .filter_map(|(k, v)| {
                    if let Some(role) = k.strip_prefix("node-role.kubernetes.io/") {
                        Some(role)
                    } else if k == "kubernetes.io/role" {
                        v.as_str()
                    } else {
                        None
                    }
                })
                .filter(|r| !r.is_empty())
                .collect()
        })
        .unwrap_or_default();
    roles.sort_unstable();
    roles.dedup();
    if roles.is_empty() {
        "<none>".to_string()
    } else {
        roles.join(",")
    }
}

/// The `PartialObjectMetadata` of an object.
pub(crate) fn partial_metadata(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({}))
    })
}

/// The column definitions: `Name` first, then the resource's columns.
pub(crate) fn column_definitions(def: &ResourceDef) -> Vec<Value> {
    let mut out = Vec::new();
    let name_first = def.builtin != Some(super::registry::Builtin::Event)
        && def.builtin != Some(super::registry::Builtin::EventV1);
    if name_first {
        out.push(json!({
            "name": "Name", "type": "string", "format": "name",
            "description": "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names",
            "priority": 0
        }));
    }
    for c in &def.columns {
        out.push(json!({
            "name": c.name, "type": if c.ty == "date" { "date" } else { c.ty.as_str() }, "format": c.format,
            "description": c.description, "priority": c.priority
        }));
    }
    out
}

/// One row.
pub(crate) fn row(def: &ResourceDef, obj: &Value, include: IncludeObject) -> Value {
    let mut cells = Vec::new();
    let name_first = def.builtin != Some(super::registry::Builtin::Event)
        && def.builtin != Some(super::registry::Builtin::EventV1);
    if name_first {
        cells.push(Value::String(meta::meta_str(obj, "name").to_string()));
    }
    for c in &def.columns {
        cells.push(cell(c, obj));
    }
    let mut r = Map::new();
    r.insert("cells".into(), Value::Array(cells));
    match include {
        IncludeObject::None => {}
        IncludeObject::Metadata => {
            r.insert("object".into(), partial_metadata(obj));
        }
        IncludeObject::Object => {
            r.insert("object".into(), obj.clone());
        }
    }
    Value::Object(r)
}

/// A Table of objects.
pub(crate) fn table(
    def: &ResourceDef,
    objects: &[Value],
    include: IncludeObject,
    resource_version: Option<u64>,
    continue_token: Option<&str>,
    with_columns: bool,
) -> Value {
    let mut md = Map::new();
    if let Some(rv) = resource_version {
        md.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
    if let Some(c) = continue_token {
        md.insert("continue".into(), Value::String(c.into()));
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": md,
        "columnDefinitions": if with_columns { column_definitions(def) } else { Vec::new() },
        "rows": objects.iter().map(|o| row(def, o, include)).collect::<Vec<_>>()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations_match_apimachinery() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(119), "119s");
        assert_eq!(human_duration(125), "2m5s");
        assert_eq!(human_duration(600), "10m");
        assert_eq!(human_duration(3 * 3600 + 120), "3h2m");
        assert_eq!(human_duration(30 * 3600), "30h");
        assert_eq!(human_duration(3 * 86400 + 3600), "3d1h");
        assert_eq!(human_duration(100 * 86400), "100d");
    }
}
