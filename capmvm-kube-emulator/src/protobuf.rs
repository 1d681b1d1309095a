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

fn bytes_b64(b: &[u8]) -> Value {
    Value::String(base64::engine::general_purpose::STANDARD.encode(b))
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
    let mut r = Reader::new(b);
    let mut m = Map::new();
    while let Some((f, w)) = r.next()? {
        match (f, w) {
            (1, Wire::Bytes(v)) => {
                m.insert("kind".into(), string(v)?);
            }
            (3, Wire::Bytes(v)) => {
                m.insert("name".into(), string(v)?);
            }
            (4, Wire::Bytes(v)) => {
                m.insert("uid".into(), string(v)?);
            }
            (5, Wire::Bytes(v)) => {
                m.insert("apiVersion".into(), string(v)?);
            }
            (6, Wire::Varint(v)) => {
                m.insert("controller".into(), json!(v != 0));
            }
            (7, Wire::Varint(v)) => {
                m.insert("blockOwnerDeletion".into(), json!(v != 0));
            }
            _ => {}
        }
    }
    Ok(Value::Object(m))
}

fn object_meta(b: &[u8]) -> Result<Value, ApiError> {
    let mut r = Reader::new(b);
    let mut m = Map::new();
    while let Some((f, w)) = r.next()? {
        match (f, w) {
            (1, Wire::Bytes(v)) => {
                m.insert("name".into(), string(v)?);
            }
            (2, Wire::Bytes(v)) => {
                m.insert("generateName".into(), string(v)?);
            }
            (3, Wire::Bytes(v)) => {
                m.insert("namespace".into(), string(v)?);
            }
            (5, Wire::Bytes(v)) => {
                m.insert("uid".into(), string(v)?);
            }
            (6, Wire::Bytes(v)) => {
                m.insert("resourceVersion".into(), string(v)?);
            }
            (7, Wire::Varint(v)) => {
                m.insert("generation".into(), json!(v as i64));
            }
            (8, Wire::Bytes(v)) => {
                m.insert("creationTimestamp".into(), time(v)?);
            }
            (9, Wire::Bytes(v)) => {
                m.insert("deletionTimestamp".into(), time(v)?);
            }
            (10, Wire::Varint(v)) => {
                m.insert("deletionGracePeriodSeconds".into(), json!(v as i64));
            }
            (11, Wire::Bytes(v)) => insert_map(&mut m, "labels", map_entry(v, string)?),
            (12, Wire::Bytes(v)) => insert_map(&mut m, "annotations", map_entry(v, string)?),
            (13, Wire::Bytes(v)) => push(&mut m, "ownerReferences", owner_reference(v)?),
            (14, Wire::Bytes(v)) => push(&mut m, "finalizers", string(v)?),
            _ => {}
        }
    }
    Ok(Value::Object(m))
}

fn namespace(b: &[u8], out: &mut Map<String, Value>) -> Result<(), ApiError> {
    let mut r = Reader::new(b);
    while let Some((f, w)) = r.next()? {
        match (f, w) {
            (1, Wire::Bytes(v)) => {
                out.insert("metadata".into(), object_meta(v)?);
            }
            (2, Wire::Bytes(v)) => {
                let mut spec = Map::new();
                let mut sr = Reader::new(v);
                while let Some((sf, sw)) = sr.next()? {
                    if let (1, Wire::Bytes(x)) = (sf, sw) {
                        push(&mut spec, "finalizers", string(x)?);
                    }
                }
                out.insert("spec".into(), Value::Object(spec));
            }
            _ => {}
        }
    }
    Ok(())
}

fn secret(b: &[u8], out: &mut Map<String, Value>) -> Result<(), ApiError> {
    let mut r = Reader::new(b);
    while let Some((f, w)) = r.next()? {
        match (f, w) {
            (1, Wire::Bytes(v)) => {
                out.insert("metadata".into(), object_meta(v)?);
            }
            (2, Wire::Bytes(v)) => insert_map(out, "data", map_entry(v, |x| Ok(bytes_b64(x)))?),
            (3, Wire::Bytes(v)) => {
                out.insert("type".into(), string(v)?);
            }
            (4, Wire::Bytes(v)) => insert_map(out, "stringData", map_entry(v, string)?),
            (5, Wire::Varint(v)) => {
                out.insert("immutable".into(), json!(v != 0));
            }
            _ => {}
        }
    }
    Ok(())
}

