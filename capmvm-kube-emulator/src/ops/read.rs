//! LIST and watch setup, and the waits of reads from a resourceVersion not reached yet.

use super::*;

/// LIST options.
#[derive(Debug, Clone, Default)]
pub(crate) struct ListOpts {
    pub(crate) limit: Option<usize>,
    pub(crate) continue_token: Option<String>,
    pub(crate) resource_version: Option<String>,
    pub(crate) resource_version_match: Option<String>,
}

/// A page of a list.
#[derive(Debug)]
pub(crate) struct ListPage {
    pub(crate) items: Vec<Arc<Stored>>,
    pub(crate) resource_version: u64,
    pub(crate) continue_token: Option<String>,
    pub(crate) remaining: Option<u64>,
}

fn encode_continue(rv: u64, key: &ObjKey) -> String {
    let start = format!("{}/{}\u{0}", key.ns, key.name);
    let doc = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": start});
    // Unpadded, as the real server's tokens.
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(doc.to_string())
}

fn decode_continue(token: &str) -> Result<(u64, ObjKey), ApiError> {
    let bad = |why: &str| ApiError::bad_request(format!("continue key is not valid: {why}"));
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .or_else(|_| base64::engine::general_purpose::URL_SAFE.decode(token))
        .or_else(|_| base64::engine::general_purpose::STANDARD.decode(token))
        .map_err(|_| bad("illegal base64 data"))?;
    let doc: Value = serde_json::from_slice(&raw).map_err(|_| bad("not a JSON document"))?;
    if doc.get("v").and_then(Value::as_str) != Some("meta.k8s.io/v1") {
        return Err(bad(
            "incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
        ));
    }
    let rv = doc
        .get("rv")
        .and_then(Value::as_u64)
        .filter(|r| *r > 0)
        .ok_or_else(|| bad("incorrect encoded start resourceVersion"))?;
    let start = doc
        .get("start")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("missing start"))?;
    let start = start.strip_suffix('\u{0}').unwrap_or(start);
    let (ns, name) = start
        .split_once('/')
        .ok_or_else(|| bad("malformed start key"))?;
    Ok((rv, ObjKey::new(ns, name)))
}

/// LIST: a consistent page of the objects the filter selects.
pub(crate) fn list(
    shared: &Shared,
    def: &ResourceDef,
    filter: &Filter,
    opts: &ListOpts,
) -> Result<ListPage, ApiError> {
    let rv_param = opts.resource_version.as_deref().unwrap_or("");
    if opts.resource_version_match.is_some() && rv_param.is_empty() {
        return Err(ApiError::bad_request(
            "resourceVersionMatch is forbidden unless resourceVersion is provided",
        ));
    }
    if opts.continue_token.is_some() && !rv_param.is_empty() && rv_param != "0" {
        return Err(ApiError::bad_request(
            "specifying resource version is not allowed when using continue",
        ));
    }
    let store = shared.lock();
    let (mut at, after) = match &opts.continue_token {
        Some(t) => {
            let (rv, key) = decode_continue(t)?;
            (Some(rv), Some(key))
        }
        None => (None, None),
    };
    if at.is_none() && !rv_param.is_empty() && rv_param != "0" {
        let rv = parse_rv(rv_param)?;
        match opts.resource_version_match.as_deref() {
            Some("Exact") => at = Some(rv),
            None | Some("NotOlderThan") => {
                if rv > store.rev {
                    return Err(ApiError::too_large_resource_version(rv, store.rev));
                }
            }
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "resourceVersionMatch: Unsupported value: {other:?}: supported values: \"Exact\", \"NotOlderThan\""
                )));
            }
        }
    }
    if let Some(a) = at
        && a > store.rev
    {
        return Err(ApiError::too_large_resource_version(a, store.rev));
    }
    let list_rv = at.unwrap_or(store.rev);
    let limit = opts.limit.filter(|l| *l > 0);
    let pinned = filter.fields.pinned_name().map(str::to_string);
    // `fieldSelector=metadata.name=x` in one namespace (kubectl wait and delete, kube-runtime's
    // await_condition) is one lookup, not a scan.
    if let Some(p) = &pinned
        && at.is_none_or(|a| a >= store.rev)
        && after.is_none()
        && (filter.ns.is_some() || !def.namespaced)
    {
        let key = ObjKey::new(filter.ns.as_deref().unwrap_or(""), p);
        let items: Vec<Arc<Stored>> = store
            .get(&def.storage, &key)
            .filter(|o| filter.matches(o.value()))
            .into_iter()
            .collect();
        return Ok(ListPage {
            items,
            resource_version: list_rv,
            continue_token: None,
            remaining: None,
        });
    }
    let mut items = Vec::new();
    let mut last_key: Option<ObjKey> = None;
    let mut more = false;
    let mut remaining = 0u64;
    let trivial = filter.is_trivial();
    let result = store.snapshot(
        &def.storage,
        at,
        filter.ns.as_deref(),
        after.as_ref(),
        |key, obj| {
            if pinned.as_ref().is_some_and(|p| key.name != *p) {
                return true;
            }
            if !filter.matches_stored(key, obj) {
                return true;
            }
            if limit.is_some_and(|l| items.len() >= l) {
                more = true;
                remaining += 1;
                // Counting the rest is only needed (and only reported) without selectors.
                return trivial;
            }
            last_key = Some(key.clone());
            items.push(obj.clone());
            true
        },
    );
    if let Err(e) = result {
        if opts.continue_token.is_some() {
            return Err(ApiError::gone(
                "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
            ));
        }
        return Err(e);
    }
    let continue_token = if more {
        last_key.as_ref().map(|k| encode_continue(list_rv, k))
    } else {
        None
    };
    Ok(ListPage {
        items,
        resource_version: list_rv,
        continue_token,
        remaining: (more && trivial).then_some(remaining),
    })
}

