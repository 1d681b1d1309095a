//! The subset of Kubernetes JSONPath that printer columns use: field access (with `\.` escapes), `..`,
//! `*`, `[n]`, `[a:b]`, `['key']` and filters such as `[?(@.type=="Ready")]`.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
enum Step {
    Field(String),
    Recursive(String),
    Wildcard,
    Index(i64),
    Slice(Option<i64>, Option<i64>),
    Filter(Box<Filter>),
}

#[derive(Debug, Clone, PartialEq)]
enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Debug, Clone, PartialEq)]
struct Filter {
    path: Vec<Step>,
    cmp: Option<(CmpOp, Value)>,
}

/// A compiled JSONPath expression.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct JsonPath {
    steps: Vec<Step>,
}

impl JsonPath {
    /// Compiles an expression such as `.status.conditions[?(@.type=="Ready")].status`.
    pub(crate) fn parse(expr: &str) -> Result<Self, String> {
        let mut s = expr.trim();
        if let Some(inner) = s.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
            s = inner.trim();
        }
        if let Some(rest) = s.strip_prefix('$') {
            s = rest;
        }
        let chars: Vec<char> = s.chars().collect();
        let (steps, end) = parse_steps(&chars, 0, false)?;
        if end != chars.len() {
            return Err(format!(
                "unexpected {:?} in {expr:?}",
                chars[end..].iter().collect::<String>()
            ));
        }
        Ok(Self { steps })
    }

    /// An expression that selects nothing (a stand-in for one that failed to parse).
    pub(crate) fn nothing() -> Self {
        Self {
            steps: vec![Step::Filter(Box::new(Filter {
                path: Vec::new(),
                cmp: Some((CmpOp::Lt, Value::Null)),
            }))],
        }
    }

    /// All values the expression selects, in document order.
    pub(crate) fn find<'a>(&self, root: &'a Value) -> Vec<&'a Value> {
        eval(&self.steps, vec![root])
    }
}

fn parse_name(chars: &[char], mut i: usize) -> (String, usize) {
    let mut name = String::new();
    while i < chars.len() {
        match chars[i] {
            '\\' if i + 1 < chars.len() => {
                name.push(chars[i + 1]);
                i += 2;
            }
            '.' | '[' => break,
            // Filters end at `)` or an operator; names in filters stop there.
            c @ (')' | '=' | '!' | '<' | '>' | ' ') => {
                let _ = c;
                break;
            }
            c => {
                name.push(c);
                i += 1;
            }
        }
    }
    (name, i)
}

fn parse_steps(
    chars: &[char],
    mut i: usize,
    in_filter: bool,
) -> Result<(Vec<Step>, usize), String> {
    let mut steps = Vec::new();
    while i < chars.len() {
        match chars[i] {
            '.' => {
                if chars.get(i + 1) == Some(&'.') {
                    let (name, j) = parse_name(chars, i + 2);
                    steps.push(Step::Recursive(name));
                    i = j;
                } else if chars.get(i + 1) == Some(&'*') {
                    steps.push(Step::Wildcard);
                    i += 2;
                } else {
                    let (name, j) = parse_name(chars, i + 1);
                    if !name.is_empty() {
                        steps.push(Step::Field(name));
                    }
                    i = j;
                }
            }
            '[' => {
                let (step, j) = parse_bracket(chars, i + 1)?;
                steps.push(step);
                i = j;
            }
            c if in_filter && (c == ')' || c == ' ' || "=!<>".contains(c)) => break,
            c if steps.is_empty() && !in_filter && c != ' ' => {
                // A leading field without a dot (`metadata.name`).
                let (name, j) = parse_name(chars, i);
                if name.is_empty() {
                    return Err(format!("unexpected {c:?}"));
                }
                steps.push(Step::Field(name));
                i = j;
            }
            c => return Err(format!("unexpected {c:?}")),
        }
    }
    Ok((steps, i))
}

