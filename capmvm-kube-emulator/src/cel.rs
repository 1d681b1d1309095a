//! CEL validation rules (`x-kubernetes-validations`), evaluated with the `cel` crate (the CEL
//! grammar's own parser, the standard macros and functions: `has`, `all`, `exists`, `exists_one`,
//! `map`, `filter`, `in`, `size`, string `contains`/`startsWith`/`endsWith`/`matches`): `self` is the
//! value the rule is declared on, `oldSelf` the same value before an update. A rule that reads
//! `oldSelf` (a transition rule) is checked only on an update where the old value exists (in a list,
//! only a list keyed by `x-kubernetes-list-map-keys` pairs items up). A rule that does not parse is
//! refused when the CRD is created, as the real server refuses it.

use serde_json::Value;

use super::error::FieldError;

/// One compiled rule.
#[derive(Debug, Clone)]
pub(crate) struct Rule {
    rule: String,
    message: String,
    reason: String,
    field_path: String,
    program: std::sync::Arc<cel::Program>,
    message_program: Option<std::sync::Arc<cel::Program>>,
    /// Whether the rule reads `oldSelf`.
    transition: bool,
}

/// The rule as the real server shows it in a CRD error (Go's `%v` of its `ValidationRule`).
fn shown(r: &serde_json::Map<String, Value>) -> String {
    let s = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("");
    let opt = |k: &str| {
        r.get(k)
            .filter(|v| !v.is_null())
            .map_or_else(|| "null".to_string(), Value::to_string)
    };
    // Go's JSON escapes `<`, `>` and `&` in strings.
    let go = |v: &str| {
        Value::String(v.to_string())
            .to_string()
            .replace('<', "\\u003c")
            .replace('>', "\\u003e")
            .replace('&', "\\u0026")
    };
    format!(
        "{{\"Rule\":{},\"Message\":{},\"MessageExpression\":{},\"Reason\":{},\"FieldPath\":{},\"OptionalOldSelf\":{}}}",
        go(s("rule")),
        go(s("message")),
        go(s("messageExpression")),
        opt("reason"),
        go(s("fieldPath")),
        opt("optionalOldSelf")
    )
}

