//! Structural OpenAPI v3 schemas as custom resources use them: pruning of unknown fields, dropping of
//! non-nullable nulls, defaulting, and validation with the messages of the real server's validator.

use std::collections::BTreeMap;

use regex::Regex;
use serde_json::{Map, Value};

use super::error::FieldError;
use super::meta;

mod cel_type;
mod path;
mod rules;
mod validate;
use path::Path;

#[derive(Debug, Clone)]
enum Additional {
    Allowed(bool),
    Schema(Box<Schema>),
}

/// A compiled structural schema node.
#[derive(Debug, Clone, Default)]
pub(crate) struct Schema {
    ty: Option<String>,
    nullable: bool,
    properties: Option<BTreeMap<String, Schema>>,
    additional: Option<Additional>,
    items: Option<Box<Schema>>,
    required: Vec<String>,
    enumeration: Option<Vec<Value>>,
    minimum: Option<f64>,
    maximum: Option<f64>,
    exclusive_minimum: bool,
    exclusive_maximum: bool,
    multiple_of: Option<f64>,
    min_length: Option<u64>,
    max_length: Option<u64>,
    pattern: Option<(String, Regex)>,
    min_items: Option<u64>,
    max_items: Option<u64>,
    min_properties: Option<u64>,
    max_properties: Option<u64>,
    format: Option<String>,
    default: Option<Value>,
    preserve_unknown: bool,
    int_or_string: bool,
    embedded: bool,
    list_type: Option<String>,
    list_map_keys: Vec<String>,
    /// `x-kubernetes-map-type: atomic`: the object is owned and replaced as a whole by apply.
    map_atomic: bool,
    all_of: Vec<Schema>,
    any_of: Vec<Schema>,
    one_of: Vec<Schema>,
    not: Option<Box<Schema>>,
    /// This node's CEL rules.
    rules: Vec<crate::cel::Rule>,
    /// Whether this node or one below it has CEL rules (the rules' walk skips the others).
    has_rules: bool,
}

fn f64_of(v: Option<&Value>) -> Option<f64> {
    v.and_then(Value::as_f64)
}

/// A boolean keyword, false when absent.
fn flag(m: &Map<String, Value>, key: &str) -> bool {
    m.get(key).and_then(Value::as_bool).unwrap_or(false)
}

fn text(m: &Map<String, Value>, key: &str) -> Option<String> {
    m.get(key).and_then(Value::as_str).map(str::to_string)
}

