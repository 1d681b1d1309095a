//! Label selectors (`=`, `==`, `!=`, `in`, `notin`, `key`, `!key`, `>`, `<`) and field selectors, with the
//! grammar of `k8s.io/apimachinery/pkg/labels` and `.../fields`.

use serde_json::{Map, Value};

use super::error::ApiError;
use super::meta;

#[derive(Debug, Clone, PartialEq)]
enum Op {
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    DoesNotExist,
    Gt(i64),
    Lt(i64),
}

#[derive(Debug, Clone, PartialEq)]
struct Requirement {
    key: String,
    op: Op,
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LabelSelector {
    reqs: Vec<Requirement>,
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Not,
    Eq,
    DoubleEq,
    NotEq,
    Gt,
    Lt,
    Open,
    Close,
    Comma,
}

fn lex(s: &str) -> Result<Vec<Tok>, String> {
    let mut out = Vec::new();
    let chars: Vec<char> = s.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            ' ' | '\t' | '\n' | '\r' => i += 1,
            ',' => {
                out.push(Tok::Comma);
                i += 1;
            }
            '(' => {
                out.push(Tok::Open);
                i += 1;
            }
            ')' => {
                out.push(Tok::Close);
                i += 1;
            }
            '>' => {
                out.push(Tok::Gt);
                i += 1;
            }
            '<' => {
                out.push(Tok::Lt);
                i += 1;
            }
            '!' => {
                if chars.get(i + 1) == Some(&'=') {
                    out.push(Tok::NotEq);
                    i += 2;
                } else {
                    out.push(Tok::Not);
                    i += 1;
                }
            }
            '=' => {
                if chars.get(i + 1) == Some(&'=') {
                    out.push(Tok::DoubleEq);
                    i += 2;
                } else {
                    out.push(Tok::Eq);
                    i += 1;
                }
            }
            _ => {
                let start = i;
                while i < chars.len() && !" \t\n\r,()=!<>".contains(chars[i]) {
                    i += 1;
                }
                out.push(Tok::Ident(chars[start..i].iter().collect()));
            }
        }
    }
    Ok(out)
}

fn parse_error(msg: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!("unable to parse requirement: {msg}"))
}

fn check_key(key: &str) -> Result<(), ApiError> {
    let errs = meta::qualified_name_errors(key);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(parse_error(format!(
            "<nil>: Invalid value: {key:?}: {}",
            errs.join("; ")
        )))
    }
}

