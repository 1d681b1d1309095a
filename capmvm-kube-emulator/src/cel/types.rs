//! CEL types as the real server's checker (cel-go) sees them, and their assignability with type
//! parameters (cel-go's `checker/types.go`): what decides whether a rule type-checks against its schema.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

/// An object type declared by a schema: its name (`selfType<n>.spec`, as the real server names it)
/// and its fields by their CEL (escaped) names.
#[derive(Debug, PartialEq)]
pub(crate) struct ObjectType {
    pub(crate) name: String,
    pub(crate) fields: BTreeMap<String, Ty>,
}

/// A CEL type.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Ty {
    Dyn,
    Error,
    Null,
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    Timestamp,
    Duration,
    List(Box<Ty>),
    Map(Box<Ty>, Box<Ty>),
    Object(Arc<ObjectType>),
    /// `type` (no parameter) or `type(T)`.
    Type(Option<Box<Ty>>),
    /// An opaque type with parameters: `optional_type(T)`, and the Kubernetes libraries' own
    /// (`kubernetes.URL`, `net.IP`, ...).
    Opaque(&'static str, Vec<Ty>),
    /// A type parameter, free or bound by the mapping.
    Param(String),
}

impl Ty {
    pub(crate) fn list(t: Ty) -> Ty {
        Ty::List(Box::new(t))
    }

    pub(crate) fn map(k: Ty, v: Ty) -> Ty {
        Ty::Map(Box::new(k), Box::new(v))
    }

    pub(crate) fn optional(t: Ty) -> Ty {
        Ty::Opaque("optional_type", vec![t])
    }

    pub(crate) fn param(name: &str) -> Ty {
        Ty::Param(name.to_string())
    }

    pub(crate) fn is_dyn(&self) -> bool {
        matches!(self, Ty::Dyn)
    }

    pub(crate) fn is_dyn_or_error(&self) -> bool {
        matches!(self, Ty::Dyn | Ty::Error)
    }

    /// The optional's value type, if this is an optional.
    pub(crate) fn unwrap_optional(&self) -> Option<&Ty> {
        match self {
            Ty::Opaque("optional_type", p) if p.len() == 1 => Some(&p[0]),
            _ => None,
        }
    }

    /// cel-go's kinds: two types of different kinds never agree (except through dyn and params).
    fn kind(&self) -> u8 {
        match self {
            Ty::Dyn => 0,
            Ty::Error => 1,
            Ty::Null => 2,
            Ty::Bool => 3,
            Ty::Int => 4,
            Ty::Uint => 5,
            Ty::Double => 6,
            Ty::String => 7,
            Ty::Bytes => 8,
            Ty::Timestamp => 9,
            Ty::Duration => 10,
            Ty::List(_) => 11,
            Ty::Map(..) => 12,
            Ty::Object(_) => 13,
            Ty::Type(_) => 14,
            Ty::Opaque(..) => 15,
            Ty::Param(_) => 16,
        }
    }

    fn params(&self) -> Vec<&Ty> {
        match self {
            Ty::List(e) => vec![e],
            Ty::Map(k, v) => vec![k, v],
            Ty::Type(Some(t)) => vec![t],
            Ty::Opaque(_, p) => p.iter().collect(),
            _ => Vec::new(),
        }
    }

    /// cel-go's `IsExactType`: same kind, name and parameters.
    pub(crate) fn exact(&self, other: &Ty) -> bool {
        match (self, other) {
            (Ty::Object(a), Ty::Object(b)) => a.name == b.name,
            _ => self == other,
        }
    }

    /// cel-go's `Type.IsAssignableType` (self the target, `from` the value's type).
    fn assignable_from(&self, from: &Ty) -> bool {
        if self.is_dyn() || self.exact(from) {
            return true;
        }
        if self.kind() != from.kind() {
            return false;
        }
        match (self, from) {
            (Ty::Object(a), Ty::Object(b)) => a.name == b.name,
            (Ty::Opaque(a, _), Ty::Opaque(b, _)) if a != b => false,
            _ => {
                let (p, q) = (self.params(), from.params());
                p.len() == q.len() && p.iter().zip(q).all(|(x, y)| x.assignable_from(y))
            }
        }
    }
}

