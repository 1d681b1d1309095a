//! Protobuf request bodies (`application/vnd.kubernetes.protobuf`) for the built-in kinds that
//! kubectl's typed commands send that way (`kubectl create namespace|secret|configmap`, `kubectl auth
//! can-i|whoami`): Namespace, Secret, ConfigMap and the self-reviews. The message layouts are those of `k8s.io/api` and apimachinery's
//! `generated.proto`; anything else is answered 415 as a server without protobuf support would.

use base64::Engine as _;
use serde_json::{Map, Value, json};

use super::error::ApiError;

/// The 4-byte prefix of Kubernetes protobuf bodies.
const MAGIC: &[u8] = b"k8s\0";

enum Wire<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

fn malformed() -> ApiError {
    ApiError::bad_request("the protobuf body of the request is malformed")
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    fn varint(&mut self) -> Result<u64, ApiError> {
        let mut out = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.buf.get(self.pos).ok_or_else(malformed)?;
            self.pos += 1;
            out |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(out);
            }
        }
        Err(malformed())
    }

    fn next(&mut self) -> Result<Option<(u64, Wire<'a>)>, ApiError> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let field = key >> 3;
        let wire = match key & 7 {
            0 => Wire::Varint(self.varint()?),
            1 => {
                self.skip(8)?;
                Wire::Fixed
            }
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|_| malformed())?;
                let end = self
                    .pos
                    .checked_add(len)
                    .filter(|e| *e <= self.buf.len())
                    .ok_or_else(malformed)?;
                let bytes = &self.buf[self.pos..end];
                self.pos = end;
                Wire::Bytes(bytes)
            }
            5 => {
                self.skip(4)?;
                Wire::Fixed
            }
            _ => return Err(malformed()),
        };
        Ok(Some((field, wire)))
    }

    fn skip(&mut self, n: usize) -> Result<(), ApiError> {
        self.pos = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.buf.len())
            .ok_or_else(malformed)?;
        Ok(())
    }
}

fn string(b: &[u8]) -> Result<Value, ApiError> {
    std::str::from_utf8(b)
        .map(|s| Value::String(s.to_string()))
        .map_err(|_| malformed())
}

/// A `map<string, V>` entry: key (1), value (2).
fn map_entry(
    b: &[u8],
    value: impl Fn(&[u8]) -> Result<Value, ApiError>,
) -> Result<(String, Value), ApiError> {
    let mut r = Reader::new(b);
    let mut key = String::new();
    let mut val = value(&[])?;
    while let Some((f, w)) = r.next()? {
        match (f, w) {
            (1, Wire::Bytes(k)) => {
                key = std::str::from_utf8(k).map_err(|_| malformed())?.to_string()
            }
            (2, Wire::Bytes(v)) => val = value(v)?,
            _ => {}
        }
    }
    Ok((key, val))
}

fn insert_map(m: &mut Map<String, Value>, field: &str, entry: (String, Value)) {
    let target = m.entry(field).or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(t) = target {
        t.insert(entry.0, entry.1);
    }
}

fn push(m: &mut Map<String, Value>, field: &str, v: Value) {
    let target = m.entry(field).or_insert_with(|| Value::Array(Vec::new()));
    if let Value::Array(a) = target {
        a.push(v);
    }
}

/// A decoder of a length-delimited value (a nested message, a string, bytes).
type Decode = fn(&[u8]) -> Result<Value, ApiError>;

/// How a field of a message becomes a JSON field; a field of another wire type is skipped.
#[derive(Clone, Copy)]
enum Field {
    /// A string, empty or not.
    Str,
    /// A string left out when empty (Go writes empty strings in protobuf and omits them in JSON).
    NonEmptyStr,
    /// A bool (varint).
    Bool,
    /// An int64 (varint).
    Int,
    /// A nested message or other length-delimited value.
    One(Decode),
    /// A repeated length-delimited field, appended to an array.
    Repeated(Decode),
    /// A `map<string, V>`, its values decoded so.
    StringMap(Decode),
}