/// A keyword listing names, empty when absent; entries that are not strings are skipped.
fn names(m: &Map<String, Value>, key: &str) -> Vec<String> {
    m.get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|r| r.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn u64_of(v: Option<&Value>) -> Option<u64> {
    v.and_then(|x| {
        x.as_u64()
            .or_else(|| x.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
    })
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

const TYPES: &[&str] = &["object", "array", "string", "integer", "number", "boolean"];

impl Schema {
    /// Compiles a `JSONSchemaProps` document. `path` names it in errors (`spec.versions[0].schema.openAPIV3Schema`).
    pub(crate) fn compile(v: &Value, path: &str) -> Result<Self, Vec<FieldError>> {
        let mut errs = Vec::new();
        let mut s = Self::compile_inner(v, path, &mut errs, true);
        // As the real server, rules are compiled only against a schema without other errors.
        if errs.is_empty() {
            s.compile_rules(v, path, true, None, &mut errs);
        }
        if errs.is_empty() { Ok(s) } else { Err(errs) }
    }

    fn compile_inner(v: &Value, path: &str, errs: &mut Vec<FieldError>, structural: bool) -> Self {
        let Some(m) = v.as_object() else {
            errs.push(FieldError::invalid(path, v, "must be an object"));
            return Self::default();
        };
        let mut s = Self {
            ty: m
                .get("type")
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty())
                .map(str::to_string),
            nullable: flag(m, "nullable"),
            required: names(m, "required"),
            enumeration: m.get("enum").and_then(Value::as_array).cloned(),
            minimum: f64_of(m.get("minimum")),
            maximum: f64_of(m.get("maximum")),
            exclusive_minimum: flag(m, "exclusiveMinimum"),
            exclusive_maximum: flag(m, "exclusiveMaximum"),
            multiple_of: f64_of(m.get("multipleOf")),
            min_length: u64_of(m.get("minLength")),
            max_length: u64_of(m.get("maxLength")),
            min_items: u64_of(m.get("minItems")),
            max_items: u64_of(m.get("maxItems")),
            min_properties: u64_of(m.get("minProperties")),
            max_properties: u64_of(m.get("maxProperties")),
            format: text(m, "format"),
            default: m.get("default").cloned(),
            preserve_unknown: flag(m, "x-kubernetes-preserve-unknown-fields"),
            int_or_string: flag(m, "x-kubernetes-int-or-string"),
            embedded: flag(m, "x-kubernetes-embedded-resource"),
            list_type: text(m, "x-kubernetes-list-type"),
            list_map_keys: names(m, "x-kubernetes-list-map-keys"),
            map_atomic: m.get("x-kubernetes-map-type").and_then(Value::as_str) == Some("atomic"),
            ..Self::default()
        };
        crate::cel::lint(v, path, errs);
        if let Some(t) = &s.ty
            && !TYPES.contains(&t.as_str())
        {
            errs.push(FieldError::not_supported(
                join(path, "type"),
                &Value::String(t.clone()),
                &TYPES.iter().map(|t| (*t).to_string()).collect::<Vec<_>>(),
            ));
        }
        if structural && s.ty.is_none() && !s.int_or_string && !s.preserve_unknown {
            errs.push(FieldError::required_detail(
                join(path, "type"),
                "must not be empty for specified object fields",
            ));
        }
        if let Some(p) = m.get("pattern").and_then(Value::as_str) {
            match Regex::new(p) {
                Ok(re) => s.pattern = Some((p.to_string(), re)),
                Err(e) => errs.push(FieldError::invalid(
                    join(path, "pattern"),
                    &Value::String(p.into()),
                    &format!("must be a valid regular expression, but isn't: {e}"),
                )),
            }
        }
        if let Some(props) = m.get("properties").and_then(Value::as_object) {
            let mut out = BTreeMap::new();
            for (k, pv) in props {
                let child =
                    Self::compile_inner(pv, &format!("{path}.properties[{k}]"), errs, structural);
                out.insert(k.clone(), child);
            }
            s.properties = Some(out);
        }
        match m.get("additionalProperties") {
            Some(Value::Bool(b)) => s.additional = Some(Additional::Allowed(*b)),
            Some(a @ Value::Object(_)) => {
                let child = Self::compile_inner(
                    a,
                    &format!("{path}.additionalProperties"),
                    errs,
                    structural,
                );
                s.additional = Some(Additional::Schema(Box::new(child)));
            }
            _ => {}
        }
        if let Some(items) = m.get("items") {
            let child = Self::compile_inner(items, &format!("{path}.items"), errs, structural);
            s.items = Some(Box::new(child));
        }
        for (key, target) in [("allOf", 0), ("anyOf", 1), ("oneOf", 2)] {
            if let Some(list) = m.get(key).and_then(Value::as_array) {
                let compiled: Vec<Schema> = list
                    .iter()
                    .enumerate()
                    .map(|(i, x)| {
                        Self::compile_inner(x, &format!("{path}.{key}[{i}]"), errs, false)
                    })
                    .collect();
                match target {
                    0 => s.all_of = compiled,
                    1 => s.any_of = compiled,
                    _ => s.one_of = compiled,
                }
            }
        }
        if let Some(not) = m.get("not") {
            s.not = Some(Box::new(Self::compile_inner(
                not,
                &format!("{path}.not"),
                errs,
                false,
            )));
        }
        s
    }

    /// How server-side apply treats this node: its declared fields, the schema of other keys, its
    /// items, and whether it is atomic.
    pub(crate) fn property(&self, key: &str) -> Option<&Schema> {
        self.properties.as_ref().and_then(|p| p.get(key))
    }

    pub(crate) fn additional_schema(&self) -> Option<&Schema> {
        match &self.additional {
            Some(Additional::Schema(s)) => Some(s),
            _ => None,
        }
    }

    pub(crate) fn item_schema(&self) -> Option<&Schema> {
        self.items.as_deref()
    }

    pub(crate) fn list_type(&self) -> Option<&str> {
        self.list_type.as_deref()
    }

    pub(crate) fn list_map_keys(&self) -> &[String] {
        &self.list_map_keys
    }

    pub(crate) fn is_map_atomic(&self) -> bool {
        self.map_atomic
    }

    pub(crate) fn is_int_or_string(&self) -> bool {
        self.int_or_string
    }

    pub(crate) fn is_embedded(&self) -> bool {
        self.embedded
    }

    pub(crate) fn type_name(&self) -> Option<&str> {
        self.ty.as_deref()
    }

    fn child(&self, key: &str) -> Option<&Schema> {
        if let Some(p) = self.properties.as_ref().and_then(|p| p.get(key)) {
            return Some(p);
        }
        match &self.additional {
            Some(Additional::Schema(s)) => Some(s),
            _ => None,
        }
    }

    fn keeps_unknown(&self) -> bool {
        self.preserve_unknown || matches!(self.additional, Some(Additional::Allowed(true)))
    }

    /// Removes fields the schema does not specify, recording their paths; `metadata` is left to the caller.
    pub(crate) fn prune(&self, v: &mut Value, unknown: &mut Vec<String>) {
        self.prune_at(v, &Path::Root, unknown, true);
    }

    fn prune_at(&self, v: &mut Value, path: &Path<'_>, unknown: &mut Vec<String>, root: bool) {
        if self.int_or_string {
            return;
        }
        match v {
            Value::Object(m) => {
                let implicit_meta = root || self.embedded;
                let mut dropped = Vec::new();
                for (k, cv) in m.iter_mut() {
                    if implicit_meta && (k == "apiVersion" || k == "kind") {
                        continue;
                    }
                    if implicit_meta && k == "metadata" {
                        if self.embedded
                            && let Some(mm) = cv.as_object_mut()
                        {
                            mm.retain(|mk, _| {
                                let known = meta::OBJECT_META_FIELDS.contains(&mk.as_str());
                                if !known {
                                    unknown.push(path.field("metadata").field(mk).render());
                                }
                                known
                            });
                        }
                        continue;
                    }
                    match self.child(k) {
                        Some(child) => child.prune_at(cv, &path.field(k), unknown, false),
                        None if self.keeps_unknown() => {}
                        None => {
                            unknown.push(path.field(k).render());
                            dropped.push(k.clone());
                        }
                    }
                }
                for k in dropped {
                    m.remove(&k);
                }
            }
            Value::Array(a) => {
                if let Some(items) = &self.items {
                    for (i, item) in a.iter_mut().enumerate() {
                        items.prune_at(item, &path.item(i), unknown, false);
                    }
                }
            }
            _ => {}
        }
    }

    /// Drops nulls the schema does not allow (or defaults them) and applies `default`s, top down.
    pub(crate) fn default_and_drop_nulls(&self, v: &mut Value) {
        match v {
            Value::Object(m) => {
                if let Some(props) = &self.properties {
                    for (k, child) in props {
                        match m.get(k) {
                            Some(Value::Null) if !child.nullable => match &child.default {
                                Some(d) => {
                                    m.insert(k.clone(), d.clone());
                                }
                                None => {
                                    m.remove(k);
                                }
                            },
                            None => {
                                if let Some(d) = &child.default {
                                    m.insert(k.clone(), d.clone());
                                }
                            }
                            _ => {}
                        }
                    }
                }
                let additional = match &self.additional {
                    Some(Additional::Schema(s)) => Some(s.as_ref()),
                    _ => None,
                };
                for (k, cv) in m.iter_mut() {
                    let child = self
                        .properties
                        .as_ref()
                        .and_then(|p| p.get(k))
                        .or(additional);
                    if let Some(child) = child {
                        child.default_and_drop_nulls(cv);
                    }
                }
                if let Some(add) = additional {
                    let nulls: Vec<String> = m
                        .iter()
                        .filter(|(k, v)| v.is_null() && !self.has_property(k))
                        .map(|(k, _)| k.clone())
                        .collect();
                    if !add.nullable {
                        for k in nulls {
                            match &add.default {
                                Some(d) => {
                                    m.insert(k, d.clone());
                                }
                                None => {
                                    m.remove(&k);
                                }
                            }
                        }
                    }
                }
            }
            Value::Array(a) => {
                if let Some(items) = &self.items {
                    for item in a.iter_mut() {
                        if item.is_null()
                            && !items.nullable
                            && let Some(d) = &items.default
                        {
                            *item = d.clone();
                        }
                        items.default_and_drop_nulls(item);
                    }
                }
            }
            _ => {}
        }
    }

    fn has_property(&self, k: &str) -> bool {
        self.properties.as_ref().is_some_and(|p| p.contains_key(k))
    }
}
/// Ratcheting on update: whether error `e` of the new object `obj` stands, the value at its field
/// having changed from `old` (an error on a field whose value did not change is not reported, as
/// the real server does since 1.30).
pub(crate) fn still_an_error(e: &FieldError, obj: &Value, old: &Value) -> bool {
    let path = if e.field == "body" {
        ""
    } else {
        e.field.as_str()
    };
    let now = value_at(obj, path);
    now.is_none() || now != value_at(old, path)
}

/// The value at a field path such as `spec.hosts[0].endpoint`, used to ratchet validation on update:
/// an error on a field whose value did not change is not reported (as the real server does since 1.30).
pub(crate) fn value_at<'a>(root: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = root;
    for part in path.split('.') {
        let (name, mut rest) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if !name.is_empty() {
            cur = cur.get(name)?;
        }
        while let Some(stripped) = rest.strip_prefix('[') {
            let end = stripped.find(']')?;
            let idx = &stripped[..end];
            cur = match idx.parse::<usize>() {
                Ok(i) => cur.get(i)?,
                Err(_) => cur.get(idx)?,
            };
            rest = &stripped[end + 1..];
        }
    }
    Some(cur)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_metadata_of_an_embedded_object_is_named_under_its_path() {
        let s = Schema::compile(
            &json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
                "templates": {"type": "array", "items": {"type": "object",
                    "x-kubernetes-embedded-resource": true,
                    "x-kubernetes-preserve-unknown-fields": true}}}}}}),
            "schema",
        )
        .unwrap();
        let mut v = json!({"spec": {"templates": [{"apiVersion": "v1", "kind": "K",
            "metadata": {"name": "n", "colour": "red"}, "spec": {"x": 1}}]}});
        let mut unknown = Vec::new();
        s.prune(&mut v, &mut unknown);
        assert_eq!(unknown, ["spec.templates[0].metadata.colour"]);
        assert_eq!(v["spec"]["templates"][0]["metadata"], json!({"name": "n"}));
        assert_eq!(v["spec"]["templates"][0]["spec"]["x"], 1);
    }

    #[test]
    fn messages_name_list_items_by_index_and_the_root_as_body() {
        let s = schema();
        let errs = s.validate_root(
            &json!({"spec": {"vcpu": 1, "list": [{}, {"type": 5}]}}),
            None,
        );
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "spec.list[1].type");
        assert!(
            errs[0]
                .message
                .ends_with("spec.list[1].type in body must be of type string: \"integer\""),
            "{:?}",
            errs[0]
        );
        let errs = s.validate_root(&json!([1]), None);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "body");
        assert!(
            errs[0]
                .message
                .contains("body in body must be of type object"),
            "{:?}",
            errs[0]
        );
    }

    fn schema() -> Schema {
        Schema::compile(
            &json!({
                "type": "object",
                "properties": {
                    "spec": {
                        "type": "object",
                        "required": ["vcpu"],
                        "properties": {
                            "vcpu": {"type": "integer", "minimum": 1, "maximum": 64},
                            "kind": {"type": "string", "enum": ["a", "b"], "default": "a"},
                            "name": {"type": "string", "maxLength": 3, "pattern": "^[a-z]+$", "nullable": true},
                            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                            "list": {"type": "array", "items": {"type": "object", "properties": {
                                "type": {"type": "string", "default": "tap"}}}}
                        }
                    }
                }
            }),
            "schema",
        )
        .unwrap()
    }

    #[test]
    fn prune_default_validate() {
        let s = schema();
        let mut v = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n"},
            "spec": {"vcpu": 100, "zzz": 1, "free": {"any": {"thing": 1}}, "labels": {"a": "b"}, "list": [{"x": 1}], "kind": null},
            "extra": true});
        let mut unknown = Vec::new();
        s.prune(&mut v, &mut unknown);
        assert_eq!(
            unknown,
            vec![
                "extra".to_string(),
                "spec.list[0].x".into(),
                "spec.zzz".into()
            ]
        );
        s.default_and_drop_nulls(&mut v);
        assert_eq!(v["spec"]["kind"], "a");
        assert_eq!(v["spec"]["list"][0]["type"], "tap");
        assert_eq!(v["spec"]["free"]["any"]["thing"], 1);
        let errs = s.validate_root(&v, None);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "spec.vcpu");
        assert_eq!(
            errs[0].message,
            "Invalid value: 100: spec.vcpu in body should be less than or equal to 64"
        );
        let v = json!({"spec": {"name": "ABCD", "kind": "c"}});
        let errs = s.validate_root(&v, None);
        let msgs: Vec<String> = errs.iter().map(FieldError::full).collect();
        assert!(
            msgs.contains(&"spec.vcpu: Required value".to_string()),
            "{msgs:?}"
        );
        assert!(msgs.contains(
            &"spec.kind: Unsupported value: \"c\": supported values: \"a\", \"b\"".to_string()
        ));
        assert!(msgs.contains(&"spec.name: Too long: may not be more than 3 bytes".to_string()));
        assert!(msgs.iter().any(|m| m.contains("should match '^[a-z]+$'")));
    }

    #[test]
    fn value_at_paths() {
        let v = json!({"spec": {"hosts": [{"endpoint": "a"}]}});
        assert_eq!(value_at(&v, "spec.hosts[0].endpoint"), Some(&json!("a")));
        assert_eq!(value_at(&v, "spec.hosts[1].endpoint"), None);
    }

    #[test]
    fn non_structural_schema_is_rejected() {
        let errs =
            Schema::compile(&json!({"type": "object", "properties": {"a": {}}}), "s").unwrap_err();
        assert_eq!(errs[0].field, "s.properties[a].type");
    }
}