fn parse_bracket(chars: &[char], mut i: usize) -> Result<(Step, usize), String> {
    let rest: String = chars[i..].iter().collect();
    if rest.starts_with("?(") {
        i += 2;
        while chars.get(i) == Some(&' ') {
            i += 1;
        }
        if chars.get(i) != Some(&'@') {
            return Err("filter must start with @".into());
        }
        let (path, j) = parse_steps(chars, i + 1, true)?;
        i = j;
        while chars.get(i) == Some(&' ') {
            i += 1;
        }
        let mut cmp = None;
        if chars.get(i) != Some(&')') {
            let two: String = chars[i..chars.len().min(i + 2)].iter().collect();
            let (op, len) = match two.as_str() {
                "==" => (CmpOp::Eq, 2),
                "!=" => (CmpOp::Ne, 2),
                "<=" => (CmpOp::Le, 2),
                ">=" => (CmpOp::Ge, 2),
                _ if two.starts_with('<') => (CmpOp::Lt, 1),
                _ if two.starts_with('>') => (CmpOp::Gt, 1),
                _ => return Err(format!("unsupported filter operator at {two:?}")),
            };
            i += len;
            while chars.get(i) == Some(&' ') {
                i += 1;
            }
            let (lit, j) = parse_literal(chars, i)?;
            i = j;
            while chars.get(i) == Some(&' ') {
                i += 1;
            }
            cmp = Some((op, lit));
        }
        if chars.get(i) != Some(&')') || chars.get(i + 1) != Some(&']') {
            return Err("unterminated filter".into());
        }
        return Ok((Step::Filter(Box::new(Filter { path, cmp })), i + 2));
    }
    let close = chars[i..]
        .iter()
        .position(|&c| c == ']')
        .ok_or("unterminated [")?
        + i;
    let inner: String = chars[i..close].iter().collect();
    let inner = inner.trim();
    let step = if inner == "*" {
        Step::Wildcard
    } else if (inner.starts_with('\'') && inner.ends_with('\'')
        || inner.starts_with('"') && inner.ends_with('"'))
        && inner.len() >= 2
    {
        Step::Field(inner[1..inner.len() - 1].to_string())
    } else if let Some((a, b)) = inner.split_once(':') {
        let b = b.split(':').next().unwrap_or("");
        let parse = |s: &str| -> Result<Option<i64>, String> {
            if s.trim().is_empty() {
                Ok(None)
            } else {
                s.trim()
                    .parse()
                    .map(Some)
                    .map_err(|_| format!("bad slice {inner:?}"))
            }
        };
        Step::Slice(parse(a)?, parse(b)?)
    } else {
        Step::Index(inner.parse().map_err(|_| format!("bad index {inner:?}"))?)
    };
    Ok((step, close + 1))
}

fn parse_literal(chars: &[char], mut i: usize) -> Result<(Value, usize), String> {
    match chars.get(i) {
        Some(&q @ ('"' | '\'')) => {
            let mut s = String::new();
            i += 1;
            while let Some(&c) = chars.get(i) {
                if c == q {
                    return Ok((Value::String(s), i + 1));
                }
                if c == '\\' && i + 1 < chars.len() {
                    s.push(chars[i + 1]);
                    i += 2;
                    continue;
                }
                s.push(c);
                i += 1;
            }
            Err("unterminated string".into())
        }
        Some(_) => {
            let start = i;
            while i < chars.len() && chars[i] != ')' && chars[i] != ' ' {
                i += 1;
            }
            let text: String = chars[start..i].iter().collect();
            let v = match text.as_str() {
                "true" => Value::Bool(true),
                "false" => Value::Bool(false),
                "nil" | "null" => Value::Null,
                t => serde_json::from_str::<Value>(t).map_err(|_| format!("bad literal {t:?}"))?,
            };
            Ok((v, i))
        }
        None => Err("missing literal".into()),
    }
}

