//! CEL validation rules (`x-kubernetes-validations`). At CRD creation each rule is parsed (the CEL
//! grammar's own parser, with the standard macros and optional syntax) and type-checked against the
//! schema as the real server checks it ([`check`]: `self` and `oldSelf` typed from the schema node,
//! every field, function and operator checked): a rule that does not parse, names an undeclared
//! field, mixes types, or does not give a bool is refused with the real server's message. A rule
//! that reads `oldSelf` (a transition rule) is checked only on an update where the old value exists
//! (in a list, only a list keyed by `x-kubernetes-list-map-keys` pairs items up; elsewhere such a rule
//! is refused, as there), unless it sets `optionalOldSelf`. Evaluation is the `cel` crate's, with
//! cel-go's strings and lists extensions; the Kubernetes libraries (quantities, URLs, IPs and CIDRs,
//! semver, named formats, `isSorted`/`sum`/`min`/`max`, regex `find`) type-check as there but fail
//! when evaluated here, with an error naming the function: never skipped silently.

mod check;
mod decls;
mod lint;
mod types;

use std::sync::{Arc, LazyLock};

use serde_json::Value;

use super::error::FieldError;
pub(crate) use lint::lint;
pub(crate) use types::{ObjectType, Ty};

/// The environment rules are parsed and evaluated in: the standard library, optionals, and cel-go's
/// strings and lists extensions, as the real server declares them.
static ENV: LazyLock<Arc<cel::Env>> = LazyLock::new(|| {
    let mut env = cel::Env::stdlib();
    // Both extensions declare distinct names; a clash would be the crate's bug, and the standard
    // library alone still evaluates every rule our CRDs and CAPI's use.
    let _ = env.add_extension(cel::extensions::strings);
    let _ = env.add_extension(cel::extensions::lists);
    Arc::new(env)
});

/// One compiled rule.
#[derive(Debug, Clone)]
pub(crate) struct Rule {
    rule: String,
    message: String,
    reason: String,
    field_path: String,
    program: Arc<cel::Program>,
    message_program: Option<Arc<cel::Program>>,
    /// Whether the rule reads `oldSelf`.
    transition: bool,
    /// `optionalOldSelf`: the rule also runs without an old value (`oldSelf` is then `optional.none()`).
    optional_old_self: bool,
}

impl Rule {
    /// Whether the rule reads `oldSelf`.
    pub(crate) fn reads_old_self(&self) -> bool {
        self.transition
    }

    /// The rule as the real server names it in evaluation errors: its message, else its text.
    fn named(&self) -> &str {
        if self.message.trim().is_empty() {
            self.rule.trim()
        } else {
            self.message.trim()
        }
    }
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

/// Compiles and type-checks the `x-kubernetes-validations` of a schema node at `path`, whose values
/// have the CEL type `ty`; `uncorrelatable` names the ancestor under which old values cannot be paired.
pub(crate) fn compile(
    list: &Value,
    path: &str,
    ty: &Ty,
    uncorrelatable: Option<&str>,
    errs: &mut Vec<FieldError>,
) -> Vec<Rule> {
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
            // Refused by `lint`, which runs first.
            continue;
        }
        let optional_old_self = m.get("optionalOldSelf").and_then(Value::as_bool);
        let invalid = |field: &str, detail: String| {
            FieldError::invalid_shown(format!("{at}.{field}"), &shown(m), &detail)
        };
        let program = match ENV.compile(text) {
            Ok(p) => p,
            Err(e) => {
                errs.push(invalid(
                    "rule",
                    format!("compilation failed: {}", parse_message(&e)),
                ));
                continue;
            }
        };
        let checked = match check::check(&program, ty, optional_old_self == Some(true)) {
            Ok(c) => c,
            Err(report) => {
                errs.push(invalid("rule", format!("compilation failed: {report}")));
                continue;
            }
        };
        if checked.output != Ty::Bool {
            errs.push(invalid(
                "rule",
                "cel expression must evaluate to a bool".to_string(),
            ));
            continue;
        }
        let message_expression = m
            .get("messageExpression")
            .and_then(Value::as_str)
            .unwrap_or("");
        let message_program = if message_expression.is_empty() {
            None
        } else {
            let compiled = ENV
                .compile(message_expression)
                .map_err(|e| parse_message(&e))
                .and_then(|p| {
                    check::check(&p, ty, optional_old_self == Some(true)).map(|c| (p, c))
                });
            match compiled {
                Ok((p, c)) if c.output == Ty::String => Some(Arc::new(p)),
                Ok(_) => {
                    errs.push(invalid(
                        "messageExpression",
                        "messageExpression must evaluate to a string".to_string(),
                    ));
                    continue;
                }
                Err(report) => {
                    errs.push(invalid(
                        "messageExpression",
                        format!("messageExpression compilation failed: {report}"),
                    ));
                    continue;
                }
            }
        };
        if checked.uses_old_self {
            if let Some(ancestor) = uncorrelatable {
                errs.push(FieldError::invalid(
                    format!("{at}.rule"),
                    &Value::String(text.to_string()),
                    &format!(
                        "oldSelf cannot be used on the uncorrelatable portion of the schema within {ancestor}"
                    ),
                ));
                continue;
            }
        } else if let Some(o) = optional_old_self {
            errs.push(FieldError::invalid(
                format!("{at}.optionalOldSelf"),
                &Value::Bool(o),
                "may not be set if oldSelf is not used in rule",
            ));
            continue;
        }
        let text_of = |k: &str| m.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        out.push(Rule {
            rule: text.to_string(),
            message: text_of("message"),
            reason: m
                .get("reason")
                .and_then(Value::as_str)
                .unwrap_or("FieldValueInvalid")
                .to_string(),
            field_path: text_of("fieldPath"),
            program: Arc::new(program),
            message_program,
            transition: checked.uses_old_self,
            optional_old_self: optional_old_self == Some(true),
        });
    }
    out
}

