//! Server-side apply for `coordination.k8s.io/v1` Leases only (kube-lease-manager takes orphaned leases
//! with it), with the field-ownership conflicts that make it a lock: fields are owned by managers in
//! `metadata.managedFields`, and an apply that changes a field another manager owns is a 409 Conflict
//! unless forced. Every other kind answers apply with 415.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::error::{ApiError, FieldError};
use super::meta;
use super::ops::{self, Shared, Sub, WriteParams, WriteResult};
use super::registry::ResourceDef;
use super::store::{CommitError, ObjKey};

type Paths = BTreeSet<String>;

/// One `managedFields` entry.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    manager: String,
    operation: String,
    paths: Paths,
}

/// The leaf fields of an object that ownership is tracked for (everything but identity metadata).
fn leaf_paths(obj: &Value) -> Paths {
    let mut out = Paths::new();
    if let Some(m) = obj.as_object() {
        for (k, v) in m {
            match k.as_str() {
                "apiVersion" | "kind" | "status" => {}
                "metadata" => {
                    for sub in ["labels", "annotations"] {
                        if let Some(Value::Object(mm)) = v.get(sub) {
                            for key in mm.keys() {
                                out.insert(format!("metadata.{sub}.{key}"));
                            }
                        }
                    }
                }
                _ => flatten(v, k, &mut out),
            }
        }
    }
    out
}

fn flatten(v: &Value, prefix: &str, out: &mut Paths) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, c) in m {
                flatten(c, &format!("{prefix}.{k}"), out);
            }
        }
        Value::Null => {}
        _ => {
            out.insert(prefix.to_string());
        }
    }
}

fn split(path: &str) -> Vec<&str> {
    // Label and annotation keys may contain dots; they are the last component.
    if let Some(rest) = path.strip_prefix("metadata.labels.") {
        return vec!["metadata", "labels", rest];
    }
    if let Some(rest) = path.strip_prefix("metadata.annotations.") {
        return vec!["metadata", "annotations", rest];
    }
    path.split('.').collect()
}

fn get_path<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = v;
    for p in split(path) {
        cur = cur.get(p)?;
    }
    Some(cur)
}

fn remove_path(v: &mut Value, path: &str) {
    let parts = split(path);
    let Some((last, parents)) = parts.split_last() else {
        return;
    };
    let mut cur = v;
    for p in parents {
        match cur.get_mut(*p) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Value::Object(m) = cur {
        m.remove(*last);
    }
}

fn fields_v1(paths: &Paths) -> Value {
    let mut root = Map::new();
    for p in paths {
        let mut cur = &mut root;
        for part in split(p) {
            let entry = cur.entry(format!("f:{part}")).or_insert_with(|| json!({}));
            if !entry.is_object() {
                *entry = json!({});
            }
            let Value::Object(next) = entry else { break };
            cur = next;
        }
    }
    Value::Object(root)
}

fn paths_of_fields(v: &Value, prefix: &str, out: &mut Paths) {
    let Some(m) = v.as_object() else { return };
    let children: Vec<(&String, &Value)> = m.iter().filter(|(k, _)| k.starts_with("f:")).collect();
    if children.is_empty() && !prefix.is_empty() {
        out.insert(prefix.to_string());
        return;
    }
    for (k, c) in children {
        let name = &k[2..];
        let p = if prefix.is_empty() {
            name.to_string()
        } else {
            format!("{prefix}.{name}")
        };
        paths_of_fields(c, &p, out);
    }
}

fn read_entries(obj: &Value) -> Vec<Entry> {
    meta::metadata(obj)
        .and_then(|m| m.get("managedFields"))
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .map(|e| {
                    let mut paths = Paths::new();
                    if let Some(f) = e.get("fieldsV1") {
                        paths_of_fields(f, "", &mut paths);
                    }
                    Entry {
                        manager: e
                            .get("manager")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                        operation: e
                            .get("operation")
                            .and_then(Value::as_str)
                            .unwrap_or("Update")
                            .to_string(),
                        paths,
                    }
                })
                .collect()
        })
        .unwrap_or_default()
}

fn write_entries(obj: &mut Value, entries: &[Entry], api_version: &str) {
    let now = meta::now_rfc3339();
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.paths.is_empty())
        .map(|e| {
            json!({
                "manager": e.manager, "operation": e.operation, "apiVersion": api_version, "time": now,
                "fieldsType": "FieldsV1", "fieldsV1": fields_v1(&e.paths)
            })
        })
        .collect();
    let m = meta::metadata_mut(obj);
    if list.is_empty() {
        m.remove("managedFields");
    } else {
        m.insert("managedFields".into(), Value::Array(list));
    }
}

