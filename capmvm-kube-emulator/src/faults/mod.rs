//! Faults on demand, for resilience tests: the emulator fails a share of requests, chosen by verb,
//! resource and client, with what a real server under stress answers (500, 429 with `Retry-After`,
//! 409 Conflict, 504 Timeout, slow answers, watches cut mid-way or answered 410 on resume, and
//! writes carried out whose reply is then lost: a 504 or a cut connection after the commit).
//!
//! The choice is made by a seeded random source, so a failing run can be replayed with the same seed
//! (the same sequence of requests then gets the same faults). A write faulted otherwise is refused
//! before it reaches the store; only the committed kinds (`committed-timeout`, `committed-cut`)
//! store what a fault-free server would, and fail the reply.

mod counts;
mod rule;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

pub use counts::FaultCounts;
pub use rule::{FaultKind, FaultRule, FaultRuleError};

use super::counters::Verb;

/// The seed used until [`Faults::seed`] is called, so runs are reproducible by default.
pub const DEFAULT_FAULT_SEED: u64 = 0;

/// The fault rules of a running emulator, its random source and the counts of faults injected.
/// Cloning gives another handle on the same rules (for a test or a soak driving the emulator).
#[derive(Debug, Clone)]
pub struct Faults {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Whether any rule is set: requests skip the lock when none is.
    armed: AtomicBool,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    rules: Vec<ArmedRule>,
    rng: u64,
    counts: BTreeMap<(FaultKind, Verb, String), u64>,
}

#[derive(Debug)]
struct ArmedRule {
    rule: FaultRule,
    /// Requests this rule was chosen for (for `times`).
    chosen: u64,
}

/// One request, as far as the rules look at it.
pub(crate) struct FaultRequest<'a> {
    pub(crate) verb: Verb,
    pub(crate) group: &'a str,
    pub(crate) plural: &'a str,
    pub(crate) subresource: Option<&'a str>,
    /// The whole User-Agent header.
    pub(crate) user_agent: &'a str,
    /// The request counters' name of the resource, under which the fault is counted.
    pub(crate) counter: &'a str,
    /// A watch from a resourceVersion (not `""` or `"0"`): only these can be answered 410.
    pub(crate) resuming_watch: bool,
}

/// The fault chosen for a request.
#[derive(Debug)]
pub(crate) struct Injected {
    pub(crate) kind: FaultKind,
    pub(crate) retry_after_secs: u32,
    pub(crate) delay: Duration,
    pub(crate) cut_after: usize,
    /// Where a cut is counted once it happens (a watch may end before its cut).
    pub(crate) cut: Option<CutCounter>,
}

/// Counts a watch cut when the cut happens.
#[derive(Debug)]
pub(crate) struct CutCounter {
    faults: Faults,
    verb: Verb,
    resource: String,
}

impl CutCounter {
    pub(crate) fn record(&self) {
        self.faults
            .state()
            .count(FaultKind::CutWatch, self.verb, &self.resource);
    }
}

impl State {
    fn count(&mut self, kind: FaultKind, verb: Verb, resource: &str) {
        *self
            .counts
            .entry((kind, verb, resource.to_string()))
            .or_insert(0) += 1;
    }

    /// The next number of the seeded random source, in `[0, 1)` (splitmix64).
    fn next_fraction(&mut self) -> f64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // 53 random bits make an exact f64 fraction.
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            inner: Arc::new(Inner {
                armed: AtomicBool::new(false),
                state: Mutex::new(State {
                    rules: Vec::new(),
                    rng: DEFAULT_FAULT_SEED,
                    counts: BTreeMap::new(),
                }),
            }),
        }
    }
}

