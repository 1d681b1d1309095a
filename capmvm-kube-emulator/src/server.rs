//! HTTP: routing of the Kubernetes API paths, content negotiation (JSON, Table, PartialObjectMetadata),
//! request decoding and `Status` error answers, and the watch streams.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};

use super::counters::Verb;
use super::discovery;
use super::error::{ApiError, FieldError};
use super::faults::{FaultKind, FaultRequest, Injected};
use super::meta;
use super::ops::{
    self, DeleteOpts, FieldValidation, ListOpts, Shared, Sub, WatchOpts, WatchStart, WriteParams,
};
use super::patch::PatchType;
use super::registry::{Builtin, ResourceDef};
use super::selector::{FieldSelector, LabelSelector};
use super::store::{self, Filter, Propagation, Written};
use super::table::{self, IncludeObject};

mod watch_stream;
use watch_stream::{WatchCut, WatchStream};

/// The largest request body accepted, as the real server's 3 MiB.
const MAX_BODY: usize = 3 * 1024 * 1024;

/// What the HTTP handlers share.
#[derive(Debug)]
pub(crate) struct App {
    pub(crate) shared: Arc<Shared>,
    /// `host:port` the server is reached at, for `/api`'s `serverAddressByClientCIDRs`.
    pub(crate) address: String,
}

/// Serves until the shutdown signal.
pub(crate) async fn serve(listener: tokio::net::TcpListener, app: Arc<App>) -> std::io::Result<()> {
    let mut shutdown = app.shared.shutdown.clone();
    let router = axum::Router::new().fallback(handle).with_state(app);
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            let _ = shutdown.wait_for(|s| *s).await;
        })
        .await
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn path_decode(s: &str) -> String {
    // `+` is literal in paths; only %XX escapes apply.
    percent_decode(&s.replace('+', "%2B"))
}

struct Query(Vec<(String, String)>);

impl Query {
    fn parse(q: Option<&str>) -> Self {
        let pairs = q
            .unwrap_or("")
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| match p.split_once('=') {
                Some((k, v)) => (percent_decode(k), percent_decode(v)),
                None => (percent_decode(p), String::new()),
            })
            .collect();
        Self(pairs)
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn flag(&self, key: &str) -> Result<bool, ApiError> {
        match self.get(key) {
            None | Some("" | "false" | "0") => Ok(false),
            Some("true" | "1") => Ok(true),
            Some(other) => Err(ApiError::bad_request(format!(
                "invalid value {other:?} for parameter {key}: expected a boolean"
            ))),
        }
    }

    fn number(&self, key: &str) -> Result<Option<i64>, ApiError> {
        match self.get(key) {
            None | Some("") => Ok(None),
            Some(v) => v.parse::<i64>().map(Some).map_err(|_| {
                ApiError::bad_request(format!(
                    "invalid value {v:?} for parameter {key}: expected an integer"
                ))
            }),
        }
    }
}

fn status_code(code: u16) -> StatusCode {
    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

fn warning_value(w: &str) -> Option<HeaderValue> {
    let escaped = w.replace('\\', "\\\\").replace('"', "\\\"");
    HeaderValue::from_str(&format!("299 - \"{escaped}\"")).ok()
}

fn respond(
    code: StatusCode,
    content_type: &'static str,
    body: Bytes,
    warnings: &[String],
) -> Response {
    let mut resp = Response::new(Body::from(body));
    *resp.status_mut() = code;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    for w in warnings {
        if let Some(v) = warning_value(w) {
            resp.headers_mut().append(header::WARNING, v);
        }
    }
    resp
}

fn respond_value(code: StatusCode, v: &Value, warnings: &[String]) -> Response {
    respond(code, "application/json", store::encode(v), warnings)
}

fn respond_error(e: &ApiError) -> Response {
    if e.is_page_not_found() {
        let body: &'static [u8] = if e.message.is_empty() {
            b""
        } else {
            b"404 page not found\n"
        };
        return respond(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            Bytes::from_static(body),
            &[],
        );
    }
    let mut resp = respond_value(status_code(e.code), &e.to_status(), &[]);
    if let Some(secs) = e
        .details
        .as_ref()
        .and_then(|d| d.get("retryAfterSeconds"))
        .and_then(Value::as_u64)
        && let Ok(v) = HeaderValue::from_str(&secs.to_string())
    {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    resp
}

/// What the client accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Json,
    Table,
    Partial,
}

fn negotiate(headers: &HeaderMap) -> Result<Format, ApiError> {
    let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) else {
        return Ok(Format::Json);
    };
    if accept.trim().is_empty() {
        return Ok(Format::Json);
    }
    for part in accept.split(',') {
        let mut pieces = part.split(';').map(str::trim);
        let media = pieces.next().unwrap_or("").to_ascii_lowercase();
        let params: Vec<(String, String)> = pieces
            .filter_map(|p| {
                p.split_once('=')
                    .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            })
            .collect();
        let param = |k: &str| {
            params
                .iter()
                .find(|(pk, _)| pk == k)
                .map(|(_, v)| v.as_str())
        };
        if media == "application/json" || media == "*/*" || media == "application/*" {
            match (param("as"), param("g"), param("v")) {
                (Some("Table"), Some("meta.k8s.io"), Some("v1" | "v1beta1")) => {
                    return Ok(Format::Table);
                }
                (
                    Some("PartialObjectMetadata" | "PartialObjectMetadataList"),
                    Some("meta.k8s.io"),
                    Some("v1" | "v1beta1"),
                ) => {
                    return Ok(Format::Partial);
                }
                (None, _, _) => return Ok(Format::Json),
                _ => {}
            }
        }
    }
    Err(ApiError::not_acceptable(
        "only the following media types are accepted: application/json, application/json;as=Table;v=v1;g=meta.k8s.io, application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io",
    ))
}

