//! The type checker of CRD rules: a port of cel-go's checker (`checker/checker.go`) over the `cel`
//! crate's AST, so a rule the real server refuses at CRD creation (an undeclared field, mismatched
//! types, a function that does not exist for its arguments, a result that is not a bool) is refused
//! here, with cel-go's messages and positions.

use std::collections::HashMap;

use cel::common::ast::{
    CallExpr, ComprehensionExpr, EntryExpr, Expr, IdedExpr, LiteralValue, SelectExpr, operators,
};

use super::decls;
use super::types::{Mapping, Ty, most_general};

/// What checking a rule found: its type, whether it reads `oldSelf`, or cel-go's report of its errors.
pub(crate) struct Checked {
    pub(crate) output: Ty,
    pub(crate) uses_old_self: bool,
}

/// Checks `program` with `self` of type `self_ty` and `oldSelf` of the same type (an optional of it
/// when `optional_old_self`). The error is cel-go's `issues.String()`.
pub(crate) fn check(
    program: &cel::Program,
    self_ty: &Ty,
    optional_old_self: bool,
) -> Result<Checked, String> {
    let old = if optional_old_self {
        Ty::optional(self_ty.clone())
    } else {
        self_ty.clone()
    };
    let mut c = Checker {
        scopes: vec![
            ("self".to_string(), self_ty.clone()),
            ("oldSelf".to_string(), old),
        ],
        globals: 2,
        mapping: Mapping::default(),
        errors: Vec::new(),
        next_var: 0,
        uses_old_self: false,
    };
    let t = c.check(program.expression());
    if c.errors.is_empty() {
        // cel-go's literal validators, which run once the rule type-checks.
        validate_literals(program.expression(), &mut c.errors);
    }
    if c.errors.is_empty() {
        Ok(Checked {
            output: c.mapping.substitute(&t, true),
            uses_old_self: c.uses_old_self,
        })
    } else {
        Err(report(program, c.errors))
    }
}

struct Checker {
    /// Variables in scope, innermost last; the first `globals` are `self` and `oldSelf`.
    scopes: Vec<(String, Ty)>,
    globals: usize,
    mapping: Mapping,
    errors: Vec<(u64, String)>,
    next_var: u32,
    uses_old_self: bool,
}

impl Checker {
    fn error(&mut self, id: u64, message: String) {
        self.errors.push((id, message));
    }

    fn check(&mut self, e: &IdedExpr) -> Ty {
        match &e.expr {
            Expr::Literal(l) => match l {
                LiteralValue::Boolean(_) => Ty::Bool,
                LiteralValue::Bytes(_) => Ty::Bytes,
                LiteralValue::Double(_) => Ty::Double,
                LiteralValue::Int(_) => Ty::Int,
                LiteralValue::Null => Ty::Null,
                LiteralValue::String(_) => Ty::String,
                LiteralValue::UInt(_) => Ty::Uint,
            },
            Expr::Ident(name) => self.ident(e.id, name),
            Expr::Select(s) => self.select(e.id, s),
            Expr::Call(call) => self.call(e.id, call),
            Expr::List(list) => {
                let mut elems: Option<Ty> = None;
                for (i, el) in list.elements.iter().enumerate() {
                    let mut t = self.check(el);
                    if list.optional_indices.contains(&i) {
                        t = self.unwrap_optional_entry(el.id, t);
                    }
                    elems = Some(self.join(el.id, elems, t));
                }
                let elems = elems.unwrap_or_else(|| self.fresh());
                Ty::list(elems)
            }
            Expr::Map(map) => {
                let (mut keys, mut values): (Option<Ty>, Option<Ty>) = (None, None);
                for entry in &map.entries {
                    let EntryExpr::MapEntry(m) = &entry.expr else {
                        continue;
                    };
                    let k = self.check(&m.key);
                    keys = Some(self.join(m.key.id, keys, k));
                    let mut v = self.check(&m.value);
                    if m.optional {
                        v = self.unwrap_optional_entry(m.value.id, v);
                    }
                    values = Some(self.join(m.value.id, values, v));
                }
                match (keys, values) {
                    (Some(k), Some(v)) => Ty::map(k, v),
                    _ => Ty::map(self.fresh(), self.fresh()),
                }
            }
            Expr::Struct(s) => {
                // No message types are declared for CRD rules.
                self.error(
                    e.id,
                    format!(
                        "undeclared reference to '{}' (in container '')",
                        s.type_name
                    ),
                );
                Ty::Error
            }
            Expr::Comprehension(comp) => self.comprehension(comp),
            Expr::Unspecified => {
                self.error(e.id, "unexpected unspecified type: ".to_string());
                Ty::Error
            }
        }
    }

