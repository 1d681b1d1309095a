//! Object metadata: accessors, system fields (uid, timestamps, generated names) and the `ObjectMeta`
//! validation rules the real server applies to every kind.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Map, Value};

use super::error::{ApiError, FieldError};

/// The fields of `ObjectMeta`; anything else under `metadata` is an unknown field.
pub(crate) const OBJECT_META_FIELDS: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

pub(crate) fn metadata(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
}

/// The metadata map, created when absent (or replaced when it is not a map).
pub(crate) fn metadata_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = Value::Object(Map::new());
    }
    let Value::Object(map) = obj else {
        unreachable!("made an object above")
    };
    let entry = map
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !entry.is_object() {
        *entry = Value::Object(Map::new());
    }
    match entry {
        Value::Object(m) => m,
        _ => unreachable!("made an object above"),
    }
}

pub(crate) fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    metadata(obj)
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

pub(crate) fn labels(obj: &Value) -> Option<&Map<String, Value>> {
    metadata(obj)
        .and_then(|m| m.get("labels"))
        .and_then(Value::as_object)
}

pub(crate) fn finalizers(obj: &Value) -> Vec<String> {
    metadata(obj)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

pub(crate) fn is_deleting(obj: &Value) -> bool {
    metadata(obj)
        .and_then(|m| m.get("deletionTimestamp"))
        .is_some_and(|t| !t.is_null())
}

/// The uids named by `metadata.ownerReferences`.
pub(crate) fn owner_uids(obj: &Value) -> Vec<String> {
    metadata(obj)
        .and_then(|m| m.get("ownerReferences"))
        .and_then(Value::as_array)
        .map(|refs| {
            refs.iter()
                .filter_map(|r| r.get("uid").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Now, as the RFC 3339 second-precision timestamps of `metav1.Time`.
pub(crate) fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Parses a `metav1.Time` or `MicroTime`.
pub(crate) fn parse_time(s: &str) -> Option<jiff::Timestamp> {
    s.parse::<jiff::Timestamp>().ok()
}

static UID_COUNTER: AtomicU64 = AtomicU64::new(0);

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SEED.get_or_init(|| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.finish()
    })
}

fn random_u64() -> u64 {
    splitmix64(
        seed()
            ^ UID_COUNTER
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_mul(0xA24B_AED4_963E_E407),
    )
}

/// A random (version 4) UUID; uniqueness is what matters here, not unpredictability.
pub(crate) fn new_uid() -> String {
    let hi = random_u64();
    let lo = random_u64();
    let hi = (hi & 0xFFFF_FFFF_FFFF_0FFF) | 0x0000_0000_0000_4000;
    let lo = (lo & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000;
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xFFFF,
        hi & 0xFFFF,
        lo >> 48,
        lo & 0xFFFF_FFFF_FFFF
    )
}

/// The 5-character suffix of `generateName`, from the alphabet the real server uses.
pub(crate) fn generated_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut r = random_u64();
    (0..5)
        .map(|_| {
            let c = ALPHABET[(r % ALPHABET.len() as u64) as usize];
            r /= ALPHABET.len() as u64;
            char::from(c)
        })
        .collect()
}

/// The part of a `generateName` a generated name keeps: apimachinery's `SimpleNameGenerator` cuts
/// the prefix to 58 characters so that the name with its 5 random ones fits a DNS label.
pub(crate) fn generated_name_base(prefix: &str) -> &str {
    const MAX_PREFIX: usize = 63 - 5;
    let mut end = prefix.len().min(MAX_PREFIX);
    while !prefix.is_char_boundary(end) {
        end -= 1;
    }
    &prefix[..end]
}

const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const QUALIFIED_NAME_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

/// The shape of one RFC 1123 label, `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, without its length limit.
fn is_dns1123_label_shaped(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS label (Namespace names, CRD plurals): at most 63 characters.
pub(crate) fn is_dns1123_label(s: &str) -> bool {
    s.len() <= 63 && is_dns1123_label_shaped(s)
}

/// A DNS subdomain (most object names, API groups): at most 253 characters in all. As in
/// apimachinery's `IsDNS1123Subdomain`, the parts between dots have no limit of their own.
fn is_dns1123_subdomain_shaped(s: &str) -> bool {
    s.split('.').all(is_dns1123_label_shaped)
}

pub(crate) fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && is_dns1123_subdomain_shaped(s)
}

fn is_qualified_name_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && s.as_bytes().first().is_some_and(u8::is_ascii_alphanumeric)
        && s.as_bytes().last().is_some_and(u8::is_ascii_alphanumeric)
}

/// Checks a qualified name (`[prefix/]name`), as used by label and annotation keys and finalizers.
pub(crate) fn qualified_name_errors(s: &str) -> Vec<String> {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    let mut errs = Vec::new();
    if let Some(p) = prefix {
        if p.is_empty() {
            errs.push("prefix part must be non-empty".to_string());
        } else if !is_dns1123_subdomain(p) {
            errs.push(format!("prefix part {DNS1123_SUBDOMAIN_MSG}"));
        }
    }
    if name.is_empty() {
        errs.push("name part must be non-empty".into());
    } else if name.len() > 63 {
        errs.push("name part must be no more than 63 characters".into());
    } else if !is_qualified_name_part(name) || name.contains('/') {
        errs.push(QUALIFIED_NAME_MSG.into());
    }
    errs
}

pub(crate) fn is_label_value(s: &str) -> bool {
    s.is_empty() || is_qualified_name_part(s)
}

/// How object names of a resource are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NameRule {
    Dns1123Subdomain,
    Dns1123Label,
}

