//! Wrappers for tokens and private keys: compared and hashed by content (so a changed secret gives a
//! new pooled channel), never printed.

use std::fmt;

/// A secret text (a basic-auth token). `Debug` and `Display` print `<redacted>`.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct SecretString(String);

impl SecretString {
    /// Wraps `value`.
    pub fn new(value: impl Into<String>) -> Self {
        SecretString(value.into())
    }

    /// The secret itself. Callers must not log or display it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether the secret is the empty string.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<String> for SecretString {
    fn from(value: String) -> Self {
        SecretString(value)
    }
}

impl From<&str> for SecretString {
    fn from(value: &str) -> Self {
        SecretString(value.to_owned())
    }
}

impl fmt::Debug for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Secret bytes (a PEM private key). `Debug` and `Display` print `<redacted>`.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct SecretBytes(Vec<u8>);

impl SecretBytes {
    /// Wraps `value`.
    pub fn new(value: impl Into<Vec<u8>>) -> Self {
        SecretBytes(value.into())
    }

    /// The secret itself. Callers must not log or display it.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl From<Vec<u8>> for SecretBytes {
    fn from(value: Vec<u8>) -> Self {
        SecretBytes(value)
    }
}

impl fmt::Debug for SecretBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for SecretBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let token = SecretString::new("hunter2");
        let key = SecretBytes::new(b"-----BEGIN PRIVATE KEY-----".to_vec());
        for text in [
            format!("{token:?}"),
            format!("{token}"),
            format!("{key:?}"),
            format!("{key}"),
        ] {
            assert_eq!(text, "<redacted>");
        }
        assert_eq!(token.expose(), "hunter2");
    }

    #[test]
    fn equality_follows_content() {
        assert_eq!(SecretString::new("a"), SecretString::new("a"));
        assert_ne!(SecretString::new("a"), SecretString::new("b"));
    }
}