impl fmt::Display for Ty {
    /// cel-go's `FormatCELType`, as its messages print types.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let joined = |p: &[&Ty]| {
            p.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            Ty::Dyn => f.write_str("dyn"),
            Ty::Error => f.write_str("!error!"),
            Ty::Null => f.write_str("null"),
            Ty::Bool => f.write_str("bool"),
            Ty::Int => f.write_str("int"),
            Ty::Uint => f.write_str("uint"),
            Ty::Double => f.write_str("double"),
            Ty::String => f.write_str("string"),
            Ty::Bytes => f.write_str("bytes"),
            Ty::Timestamp => f.write_str("timestamp"),
            Ty::Duration => f.write_str("duration"),
            Ty::List(e) => write!(f, "list({e})"),
            Ty::Map(k, v) => write!(f, "map({k}, {v})"),
            Ty::Object(o) => f.write_str(&o.name),
            Ty::Type(None) => f.write_str("type"),
            Ty::Type(Some(t)) => write!(f, "type({t})"),
            Ty::Opaque(name, p) if p.is_empty() => f.write_str(name),
            Ty::Opaque(name, p) => write!(f, "{name}({})", joined(&p.iter().collect::<Vec<_>>())),
            Ty::Param(name) => f.write_str(name),
        }
    }
}

/// The substitutions of type parameters found so far.
#[derive(Debug, Clone, Default)]
pub(crate) struct Mapping(HashMap<String, Ty>);

impl Mapping {
    fn find(&self, t: &Ty) -> Option<&Ty> {
        match t {
            Ty::Param(n) => self.0.get(n),
            _ => None,
        }
    }

    fn add(&mut self, param: &Ty, t: Ty) {
        if let Ty::Param(n) = param {
            self.0.insert(n.clone(), t);
        }
    }

    /// `t` with its bound parameters replaced; free ones become dyn when `to_dyn`.
    pub(crate) fn substitute(&self, t: &Ty, to_dyn: bool) -> Ty {
        if let Some(s) = self.find(t) {
            return self.substitute(s, to_dyn);
        }
        match t {
            Ty::Param(_) if to_dyn => Ty::Dyn,
            Ty::List(e) => Ty::list(self.substitute(e, to_dyn)),
            Ty::Map(k, v) => Ty::map(self.substitute(k, to_dyn), self.substitute(v, to_dyn)),
            Ty::Type(Some(p)) => Ty::Type(Some(Box::new(self.substitute(p, to_dyn)))),
            Ty::Opaque(n, p) => {
                Ty::Opaque(n, p.iter().map(|x| self.substitute(x, to_dyn)).collect())
            }
            other => other.clone(),
        }
    }

    /// Whether a value of type `t2` may be used where `t1` is expected, recording the parameter
    /// bindings that makes it so (the mapping is unchanged when not).
    pub(crate) fn assign(&mut self, t1: &Ty, t2: &Ty) -> bool {
        let mut m = self.clone();
        if m.assignable(t1, t2) {
            *self = m;
            true
        } else {
            false
        }
    }

    pub(crate) fn assign_all(&mut self, l1: &[Ty], l2: &[Ty]) -> bool {
        let mut m = self.clone();
        if l1.len() == l2.len() && l1.iter().zip(l2).all(|(a, b)| m.assignable(a, b)) {
            *self = m;
            true
        } else {
            false
        }
    }