fn check_value(v: &str) -> Result<(), ApiError> {
    if meta::is_label_value(v) {
        Ok(())
    } else {
        Err(parse_error(format!(
            "values[0][{v}]: Invalid value: {v:?}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        )))
    }
}

impl LabelSelector {
    /// Parses `labelSelector`; a syntax error is a 400 as on the real server.
    pub(crate) fn parse(s: &str) -> Result<Self, ApiError> {
        let toks = lex(s).map_err(parse_error)?;
        let mut reqs = Vec::new();
        let mut i = 0;
        while i < toks.len() {
            let req = match &toks[i] {
                Tok::Not => {
                    let Some(Tok::Ident(key)) = toks.get(i + 1) else {
                        return Err(parse_error("identifier expected after '!'"));
                    };
                    check_key(key)?;
                    i += 2;
                    Requirement {
                        key: key.clone(),
                        op: Op::DoesNotExist,
                    }
                }
                Tok::Ident(key) => {
                    check_key(key)?;
                    i += 1;
                    match toks.get(i) {
                        None | Some(Tok::Comma) => Requirement {
                            key: key.clone(),
                            op: Op::Exists,
                        },
                        Some(Tok::Eq | Tok::DoubleEq | Tok::NotEq) => {
                            let negate = toks[i] == Tok::NotEq;
                            let value = match toks.get(i + 1) {
                                Some(Tok::Ident(v)) => {
                                    i += 2;
                                    v.clone()
                                }
                                None | Some(Tok::Comma) => {
                                    i += 1;
                                    String::new()
                                }
                                Some(other) => {
                                    return Err(parse_error(format!(
                                        "found '{other:?}', expected: identifier"
                                    )));
                                }
                            };
                            check_value(&value)?;
                            let op = if negate {
                                Op::NotIn(vec![value])
                            } else {
                                Op::In(vec![value])
                            };
                            Requirement {
                                key: key.clone(),
                                op,
                            }
                        }
                        Some(Tok::Gt | Tok::Lt) => {
                            let gt = toks[i] == Tok::Gt;
                            let Some(Tok::Ident(v)) = toks.get(i + 1) else {
                                return Err(parse_error(
                                    "identifier expected after comparison operator",
                                ));
                            };
                            let n: i64 = v.parse().map_err(|_| {
                                parse_error(format!(
                                    "for 'Gt', 'Lt' operators, the value must be an integer: {v:?}"
                                ))
                            })?;
                            i += 2;
                            Requirement {
                                key: key.clone(),
                                op: if gt { Op::Gt(n) } else { Op::Lt(n) },
                            }
                        }
                        Some(Tok::Ident(word)) if word == "in" || word == "notin" => {
                            let notin = word == "notin";
                            i += 1;
                            if toks.get(i) != Some(&Tok::Open) {
                                return Err(parse_error("found '', expected: '('"));
                            }
                            i += 1;
                            let mut values = Vec::new();
                            loop {
                                match toks.get(i) {
                                    Some(Tok::Ident(v)) => {
                                        check_value(v)?;
                                        values.push(v.clone());
                                        i += 1;
                                        match toks.get(i) {
                                            Some(Tok::Comma) => i += 1,
                                            Some(Tok::Close) => {
                                                i += 1;
                                                break;
                                            }
                                            _ => {
                                                return Err(parse_error(
                                                    "found '', expected: ',' or ')'",
                                                ));
                                            }
                                        }
                                    }
                                    Some(Tok::Close) => {
                                        // `in ()` is allowed by the grammar; it matches nothing.
                                        i += 1;
                                        break;
                                    }
                                    Some(Tok::Comma) => {
                                        values.push(String::new());
                                        i += 1;
                                    }
                                    _ => {
                                        return Err(parse_error(
                                            "found '', expected: ',', ')' or identifier",
                                        ));
                                    }
                                }
                            }
                            Requirement {
                                key: key.clone(),
                                op: if notin {
                                    Op::NotIn(values)
                                } else {
                                    Op::In(values)
                                },
                            }
                        }
                        Some(other) => {
                            return Err(parse_error(format!(
                                "found '{other:?}', expected: in, notin, =, ==, !=, gt, lt"
                            )));
                        }
                    }
                }
                other => {
                    return Err(parse_error(format!(
                        "found '{other:?}', expected: !, identifier, or 'end of string'"
                    )));
                }
            };
            reqs.push(req);
            match toks.get(i) {
                None => {}
                Some(Tok::Comma) => {
                    i += 1;
                    if i == toks.len() {
                        return Err(parse_error("found '', expected: identifier after ','"));
                    }
                }
                Some(other) => {
                    return Err(parse_error(format!("found '{other:?}', expected: ','")));
                }
            }
        }
        Ok(Self { reqs })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Whether an object with these labels matches.
    pub(crate) fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        self.reqs.iter().all(|r| {
            let v = labels.and_then(|l| l.get(&r.key)).and_then(Value::as_str);
            match &r.op {
                Op::In(vals) => v.is_some_and(|v| vals.iter().any(|x| x == v)),
                Op::NotIn(vals) => v.is_none_or(|v| !vals.iter().any(|x| x == v)),
                Op::Exists => v.is_some(),
                Op::DoesNotExist => v.is_none(),
                Op::Gt(n) => v
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|x| x > *n),
                Op::Lt(n) => v
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|x| x < *n),
            }
        })
    }
}

/// One term of a field selector.
#[derive(Debug, Clone, PartialEq)]
struct FieldTerm {
    /// The dotted JSON path of the field in the object.
    path: String,
    value: String,
    negate: bool,
}

/// A parsed field selector; the fields a resource supports are checked at parse time.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FieldSelector {
    terms: Vec<FieldTerm>,
}

fn split_unescaped(s: &str, sep: char) -> Vec<String> {
    let mut parts = Vec::new();
    let mut cur = String::new();
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            cur.push('\\');
            cur.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            parts.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    if escaped {
        cur.push('\\');
    }
    parts.push(cur);
    parts
}

fn unescape(s: &str) -> Result<String, ApiError> {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some(e @ ('\\' | ',' | '=' | '!')) => out.push(e),
                Some(e) => {
                    return Err(ApiError::bad_request(format!(
                        "invalid field selector: invalid escape sequence: \\{e}"
                    )));
                }
                None => {
                    return Err(ApiError::bad_request(
                        "invalid field selector: unterminated escape sequence",
                    ));
                }
            }
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