    fn unwrap_optional_entry(&mut self, id: u64, t: Ty) -> Ty {
        match t.unwrap_optional() {
            Some(inner) => inner.clone(),
            None if t.is_dyn() => t,
            None => {
                self.error(
                    id,
                    format!(
                        "expected type '{}' but found '{t}'",
                        Ty::optional(t.clone())
                    ),
                );
                t
            }
        }
    }

    fn fresh(&mut self) -> Ty {
        let t = Ty::Param(format!("_var{}", self.next_var));
        self.next_var += 1;
        t
    }

    fn ident(&mut self, id: u64, name: &str) -> Ty {
        if let Some(i) = self.scopes.iter().rposition(|(n, _)| n == name) {
            if i < self.globals && name == "oldSelf" {
                self.uses_old_self = true;
            }
            return self.scopes[i].1.clone();
        }
        if let Some(t) = decls::type_ident(name) {
            return t;
        }
        self.error(
            id,
            format!("undeclared reference to '{name}' (in container '')"),
        );
        Ty::Error
    }

    fn select(&mut self, id: u64, s: &SelectExpr) -> Ty {
        let t = self.select_field(id, &s.operand, &s.field, false);
        if s.test { Ty::Bool } else { t }
    }

    fn select_field(&mut self, id: u64, operand: &IdedExpr, field: &str, optional: bool) -> Ty {
        let operand_ty = self.check(operand);
        let operand_ty = self.mapping.substitute(&operand_ty, false);
        let (target, was_optional) = match operand_ty.unwrap_optional() {
            Some(inner) => (inner.clone(), true),
            None => (operand_ty.clone(), false),
        };
        let result = match &target {
            Ty::Map(_, v) => (**v).clone(),
            Ty::Object(o) => match o.fields.get(field) {
                Some(t) => t.clone(),
                None => {
                    self.error(id, format!("undefined field '{field}'"));
                    Ty::Error
                }
            },
            Ty::Param(_) => {
                self.mapping.assign(&Ty::Dyn, &target);
                Ty::Dyn
            }
            other => {
                if !other.is_dyn_or_error() {
                    self.error(
                        id,
                        format!("type '{other}' does not support field selection"),
                    );
                }
                Ty::Dyn
            }
        };
        let result = self.mapping.substitute(&result, false);
        if was_optional || optional {
            Ty::optional(result)
        } else {
            result
        }
    }

    fn call(&mut self, id: u64, call: &CallExpr) -> Ty {
        if call.func_name == operators::OPT_SELECT {
            if let ([operand, field], None) = (call.args.as_slice(), &call.target)
                && let Expr::Literal(LiteralValue::String(name)) = &field.expr
            {
                return self.select_field(id, operand, name.inner(), true);
            }
            self.error(
                id,
                "unsupported optional field selection: incorrect signature".to_string(),
            );
            return Ty::Error;
        }
        let args: Vec<Ty> = call.args.iter().map(|a| self.check(a)).collect();
        let arg_ids: Vec<u64> = call.args.iter().map(|a| a.id).collect();
        let Some(target) = &call.target else {
            return match decls::lookup(&call.func_name) {
                Some(overloads) => {
                    self.resolve(id, &call.func_name, overloads, None, args, &arg_ids)
                }
                None => self.undeclared(id, &call.func_name),
            };
        };
        // `a.b.f(x)` is the function `a.b.f` when one is declared (`sets.contains`, `optional.of`).
        if let Some(prefix) = qualified_name(target) {
            let name = format!("{prefix}.{}", call.func_name);
            if let Some(overloads) = decls::lookup(&name) {
                return self.resolve(id, &name, overloads, None, args, &arg_ids);
            }
        }
        let target_ty = self.check(target);
        match decls::lookup(&call.func_name) {
            Some(overloads) => self.resolve(
                id,
                &call.func_name,
                overloads,
                Some(target_ty),
                args,
                &arg_ids,
            ),
            None => self.undeclared(id, &call.func_name),
        }
    }

    fn undeclared(&mut self, id: u64, name: &str) -> Ty {
        self.error(
            id,
            format!("undeclared reference to '{name}' (in container '')"),
        );
        Ty::Error
    }

