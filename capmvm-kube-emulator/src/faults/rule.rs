//! Fault rules: what to inject, into which requests, how often; and their flag syntax
//! (`kind=500;verbs=list,watch;resources=secrets;share=0.05`).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::counters::Verb;

/// What an injected fault does, as a real server under stress answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// 500 InternalError; nothing is done.
    InternalError,
    /// 429 TooManyRequests with a `Retry-After` header, as API priority and fairness answers; nothing
    /// is done.
    TooManyRequests,
    /// 409 Conflict on an update, patch or delete, as if another writer had won; nothing is stored.
    Conflict,
    /// 504 Timeout (reason `Timeout`); nothing is stored.
    Timeout,
    /// The real answer, after a delay.
    Slow,
    /// A watch whose connection ends abruptly after some events.
    CutWatch,
    /// A watch resumed from a resourceVersion answered with an ERROR event carrying 410 Expired
    /// ("too old resource version"), so the client relists.
    Gone,
    /// The write is carried out (stored, and seen by watchers), then answered 504 Timeout, as when a
    /// reply is lost behind a proxy or the server times out after committing.
    CommittedTimeout,
    /// The write is carried out, then the connection is cut before the reply is complete.
    CommittedCut,
}

impl FaultKind {
    /// Every kind, in report order.
    pub const ALL: [FaultKind; 9] = [
        Self::InternalError,
        Self::TooManyRequests,
        Self::Conflict,
        Self::Timeout,
        Self::Slow,
        Self::CutWatch,
        Self::Gone,
        Self::CommittedTimeout,
        Self::CommittedCut,
    ];

    /// The name used in rules and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InternalError => "internal-error",
            Self::TooManyRequests => "too-many-requests",
            Self::Conflict => "conflict",
            Self::Timeout => "timeout",
            Self::Slow => "slow",
            Self::CutWatch => "cut-watch",
            Self::Gone => "gone",
            Self::CommittedTimeout => "committed-timeout",
            Self::CommittedCut => "committed-cut",
        }
    }

    /// Whether the request is carried out before the fault is injected (its reply is what fails).
    pub fn commits(self) -> bool {
        matches!(self, Self::CommittedTimeout | Self::CommittedCut)
    }

    /// The HTTP code a client sees, for the kinds that answer with an error.
    pub fn http_code(self) -> Option<u16> {
        match self {
            Self::InternalError => Some(500),
            Self::TooManyRequests => Some(429),
            Self::Conflict => Some(409),
            Self::Timeout | Self::CommittedTimeout => Some(504),
            Self::Gone => Some(410),
            Self::Slow | Self::CutWatch | Self::CommittedCut => None,
        }
    }

    /// The verbs this kind can apply to (a rule without verbs applies to all of these).
    pub fn applicable_verbs(self) -> &'static [Verb] {
        const ALL: &[Verb] = &[
            Verb::Get,
            Verb::List,
            Verb::Watch,
            Verb::Create,
            Verb::Update,
            Verb::Patch,
            Verb::Delete,
            Verb::DeleteCollection,
        ];
        match self {
            Self::InternalError | Self::TooManyRequests | Self::Timeout | Self::Slow => ALL,
            // A conflict is a lost race between writers of one object.
            Self::Conflict => &[Verb::Update, Verb::Patch, Verb::Delete],
            // Only a write has something to commit.
            Self::CommittedTimeout | Self::CommittedCut => {
                &[Verb::Create, Verb::Update, Verb::Patch, Verb::Delete]
            }
            Self::CutWatch | Self::Gone => &[Verb::Watch],
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl FromStr for FaultKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "500" | "internal-error" => Ok(Self::InternalError),
            "429" | "too-many-requests" => Ok(Self::TooManyRequests),
            "409" | "conflict" => Ok(Self::Conflict),
            "504" | "timeout" => Ok(Self::Timeout),
            "slow" => Ok(Self::Slow),
            "cut-watch" => Ok(Self::CutWatch),
            "410" | "gone" => Ok(Self::Gone),
            "committed-timeout" => Ok(Self::CommittedTimeout),
            "committed-cut" => Ok(Self::CommittedCut),
            other => Err(format!(
                "unknown kind {other:?}: expected one of 500 (internal-error), 429 (too-many-requests), \
                 409 (conflict), 504 (timeout), slow, cut-watch, 410 (gone), committed-timeout, \
                 committed-cut"
            )),
        }
    }
}