/// A parsed resource path.
struct ResourcePath {
    group: String,
    version: String,
    plural: String,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
    watch: bool,
}

enum Route {
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

fn route(path: &str, shared: &Shared) -> Option<Route> {
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

fn resource_path(
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

/// A kube client whose requests `handle` answers directly (see `EmulatorHandle::in_process_client`),
/// sent with `user_agent` when one is given.
pub(crate) fn in_process_client(app: Arc<App>, user_agent: Option<HeaderValue>) -> kube::Client {
    let service = tower::service_fn(move |req: axum::http::Request<kube::client::Body>| {
        let app = app.clone();
        let user_agent = user_agent.clone();
        async move {
            let (mut parts, body) = req.into_parts();
            if let Some(agent) = user_agent {
                parts.headers.insert(header::USER_AGENT, agent);
            }
            let req = Request::from_parts(parts, Body::new(body));
            Ok::<_, std::convert::Infallible>(handle(State(app), req).await)
        }
    });
    kube::Client::new(service, "default")
}

/// Whether every `%` of a path starts a two-digit hex escape (Go's HTTP server refuses the request
/// before any handler sees it otherwise).
fn escapes_valid(path: &str) -> bool {
    let b = path.as_bytes();
    b.iter().enumerate().all(|(i, c)| {
        *c != b'%'
            || (b.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && b.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
    })
}

async fn handle(State(app): State<Arc<App>>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    if !escapes_valid(&path) {
        let mut resp = respond(
            StatusCode::BAD_REQUEST,
            "text/plain; charset=utf-8",
            Bytes::from_static(b"400 Bad Request"),
            &[],
        );
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return resp;
    }
    let query = Query::parse(req.uri().query());
    let headers = req.headers().clone();
    let body = match read_body(req.into_body()).await {
        Ok(b) => b,
        Err(e) => {
            let mut resp = respond_error(&e);
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return resp;
        }
    };
    let result = dispatch(&app, &method, &path, &query, &headers, body).await;
    let resp = match result {
        Ok(r) => r,
        Err(e) => respond_error(&e),
    };
    tracing::debug!(%method, %path, status = resp.status().as_u16(), "request");
    resp
}

/// Reads the body up to the limit. A larger body is read on (and dropped) up to a bound, so the client
/// finishes sending and sees the 413 instead of a stalled connection.
async fn read_body(body: Body) -> Result<Bytes, ApiError> {
    use futures::StreamExt as _;
    const DRAIN_LIMIT: usize = 64 * 1024 * 1024;
    let mut stream = body.into_data_stream();
    let mut buf: Vec<u8> = Vec::new();
    let mut total = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?;
        total = total.saturating_add(chunk.len());
        if total <= MAX_BODY {
            buf.extend_from_slice(&chunk);
        } else if total > DRAIN_LIMIT {
            break;
        }
    }
    if total > MAX_BODY {
        Err(ApiError::too_large())
    } else {
        Ok(Bytes::from(buf))
    }
}

async fn dispatch(
    app: &Arc<App>,
    method: &Method,
    path: &str,
    query: &Query,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let shared = &app.shared;
    let agent = request_agent(headers);
    let Some(r) = route(path, shared) else {
        return Err(ApiError::page_not_found());
    };
    let discovery_get = |counter: &str, v: Option<Value>| -> Result<Response, ApiError> {
        if method != Method::GET {
            return Err(ApiError::method_not_allowed());
        }
        shared.counters.bump(Verb::Get, &Arc::from(counter), agent);
        v.map(|v| respond_value(StatusCode::OK, &v, &[]))
            .ok_or_else(ApiError::path_not_found)
    };
    match r {
        Route::Version => discovery_get("discovery", Some(discovery::version())),
        Route::Health => {
            if method != Method::GET {
                return Err(ApiError::method_not_allowed());
            }
            Ok(respond(
                StatusCode::OK,
                "text/plain; charset=utf-8",
                Bytes::from_static(b"ok"),
                &[],
            ))
        }
        Route::Api => discovery_get("discovery", Some(discovery::api_versions(&app.address))),
        Route::GroupList => {
            let doc = discovery::api_group_list(&shared.lock().registry);
            discovery_get("discovery", Some(doc))
        }
        Route::Group(g) => {
            let doc = discovery::api_group(&shared.lock().registry, &g);
            discovery_get("discovery", doc).map_err(|e| not_served(&g, e))
        }
        Route::ResourceList(g, v) => {
            let doc = discovery::resource_list(&shared.lock().registry, &g, &v);
            discovery_get("discovery", doc).map_err(|e| not_served(&g, e))
        }
        Route::OpenApiIndex => {
            let doc = discovery::openapi_index(&shared.lock().registry);
            discovery_get("openapi", Some(doc))
        }
        Route::OpenApiDoc(g, v) => {
            let doc = discovery::openapi_doc(&shared.lock().registry, &g, &v);
            // The real OpenAPI v3 handler answers an unknown group version with an empty 404.
            discovery_get("openapi", doc).map_err(|e| {
                if e.code == 404 {
                    ApiError::new(404, "", "")
                } else {
                    e
                }
            })
        }
        Route::FaultCounts => {
            if method != Method::GET {
                return Err(ApiError::method_not_allowed());
            }
            let table = shared.faults.counts().to_string();
            Ok(respond(
                StatusCode::OK,
                "text/plain; charset=utf-8",
                Bytes::from(table),
                &[],
            ))
        }
        Route::Resource(rp) => resource(app, method, rp, query, headers, body).await,
    }
}

/// A 404 for a path of `group`: a Status where the built-in API groups' handlers answer, the plain
/// `404 page not found` of the real server's mux elsewhere (unknown groups, and custom resource groups,
/// whose handler answers unknown resources and versions that way).
fn not_served(group: &str, status: ApiError) -> ApiError {
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

/// The client's User-Agent product, for the request counters ("" when it sends none).
fn request_agent(headers: &HeaderMap) -> &str {
    let ua = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    super::counters::user_agent_product(ua)
}

/// The write's query parameters; `options` names the options kind in errors (`CreateOptions`,
/// `UpdateOptions`, `PatchOptions`).
fn write_params(
    query: &Query,
    headers: &HeaderMap,
    options: &str,
) -> Result<WriteParams, ApiError> {
    let dry_run = match query.get("dryRun") {
        None | Some("") => false,
        Some("All") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "dryRun: Unsupported value: {other:?}: supported values: \"All\""
            )));
        }
    };
    let field_validation = match query.get("fieldValidation") {
        None | Some("") | Some("Warn") => FieldValidation::Warn,
        Some("Strict") => FieldValidation::Strict,
        Some("Ignore") => FieldValidation::Ignore,
        Some(other) => {
            return Err(ApiError::invalid(
                options,
                "meta.k8s.io",
                "",
                &[FieldError::not_supported(
                    "fieldValidation",
                    &Value::String(other.to_string()),
                    &["", "Ignore", "Strict", "Warn"].map(String::from),
                )],
            ));
        }
    };
    // The real server names an unnamed manager after the user agent's product.
    let field_manager = query
        .get("fieldManager")
        .filter(|m| !m.is_empty())
        .map(str::to_string)
        .or_else(|| {
            headers
                .get(header::USER_AGENT)
                .and_then(|v| v.to_str().ok())
                .map(|ua| ua.split('/').next().unwrap_or(ua).to_string())
                .filter(|m| !m.is_empty())
        });
    if field_manager.as_ref().is_some_and(|m| m.len() > 128) {
        return Err(ApiError::invalid(
            "PatchOptions",
            "meta.k8s.io",
            "",
            &[FieldError::too_long("fieldManager", 128)],
        ));
    }
    Ok(WriteParams {
        dry_run,
        field_validation,
        field_manager,
        subresource: None,
        managed_fields_set: false,
    })
}