fn eval<'a>(steps: &[Step], mut cur: Vec<&'a Value>) -> Vec<&'a Value> {
    for step in steps {
        let mut next = Vec::new();
        for v in cur {
            match step {
                Step::Field(name) => {
                    if let Some(x) = v.get(name) {
                        next.push(x);
                    }
                }
                Step::Wildcard => match v {
                    Value::Object(m) => next.extend(m.values()),
                    Value::Array(a) => next.extend(a.iter()),
                    _ => {}
                },
                Step::Recursive(name) => recurse(v, name, &mut next),
                Step::Index(n) => {
                    if let Value::Array(a) = v {
                        let idx = if *n < 0 { a.len() as i64 + n } else { *n };
                        if idx >= 0
                            && let Some(x) = a.get(idx as usize)
                        {
                            next.push(x);
                        }
                    }
                }
                Step::Slice(from, to) => {
                    if let Value::Array(a) = v {
                        let len = a.len() as i64;
                        let norm = |x: i64| if x < 0 { (len + x).max(0) } else { x.min(len) };
                        let from = norm(from.unwrap_or(0));
                        let to = norm(to.unwrap_or(len));
                        if from < to {
                            next.extend(a[from as usize..to as usize].iter());
                        }
                    }
                }
                Step::Filter(f) => {
                    let items: Vec<&Value> = match v {
                        Value::Array(a) => a.iter().collect(),
                        Value::Object(m) => m.values().collect(),
                        _ => Vec::new(),
                    };
                    for item in items {
                        let found = eval(&f.path, vec![item]);
                        let keep = match &f.cmp {
                            None => !found.is_empty(),
                            Some((op, lit)) => found.iter().any(|x| compare(x, op, lit)),
                        };
                        if keep {
                            next.push(item);
                        }
                    }
                }
            }
        }
        cur = next;
    }
    cur
}

fn recurse<'a>(v: &'a Value, name: &str, out: &mut Vec<&'a Value>) {
    match v {
        Value::Object(m) => {
            if name.is_empty() || name == "*" {
                out.extend(m.values());
            } else if let Some(x) = m.get(name) {
                out.push(x);
            }
            for child in m.values() {
                recurse(child, name, out);
            }
        }
        Value::Array(a) => {
            for child in a {
                recurse(child, name, out);
            }
        }
        _ => {}
    }
}

/// `a op b` for values that order (numbers with each other, strings with each other).
fn ordered<T: PartialOrd + ?Sized>(a: &T, op: &CmpOp, b: &T) -> bool {
    match op {
        CmpOp::Eq => a == b,
        CmpOp::Ne => a != b,
        CmpOp::Lt => a < b,
        CmpOp::Le => a <= b,
        CmpOp::Gt => a > b,
        CmpOp::Ge => a >= b,
    }
}

fn compare(x: &Value, op: &CmpOp, lit: &Value) -> bool {
    match (x, lit) {
        (Value::Number(a), Value::Number(b)) => {
            let (a, b) = (
                a.as_f64().unwrap_or(f64::NAN),
                b.as_f64().unwrap_or(f64::NAN),
            );
            ordered(&a, op, &b)
        }
        (Value::String(a), Value::String(b)) => ordered(a, op, b),
        (a, b) => match op {
            CmpOp::Eq => a == b,
            CmpOp::Ne => a != b,
            _ => false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn printer_column_paths() {
        let obj = json!({
            "metadata": {"labels": {"cluster.x-k8s.io/cluster-name": "c1"}},
            "spec": {"items": [1, 2, 3]},
            "status": {"conditions": [
                {"type": "Paused", "status": "False"},
                {"type": "Ready", "status": "True"}
            ]}
        });
        let p = JsonPath::parse(r".metadata.labels.cluster\.x-k8s\.io/cluster-name").unwrap();
        assert_eq!(p.find(&obj), vec![&json!("c1")]);
        let p = JsonPath::parse(r#".status.conditions[?(@.type=="Ready")].status"#).unwrap();
        assert_eq!(p.find(&obj), vec![&json!("True")]);
        let p = JsonPath::parse(".spec.items[-1]").unwrap();
        assert_eq!(p.find(&obj), vec![&json!(3)]);
        let p = JsonPath::parse(".spec.items[*]").unwrap();
        assert_eq!(p.find(&obj).len(), 3);
        let p = JsonPath::parse("{.spec.items[0:2]}").unwrap();
        assert_eq!(p.find(&obj).len(), 2);
        let p = JsonPath::parse(".metadata.labels['cluster.x-k8s.io/cluster-name']").unwrap();
        assert_eq!(p.find(&obj), vec![&json!("c1")]);
        let p = JsonPath::parse(".status.missing").unwrap();
        assert!(p.find(&obj).is_empty());
        assert!(JsonPath::parse(".a[?(@.x=='y'").is_err());
    }
}