/// One resource a rule selects: `plural[.group][/subresource]`, e.g. `secrets`,
/// `microvmmachines.infrastructure.cluster.x-k8s.io`, `microvmmachines/status`. Without a
/// subresource it selects the resource's subresources too; `core` names the core group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResourceMatch {
    plural: String,
    group: Option<String>,
    subresource: Option<String>,
}

impl ResourceMatch {
    fn parse(s: &str) -> Result<Self, String> {
        let (name, sub) = match s.split_once('/') {
            Some((n, sub)) => (n, Some(sub)),
            None => (s, None),
        };
        let (plural, group) = match name.split_once('.') {
            Some((p, g)) => (p, Some(g)),
            None => (name, None),
        };
        let word = |w: &str| {
            !w.is_empty()
                && w.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        };
        if !word(plural) || group.is_some_and(|g| !word(g)) || sub.is_some_and(|s| !word(s)) {
            return Err(format!(
                "resource {s:?} is not of the form plural[.group][/subresource] in lower case \
                 (e.g. secrets, microvmmachines.infrastructure.cluster.x-k8s.io, microvmmachines/status)"
            ));
        }
        Ok(Self {
            plural: plural.to_string(),
            group: group.map(|g| {
                if g == "core" {
                    String::new()
                } else {
                    g.to_string()
                }
            }),
            subresource: sub.map(str::to_string),
        })
    }

    pub(crate) fn matches(&self, group: &str, plural: &str, subresource: Option<&str>) -> bool {
        self.plural == plural
            && self.group.as_deref().is_none_or(|g| g == group)
            && self
                .subresource
                .as_deref()
                .is_none_or(|s| Some(s) == subresource)
    }
}

impl fmt::Display for ResourceMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.plural)?;
        match self.group.as_deref() {
            Some("") => f.write_str(".core")?,
            Some(g) => write!(f, ".{g}")?,
            None => {}
        }
        if let Some(s) = &self.subresource {
            write!(f, "/{s}")?;
        }
        Ok(())
    }
}

/// A rule that is not usable, naming the part at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("fault rule {rule:?}: {problem}")]
pub struct FaultRuleError {
    /// The rule as written (or as built).
    pub rule: String,
    /// What is wrong and how to write it.
    pub problem: String,
}

/// Which requests to fault and how: a share of the requests with one of `verbs` on one of
/// `resources` (and, optionally, from clients whose User-Agent starts with a prefix) gets `kind`.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultRule {
    pub(crate) kind: FaultKind,
    pub(crate) share: f64,
    pub(crate) verbs: Vec<Verb>,
    pub(crate) resources: Vec<ResourceMatch>,
    pub(crate) user_agent_prefix: Option<String>,
    pub(crate) retry_after_secs: u32,
    pub(crate) delay: Duration,
    pub(crate) cut_after: usize,
    pub(crate) times: Option<u64>,
}

impl FaultRule {
    /// A rule faulting every request its kind applies to (share 1), on every resource, from any
    /// client; narrow it with the other methods.
    pub fn new(kind: FaultKind) -> Self {
        Self {
            kind,
            share: 1.0,
            verbs: Vec::new(),
            resources: Vec::new(),
            user_agent_prefix: None,
            retry_after_secs: 1,
            delay: Duration::from_millis(500),
            cut_after: 1,
            times: None,
        }
    }