fn decode_object(def: &ResourceDef, headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    let base = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match base.as_str() {
        "" | "application/json" | "*/*" => serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
        }),
        "application/yaml" | "application/x-yaml" | "text/yaml" => {
            let text = std::str::from_utf8(body)
                .map_err(|e| ApiError::bad_request(format!("invalid YAML: {e}")))?;
            serde_saphyr::from_str::<Value>(text).map_err(|e| {
                ApiError::bad_request(format!("couldn't get version/kind; yaml parse error: {e}"))
            })
        }
        // kubectl's typed commands (`kubectl create namespace|secret|configmap`) send protobuf.
        "application/vnd.kubernetes.protobuf"
            if matches!(
                def.builtin,
                Some(Builtin::Namespace | Builtin::Secret | Builtin::ConfigMap)
            ) =>
        {
            super::protobuf::decode(body)
        }
        _ => Err(super::protobuf::unsupported()),
    }
}

fn filter_from(def: &ResourceDef, ns: Option<&str>, query: &Query) -> Result<Filter, ApiError> {
    Ok(Filter {
        ns: ns.map(str::to_string),
        labels: LabelSelector::parse(query.get("labelSelector").unwrap_or(""))?,
        fields: FieldSelector::parse(query.get("fieldSelector").unwrap_or(""), &def.selectors())?,
    })
}

fn include_object(query: &Query) -> Result<IncludeObject, ApiError> {
    match query.get("includeObject") {
        None | Some("" | "Metadata") => Ok(IncludeObject::Metadata),
        Some("None") => Ok(IncludeObject::None),
        Some("Object") => Ok(IncludeObject::Object),
        Some(other) => Err(ApiError::bad_request(format!(
            "includeObject: Unsupported value: {other:?}: supported values: \"Metadata\", \"None\", \"Object\""
        ))),
    }
}

