//! Validation of a value against its schema, with the messages and the order of errors of the real
//! server's validator.

use base64::Engine as _;
use serde_json::{Map, Value};

use super::Schema;
use super::path::Path;
use crate::error::FieldError;
use crate::meta;

impl Schema {
    /// Validates a whole object (the root: `apiVersion`, `kind` and `metadata` are not checked here).
    pub(crate) fn validate_root(&self, v: &Value, old: Option<&Value>) -> Vec<FieldError> {
        let mut errs = Vec::new();
        self.validate(v, old, &Path::Root, &mut errs, true);
        // The real validator reports missing fields after every wrong value.
        let (required, mut values): (Vec<FieldError>, Vec<FieldError>) = errs
            .into_iter()
            .partition(|e| e.kind == crate::error::FieldErrorKind::Required);
        values.extend(required);
        // Errors ratcheted away do not keep rules from running.
        if let Some(before) = old {
            values.retain(|e| super::still_an_error(e, v, before));
        }
        self.check_rules_root(v, old, &mut values);
        values
    }

    fn validate(
        &self,
        v: &Value,
        old: Option<&Value>,
        path: &Path<'_>,
        errs: &mut Vec<FieldError>,
        root: bool,
    ) {
        if v.is_null() {
            if !self.nullable && (self.ty.is_some() || self.int_or_string) {
                let t = self.ty.as_deref().unwrap_or("integer,string");
                let shown = &path.shown();
                // The real validator shows the value's type as the invalid value.
                errs.push(FieldError::type_invalid(
                    shown,
                    &Value::String("null".into()),
                    &format!("{shown} in body must be of type {t}: \"null\""),
                ));
            }
            return;
        }
        if self.int_or_string {
            if !(v.is_string() || is_integer(v)) {
                let shown = &path.shown();
                errs.push(FieldError::type_invalid(
                    shown,
                    &Value::String(type_name(v).into()),
                    &format!(
                        "{shown} in body must be of type integer,string: {:?}",
                        type_name(v)
                    ),
                ));
                return;
            }
        } else if let Some(t) = &self.ty
            && !type_matches(t, v)
        {
            let shown = &path.shown();
            errs.push(FieldError::type_invalid(
                shown,
                &Value::String(type_name(v).into()),
                &format!("{shown} in body must be of type {t}: {:?}", type_name(v)),
            ));
            return;
        }
        if let Some(en) = &self.enumeration
            && !en.iter().any(|e| json_eq(e, v))
        {
            let allowed: Vec<String> = en
                .iter()
                .map(|e| e.as_str().map_or_else(|| e.to_string(), str::to_string))
                .collect();
            let shown = &path.shown();
            errs.push(FieldError::not_supported(shown, v, &allowed));
        }
        match v {
            Value::Number(n) => self.validate_number(n.as_f64().unwrap_or(0.0), v, path, errs),
            Value::String(s) => self.validate_string(s, v, path, errs),
            Value::Array(a) => self.validate_array(a, v, old, path, errs),
            Value::Object(m) => self.validate_object(m, v, old, path, errs, root),
            _ => {}
        }
        for s in &self.all_of {
            s.validate(v, old, path, errs, root);
        }
        if !self.any_of.is_empty() && !self.any_of.iter().any(|s| s.passes(v)) {
            let shown = &path.shown();
            errs.push(FieldError::invalid(
                shown,
                v,
                &format!("{shown} in body must validate at least one schema (anyOf)"),
            ));
        }
        if !self.one_of.is_empty() {
            let n = self.one_of.iter().filter(|s| s.passes(v)).count();
            if n != 1 {
                let shown = &path.shown();
                errs.push(FieldError::invalid(
                    shown,
                    v,
                    &format!("{shown} in body must validate one and only one schema (oneOf)"),
                ));
            }
        }
        if let Some(not) = &self.not
            && not.passes(v)
        {
            let shown = &path.shown();
            errs.push(FieldError::invalid(
                shown,
                v,
                &format!("{shown} in body must not validate the schema (not)"),
            ));
        }
    }

    fn passes(&self, v: &Value) -> bool {
        let mut errs = Vec::new();
        self.validate(v, None, &Path::Root, &mut errs, false);
        errs.is_empty()
    }

