//! Which hosts a machine may run on: host labels matched by a machine's `hostSelector` (a standard
//! Kubernetes label selector), and the label syntax both must follow.
//!
//! Matching follows `metav1.LabelSelector` exactly: every `matchLabels` pair and every
//! `matchExpressions` requirement must hold; an empty selector matches every host.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Whether a host with `labels` satisfies `selector`. A requirement with an unknown operator or
/// malformed values matches nothing (validation refuses such selectors before they get here).
pub fn matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let pairs_hold = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let requirements_hold = selector.match_expressions.iter().flatten().all(|req| {
        let values = req.values.as_deref().unwrap_or_default();
        let value = labels.get(&req.key);
        match req.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    pairs_hold && requirements_hold
}

/// The selector written as `kubectl get -l` would take it (`role=db,zone in (a,b),!gpu`), for
/// messages.
pub fn describe(selector: &LabelSelector) -> String {
    let mut parts: Vec<String> = selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for req in selector.match_expressions.iter().flatten() {
        let values = req.values.as_deref().unwrap_or_default().join(",");
        parts.push(match req.operator.as_str() {
            "In" => format!("{} in ({values})", req.key),
            "NotIn" => format!("{} notin ({values})", req.key),
            "Exists" => req.key.clone(),
            "DoesNotExist" => format!("!{}", req.key),
            other => format!("{} {other} ({values})", req.key),
        });
    }
    if parts.is_empty() {
        "<everything>".to_string()
    } else {
        parts.join(",")
    }
}

/// Problems with a label selector, as `(path, message)` pairs; `path` is the selector's own path.
pub fn selector_problems(selector: &LabelSelector, path: &str) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    for (k, v) in selector.match_labels.iter().flatten() {
        let at = format!("{path}.matchLabels[{k}]");
        if let Some(why) = label_key_problem(k) {
            problems.push((at.clone(), why));
        }
        if let Some(why) = label_value_problem(v) {
            problems.push((at, why));
        }
    }
    for (i, req) in selector.match_expressions.iter().flatten().enumerate() {
        let at = format!("{path}.matchExpressions[{i}]");
        if let Some(why) = label_key_problem(&req.key) {
            problems.push((format!("{at}.key"), why));
        }
        let values = req.values.as_deref().unwrap_or_default();
        match req.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => problems.push((
                format!("{at}.values"),
                format!(
                    "must not be empty for operator {}; list the label values to match",
                    req.operator
                ),
            )),
            "Exists" | "DoesNotExist" if !values.is_empty() => problems.push((
                format!("{at}.values"),
                format!("must be empty for operator {}; remove values", req.operator),
            )),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => problems.push((
                format!("{at}.operator"),
                format!("{other:?} is not an operator; use In, NotIn, Exists or DoesNotExist"),
            )),
        }
        for (j, v) in values.iter().enumerate() {
            if let Some(why) = label_value_problem(v) {
                problems.push((format!("{at}.values[{j}]"), why));
            }
        }
    }
    problems
}

/// Why `key` is not a Kubernetes label key (`[prefix/]name`: a DNS subdomain prefix of at most 253
/// characters, a name of 1 to 63 alphanumerics, `-`, `_` or `.` starting and ending alphanumeric).
pub fn label_key_problem(key: &str) -> Option<String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && !is_dns_subdomain(prefix)
    {
        return Some(format!(
            "label key {key:?}: prefix {prefix:?} must be a DNS subdomain (lowercase alphanumerics, '-' and '.', at most 253 characters)"
        ));
    }
    if !is_label_name(name) {
        return Some(format!(
            "label key {key:?}: name {name:?} must be 1 to 63 characters of alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric"
        ));
    }
    None
}

/// Why `value` is not a Kubernetes label value (empty, or a label name).
pub fn label_value_problem(value: &str) -> Option<String> {
    (!value.is_empty() && !is_label_name(value)).then(|| {
        format!(
            "label value {value:?} must be empty or 1 to 63 characters of alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric"
        )
    })
}

fn is_label_name(s: &str) -> bool {
    let bytes = s.as_bytes();
    !s.is_empty()
        && s.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            !b.is_empty()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b.first().is_some_and(u8::is_ascii_alphanumeric)
                && b.last().is_some_and(u8::is_ascii_alphanumeric)
        })
}

