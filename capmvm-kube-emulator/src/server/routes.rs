//! The Kubernetes API paths: which route a path is, and the parts of a resource path.

use super::*;

/// A parsed resource path.
pub(super) struct ResourcePath {
    pub(super) group: String,
    pub(super) version: String,
    pub(super) plural: String,
    pub(super) ns: Option<String>,
    pub(super) name: Option<String>,
    pub(super) sub: Option<String>,
    pub(super) watch: bool,
}

pub(super) enum Route {
    Version,
    Health,
    Api,
    GroupList,
    Group(String),
    ResourceList(String, String),
    OpenApiIndex,
    OpenApiDoc(String, String),
    FaultCounts,
    Resource(ResourcePath),
}

pub(super) fn route(path: &str, shared: &Shared) -> Option<Route> {
    let segs: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(path_decode)
        .collect();
    let s: Vec<&str> = segs.iter().map(String::as_str).collect();
    match s.as_slice() {
        ["version"] => Some(Route::Version),
        ["healthz" | "livez" | "readyz", ..] => Some(Route::Health),
        ["api"] => Some(Route::Api),
        ["apis"] => Some(Route::GroupList),
        ["apis", g] => Some(Route::Group((*g).to_string())),
        ["api", v] => Some(Route::ResourceList(String::new(), (*v).to_string())),
        ["apis", g, v] => Some(Route::ResourceList((*g).to_string(), (*v).to_string())),
        ["openapi", "v3"] => Some(Route::OpenApiIndex),
        ["debug", "faults"] => Some(Route::FaultCounts),
        ["openapi", "v3", "api", v] => Some(Route::OpenApiDoc(String::new(), (*v).to_string())),
        ["openapi", "v3", "apis", g, v] => {
            Some(Route::OpenApiDoc((*g).to_string(), (*v).to_string()))
        }
        ["api", v, rest @ ..] => resource_path("", v, rest, shared).map(Route::Resource),
        ["apis", g, v, rest @ ..] => resource_path(g, v, rest, shared).map(Route::Resource),
        _ => None,
    }
}

pub(super) fn resource_path(
    group: &str,
    version: &str,
    rest: &[&str],
    shared: &Shared,
) -> Option<ResourcePath> {
    let (watch, rest) = match rest {
        ["watch", more @ ..] => (true, more),
        other => (false, other),
    };
    let mk = |plural: &str, ns: Option<&str>, name: Option<&str>, sub: Option<&str>| ResourcePath {
        group: group.to_string(),
        version: version.to_string(),
        plural: plural.to_string(),
        ns: ns.map(str::to_string),
        name: name.map(str::to_string),
        sub: sub.map(str::to_string),
        watch,
    };
    match rest {
        ["namespaces", ns, plural, tail @ ..] => {
            let namespaced = {
                let store = shared.lock();
                store
                    .registry
                    .lookup(group, version, plural)
                    .is_some_and(|d| d.namespaced)
            };
            if namespaced || !group.is_empty() {
                match tail {
                    [] => Some(mk(plural, Some(ns), None, None)),
                    [name] => Some(mk(plural, Some(ns), Some(name), None)),
                    [name, sub] => Some(mk(plural, Some(ns), Some(name), Some(sub))),
                    _ => None,
                }
            } else if tail.is_empty() {
                // `/api/v1/namespaces/{name}/{subresource}`.
                Some(mk("namespaces", None, Some(ns), Some(plural)))
            } else {
                None
            }
        }
        [plural] => Some(mk(plural, None, None, None)),
        [plural, name] => Some(mk(plural, None, Some(name), None)),
        [plural, name, sub] => Some(mk(plural, None, Some(name), Some(sub))),
        _ => None,
    }
}

/// Whether every `%` of a path starts a two-digit hex escape (Go's HTTP server refuses the request
/// before any handler sees it otherwise).
pub(super) fn escapes_valid(path: &str) -> bool {
    let b = path.as_bytes();
    b.iter().enumerate().all(|(i, c)| {
        *c != b'%'
            || (b.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && b.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
    })
}

/// A 404 for a path of `group`: a Status where the built-in API groups' handlers answer, the plain
/// `404 page not found` of the real server's mux elsewhere (unknown groups, and custom resource groups,
/// whose handler answers unknown resources and versions that way).
pub(super) fn not_served(group: &str, status: ApiError) -> ApiError {
    if status.code == 404
        && !matches!(
            group,
            "" | "apiextensions.k8s.io" | "coordination.k8s.io" | "events.k8s.io"
        )
    {
        ApiError::page_not_found()
    } else {
        status
    }
}
