//! The self-reviews clients ask before acting (`kubectl auth can-i`, `kubectl auth whoami`, operators
//! that check their permissions at start): `SelfSubjectAccessReview` and `SelfSubjectRulesReview`
//! (`authorization.k8s.io/v1`) and `SelfSubjectReview` (`authentication.k8s.io/v1`). The emulator has
//! no authentication or authorization, so every client is an administrator: every access is allowed,
//! and the rules are those a real server lists for a member of `system:masters`.

use serde_json::{Value, json};

use super::error::{ApiError, FieldError};
use super::meta;

/// The user every client of the emulator is.
const USER: &str = "kube-emulator";

/// A review resource: `(plural, singular, kind)`.
type Review = (&'static str, &'static str, &'static str);

/// The group versions these reviews are served in, with their resources (all cluster-scoped,
/// create only): `(group, version, resources)`.
pub(crate) const GROUPS: &[(&str, &str, &[Review])] = &[
    (
        "authentication.k8s.io",
        "v1",
        &[(
            "selfsubjectreviews",
            "selfsubjectreview",
            "SelfSubjectReview",
        )],
    ),
    (
        "authorization.k8s.io",
        "v1",
        &[
            (
                "selfsubjectaccessreviews",
                "selfsubjectaccessreview",
                "SelfSubjectAccessReview",
            ),
            (
                "selfsubjectrulesreviews",
                "selfsubjectrulesreview",
                "SelfSubjectRulesReview",
            ),
        ],
    ),
];

/// Whether `group` is one of the review groups.
pub(crate) fn is_review_group(group: &str) -> bool {
    GROUPS.iter().any(|(g, _, _)| *g == group)
}

/// The discovery resource list of a review group version.
pub(crate) fn resource_list(group: &str, version: &str) -> Option<Value> {
    let (_, _, resources) = GROUPS
        .iter()
        .find(|(g, v, _)| *g == group && *v == version)?;
    let resources: Vec<Value> = resources
        .iter()
        .map(|(plural, singular, kind)| {
            json!({"name": plural, "singularName": singular, "namespaced": false, "kind": kind,
                "verbs": ["create"]})
        })
        .collect();
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1",
        "groupVersion": format!("{group}/{version}"), "resources": resources}))
}

/// Answers `POST /apis/{group}/{version}/{plural}` of a review: the review with its status, 201.
/// `None` for a path that is no review (a 404 to the caller); `manager` names the `managedFields`
/// entry a real server records for the request's spec.
pub(crate) fn review(
    group: &str,
    version: &str,
    plural: &str,
    body: &Value,
    manager: &str,
) -> Option<Result<Value, ApiError>> {
    let (_, _, resources) = GROUPS
        .iter()
        .find(|(g, v, _)| *g == group && *v == version)?;
    let (_, _, kind) = resources.iter().find(|(p, _, _)| *p == plural)?;
    let api_version = format!("{group}/{version}");
    if let Err(e) = check_type(body, &api_version, kind) {
        return Some(Err(e));
    }
    let spec = body.get("spec").cloned().unwrap_or_else(|| json!({}));
    Some(match *kind {
        "SelfSubjectAccessReview" => access_review(&api_version, spec, manager),
        "SelfSubjectRulesReview" => Ok(json!({
            "kind": kind, "apiVersion": api_version, "metadata": {}, "spec": {},
            "status": rules()
        })),
        _ => Ok(json!({
            "kind": kind, "apiVersion": api_version,
            "metadata": {"creationTimestamp": meta::now_rfc3339()},
            "status": {"userInfo": {"username": USER,
                "groups": ["system:masters", "system:authenticated"]}}
        })),
    })
}

fn check_type(body: &Value, api_version: &str, kind: &str) -> Result<(), ApiError> {
    let Some(m) = body.as_object() else {
        return Err(ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {kind})"
        )));
    };
    let got_kind = m.get("kind").and_then(Value::as_str).unwrap_or("");
    let got_version = m.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    if got_kind != kind || got_version != api_version {
        return Err(ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {kind}): expected apiVersion \
             {api_version:?} and kind {kind:?}, got {got_version:?} and {got_kind:?}"
        )));
    }
    Ok(())
}

fn access_review(api_version: &str, spec: Value, manager: &str) -> Result<Value, ApiError> {
    let resource = spec.get("resourceAttributes").filter(|v| !v.is_null());
    let non_resource = spec.get("nonResourceAttributes").filter(|v| !v.is_null());
    if resource.is_some() == non_resource.is_some() {
        return Err(ApiError::invalid(
            "",
            "authorization.k8s.io",
            "",
            &[FieldError::invalid(
                "spec.resourceAttributes",
                &Value::Null,
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            )],
        ));
    }
    let mut fields = serde_json::Map::new();
    for (key, attrs) in [
        ("f:resourceAttributes", resource),
        ("f:nonResourceAttributes", non_resource),
    ] {
        if let Some(Value::Object(a)) = attrs {
            let mut set = serde_json::Map::new();
            set.insert(".".into(), json!({}));
            for k in a.keys() {
                set.insert(format!("f:{k}"), json!({}));
            }
            fields.insert(key.into(), Value::Object(set));
        }
    }
    Ok(json!({
        "kind": "SelfSubjectAccessReview", "apiVersion": api_version,
        "metadata": {"managedFields": [{"manager": manager, "operation": "Update",
            "apiVersion": api_version, "time": meta::now_rfc3339(), "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": fields}}]},
        "spec": spec,
        "status": {"allowed": true}
    }))
}

/// What a real server lists for a member of `system:masters`: the self-reviews, everything on every
/// resource, and every non-resource URL.
fn rules() -> Value {
    json!({
        "resourceRules": [
            {"verbs": ["create"], "apiGroups": ["authorization.k8s.io"],
                "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"]},
            {"verbs": ["create"], "apiGroups": ["authentication.k8s.io"],
                "resources": ["selfsubjectreviews"]},
            {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}
        ],
        "nonResourceRules": [
            {"verbs": ["get"], "nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz",
                "/livez", "/openapi", "/openapi/*", "/readyz", "/version", "/version/"]},
            {"verbs": ["get"], "nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version",
                "/version/"]},
            {"verbs": ["*"], "nonResourceURLs": ["*"]}
        ],
        "incomplete": false
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_access_review_needs_exactly_one_kind_of_attributes() {
        let body = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {}});
        let e = review(
            "authorization.k8s.io",
            "v1",
            "selfsubjectaccessreviews",
            &body,
            "m",
        )
        .unwrap()
        .unwrap_err();
        assert_eq!(e.code, 422);
        let ok = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"verb": "get", "resource": "pods"}}});
        let r = review(
            "authorization.k8s.io",
            "v1",
            "selfsubjectaccessreviews",
            &ok,
            "m",
        )
        .unwrap()
        .unwrap();
        assert_eq!(r["status"]["allowed"], true);
        assert!(review("authorization.k8s.io", "v1", "nothing", &ok, "m").is_none());
    }
}