fn object_response(
    def: &ResourceDef,
    stored: &store::Stored,
    format: Format,
    query: &Query,
    code: StatusCode,
    warnings: &[String],
) -> Result<Response, ApiError> {
    match format {
        Format::Json => Ok(respond(
            code,
            "application/json",
            ops::view_bytes(def, stored),
            warnings,
        )),
        Format::Partial => Ok(respond_value(
            code,
            &table::partial_metadata(stored.value()),
            warnings,
        )),
        Format::Table => {
            let v = ops::view(def, stored.value());
            let t = table::table(
                def,
                std::slice::from_ref(&v),
                include_object(query)?,
                Some(stored.rv),
                None,
                true,
            );
            Ok(respond(
                code,
                "application/json;as=Table;v=v1;g=meta.k8s.io",
                store::encode(&t),
                warnings,
            ))
        }
    }
}

fn written_response(
    def: &ResourceDef,
    written: &Written,
    created: bool,
    warnings: &[String],
) -> Response {
    let code = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    respond(
        code,
        "application/json",
        ops::view_bytes(def, written.object()),
        warnings,
    )
}

async fn resource(
    app: &Arc<App>,
    method: &Method,
    rp: ResourcePath,
    query: &Query,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let shared = &app.shared;
    let agent = request_agent(headers);
    if super::reviews::is_review_group(&rp.group) {
        return review_request(shared, method, &rp, query, headers, &body);
    }
    let def = {
        let store = shared.lock();
        store.registry.lookup(&rp.group, &rp.version, &rp.plural)
    };
    let Some(def) = def else {
        return Err(not_served(&rp.group, ApiError::path_not_found()));
    };
    if def.namespaced && rp.name.is_some() && rp.ns.is_none() {
        return Err(not_served(&rp.group, ApiError::path_not_found()));
    }
    if !def.namespaced && rp.ns.is_some() {
        return Err(not_served(&rp.group, ApiError::path_not_found()));
    }
    if rp.sub.as_deref() == Some("scale") && def.scale.is_some() && !rp.watch {
        return scale_request(app, method, &def, &rp, query, headers, &body).await;
    }
    let sub = match rp.sub.as_deref() {
        None => Sub::Main,
        Some("status") if def.status_subresource => Sub::Status,
        Some(_) => return Err(not_served(&rp.group, ApiError::path_not_found())),
    };
    let counter = if sub == Sub::Status {
        def.counter_name_status.clone()
    } else {
        def.counter_name.clone()
    };
    let ns = rp.ns.as_deref();
    if rp.watch {
        // The (deprecated) `/watch/` paths are served for GET of a collection or of one object only.
        if sub != Sub::Main {
            return Err(ApiError::path_not_found());
        }
        if *method != Method::GET {
            return Err(ApiError::method_not_allowed());
        }
    }
    // `?watch=true` makes a GET of a collection a watch; on a named path the real server ignores it
    // (a plain GET), and only the `/watch/` form watches one object.
    // As the real server's request info decides it: any `watch` value but `false` or `0` watches.
    let watch = rp.watch
        || query
            .get("watch")
            .is_some_and(|w| !w.eq_ignore_ascii_case("false") && w != "0");
    // The custom resource handler takes a POST to a named path as a create (the name comes from the
    // body), where the built-in registries refuse it.
    let named = rp.name.is_some() && !(*method == Method::POST && def.builtin.is_none());
    let Some(verb) = verb_of(method, named, watch, rp.watch, sub) else {
        return Err(ApiError::method_not_allowed());
    };
    shared.counters.bump(verb, &counter, agent);
    let (cut, after_commit) =
        match inject_fault(shared, &def, &rp, verb, &counter, query, headers).await {
            FaultOutcome::Serve { cut, after_commit } => (cut, after_commit),
            FaultOutcome::Answer(answer) => return answer,
        };
    let answer = match (method.clone(), rp.name.as_deref()) {
        (Method::GET, None) if watch => {
            let filter = filter_from(&def, ns, query)?;
            start_watch(app, &def, filter, query, negotiate(headers)?, cut).await
        }
        (Method::GET, Some(name)) if rp.watch => {
            let filter = named_filter(&def, ns, name, query)?;
            start_watch(app, &def, filter, query, negotiate(headers)?, cut).await
        }
        (Method::GET, None) => {
            let format = negotiate(headers)?;
            let opts = list_opts(query)?;
            ops::wait_for_read(
                shared,
                opts.resource_version.as_deref(),
                opts.continue_token.is_some(),
                ops::RvUse::List,
            )
            .await?;
            list(shared, &def, ns, query, &opts, format)
        }
        (Method::GET, Some(name)) => {
            let format = negotiate(headers)?;
            // A GET "not older than" a resourceVersion waits for it as a LIST does.
            ops::wait_for_read(
                shared,
                query.get("resourceVersion"),
                false,
                ops::RvUse::Read,
            )
            .await?;
            let stored = ops::get(shared, &def, ns, name)?;
            object_response(&def, &stored, format, query, StatusCode::OK, &[])
        }
        (Method::POST, _) if sub == Sub::Main && !named => {
            let params = write_params(query, headers, "CreateOptions")?;
            let obj = decode_object(&def, headers, &body)?;
            let res = ops::create(shared, &def, ns, obj, &params)?;
            Ok(written_response(&def, &res.written, true, &res.warnings))
        }
        (Method::PUT, Some(name)) => {
            let params = write_params(query, headers, "UpdateOptions")?;
            let obj = decode_object(&def, headers, &body)?;
            let res = ops::update(shared, &def, ns, name, sub, obj, &params)?;
            Ok(written_response(
                &def,
                &res.written,
                res.created,
                &res.warnings,
            ))
        }
        (Method::PATCH, Some(name)) => {
            let params = write_params(query, headers, "PatchOptions")?;
            let ct = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let Some(ptype) = PatchType::from_content_type(ct) else {
                let accepted = if def.builtin.is_some() {
                    "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json"
                } else {
                    "application/json-patch+json, application/merge-patch+json"
                };
                return Err(ApiError::unsupported_media_type(format!(
                    "the body of the request was in an unknown format - accepted media types include: {accepted}"
                )));
            };
            if ptype == PatchType::Apply {
                // Apply names its manager explicitly: the User-Agent does not stand in.
                let mut params = params;
                params.field_manager = query
                    .get("fieldManager")
                    .filter(|m| !m.is_empty())
                    .map(str::to_string);
                let request = super::apply::ApplyRequest {
                    ns,
                    name,
                    sub,
                    body: &body,
                    force: query.flag("force")?,
                };
                let res = super::apply::apply(shared, &def, &request, &params)?;
                return Ok(written_response(
                    &def,
                    &res.written,
                    res.created,
                    &res.warnings,
                ));
            }
            let res = ops::patch(shared, &def, ns, name, sub, ptype, &body, &params)?;
            Ok(written_response(
                &def,
                &res.written,
                res.created,
                &res.warnings,
            ))
        }
        (Method::DELETE, Some(name)) if sub == Sub::Main => {
            let opts = delete_opts(query, &body)?;
            let written = ops::delete(shared, &def, ns, name, &opts)?;
            Ok(delete_response(&def, name, &written))
        }
        (Method::DELETE, None) if sub == Sub::Main => {
            let opts = delete_opts(query, &body)?;
            delete_collection(shared, &def, ns, query, &opts)
        }
        (Method::PUT, None) if def.builtin.is_none() => {
            Err(ApiError::bad_request("name must be provided"))
        }
        _ => Err(ApiError::method_not_allowed()),
    };
    reply_after_commit(answer, after_commit)
}