impl Faults {
    /// The state; every change is completed under the lock, so a poisoned lock is still consistent.
    fn state(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Replaces the rules (checked first: on an error the old rules stay). Rules are tried in order;
    /// the first one that selects a request and draws it decides the fault.
    pub fn set_rules(
        &self,
        rules: impl IntoIterator<Item = FaultRule>,
    ) -> Result<(), FaultRuleError> {
        let rules: Vec<FaultRule> = rules.into_iter().collect();
        for r in &rules {
            r.validate()?;
        }
        let mut state = self.state();
        state.rules = rules
            .into_iter()
            .map(|rule| ArmedRule { rule, chosen: 0 })
            .collect();
        self.inner
            .armed
            .store(!state.rules.is_empty(), Ordering::Release);
        Ok(())
    }

    /// Adds a rule after the others.
    pub fn add_rule(&self, rule: FaultRule) -> Result<(), FaultRuleError> {
        rule.validate()?;
        let mut state = self.state();
        state.rules.push(ArmedRule { rule, chosen: 0 });
        self.inner.armed.store(true, Ordering::Release);
        Ok(())
    }

    /// Removes every rule: requests are served normally again (the counts stay).
    pub fn clear(&self) {
        let mut state = self.state();
        state.rules.clear();
        self.inner.armed.store(false, Ordering::Release);
    }

    /// The rules in force.
    pub fn rules(&self) -> Vec<FaultRule> {
        self.state().rules.iter().map(|a| a.rule.clone()).collect()
    }

    /// Restarts the random source from `seed` (a run is replayed by giving it the same seed).
    pub fn seed(&self, seed: u64) {
        self.state().rng = seed;
    }

    /// The faults injected so far.
    pub fn counts(&self) -> FaultCounts {
        FaultCounts {
            counts: self.state().counts.clone(),
        }
    }

    /// Sets the counts back to zero.
    pub fn reset_counts(&self) {
        self.state().counts.clear();
    }

    /// Chooses the fault for a request, if any, and counts it (a cut is counted when it happens).
    pub(crate) fn decide(&self, req: &FaultRequest<'_>) -> Option<Injected> {
        if !self.inner.armed.load(Ordering::Acquire) {
            return None;
        }
        let mut state = self.state();
        for i in 0..state.rules.len() {
            let armed = &state.rules[i];
            let rule = &armed.rule;
            if !rule.selects(
                req.verb,
                req.group,
                req.plural,
                req.subresource,
                req.user_agent,
            ) || (rule.kind == FaultKind::Gone && !req.resuming_watch)
                || rule.times.is_some_and(|t| armed.chosen >= t)
            {
                continue;
            }
            let share = rule.share;
            let hit = share >= 1.0 || (share > 0.0 && state.next_fraction() < share);
            if !hit {
                continue;
            }
            let armed = &mut state.rules[i];
            armed.chosen += 1;
            let rule = armed.rule.clone();
            let cut = if rule.kind == FaultKind::CutWatch {
                Some(CutCounter {
                    faults: self.clone(),
                    verb: req.verb,
                    resource: req.counter.to_string(),
                })
            } else {
                state.count(rule.kind, req.verb, req.counter);
                None
            };
            tracing::debug!(kind = %rule.kind, verb = %req.verb, resource = req.counter, "injecting a fault");
            return Some(Injected {
                kind: rule.kind,
                retry_after_secs: rule.retry_after_secs,
                delay: rule.delay,
                cut_after: rule.cut_after,
                cut,
            });
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list_of_secrets() -> FaultRequest<'static> {
        FaultRequest {
            verb: Verb::List,
            group: "",
            plural: "secrets",
            subresource: None,
            user_agent: "capmvm-operator/0.1.0",
            counter: "core/secrets",
            resuming_watch: false,
        }
    }

    fn pattern(faults: &Faults, n: usize) -> Vec<bool> {
        (0..n)
            .map(|_| faults.decide(&list_of_secrets()).is_some())
            .collect()
    }

    #[test]
    fn the_same_seed_gives_the_same_faults() {
        let faults = Faults::default();
        faults
            .set_rules([FaultRule::new(FaultKind::InternalError).share(0.3)])
            .unwrap();
        faults.seed(42);
        let first = pattern(&faults, 200);
        faults.seed(42);
        assert_eq!(pattern(&faults, 200), first);
        let hits = first.iter().filter(|h| **h).count();
        assert!((40..=80).contains(&hits), "about 30% of 200: {hits}");
        faults.seed(7);
        assert_ne!(pattern(&faults, 200), first);
        faults.reset_counts();
        faults.seed(42);
        pattern(&faults, 200);
        assert_eq!(
            faults
                .counts()
                .get(FaultKind::InternalError, Verb::List, "core/secrets"),
            hits as u64
        );
    }

    #[test]
    fn times_limits_and_clear_stops_the_faults() {
        let faults = Faults::default();
        faults
            .set_rules([FaultRule::new(FaultKind::Timeout).times(2)])
            .unwrap();
        assert_eq!(pattern(&faults, 5), [true, true, false, false, false]);
        faults
            .set_rules([FaultRule::new(FaultKind::Timeout)])
            .unwrap();
        assert!(pattern(&faults, 3).iter().all(|h| *h));
        faults.clear();
        assert!(pattern(&faults, 3).iter().all(|h| !*h));
        assert_eq!(faults.counts().kind_total(FaultKind::Timeout), 5);
    }

    #[test]
    fn an_invalid_rule_leaves_the_old_ones() {
        let faults = Faults::default();
        faults
            .set_rules([FaultRule::new(FaultKind::Timeout)])
            .unwrap();
        let e = faults
            .set_rules([FaultRule::new(FaultKind::Conflict).verbs([Verb::List])])
            .unwrap_err();
        assert!(e.problem.contains("does not apply to verb list"), "{e}");
        assert_eq!(faults.rules().len(), 1);
        assert_eq!(faults.rules()[0].kind(), FaultKind::Timeout);
    }
}
