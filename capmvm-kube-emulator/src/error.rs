//! Errors: the library's own (`Error`) and the API errors answered as `Status` objects (`ApiError`).

use serde_json::{Map, Value, json};

/// Errors of the emulator as a library (starting, writing a kubeconfig, building a client).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The listening socket could not be bound.
    #[error("binding the API emulator to {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// Reading the bound address or writing a file failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// The kube client could not be built for the emulator's address.
    #[error("building a kube client for {url}: {source}")]
    Client {
        /// The emulator's base URL.
        url: String,
        /// The kube error.
        source: Box<kube::Error>,
    },
    /// The options are not usable.
    #[error("invalid emulator options: {0}")]
    Options(String),
}

/// The kind of one field error, as `k8s.io/apimachinery/pkg/util/validation/field` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FieldErrorKind {
    Required,
    Invalid,
    TypeInvalid,
    NotSupported,
    Forbidden,
    Duplicate,
    TooLong,
    TooMany,
    Internal,
}

impl FieldErrorKind {
    fn reason(self) -> &'static str {
        match self {
            Self::Required => "FieldValueRequired",
            Self::Invalid => "FieldValueInvalid",
            Self::TypeInvalid => "FieldValueTypeInvalid",
            Self::NotSupported => "FieldValueNotSupported",
            Self::Forbidden => "FieldValueForbidden",
            Self::Duplicate => "FieldValueDuplicate",
            Self::TooLong => "FieldValueTooLong",
            Self::TooMany => "FieldValueTooMany",
            Self::Internal => "InternalError",
        }
    }
}

/// One field error of a 422 Invalid answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FieldError {
    pub(crate) kind: FieldErrorKind,
    pub(crate) field: String,
    /// The message without the field prefix, as in `details.causes[].message`.
    pub(crate) message: String,
}

impl FieldError {
    pub(crate) fn required(field: impl Into<String>) -> Self {
        Self {
            kind: FieldErrorKind::Required,
            field: field.into(),
            message: "Required value".into(),
        }
    }

    pub(crate) fn required_detail(field: impl Into<String>, detail: &str) -> Self {
        Self {
            kind: FieldErrorKind::Required,
            field: field.into(),
            message: format!("Required value: {detail}"),
        }
    }

    pub(crate) fn invalid(field: impl Into<String>, value: &Value, detail: &str) -> Self {
        Self {
            kind: FieldErrorKind::Invalid,
            field: field.into(),
            message: format!("Invalid value: {}: {detail}", go_value(value)),
        }
    }

    /// `Invalid value: <shown>: detail`, the value already formatted.
    pub(crate) fn invalid_shown(field: impl Into<String>, shown: &str, detail: &str) -> Self {
        Self {
            kind: FieldErrorKind::Invalid,
            field: field.into(),
            message: format!("Invalid value: {shown}: {detail}"),
        }
    }

    /// A failed CEL rule, as its `reason` says; an invalid scalar is shown, an object or a list is not,
    /// as the real server words it.
    pub(crate) fn rule_failed(
        field: impl Into<String>,
        reason: &str,
        value: &Value,
        message: &str,
    ) -> Self {
        let field = field.into();
        match reason {
            "FieldValueForbidden" => Self::forbidden(field, message),
            "FieldValueRequired" => Self::required_detail(field, message),
            "FieldValueDuplicate" => Self {
                kind: FieldErrorKind::Duplicate,
                field,
                message: format!("Duplicate value: {message}"),
            },
            _ if value.is_object() || value.is_array() => Self {
                kind: FieldErrorKind::Invalid,
                field,
                message: format!("Invalid value: {message}"),
            },
            _ => Self::invalid(field, value, message),
        }
    }

    pub(crate) fn type_invalid(field: impl Into<String>, value: &Value, detail: &str) -> Self {
        Self {
            kind: FieldErrorKind::TypeInvalid,
            field: field.into(),
            message: format!("Invalid value: {}: {detail}", go_value(value)),
        }
    }

    pub(crate) fn not_supported(
        field: impl Into<String>,
        value: &Value,
        allowed: &[String],
    ) -> Self {
        let allowed: Vec<String> = allowed.iter().map(|a| format!("{a:?}")).collect();
        Self {
            kind: FieldErrorKind::NotSupported,
            field: field.into(),
            message: format!(
                "Unsupported value: {}: supported values: {}",
                go_value(value),
                allowed.join(", ")
            ),
        }
    }