    /// The share of matching requests faulted, from 0 to 1.
    #[must_use]
    pub fn share(mut self, share: f64) -> Self {
        self.share = share;
        self
    }

    /// Only these verbs (by default every verb the kind applies to).
    #[must_use]
    pub fn verbs(mut self, verbs: impl IntoIterator<Item = Verb>) -> Self {
        self.verbs = verbs.into_iter().collect();
        self
    }

    /// Only these resources, each `plural[.group][/subresource]` (by default every resource).
    pub fn resources<S: AsRef<str>>(
        mut self,
        resources: impl IntoIterator<Item = S>,
    ) -> Result<Self, FaultRuleError> {
        let mut parsed = Vec::new();
        for r in resources {
            parsed.push(
                ResourceMatch::parse(r.as_ref()).map_err(|problem| FaultRuleError {
                    rule: self.to_string(),
                    problem,
                })?,
            );
        }
        self.resources = parsed;
        Ok(self)
    }

    /// Only requests whose User-Agent starts with this (e.g. `my-operator/` for every version of that client).
    #[must_use]
    pub fn user_agent_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.user_agent_prefix = Some(prefix.into());
        self
    }

    /// The `Retry-After` of a 429, in seconds (default 1).
    #[must_use]
    pub fn retry_after_secs(mut self, secs: u32) -> Self {
        self.retry_after_secs = secs;
        self
    }

    /// The delay of a slow answer (default 500 ms).
    #[must_use]
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// How many events a cut watch sends before its connection ends (default 1; bookmarks count).
    #[must_use]
    pub fn cut_after(mut self, events: usize) -> Self {
        self.cut_after = events;
        self
    }

    /// Fault at most this many requests (by default no limit).
    #[must_use]
    pub fn times(mut self, times: u64) -> Self {
        self.times = Some(times);
        self
    }

    /// The kind injected.
    pub fn kind(&self) -> FaultKind {
        self.kind
    }

    /// Checks the rule is usable: a share from 0 to 1 and verbs its kind applies to.
    pub fn validate(&self) -> Result<(), FaultRuleError> {
        let err = |problem: String| FaultRuleError {
            rule: self.to_string(),
            problem,
        };
        if !(0.0..=1.0).contains(&self.share) {
            return Err(err(format!(
                "share={} is not a fraction: write a number from 0 to 1 (0.05 faults one request in 20)",
                self.share
            )));
        }
        let allowed = self.kind.applicable_verbs();
        if let Some(v) = self.verbs.iter().find(|v| !allowed.contains(v)) {
            return Err(err(format!(
                "kind={} does not apply to verb {v}: it applies to {} (or leave verbs out)",
                self.kind,
                join(allowed)
            )));
        }
        if self.kind == FaultKind::Slow && self.delay.is_zero() {
            return Err(err(
                "kind=slow needs a delay above zero, e.g. delay=200ms".into()
            ));
        }
        Ok(())
    }

    /// Whether the rule selects a request (its kind's verbs when the rule names none).
    pub(crate) fn selects(
        &self,
        verb: Verb,
        group: &str,
        plural: &str,
        subresource: Option<&str>,
        user_agent: &str,
    ) -> bool {
        let verb_ok = if self.verbs.is_empty() {
            self.kind.applicable_verbs().contains(&verb)
        } else {
            self.verbs.contains(&verb)
        };
        verb_ok
            && (self.resources.is_empty()
                || self
                    .resources
                    .iter()
                    .any(|r| r.matches(group, plural, subresource)))
            && self
                .user_agent_prefix
                .as_deref()
                .is_none_or(|p| user_agent.starts_with(p))
    }
}

