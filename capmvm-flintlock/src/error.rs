//! The client's error: a [`ErrorKind`] callers branch on, and a message for people.
//!
//! Flintlock reports almost every failure as gRPC `Unknown` with a wrapped Go error text, so the
//! reading of flintlock's texts happens here, once; callers never look at strings.

use std::fmt;

use tonic::Code;

/// What went wrong, as far as a caller needs to decide what to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The microVM does not exist on the host: flintlock's `Unknown` ending in
    /// `microvm spec <ns>/<name>/<uid> not found` (its Get/Delete of an unknown uid), or the
    /// `NotFound` code. Other texts mentioning "not found" (an image during a create, ...) are not
    /// this kind.
    NotFound,
    /// The host refused the credentials (missing or wrong basic-auth token).
    Unauthenticated,
    /// The host refused the request itself: `InvalidArgument`, or one of flintlock's spec rejections
    /// that it reports as `Unknown` (validation failures, missing name, unknown provider, a feature
    /// the provider lacks). Retrying the same request cannot succeed.
    InvalidArgument,
    /// The host could not be reached or the connection broke (refused, reset, TLS handshake failed,
    /// proxy refused the tunnel, connect timeout).
    Unavailable,
    /// The call did not finish within its deadline.
    DeadlineExceeded,
    /// The host configuration given to the client is unusable (bad endpoint, unparsable PEM, a
    /// client certificate without its key, ...). Nothing was sent.
    InvalidConfig,
    /// Anything else (including responses that break the protocol).
    Other,
}

impl ErrorKind {
    /// A short, stable, lowercase name: suitable as a metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not_found",
            ErrorKind::Unauthenticated => "unauthenticated",
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::DeadlineExceeded => "deadline_exceeded",
            ErrorKind::InvalidConfig => "invalid_config",
            ErrorKind::Other => "other",
        }
    }

    /// Whether trying the same call again later may succeed.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            ErrorKind::Unavailable | ErrorKind::DeadlineExceeded | ErrorKind::Other
        )
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed flintlock call (or an unusable host configuration).
///
/// The message is the host's own text (flintlock's wrapped error) or a description of the local
/// failure. It never contains tokens, keys or microVM metadata: the client puts none of them in
/// messages, and flintlock does not echo them.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct Error {
    kind: ErrorKind,
    code: Option<Code>,
    message: String,
}

impl Error {
    /// An error of `kind` with `message`, not coming from a gRPC status.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            code: None,
            message: message.into(),
        }
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The gRPC status code the error came from, if it came from one.
    pub fn code(&self) -> Option<Code> {
        self.code
    }

    /// The human-readable message (the host's text for errors the host reported).
    pub fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn invalid_config(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidConfig, message)
    }

    pub(crate) fn protocol(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Other, message)
    }

    pub(crate) fn deadline(what: &str, deadline: std::time::Duration) -> Self {
        Error {
            kind: ErrorKind::DeadlineExceeded,
            code: Some(Code::DeadlineExceeded),
            message: format!("{what} did not finish within {deadline:?}"),
        }
    }
}

impl From<tonic::Status> for Error {
    fn from(status: tonic::Status) -> Self {
        let code = status.code();
        let kind = classify(&status);
        let mut message = status.message().to_owned();
        // Local transport failures carry their cause in the source chain ("connection refused",
        // the TLS alert, the proxy's answer); statuses sent by the host have no source.
        let mut source = std::error::Error::source(&status);
        while let Some(cause) = source {
            let text = cause.to_string();
            if !text.is_empty() && !message.contains(&text) {
                if !message.is_empty() {
                    message.push_str(": ");
                }
                message.push_str(&text);
            }
            source = cause.source();
        }
        Error {
            kind,
            code: Some(code),
            message,
        }
    }
}

/// Maps a status to a kind. The texts are flintlock's (`infrastructure/grpc/server.go`,
/// `core/application/commands.go`); see `flintlock-and-reference.md` A2.9.
fn classify(status: &tonic::Status) -> ErrorKind {
    let message = status.message();
    let local_source = std::error::Error::source(status);
    match status.code() {
        Code::NotFound => ErrorKind::NotFound,
        Code::Unauthenticated | Code::PermissionDenied => ErrorKind::Unauthenticated,
        Code::InvalidArgument => ErrorKind::InvalidArgument,
        Code::Unavailable => ErrorKind::Unavailable,
        Code::DeadlineExceeded => ErrorKind::DeadlineExceeded,
        // Statuses the client builds itself carry their cause as a source; the host's never do.
        // tonic's own enforcement of the `grpc-timeout` we send is a local `Cancelled`.
        Code::Cancelled if local_source.is_some_and(is_timeout) => ErrorKind::DeadlineExceeded,
        // A connection that broke under a call (reset, closed, GOAWAY).
        Code::Cancelled | Code::Unknown if local_source.is_some() => ErrorKind::Unavailable,
        Code::Unknown if is_not_found_text(message) => ErrorKind::NotFound,
        Code::Unknown if is_spec_rejection_text(message) => ErrorKind::InvalidArgument,
        _ => ErrorKind::Other,
    }
}

fn is_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(error) = source {
        if error.is::<tonic::TimeoutExpired>() {
            return true;
        }
        source = error.source();
    }
    false
}