/// Records the fields an update (PUT, PATCH) or create changed as owned by `(manager, Update)`.
pub(crate) fn track_update(old: Option<&Value>, new: &mut Value, manager: &str) {
    let mut entries = old.map(read_entries).unwrap_or_default();
    let new_paths = leaf_paths(new);
    let changed: Paths = new_paths
        .iter()
        .filter(|p| old.is_none_or(|o| get_path(o, p) != get_path(new, p)))
        .cloned()
        .collect();
    for e in &mut entries {
        e.paths.retain(|p| {
            new_paths.contains(p)
                && (!changed.contains(p) || (e.manager == manager && e.operation == "Update"))
        });
    }
    if !changed.is_empty() {
        match entries
            .iter_mut()
            .find(|e| e.manager == manager && e.operation == "Update")
        {
            Some(e) => e.paths.extend(changed),
            None => entries.push(Entry {
                manager: manager.to_string(),
                operation: "Update".into(),
                paths: changed,
            }),
        }
    }
    let api_version = new
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("coordination.k8s.io/v1")
        .to_string();
    write_entries(new, &entries, &api_version);
}

fn merge_into(target: &mut Value, config: &Value) {
    match (target, config) {
        (Value::Object(t), Value::Object(c)) => {
            for (k, v) in c {
                if v.is_null() {
                    continue;
                }
                match t.get_mut(k) {
                    Some(existing) if existing.is_object() && v.is_object() => {
                        merge_into(existing, v)
                    }
                    _ => {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (t, c) => *t = c.clone(),
    }
}

fn decode_config(def: &ResourceDef, name: &str, body: &[u8]) -> Result<Value, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
    let config: Value = serde_saphyr::from_str(text)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
    if !config.is_object() {
        return Err(ApiError::bad_request(
            "error decoding YAML: the apply configuration must be an object",
        ));
    }
    if config.get("apiVersion").and_then(Value::as_str) != Some(def.api_version().as_str())
        || config.get("kind").and_then(Value::as_str) != Some(def.kind.as_str())
    {
        return Err(ApiError::bad_request(format!(
            "the apply configuration must have apiVersion {:?} and kind {:?}",
            def.api_version(),
            def.kind
        )));
    }
    let cfg_name = meta::meta_str(&config, "name");
    if !cfg_name.is_empty() && cfg_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({cfg_name}) does not match the name on the URL ({name})"
        )));
    }
    Ok(config)
}

