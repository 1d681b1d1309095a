//! Objects walked with their types, as structured-merge-diff walks them: which fields an object sets
//! (`to_set`), which a write added, changed and removed (`compare`), how an apply configuration merges
//! into the live object (`merge`) and the removal of fields (`remove`). A type says whether a list is
//! atomic, a set or a map keyed by some of its items' fields (`x-kubernetes-list-type`,
//! `x-kubernetes-list-map-keys`), and whether an object is granular or atomic
//! (`x-kubernetes-map-type`); what no schema describes is deduced from the value (objects granular,
//! lists atomic), as the library does for unknown fields.

use std::sync::{Arc, OnceLock};

use serde_json::{Map, Value};

use super::fieldpath::{Path, Pe, Set};
use crate::registry::{Builtin, ResourceDef};
use crate::schema::Schema;

/// The type of a value.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ty<'a> {
    /// The object's root: `apiVersion` and `kind` are not fields anyone owns, `metadata` is
    /// [`Ty::Meta`], the rest follows the schema (if any).
    Root(Option<&'a Schema>),
    /// A node of a structural schema.
    Schema(&'a Schema),
    /// `ObjectMeta`: identity fields are nobody's, `finalizers` is a set, `ownerReferences` a map
    /// keyed by `uid`.
    Meta,
    /// A list of scalars that is a set.
    Set,
    /// A list of objects keyed by these fields.
    KeyedList(&'static [&'static str]),
    /// Untyped: objects granular, lists atomic.
    Deduced,
}

/// How a value is walked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape<'a> {
    Scalar,
    Map { atomic: bool },
    AtomicList,
    SetList,
    KeyedList(Keys<'a>),
}

/// The key fields of a keyed list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keys<'a> {
    Schema(&'a [String]),
    Static(&'static [&'static str]),
}

impl Keys<'_> {
    fn names(&self) -> Vec<&str> {
        match self {
            Keys::Schema(k) => k.iter().map(String::as_str).collect(),
            Keys::Static(k) => k.to_vec(),
        }
    }
}

/// `ObjectMeta` fields that are the server's, never a manager's (the real field manager strips them).
const META_IDENTITY: &[&str] = &[
    "name",
    "namespace",
    "creationTimestamp",
    "selfLink",
    "uid",
    "clusterName",
    "generation",
    "managedFields",
    "resourceVersion",
];

fn deduce(v: &Value) -> Shape<'static> {
    match v {
        Value::Object(_) => Shape::Map { atomic: false },
        Value::Array(_) => Shape::AtomicList,
        _ => Shape::Scalar,
    }
}

impl<'a> Ty<'a> {
    /// The type of a whole object of `def`.
    pub(crate) fn of(def: &'a ResourceDef) -> Ty<'a> {
        match (&def.schema, def.builtin) {
            (Some(s), _) => Ty::Root(Some(s)),
            (None, Some(b)) => Ty::Root(builtin_schema(b)),
            (None, None) => Ty::Root(None),
        }
    }

    pub(crate) fn shape(&self, v: &Value) -> Shape<'a> {
        match self {
            Ty::Root(_) | Ty::Meta | Ty::Deduced => deduce(v),
            Ty::Set => Shape::SetList,
            Ty::KeyedList(keys) => Shape::KeyedList(Keys::Static(keys)),
            Ty::Schema(s) => {
                if s.is_int_or_string() {
                    return Shape::Scalar;
                }
                // A value of another type than declared is walked as what it is (validation
                // refuses it afterwards).
                match (s.type_name(), v) {
                    (Some("object"), Value::Object(_)) => Shape::Map {
                        atomic: s.is_map_atomic(),
                    },
                    (Some("array"), Value::Array(_)) => match s.list_type() {
                        Some("set") => Shape::SetList,
                        Some("map") if !s.list_map_keys().is_empty() => {
                            Shape::KeyedList(Keys::Schema(s.list_map_keys()))
                        }
                        _ => Shape::AtomicList,
                    },
                    (None, Value::Object(_)) if s.is_map_atomic() => Shape::Map { atomic: true },
                    _ => deduce(v),
                }
            }
        }
    }

    /// Whether `key` is nobody's field here (the root's type fields, `ObjectMeta`'s identity).
    pub(crate) fn skips(&self, key: &str) -> bool {
        match self {
            Ty::Root(_) => key == "apiVersion" || key == "kind",
            Ty::Meta => META_IDENTITY.contains(&key),
            Ty::Schema(s) if s.is_embedded() => key == "apiVersion" || key == "kind",
            _ => false,
        }
    }

