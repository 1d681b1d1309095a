//! Patch bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and strategic merge patch for the
//! built-in kinds served here.

use serde_json::{Map, Value};

use super::error::ApiError;

/// The media type of a `Content-Type` value, lowercase and without its parameters.
pub(crate) fn media_type(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// The patch types named by the request's `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchType {
    Merge,
    Json,
    Strategic,
    Apply,
}

impl PatchType {
    pub(crate) fn from_content_type(ct: &str) -> Option<Self> {
        match media_type(ct).as_str() {
            "application/merge-patch+json" => Some(Self::Merge),
            "application/json-patch+json" => Some(Self::Json),
            "application/strategic-merge-patch+json" => Some(Self::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Some(Self::Apply),
            _ => None,
        }
    }
}

/// The most operations one JSON patch may carry, as on the real server.
const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;

pub(crate) fn decode_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))
}

/// Applies an RFC 7386 merge patch.
pub(crate) fn merge(doc: &mut Value, body: &[u8]) -> Result<(), ApiError> {
    let patch = decode_json(body)?;
    if !patch.is_object() {
        return Err(ApiError::bad_request(
            "error decoding patch: the merge patch must be a JSON object",
        ));
    }
    json_patch::merge(doc, &patch);
    Ok(())
}

/// Applies an RFC 6902 JSON patch; a failed operation (such as a `test`) changes nothing and is a 422.
pub(crate) fn json(doc: &mut Value, body: &[u8]) -> Result<(), ApiError> {
    let parsed: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    // JSON that is no patch (an unknown `op`, a missing `path`) fails when applied: 422, as the real
    // server's patch library reports it.
    let patch: json_patch::Patch = serde_json::from_value(parsed).map_err(|_| {
        let mut e = ApiError::new(
            422,
            "Invalid",
            "the server rejected our request due to an error in our request",
        );
        e.details = Some(Map::new());
        e
    })?;
    if patch.0.len() > MAX_JSON_PATCH_OPERATIONS {
        return Err(ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!(
                "Request entity too large: The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {}",
                patch.0.len()
            ),
        ));
    }
    // Work on a copy: the crate's own rollback asserts instead of failing, and we never panic on input.
    let mut work = doc.clone();
    let mut result = Ok(());
    for (i, op) in patch.0.iter().enumerate() {
        // The real server's patch library lets `test` with a null value pass on a missing path (kube-runtime's
        // finalizer helper relies on it to test that `metadata.finalizers` is absent).
        if let json_patch::PatchOperation::Test(t) = op
            && t.value.is_null()
            && work.pointer(t.path.as_str()).is_none_or(Value::is_null)
        {
            continue;
        }
        if let Err(mut e) = json_patch::patch_unsafe(&mut work, std::slice::from_ref(op)) {
            e.operation = i;
            result = Err(e);
            break;
        }
    }
    match result {
        Ok(()) => {
            *doc = work;
            Ok(())
        }
        Err(e) => {
            let detail = match e.kind {
                json_patch::PatchErrorKind::TestFailed => {
                    format!("testing value {} failed: test failed", e.path)
                }
                _ => format!("{e}"),
            };
            let mut err = ApiError::new(
                422,
                "Invalid",
                "the server rejected our request due to an error in our request",
            );
            let mut details = Map::new();
            details.insert(
                "causes".into(),
                serde_json::json!([{ "reason": "UnexpectedServerResponse", "message": detail }]),
            );
            err.details = Some(details);
            Err(err)
        }
    }
}

/// How a list in a built-in kind is patched strategically.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListStrategy {
    Replace,
    MergePrimitives,
    MergeByKey(&'static str),
}

/// The `patchStrategy`/`patchMergeKey` tags of the built-in kinds served here: only `ObjectMeta` has
/// mergeable lists among them (every other list is atomic).
fn strategy(path: &str) -> ListStrategy {
    match path {
        "metadata.finalizers" => ListStrategy::MergePrimitives,
        "metadata.ownerReferences" => ListStrategy::MergeByKey("uid"),
        _ => ListStrategy::Replace,
    }
}

/// Applies a strategic merge patch (with `$patch`, `$retainKeys`, `$deleteFromPrimitiveList` and
/// `$setElementOrder` directives).
pub(crate) fn strategic(doc: &mut Value, body: &[u8]) -> Result<(), ApiError> {
    let patch = decode_json(body)?;
    let Value::Object(p) = patch else {
        return Err(ApiError::bad_request(
            "error decoding patch: the strategic merge patch must be a JSON object",
        ));
    };
    if !doc.is_object() {
        *doc = Value::Object(Map::new());
    }
    if let Value::Object(d) = doc {
        merge_map(d, &p, "").map_err(|e| {
            ApiError::bad_request(format!("unable to apply strategic merge patch: {e}"))
        })?;
    }
    Ok(())
}