    fn validate_number(&self, n: f64, v: &Value, path: &Path<'_>, errs: &mut Vec<FieldError>) {
        if let Some(max) = self.maximum {
            if self.exclusive_maximum && n >= max {
                let shown = &path.shown();
                errs.push(FieldError::invalid(
                    shown,
                    v,
                    &format!("{shown} in body should be less than {}", num(max)),
                ));
            } else if n > max {
                let shown = &path.shown();
                errs.push(FieldError::invalid(
                    shown,
                    v,
                    &format!(
                        "{shown} in body should be less than or equal to {}",
                        num(max)
                    ),
                ));
            }
        }
        if let Some(min) = self.minimum {
            if self.exclusive_minimum && n <= min {
                let shown = &path.shown();
                errs.push(FieldError::invalid(
                    shown,
                    v,
                    &format!("{shown} in body should be greater than {}", num(min)),
                ));
            } else if n < min {
                let shown = &path.shown();
                errs.push(FieldError::invalid(
                    shown,
                    v,
                    &format!(
                        "{shown} in body should be greater than or equal to {}",
                        num(min)
                    ),
                ));
            }
        }
        if let Some(m) = self.multiple_of
            && m != 0.0
            && (n / m).fract().abs() > 1e-9
        {
            let shown = &path.shown();
            errs.push(FieldError::invalid(
                shown,
                v,
                &format!("{shown} in body should be a multiple of {}", num(m)),
            ));
        }
        if self.ty.as_deref() == Some("integer")
            && self.format.as_deref() == Some("int32")
            && !(f64::from(i32::MIN)..=f64::from(i32::MAX)).contains(&n)
        {
            // Word for word what the real validator answers (its path lost, its field `<nil>`).
            errs.push(FieldError::invalid(
                "<nil>",
                &Value::String(String::new()),
                &format!(
                    "Checked value must be of type integer with format int32 in {}",
                    path.shown()
                ),
            ));
        }
    }

    fn validate_string(&self, s: &str, v: &Value, path: &Path<'_>, errs: &mut Vec<FieldError>) {
        let len = s.chars().count() as u64;
        if let Some(max) = self.max_length
            && len > max
        {
            let shown = &path.shown();
            errs.push(FieldError::too_long(shown, max));
        }
        if let Some(min) = self.min_length
            && len < min
        {
            let shown = &path.shown();
            errs.push(FieldError::invalid(
                shown,
                v,
                &format!("{shown} in body should be at least {min} chars long"),
            ));
        }
        if let Some((src, re)) = &self.pattern
            && !re.is_match(s)
        {
            let shown = &path.shown();
            errs.push(FieldError::invalid(
                shown,
                v,
                &format!("{shown} in body should match '{src}'"),
            ));
        }
        if let Some(f) = &self.format
            && !format_ok(f, s)
        {
            let shown = &path.shown();
            errs.push(FieldError::type_invalid(
                shown,
                v,
                &format!("{shown} in body must be of type {f}: {s:?}"),
            ));
        }
    }

    fn validate_array(
        &self,
        a: &[Value],
        v: &Value,
        old: Option<&Value>,
        path: &Path<'_>,
        errs: &mut Vec<FieldError>,
    ) {
        if let Some(max) = self.max_items
            && a.len() as u64 > max
        {
            let shown = &path.shown();
            errs.push(FieldError::too_many(shown, a.len(), max, "items"));
        }
        if let Some(min) = self.min_items
            && (a.len() as u64) < min
        {
            let shown = &path.shown();
            errs.push(FieldError::invalid(
                shown,
                v,
                &format!("{shown} in body should have at least {min} items"),
            ));
        }
        match self.list_type.as_deref() {
            Some("set") => {
                for (i, item) in a.iter().enumerate() {
                    if a[..i].iter().any(|prev| json_eq(prev, item)) {
                        errs.push(FieldError::duplicate(path.item(i).render(), item));
                    }
                }
            }
            Some("map") if !self.list_map_keys.is_empty() => {
                let key_of = |item: &Value| -> Map<String, Value> {
                    self.list_map_keys
                        .iter()
                        .filter_map(|k| item.get(k).map(|kv| (k.clone(), kv.clone())))
                        .collect()
                };
                for (i, item) in a.iter().enumerate() {
                    let key = key_of(item);
                    if a[..i].iter().any(|prev| key_of(prev) == key) {
                        errs.push(FieldError::duplicate(
                            path.item(i).render(),
                            &Value::Object(key),
                        ));
                    }
                }
            }
            _ => {}
        }
        if let Some(items) = &self.items {
            // Only a keyed list pairs its items with the old ones (for transition rules).
            let old_items = old.and_then(Value::as_array).filter(|_| {
                self.list_type.as_deref() == Some("map") && !self.list_map_keys.is_empty()
            });
            for (i, item) in a.iter().enumerate() {
                let before = old_items.and_then(|olds| {
                    olds.iter()
                        .find(|o| self.list_map_keys.iter().all(|k| o.get(k) == item.get(k)))
                });
                items.validate(item, before, &path.item(i), errs, false);
            }
        }
    }