    /// The type of the value at `key` of an object of this type.
    pub(crate) fn field(&self, key: &str) -> Ty<'a> {
        match self {
            Ty::Root(schema) => {
                if key == "metadata" {
                    return Ty::Meta;
                }
                match schema.and_then(|s| s.property(key).or(s.additional_schema())) {
                    Some(s) => Ty::Schema(s),
                    None => Ty::Deduced,
                }
            }
            Ty::Meta => match key {
                "finalizers" => Ty::Set,
                "ownerReferences" => Ty::KeyedList(&["uid"]),
                _ => Ty::Deduced,
            },
            Ty::Schema(s) => {
                if s.is_embedded() && key == "metadata" {
                    return Ty::Meta;
                }
                match s.property(key).or(s.additional_schema()) {
                    Some(c) => Ty::Schema(c),
                    None => Ty::Deduced,
                }
            }
            _ => Ty::Deduced,
        }
    }

    /// Whether `key` is a declared field (a struct's) rather than a key of a map.
    pub(crate) fn is_named(&self, key: &str) -> bool {
        match self {
            Ty::Root(schema) => {
                key == "metadata" || schema.is_some_and(|s| s.property(key).is_some())
            }
            Ty::Meta => true,
            Ty::Schema(s) => s.property(key).is_some(),
            _ => false,
        }
    }

    /// The type of a list's items.
    pub(crate) fn item(&self) -> Ty<'a> {
        match self {
            Ty::Schema(s) => s.item_schema().map_or(Ty::Deduced, Ty::Schema),
            _ => Ty::Deduced,
        }
    }
}

/// The merge-relevant parts of the built-in kinds' schemas (the lists that are maps or sets); the
/// rest is deduced.
fn builtin_schema(b: Builtin) -> Option<&'static Schema> {
    static NODE: OnceLock<Option<Arc<Schema>>> = OnceLock::new();
    static CRD: OnceLock<Option<Arc<Schema>>> = OnceLock::new();
    static NAMESPACE: OnceLock<Option<Arc<Schema>>> = OnceLock::new();
    let keyed = |key: &str| {
        serde_json::json!({"type": "array", "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": [key],
            "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}})
    };
    let open = |properties: Value| {
        serde_json::json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true,
            "properties": properties})
    };
    let compile = |doc: Value| Schema::compile(&doc, "builtin").ok().map(Arc::new);
    let cell = match b {
        Builtin::Node => NODE.get_or_init(|| {
            compile(open(serde_json::json!({"status": open(serde_json::json!({
                "conditions": keyed("type"), "addresses": keyed("type")}))})))
        }),
        Builtin::Crd => CRD.get_or_init(|| {
            compile(open(serde_json::json!({
                "spec": open(serde_json::json!({"versions": keyed("name")})),
                "status": open(serde_json::json!({"conditions": keyed("type")}))})))
        }),
        Builtin::Namespace => NAMESPACE.get_or_init(|| {
            compile(open(serde_json::json!({
                "status": open(serde_json::json!({"conditions": keyed("type")}))})))
        }),
        _ => return None,
    };
    cell.as_deref()
}

/// The path element of a list item.
pub(crate) fn item_pe(shape: Shape<'_>, item: &Value, index: usize) -> Pe {
    match shape {
        Shape::SetList => Pe::Value(item.to_string()),
        Shape::KeyedList(keys) => {
            let mut k: Vec<(String, String)> = keys
                .names()
                .into_iter()
                .map(|name| {
                    let v = item.get(name).cloned().unwrap_or(Value::Null);
                    (name.to_string(), v.to_string())
                })
                .collect();
            k.sort();
            Pe::Key(k)
        }
        _ => Pe::Index(index),
    }
}

/// The fields `v` sets: its scalars, atomic objects and lists, list items, and the keys of maps
/// (and empty or null fields), as the library's `ToFieldSet`.
pub(crate) fn to_set(v: &Value, ty: Ty<'_>) -> Set {
    let mut set = Set::default();
    walk_set(v, ty, &mut Vec::new(), &mut set);
    set
}