    fn assignable(&mut self, t1: &Ty, t2: &Ty) -> bool {
        if matches!(t2, Ty::Param(_)) {
            let (valid, has_sub) = self.valid_substitution(t1, t2);
            if valid {
                return true;
            }
            if has_sub {
                return false;
            }
        }
        if matches!(t1, Ty::Param(_)) {
            return self.valid_substitution(t2, t1).0;
        }
        if t1.is_dyn_or_error() || t2.is_dyn_or_error() {
            return true;
        }
        if matches!(t1, Ty::Null) {
            return nullable(t2);
        }
        if matches!(t2, Ty::Null) {
            return nullable(t1);
        }
        match t1 {
            Ty::Bool
            | Ty::Bytes
            | Ty::Double
            | Ty::Int
            | Ty::String
            | Ty::Uint
            | Ty::Duration
            | Ty::Timestamp
            | Ty::Object(_) => t2.assignable_from(t1),
            Ty::Type(_) => matches!(t2, Ty::Type(_)),
            Ty::Opaque(..) | Ty::List(_) | Ty::Map(..) => {
                let same_name = match (t1, t2) {
                    (Ty::Opaque(a, _), Ty::Opaque(b, _)) => a == b,
                    _ => t1.kind() == t2.kind(),
                };
                let (p, q) = (t1.params(), t2.params());
                same_name
                    && p.len() == q.len()
                    && p.iter().zip(q).all(|(a, b)| self.assignable(a, b))
            }
            _ => false,
        }
    }

    fn valid_substitution(&mut self, t1: &Ty, t2: &Ty) -> (bool, bool) {
        if t1.exact(t2) {
            return (true, true);
        }
        if let Some(sub) = self.find(t2).cloned() {
            if t1.exact(&sub) {
                return (true, true);
            }
            if self.assignable(t1, &sub) {
                let general = most_general(t1, &sub);
                if self.not_referenced_in(t2, &general) {
                    self.add(t2, general);
                }
                return (true, true);
            }
            return (false, true);
        }
        if self.not_referenced_in(t2, t1) {
            self.add(t2, t1.clone());
            return (true, false);
        }
        (false, false)
    }

    fn not_referenced_in(&self, t: &Ty, within: &Ty) -> bool {
        if t.exact(within) {
            return false;
        }
        match within {
            Ty::Param(_) => match self.find(within) {
                None => true,
                Some(sub) => self.not_referenced_in(t, sub),
            },
            Ty::Opaque(..) | Ty::List(_) | Ty::Map(..) | Ty::Type(_) => {
                within.params().iter().all(|p| self.not_referenced_in(t, p))
            }
            _ => true,
        }
    }
}

/// cel-go's legacy nullness: which types `null` may stand for.
fn nullable(t: &Ty) -> bool {
    matches!(
        t,
        Ty::Opaque(..) | Ty::Object(_) | Ty::Duration | Ty::Timestamp | Ty::Null
    )
}

fn equal_or_less_specific(t1: &Ty, t2: &Ty) -> bool {
    if t1.is_dyn() || matches!(t1, Ty::Param(_)) {
        return true;
    }
    if t2.is_dyn() || matches!(t2, Ty::Param(_)) {
        return false;
    }
    if t1.kind() != t2.kind() {
        return false;
    }
    match (t1, t2) {
        (Ty::Opaque(a, p), Ty::Opaque(b, q)) => {
            a == b
                && p.len() == q.len()
                && p.iter().zip(q).all(|(x, y)| equal_or_less_specific(x, y))
        }
        (Ty::List(a), Ty::List(b)) => equal_or_less_specific(a, b),
        (Ty::Map(k1, v1), Ty::Map(k2, v2)) => {
            equal_or_less_specific(k1, k2) && equal_or_less_specific(v1, v2)
        }
        (Ty::Type(_), Ty::Type(_)) => true,
        _ => t1.exact(t2),
    }
}

pub(crate) fn most_general(t1: &Ty, t2: &Ty) -> Ty {
    if equal_or_less_specific(t1, t2) {
        t1.clone()
    } else {
        t2.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_bind_once_and_format_as_cel_go() {
        let mut m = Mapping::default();
        let a = Ty::param("A");
        assert!(m.assign_all(&[a.clone(), a.clone()], &[Ty::Int, Ty::Int]));
        let mut m = Mapping::default();
        assert!(!m.assign_all(&[a.clone(), a.clone()], &[Ty::Int, Ty::String]));
        assert!(m.assign_all(
            &[a.clone(), Ty::list(a.clone())],
            &[Ty::Dyn, Ty::list(Ty::String)]
        ));
        assert_eq!(
            Ty::map(Ty::String, Ty::list(Ty::optional(Ty::Int))).to_string(),
            "map(string, list(optional_type(int)))"
        );
    }
}