    fn resolve(
        &mut self,
        id: u64,
        name: &str,
        overloads: &[decls::Overload],
        target: Option<Ty>,
        args: Vec<Ty>,
        arg_ids: &[u64],
    ) -> Ty {
        let member = target.is_some();
        let all: Vec<Ty> = target.into_iter().chain(args).collect();
        if !member && (name == operators::LOGICAL_AND || name == operators::LOGICAL_OR) {
            let mut ok = true;
            for (i, t) in all.iter().enumerate() {
                if !self.mapping.assign(t, &Ty::Bool) {
                    let at = arg_ids.get(i).copied().unwrap_or(id);
                    self.error(at, format!("expected type 'bool' but found '{t}'"));
                    ok = false;
                }
            }
            return if ok { Ty::Bool } else { Ty::Error };
        }
        let mut result: Option<Ty> = None;
        for o in overloads.iter().filter(|o| o.member == member) {
            let (params, out) = if o.is_generic() {
                let mut fresh = HashMap::new();
                let params: Vec<Ty> = o
                    .args
                    .iter()
                    .map(|t| self.instantiate(t, &mut fresh))
                    .collect();
                (params, self.instantiate(&o.result, &mut fresh))
            } else {
                (o.args.clone(), o.result.clone())
            };
            if self.mapping.assign_all(&all, &params) {
                let r = self.mapping.substitute(&out, false);
                result = Some(match result {
                    None => r,
                    Some(prev) if !prev.is_dyn() && !r.exact(&prev) => Ty::Dyn,
                    Some(prev) => prev,
                });
            }
        }
        match result {
            Some(r) => r,
            None => {
                let shown: Vec<String> = all
                    .iter()
                    .map(|t| self.mapping.substitute(t, true).to_string())
                    .collect();
                let signature = if member {
                    format!("{}.({})", shown[0], shown[1..].join(", "))
                } else {
                    format!("({})", shown.join(", "))
                };
                self.error(
                    id,
                    format!("found no matching overload for '{name}' applied to '{signature}'"),
                );
                Ty::Error
            }
        }
    }

    /// A declared overload's type with its parameters replaced by fresh type variables.
    fn instantiate(&mut self, t: &Ty, fresh: &mut HashMap<String, Ty>) -> Ty {
        match t {
            Ty::Param(n) => {
                if let Some(v) = fresh.get(n) {
                    return v.clone();
                }
                let v = self.fresh();
                fresh.insert(n.clone(), v.clone());
                v
            }
            Ty::List(e) => Ty::list(self.instantiate(e, fresh)),
            Ty::Map(k, v) => {
                let k = self.instantiate(k, fresh);
                Ty::map(k, self.instantiate(v, fresh))
            }
            Ty::Type(Some(p)) => Ty::Type(Some(Box::new(self.instantiate(p, fresh)))),
            Ty::Opaque(n, p) => {
                Ty::Opaque(n, p.iter().map(|x| self.instantiate(x, fresh)).collect())
            }
            other => other.clone(),
        }
    }

    /// The common type of a literal's elements; a mismatch is an error (homogeneous literals).
    fn join(&mut self, id: u64, previous: Option<Ty>, current: Ty) -> Ty {
        let Some(previous) = previous else {
            return current;
        };
        if self.mapping.assign(&previous, &current) {
            return most_general(&previous, &current);
        }
        self.error(
            id,
            format!("expected type '{previous}' but found '{current}'"),
        );
        Ty::Error
    }

    fn comprehension(&mut self, comp: &ComprehensionExpr) -> Ty {
        let range = self.check(&comp.iter_range);
        let accu = self.check(&comp.accu_init);
        let range = self.mapping.substitute(&range, false);
        let depth = self.scopes.len();
        self.scopes.push((comp.accu_var.clone(), accu.clone()));
        let two = comp.iter_var2.is_some();
        let (var, var2) = match &range {
            Ty::List(e) if two => (Ty::Int, (**e).clone()),
            Ty::List(e) => ((**e).clone(), Ty::Error),
            Ty::Map(k, v) => ((**k).clone(), (**v).clone()),
            Ty::Dyn | Ty::Error | Ty::Param(_) => {
                self.mapping.assign(&Ty::Dyn, &range);
                (Ty::Dyn, Ty::Dyn)
            }
            other => {
                self.error(
                    comp.iter_range.id,
                    format!(
                        "expression of type '{other}' cannot be range of a comprehension (must be list, map, or dynamic)"
                    ),
                );
                (Ty::Error, Ty::Error)
            }
        };
        let loop_depth = self.scopes.len();
        self.scopes.push((comp.iter_var.clone(), var));
        if let Some(v2) = &comp.iter_var2 {
            self.scopes.push((v2.clone(), var2));
        }
        let cond = self.check(&comp.loop_cond);
        self.expect(comp.loop_cond.id, &Ty::Bool, &cond);
        let step = self.check(&comp.loop_step);
        self.expect(comp.loop_step.id, &accu, &step);
        self.scopes.truncate(loop_depth);
        let result = self.check(&comp.result);
        self.scopes.truncate(depth);
        self.mapping.substitute(&result, false)
    }

    fn expect(&mut self, id: u64, want: &Ty, got: &Ty) {
        if !self.mapping.assign(want, got) {
            self.error(id, format!("expected type '{want}' but found '{got}'"));
        }
    }
}