/// `PATCH` with `application/apply-patch+yaml` on a Lease.
#[allow(clippy::too_many_arguments)]
pub(crate) fn apply_lease(
    shared: &Shared,
    def: &Arc<ResourceDef>,
    ns: Option<&str>,
    name: &str,
    body: &[u8],
    manager: &str,
    force: bool,
    params: &WriteParams,
) -> Result<WriteResult, ApiError> {
    if manager.is_empty() {
        return Err(ApiError::invalid(
            &def.kind,
            &def.group,
            name,
            &[FieldError::required_detail(
                "fieldManager",
                "is required for apply patch",
            )],
        ));
    }
    let config = decode_config(def, name, body)?;
    let config_paths = leaf_paths(&config);
    let key = ObjKey::new(ns.unwrap_or(""), name);
    for _ in 0..64 {
        let current = { shared.lock().get(&def.storage, &key) };
        let Some(current) = current else {
            let mut obj = config.clone();
            {
                let m = meta::metadata_mut(&mut obj);
                m.insert("name".into(), json!(name));
                m.remove("managedFields");
            }
            let entries = [Entry {
                manager: manager.into(),
                operation: "Apply".into(),
                paths: config_paths.clone(),
            }];
            write_entries(&mut obj, &entries, &def.api_version());
            let mut params = params.clone();
            params.field_manager = None;
            return ops::create(shared, def, ns, obj, &params);
        };
        let mut entries = read_entries(current.value());
        let mut conflicts: Vec<(String, String)> = Vec::new();
        for p in &config_paths {
            if get_path(current.value(), p) == get_path(&config, p) {
                continue;
            }
            for e in &entries {
                if !(e.manager == manager && e.operation == "Apply") && e.paths.contains(p) {
                    conflicts.push((e.manager.clone(), p.clone()));
                }
            }
        }
        if !conflicts.is_empty() && !force {
            let n = conflicts.len();
            let list: Vec<String> = conflicts
                .iter()
                .map(|(m, p)| format!("conflict with {m:?} using {}: .{p}", def.api_version()))
                .collect();
            let mut err = ApiError::conflict(
                &def.plural,
                &def.group,
                name,
                &format!(
                    "Apply failed with {n} conflict{}: {}",
                    if n == 1 { "" } else { "s" },
                    list.join("\n")
                ),
            );
            err.message = format!(
                "Apply failed with {n} conflict{}: {}",
                if n == 1 { "" } else { "s" },
                list.join("\n")
            );
            if let Some(d) = &mut err.details {
                let causes: Vec<Value> = conflicts
                    .iter()
                    .map(|(m, p)| {
                        json!({"reason": "FieldManagerConflict", "message": format!("conflict with {m:?} using {}", def.api_version()), "field": format!(".{p}")})
                    })
                    .collect();
                d.insert("causes".into(), Value::Array(causes));
            }
            return Err(err);
        }
        let mut new = current.value().clone();
        // Fields this manager applied before and no longer applies are removed unless someone else owns them.
        let previous: Paths = entries
            .iter()
            .find(|e| e.manager == manager && e.operation == "Apply")
            .map(|e| e.paths.clone())
            .unwrap_or_default();
        for p in previous.difference(&config_paths) {
            let shared_owner = entries
                .iter()
                .any(|e| !(e.manager == manager && e.operation == "Apply") && e.paths.contains(p));
            if !shared_owner {
                remove_path(&mut new, p);
            }
        }
        merge_into(&mut new, &config);
        for e in &mut entries {
            if e.manager == manager && e.operation == "Apply" {
                continue;
            }
            // Forced fields change owner.
            e.paths.retain(|p| !conflicts.iter().any(|(_, cp)| cp == p));
        }
        match entries
            .iter_mut()
            .find(|e| e.manager == manager && e.operation == "Apply")
        {
            Some(e) => e.paths = config_paths.clone(),
            None => entries.push(Entry {
                manager: manager.into(),
                operation: "Apply".into(),
                paths: config_paths.clone(),
            }),
        }
        let mut warnings = Vec::new();
        let mut prepared = ops::prepare_update(
            shared,
            def,
            Sub::Main,
            &current,
            new,
            Vec::new(),
            params,
            &mut warnings,
        )?;
        write_entries(&mut prepared, &entries, &def.api_version());
        if params.dry_run {
            let bytes = super::store::encode(&prepared);
            return Ok(WriteResult {
                written: super::store::Written::Stored(Arc::new(super::store::Stored::detached(
                    prepared, bytes,
                ))),
                warnings,
                created: false,
            });
        }
        let mut store = shared.lock();
        match store.replace(&def.storage, &key, &current, prepared) {
            Ok(written) => {
                drop(store);
                return Ok(WriteResult {
                    written,
                    warnings,
                    created: false,
                });
            }
            Err(CommitError::Stale) => continue,
            Err(CommitError::Api(e)) => return Err(e),
        }
    }
    Err(ApiError::modified_conflict(&def.plural, &def.group, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_v1_round_trip() {
        let obj = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "l", "labels": {"a.b/c": "x"}}, "spec": {"holderIdentity": "me", "leaseDurationSeconds": 5}});
        let paths = leaf_paths(&obj);
        assert_eq!(
            paths.iter().cloned().collect::<Vec<_>>(),
            vec![
                "metadata.labels.a.b/c",
                "spec.holderIdentity",
                "spec.leaseDurationSeconds"
            ]
        );
        let f = fields_v1(&paths);
        let mut back = Paths::new();
        paths_of_fields(&f, "", &mut back);
        // Label keys with dots come back split; ownership of those is approximate, which Leases never use.
        assert!(back.contains("spec.holderIdentity"));
        assert!(back.contains("spec.leaseDurationSeconds"));
    }

    #[test]
    fn updates_take_ownership_of_what_they_change() {
        let old = json!({"spec": {"holderIdentity": "a", "renewTime": "t1"}, "metadata": {"managedFields": [
            {"manager": "a", "operation": "Apply", "fieldsV1": {"f:spec": {"f:holderIdentity": {}, "f:renewTime": {}}}}]}});
        let mut new = json!({"spec": {"holderIdentity": "a", "renewTime": "t2"}, "metadata": {}});
        new["metadata"]["managedFields"] = old["metadata"]["managedFields"].clone();
        track_update(Some(&old), &mut new, "b");
        let entries = read_entries(&new);
        assert_eq!(entries.len(), 2);
        assert!(entries[0].paths.contains("spec.holderIdentity"));
        assert!(!entries[0].paths.contains("spec.renewTime"));
        assert!(entries[1].paths.contains("spec.renewTime"));
    }
}