/// `answer` of a write that was carried out, failed as `after_commit` says: a 504, or a reply cut
/// off (its headers sent, its body broken off, as a connection that dies). An answer that is an
/// error committed nothing and goes as it is.
fn reply_after_commit(
    answer: Result<Response, ApiError>,
    after_commit: Option<FaultKind>,
) -> Result<Response, ApiError> {
    match (answer, after_commit) {
        (Ok(_), Some(FaultKind::CommittedTimeout)) => Err(ApiError::request_timeout()),
        (Ok(written), Some(FaultKind::CommittedCut)) => {
            let (parts, _) = written.into_parts();
            let broken = futures::stream::once(async {
                Err::<Bytes, std::io::Error>(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "connection cut by the API emulator's fault rules after the write",
                ))
            });
            Ok(Response::from_parts(parts, Body::from_stream(broken)))
        }
        (answer, _) => answer,
    }
}

/// `POST` of a self-review (`kubectl auth can-i`, `kubectl auth whoami`): answered at once, nothing
/// stored.
fn review_request(
    shared: &Shared,
    method: &Method,
    rp: &ResourcePath,
    query: &Query,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ApiError> {
    let known = super::reviews::resource_list(&rp.group, &rp.version).is_some_and(|l| {
        l["resources"]
            .as_array()
            .is_some_and(|r| r.iter().any(|r| r["name"] == rp.plural.as_str()))
    });
    if !known || rp.ns.is_some() || rp.name.is_some() || rp.sub.is_some() || rp.watch {
        return Err(ApiError::path_not_found());
    }
    if *method != Method::POST {
        return Err(ApiError::method_not_allowed());
    }
    let counter: Arc<str> = Arc::from(format!("{}/{}", rp.group, rp.plural));
    shared
        .counters
        .bump(Verb::Create, &counter, request_agent(headers));
    let params = write_params(query, headers, "CreateOptions")?;
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    let doc: Value = if ct.starts_with("application/vnd.kubernetes.protobuf") {
        super::protobuf::decode(body)?
    } else if ct.contains("yaml") {
        let text = std::str::from_utf8(body)
            .map_err(|e| ApiError::bad_request(format!("invalid YAML: {e}")))?;
        serde_saphyr::from_str(text).map_err(|e| {
            ApiError::bad_request(format!("couldn't get version/kind; yaml parse error: {e}"))
        })?
    } else {
        serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
        })?
    };
    let manager = params.field_manager.as_deref().unwrap_or("unknown");
    match super::reviews::review(&rp.group, &rp.version, &rp.plural, &doc, manager) {
        Some(Ok(answer)) => Ok(respond_value(StatusCode::CREATED, &answer, &[])),
        Some(Err(e)) => Err(e),
        None => Err(ApiError::path_not_found()),
    }
}