/// Watch options.
#[derive(Debug, Clone, Default)]
pub(crate) struct WatchOpts {
    pub(crate) resource_version: Option<String>,
    pub(crate) resource_version_match: Option<String>,
    pub(crate) bookmarks: bool,
    pub(crate) send_initial_events: bool,
}

/// How a watch starts: a stream (the backlog, then the channel), or an error that the real server
/// reports as an ERROR event in a 200 stream because it arises after the request was accepted.
#[derive(Debug)]
pub(crate) enum WatchStart {
    Stream(Vec<WatchMsg>, mpsc::Receiver<WatchMsg>),
    Error(ApiError),
}

/// Registers a watch. A resourceVersion older than the history gives a 410; one newer than the
/// current revision starts a watch that sends only the changes after it (the real server "may wait
/// indefinitely", as its API documentation says), except with `sendInitialEvents`, where the initial
/// state must be at least that fresh: the watch cache waits up to [`FRESHNESS_WAIT`] for it, then
/// fails with "Too large resource version".
/// A watch's ListOptions refused for a field the options forbid.
fn forbidden_watch_option(field: &str, detail: &str) -> ApiError {
    ApiError::invalid(
        "ListOptions",
        "meta.k8s.io",
        "",
        &[FieldError::forbidden(field, detail)],
    )
}

pub(crate) async fn watch(
    shared: &Shared,
    def: &ResourceDef,
    filter: Filter,
    opts: &WatchOpts,
) -> Result<WatchStart, ApiError> {
    let rv = opts.resource_version.as_deref().unwrap_or("");
    if opts.send_initial_events {
        if opts.resource_version_match.as_deref() != Some("NotOlderThan") {
            return Err(forbidden_watch_option(
                "resourceVersionMatch",
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
        if !opts.bookmarks {
            return Err(forbidden_watch_option(
                "allowWatchBookmarks",
                "sendInitialEvents requires setting allowWatchBookmarks to true",
            ));
        }
    } else if opts.resource_version_match.is_some() {
        return Err(forbidden_watch_option(
            "resourceVersionMatch",
            "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        ));
    }
    let wanted = if rv.is_empty() || rv == "0" {
        None
    } else {
        Some(parse_rv_for(rv, RvUse::Read)?)
    };
    let from = if opts.send_initial_events {
        if let Some(w) = wanted
            && let Err(e) = wait_for_revision(shared, w).await
        {
            return Ok(WatchStart::Error(e));
        }
        None
    } else {
        wanted
    };
    let mut store = shared.lock();
    // A watch that starts with the current state ends it with the `initial-events-end` bookmark
    // whenever bookmarks are allowed, with or without `sendInitialEvents`, as the real watch cache does.
    let initial_events_end = from.is_none() && opts.bookmarks;
    match store.watch(
        &def.storage,
        filter,
        from,
        opts.bookmarks,
        initial_events_end,
    ) {
        Ok((backlog, rx)) => Ok(WatchStart::Stream(backlog, rx)),
        Err(e) if e.code == 410 => Ok(WatchStart::Error(e)),
        Err(e) => Err(e),
    }
}

/// How long a read that needs a resourceVersion newer than the current one waits for it, as the real
/// watch cache's `waitUntilFreshAndBlock` (3 s) before "Too large resource version".
pub(crate) const FRESHNESS_WAIT: Duration = Duration::from_secs(3);

/// Waits (up to [`FRESHNESS_WAIT`]) until the store has reached revision `wanted`.
pub(crate) async fn wait_for_revision(shared: &Shared, wanted: u64) -> Result<(), ApiError> {
    let mut revisions = {
        let store = shared.lock();
        if store.rev >= wanted {
            return Ok(());
        }
        store.revisions()
    };
    let reached = tokio::time::timeout(FRESHNESS_WAIT, revisions.wait_for(|r| *r >= wanted)).await;
    match reached {
        Ok(Ok(_)) => Ok(()),
        _ => {
            let current = shared.lock().rev;
            if current >= wanted {
                Ok(())
            } else {
                Err(ApiError::too_large_resource_version(wanted, current))
            }
        }
    }
}

/// The wait a LIST (or GET) with a resourceVersion makes before it is served: "not older than" and
/// "exact" both need the store to have reached it. Continue tokens carry a version already served.
pub(crate) async fn wait_for_read(
    shared: &Shared,
    resource_version: Option<&str>,
    continued: bool,
    use_: RvUse,
) -> Result<(), ApiError> {
    match resource_version {
        None | Some("" | "0") => Ok(()),
        Some(_) if continued => Ok(()),
        Some(rv) => wait_for_revision(shared, parse_rv_for(rv, use_)?).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip() {
        let t = encode_continue(42, &ObjKey::new("ns", "name"));
        assert_eq!(
            decode_continue(&t).unwrap(),
            (42, ObjKey::new("ns", "name"))
        );
        assert_eq!(decode_continue("garbage!").unwrap_err().code, 400);
    }
}