fn join<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The rule in its flag syntax (parsing it gives the same rule).
impl fmt::Display for FaultRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kind={};share={}", self.kind, self.share)?;
        if !self.verbs.is_empty() {
            write!(f, ";verbs={}", join(&self.verbs))?;
        }
        if !self.resources.is_empty() {
            write!(f, ";resources={}", join(&self.resources))?;
        }
        if let Some(p) = &self.user_agent_prefix {
            write!(f, ";agent={p}")?;
        }
        match self.kind {
            FaultKind::TooManyRequests => write!(f, ";retry-after={}", self.retry_after_secs)?,
            FaultKind::Slow => write!(f, ";delay={}ms", self.delay.as_millis())?,
            FaultKind::CutWatch => write!(f, ";after={}", self.cut_after)?,
            _ => {}
        }
        if let Some(t) = self.times {
            write!(f, ";times={t}")?;
        }
        Ok(())
    }
}

const KEYS: &str = "kind, share, verbs, resources, agent, retry-after (429), delay (slow), after (cut-watch), times";

/// Parses `key=value` pairs separated by `;`: `kind` (required), `share` (default 1), `verbs`,
/// `resources`, `agent` (User-Agent prefix), `retry-after` (seconds), `delay` (`200ms`, `2s`),
/// `after` (events before a cut), `times`.
impl FromStr for FaultRule {
    type Err = FaultRuleError;

    fn from_str(s: &str) -> Result<Self, FaultRuleError> {
        let err = |problem: String| FaultRuleError {
            rule: s.to_string(),
            problem,
        };
        let mut pairs = Vec::new();
        for part in s.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((k, v)) = part.split_once('=') else {
                return Err(err(format!("{part:?} is not key=value (keys: {KEYS})")));
            };
            pairs.push((k.trim().to_ascii_lowercase(), v.trim()));
        }
        let kind = match pairs.iter().find(|(k, _)| k == "kind") {
            Some((_, v)) => v
                .parse::<FaultKind>()
                .map_err(|p| err(format!("kind: {p}")))?,
            None => {
                return Err(err(format!(
                    "kind is missing, e.g. kind=500 (keys: {KEYS})"
                )));
            }
        };
        let mut rule = Self::new(kind);
        for (key, value) in pairs {
            let number = |what: &str| {
                value
                    .parse::<u64>()
                    .map_err(|_| err(format!("{key}={value:?} is not a whole number ({what})")))
            };
            match key.as_str() {
                "kind" => {}
                "share" => {
                    rule.share = value.parse::<f64>().map_err(|_| {
                        err(format!(
                            "share={value:?} is not a number: write a fraction from 0 to 1, e.g. share=0.05"
                        ))
                    })?;
                }
                "verbs" | "verb" => {
                    rule.verbs = list(value)
                        .map(|v| {
                            Verb::from_str(v).map_err(|_| {
                                err(format!(
                                    "verbs: unknown verb {v:?}: expected get, list, watch, create, \
                                     update, patch, delete, deletecollection"
                                ))
                            })
                        })
                        .collect::<Result<_, _>>()?;
                }
                "resources" | "resource" => {
                    rule.resources = list(value)
                        .map(|r| {
                            ResourceMatch::parse(r).map_err(|p| err(format!("resources: {p}")))
                        })
                        .collect::<Result<_, _>>()?;
                }
                "agent" | "user-agent" => {
                    if value.is_empty() {
                        return Err(err(
                            "agent= is empty: give a User-Agent prefix, e.g. agent=my-operator/"
                                .into(),
                        ));
                    }
                    rule.user_agent_prefix = Some(value.to_string());
                }
                "retry-after" => {
                    rule.retry_after_secs = u32::try_from(number("seconds")?)
                        .map_err(|_| err(format!("retry-after={value} is too large")))?;
                }
                "delay" => {
                    rule.delay = parse_duration(value).map_err(|p| err(format!("delay: {p}")))?
                }
                "after" => {
                    rule.cut_after = usize::try_from(number("events before the cut")?)
                        .map_err(|_| err(format!("after={value} is too large")))?;
                }
                "times" => rule.times = Some(number("how many requests to fault")?),
                other => return Err(err(format!("unknown key {other:?} (keys: {KEYS})"))),
            }
        }
        rule.validate().map_err(|e| err(e.problem))?;
        Ok(rule)
    }
}