/// The verb of a request on a resource path, as the request counters and fault rules name it; `None`
/// for a method the path does not take.
fn verb_of(method: &Method, named: bool, watch: bool, watch_path: bool, sub: Sub) -> Option<Verb> {
    match (method.clone(), named) {
        (Method::GET, false) if watch => Some(Verb::Watch),
        (Method::GET, true) if watch_path => Some(Verb::Watch),
        (Method::GET, false) => Some(Verb::List),
        (Method::GET, true) => Some(Verb::Get),
        (Method::POST, false) if sub == Sub::Main => Some(Verb::Create),
        (Method::PUT, _) => Some(Verb::Update),
        (Method::PATCH, true) => Some(Verb::Patch),
        (Method::DELETE, true) if sub == Sub::Main => Some(Verb::Delete),
        (Method::DELETE, false) if sub == Sub::Main => Some(Verb::DeleteCollection),
        _ => None,
    }
}

/// The whole User-Agent header ("" when there is none), which fault rules match by prefix.
fn full_user_agent(headers: &HeaderMap) -> &str {
    headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// What the fault rules make of a request.
enum FaultOutcome {
    /// Serve it (after any delay), cutting a watch if told, and failing the reply of a write that
    /// was carried out if told.
    Serve {
        cut: Option<WatchCut>,
        after_commit: Option<FaultKind>,
    },
    /// Answer this instead.
    Answer(Result<Response, ApiError>),
}

async fn inject_fault(
    shared: &Shared,
    def: &ResourceDef,
    rp: &ResourcePath,
    verb: Verb,
    counter: &str,
    query: &Query,
    headers: &HeaderMap,
) -> FaultOutcome {
    let Some(fault) = shared.faults.decide(&FaultRequest {
        verb,
        group: &def.group,
        plural: &def.plural,
        subresource: rp.sub.as_deref(),
        user_agent: full_user_agent(headers),
        counter,
        resuming_watch: verb == Verb::Watch
            && query
                .get("resourceVersion")
                .is_some_and(|rv| !rv.is_empty() && rv != "0"),
    }) else {
        return FaultOutcome::Serve {
            cut: None,
            after_commit: None,
        };
    };
    match fault.kind {
        FaultKind::Slow => {
            // Slow, then the real answer; shutting down does not wait for the delay.
            let mut shutdown = shared.shutdown.clone();
            tokio::select! {
                () = tokio::time::sleep(fault.delay) => {}
                _ = shutdown.wait_for(|s| *s) => {}
            }
            FaultOutcome::Serve {
                cut: None,
                after_commit: None,
            }
        }
        FaultKind::CutWatch => FaultOutcome::Serve {
            cut: Some(WatchCut {
                after: fault.cut_after,
                counter: fault.cut,
            }),
            after_commit: None,
        },
        kind if kind.commits() => FaultOutcome::Serve {
            cut: None,
            after_commit: Some(kind),
        },
        _ => FaultOutcome::Answer(fault_answer(shared, def, rp.name.as_deref(), query, &fault)),
    }
}

/// `{resource}/{name}/scale` of a custom resource that declares the scale subresource: an
/// `autoscaling/v1` Scale read from and written through to the object.
async fn scale_request(
    app: &Arc<App>,
    method: &Method,
    def: &Arc<ResourceDef>,
    rp: &ResourcePath,
    query: &Query,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ApiError> {
    let shared = &app.shared;
    let Some(name) = rp.name.as_deref() else {
        return Err(ApiError::path_not_found());
    };
    let verb = match *method {
        Method::GET => Verb::Get,
        Method::PUT => Verb::Update,
        Method::PATCH => Verb::Patch,
        _ => return Err(ApiError::method_not_allowed()),
    };
    let counter: Arc<str> = Arc::from(format!("{}/scale", def.counter_name));
    shared.counters.bump(verb, &counter, request_agent(headers));
    let after_commit = match inject_fault(shared, def, rp, verb, &counter, query, headers).await {
        FaultOutcome::Answer(answer) => return answer,
        FaultOutcome::Serve { after_commit, .. } => after_commit,
    };
    let ns = rp.ns.as_deref();
    let scale = match verb {
        Verb::Get => {
            ops::wait_for_read(
                shared,
                query.get("resourceVersion"),
                false,
                ops::RvUse::Read,
            )
            .await?;
            super::scale::get(shared, def, ns, name)?
        }
        Verb::Update => {
            let mut params = write_params(query, headers, "UpdateOptions")?;
            params.subresource = Some("scale");
            let obj = decode_object(def, headers, body)?;
            super::scale::update(shared, def, ns, name, &obj, &params)?
        }
        _ => {
            let mut params = write_params(query, headers, "PatchOptions")?;
            params.subresource = Some("scale");
            let ct = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let ptype = PatchType::from_content_type(ct)
                .filter(|p| *p != PatchType::Apply)
                .ok_or_else(|| {
                    ApiError::unsupported_media_type(
                        "the body of the request was in an unknown format - accepted media types include: \
                         application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json",
                    )
                })?;
            super::scale::patch(shared, def, ns, name, ptype, body, &params)?
        }
    };
    reply_after_commit(Ok(respond_value(StatusCode::OK, &scale, &[])), after_commit)
}

/// The answer of an injected error, before anything is read or stored.
fn fault_answer(
    shared: &Shared,
    def: &ResourceDef,
    name: Option<&str>,
    query: &Query,
    fault: &Injected,
) -> Result<Response, ApiError> {
    Err(match fault.kind {
        FaultKind::InternalError => {
            ApiError::internal("fault injected by the API emulator's fault rules")
        }
        FaultKind::TooManyRequests => ApiError::too_many_requests(fault.retry_after_secs),
        FaultKind::Conflict => {
            ApiError::modified_conflict(&def.plural, &def.group, name.unwrap_or(""))
        }
        FaultKind::Timeout => ApiError::request_timeout(),
        FaultKind::Gone => {
            // As a watch from a compacted resourceVersion: an ERROR event in a 200 stream.
            let from = query.get("resourceVersion").unwrap_or("");
            let current = shared.lock().rev;
            let e = ApiError::gone(format!("too old resource version: {from} ({current})"));
            let line = store::event_line("ERROR", &store::encode(&e.to_status()));
            return Ok(respond(StatusCode::OK, "application/json", line, &[]));
        }
        FaultKind::Slow
        | FaultKind::CutWatch
        | FaultKind::CommittedTimeout
        | FaultKind::CommittedCut => {
            return Err(ApiError::internal(
                "a delay, a cut or a fault after the write is not an answer",
            ));
        }
    })
}

fn delete_response(def: &ResourceDef, name: &str, written: &Written) -> Response {
    match written {
        // Registries other than the namespaces' answer an immediate deletion with a Status (custom
        // resources too).
        Written::Removed(obj) if def.builtin != Some(Builtin::Namespace) => {
            let status = json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": name, "group": def.group, "kind": def.plural, "uid": meta::meta_str(obj.value(), "uid")}
            });
            respond_value(StatusCode::OK, &status, &[])
        }
        w => respond(
            StatusCode::OK,
            "application/json",
            ops::view_bytes(def, w.object()),
            &[],
        ),
    }
}