/// Flintlock's Get/Delete of an unknown uid (A2.4, A2.5): the text ends with
/// `microvm spec <namespace>/<name>/<uid> not found` (namespace and name are blank when only the
/// uid is known, hence `//<uid>`).
///
/// A caller takes `NotFound` as "the microVM is gone" and may drop a finalizer on it, so only that
/// exact form counts: any other "... not found" (an image, a snapshot, a lease during a create) is
/// a failure of the call, not news that the microVM does not exist.
fn is_not_found_text(message: &str) -> bool {
    let Some(head) = message.strip_suffix(" not found") else {
        return false;
    };
    // The id is one word, so it starts after the last space.
    let Some((before, id)) = head.rsplit_once(' ') else {
        return false;
    };
    if !before.ends_with("microvm spec") {
        return false;
    }
    // `<namespace>/<name>/<uid>`: exactly three parts, a uid that is not blank.
    let mut parts = id.split('/');
    let (Some(_namespace), Some(_name), Some(uid), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    !uid.is_empty()
}

/// Flintlock's create rejections that no retry can fix.
fn is_spec_rejection_text(message: &str) -> bool {
    const REJECTIONS: &[&str] = &[
        "an error occurred when attempting to validate microvm spec",
        "creating vmid from spec",
        "not supported by the microvm provider",
        "isn't available",
        "adding instance data: decoding existing instance metadata",
        "adding instance data: unmarshalling exists instance metadata",
    ];
    REJECTIONS.iter().any(|text| message.contains(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind_of(code: Code, message: &str) -> ErrorKind {
        Error::from(tonic::Status::new(code, message)).kind()
    }

    #[test]
    fn flintlock_texts_map_to_kinds() {
        assert_eq!(
            kind_of(
                Code::Unknown,
                "getting microvm: error attempting to locate microvm with uid: X: microvm spec //X not found"
            ),
            ErrorKind::NotFound
        );
        assert_eq!(kind_of(Code::NotFound, "gone"), ErrorKind::NotFound);
        assert_eq!(
            kind_of(
                Code::Unknown,
                "creating microvm: an error occurred when attempting to validate microvm spec: validation failures found: x"
            ),
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            kind_of(
                Code::Unknown,
                "creating microvm: macvtap network interfaces not supported by the microvm provider"
            ),
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            kind_of(
                Code::Unknown,
                "creating microvm: microvm provider x isn't available"
            ),
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            kind_of(
                Code::Unknown,
                "converting request: creating vmid from spec: name is required"
            ),
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            kind_of(Code::Unknown, "saving microvm: disk full"),
            ErrorKind::Other
        );
        assert_eq!(
            kind_of(Code::Unauthenticated, "invalid auth token"),
            ErrorKind::Unauthenticated
        );
        assert_eq!(
            kind_of(Code::Unavailable, "tcp connect error"),
            ErrorKind::Unavailable
        );
        assert_eq!(
            kind_of(Code::DeadlineExceeded, "late"),
            ErrorKind::DeadlineExceeded
        );
        assert_eq!(kind_of(Code::Internal, "boom"), ErrorKind::Other);
    }

    #[test]
    fn only_flintlocks_missing_microvm_texts_are_not_found() {
        for gone in [
            // Get and Delete of an unknown uid (flintlock-and-reference.md A2.4, A2.5).
            "getting microvm: error attempting to locate microvm with uid: 01KE75BHT9H6D7V5YG0KYGRXX2: microvm spec //01KE75BHT9H6D7V5YG0KYGRXX2 not found",
            "deleting microvm: checking to see if spec exists: microvm spec //01KE75BHT9H6D7V5YG0KYGRXX2 not found",
            // The same error when flintlock knows namespace and name too.
            "deleting microvm: microvm spec ns1/m1/01KE75BHT9H6D7V5YG0KYGRXX2 not found",
        ] {
            assert_eq!(kind_of(Code::Unknown, gone), ErrorKind::NotFound, "{gone}");
        }
        // The NotFound code stays NotFound whatever its text.
        assert_eq!(
            kind_of(Code::NotFound, "image not found"),
            ErrorKind::NotFound
        );
    }

    #[test]
    fn other_not_found_texts_are_not_a_missing_microvm() {
        for other in [
            "creating microvm: getting image ghcr.io/x/kernel:1: ghcr.io/x/kernel:1: not found",
            "creating microvm: snapshot flintlock/ns1/m1/root not found",
            "creating microvm: content digest sha256:abc: not found",
            "not found",
            // A spec of a different shape, or no uid.
            "deleting microvm: microvm spec //  not found",
            "deleting microvm: microvm spec ns1/m1 not found",
            "microvm spec //X not found: while saving",
            "lease microvm spec //X not foundx",
        ] {
            assert_ne!(
                kind_of(Code::Unknown, other),
                ErrorKind::NotFound,
                "{other}"
            );
        }
        // A create failing on a missing image is worth retrying, not a reason to forget the VM.
        assert!(kind_of(Code::Unknown, "creating microvm: image not found").is_transient());
    }

    #[test]
    fn local_transport_failures_map_by_their_cause() {
        let timeout = tonic::Status::from_error(Box::new(tonic::TimeoutExpired(())));
        assert_eq!(timeout.code(), Code::Cancelled);
        assert_eq!(Error::from(timeout).kind(), ErrorKind::DeadlineExceeded);
        let broken = tonic::Status::from_error(Box::new(std::io::Error::other("connection reset")));
        let broken = Error::from(broken);
        assert_eq!(broken.kind(), ErrorKind::Unavailable);
        assert!(broken.message().contains("connection reset"), "{broken}");
        // The same codes sent by a host (no local cause) are not transport failures.
        assert_eq!(
            kind_of(Code::Cancelled, "client went away"),
            ErrorKind::Other
        );
    }

    #[test]
    fn display_has_kind_and_host_text() {
        let err = Error::from(tonic::Status::new(
            Code::Unknown,
            "microvm spec //X not found",
        ));
        assert_eq!(err.to_string(), "not_found: microvm spec //X not found");
        assert_eq!(err.code(), Some(Code::Unknown));
    }
}