impl FieldSelector {
    /// Parses `fieldSelector` against the fields this resource supports (label → path in the object).
    pub(crate) fn parse(s: &str, supported: &[(&str, &str)]) -> Result<Self, ApiError> {
        let mut terms = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self { terms });
        }
        for part in split_unescaped(s, ',') {
            let Some((key, value, negate)) = split_term(&part) else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                )));
            };
            let key = key.trim();
            let Some((_, path)) = supported.iter().find(|(label, _)| *label == key) else {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {key}"
                )));
            };
            terms.push(FieldTerm {
                path: (*path).to_string(),
                value: unescape(value)?,
                negate,
            });
        }
        Ok(Self { terms })
    }

    /// `metadata.name=<name>`, taken as it is (no selector syntax to escape), as the real server
    /// builds it for a watch of one object.
    pub(crate) fn name(name: &str) -> Self {
        Self {
            terms: vec![FieldTerm {
                path: "metadata.name".into(),
                value: name.to_string(),
                negate: false,
            }],
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// The name this selector pins (`metadata.name=x`), which lets a list skip the scan.
    pub(crate) fn pinned_name(&self) -> Option<&str> {
        self.terms
            .iter()
            .find(|t| t.path == "metadata.name" && !t.negate)
            .map(|t| t.value.as_str())
    }

    pub(crate) fn matches(&self, obj: &Value) -> bool {
        self.terms.iter().all(|t| {
            let mut cur = obj;
            let mut found = true;
            for seg in t.path.split('.') {
                match cur.get(seg) {
                    Some(v) => cur = v,
                    None => {
                        found = false;
                        break;
                    }
                }
            }
            let actual = if !found {
                String::new()
            } else {
                match cur {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                }
            };
            (actual == t.value) != t.negate
        })
    }
}

/// Splits `key<op>value` at the first unescaped operator, trying `!=`, `==`, `=` at each position (as
/// apimachinery's field selector parser does).
fn split_term(part: &str) -> Option<(&str, &str, bool)> {
    let bytes = part.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            i += 2;
            continue;
        }
        // Byte comparisons: `i` may be inside a multi-byte character, the ASCII operators never are.
        let rest = &bytes[i..];
        if rest.starts_with(b"!=") {
            return Some((&part[..i], &part[i + 2..], true));
        }
        if rest.starts_with(b"==") {
            return Some((&part[..i], &part[i + 2..], false));
        }
        if rest.starts_with(b"=") {
            return Some((&part[..i], &part[i + 1..], false));
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn m(sel: &str, labels: Value) -> bool {
        LabelSelector::parse(sel)
            .unwrap()
            .matches(labels.as_object())
    }

    #[test]
    fn label_selectors() {
        assert!(m("a=b", json!({"a": "b"})));
        assert!(m("a==b", json!({"a": "b"})));
        assert!(!m("a!=b", json!({"a": "b"})));
        assert!(m("a!=b", json!({})));
        assert!(m("a in (b, c)", json!({"a": "c"})));
        assert!(!m("a notin (b,c)", json!({"a": "c"})));
        assert!(m("a notin (b,c)", json!({})));
        assert!(m("a", json!({"a": ""})));
        assert!(m("!a", json!({"b": ""})));
        assert!(m("a,b=c", json!({"a": "x", "b": "c"})));
        assert!(m("n>3", json!({"n": "4"})));
        assert!(m(
            "cluster.x-k8s.io/cluster-name=c1",
            json!({"cluster.x-k8s.io/cluster-name": "c1"})
        ));
        assert!(LabelSelector::parse("a in b").is_err());
        assert!(LabelSelector::parse("a=b,").is_err());
        assert!(LabelSelector::parse("a=(b").is_err());
        assert!(LabelSelector::parse("bad key=1").is_err());
    }

    #[test]
    fn field_selectors() {
        let sup = [
            ("metadata.name", "metadata.name"),
            ("metadata.namespace", "metadata.namespace"),
        ];
        let s = FieldSelector::parse("metadata.name=a", &sup).unwrap();
        assert!(s.matches(&json!({"metadata": {"name": "a"}})));
        let s = FieldSelector::parse("metadata.name!=a,metadata.namespace==x", &sup).unwrap();
        assert!(s.matches(&json!({"metadata": {"name": "b", "namespace": "x"}})));
        assert!(FieldSelector::parse("spec.x=1", &sup).is_err());
        let s = FieldSelector::parse("metadata.name=é!=ü", &sup).unwrap();
        assert!(!s.matches(&json!({"metadata": {"name": "x"}})));
        assert!(FieldSelector::parse("métadata", &sup).is_err());
    }
}