fn walk_set(v: &Value, ty: Ty<'_>, path: &mut Path, set: &mut Set) {
    match (ty.shape(v), v) {
        (Shape::Map { atomic: false }, Value::Object(m)) => {
            for (k, cv) in m {
                if ty.skips(k) {
                    continue;
                }
                path.push(Pe::Field(k.clone()));
                walk_set(cv, ty.field(k), path, set);
                let empty = cv.is_null() || cv.as_object().is_some_and(Map::is_empty);
                if empty || !ty.is_named(k) {
                    set.insert(path);
                }
                path.pop();
            }
        }
        (shape @ (Shape::SetList | Shape::KeyedList(_)), Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                path.push(item_pe(shape, item, i));
                if matches!(shape, Shape::KeyedList(_)) {
                    walk_set(item, ty.item(), path, set);
                }
                set.insert(path);
                path.pop();
            }
        }
        _ => set.insert(path),
    }
}

/// What a write changed, as the library's `Compare`.
#[derive(Debug, Default)]
pub(crate) struct Comparison {
    pub(crate) added: Set,
    pub(crate) modified: Set,
    pub(crate) removed: Set,
}

/// Compares `old` and `new` (both whole objects, or absent).
pub(crate) fn compare(old: Option<&Value>, new: Option<&Value>, ty: Ty<'_>) -> Comparison {
    let mut c = Comparison::default();
    walk_compare(old, new, ty, &mut Vec::new(), &mut c);
    c
}

/// JSON equality where `1` and `1.0` are the same number.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

fn leaf(l: Option<&Value>, r: Option<&Value>, path: &Path, c: &mut Comparison) {
    match (l, r) {
        (None, Some(_)) => c.added.insert(path),
        (Some(_), None) => c.removed.insert(path),
        (Some(a), Some(b)) if !same(a, b) => c.modified.insert(path),
        _ => {}
    }
}

fn walk_compare(
    l: Option<&Value>,
    r: Option<&Value>,
    ty: Ty<'_>,
    path: &mut Path,
    c: &mut Comparison,
) {
    let (Some(first), other) = (r.or(l), l.and(r)) else {
        return;
    };
    // Most of an object is the same before and after a write: skip it without walking it.
    if let (Some(a), Some(b)) = (l, r)
        && a == b
    {
        return;
    }
    let shape = ty.shape(first);
    // A value that changed its kind (an object that became a string) is a leaf that changed.
    if other.is_some_and(|_| l.map(|v| ty.shape(v)) != Some(shape)) {
        leaf(l, r, path, c);
        return;
    }
    match shape {
        Shape::Map { atomic: false } => {
            let (lm, rm) = (l.and_then(Value::as_object), r.and_then(Value::as_object));
            if lm.is_none_or(Map::is_empty) && rm.is_none_or(Map::is_empty) {
                leaf(l, r, path, c);
                return;
            }
            for (k, lv) in lm.into_iter().flatten() {
                if ty.skips(k) {
                    continue;
                }
                path.push(Pe::Field(k.clone()));
                walk_compare(Some(lv), rm.and_then(|m| m.get(k)), ty.field(k), path, c);
                path.pop();
            }
            for (k, rv) in rm.into_iter().flatten() {
                if ty.skips(k) || lm.is_some_and(|m| m.contains_key(k)) {
                    continue;
                }
                path.push(Pe::Field(k.clone()));
                walk_compare(None, Some(rv), ty.field(k), path, c);
                path.pop();
            }
        }
        Shape::SetList | Shape::KeyedList(_) => {
            let (la, ra) = (
                l.and_then(Value::as_array).map_or(&[][..], Vec::as_slice),
                r.and_then(Value::as_array).map_or(&[][..], Vec::as_slice),
            );
            if la.is_empty() && ra.is_empty() {
                leaf(l, r, path, c);
                return;
            }
            let index = |items: &'_ [Value]| -> Vec<(Pe, usize)> {
                let mut seen: Vec<(Pe, usize)> = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    let pe = item_pe(shape, item, i);
                    if !seen.iter().any(|(p, _)| *p == pe) {
                        seen.push((pe, i));
                    }
                }
                seen
            };
            let (li, ri) = (index(la), index(ra));
            let item_ty = ty.item();
            for (pe, i) in &li {
                let rv = ri.iter().find(|(p, _)| p == pe).map(|(_, j)| &ra[*j]);
                path.push(pe.clone());
                walk_compare(Some(&la[*i]), rv, item_ty, path, c);
                path.pop();
            }
            for (pe, j) in &ri {
                if li.iter().any(|(p, _)| p == pe) {
                    continue;
                }
                path.push(pe.clone());
                walk_compare(None, Some(&ra[*j]), item_ty, path, c);
                path.pop();
            }
        }
        _ => {
            leaf(l, r, path, c);
            return;
        }
    }
    // A granular object or list item that appeared or went is a change of its own too.
    match (l, r) {
        (None, Some(_)) => c.added.insert(path),
        (Some(_), None) => c.removed.insert(path),
        _ => {}
    }
}

