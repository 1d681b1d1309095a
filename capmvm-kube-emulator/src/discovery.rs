//! Discovery documents (`/version`, `/api`, `/apis`, `/apis/{group}[/{version}]`) and the OpenAPI v3
//! documents built from the served schemas.

use std::sync::Arc;

use base64::Engine as _;
use serde_json::{Map, Value, json};

use super::builtin;
use super::registry::{Builtin, Registry, ResourceDef};
use super::reviews;

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// The Kubernetes version the emulator answers as: the kube-apiserver its contract suite is checked
/// against.
pub(crate) fn version() -> Value {
    json!({
        "major": "1",
        "minor": "36",
        "gitVersion": "v1.36.3-kube-emulator",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.26.8",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

fn fnv64(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn storage_version_hash(def: &ResourceDef) -> String {
    let h = fnv64(format!("{}/{}/{}", def.group, def.version, def.kind).as_bytes());
    base64::engine::general_purpose::STANDARD.encode(h.to_be_bytes())
}

pub(crate) fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]
    })
}

fn group_doc(name: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    let preferred = vs.first().cloned().unwrap_or(Value::Null);
    json!({"name": name, "versions": vs, "preferredVersion": preferred})
}

pub(crate) fn api_group_list(registry: &Registry) -> Value {
    let mut groups: Vec<Value> = registry
        .groups()
        .iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, vs)| group_doc(g, vs))
        .collect();
    groups.extend(
        reviews::GROUPS
            .iter()
            .map(|(g, v, _)| group_doc(g, &[(*v).to_string()])),
    );
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub(crate) fn api_group(registry: &Registry, group: &str) -> Option<Value> {
    let review = reviews::GROUPS
        .iter()
        .find(|(g, _, _)| *g == group)
        .map(|(g, v, _)| ((*g).to_string(), vec![(*v).to_string()]));
    let (g, vs) = review.or_else(|| {
        registry
            .groups()
            .into_iter()
            .find(|(g, _)| g == group && !g.is_empty())
    })?;
    let mut doc = group_doc(&g, &vs);
    if let Value::Object(m) = &mut doc {
        m.insert("kind".into(), json!("APIGroup"));
        m.insert("apiVersion".into(), json!("v1"));
    }
    Some(doc)
}

