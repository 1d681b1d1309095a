//! What CEL rules see of a schema, as the real server builds it (apiserver's `SchemaDeclType` and its
//! value conversion): the type a rule is checked against at CRD creation, and the value it is
//! evaluated on. Declared properties are fields under their escaped names (`foo-bar` is
//! `foo__dash__bar`); undeclared ones are not visible; a resource's root (the CRD's, or an embedded
//! resource) always has `apiVersion`, `kind` and `metadata.name`/`metadata.generateName`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock};

use base64::Engine as _;
use serde_json::Value;

use super::{Additional, Schema};
use crate::cel::{ObjectType, Ty};

/// CEL's reserved words, which property names are escaped from (`__namespace__`).
const RESERVED: &[&str] = &[
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// A property name as rules spell it, or `None` when rules cannot name it.
pub(crate) fn escape(name: &str) -> Option<String> {
    let first = name.chars().next()?;
    if first.is_ascii_digit() {
        return None;
    }
    if RESERVED.contains(&name) {
        return Some(format!("__{name}__"));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/'))
    {
        return None;
    }
    let mut out = String::with_capacity(name.len());
    let mut chars = name.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '_' if chars.peek() == Some(&'_') => {
                chars.next();
                out.push_str("__underscores__");
            }
            '.' => out.push_str("__dot__"),
            '-' => out.push_str("__dash__"),
            '/' => out.push_str("__slash__"),
            c => out.push(c),
        }
    }
    Some(out)
}

/// The name the real server gives the type of `self`: unique per CRD write, so rules cannot depend on it.
pub(super) fn self_type_name() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("selfType{nanos}")
}

/// The `apiVersion` and `kind` every resource's root has for rules.
static IMPLICIT_STRING: LazyLock<Schema> = LazyLock::new(|| Schema {
    ty: Some("string".into()),
    ..Schema::default()
});

/// The `metadata` every resource's root has for rules: its name and generateName only.
static IMPLICIT_METADATA: LazyLock<Schema> = LazyLock::new(|| Schema {
    ty: Some("object".into()),
    properties: Some(BTreeMap::from([
        ("name".to_string(), IMPLICIT_STRING.clone()),
        ("generateName".to_string(), IMPLICIT_STRING.clone()),
    ])),
    ..Schema::default()
});

impl Schema {
    fn is_typed_as(&self, t: &str) -> bool {
        self.ty.as_deref() == Some(t)
    }

    /// The declared properties as rules see them, with their escaped names; a resource's root
    /// gets its implicit ones (borrowed: values are converted on every write).
    fn cel_properties(&self, resource_root: bool) -> Vec<(&str, String, &Schema)> {
        let declared = self.properties.iter().flatten();
        let mut props: BTreeMap<&str, &Schema> = declared.map(|(k, s)| (k.as_str(), s)).collect();
        if resource_root {
            let typed = |k: &str, t: &str| props.get(k).is_some_and(|s| s.is_typed_as(t));
            let meta_declared = props.get("metadata").is_some_and(|m| {
                m.is_typed_as("object")
                    && m.property("name").is_some_and(|n| n.is_typed_as("string"))
                    && m.property("generateName")
                        .is_some_and(|n| n.is_typed_as("string"))
            });
            if !(meta_declared && typed("kind", "string") && typed("apiVersion", "string")) {
                props.insert("kind", &IMPLICIT_STRING);
                props.insert("apiVersion", &IMPLICIT_STRING);
                props.insert("metadata", &IMPLICIT_METADATA);
            }
        }
        props
            .into_iter()
            .filter_map(|(k, s)| escape(k).map(|e| (k, e, s)))
            .collect()
    }

