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

mod collections;
mod faults;
mod http;
mod routes;
mod scale_subresource;
mod watch_stream;
use collections::*;
use faults::*;
use http::*;
use routes::*;
use scale_subresource::*;
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
    let watch = rp.watch || query.flag("watch");
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
                    force: query.flag("force"),
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