pub(crate) fn resource_list(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    if reviews::is_review_group(group) {
        return reviews::resource_list(group, version);
    }
    if !registry.has_group_version(group, version) {
        return None;
    }
    let mut resources = Vec::new();
    let mut defs = registry.resources(group, version);
    defs.sort_by(|a, b| a.plural.cmp(&b.plural));
    for d in defs {
        let mut r = Map::new();
        r.insert("name".into(), json!(d.plural));
        r.insert("singularName".into(), json!(d.singular));
        r.insert("namespaced".into(), json!(d.namespaced));
        r.insert("kind".into(), json!(d.kind));
        r.insert("verbs".into(), json!(VERBS));
        if !d.short_names.is_empty() {
            r.insert("shortNames".into(), json!(d.short_names));
        }
        if !d.categories.is_empty() {
            r.insert("categories".into(), json!(d.categories));
        }
        r.insert("storageVersionHash".into(), json!(storage_version_hash(&d)));
        resources.push(Value::Object(r));
        if d.status_subresource {
            resources.push(json!({
                "name": format!("{}/status", d.plural),
                "singularName": "",
                "namespaced": d.namespaced,
                "kind": d.kind,
                "verbs": ["get", "patch", "update"]
            }));
        }
        if d.scale.is_some() {
            resources.push(json!({
                "name": format!("{}/scale", d.plural),
                "singularName": "",
                "namespaced": d.namespaced,
                "group": "autoscaling",
                "version": "v1",
                "kind": "Scale",
                "verbs": ["get", "patch", "update"]
            }));
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

/// The OpenAPI component name of a kind: `io.k8s.api.core.v1.Secret`, or the reversed group for custom
/// resources (`io.x-k8s.cluster.infrastructure.v1alpha2.MicrovmMachine`).
fn schema_name(def: &ResourceDef, kind: &str) -> String {
    match def.builtin {
        Some(Builtin::Crd) => {
            format!("io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.{kind}")
        }
        Some(Builtin::Lease) => format!("io.k8s.api.coordination.v1.{kind}"),
        Some(Builtin::EventV1) => format!("io.k8s.api.events.v1.{kind}"),
        Some(_) => format!("io.k8s.api.core.v1.{kind}"),
        None => {
            let reversed: Vec<&str> = def.group.split('.').rev().collect();
            format!("{}.{}.{kind}", reversed.join("."), def.version)
        }
    }
}

const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";
const LIST_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta";

fn reference(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

fn gvk(def: &ResourceDef, kind: &str) -> Value {
    json!({"group": def.group, "version": def.version, "kind": kind})
}

fn kind_schema(def: &ResourceDef) -> Value {
    let mut s = def
        .raw_schema
        .clone()
        .unwrap_or_else(|| json!({"type": "object"}));
    if let Value::Object(m) = &mut s {
        let props = m.entry("properties").or_insert_with(|| json!({}));
        if let Value::Object(p) = props {
            p.insert("apiVersion".into(), json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources"}));
            p.insert("kind".into(), json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds"}));
            p.insert("metadata".into(), json!({"allOf": [reference(OBJECT_META)], "default": {}, "description": "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"}));
        }
        m.insert(
            "x-kubernetes-group-version-kind".into(),
            json!([gvk(def, &def.kind)]),
        );
    }
    s
}

fn list_schema(def: &ResourceDef, item: &str) -> Value {
    json!({
        "type": "object",
        "description": format!("{} is a list of {}", def.list_kind, def.kind),
        "required": ["items"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "items": {"type": "array", "items": reference(item)},
            "metadata": {"allOf": [reference(LIST_META)], "default": {}}
        },
        "x-kubernetes-group-version-kind": [gvk(def, &def.list_kind)]
    })
}

fn query(name: &str, description: &str, ty: &str) -> Value {
    json!({"name": name, "in": "query", "description": description, "schema": {"type": ty, "uniqueItems": true}})
}

fn operation(
    def: &ResourceDef,
    action: &str,
    kind: &str,
    response: &str,
    extra_params: Vec<Value>,
    body: Option<Value>,
) -> Value {
    let mut op = Map::new();
    op.insert("description".into(), json!(format!("{action} {kind}")));
    op.insert(
        "operationId".into(),
        json!(format!("{action}{}{}", def.kind, def.version)),
    );
    op.insert("parameters".into(), Value::Array(extra_params));
    if let Some(b) = body {
        op.insert("requestBody".into(), b);
    }
    op.insert(
        "responses".into(),
        json!({"200": {"description": "OK", "content": {"application/json": {"schema": reference(response)}}},
               "401": {"description": "Unauthorized"}}),
    );
    op.insert("x-kubernetes-action".into(), json!(action));
    op.insert(
        "x-kubernetes-group-version-kind".into(),
        gvk(def, &def.kind),
    );
    Value::Object(op)
}

fn write_params() -> Vec<Value> {
    vec![
        query(
            "dryRun",
            "When present, indicates that modifications should not be persisted.",
            "string",
        ),
        query(
            "fieldManager",
            "fieldManager is a name associated with the actor or entity that is making these changes.",
            "string",
        ),
        query(
            "fieldValidation",
            "fieldValidation instructs the server on how to handle objects in the request (POST/PUT/PATCH) containing unknown or duplicate fields. Valid values are: - Ignore - Warn - Strict",
            "string",
        ),
    ]
}

fn paths_for(def: &ResourceDef, out: &mut Map<String, Value>) {
    let kind_ref = schema_name(def, &def.kind);
    let list_ref = schema_name(def, &def.list_kind);
    let base = if def.group.is_empty() {
        format!("/api/{}", def.version)
    } else {
        format!("/apis/{}/{}", def.group, def.version)
    };
    let collection = if def.namespaced {
        format!("{base}/namespaces/{{namespace}}/{}", def.plural)
    } else {
        format!("{base}/{}", def.plural)
    };
    let item = format!("{collection}/{{name}}");
    let body = |types: &[&str]| {
        let content: Map<String, Value> = types
            .iter()
            .map(|t| ((*t).to_string(), json!({"schema": reference(&kind_ref)})))
            .collect();
        json!({"content": content, "required": true})
    };
    let patch_body = {
        let mut types = vec![
            "application/json-patch+json",
            "application/merge-patch+json",
        ];
        if def.builtin.is_some() {
            types.push("application/strategic-merge-patch+json");
        }
        let content: Map<String, Value> = types
            .iter()
            .map(|t| ((*t).to_string(), json!({"schema": {"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.Patch"}})))
            .collect();
        json!({"content": content, "required": true})
    };
    let list_params = vec![
        query(
            "labelSelector",
            "A selector to restrict the list of returned objects by their labels.",
            "string",
        ),
        query(
            "fieldSelector",
            "A selector to restrict the list of returned objects by their fields.",
            "string",
        ),
        query(
            "limit",
            "limit is a maximum number of responses to return for a list call.",
            "integer",
        ),
        query(
            "continue",
            "The continue option should be set when retrieving more results from the server.",
            "string",
        ),
        query(
            "resourceVersion",
            "resourceVersion sets a constraint on what resource versions a request may be served from.",
            "string",
        ),
        query(
            "watch",
            "Watch for changes to the described resources and return them as a stream of add, update, and remove notifications.",
            "boolean",
        ),
    ];
    out.insert(
        collection.clone(),
        json!({
            "get": operation(def, "list", &def.kind, &list_ref, list_params.clone(), None),
            "post": operation(def, "post", &def.kind, &kind_ref, write_params(), Some(body(&["application/json", "application/yaml"]))),
            "delete": operation(def, "deletecollection", &def.kind, "io.k8s.apimachinery.pkg.apis.meta.v1.Status", list_params.clone(), None),
        }),
    );
    let mut patch_params = write_params();
    patch_params.push(query(
        "force",
        "Force is going to \"force\" Apply requests.",
        "boolean",
    ));
    out.insert(
        item.clone(),
        json!({
            "get": operation(def, "get", &def.kind, &kind_ref, Vec::new(), None),
            "put": operation(def, "put", &def.kind, &kind_ref, write_params(), Some(body(&["application/json", "application/yaml"]))),
            "patch": operation(def, "patch", &def.kind, &kind_ref, patch_params.clone(), Some(patch_body.clone())),
            "delete": operation(def, "delete", &def.kind, "io.k8s.apimachinery.pkg.apis.meta.v1.Status", vec![
                query("propagationPolicy", "Whether and how garbage collection will be performed.", "string"),
                query("gracePeriodSeconds", "The duration in seconds before the object should be deleted.", "integer"),
                query("dryRun", "When present, indicates that modifications should not be persisted.", "string"),
            ], None),
        }),
    );
    if def.status_subresource {
        out.insert(
            format!("{item}/status"),
            json!({
                "get": operation(def, "get", &def.kind, &kind_ref, Vec::new(), None),
                "put": operation(def, "put", &def.kind, &kind_ref, write_params(), Some(body(&["application/json"]))),
                "patch": operation(def, "patch", &def.kind, &kind_ref, patch_params, Some(patch_body)),
            }),
        );
    }
    if def.namespaced {
        out.insert(
            format!("{base}/{}", def.plural),
            json!({"get": operation(def, "list", &def.kind, &list_ref, list_params, None)}),
        );
    }
}

/// The OpenAPI v3 document of one group version (`api/v1` or `apis/{group}/{version}`).
pub(crate) fn openapi_doc(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    if !registry.has_group_version(group, version) {
        return None;
    }
    let defs: Vec<Arc<ResourceDef>> = registry.resources(group, version);
    let mut paths = Map::new();
    let mut schemas = Map::new();
    for d in &defs {
        paths_for(d, &mut paths);
        schemas.insert(schema_name(d, &d.kind), kind_schema(d));
        schemas.insert(
            schema_name(d, &d.list_kind),
            list_schema(d, &schema_name(d, &d.kind)),
        );
    }
    schemas.insert(OBJECT_META.into(), builtin::object_meta_schema());
    schemas.insert(
        LIST_META.into(),
        json!({"type": "object", "description": "ListMeta describes metadata that synthetic resources must have.", "properties": {
            "continue": {"type": "string"}, "remainingItemCount": {"type": "integer", "format": "int64"},
            "resourceVersion": {"type": "string"}, "selfLink": {"type": "string"}}}),
    );
    schemas.insert("io.k8s.apimachinery.pkg.apis.meta.v1.Patch".into(), json!({"type": "object", "description": "Patch is provided to give a concrete name and type to the Kubernetes PATCH request body."}));
    schemas.insert(
        "io.k8s.apimachinery.pkg.apis.meta.v1.Status".into(),
        json!({"type": "object", "description": "Status is a return value for calls that don't return other objects.", "properties": {
            "apiVersion": {"type": "string"}, "code": {"type": "integer", "format": "int32"}, "details": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            "kind": {"type": "string"}, "message": {"type": "string"}, "metadata": {"allOf": [reference(LIST_META)], "default": {}},
            "reason": {"type": "string"}, "status": {"type": "string"}}}),
    );
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.36.3"},
        "paths": paths,
        "components": {"schemas": schemas}
    }))
}

/// The OpenAPI v3 index: one entry per group version, with a content hash clients cache by.
pub(crate) fn openapi_index(registry: &Registry) -> Value {
    let mut paths = Map::new();
    for (g, versions) in registry.groups() {
        for v in versions {
            let key = if g.is_empty() {
                format!("api/{v}")
            } else {
                format!("apis/{g}/{v}")
            };
            let hash = openapi_doc(registry, &g, &v)
                .map(|d| format!("{:016X}", fnv64(d.to_string().as_bytes())))
                .unwrap_or_default();
            paths.insert(
                key.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={hash}")}),
            );
        }
    }
    json!({"paths": paths})
}