/// Merges an apply configuration (`r`) into the live object (`l`): granular objects key by key,
/// sets and keyed lists item by item (the live order kept, the configuration's order for the items
/// both have), everything else replaced by the configuration's value.
pub(crate) fn merge(l: Option<&Value>, r: Option<&Value>, ty: Ty<'_>) -> Option<Value> {
    let (l, r) = match (l, r) {
        (None, None) => return None,
        (Some(l), None) => return Some(l.clone()),
        (None, Some(r)) => return Some(r.clone()),
        (Some(l), Some(r)) => (l, r),
    };
    let shape = ty.shape(r);
    if ty.shape(l) != shape {
        return Some(r.clone());
    }
    match (shape, l, r) {
        (Shape::Map { atomic: false }, Value::Object(lm), Value::Object(rm)) => {
            if lm.is_empty() && rm.is_empty() {
                return Some(r.clone());
            }
            let mut out = Map::new();
            for (k, lv) in lm {
                if let Some(v) = merge(Some(lv), rm.get(k), ty.field(k)) {
                    out.insert(k.clone(), v);
                }
            }
            for (k, rv) in rm {
                if !lm.contains_key(k) {
                    out.insert(k.clone(), rv.clone());
                }
            }
            Some(Value::Object(out))
        }
        (Shape::SetList | Shape::KeyedList(_), Value::Array(la), Value::Array(ra)) => {
            if la.is_empty() && ra.is_empty() {
                return Some(r.clone());
            }
            Some(Value::Array(merge_list(la, ra, shape, ty.item())))
        }
        _ => Some(r.clone()),
    }
}

/// The library's list merge: walks both lists at once, keeping the live items the configuration
/// does not name where they were, and the items both name in the configuration's order.
fn merge_list(la: &[Value], ra: &[Value], shape: Shape<'_>, item_ty: Ty<'_>) -> Vec<Value> {
    let dedup = |items: &[Value]| -> Vec<(Pe, usize)> {
        let mut out: Vec<(Pe, usize)> = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let pe = item_pe(shape, item, i);
            if !out.iter().any(|(p, _)| *p == pe) {
                out.push((pe, i));
            }
        }
        out
    };
    let (lpes, rpes) = (dedup(la), dedup(ra));
    let in_l = |pe: &Pe| lpes.iter().find(|(p, _)| p == pe).map(|(_, i)| &la[*i]);
    let in_r = |pe: &Pe| rpes.iter().find(|(p, _)| p == pe).map(|(_, i)| &ra[*i]);
    let mut shared: std::collections::VecDeque<&Pe> = rpes
        .iter()
        .filter(|(p, _)| in_l(p).is_some())
        .map(|(p, _)| p)
        .collect();
    let mut next_shared = shared.pop_front();
    let mut merged_r: Vec<&Pe> = Vec::new();
    let mut out = Vec::with_capacity(la.len().max(ra.len()));
    let (mut li, mut ri) = (0, 0);
    while li < lpes.len() || ri < rpes.len() {
        if li < lpes.len() && ri < rpes.len() {
            let pe = &lpes[li].0;
            if *pe == rpes[ri].0 {
                merged_r.push(pe);
                if let Some(v) = merge(in_l(pe), in_r(pe), item_ty) {
                    out.push(v);
                }
                li += 1;
                ri += 1;
                next_shared = shared.pop_front();
                continue;
            }
            if in_r(pe).is_some() && next_shared.is_some_and(|n| n != pe) {
                li += 1;
                continue;
            }
        }
        if li < lpes.len() {
            let pe = &lpes[li].0;
            if in_r(pe).is_none() {
                out.push(la[lpes[li].1].clone());
                li += 1;
                continue;
            } else if merged_r.contains(&pe) {
                li += 1;
                continue;
            }
        }
        if ri < rpes.len() {
            let pe = &rpes[ri].0;
            merged_r.push(pe);
            if let Some(v) = merge(in_l(pe), in_r(pe), item_ty) {
                out.push(v);
            }
            ri += 1;
            if next_shared.is_some_and(|n| n == pe) {
                next_shared = shared.pop_front();
            }
        }
    }
    out
}