fn delete_opts(query: &Query, body: &[u8]) -> Result<DeleteOpts, ApiError> {
    let doc: Value = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?
    };
    let policy = doc
        .get("propagationPolicy")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| query.get("propagationPolicy").map(str::to_string));
    let orphan_flag = doc.get("orphanDependents").and_then(Value::as_bool);
    let propagation = match (policy.as_deref(), orphan_flag) {
        (None | Some(""), Some(true)) => Propagation::Orphan,
        (None | Some(""), _) => Propagation::Background,
        (Some("Background"), _) => Propagation::Background,
        (Some("Foreground"), _) => Propagation::Foreground,
        (Some("Orphan"), _) => Propagation::Orphan,
        (Some(other), _) => {
            return Err(ApiError::invalid(
                "DeleteOptions",
                "meta.k8s.io",
                "",
                &[FieldError::not_supported(
                    "propagationPolicy",
                    &json!(other),
                    &["Foreground", "Background", "Orphan", "nil"].map(String::from),
                )],
            ));
        }
    };
    let dry_run = match doc.get("dryRun").and_then(Value::as_array) {
        Some(list) => list.iter().any(|v| v == "All"),
        None => match query.get("dryRun") {
            None | Some("") => false,
            Some("All") => true,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "dryRun: Unsupported value: {other:?}: supported values: \"All\""
                )));
            }
        },
    };
    Ok(DeleteOpts {
        propagation,
        uid: doc
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(str::to_string),
        resource_version: doc
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string),
        dry_run,
    })
}

fn list_opts(query: &Query) -> Result<ListOpts, ApiError> {
    let limit = query
        .number("limit")?
        .filter(|l| *l > 0)
        .map(|l| usize::try_from(l).unwrap_or(usize::MAX));
    Ok(ListOpts {
        limit,
        continue_token: query
            .get("continue")
            .filter(|c| !c.is_empty())
            .map(str::to_string),
        resource_version: query.get("resourceVersion").map(str::to_string),
        resource_version_match: query
            .get("resourceVersionMatch")
            .filter(|c| !c.is_empty())
            .map(str::to_string),
    })
}

