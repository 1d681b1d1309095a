//! Request counters by verb and resource, for benchmarks (API calls per machine).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex};

/// The verbs requests are counted under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verb {
    /// GET of one object (and discovery / OpenAPI documents).
    Get,
    /// GET of a collection.
    List,
    /// GET of a collection with `watch=true`.
    Watch,
    /// POST.
    Create,
    /// PUT.
    Update,
    /// PATCH.
    Patch,
    /// DELETE of one object.
    Delete,
    /// DELETE of a collection.
    DeleteCollection,
}

impl Verb {
    /// The verb as Kubernetes spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "get",
            Self::List => "list",
            Self::Watch => "watch",
            Self::Create => "create",
            Self::Update => "update",
            Self::Patch => "patch",
            Self::Delete => "delete",
            Self::DeleteCollection => "deletecollection",
        }
    }
}

impl std::str::FromStr for Verb {
    type Err = String;

    /// The verb as Kubernetes spells it (`get`, `list`, ..., `deletecollection`).
    fn from_str(s: &str) -> Result<Self, String> {
        [
            Self::Get,
            Self::List,
            Self::Watch,
            Self::Create,
            Self::Update,
            Self::Patch,
            Self::Delete,
            Self::DeleteCollection,
        ]
        .into_iter()
        .find(|v| v.as_str().eq_ignore_ascii_case(s.trim()))
        .ok_or_else(|| format!("unknown verb {s:?}"))
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad`, so tables can align the column (`{verb:<16}`).
        f.pad(self.as_str())
    }
}

/// Counts of one client, by verb and resource.
type PerAgent = HashMap<(Verb, Arc<str>), u64>;

/// How many clients (User-Agent products) are counted apart. The User-Agent is whatever a client
/// sends, so without a bound any client could grow the counters without limit.
pub(crate) const MAX_AGENTS: usize = 64;

/// The client the requests of agents beyond [`MAX_AGENTS`] are counted under.
pub const OTHER_AGENTS: &str = "other";

/// Live counters, per client (the product part of its User-Agent); cheap to bump from request handlers.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    inner: Mutex<HashMap<Arc<str>, PerAgent>>,
}

impl Counters {
    pub(crate) fn bump(&self, verb: Verb, resource: &Arc<str>, agent: &str) {
        let mut map = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // The first MAX_AGENTS clients are counted apart, the rest together under OTHER_AGENTS (so at
        // most MAX_AGENTS + 1 entries).
        let agent = if map.contains_key(agent) || map.len() < MAX_AGENTS {
            agent
        } else {
            OTHER_AGENTS
        };
        let per_agent = match map.get_mut(agent) {
            Some(m) => m,
            None => map.entry(Arc::from(agent)).or_default(),
        };
        match per_agent.get_mut(&(verb, resource.clone())) {
            Some(n) => *n += 1,
            None => {
                per_agent.insert((verb, resource.clone()), 1);
            }
        }
    }

    /// Every client's requests together.
    pub(crate) fn snapshot(&self) -> CounterSnapshot {
        self.snapshot_where(|_| true)
    }

    /// The requests of clients whose User-Agent product (the part before `/`) is `agent`'s
    /// ([`OTHER_AGENTS`] for the clients beyond the first [`MAX_AGENTS`]).
    pub(crate) fn snapshot_of_agent(&self, agent: &str) -> CounterSnapshot {
        let product = user_agent_product(agent);
        self.snapshot_where(|a| a == product)
    }

    fn snapshot_where(&self, keep: impl Fn(&str) -> bool) -> CounterSnapshot {
        let map = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut counts = BTreeMap::new();
        for per_agent in map.iter().filter(|(a, _)| keep(a)).map(|(_, m)| m) {
            for ((v, r), n) in per_agent {
                *counts.entry((*v, r.to_string())).or_insert(0) += *n;
            }
        }
        CounterSnapshot { counts }
    }

    pub(crate) fn reset(&self) {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
    }
}

/// The product part of a User-Agent (`my-operator/0.1.0` → `my-operator`).
pub(crate) fn user_agent_product(agent: &str) -> &str {
    agent.split(['/', ' ']).next().unwrap_or(agent)
}

/// Request counts at one moment, keyed by verb and resource (`group/resource[/subresource]`, the core
/// group spelled `core`, e.g. `core/secrets`, `infrastructure.cluster.x-k8s.io/microvmmachines/status`;
/// discovery and OpenAPI documents count as `get` of `discovery` and `openapi`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CounterSnapshot {
    counts: BTreeMap<(Verb, String), u64>,
}

impl CounterSnapshot {
    /// Requests of one verb on one resource.
    pub fn get(&self, verb: Verb, resource: &str) -> u64 {
        self.counts
            .get(&(verb, resource.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// Requests of one verb on any resource.
    pub fn verb_total(&self, verb: Verb) -> u64 {
        self.counts
            .iter()
            .filter(|((v, _), _)| *v == verb)
            .map(|(_, n)| n)
            .sum()
    }

    /// Requests on one resource (any verb).
    pub fn resource_total(&self, resource: &str) -> u64 {
        self.counts
            .iter()
            .filter(|((_, r), _)| r == resource)
            .map(|(_, n)| n)
            .sum()
    }

    /// All requests counted.
    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }

    /// Every (verb, resource, count), ordered by verb then resource.
    pub fn iter(&self) -> impl Iterator<Item = (Verb, &str, u64)> {
        self.counts.iter().map(|((v, r), n)| (*v, r.as_str(), *n))
    }

    /// The difference from an earlier snapshot (for counting the requests of one phase).
    pub fn since(&self, earlier: &CounterSnapshot) -> CounterSnapshot {
        let counts = self
            .counts
            .iter()
            .map(|(k, n)| {
                (
                    k.clone(),
                    n.saturating_sub(earlier.counts.get(k).copied().unwrap_or(0)),
                )
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        CounterSnapshot { counts }
    }
}

impl fmt::Display for CounterSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for ((v, r), n) in &self.counts {
            writeln!(f, "{v:<16} {r:<60} {n}")?;
        }
        Ok(())
    }
}
