//! The API server's own count of requests: its audit log (JSON lines, metadata level).

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::{Result, io_error};

/// One audit event (the fields this crate reads).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AuditEvent {
    /// Identifies the request: a watch logs `ResponseStarted` and `ResponseComplete` under one id.
    #[serde(rename = "auditID")]
    pub audit_id: String,
    /// `ResponseStarted` (long-running requests), `ResponseComplete` or `Panic`.
    pub stage: String,
    /// The verb: get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: String,
    /// The request's path and query.
    #[serde(rename = "requestURI")]
    pub request_uri: String,
    /// Who asked.
    pub user: AuditUser,
    /// What it was about.
    pub object_ref: Option<AuditObject>,
    /// The answer.
    pub response_status: Option<AuditStatus>,
    /// The client's user agent.
    pub user_agent: String,
    /// When the server received the request (RFC 3339, microseconds).
    pub request_received_timestamp: String,
    /// The server's notes: `authorization.k8s.io/decision` is `forbid` when authorization (RBAC)
    /// refused the request, `allow` when it passed (a 403 then came from admission, such as a
    /// namespace being terminated).
    pub annotations: std::collections::BTreeMap<String, String>,
}

/// The authenticated user of an audit event.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct AuditUser {
    /// `system:serviceaccount:<namespace>:<name>` for a ServiceAccount.
    pub username: String,
    /// Its groups.
    pub groups: Vec<String>,
}

/// The object of an audit event.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AuditObject {
    /// The resource (plural).
    pub resource: String,
    /// The subresource (status, scale, ...).
    pub subresource: String,
    /// The namespace.
    pub namespace: String,
    /// The name.
    pub name: String,
    /// The API group (empty for the core group).
    pub api_group: String,
}

/// The response of an audit event.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct AuditStatus {
    /// The HTTP status code.
    pub code: u16,
    /// The reason, for failures.
    pub reason: String,
    /// The message, for failures.
    pub message: String,
}

impl AuditEvent {
    /// Whether the request changes state.
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }

    /// Its HTTP status code (0 if none was logged).
    pub fn code(&self) -> u16 {
        self.response_status.as_ref().map_or(0, |s| s.code)
    }

    /// Whether authorization (RBAC) refused the request.
    pub fn denied_by_authorization(&self) -> bool {
        self.annotations
            .get("authorization.k8s.io/decision")
            .is_some_and(|d| d == "forbid")
    }

    /// `resource` or `resource/subresource`.
    pub fn resource(&self) -> String {
        match &self.object_ref {
            Some(o) if !o.subresource.is_empty() => format!("{}/{}", o.resource, o.subresource),
            Some(o) => o.resource.clone(),
            None => String::new(),
        }
    }
}

/// An audit log file.
#[derive(Clone, Debug)]
pub struct AuditLog {
    path: PathBuf,
}

/// Requests counted from an audit log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuditCounts {
    /// Every request, once.
    pub requests: u64,
    /// Requests that change state.
    pub writes: u64,
    /// Requests by verb.
    pub by_verb: BTreeMap<String, u64>,
    /// Requests by HTTP status code.
    pub by_code: BTreeMap<u16, u64>,
}

impl AuditLog {
    /// The log at `path`.
    pub fn new(path: &Path) -> AuditLog {
        AuditLog {
            path: path.to_path_buf(),
        }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every request logged so far, once each (a long-running request by its first event). Lines
    /// that are not events (a line still being written) are skipped.
    pub fn requests(&self) -> Result<Vec<AuditEvent>> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(io_error(&self.path)(e)),
        };
        let mut seen = HashSet::new();
        Ok(text
            .lines()
            .filter_map(|line| serde_json::from_str::<AuditEvent>(line).ok())
            .filter(|e| seen.insert(e.audit_id.clone()))
            .collect())
    }

    /// The requests of user `username`, counted.
    pub fn counts_for(&self, username: &str) -> Result<AuditCounts> {
        Ok(count(
            self.requests()?
                .iter()
                .filter(|e| e.user.username == username),
        ))
    }

    /// The requests of `username` that authorization (RBAC) refused: a verb or resource missing
    /// from its roles. A 403 from admission (a namespace being terminated) is not one.
    pub fn forbidden_for(&self, username: &str) -> Result<Vec<AuditEvent>> {
        Ok(self
            .requests()?
            .into_iter()
            .filter(|e| e.user.username == username && e.denied_by_authorization())
            .collect())
    }
}

/// Counts `events`.
pub fn count<'a>(events: impl Iterator<Item = &'a AuditEvent>) -> AuditCounts {
    let mut counts = AuditCounts::default();
    for e in events {
        counts.requests += 1;
        if e.is_write() {
            counts.writes += 1;
        }
        *counts.by_verb.entry(e.verb.clone()).or_default() += 1;
        *counts.by_code.entry(e.code()).or_default() += 1;
    }
    counts
}

/// The username of ServiceAccount `namespace/name`.
pub fn service_account_user(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_watch_counts_once_and_writes_are_told_apart() {
        let dir =
            std::env::temp_dir().join(format!("capmvm-upstream-audit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("audit.log");
        let line = |id: &str, stage: &str, verb: &str, code: u16| {
            format!(
                r#"{{"kind":"Event","auditID":"{id}","stage":"{stage}","verb":"{verb}","requestURI":"/x","user":{{"username":"system:serviceaccount:capmvm-system:capmvm-manager"}},"objectRef":{{"resource":"microvmmachines","subresource":"status","apiGroup":"infrastructure.cluster.x-k8s.io"}},"responseStatus":{{"code":{code}}},"annotations":{{"authorization.k8s.io/decision":"{decision}"}}}}"#,
                decision = if code == 403 { "forbid" } else { "allow" }
            )
        };
        let text = [
            line("a", "ResponseStarted", "watch", 200),
            line("b", "ResponseComplete", "patch", 200),
            line("a", "ResponseComplete", "watch", 200),
            line("c", "ResponseComplete", "get", 403),
            // Refused by admission (a namespace being terminated), not by RBAC.
            line("d", "ResponseComplete", "create", 403).replace("\"forbid\"", "\"allow\""),
            "{\"kind\":\"Ev".to_string(),
        ]
        .join("\n");
        std::fs::write(&path, text).unwrap();
        let log = AuditLog::new(&path);
        let user = service_account_user("capmvm-system", "capmvm-manager");
        let counts = log.counts_for(&user).unwrap();
        assert_eq!(counts.requests, 4);
        assert_eq!(counts.writes, 2);
        assert_eq!(counts.by_code.get(&403), Some(&2));
        let forbidden = log.forbidden_for(&user).unwrap();
        assert_eq!(forbidden.len(), 1);
        assert_eq!(forbidden[0].resource(), "microvmmachines/status");
        assert_eq!(log.counts_for("someone-else").unwrap().requests, 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