/// The parser's message as the real server prints it (its source lines indented by a space).
fn parse_message(e: &impl std::fmt::Display) -> String {
    e.to_string()
        .lines()
        .map(|l| {
            if l.starts_with('|') {
                format!(" {l}")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Compiles the `x-kubernetes-validations` of a schema node at `path`.
pub(crate) fn compile(list: &Value, path: &str, errs: &mut Vec<FieldError>) -> Vec<Rule> {
    let Some(list) = list.as_array() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (i, r) in list.iter().enumerate() {
        let at = format!("{path}.x-kubernetes-validations[{i}]");
        let Some(m) = r.as_object() else {
            errs.push(FieldError::invalid(at, r, "must be an object"));
            continue;
        };
        let text = m.get("rule").and_then(Value::as_str).unwrap_or("");
        if text.trim().is_empty() {
            errs.push(FieldError::required(format!("{at}.rule")));
            continue;
        }
        let program = match cel::Program::compile(text) {
            Ok(p) => p,
            Err(e) => {
                errs.push(FieldError::invalid_shown(
                    format!("{at}.rule"),
                    &shown(m),
                    &format!("compilation failed: {}", parse_message(&e)),
                ));
                continue;
            }
        };
        let message_expression = m
            .get("messageExpression")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let message_program = if message_expression.is_empty() {
            None
        } else {
            match cel::Program::compile(&message_expression) {
                Ok(p) => Some(std::sync::Arc::new(p)),
                Err(e) => {
                    errs.push(FieldError::invalid_shown(
                        format!("{at}.messageExpression"),
                        &shown(m),
                        &format!(
                            "messageExpression compilation failed: {}",
                            parse_message(&e)
                        ),
                    ));
                    continue;
                }
            }
        };
        let transition = program.references().has_variable("oldSelf");
        out.push(Rule {
            rule: text.to_string(),
            message: m
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            reason: m
                .get("reason")
                .and_then(Value::as_str)
                .unwrap_or("FieldValueInvalid")
                .to_string(),
            field_path: m
                .get("fieldPath")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            program: std::sync::Arc::new(program),
            message_program,
            transition,
        });
    }
    out
}

/// The JSON type name the real server shows as a failed rule's value.
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Checks `rules` on `value` (at `field`, as messages name it), with `old` the value before an update.
pub(crate) fn check(
    rules: &[Rule],
    value: &Value,
    old: Option<&Value>,
    field: &str,
    errs: &mut Vec<FieldError>,
) {
    if rules.is_empty() {
        return;
    }
    let Ok(this) = cel::to_value(value) else {
        return;
    };
    let previous = old.and_then(|o| cel::to_value(o).ok());
    for rule in rules {
        if rule.transition && previous.is_none() {
            continue;
        }
        let mut ctx = cel::Context::default();
        ctx.add_variable_from_value("self", this.clone());
        if let Some(p) = &previous {
            ctx.add_variable_from_value("oldSelf", p.clone());
        }
        let at = if rule.field_path.is_empty() {
            field.to_string()
        } else {
            format!("{field}{}", rule.field_path)
        };
        let shown = type_name(value);
        match rule.program.execute(&ctx) {
            Ok(cel::Value::Bool(true)) => {}
            Ok(cel::Value::Bool(false)) => {
                let message = rule
                    .message_program
                    .as_ref()
                    .and_then(|p| match p.execute(&ctx) {
                        Ok(cel::Value::String(s)) if !s.trim().is_empty() => Some(s.to_string()),
                        _ => None,
                    })
                    .or_else(|| (!rule.message.is_empty()).then(|| rule.message.clone()))
                    .unwrap_or_else(|| format!("failed rule: {}", rule.rule));
                errs.push(FieldError::rule_failed(at, &rule.reason, value, &message));
            }
            Ok(other) => errs.push(FieldError::invalid_shown(
                at,
                &format!("{shown:?}"),
                &format!(
                    "rule result is not a boolean: {other:?} (rule: {})",
                    rule.rule
                ),
            )),
            Err(e) => errs.push(FieldError::invalid_shown(
                at,
                &format!("{shown:?}"),
                &format!("{e}"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rules(v: Value) -> Vec<Rule> {
        let mut errs = Vec::new();
        let r = compile(&v, "s", &mut errs);
        assert!(errs.is_empty(), "{errs:?}");
        r
    }

    #[test]
    fn rules_see_self_and_old_self() {
        let r = rules(json!([
            {"rule": "self.all(x, self.exists_one(y, x.name == y.name))", "message": "names must be unique"},
            {"rule": "self.size() >= oldSelf.size()", "message": "may not shrink"}
        ]));
        let mut errs = Vec::new();
        check(
            &r,
            &json!([{"name": "a"}, {"name": "a"}]),
            None,
            "spec.args",
            &mut errs,
        );
        assert_eq!(errs.len(), 1, "the transition rule waits for an update");
        assert_eq!(
            errs[0].full(),
            "spec.args: Invalid value: names must be unique"
        );
        let mut errs = Vec::new();
        check(
            &r,
            &json!([{"name": "a"}]),
            Some(&json!([{"name": "a"}, {"name": "b"}])),
            "spec.args",
            &mut errs,
        );
        assert_eq!(errs[0].message, "Invalid value: may not shrink");
    }

    #[test]
    fn a_rule_that_does_not_parse_is_refused() {
        let mut errs = Vec::new();
        compile(
            &json!([{"rule": "self.a ==", "message": "bad"}]),
            "p",
            &mut errs,
        );
        assert_eq!(errs[0].field, "p.x-kubernetes-validations[0].rule");
        assert!(
            errs[0].message.starts_with(
                "Invalid value: {\"Rule\":\"self.a ==\",\"Message\":\"bad\",\"MessageExpression\":\"\",\"Reason\":null,\"FieldPath\":\"\",\"OptionalOldSelf\":null}: compilation failed: ERROR: <input>:1:10: Syntax error:"
            ),
            "{}",
            errs[0].message
        );
        assert!(
            errs[0].message.contains("\n | self.a ==\n | .........^"),
            "{}",
            errs[0].message
        );
    }
}