/// Removes the fields and list items of `set` from `v` (with everything below them).
pub(crate) fn remove(v: &mut Value, set: &Set, ty: Ty<'_>) {
    let shape = ty.shape(v);
    match (shape, v) {
        (Shape::Map { atomic: false }, Value::Object(m)) => {
            m.retain(|k, _| !set.has(&[Pe::Field(k.clone())]));
            for (k, cv) in m.iter_mut() {
                if let Some(child) = set.child(&Pe::Field(k.clone())) {
                    remove(cv, child, ty.field(k));
                }
            }
        }
        (Shape::SetList | Shape::KeyedList(_), Value::Array(items)) => {
            let mut i = 0;
            items.retain(|item| {
                let keep = !set.has(&[item_pe(shape, item, i)]);
                i += 1;
                keep
            });
            let item_ty = ty.item();
            for (i, item) in items.iter_mut().enumerate() {
                if let Some(child) = set.child(&item_pe(shape, item, i)) {
                    remove(item, child, item_ty);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Schema {
        Schema::compile(
            &json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
                "tags": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
                "ports": {"type": "array", "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name"], "items": {"type": "object",
                    "properties": {"name": {"type": "string"}, "port": {"type": "integer"}}}},
                "items": {"type": "array", "items": {"type": "string"}},
                "atomic": {"type": "object", "x-kubernetes-map-type": "atomic",
                    "properties": {"a": {"type": "string"}, "b": {"type": "string"}}},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}}}}}}),
            "s",
        )
        .unwrap()
    }

    #[test]
    fn the_set_of_an_object_names_what_the_real_server_names() {
        let s = schema();
        let obj = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n", "labels": {"a": "1"}},
            "spec": {"tags": ["x"], "ports": [{"name": "http", "port": 80}], "items": ["a"],
                "atomic": {"a": "A"}, "labels": {"k": "v"}}});
        let set = to_set(&obj, Ty::Root(Some(&s)));
        assert_eq!(
            set.to_fields_v1(),
            json!({"f:metadata": {"f:labels": {"f:a": {}}}, "f:spec": {"f:atomic": {}, "f:items": {},
                "f:labels": {"f:k": {}}, "f:ports": {"k:{\"name\":\"http\"}": {".": {}, "f:name": {}, "f:port": {}}},
                "f:tags": {"v:\"x\"": {}}}})
        );
    }

    #[test]
    fn merging_keeps_live_items_and_replaces_atomic_values() {
        let s = schema();
        let ty = Ty::Root(Some(&s));
        let live = json!({"spec": {"ports": [{"name": "a", "port": 1}, {"name": "b", "port": 2}],
            "tags": ["x"], "items": ["a", "b"], "atomic": {"a": "A"}}});
        let config = json!({"spec": {"ports": [{"name": "b", "port": 3}, {"name": "c", "port": 4}],
            "tags": ["y"], "items": ["c"], "atomic": {"b": "B"}}});
        let merged = merge(Some(&live), Some(&config), ty).unwrap();
        assert_eq!(
            merged["spec"]["ports"],
            json!([{"name": "a", "port": 1}, {"name": "b", "port": 3}, {"name": "c", "port": 4}])
        );
        assert_eq!(merged["spec"]["tags"], json!(["x", "y"]));
        assert_eq!(merged["spec"]["items"], json!(["c"]));
        assert_eq!(merged["spec"]["atomic"], json!({"b": "B"}));
        let c = compare(Some(&live), Some(&merged), ty);
        let modified: Vec<String> = c
            .modified
            .paths()
            .iter()
            .map(|p| super::super::fieldpath::render(p))
            .collect();
        assert_eq!(
            modified,
            [
                ".spec.atomic",
                ".spec.items",
                ".spec.ports[name=\"b\"].port"
            ]
        );
        let mut removed = merged.clone();
        let mut set = Set::default();
        set.insert(&[Pe::Field("spec".into()), Pe::Field("tags".into())]);
        remove(&mut removed, &set, ty);
        assert!(removed["spec"].get("tags").is_none());
    }
}
