//! Server-side apply and field ownership, as the real server's field manager keeps them: every write
//! records the fields it set under its manager in `metadata.managedFields` (operation `Update`, per
//! subresource), and `application/apply-patch+yaml` merges a configuration into the object by the
//! schema's rules, owns what it names (operation `Apply`), removes what its manager stopped applying
//! and no one else owns, and is refused with 409 Conflict when it changes a field another manager owns
//! (unless `force=true`, which takes the field over).
//!
//! `fieldpath` names fields and sets of them, `typed` walks objects with their schema's merge rules.

mod fieldpath;
mod typed;

use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::error::{ApiError, FieldError};
use super::meta;
use super::ops::{self, Shared, Sub, WriteParams, WriteResult};
use super::registry::ResourceDef;
use super::store::ObjKey;
use fieldpath::{Pe, Set};
use typed::Ty;

/// Update managers kept apart; older ones are merged into [`ANCIENT`], as the real server caps them.
const MAX_UPDATE_MANAGERS: usize = 10;
const ANCIENT: &str = "ancient-changes";

/// The manager a write without `fieldManager` and without a User-Agent is recorded under.
pub(crate) const UNKNOWN_MANAGER: &str = "unknown";

/// One `managedFields` entry.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    manager: String,
    apply: bool,
    api_version: String,
    subresource: String,
    time: Option<String>,
    set: Set,
}

impl Entry {
    /// Whether this is the entry of `manager` for this operation and subresource (an update's also
    /// by its apiVersion, as the real server keys them).
    fn is(&self, manager: &str, apply: bool, subresource: &str, api_version: &str) -> bool {
        self.manager == manager
            && self.apply == apply
            && self.subresource == subresource
            && (apply || self.api_version == api_version)
    }

    /// As conflicts name a manager: `"m"`, `"m" with subresource "status"`, and for an update
    /// `... using apps/v1`.
    fn shown(&self) -> String {
        let mut s = format!("{:?}", self.manager);
        if !self.subresource.is_empty() {
            s.push_str(&format!(" with subresource {:?}", self.subresource));
        }
        if !self.apply {
            s.push_str(&format!(" using {}", self.api_version));
        }
        s
    }
}

fn read_entries(obj: &Value) -> Option<Vec<Entry>> {
    let list = meta::metadata(obj)?.get("managedFields")?.as_array()?;
    let mut out = Vec::with_capacity(list.len());
    for e in list {
        let m = e.as_object()?;
        let str_of = |k: &str| m.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let set = match m.get("fieldsV1") {
            Some(f) => Set::from_fields_v1(f)?,
            None => Set::default(),
        };
        out.push(Entry {
            manager: str_of("manager"),
            apply: str_of("operation") == "Apply",
            api_version: str_of("apiVersion"),
            subresource: str_of("subresource"),
            time: m.get("time").and_then(Value::as_str).map(str::to_string),
            set,
        });
    }
    Some(out)
}

/// Writes the entries as the real server lists them: applies first, then by time, manager,
/// apiVersion and subresource; empty ones dropped, updates beyond the cap merged.
fn write_entries(obj: &mut Value, mut entries: Vec<Entry>) {
    entries.retain(|e| !e.set.is_empty());
    cap_updates(&mut entries);
    entries.sort_by(|a, b| {
        (
            !a.apply,
            &a.time,
            &a.manager,
            &a.api_version,
            &a.subresource,
        )
            .cmp(&(
                !b.apply,
                &b.time,
                &b.manager,
                &b.api_version,
                &b.subresource,
            ))
    });
    let list: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut m = Map::new();
            m.insert("manager".into(), json!(e.manager));
            m.insert(
                "operation".into(),
                json!(if e.apply { "Apply" } else { "Update" }),
            );
            m.insert("apiVersion".into(), json!(e.api_version));
            if let Some(t) = &e.time {
                m.insert("time".into(), json!(t));
            }
            m.insert("fieldsType".into(), json!("FieldsV1"));
            m.insert("fieldsV1".into(), e.set.to_fields_v1());
            if !e.subresource.is_empty() {
                m.insert("subresource".into(), json!(e.subresource));
            }
            Value::Object(m)
        })
        .collect();
    let m = meta::metadata_mut(obj);
    if list.is_empty() {
        m.remove("managedFields");
    } else {
        m.insert("managedFields".into(), Value::Array(list));
    }
}

