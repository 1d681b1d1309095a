//! Faults on demand at the HTTP layer: what the fault rules make of a request (an injected answer,
//! a delay, a cut watch, or a committed write whose reply fails).

use super::*;

/// `answer` of a write that was carried out, failed as `after_commit` says: a 504, or a reply cut
/// off (its headers sent, its body broken off, as a connection that dies). An answer that is an
/// error committed nothing and goes as it is.
pub(super) fn reply_after_commit(
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

/// The whole User-Agent header ("" when there is none), which fault rules match by prefix.
pub(super) fn full_user_agent(headers: &HeaderMap) -> &str {
    headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// What the fault rules make of a request.
pub(super) enum FaultOutcome {
    /// Serve it (after any delay), cutting a watch if told, and failing the reply of a write that
    /// was carried out if told.
    Serve {
        cut: Option<WatchCut>,
        after_commit: Option<FaultKind>,
    },
    /// Answer this instead.
    Answer(Result<Response, ApiError>),
}

pub(super) async fn inject_fault(
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

/// The answer of an injected error, before anything is read or stored.
pub(super) fn fault_answer(
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
