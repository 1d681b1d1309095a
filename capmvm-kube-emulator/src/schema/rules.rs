//! CEL rules (`x-kubernetes-validations`) in a schema: compiled and type-checked when the CRD is
//! written, evaluated once the object passes the schema, as the real server runs them: not at all
//! when the object has an error that makes its rules meaningless (a wrong type, a missing or
//! unsupported value, too long or too many), which is then said in one more error.

use serde_json::Value;

use super::path::Path;
use super::{Additional, Schema};
use crate::error::{FieldError, FieldErrorKind};

/// The real server's error when rules were not run because of the object's other errors.
const NOT_CHECKED: &str = "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation";

impl Schema {
    /// Evaluates the rules of the whole object `v` (`old` before an update), after the schema's
    /// other errors `errs`: skipped, with an error saying so, when one of those blocks them.
    pub(crate) fn check_rules_root(
        &self,
        v: &Value,
        old: Option<&Value>,
        errs: &mut Vec<FieldError>,
    ) {
        let blocking = errs.iter().any(|e| {
            matches!(
                e.kind,
                FieldErrorKind::NotSupported
                    | FieldErrorKind::Required
                    | FieldErrorKind::TooLong
                    | FieldErrorKind::TooMany
                    | FieldErrorKind::TypeInvalid
            )
        });
        if !self.has_rules {
            return;
        }
        if blocking {
            errs.push(FieldError::invalid_shown("<nil>", "null", NOT_CHECKED));
            return;
        }
        self.check_rules(v, old, &Path::Root, errs, true);
    }