/// The causes a real server gives for a bad name: one per broken rule (length, then shape), as
/// apimachinery's `IsDNS1123Label` / `IsDNS1123Subdomain` list them.
pub(crate) fn name_errors(rule: NameRule, name: &str, field: &str) -> Vec<FieldError> {
    let (max, shaped, shape_msg) = match rule {
        // A name that would be a subdomain but for its dots gets apimachinery's shorter message.
        NameRule::Dns1123Label if name.contains('.') && is_dns1123_subdomain_shaped(name) => {
            (63, false, "must not contain dots")
        }
        NameRule::Dns1123Label => (63, is_dns1123_label_shaped(name), DNS1123_LABEL_MSG),
        NameRule::Dns1123Subdomain => (
            253,
            is_dns1123_subdomain_shaped(name),
            DNS1123_SUBDOMAIN_MSG,
        ),
    };
    let value = Value::String(name.to_string());
    let mut errs = Vec::new();
    if name.len() > max {
        errs.push(FieldError::invalid(
            field,
            &value,
            &format!("must be no more than {max} characters"),
        ));
    }
    if !shaped {
        errs.push(FieldError::invalid(field, &value, shape_msg));
    }
    errs
}

/// Decoding checks on `metadata`: a wrongly typed field makes the whole body undecodable (400), as with
/// the real server's JSON decoder. Unknown fields are removed and returned as paths.
pub(crate) fn decode_metadata(obj: &mut Value, what: &str) -> Result<Vec<String>, ApiError> {
    let Some(meta) = obj.get_mut("metadata") else {
        return Ok(Vec::new());
    };
    if meta.is_null() {
        *meta = Value::Object(Map::new());
        return Ok(Vec::new());
    }
    let Value::Object(meta) = meta else {
        return Err(ApiError::bad_request(format!(
            "{what}: json: cannot unmarshal {} into Go struct field .metadata of type v1.ObjectMeta",
            json_type(meta)
        )));
    };
    let mut unknown = Vec::new();
    meta.retain(|k, v| {
        let known = OBJECT_META_FIELDS.contains(&k.as_str());
        if !known {
            unknown.push(format!("metadata.{k}"));
        }
        known && !v.is_null()
    });
    let bad = |field: &str, want: &str, v: &Value| {
        ApiError::bad_request(format!(
            "{what}: json: cannot unmarshal {} into Go struct field ObjectMeta.metadata.{field} of type {want}",
            json_type(v)
        ))
    };
    for (field, v) in meta.iter() {
        match field.as_str() {
            "name" | "generateName" | "namespace" | "selfLink" | "uid" | "resourceVersion"
            | "creationTimestamp" | "deletionTimestamp"
                if !v.is_string() =>
            {
                return Err(bad(field, "string", v));
            }
            "generation" | "deletionGracePeriodSeconds" if !v.is_i64() => {
                return Err(bad(field, "int64", v));
            }
            "labels" | "annotations" => {
                let Some(m) = v.as_object() else {
                    return Err(bad(field, "map[string]string", v));
                };
                if let Some((_, inner)) = m.iter().find(|(_, inner)| !inner.is_string()) {
                    return Err(bad(field, "string", inner));
                }
            }
            "finalizers" => {
                let Some(a) = v.as_array() else {
                    return Err(bad(field, "[]string", v));
                };
                if let Some(inner) = a.iter().find(|i| !i.is_string()) {
                    return Err(bad(field, "string", inner));
                }
            }
            "ownerReferences" | "managedFields" => {
                let Some(a) = v.as_array() else {
                    return Err(bad(field, "[]", v));
                };
                if let Some(inner) = a.iter().find(|i| !i.is_object()) {
                    return Err(bad(field, "object", inner));
                }
            }
            _ => {}
        }
    }
    for ts in ["creationTimestamp", "deletionTimestamp"] {
        if let Some(Value::String(s)) = meta.get(ts)
            && !s.is_empty()
            && parse_time(s).is_none()
        {
            return Err(ApiError::bad_request(format!(
                "{what}: parsing time {s:?} as \"2006-01-02T15:04:05Z07:00\": cannot parse"
            )));
        }
    }
    Ok(unknown)
}

