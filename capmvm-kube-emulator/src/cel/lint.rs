//! The checks of each rule's own fields that the real server makes with the schema's (before any
//! rule is compiled): a rule is given, a message or messageExpression is not blank and has no line
//! break, a rule with line breaks has a message, a reason is one it supports, a fieldPath names a
//! declared field of the node.

use serde_json::Value;

use crate::error::FieldError;

const REASONS: &[&str] = &[
    "FieldValueDuplicate",
    "FieldValueForbidden",
    "FieldValueInvalid",
    "FieldValueRequired",
];

/// Checks the `x-kubernetes-validations` of the schema node `node` at `path`.
pub(crate) fn lint(node: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let Some(list) = node
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
    else {
        return;
    };
    for (i, r) in list.iter().enumerate() {
        let at = format!("{path}.x-kubernetes-validations[{i}]");
        let text = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("");
        let (rule, message, message_expression) =
            (text("rule"), text("message"), text("messageExpression"));
        let shown = |s: &str| Value::String(s.to_string());
        if rule.trim().is_empty() {
            errs.push(FieldError::required_detail(
                format!("{at}.rule"),
                "rule is not specified",
            ));
        } else if !message.is_empty() && message.trim().is_empty() {
            errs.push(FieldError::invalid(
                format!("{at}.message"),
                &shown(message),
                "must be non-empty if specified",
            ));
        } else if message.trim().contains('\n') {
            errs.push(FieldError::invalid(
                format!("{at}.message"),
                &shown(message),
                "must not contain line breaks",
            ));
        } else if rule.trim().contains('\n') && message.trim().is_empty() {
            errs.push(FieldError::required_detail(
                format!("{at}.message"),
                "message must be specified if rule contains line breaks",
            ));
        }
        if !message_expression.is_empty() && message_expression.trim().is_empty() {
            errs.push(FieldError::required_detail(
                format!("{at}.messageExpression"),
                "messageExpression must be non-empty if specified",
            ));
        }
        if let Some(reason) = r.get("reason").and_then(Value::as_str)
            && !REASONS.contains(&reason)
        {
            let allowed: Vec<String> = REASONS.iter().map(|s| (*s).to_string()).collect();
            errs.push(FieldError::not_supported(
                format!("{at}.reason"),
                &shown(reason),
                &allowed,
            ));
        }
        let field_path = text("fieldPath");
        if !field_path.is_empty() {
            if field_path.trim().is_empty() {
                errs.push(FieldError::invalid(
                    format!("{at}.fieldPath"),
                    &shown(field_path),
                    "must be non-empty if specified",
                ));
            }
            if field_path.contains('\n') {
                errs.push(FieldError::invalid(
                    format!("{at}.fieldPath"),
                    &shown(field_path),
                    "must not contain line breaks",
                ));
            }
            if !field_path_valid(node, field_path) {
                errs.push(FieldError::invalid(
                    format!("{at}.fieldPath"),
                    &shown(field_path),
                    "must be a valid path",
                ));
            }
        }
    }
}

/// Whether `path` (`.a.b`, `['a-b']`, `.list[0]`) names a field declared under `node`.
fn field_path_valid(node: &Value, path: &str) -> bool {
    let mut cur = node;
    let mut rest = path.trim();
    if rest.is_empty() {
        return false;
    }
    while !rest.is_empty() {
        let key: String;
        if let Some(r) = rest.strip_prefix("['") {
            let Some(end) = r.find("']") else {
                return false;
            };
            key = r[..end].to_string();
            rest = &r[end + 2..];
        } else if let Some(r) = rest.strip_prefix('[') {
            // A list index or a map key in brackets: the items (or values) schema.
            let Some(end) = r.find(']') else {
                return false;
            };
            let Some(next) = cur.get("items").or_else(|| cur.get("additionalProperties")) else {
                return false;
            };
            cur = next;
            rest = &r[end + 1..];
            continue;
        } else if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            key = r[..end].to_string();
            rest = &r[end..];
        } else {
            return false;
        }
        if key.is_empty() {
            return false;
        }
        match cur.get("properties").and_then(|p| p.get(&key)) {
            Some(next) => cur = next,
            None => match cur.get("additionalProperties") {
                Some(next @ Value::Object(_)) => cur = next,
                _ => return false,
            },
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn field_paths_name_declared_fields() {
        let node = json!({"type": "object", "properties": {
            "a": {"type": "object", "properties": {"b-c": {"type": "string"}}},
            "m": {"type": "object", "additionalProperties": {"type": "string"}}}});
        assert!(field_path_valid(&node, ".a"));
        assert!(field_path_valid(&node, ".a['b-c']"));
        assert!(field_path_valid(&node, ".m.anything"));
        assert!(!field_path_valid(&node, ".nope"));
        assert!(!field_path_valid(&node, "a"));
        assert!(!field_path_valid(&node, ".a.b-c.d"));
    }
}