    fn check_rules(
        &self,
        v: &Value,
        old: Option<&Value>,
        path: &Path<'_>,
        errs: &mut Vec<FieldError>,
        resource_root: bool,
    ) {
        if !self.has_rules {
            return;
        }
        // The real server validates non-null values only: a rule about a null (an unset optional
        // field written as `null`) is the parent's to state.
        if !self.rules.is_empty() && !v.is_null() {
            let this = self.to_cel(v, resource_root);
            let previous = old
                .filter(|_| self.rules.iter().any(crate::cel::Rule::reads_old_self))
                .map(|o| self.to_cel(o, resource_root));
            let declared = self.ty.as_deref().unwrap_or("");
            // The real server names the root `<nil>` (a nil field path).
            let field = match path.render() {
                f if f.is_empty() => "<nil>".to_string(),
                f => f,
            };
            crate::cel::check(&self.rules, declared, v, this, previous, &field, errs);
        }
        match v {
            Value::Object(m) => {
                for (k, cv) in m {
                    if resource_root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                        continue;
                    }
                    let child = match (self.property(k), &self.additional) {
                        (Some(c), _) => c,
                        (None, Some(Additional::Schema(c))) => &**c,
                        _ => continue,
                    };
                    let before = old.and_then(|o| o.get(k));
                    child.check_rules(cv, before, &path.field(k), errs, child.embedded);
                }
            }
            Value::Array(a) => {
                let Some(items) = self.items.as_deref() else {
                    return;
                };
                // Only a keyed list pairs its items with the old ones (for transition rules).
                let keyed =
                    self.list_type.as_deref() == Some("map") && !self.list_map_keys.is_empty();
                let olds = old.and_then(Value::as_array).filter(|_| keyed);
                for (i, item) in a.iter().enumerate() {
                    let before = olds.and_then(|olds| {
                        olds.iter()
                            .find(|o| self.list_map_keys.iter().all(|k| o.get(k) == item.get(k)))
                    });
                    items.check_rules(item, before, &path.item(i), errs, items.embedded);
                }
            }
            _ => {}
        }
    }

    /// Compiles and type-checks the CEL rules of this node and of those below it (`raw` is the
    /// node's JSON), as the real server does once the schema is otherwise valid. `uncorrelatable`
    /// names the nearest ancestor under which an old value cannot be paired with the new one.
    pub(crate) fn compile_rules(
        &mut self,
        raw: &Value,
        path: &str,
        resource_root: bool,
        uncorrelatable: Option<&str>,
        errs: &mut Vec<FieldError>,
    ) {
        if let Some(list) = raw.get("x-kubernetes-validations") {
            match self.cel_type(resource_root, &super::cel_type::self_type_name()) {
                Some(ty) => {
                    self.rules = crate::cel::compile(list, path, &ty, uncorrelatable, errs);
                }
                None => errs.push(FieldError::internal(
                    format!("{path}.x-kubernetes-validations"),
                    "failed to convert to declType for CEL validation rules",
                )),
            }
        }
        let below_map = uncorrelatable.or(self.map_atomic.then_some(path));
        if let Some(props) = &mut self.properties {
            for (k, child) in props.iter_mut() {
                if let Some(raw_child) = raw.get("properties").and_then(|p| p.get(k)) {
                    let embedded = child.embedded;
                    child.compile_rules(
                        raw_child,
                        &format!("{path}.properties[{k}]"),
                        embedded,
                        below_map,
                        errs,
                    );
                }
            }
        }
        if let (Some(Additional::Schema(child)), Some(raw_child)) =
            (&mut self.additional, raw.get("additionalProperties"))
        {
            let embedded = child.embedded;
            child.compile_rules(
                raw_child,
                &format!("{path}.additionalProperties"),
                embedded,
                below_map,
                errs,
            );
        }
        let keyed = self.list_type.as_deref() == Some("map");
        let below_list = uncorrelatable.or((!keyed).then_some(path));
        if let (Some(child), Some(raw_child)) = (&mut self.items, raw.get("items")) {
            let embedded = child.embedded;
            child.compile_rules(
                raw_child,
                &format!("{path}.items"),
                embedded,
                below_list,
                errs,
            );
        }
        self.has_rules = !self.rules.is_empty()
            || self.properties.iter().flatten().any(|(_, c)| c.has_rules)
            || matches!(&self.additional, Some(Additional::Schema(c)) if c.has_rules)
            || self.items.as_ref().is_some_and(|c| c.has_rules);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Schema {
        Schema::compile(
            &json!({"type": "object", "properties": {"spec": {"type": "object",
                "x-kubernetes-validations": [
                    {"rule": "self.min <= self.max", "message": "min must not exceed max"},
                    {"rule": "!has(oldSelf.zone) || self.zone == oldSelf.zone", "message": "zone is immutable"},
                    {"rule": "!has(self.ratio) || self.ratio == 1.0 || self.foo__dash__bar == 'x'"}
                ],
                "properties": {
                    "min": {"type": "integer"}, "max": {"type": "integer"},
                    "zone": {"type": "string", "enum": ["a", "b"]},
                    "ratio": {"type": "number"}, "foo-bar": {"type": "string"}
                }}}}),
            "schema",
        )
        .unwrap()
    }

    fn full(errs: &[FieldError]) -> Vec<String> {
        errs.iter().map(FieldError::full).collect()
    }

    #[test]
    fn rules_see_declared_types_and_escaped_names() {
        let s = schema();
        // `ratio` is a number: 1 is 1.0 to rules, as on the real server.
        let ok = json!({"spec": {"min": 1, "max": 2, "ratio": 1, "foo-bar": "y"}});
        assert_eq!(full(&s.validate_root(&ok, None)), Vec::<String>::new());
        let bad = json!({"spec": {"min": 3, "max": 2, "ratio": 2, "foo-bar": "y"}});
        assert_eq!(
            full(&s.validate_root(&bad, None)),
            [
                "spec: Invalid value: min must not exceed max",
                "spec: Invalid value: failed rule: !has(self.ratio) || self.ratio == 1.0 || self.foo__dash__bar == 'x'"
            ]
        );
        let moved = json!({"spec": {"min": 1, "max": 2, "zone": "b"}});
        let before = json!({"spec": {"min": 1, "max": 2, "zone": "a"}});
        assert_eq!(
            full(&s.validate_root(&moved, Some(&before))),
            ["spec: Invalid value: zone is immutable"]
        );
    }

    #[test]
    fn rules_never_skip_silently() {
        let s = schema();
        // A field a rule reads is absent: an evaluation error naming the rule.
        assert_eq!(
            full(&s.validate_root(&json!({"spec": {"min": 1}}), None)),
            [
                "spec: Invalid value: \"object\": no such key: max evaluating rule: min must not exceed max"
            ]
        );
        // An error that makes rules meaningless: they are not run, and the answer says so.
        assert_eq!(
            full(&s.validate_root(
                &json!({"spec": {"min": "one", "max": 2, "zone": "c"}}),
                None
            )),
            [
                "spec.min: Invalid value: \"string\": spec.min in body must be of type integer: \"string\"",
                "spec.zone: Unsupported value: \"c\": supported values: \"a\", \"b\"",
                "<nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation"
            ]
        );
    }

    #[test]
    fn an_error_ratcheted_away_does_not_keep_rules_from_running() {
        let s = schema();
        // `zone: c` was stored before the enum existed and is unchanged: not an error, and not a
        // reason to skip the rules either.
        let before = json!({"spec": {"min": 1, "max": 2, "zone": "c"}});
        let now = json!({"spec": {"min": 3, "max": 2, "zone": "c"}});
        assert_eq!(
            full(&s.validate_root(&now, Some(&before))),
            ["spec: Invalid value: min must not exceed max"]
        );
    }

    #[test]
    fn an_undeclared_field_is_refused_with_the_crd() {
        let errs = Schema::compile(
            &json!({"type": "object", "properties": {"spec": {"type": "object",
                "x-kubernetes-validations": [{"rule": "self.replicas > 0"}],
                "properties": {"size": {"type": "integer"}}}}}),
            "spec.validation.openAPIV3Schema",
        )
        .unwrap_err();
        assert_eq!(
            full(&errs),
            [
                "spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule: Invalid value: {\"Rule\":\"self.replicas \\u003e 0\",\"Message\":\"\",\"MessageExpression\":\"\",\"Reason\":null,\"FieldPath\":\"\",\"OptionalOldSelf\":null}: compilation failed: ERROR: <input>:1:5: undefined field 'replicas'\n | self.replicas > 0\n | ....^"
            ]
        );
    }
}