/// A message's fields by number, each with its JSON name; fields not listed are skipped.
type Layout = [(u64, &'static str, Field)];

/// Decodes the fields of a message that `layout` lists into `out`.
fn message_into(b: &[u8], layout: &Layout, out: &mut Map<String, Value>) -> Result<(), ApiError> {
    let mut r = Reader::new(b);
    while let Some((f, w)) = r.next()? {
        let Some(&(_, name, field)) = layout.iter().find(|(n, _, _)| *n == f) else {
            continue;
        };
        let value = match (field, w) {
            (Field::Str, Wire::Bytes(v)) => string(v)?,
            (Field::NonEmptyStr, Wire::Bytes(v)) if !v.is_empty() => string(v)?,
            (Field::Bool, Wire::Varint(v)) => json!(v != 0),
            (Field::Int, Wire::Varint(v)) => json!(v as i64),
            (Field::One(decode), Wire::Bytes(v)) => decode(v)?,
            (Field::Repeated(decode), Wire::Bytes(v)) => {
                push(out, name, decode(v)?);
                continue;
            }
            (Field::StringMap(decode), Wire::Bytes(v)) => {
                insert_map(out, name, map_entry(v, decode)?);
                continue;
            }
            _ => continue,
        };
        out.insert(name.into(), value);
    }
    Ok(())
}

/// A message as a JSON object of the fields `layout` lists.
fn message(b: &[u8], layout: &Layout) -> Result<Value, ApiError> {
    let mut m = Map::new();
    message_into(b, layout, &mut m)?;
    Ok(Value::Object(m))
}

/// `bytes`, base64 in JSON.
fn bytes(b: &[u8]) -> Result<Value, ApiError> {
    Ok(Value::String(
        base64::engine::general_purpose::STANDARD.encode(b),
    ))
}

/// `metav1.Time`: seconds (1), nanos (2).
fn time(b: &[u8]) -> Result<Value, ApiError> {
    let mut r = Reader::new(b);
    let mut secs = 0i64;
    while let Some((f, w)) = r.next()? {
        if let (1, Wire::Varint(v)) = (f, w) {
            secs = v as i64;
        }
    }
    let ts = jiff::Timestamp::from_second(secs).map_err(|_| malformed())?;
    Ok(Value::String(ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()))
}

fn owner_reference(b: &[u8]) -> Result<Value, ApiError> {
    message(
        b,
        &[
            (1, "kind", Field::Str),
            (3, "name", Field::Str),
            (4, "uid", Field::Str),
            (5, "apiVersion", Field::Str),
            (6, "controller", Field::Bool),
            (7, "blockOwnerDeletion", Field::Bool),
        ],
    )
}

fn object_meta(b: &[u8]) -> Result<Value, ApiError> {
    message(
        b,
        &[
            (1, "name", Field::Str),
            (2, "generateName", Field::Str),
            (3, "namespace", Field::Str),
            (5, "uid", Field::Str),
            (6, "resourceVersion", Field::Str),
            (7, "generation", Field::Int),
            (8, "creationTimestamp", Field::One(time)),
            (9, "deletionTimestamp", Field::One(time)),
            (10, "deletionGracePeriodSeconds", Field::Int),
            (11, "labels", Field::StringMap(string)),
            (12, "annotations", Field::StringMap(string)),
            (13, "ownerReferences", Field::Repeated(owner_reference)),
            (14, "finalizers", Field::Repeated(string)),
        ],
    )
}

/// Every top-level kind starts with its metadata (1).
const METADATA: (u64, &str, Field) = (1, "metadata", Field::One(object_meta));

fn namespace(b: &[u8], out: &mut Map<String, Value>) -> Result<(), ApiError> {
    fn spec(b: &[u8]) -> Result<Value, ApiError> {
        message(b, &[(1, "finalizers", Field::Repeated(string))])
    }
    message_into(b, &[METADATA, (2, "spec", Field::One(spec))], out)
}

fn secret(b: &[u8], out: &mut Map<String, Value>) -> Result<(), ApiError> {
    message_into(
        b,
        &[
            METADATA,
            (2, "data", Field::StringMap(bytes)),
            (3, "type", Field::Str),
            (4, "stringData", Field::StringMap(string)),
            (5, "immutable", Field::Bool),
        ],
        out,
    )
}

fn config_map(b: &[u8], out: &mut Map<String, Value>) -> Result<(), ApiError> {
    message_into(
        b,
        &[
            METADATA,
            (2, "data", Field::StringMap(string)),
            (3, "binaryData", Field::StringMap(bytes)),
            (4, "immutable", Field::Bool),
        ],
        out,
    )
}

/// `SelfSubjectAccessReview` (kubectl auth can-i): metadata (1), spec (2) with resourceAttributes (1)
/// and nonResourceAttributes (2).
fn access_review(b: &[u8], out: &mut Map<String, Value>) -> Result<(), ApiError> {
    fn resource(b: &[u8]) -> Result<Value, ApiError> {
        message(
            b,
            &[
                (1, "namespace", Field::NonEmptyStr),
                (2, "verb", Field::NonEmptyStr),
                (3, "group", Field::NonEmptyStr),
                (4, "version", Field::NonEmptyStr),
                (5, "resource", Field::NonEmptyStr),
                (6, "subresource", Field::NonEmptyStr),
                (7, "name", Field::NonEmptyStr),
            ],
        )
    }
    fn non_resource(b: &[u8]) -> Result<Value, ApiError> {
        message(
            b,
            &[
                (1, "path", Field::NonEmptyStr),
                (2, "verb", Field::NonEmptyStr),
            ],
        )
    }
    fn spec(b: &[u8]) -> Result<Value, ApiError> {
        message(
            b,
            &[
                (1, "resourceAttributes", Field::One(resource)),
                (2, "nonResourceAttributes", Field::One(non_resource)),
            ],
        )
    }
    message_into(b, &[METADATA, (2, "spec", Field::One(spec))], out)
}

/// `SelfSubjectRulesReview` (kubectl auth can-i --list): metadata (1), spec (2) with namespace (1);
/// `SelfSubjectReview` (kubectl auth whoami) has only metadata (1).
fn rules_review(b: &[u8], out: &mut Map<String, Value>) -> Result<(), ApiError> {
    fn spec(b: &[u8]) -> Result<Value, ApiError> {
        message(b, &[(1, "namespace", Field::NonEmptyStr)])
    }
    message_into(b, &[METADATA, (2, "spec", Field::One(spec))], out)
}

pub(crate) fn unsupported() -> ApiError {
    ApiError::unsupported_media_type(
        "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml",
    )
}

/// Decodes a protobuf body into the JSON form of the object.
pub(crate) fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let Some(rest) = body.strip_prefix(MAGIC) else {
        return Err(malformed());
    };
    // TypeMeta (1): apiVersion (1) and kind (2), both written even when absent.
    const TYPE_META: &Layout = &[(1, "apiVersion", Field::Str), (2, "kind", Field::Str)];
    let mut out = Map::new();
    out.insert("apiVersion".into(), Value::String(String::new()));
    out.insert("kind".into(), Value::String(String::new()));
    let mut r = Reader::new(rest);
    let mut raw = None;
    while let Some((f, w)) = r.next()? {
        match (f, w) {
            (1, Wire::Bytes(tm)) => message_into(tm, TYPE_META, &mut out)?,
            (2, Wire::Bytes(v)) => raw = Some(v),
            (3 | 4, Wire::Bytes(v)) if !v.is_empty() => return Err(unsupported()),
            _ => {}
        }
    }
    let raw = raw.unwrap_or_default();
    let type_field = |name: &str| {
        out.get(name)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let (api_version, kind) = (type_field("apiVersion"), type_field("kind"));
    match (api_version.as_str(), kind.as_str()) {
        ("v1", "Namespace") => namespace(raw, &mut out)?,
        ("v1", "Secret") => secret(raw, &mut out)?,
        ("v1", "ConfigMap") => config_map(raw, &mut out)?,
        ("authorization.k8s.io/v1", "SelfSubjectAccessReview") => access_review(raw, &mut out)?,
        ("authorization.k8s.io/v1", "SelfSubjectRulesReview")
        | ("authentication.k8s.io/v1", "SelfSubjectReview") => rules_review(raw, &mut out)?,
        _ => return Err(unsupported()),
    }
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(n: u64, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![(n << 3 | 2) as u8, bytes.len() as u8];
        out.extend_from_slice(bytes);
        out
    }

    #[test]
    fn decodes_a_secret() {
        let meta = [
            field(1, b"creds"),
            field(11, &[field(1, b"app"), field(2, b"x")].concat()),
        ]
        .concat();
        let secret = [
            field(1, &meta),
            field(2, &[field(1, b"token"), field(2, b"abc")].concat()),
            field(3, b"Opaque"),
        ]
        .concat();
        let type_meta = [field(1, b"v1"), field(2, b"Secret")].concat();
        let body = [MAGIC.to_vec(), field(1, &type_meta), field(2, &secret)].concat();
        let v = decode(&body).unwrap();
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds", "labels": {"app": "x"}},
                "data": {"token": "YWJj"}, "type": "Opaque"})
        );
        assert_eq!(decode(b"k8s\0\x0a\xff").unwrap_err().code, 400);
        assert_eq!(decode(b"nope").unwrap_err().code, 400);
    }
}