fn cap_updates(entries: &mut Vec<Entry>) {
    let updates = entries.iter().filter(|e| !e.apply).count();
    if updates <= MAX_UPDATE_MANAGERS {
        return;
    }
    let mut by_age: Vec<usize> = (0..entries.len()).filter(|i| !entries[*i].apply).collect();
    by_age.sort_by(|a, b| entries[*a].time.cmp(&entries[*b].time));
    let excess: Vec<usize> = by_age[..updates - MAX_UPDATE_MANAGERS + 1].to_vec();
    let mut merged = Set::default();
    let mut newest = None;
    for i in &excess {
        merged.union_in_place(&entries[*i].set);
        newest = newest.max(entries[*i].time.clone());
    }
    let api_version = entries[excess[0]].api_version.clone();
    let mut i = 0;
    entries.retain(|_| {
        let keep = !excess.contains(&i);
        i += 1;
        keep
    });
    entries.push(Entry {
        manager: ANCIENT.into(),
        apply: false,
        api_version,
        subresource: String::new(),
        time: newest,
        set: merged,
    });
}

/// The subresource a write's entry is recorded under.
fn subresource(sub: Sub, params: &WriteParams) -> &'static str {
    match (params.subresource, sub) {
        (Some(s), _) => s,
        (None, Sub::Status) => "status",
        (None, Sub::Main) => "",
    }
}

/// Restricts a set to what a write to `sub` may own: a resource with a status subresource keeps
/// `status` out of its main path's sets, and its `/status` sets hold only `status`. `metadata` itself
/// is never owned (only the fields in it).
fn owned_by(def: &ResourceDef, sub: Sub, mut set: Set) -> Set {
    set.remove_member(&Pe::Field("metadata".into()));
    let status = Pe::Field("status".into());
    match sub {
        Sub::Status => set.retain_only(&status),
        Sub::Main if def.status_subresource => set.remove_subtree(&status),
        Sub::Main => {}
    }
    set
}

/// The entries an update starts from: those the request carries, if it carries any (a client may
/// set them), else the stored object's.
fn base_entries(old: Option<&Value>, new: &Value) -> Vec<Entry> {
    read_entries(new)
        .filter(|e| !e.is_empty())
        .or_else(|| old.and_then(read_entries))
        .unwrap_or_default()
}

/// Records a create (`old` is `None`) or an update (PUT or a patch) in `new`'s `managedFields`: the
/// fields it added or changed become its manager's (taken from whoever owned them), the fields it
/// removed are nobody's.
pub(crate) fn track_update(
    def: &ResourceDef,
    sub: Sub,
    params: &WriteParams,
    old: Option<&Value>,
    new: &mut Value,
) {
    let ty = Ty::of(def);
    let c = typed::compare(old, Some(new), ty);
    let manager = params
        .field_manager
        .as_deref()
        .unwrap_or(UNKNOWN_MANAGER)
        .to_string();
    let api_version = def.api_version();
    let subresource = subresource(sub, params);
    let mut changed = c.modified;
    changed.union_in_place(&c.added);
    let changed = owned_by(def, sub, changed);
    let removed = c.removed;
    if changed.is_empty() && removed.is_empty() {
        // Nothing anyone owns changed: the entries stay as they are (the request's, or the stored).
        if read_entries(new).is_none_or(|e| e.is_empty())
            && let Some(stored) = old.and_then(|o| meta::metadata(o)?.get("managedFields"))
        {
            meta::metadata_mut(new).insert("managedFields".into(), stored.clone());
        }
        return;
    }
    if refresh_in_place(
        old,
        new,
        &changed,
        &removed,
        &manager,
        subresource,
        &api_version,
    ) {
        return;
    }
    let mut entries = base_entries(old, new);
    let mut previous = Set::default();
    for e in &mut entries {
        if e.is(&manager, false, subresource, &api_version) {
            previous = std::mem::take(&mut e.set);
            continue;
        }
        e.set = e.set.difference(&changed).difference(&removed);
    }
    let set = previous.difference(&removed).union(&changed);
    let now = Some(meta::now_rfc3339());
    match entries
        .iter_mut()
        .find(|e| e.is(&manager, false, subresource, &api_version))
    {
        Some(e) => {
            e.set = set;
            e.time = now;
        }
        None => entries.push(Entry {
            manager,
            apply: false,
            api_version,
            subresource: subresource.to_string(),
            time: now,
            set,
        }),
    }
    write_entries(new, entries);
}