/// `labels` written `k=v,k=v` for messages (`<none>` when empty).
pub fn describe_labels(labels: &BTreeMap<String, String>) -> String {
    if labels.is_empty() {
        return "<none>".to_string();
    }
    let mut out = String::new();
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{k}={v}");
    }
    out
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn req(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    #[test]
    fn matching_follows_label_selector_semantics() {
        let host = labels(&[("zone", "a"), ("disk", "nvme")]);
        let cases: Vec<(LabelSelector, bool)> = vec![
            (LabelSelector::default(), true),
            (
                LabelSelector {
                    match_labels: Some(labels(&[("zone", "a")])),
                    ..Default::default()
                },
                true,
            ),
            (
                LabelSelector {
                    match_labels: Some(labels(&[("zone", "b")])),
                    ..Default::default()
                },
                false,
            ),
            (
                LabelSelector {
                    match_expressions: Some(vec![req("zone", "In", &["a", "b"])]),
                    ..Default::default()
                },
                true,
            ),
            (
                LabelSelector {
                    match_expressions: Some(vec![req("zone", "NotIn", &["a"])]),
                    ..Default::default()
                },
                false,
            ),
            (
                LabelSelector {
                    match_expressions: Some(vec![req("gpu", "NotIn", &["x"])]),
                    ..Default::default()
                },
                true,
            ),
            (
                LabelSelector {
                    match_expressions: Some(vec![req("disk", "Exists", &[])]),
                    ..Default::default()
                },
                true,
            ),
            (
                LabelSelector {
                    match_expressions: Some(vec![req("gpu", "DoesNotExist", &[])]),
                    ..Default::default()
                },
                true,
            ),
            (
                LabelSelector {
                    match_expressions: Some(vec![req("gpu", "Exists", &[])]),
                    ..Default::default()
                },
                false,
            ),
            (
                LabelSelector {
                    match_expressions: Some(vec![req("zone", "Gt", &["1"])]),
                    ..Default::default()
                },
                false,
            ),
            (
                LabelSelector {
                    match_labels: Some(labels(&[("zone", "a")])),
                    match_expressions: Some(vec![req("gpu", "Exists", &[])]),
                },
                false,
            ),
        ];
        for (selector, want) in cases {
            assert_eq!(matches(&selector, &host), want, "{}", describe(&selector));
        }
    }

    #[test]
    fn describe_reads_like_kubectl() {
        let selector = LabelSelector {
            match_labels: Some(labels(&[("role", "db")])),
            match_expressions: Some(vec![
                req("zone", "In", &["a", "b"]),
                req("gpu", "DoesNotExist", &[]),
            ]),
        };
        assert_eq!(describe(&selector), "role=db,zone in (a,b),!gpu");
        assert_eq!(describe(&LabelSelector::default()), "<everything>");
    }

    #[test]
    fn malformed_selectors_name_the_field() {
        let selector = LabelSelector {
            match_labels: Some(labels(&[("Bad Key", "v")])),
            match_expressions: Some(vec![
                req("zone", "In", &[]),
                req("gpu", "Exists", &["yes"]),
                req("zone", "Like", &["a"]),
            ]),
        };
        let problems = selector_problems(&selector, "spec.hostSelector");
        let paths: Vec<&str> = problems.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "spec.hostSelector.matchLabels[Bad Key]",
                "spec.hostSelector.matchExpressions[0].values",
                "spec.hostSelector.matchExpressions[1].values",
                "spec.hostSelector.matchExpressions[2].operator",
            ]
        );
        assert!(
            problems[3]
                .1
                .contains("use In, NotIn, Exists or DoesNotExist")
        );
    }

    #[test]
    fn label_syntax() {
        assert_eq!(label_key_problem("topology.kubernetes.io/zone"), None);
        assert_eq!(label_key_problem("rack"), None);
        assert!(label_key_problem("UPPER.example/x").is_some());
        assert!(label_key_problem("-x").is_some());
        assert!(label_key_problem(&"a".repeat(64)).is_some());
        assert_eq!(label_value_problem(""), None);
        assert_eq!(label_value_problem("nvme-1.2_x"), None);
        assert!(label_value_problem("a b").is_some());
    }
}