/// A literal first argument of `matches`, `duration` or `timestamp` must be a valid regular
/// expression, duration or RFC 3339 timestamp (cel-go's `Validate*Literals`, on in Kubernetes).
fn validate_literals(e: &IdedExpr, errors: &mut Vec<(u64, String)>) {
    match &e.expr {
        Expr::Call(call) => {
            if let Some(first) = call.args.first()
                && let Expr::Literal(LiteralValue::String(text)) = &first.expr
            {
                let text = text.inner();
                let valid = match call.func_name.as_str() {
                    "matches" => regex::Regex::new(text).is_ok(),
                    "duration" => valid_duration(text),
                    "timestamp" => text.parse::<jiff::Timestamp>().is_ok(),
                    _ => true,
                };
                if !valid {
                    errors.push((first.id, format!("invalid {} argument", call.func_name)));
                }
            }
            if let Some(t) = &call.target {
                validate_literals(t, errors);
            }
            for a in &call.args {
                validate_literals(a, errors);
            }
        }
        Expr::Select(s) => validate_literals(&s.operand, errors),
        Expr::List(l) => l.elements.iter().for_each(|x| validate_literals(x, errors)),
        Expr::Map(m) => {
            for entry in &m.entries {
                if let EntryExpr::MapEntry(me) = &entry.expr {
                    validate_literals(&me.key, errors);
                    validate_literals(&me.value, errors);
                }
            }
        }
        Expr::Comprehension(c) => {
            for x in [
                &c.iter_range,
                &c.accu_init,
                &c.loop_cond,
                &c.loop_step,
                &c.result,
            ] {
                validate_literals(x, errors);
            }
        }
        _ => {}
    }
}

/// Go's `time.ParseDuration` syntax: a signed sequence of decimal numbers with units (`1h30m`, `-1.5s`).
fn valid_duration(s: &str) -> bool {
    let s = s.strip_prefix(['-', '+']).unwrap_or(s);
    if s == "0" {
        return true;
    }
    let mut rest = s;
    if rest.is_empty() {
        return false;
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number = &rest[..digits];
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return false;
        }
        rest = &rest[digits..];
        let Some(unit) = ["ns", "us", "\u{b5}s", "\u{3bc}s", "ms", "s", "m", "h"]
            .iter()
            .find(|u| rest.starts_with(**u))
        else {
            return false;
        };
        rest = &rest[unit.len()..];
    }
    true
}

/// `a.b.c` as a dotted name, when the expression is only identifiers and field selections.
fn qualified_name(e: &IdedExpr) -> Option<String> {
    match &e.expr {
        Expr::Ident(n) => Some(n.clone()),
        Expr::Select(s) if !s.test => {
            qualified_name(&s.operand).map(|p| format!("{p}.{}", s.field))
        }
        _ => None,
    }
}

/// cel-go's report of errors: by position, each with its line of source and a caret under the column.
fn report(program: &cel::Program, mut errors: Vec<(u64, String)>) -> String {
    let info = program.source_info();
    let source = info.source.as_str();
    let mut located: Vec<(usize, usize, String)> = errors
        .drain(..)
        .map(|(id, message)| {
            let offset = info.offset_for(id).map_or(0, |(start, _)| start as usize);
            let (line, column) = line_and_column(source, offset);
            (line, column, message)
        })
        .collect();
    located.sort_by_key(|(l, c, _)| (*l, *c));
    located
        .into_iter()
        .map(|(line, column, message)| {
            let mut out = format!("ERROR: <input>:{line}:{}: {message}", column + 1);
            if let Some(snippet) = source.lines().nth(line - 1) {
                let snippet = snippet.replace('\t', " ");
                let mut marker = String::new();
                let mut chars = snippet.chars();
                for _ in 0..column {
                    match chars.next() {
                        Some(c) if c.len_utf8() > 1 => marker.push('\u{ff0e}'),
                        Some(_) => marker.push('.'),
                        None => break,
                    }
                }
                match chars.next() {
                    Some(c) if c.len_utf8() > 1 => marker.push('\u{ff3e}'),
                    _ => marker.push('^'),
                }
                out.push_str(&format!("\n | {snippet}\n | {marker}"));
            }
            out
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The 1-based line and 0-based column (in characters) of a character offset.
fn line_and_column(source: &str, offset: usize) -> (usize, usize) {
    let (mut line, mut column) = (1, 0);
    for c in source.chars().take(offset) {
        if c == '\n' {
            line += 1;
            column = 0;
        } else {
            column += 1;
        }
    }
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::valid_duration;

    #[test]
    fn durations_as_go_parses_them() {
        for ok in ["0", "1s", "-1.5h", "1h30m", "300ms", "2us", "+5m"] {
            assert!(valid_duration(ok), "{ok}");
        }
        for bad in ["", "1", "1x", "h", "1.2.3s", "-"] {
            assert!(!valid_duration(bad), "{bad}");
        }
    }
}