fn list(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').map(str::trim).filter(|v| !v.is_empty())
}

/// `250ms`, `2s`, `1m`.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let (digits, unit): (String, String) = s.chars().partition(char::is_ascii_digit);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a duration: write e.g. 200ms, 2s or 1m"))?;
    match unit.as_str() {
        "ms" if s.ends_with("ms") => Ok(Duration::from_millis(n)),
        "s" if s.ends_with('s') => Ok(Duration::from_secs(n)),
        "m" if s.ends_with('m') => Ok(Duration::from_secs(n.saturating_mul(60))),
        _ => Err(format!(
            "{s:?} is not a duration: write e.g. 200ms, 2s or 1m"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_parses_and_prints_back() {
        let r: FaultRule = "verbs=list,watch;resources=secrets;kind=500;share=0.05"
            .parse()
            .unwrap();
        assert_eq!(r.kind, FaultKind::InternalError);
        assert_eq!(r.verbs, vec![Verb::List, Verb::Watch]);
        assert!((r.share - 0.05).abs() < f64::EPSILON);
        assert_eq!(r.to_string().parse::<FaultRule>().unwrap(), r);
        let r: FaultRule = "kind=slow;delay=250ms;agent=capmvm-operator/;resources=microvmmachines.infrastructure.cluster.x-k8s.io/status"
            .parse()
            .unwrap();
        assert_eq!(r.delay, Duration::from_millis(250));
        assert!(r.selects(
            Verb::Patch,
            "infrastructure.cluster.x-k8s.io",
            "microvmmachines",
            Some("status"),
            "capmvm-operator/0.1.0"
        ));
        assert!(!r.selects(
            Verb::Patch,
            "infrastructure.cluster.x-k8s.io",
            "microvmmachines",
            None,
            "capmvm-operator/0.1.0"
        ));
        assert!(!r.selects(
            Verb::Patch,
            "infrastructure.cluster.x-k8s.io",
            "microvmmachines",
            Some("status"),
            "kubectl/v1.33"
        ));
        assert_eq!(r.to_string().parse::<FaultRule>().unwrap(), r);
    }

    #[test]
    fn a_bad_rule_names_the_bad_part() {
        let problem = |s: &str| s.parse::<FaultRule>().unwrap_err().problem;
        assert!(problem("verbs=list").contains("kind is missing"));
        assert!(problem("kind=503").contains("unknown kind \"503\""));
        assert!(problem("kind=500;share=5%").contains("share=\"5%\""));
        assert!(problem("kind=500;share=1.5").contains("share=1.5 is not a fraction"));
        assert!(problem("kind=500;verbs=lst").contains("unknown verb \"lst\""));
        assert!(problem("kind=409;verbs=get").contains("does not apply to verb get"));
        assert!(problem("kind=cut-watch;verbs=list").contains("does not apply to verb list"));
        assert!(problem("kind=slow;delay=fast").contains("delay"));
        assert!(problem("kind=500;colour=red").contains("unknown key \"colour\""));
        assert!(problem("kind=500;resources=Secrets").contains("plural[.group][/subresource]"));
        assert!(problem("kind=500;oops").contains("not key=value"));
    }

    #[test]
    fn a_kind_without_verbs_applies_to_its_own() {
        let conflict = FaultRule::new(FaultKind::Conflict);
        assert!(conflict.selects(Verb::Patch, "", "secrets", None, ""));
        assert!(!conflict.selects(Verb::Get, "", "secrets", None, ""));
        let core = FaultRule::new(FaultKind::Timeout)
            .resources(["secrets.core"])
            .unwrap();
        assert!(core.selects(Verb::Get, "", "secrets", None, ""));
        assert!(!core.selects(Verb::Get, "example.com", "secrets", None, ""));
    }
}