    pub(crate) fn forbidden(field: impl Into<String>, detail: &str) -> Self {
        Self {
            kind: FieldErrorKind::Forbidden,
            field: field.into(),
            message: format!("Forbidden: {detail}"),
        }
    }

    pub(crate) fn duplicate(field: impl Into<String>, value: &Value) -> Self {
        Self {
            kind: FieldErrorKind::Duplicate,
            field: field.into(),
            message: format!("Duplicate value: {}", go_value(value)),
        }
    }

    pub(crate) fn too_long(field: impl Into<String>, max: u64) -> Self {
        Self {
            kind: FieldErrorKind::TooLong,
            field: field.into(),
            message: format!("Too long: may not be more than {max} bytes"),
        }
    }

    pub(crate) fn too_many(field: impl Into<String>, actual: usize, max: u64, what: &str) -> Self {
        Self {
            kind: FieldErrorKind::TooMany,
            field: field.into(),
            message: format!("Too many: {actual}: must have at most {max} {what}"),
        }
    }

    /// An error of the server itself about a field (`field.InternalError`).
    pub(crate) fn internal(field: impl Into<String>, detail: &str) -> Self {
        Self {
            kind: FieldErrorKind::Internal,
            field: field.into(),
            message: format!("Internal error: {detail}"),
        }
    }

    /// `field: message`, as in the Status message.
    pub(crate) fn full(&self) -> String {
        format!("{}: {}", self.field, self.message)
    }
}

/// Formats a value the way Go's `%#v` formats the common cases in field errors.
pub(crate) fn go_value(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        Value::Null => "null".into(),
        other => other.to_string(),
    }
}

/// The body of [`ApiError::page_not_found`].
pub(crate) const PAGE_NOT_FOUND: &str = "404 page not found";

/// An API error, answered as a `Status` object whose `code` is the HTTP status.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiError {
    pub(crate) code: u16,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
    pub(crate) details: Option<Map<String, Value>>,
}