/// An evaluation error worded as cel-go words the common ones; a function of the Kubernetes
/// libraries, declared for the type checker but not evaluated here, is named as such.
fn evaluation_error(e: &cel::ExecutionError) -> String {
    use cel::ExecutionError as E;
    match e {
        E::NoSuchKey(k) => format!("no such key: {k}"),
        E::IndexOutOfBounds(i) => format!("index out of bounds: {i:?}"),
        E::DivisionByZero(_) => "division by zero".to_string(),
        E::RemainderByZero(_) => "modulus by zero".to_string(),
        E::Overflow(..) => "integer overflow".to_string(),
        // cel-go says no more at run time.
        E::NoSuchOverload(_) | E::ValuesNotComparable(..) | E::UnsupportedBinaryOperator(..) => {
            "no such overload".to_string()
        }
        E::UndeclaredReference(name) => format!(
            "{name}: not supported by the emulator's CEL evaluator (it type-checks as on a real server)"
        ),
        other => other.to_string(),
    }
}

/// Checks `rules` on `value` (at `field`, as messages name it; `declared` is the schema's type, which
/// the real server shows in evaluation errors), with `old` the value before an update. `this` and
/// `previous` are the values as rules see them, or why they could not be made: then each rule that
/// would run is an error saying so, never skipped.
#[allow(clippy::too_many_arguments)]
pub(crate) fn check(
    rules: &[Rule],
    declared: &str,
    value: &Value,
    this: Result<cel::Value, String>,
    previous: Option<Result<cel::Value, String>>,
    field: &str,
    errs: &mut Vec<FieldError>,
) {
    let shown = format!("{declared:?}");
    for rule in rules {
        if rule.transition && previous.is_none() && !rule.optional_old_self {
            continue;
        }
        let at = if rule.field_path.is_empty() {
            field.to_string()
        } else {
            format!("{field}{}", rule.field_path)
        };
        let unusable = match (&this, &previous) {
            (Err(e), _) => Some(e),
            (_, Some(Err(e))) if rule.transition => Some(e),
            _ => None,
        };
        if let Some(e) = unusable {
            errs.push(FieldError::invalid_shown(
                field,
                &shown,
                &format!("{e} evaluating rule: {}", rule.named()),
            ));
            continue;
        }
        let mut ctx = cel::Context::with_env(Arc::clone(&ENV));
        if let Ok(v) = &this {
            ctx.add_variable_from_value("self", v.clone());
        }
        let old_self = match &previous {
            Some(Ok(p)) if rule.optional_old_self => Some(cel::Value::Opaque(Arc::new(
                cel::objects::OptionalValue::of(p.clone()),
            ))),
            Some(Ok(p)) => Some(p.clone()),
            _ if rule.optional_old_self => Some(cel::Value::Opaque(Arc::new(
                cel::objects::OptionalValue::none(),
            ))),
            _ => None,
        };
        if let Some(o) = old_self {
            ctx.add_variable_from_value("oldSelf", o);
        }
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
                    .or_else(|| (!rule.message.is_empty()).then(|| rule.message.trim().to_string()))
                    .unwrap_or_else(|| format!("failed rule: {}", rule.rule.trim()));
                errs.push(FieldError::rule_failed(at, &rule.reason, value, &message));
            }
            // The type checker admits only rules that give a bool.
            Ok(other) => errs.push(FieldError::invalid_shown(
                field,
                &shown,
                &format!(
                    "rule result is not a boolean: {other:?} evaluating rule: {}",
                    rule.named()
                ),
            )),
            Err(e) => {
                let error = evaluation_error(&e);
                let detail = if error.starts_with("no such overload") {
                    format!(
                        "'{error}': call arguments did not match a supported operator, function or macro signature for rule: {}",
                        rule.named()
                    )
                } else {
                    format!("{error} evaluating rule: {}", rule.named())
                };
                errs.push(FieldError::invalid_shown(field, &shown, &detail));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn object() -> Ty {
        Ty::Object(Arc::new(ObjectType {
            name: "selfType1".into(),
            fields: BTreeMap::from([
                ("min".to_string(), Ty::Int),
                ("name".to_string(), Ty::String),
                ("args".to_string(), Ty::list(Ty::String)),
            ]),
        }))
    }

    /// The message of the CRD error for one rule on `object()`, after its shown rule.
    fn refusal(rule: &str) -> String {
        let mut errs = Vec::new();
        let r = compile(&json!([{"rule": rule}]), "p", &object(), None, &mut errs);
        assert!(r.is_empty(), "{rule} compiled");
        assert_eq!(errs.len(), 1, "{errs:?}");
        let m = &errs[0].message;
        m[m.find("\"OptionalOldSelf\":null}: ").map_or(0, |i| i + 25)..].to_string()
    }

    #[test]
    fn rules_are_type_checked_against_the_schema_with_cel_go_messages() {
        assert_eq!(
            refusal("self.nope > 0"),
            "compilation failed: ERROR: <input>:1:5: undefined field 'nope'\n | self.nope > 0\n | ....^"
        );
        assert_eq!(
            refusal("self.min == 'a'"),
            "compilation failed: ERROR: <input>:1:10: found no matching overload for '_==_' applied to '(int, string)'\n | self.min == 'a'\n | .........^"
        );
        assert_eq!(
            refusal("self.min"),
            "cel expression must evaluate to a bool"
        );
        assert!(
            refusal("self.name.startsWith(1)")
                .contains("found no matching overload for 'startsWith' applied to 'string.(int)'"),
        );
        assert!(refusal("[1, 'a'].size() == 2").contains("expected type 'int' but found 'string'"));
        assert!(
            refusal("self.all(x, x == 1)").contains(
                "expression of type 'selfType1' cannot be range of a comprehension (must be list, map, or dynamic)"
            )
        );
        assert!(refusal("nope(self)").contains("undeclared reference to 'nope' (in container '')"));
        let mut errs = Vec::new();
        let ok = compile(
            &json!([
                {"rule": "size(self.name) > 0 && has(self.min) && self.min <= 3.5"},
                {"rule": "self.args.all(a, a.startsWith('x')) && !(self.name in self.args)"},
                {"rule": "[has(self.name), has(self.min)].filter(x, x == true).size() == 1"},
                {"rule": "self.min == oldSelf.min", "messageExpression": "'was ' + string(oldSelf.min)"},
                {"rule": "type(self.name) == string && self.args.map(a, size(a)).exists(n, n > 1)"},
                {"rule": "self.name.lowerAscii().split('-').size() < 3 && sets.contains(self.args, ['a'])"}
            ]),
            "p",
            &object(),
            None,
            &mut errs,
        );
        assert!(errs.is_empty(), "{errs:?}");
        assert_eq!(ok.len(), 6);
        assert!(ok[3].reads_old_self() && !ok[0].reads_old_self());
    }

    #[test]
    fn transition_rules_need_a_correlatable_place() {
        let mut errs = Vec::new();
        compile(
            &json!([{"rule": "self.min == oldSelf.min"}, {"rule": "self.min > 0", "optionalOldSelf": true}]),
            "p.items",
            &object(),
            Some("p"),
            &mut errs,
        );
        let shown: Vec<String> = errs.iter().map(FieldError::full).collect();
        assert_eq!(
            shown,
            [
                "p.items.x-kubernetes-validations[0].rule: Invalid value: \"self.min == oldSelf.min\": oldSelf cannot be used on the uncorrelatable portion of the schema within p",
                "p.items.x-kubernetes-validations[1].optionalOldSelf: Invalid value: true: may not be set if oldSelf is not used in rule"
            ]
        );
    }

    #[test]
    fn a_rule_that_does_not_parse_is_refused() {
        let mut errs = Vec::new();
        compile(
            &json!([{"rule": "self.a ==", "message": "bad"}]),
            "p",
            &Ty::Dyn,
            None,
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