pub(crate) fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The `ObjectMeta` rules every kind shares: labels, annotations, finalizers, owner references.
pub(crate) fn validate_common(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let Some(meta) = metadata(obj) else {
        return errs;
    };
    if let Some(labels) = meta.get("labels").and_then(Value::as_object) {
        for (k, v) in labels {
            for e in qualified_name_errors(k) {
                errs.push(FieldError::invalid(
                    "metadata.labels",
                    &Value::String(k.clone()),
                    &e,
                ));
            }
            let v = v.as_str().unwrap_or("");
            if !is_label_value(v) {
                let msg = if v.len() > 63 {
                    "must be no more than 63 characters"
                } else {
                    LABEL_VALUE_MSG
                };
                errs.push(FieldError::invalid(
                    "metadata.labels",
                    &Value::String(v.into()),
                    msg,
                ));
            }
        }
    }
    if let Some(ann) = meta.get("annotations").and_then(Value::as_object) {
        let mut total = 0usize;
        for (k, v) in ann {
            for e in qualified_name_errors(&k.to_ascii_lowercase()) {
                errs.push(FieldError::invalid(
                    "metadata.annotations",
                    &Value::String(k.clone()),
                    &e,
                ));
            }
            total += k.len() + v.as_str().map_or(0, str::len);
        }
        if total > 256 * 1024 {
            errs.push(FieldError::too_long("metadata.annotations", 256 * 1024));
        }
    }
    if let Some(fins) = meta.get("finalizers").and_then(Value::as_array) {
        for (i, f) in fins.iter().enumerate() {
            let f = f.as_str().unwrap_or("");
            for e in qualified_name_errors(f) {
                errs.push(FieldError::invalid(
                    format!("metadata.finalizers[{i}]"),
                    &Value::String(f.into()),
                    &e,
                ));
            }
        }
    }
    if let Some(refs) = meta.get("ownerReferences").and_then(Value::as_array) {
        let mut controllers = 0;
        for (i, r) in refs.iter().enumerate() {
            for field in ["apiVersion", "kind", "name", "uid"] {
                if r.get(field)
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    let path = format!("metadata.ownerReferences[{i}].{field}");
                    errs.push(FieldError::invalid(
                        path,
                        &Value::String(String::new()),
                        &format!("{field} must not be empty"),
                    ));
                }
            }
            if r.get("controller").and_then(Value::as_bool) == Some(true) {
                controllers += 1;
            }
        }
        if controllers > 1 {
            errs.push(FieldError::invalid(
                "metadata.ownerReferences",
                &Value::Array(refs.clone()),
                "Only one reference can have Controller set to true",
            ));
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_are_v4_and_unique() {
        let a = new_uid();
        let b = new_uid();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
    }

    #[test]
    fn names() {
        assert!(is_dns1123_subdomain("a.b-c"));
        assert!(!is_dns1123_subdomain("A"));
        assert!(!is_dns1123_subdomain("a..b"));
        assert!(is_dns1123_label("default"));
        assert!(!is_dns1123_label("a.b"));
        assert!(!is_dns1123_label(&"a".repeat(64)));
        // No per-part limit in a subdomain: only the whole name's 253.
        assert!(is_dns1123_subdomain(&format!(
            "{}.{}",
            "a".repeat(100),
            "b".repeat(100)
        )));
        assert!(is_dns1123_subdomain(&"a".repeat(253)));
        assert!(!is_dns1123_subdomain(&"a".repeat(254)));
        assert!(!is_dns1123_subdomain("a."));
        let both = name_errors(NameRule::Dns1123Label, &"A".repeat(64), "metadata.name");
        assert_eq!(both.len(), 2, "length and shape are both reported");
        assert!(qualified_name_errors("cluster.x-k8s.io/cluster-name").is_empty());
        assert!(!qualified_name_errors("bad key!").is_empty());
    }
}
