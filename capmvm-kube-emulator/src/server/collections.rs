//! Requests on collections: LIST (with Tables and PartialObjectMetadata), DELETE of a collection, and
//! watches of a collection or of one object.

use super::*;

pub(super) fn list_opts(query: &Query) -> Result<ListOpts, ApiError> {
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

pub(super) fn list(
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

pub(super) fn delete_collection(
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
pub(super) fn named_filter(
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

pub(super) async fn start_watch(
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
        bookmarks: query.flag("allowWatchBookmarks"),
        send_initial_events: query.flag("sendInitialEvents"),
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