/// The common case of a controller writing again what it alone owns (the operator's status): when
/// the writer's entry already holds every changed field and no entry holds a changed or removed one,
/// only that entry's time moves; done on the stored entries in place, without reading them into sets.
fn refresh_in_place(
    old: Option<&Value>,
    new: &mut Value,
    changed: &Set,
    removed: &Set,
    manager: &str,
    subresource: &str,
    api_version: &str,
) -> bool {
    let Some(stored) = old
        .and_then(|o| meta::metadata(o)?.get("managedFields"))
        .and_then(Value::as_array)
    else {
        return false;
    };
    // A request that sets managedFields itself goes the long way.
    let requested = meta::metadata(new).and_then(|m| m.get("managedFields"));
    if requested.is_some_and(|r| r.as_array() != Some(stored)) {
        return false;
    }
    let is_writer = |e: &Value| {
        e.get("manager").and_then(Value::as_str) == Some(manager)
            && e.get("operation").and_then(Value::as_str) == Some("Update")
            && e.get("subresource").and_then(Value::as_str).unwrap_or("") == subresource
            && e.get("apiVersion").and_then(Value::as_str) == Some(api_version)
    };
    let changed_paths = changed.paths();
    let removed_paths = removed.paths();
    let mut writer = None;
    for (i, e) in stored.iter().enumerate() {
        let fields = e.get("fieldsV1").unwrap_or(&Value::Null);
        if is_writer(e) {
            if !changed_paths
                .iter()
                .all(|p| fieldpath::fields_v1_has(fields, p))
                || removed_paths
                    .iter()
                    .any(|p| fieldpath::fields_v1_has(fields, p))
            {
                return false;
            }
            writer = Some(i);
        } else if changed_paths
            .iter()
            .chain(&removed_paths)
            .any(|p| fieldpath::fields_v1_has(fields, p))
        {
            return false;
        }
    }
    let Some(writer) = writer else {
        return false;
    };
    let mut entries = stored.clone();
    if let Some(Value::Object(e)) = entries.get_mut(writer) {
        e.insert("time".into(), json!(meta::now_rfc3339()));
    }
    meta::metadata_mut(new).insert("managedFields".into(), Value::Array(entries));
    true
}

/// Without update tracking: the entries stay the stored ones unless the request sets its own.
pub(crate) fn keep_entries(old: &Value, new: &mut Value) {
    if read_entries(new).is_none_or(|e| e.is_empty())
        && let Some(stored) = meta::metadata(old).and_then(|m| m.get("managedFields"))
    {
        meta::metadata_mut(new).insert("managedFields".into(), stored.clone());
    }
}

/// A 409 naming every conflicting field and its manager, worded as the real server words it.
fn conflict_error(conflicts: &[(String, String)]) -> ApiError {
    let n = conflicts.len();
    let message = if let [(manager, path)] = conflicts {
        format!("Apply failed with 1 conflict: conflict with {manager}: {path}")
    } else {
        let mut managers: Vec<&String> = conflicts.iter().map(|(m, _)| m).collect();
        managers.sort();
        managers.dedup();
        let mut lines = Vec::new();
        for m in managers {
            lines.push(format!("conflicts with {m}:"));
            for (_, p) in conflicts.iter().filter(|(cm, _)| cm == m) {
                lines.push(format!("- {p}"));
            }
        }
        format!("Apply failed with {n} conflicts: {}", lines.join("\n"))
    };
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|(m, p)| {
            json!({"reason": "FieldManagerConflict", "message": format!("conflict with {m}"), "field": p})
        })
        .collect();
    let mut details = Map::new();
    details.insert("causes".into(), Value::Array(causes));
    let mut e = ApiError::new(409, "Conflict", message);
    e.details = Some(details);
    e
}

