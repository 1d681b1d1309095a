//! The scale subresource's requests (`{resource}/{name}/scale`), answered from `crate::scale`.

use super::*;

/// `{resource}/{name}/scale` of a custom resource that declares the scale subresource: an
/// `autoscaling/v1` Scale read from and written through to the object.
pub(super) async fn scale_request(
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
            crate::scale::get(shared, def, ns, name)?
        }
        Verb::Update => {
            let mut params = write_params(query, headers, "UpdateOptions")?;
            params.subresource = Some("scale");
            let obj = decode_object(def, headers, body)?;
            crate::scale::update(shared, def, ns, name, &obj, &params)?
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
            crate::scale::patch(shared, def, ns, name, ptype, body, &params)?
        }
    };
    reply_after_commit(Ok(respond_value(StatusCode::OK, &scale, &[])), after_commit)
}