    /// The CEL type of this node's values, its objects named from `name`; `None` when rules cannot
    /// see it (no type, or items or values that have none).
    pub(crate) fn cel_type(&self, resource_root: bool, name: &str) -> Option<Ty> {
        if self.int_or_string {
            return Some(Ty::Dyn);
        }
        match self.ty.as_deref()? {
            "array" => {
                let items = self.items.as_deref()?;
                Some(Ty::list(
                    items.cel_type(items.embedded, &format!("{name}.@idx"))?,
                ))
            }
            "object" => {
                if let Some(Additional::Schema(values)) = &self.additional {
                    let v = values.cel_type(values.embedded, &format!("{name}.@elem"))?;
                    return Some(Ty::map(Ty::String, v));
                }
                let mut fields = BTreeMap::new();
                for (_, escaped, s) in self.cel_properties(resource_root) {
                    if let Some(t) = s.cel_type(s.embedded, &format!("{name}.{escaped}")) {
                        fields.insert(escaped, t);
                    }
                }
                Some(Ty::Object(Arc::new(ObjectType {
                    name: name.to_string(),
                    fields,
                })))
            }
            "string" => Some(match self.format.as_deref() {
                Some("byte") => Ty::Bytes,
                Some("duration") => Ty::Duration,
                Some("date" | "date-time") => Ty::Timestamp,
                _ => Ty::String,
            }),
            "boolean" => Some(Ty::Bool),
            "number" => Some(Ty::Double),
            "integer" => Some(Ty::Int),
            _ => None,
        }
    }

    /// `v` as rules see it. An error says why it cannot be (a value of another type than declared:
    /// the caller reports it rather than skip the rules).
    pub(crate) fn to_cel(&self, v: &Value, resource_root: bool) -> Result<cel::Value, String> {
        let wrong = |want: &str| -> Result<cel::Value, String> {
            Err(format!(
                "invalid data, expected {want}, got {}",
                super::validate::type_name(v)
            ))
        };
        if v.is_null() {
            return Ok(cel::Value::Null);
        }
        if self.int_or_string {
            return match v {
                Value::String(s) => Ok(cel::Value::String(Arc::new(s.clone()))),
                Value::Number(n) => n
                    .as_i64()
                    .map(cel::Value::Int)
                    .ok_or_else(|| format!("invalid data, expected an int or a string, got {n}")),
                _ => wrong("an int or a string"),
            };
        }
        match (self.ty.as_deref(), v) {
            (Some("array"), Value::Array(a)) => {
                let items = self
                    .items
                    .as_deref()
                    .ok_or("an array without items schema")?;
                let list = a
                    .iter()
                    .map(|x| items.to_cel(x, items.embedded))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(cel::Value::List(Arc::new(list)))
            }
            (Some("object"), Value::Object(m)) => {
                let mut out: HashMap<cel::objects::Key, cel::Value> = HashMap::new();
                if let Some(Additional::Schema(values)) = &self.additional {
                    for (k, x) in m {
                        out.insert(
                            cel::objects::Key::String(Arc::new(k.clone())),
                            values.to_cel(x, values.embedded)?,
                        );
                    }
                } else {
                    for (k, escaped, s) in self.cel_properties(resource_root) {
                        let Some(x) = m.get(k) else {
                            continue;
                        };
                        if s.ty.is_none() && !s.int_or_string {
                            continue;
                        }
                        out.insert(
                            cel::objects::Key::String(Arc::new(escaped)),
                            s.to_cel(x, s.embedded)?,
                        );
                    }
                }
                Ok(cel::Value::Map(cel::objects::Map { map: Arc::new(out) }))
            }
            (Some("string"), Value::String(s)) => match self.format.as_deref() {
                Some("byte") => base64::engine::general_purpose::STANDARD
                    .decode(s)
                    .map(|b| cel::Value::Bytes(Arc::new(b)))
                    .map_err(|e| format!("invalid data, expected base64: {e}")),
                _ => Ok(cel::Value::String(Arc::new(s.clone()))),
            },
            (Some("boolean"), Value::Bool(b)) => Ok(cel::Value::Bool(*b)),
            (Some("number"), Value::Number(n)) => n
                .as_f64()
                .map(cel::Value::Float)
                .ok_or_else(|| format!("invalid data, expected a number, got {n}")),
            (Some("integer"), Value::Number(n)) => n
                .as_i64()
                .map(cel::Value::Int)
                .ok_or_else(|| format!("invalid data, expected an int64, got {n}")),
            (Some(t), _) => wrong(t),
            (None, _) => Err("a value without a type".to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn property_names_are_escaped_as_the_real_server_escapes_them() {
        assert_eq!(escape("foo-bar").as_deref(), Some("foo__dash__bar"));
        assert_eq!(escape("a.b/c").as_deref(), Some("a__dot__b__slash__c"));
        assert_eq!(escape("x__y").as_deref(), Some("x__underscores__y"));
        assert_eq!(escape("namespace").as_deref(), Some("__namespace__"));
        assert_eq!(escape("1st"), None);
        assert_eq!(escape("a b"), None);
        assert_eq!(escape("plain_name").as_deref(), Some("plain_name"));
    }
}