/// Decodes an apply configuration (YAML or JSON) and checks what the real server checks first.
fn decode_config(def: &ResourceDef, name: &str, body: &[u8]) -> Result<Value, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
    let config: Value = serde_saphyr::from_str(text)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
    if !config.is_object() {
        return Err(ApiError::bad_request(format!(
            "couldn't get version/kind; json parse error: json: cannot unmarshal {} into Go value of type struct {{ APIVersion string \"json:\\\"apiVersion,omitempty\\\"\"; Kind string \"json:\\\"kind,omitempty\\\"\" }}",
            meta::json_type(&config)
        )));
    }
    let api_version = config
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind = config.get("kind").and_then(Value::as_str).unwrap_or("");
    if kind.is_empty() {
        return Err(ApiError::bad_request(format!(
            "Object 'Kind' is missing in '{}'",
            config
        )));
    }
    if api_version != def.api_version() || kind != def.kind {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({})",
            def.api_version()
        )));
    }
    let config_name = meta::meta_str(&config, "name");
    if config_name.is_empty() {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({name} based on URL) was undeterminable: name must be provided"
        )));
    }
    if config_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({config_name}) does not match the name on the URL ({name})"
        )));
    }
    if meta::metadata(&config)
        .and_then(|m| m.get("managedFields"))
        .is_some_and(|f| !f.is_null())
    {
        return Err(ApiError::bad_request("metadata.managedFields must be nil"));
    }
    Ok(config)
}

/// How an apply is asked for.
pub(crate) struct ApplyRequest<'a> {
    pub(crate) ns: Option<&'a str>,
    pub(crate) name: &'a str,
    pub(crate) sub: Sub,
    pub(crate) body: &'a [u8],
    pub(crate) force: bool,
}

/// `PATCH` with `application/apply-patch+yaml` (or its JSON form): creates the object if it does not
/// exist, else merges the configuration into it; the result goes through the usual update (status
/// rules, admission, schema).
pub(crate) fn apply(
    shared: &Shared,
    def: &Arc<ResourceDef>,
    req: &ApplyRequest<'_>,
    params: &WriteParams,
) -> Result<WriteResult, ApiError> {
    let manager = params.field_manager.clone().unwrap_or_default();
    if manager.is_empty() {
        return Err(ApiError::invalid(
            "PatchOptions",
            "meta.k8s.io",
            "",
            &[FieldError::required_detail(
                "fieldManager",
                "is required for apply patch",
            )],
        ));
    }
    let mut config = decode_config(def, req.name, req.body)?;
    let mut unknown = Vec::new();
    if let Some(schema) = &def.schema {
        schema.prune(&mut config, &mut unknown);
    }
    let ty = Ty::of(def);
    let config_set = owned_by(def, req.sub, typed::to_set(&config, ty));
    let subresource = subresource(req.sub, params);
    let api_version = def.api_version();
    let key = ObjKey::new(
        if def.namespaced {
            req.ns.unwrap_or("")
        } else {
            ""
        },
        req.name,
    );
    for _ in 0..64 {
        let current = { shared.lock().get(&def.storage, &key) };
        let Some(current) = current else {
            if req.sub != Sub::Main {
                return Err(ApiError::not_found(&def.plural, &def.group, req.name));
            }
            // Apply on create: the configuration is the object, all of it the applier's.
            let mut obj = config.clone();
            if let Some(ns) = req.ns.filter(|_| def.namespaced) {
                meta::metadata_mut(&mut obj).insert("namespace".into(), json!(ns));
            }
            write_entries(
                &mut obj,
                vec![Entry {
                    manager: manager.clone(),
                    apply: true,
                    api_version: api_version.clone(),
                    subresource: String::new(),
                    time: Some(meta::now_rfc3339()),
                    set: config_set.clone(),
                }],
            );
            let mut params = params.clone();
            params.managed_fields_set = true;
            let mut res = ops::create(shared, def, req.ns, obj, &params)?;
            res.warnings
                .extend(unknown_warnings(&unknown, params.field_validation)?);
            return Ok(res);
        };
        let live = ops::view(def, current.value()).into_owned();
        let mut entries = read_entries(&live).unwrap_or_default();
        let last = entries
            .iter()
            .find(|e| e.is(&manager, true, subresource, &api_version))
            .map(|e| e.set.clone());
        let mut merged = typed::merge(Some(&live), Some(&config), ty).unwrap_or(Value::Null);
        match entries
            .iter_mut()
            .find(|e| e.is(&manager, true, subresource, &api_version))
        {
            Some(e) => e.set = config_set.clone(),
            None => entries.push(Entry {
                manager: manager.clone(),
                apply: true,
                api_version: api_version.clone(),
                subresource: subresource.to_string(),
                time: None,
                set: config_set.clone(),
            }),
        }
        // What this manager applied before and applies no more, and no one else owns, goes.
        if let Some(last) = &last {
            let mut owned = Set::default();
            for e in &entries {
                owned.union_in_place(&e.set);
            }
            let gone = last
                .with_fields_as_members()
                .difference(&owned.with_fields_as_members());
            typed::remove(&mut merged, &gone, ty);
        }
        let c = typed::compare(Some(&live), Some(&merged), ty);
        // What the subresource resets (status on the main path, the rest on /status) is no change.
        let mut changed = c.modified;
        changed.union_in_place(&c.added);
        let changed = owned_by(def, req.sub, changed);
        let removed = owned_by(def, req.sub, c.removed);
        let mut conflicts: Vec<(String, String)> = Vec::new();
        for e in &mut entries {
            if e.is(&manager, true, subresource, &api_version) {
                continue;
            }
            let clash = e.set.intersection(&changed);
            if !clash.is_empty() {
                for p in clash.paths() {
                    conflicts.push((e.shown(), fieldpath::render(&p)));
                }
                if req.force {
                    e.set = e.set.difference(&clash);
                }
            }
            e.set = e.set.difference(&removed);
        }
        if !conflicts.is_empty() && !req.force {
            conflicts.sort_by(|a, b| a.0.cmp(&b.0));
            return Err(conflict_error(&conflicts));
        }
        if let Some(e) = entries
            .iter_mut()
            .find(|e| e.is(&manager, true, subresource, &api_version))
            && (!changed.is_empty() || !removed.is_empty() || e.time.is_none())
        {
            e.time = Some(meta::now_rfc3339());
        }
        write_entries(&mut merged, entries);
        let mut params = params.clone();
        params.managed_fields_set = true;
        let mut warnings = def.deprecation_warning.iter().cloned().collect::<Vec<_>>();
        warnings.extend(unknown_warnings(&unknown, params.field_validation)?);
        let new = ops::prepare_update(
            shared,
            def,
            req.sub,
            &current,
            merged,
            Vec::new(),
            &params,
            &mut warnings,
        )?;
        match ops::commit(shared, def, &key, &current, new, &params, warnings)? {
            ops::Committed::Done(result) => return Ok(result),
            ops::Committed::Stale => continue,
        }
    }
    Err(ApiError::modified_conflict(
        &def.plural,
        &def.group,
        req.name,
    ))
}