fn child_path(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

fn merge_map(
    doc: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    path: &str,
) -> Result<(), String> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let Value::Object(replacement) = strip_directives(&Value::Object(patch.clone())) else {
                return Err("internal: replacement is not an object".into());
            };
            *doc = replacement;
            return Ok(());
        }
        Some("delete") => {
            doc.clear();
            return Ok(());
        }
        Some(other) => return Err(format!("unknown patch type: {other:?}")),
        None => {}
    }
    for (k, pv) in patch {
        if k == "$patch" || k == "$retainKeys" || k.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let Some(remove) = pv.as_array() else {
                return Err(format!("{k} must be a list"));
            };
            if let Some(Value::Array(list)) = doc.get_mut(field) {
                list.retain(|x| !remove.contains(x));
            }
            continue;
        }
        if k.starts_with('$') {
            return Err(format!("unknown directive {k:?}"));
        }
        let cp = child_path(path, k);
        match pv {
            Value::Null => {
                doc.remove(k);
            }
            Value::Object(pm) => {
                if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
                    doc.remove(k);
                    continue;
                }
                match doc.get_mut(k) {
                    Some(Value::Object(dm)) => merge_map(dm, pm, &cp)?,
                    _ => {
                        let mut fresh = Map::new();
                        merge_map(&mut fresh, pm, &cp)?;
                        doc.insert(k.clone(), Value::Object(fresh));
                    }
                }
            }
            Value::Array(pa) => match (strategy(&cp), doc.get_mut(k)) {
                (ListStrategy::MergePrimitives, Some(Value::Array(da))) => {
                    // The patch's items first, then the original's others, as the real server merges.
                    let mut merged: Vec<Value> = Vec::with_capacity(pa.len() + da.len());
                    for item in pa.iter().chain(da.iter()) {
                        if !merged.contains(item) {
                            merged.push(item.clone());
                        }
                    }
                    *da = merged;
                }
                (ListStrategy::MergeByKey(key), Some(Value::Array(da))) => {
                    merge_keyed_list(da, pa, key, &cp)?
                }
                _ => {
                    doc.insert(k.clone(), strip_directives(pv));
                }
            },
            other => {
                doc.insert(k.clone(), other.clone());
            }
        }
    }
    for (k, order) in patch {
        let (Some(field), Some(order)) = (k.strip_prefix("$setElementOrder/"), order.as_array())
        else {
            continue;
        };
        if strategy(&child_path(path, field)) != ListStrategy::MergePrimitives {
            continue;
        }
        if let Some(Value::Array(list)) = doc.get_mut(field) {
            // The listed items in the order given, then the others as they were.
            let mut ordered: Vec<Value> =
                order.iter().filter(|o| list.contains(o)).cloned().collect();
            ordered.extend(list.iter().filter(|x| !order.contains(x)).cloned());
            *list = ordered;
        }
    }
    if let Some(retain) = patch.get("$retainKeys") {
        let Some(keys) = retain.as_array() else {
            return Err("$retainKeys must be a list".into());
        };
        doc.retain(|k, _| keys.iter().any(|x| x.as_str() == Some(k.as_str())));
    }
    Ok(())
}

fn merge_keyed_list(
    doc: &mut Vec<Value>,
    patch: &[Value],
    key: &str,
    path: &str,
) -> Result<(), String> {
    if patch
        .iter()
        .any(|p| p.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        *doc = patch
            .iter()
            .filter(|p| p.get("$patch").is_none())
            .map(strip_directives)
            .collect();
        return Ok(());
    }
    for item in patch {
        let Value::Object(pm) = item else {
            return Err(format!("{path}: list items must be objects"));
        };
        let Some(kv) = pm.get(key) else {
            return Err(format!(
                "{path}: map: {pm:?} does not contain declared merge key: {key}"
            ));
        };
        let pos = doc.iter().position(|d| d.get(key) == Some(kv));
        if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
            doc.retain(|d| d.get(key) != Some(kv));
            continue;
        }
        match pos {
            Some(i) => {
                if let Value::Object(dm) = &mut doc[i] {
                    merge_map(dm, pm, path)?;
                }
            }
            None => doc.push(strip_directives(item)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_patch_test_failure_changes_nothing() {
        let mut doc = json!({"metadata": {"finalizers": ["a"]}});
        let body = br#"[{"op":"test","path":"/metadata/finalizers","value":["b"]},{"op":"remove","path":"/metadata/finalizers"}]"#;
        let err = json(&mut doc, body).unwrap_err();
        assert_eq!(err.code, 422);
        assert_eq!(doc, json!({"metadata": {"finalizers": ["a"]}}));
    }

    #[test]
    fn strategic_merges_finalizers_and_owner_refs() {
        let mut doc = json!({"metadata": {"finalizers": ["a"], "ownerReferences": [{"uid": "1", "name": "x"}],
            "labels": {"k": "v", "drop": "me"}}, "data": {"a": "b"}});
        let body = br#"{"metadata":{"finalizers":["b"],"ownerReferences":[{"uid":"1","name":"y"},{"uid":"2","name":"z"}],
            "labels":{"drop":null},"$setElementOrder/finalizers":["a","b"]},"data":{"c":"d"}}"#;
        strategic(&mut doc, body).unwrap();
        assert_eq!(doc["metadata"]["finalizers"], json!(["a", "b"]));
        assert_eq!(doc["metadata"]["ownerReferences"][0]["name"], "y");
        assert_eq!(
            doc["metadata"]["ownerReferences"].as_array().unwrap().len(),
            2
        );
        assert_eq!(doc["metadata"]["labels"], json!({"k": "v"}));
        assert_eq!(doc["data"], json!({"a": "b", "c": "d"}));
    }
}
