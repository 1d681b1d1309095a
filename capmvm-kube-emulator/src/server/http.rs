//! Requests and answers on the wire: query and path decoding, content negotiation, body reading and
//! decoding, and the encoding of answers and `Status` errors.

use super::*;

pub(super) fn percent_decode(s: &str) -> String {
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

pub(super) fn path_decode(s: &str) -> String {
    // `+` is literal in paths; only %XX escapes apply.
    percent_decode(&s.replace('+', "%2B"))
}

pub(super) struct Query(Vec<(String, String)>);

impl Query {
    pub(super) fn parse(q: Option<&str>) -> Self {
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

    pub(super) fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// A boolean parameter read as the real server converts one (`Convert_Slice_string_To_bool`):
    /// absent, `0` or `false` in any case is false; anything else, an empty value included, is true.
    /// No value is refused.
    pub(super) fn flag(&self, key: &str) -> bool {
        self.get(key)
            .is_some_and(|v| v != "0" && !v.eq_ignore_ascii_case("false"))
    }

    pub(super) fn number(&self, key: &str) -> Result<Option<i64>, ApiError> {
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

pub(super) fn status_code(code: u16) -> StatusCode {
    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

pub(super) fn warning_value(w: &str) -> Option<HeaderValue> {
    let escaped = w.replace('\\', "\\\\").replace('"', "\\\"");
    HeaderValue::from_str(&format!("299 - \"{escaped}\"")).ok()
}

pub(super) fn respond(
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

pub(super) fn respond_value(code: StatusCode, v: &Value, warnings: &[String]) -> Response {
    respond(code, "application/json", store::encode(v), warnings)
}

pub(super) fn respond_error(e: &ApiError) -> Response {
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
pub(super) enum Format {
    Json,
    Table,
    Partial,
}

pub(super) fn negotiate(headers: &HeaderMap) -> Result<Format, ApiError> {
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

/// Reads the body up to the limit. A larger body is read on (and dropped) up to a bound, so the client
/// finishes sending and sees the 413 instead of a stalled connection.
pub(super) async fn read_body(body: Body) -> Result<Bytes, ApiError> {
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

pub(super) fn decode_object(
    def: &ResourceDef,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Value, ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    match crate::patch::media_type(ct).as_str() {
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
            crate::protobuf::decode(body)
        }
        _ => Err(crate::protobuf::unsupported()),
    }
}