fn config_map(b: &[u8], out: &mut Map<String, Value>) -> Result<(), ApiError> {
    let mut r = Reader::new(b);
    while let Some((f, w)) = r.next()? {
        match (f, w) {
            (1, Wire::Bytes(v)) => {
                out.insert("metadata".into(), object_meta(v)?);
            }
            (2, Wire::Bytes(v)) => insert_map(out, "data", map_entry(v, string)?),
            (3, Wire::Bytes(v)) => {
                insert_map(out, "binaryData", map_entry(v, |x| Ok(bytes_b64(x)))?)
            }
            (4, Wire::Varint(v)) => {
                out.insert("immutable".into(), json!(v != 0));
            }
            _ => {}
        }
    }
    Ok(())
}

/// The string fields of a message by number, as JSON fields (Go writes empty strings in protobuf and
/// omits them in JSON: they are left out).
fn strings(b: &[u8], names: &[(u64, &str)]) -> Result<Value, ApiError> {
    let mut r = Reader::new(b);
    let mut m = Map::new();
    while let Some((f, w)) = r.next()? {
        if let (Some((_, name)), Wire::Bytes(v)) = (names.iter().find(|(n, _)| *n == f), w)
            && !v.is_empty()
        {
            m.insert((*name).into(), string(v)?);
        }
    }
    Ok(Value::Object(m))
}

/// `SelfSubjectAccessReview` (kubectl auth can-i): metadata (1), spec (2) with resourceAttributes (1)
/// and nonResourceAttributes (2).
fn access_review(b: &[u8], out: &mut Map<String, Value>) -> Result<(), ApiError> {
    const RESOURCE: &[(u64, &str)] = &[
        (1, "namespace"),
        (2, "verb"),
        (3, "group"),
        (4, "version"),
        (5, "resource"),
        (6, "subresource"),
        (7, "name"),
    ];
    let mut r = Reader::new(b);
    while let Some((f, w)) = r.next()? {
        match (f, w) {
            (1, Wire::Bytes(v)) => {
                out.insert("metadata".into(), object_meta(v)?);
            }
            (2, Wire::Bytes(v)) => {
                let mut spec = Map::new();
                let mut sr = Reader::new(v);
                while let Some((sf, sw)) = sr.next()? {
                    match (sf, sw) {
                        (1, Wire::Bytes(x)) => {
                            spec.insert("resourceAttributes".into(), strings(x, RESOURCE)?);
                        }
                        (2, Wire::Bytes(x)) => {
                            spec.insert(
                                "nonResourceAttributes".into(),
                                strings(x, &[(1, "path"), (2, "verb")])?,
                            );
                        }
                        _ => {}
                    }
                }
                out.insert("spec".into(), Value::Object(spec));
            }
            _ => {}
        }
    }
    Ok(())
}

/// `SelfSubjectRulesReview` (kubectl auth can-i --list): metadata (1), spec (2) with namespace (1);
/// `SelfSubjectReview` (kubectl auth whoami) has only metadata (1).
fn rules_review(b: &[u8], out: &mut Map<String, Value>) -> Result<(), ApiError> {
    let mut r = Reader::new(b);
    while let Some((f, w)) = r.next()? {
        match (f, w) {
            (1, Wire::Bytes(v)) => {
                out.insert("metadata".into(), object_meta(v)?);
            }
            (2, Wire::Bytes(v)) => {
                out.insert("spec".into(), strings(v, &[(1, "namespace")])?);
            }
            _ => {}
        }
    }
    Ok(())
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
    let mut r = Reader::new(rest);
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), None);
    while let Some((f, w)) = r.next()? {
        match (f, w) {
            (1, Wire::Bytes(tm)) => {
                let mut t = Reader::new(tm);
                while let Some((tf, tw)) = t.next()? {
                    match (tf, tw) {
                        (1, Wire::Bytes(v)) => {
                            api_version =
                                std::str::from_utf8(v).map_err(|_| malformed())?.to_string()
                        }
                        (2, Wire::Bytes(v)) => {
                            kind = std::str::from_utf8(v).map_err(|_| malformed())?.to_string()
                        }
                        _ => {}
                    }
                }
            }
            (2, Wire::Bytes(v)) => raw = Some(v),
            (3 | 4, Wire::Bytes(v)) if !v.is_empty() => return Err(unsupported()),
            _ => {}
        }
    }
    let raw = raw.unwrap_or_default();
    let mut out = Map::new();
    out.insert("apiVersion".into(), Value::String(api_version.clone()));
    out.insert("kind".into(), Value::String(kind.clone()));
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