    fn validate_object(
        &self,
        m: &Map<String, Value>,
        v: &Value,
        old: Option<&Value>,
        path: &Path<'_>,
        errs: &mut Vec<FieldError>,
        root: bool,
    ) {
        let counted = if root || self.embedded {
            m.keys()
                .filter(|k| !matches!(k.as_str(), "apiVersion" | "kind" | "metadata"))
                .count()
        } else {
            m.len()
        };
        if let Some(max) = self.max_properties
            && counted as u64 > max
        {
            let shown = &path.shown();
            errs.push(FieldError::too_many(shown, counted, max, "items"));
        }
        if let Some(min) = self.min_properties
            && (counted as u64) < min
        {
            let shown = &path.shown();
            errs.push(FieldError::invalid(
                shown,
                v,
                &format!("{shown} in body should have at least {min} properties"),
            ));
        }
        for r in &self.required {
            if !m.contains_key(r) {
                errs.push(FieldError::required(path.field(r).render()));
            }
        }
        if self.embedded {
            for r in ["apiVersion", "kind"] {
                if m.get(r).and_then(Value::as_str).is_none_or(str::is_empty) {
                    errs.push(FieldError::required(path.field(r).render()));
                }
            }
        }
        for (k, cv) in m {
            if (root || self.embedded) && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            if let Some(child) = self.child(k) {
                child.validate(cv, old.and_then(|o| o.get(k)), &path.field(k), errs, false);
            }
        }
    }
}

fn num(f: f64) -> String {
    if f.fract() == 0.0 && f.abs() < 1e15 {
        format!("{}", f as i64)
    } else {
        format!("{f}")
    }
}

fn is_integer(v: &Value) -> bool {
    match v {
        Value::Number(n) => {
            n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        _ => false,
    }
}

fn type_matches(t: &str, v: &Value) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => is_integer(v),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        _ => true,
    }
}

pub(super) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) if is_integer(v) => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// JSON equality where `1` and `1.0` are the same number.
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

fn format_ok(format: &str, s: &str) -> bool {
    match format {
        "date-time" | "datetime" => meta::parse_time(s).is_some(),
        "date" => s.parse::<jiff::civil::Date>().is_ok(),
        "byte" => base64::engine::general_purpose::STANDARD.decode(s).is_ok(),
        "uuid" => {
            s.len() == 36
                && s.chars().enumerate().all(|(i, c)| {
                    if [8, 13, 18, 23].contains(&i) {
                        c == '-'
                    } else {
                        c.is_ascii_hexdigit()
                    }
                })
        }
        "ipv4" => s.parse::<std::net::Ipv4Addr>().is_ok(),
        "ipv6" => s.parse::<std::net::Ipv6Addr>().is_ok(),
        "cidr" => s.split_once('/').is_some_and(|(ip, bits)| {
            let Ok(bits) = bits.parse::<u8>() else {
                return false;
            };
            match ip.parse::<std::net::IpAddr>() {
                Ok(std::net::IpAddr::V4(_)) => bits <= 32,
                Ok(std::net::IpAddr::V6(_)) => bits <= 128,
                Err(_) => false,
            }
        }),
        "mac" => {
            let parts: Vec<&str> = s.split([':', '-']).collect();
            parts.len() == 6
                && parts
                    .iter()
                    .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()))
        }
        _ => true,
    }
}