/// A resource as it appears in error messages: `microvmmachines.infrastructure.cluster.x-k8s.io`.
pub(crate) fn qualified(resource: &str, group: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

fn details(name: &str, group: &str, kind: &str) -> Map<String, Value> {
    let mut d = Map::new();
    if !name.is_empty() {
        d.insert("name".into(), Value::String(name.into()));
    }
    if !group.is_empty() {
        d.insert("group".into(), Value::String(group.into()));
    }
    if !kind.is_empty() {
        d.insert("kind".into(), Value::String(kind.into()));
    }
    d
}

impl ApiError {
    pub(crate) fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        let message = message.into();
        let mut d = Map::new();
        d.insert("causes".into(), json!([{ "message": message.clone() }]));
        Self {
            code: 500,
            reason: "InternalError",
            message: format!("Internal error occurred: {message}"),
            details: Some(d),
        }
    }

    /// A path the server does not serve (the real server answers these with a plain 404 Status).
    pub(crate) fn path_not_found() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    /// A path no API handler serves (an unknown group or version, or an unknown resource of a custom
    /// resource group): the real server's mux answers these with a plain-text `404 page not found`,
    /// not a Status.
    pub(crate) fn page_not_found() -> Self {
        Self::new(404, "", PAGE_NOT_FOUND)
    }

    /// Whether this is [`ApiError::page_not_found`] (or the OpenAPI handler's empty 404).
    pub(crate) fn is_page_not_found(&self) -> bool {
        self.code == 404 && self.reason.is_empty()
    }

    pub(crate) fn not_found(resource: &str, group: &str, name: &str) -> Self {
        Self {
            code: 404,
            reason: "NotFound",
            message: format!("{} {name:?} not found", qualified(resource, group)),
            details: Some(details(name, group, resource)),
        }
    }

    pub(crate) fn already_exists(resource: &str, group: &str, name: &str) -> Self {
        Self {
            code: 409,
            reason: "AlreadyExists",
            message: format!("{} {name:?} already exists", qualified(resource, group)),
            details: Some(details(name, group, resource)),
        }
    }

    pub(crate) fn conflict(resource: &str, group: &str, name: &str, why: &str) -> Self {
        Self {
            code: 409,
            reason: "Conflict",
            message: format!(
                "Operation cannot be fulfilled on {} {name:?}: {why}",
                qualified(resource, group)
            ),
            details: Some(details(name, group, resource)),
        }
    }

    pub(crate) fn modified_conflict(resource: &str, group: &str, name: &str) -> Self {
        Self::conflict(
            resource,
            group,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub(crate) fn forbidden(resource: &str, group: &str, name: &str, why: &str) -> Self {
        let subject = if name.is_empty() {
            qualified(resource, group)
        } else {
            format!("{} {name:?}", qualified(resource, group))
        };
        Self {
            code: 403,
            reason: "Forbidden",
            message: format!("{subject} is forbidden: {why}"),
            details: Some(details(name, group, resource)),
        }
    }

    /// 422 Invalid: `Kind.group "name" is invalid: field: message`.
    pub(crate) fn invalid(kind: &str, group: &str, name: &str, errors: &[FieldError]) -> Self {
        let subject = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let summary = match errors {
            [one] => one.full(),
            many => format!(
                "[{}]",
                many.iter()
                    .map(FieldError::full)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let mut d = details(name, group, kind);
        let causes: Vec<Value> = errors
            .iter()
            .map(|e| json!({ "reason": e.kind.reason(), "message": e.message, "field": e.field }))
            .collect();
        d.insert("causes".into(), Value::Array(causes));
        Self {
            code: 422,
            reason: "Invalid",
            message: format!("{subject} {name:?} is invalid: {summary}"),
            details: Some(d),
        }
    }

    pub(crate) fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    pub(crate) fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    pub(crate) fn not_acceptable(message: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", message)
    }

    pub(crate) fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub(crate) fn too_large() -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            "Request entity too large: limit is 3145728",
        )
    }

    /// 429 as API priority and fairness answers a request it sheds: the client is to wait
    /// `retry_after_secs` (also sent as the `Retry-After` header) and try again.
    pub(crate) fn too_many_requests(retry_after_secs: u32) -> Self {
        let mut d = Map::new();
        d.insert("retryAfterSeconds".into(), json!(retry_after_secs));
        Self {
            code: 429,
            reason: "TooManyRequests",
            message: "Too many requests, please try again later.".into(),
            details: Some(d),
        }
    }

    /// 504 as the real server's request timeout filter answers a request that ran out of time.
    pub(crate) fn request_timeout() -> Self {
        Self {
            code: 504,
            reason: "Timeout",
            message: "Timeout: request did not complete within requested timeout - context deadline exceeded".into(),
            details: Some(Map::new()),
        }
    }

    /// 504 Timeout for a resourceVersion the server has not reached (yet), as the real storage layer's
    /// `NewTooLargeResourceVersionError`: the one-second retry hint and the `ResourceVersionTooLarge`
    /// cause that client-go's reflector recognises (it then relists from the newest version).
    pub(crate) fn too_large_resource_version(wanted: u64, current: u64) -> Self {
        let mut d = Map::new();
        d.insert(
            "causes".into(),
            json!([{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}]),
        );
        d.insert("retryAfterSeconds".into(), json!(1));
        Self {
            code: 504,
            reason: "Timeout",
            message: format!("Timeout: Too large resource version: {wanted}, current: {current}"),
            details: Some(d),
        }
    }

    /// The `Status` object of this error.
    pub(crate) fn to_status(&self) -> Value {
        let mut s = Map::new();
        s.insert("kind".into(), Value::String("Status".into()));
        s.insert("apiVersion".into(), Value::String("v1".into()));
        s.insert("metadata".into(), Value::Object(Map::new()));
        s.insert("status".into(), Value::String("Failure".into()));
        s.insert("message".into(), Value::String(self.message.clone()));
        // Some real errors carry no reason (an internal error raised as a plain Go error).
        if !self.reason.is_empty() {
            s.insert("reason".into(), Value::String(self.reason.into()));
        }
        if let Some(d) = &self.details {
            s.insert("details".into(), Value::Object(d.clone()));
        }
        s.insert("code".into(), Value::from(self.code));
        Value::Object(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_message_has_the_real_server_shape() {
        let e = ApiError::invalid(
            "MicrovmMachine",
            "infrastructure.cluster.x-k8s.io",
            "m1",
            &[FieldError::invalid(
                "spec.vcpu",
                &json!(100),
                "spec.vcpu in body should be less than or equal to 64",
            )],
        );
        assert_eq!(
            e.message,
            "MicrovmMachine.infrastructure.cluster.x-k8s.io \"m1\" is invalid: spec.vcpu: Invalid value: 100: spec.vcpu in body should be less than or equal to 64"
        );
        assert_eq!(e.to_status()["details"]["causes"][0]["field"], "spec.vcpu");
    }
}