/// The configuration's unknown fields, handled as `fieldValidation` says (warnings, or a 400).
fn unknown_warnings(unknown: &[String], fv: ops::FieldValidation) -> Result<Vec<String>, ApiError> {
    if unknown.is_empty() {
        return Ok(Vec::new());
    }
    let listed: Vec<String> = unknown
        .iter()
        .map(|u| format!("unknown field {u:?}"))
        .collect();
    match fv {
        ops::FieldValidation::Strict => Err(ApiError::bad_request(format!(
            "failed to create typed patch object: strict decoding error: {}",
            listed.join(", ")
        ))),
        ops::FieldValidation::Warn => Ok(listed),
        ops::FieldValidation::Ignore => Ok(Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflicts_are_worded_as_the_real_server_words_them() {
        let one = conflict_error(&[("\"a\"".into(), ".spec.color".into())]);
        assert_eq!(
            one.message,
            "Apply failed with 1 conflict: conflict with \"a\": .spec.color"
        );
        let two = conflict_error(&[
            ("\"a\"".into(), ".spec.color".into()),
            ("\"a\"".into(), ".spec.items".into()),
        ]);
        assert_eq!(
            two.message,
            "Apply failed with 2 conflicts: conflicts with \"a\":\n- .spec.color\n- .spec.items"
        );
        assert_eq!(
            two.to_status()["details"]["causes"][1]["field"],
            ".spec.items"
        );
    }

    #[test]
    fn entries_round_trip_through_managed_fields() {
        let mut set = Set::default();
        set.insert(&[Pe::Field("spec".into()), Pe::Field("x".into())]);
        let mut obj = json!({"metadata": {}});
        write_entries(
            &mut obj,
            vec![Entry {
                manager: "m".into(),
                apply: false,
                api_version: "v1".into(),
                subresource: "status".into(),
                time: Some("2026-01-01T00:00:00Z".into()),
                set,
            }],
        );
        let back = read_entries(&obj).unwrap();
        assert_eq!(back.len(), 1);
        assert!(back[0].is("m", false, "status", "v1"));
        assert_eq!(
            back[0].shown(),
            "\"m\" with subresource \"status\" using v1"
        );
    }
}