fn list(
    shared: &Shared,
    def: &ResourceDef,
    ns: Option<&str>,
    query: &Query,
    opts: &ListOpts,
    format: Format,
) -> Result<Response, ApiError> {
    let filter = filter_from(def, ns, query)?;
    let page = ops::list(shared, def, &filter, opts)?;
    match format {
        Format::Table => {
            let values: Vec<Value> = page
                .items
                .iter()
                .map(|s| ops::view(def, s.value()).into_owned())
                .collect();
            let t = table::table(
                def,
                &values,
                include_object(query)?,
                Some(page.resource_version),
                page.continue_token.as_deref(),
                true,
            );
            Ok(respond(
                StatusCode::OK,
                "application/json;as=Table;v=v1;g=meta.k8s.io",
                store::encode(&t),
                &[],
            ))
        }
        Format::Partial => {
            let items: Vec<Value> = page
                .items
                .iter()
                .map(|s| table::partial_metadata(s.value()))
                .collect();
            let mut md = serde_json::Map::new();
            md.insert(
                "resourceVersion".into(),
                json!(page.resource_version.to_string()),
            );
            if let Some(c) = &page.continue_token {
                md.insert("continue".into(), json!(c));
            }
            let v = json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": md, "items": items});
            Ok(respond_value(StatusCode::OK, &v, &[]))
        }
        Format::Json => {
            let mut out = Vec::with_capacity(
                page.items.iter().map(|s| s.bytes.len() + 1).sum::<usize>() + 256,
            );
            out.extend_from_slice(b"{\"kind\":");
            out.extend_from_slice(json!(def.list_kind).to_string().as_bytes());
            out.extend_from_slice(b",\"apiVersion\":");
            out.extend_from_slice(json!(def.api_version()).to_string().as_bytes());
            out.extend_from_slice(b",\"metadata\":{\"resourceVersion\":\"");
            out.extend_from_slice(page.resource_version.to_string().as_bytes());
            out.push(b'"');
            if let Some(c) = &page.continue_token {
                out.extend_from_slice(b",\"continue\":");
                out.extend_from_slice(json!(c).to_string().as_bytes());
            }
            if let Some(n) = page.remaining {
                out.extend_from_slice(format!(",\"remainingItemCount\":{n}").as_bytes());
            }
            out.extend_from_slice(b"},\"items\":[");
            for (i, s) in page.items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(&ops::view_bytes(def, s));
            }
            out.extend_from_slice(b"]}");
            Ok(respond(
                StatusCode::OK,
                "application/json",
                Bytes::from(out),
                &[],
            ))
        }
    }
}

fn delete_collection(
    shared: &Shared,
    def: &ResourceDef,
    ns: Option<&str>,
    query: &Query,
    opts: &DeleteOpts,
) -> Result<Response, ApiError> {
    let filter = filter_from(def, ns, query)?;
    let page = ops::list(shared, def, &filter, &ListOpts::default())?;
    let mut items = Vec::new();
    for s in &page.items {
        let name = meta::meta_str(s.value(), "name").to_string();
        let obj_ns = meta::meta_str(s.value(), "namespace").to_string();
        let obj_ns = if def.namespaced {
            Some(obj_ns.as_str())
        } else {
            None
        };
        match ops::delete(shared, def, obj_ns, &name, opts) {
            Ok(w) => items.push(ops::view(def, w.object().value()).into_owned()),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let v = json!({"kind": def.list_kind, "apiVersion": def.api_version(), "metadata": {}, "items": items});
    Ok(respond_value(StatusCode::OK, &v, &[]))
}

/// The selection of a watch of one object (`/watch/.../{name}`): the real server turns the name into
/// `fieldSelector=metadata.name=<name>`, and refuses a field selector that names another object.
fn named_filter(
    def: &ResourceDef,
    ns: Option<&str>,
    name: &str,
    query: &Query,
) -> Result<Filter, ApiError> {
    let mut filter = filter_from(def, ns, query)?;
    if filter.fields.is_empty() {
        filter.fields = FieldSelector::name(name);
    } else if filter.fields.pinned_name() != Some(name) {
        return Err(ApiError::bad_request(
            "fieldSelector metadata.name doesn't match requested name",
        ));
    }
    Ok(filter)
}

async fn start_watch(
    app: &Arc<App>,
    def: &Arc<ResourceDef>,
    filter: Filter,
    query: &Query,
    format: Format,
    cut: Option<WatchCut>,
) -> Result<Response, ApiError> {
    let shared = &app.shared;
    let opts = WatchOpts {
        resource_version: query.get("resourceVersion").map(str::to_string),
        resource_version_match: query
            .get("resourceVersionMatch")
            .filter(|c| !c.is_empty())
            .map(str::to_string),
        bookmarks: query.flag("allowWatchBookmarks")?,
        send_initial_events: query.flag("sendInitialEvents")?,
    };
    let timeout = match query.number("timeoutSeconds")? {
        Some(t) if t > 0 => {
            Duration::from_secs(u64::try_from(t).unwrap_or(u64::MAX).min(365 * 24 * 3600))
        }
        _ => shared.default_watch_timeout,
    };
    let include = include_object(query)?;
    let content_type = match format {
        Format::Table => "application/json;as=Table;v=v1;g=meta.k8s.io",
        _ => "application/json",
    };
    match ops::watch(shared, def, filter, &opts).await? {
        WatchStart::Stream(backlog, rx) => {
            let stream = WatchStream::new(
                shared.clone(),
                def.clone(),
                backlog,
                rx,
                tokio::time::Instant::now() + timeout,
                (format, include),
                cut,
            );
            let body = Body::from_stream(stream.into_stream());
            let mut resp = Response::new(body);
            resp.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            Ok(resp)
        }
        WatchStart::Error(e) => {
            // The real server answers a too-old (or, for `sendInitialEvents`, a too-new) watch with an
            // ERROR event in a 200 stream.
            let line = store::event_line("ERROR", &store::encode(&e.to_status()));
            Ok(respond(StatusCode::OK, "application/json", line, &[]))
        }
    }
}
