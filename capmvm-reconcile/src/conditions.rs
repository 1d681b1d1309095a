//! Setting metav1.Conditions deterministically.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// Condition status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// True.
    True,
    /// False.
    False,
    /// Unknown.
    Unknown,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Self::True => capmvm_api::conditions::status::TRUE,
            Self::False => capmvm_api::conditions::status::FALSE,
            Self::Unknown => capmvm_api::conditions::status::UNKNOWN,
        }
    }
}

/// Sets condition `type_` in `conditions`, keeping `lastTransitionTime` unless the status changes, so
/// setting the same condition twice gives the same list. Timestamps have whole seconds, as stored.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: Status,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
    now: Timestamp,
) {
    let status = status.as_str();
    let existing = conditions.iter().position(|c| c.type_ == type_);
    let last_transition_time = match existing.map(|i| &conditions[i]) {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => Time(truncate_to_seconds(now)),
    };
    let condition = Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time,
    };
    match existing {
        Some(i) => conditions[i] = condition,
        None => {
            conditions.push(condition);
            // A stable order keeps the written list (and thus the diff) independent of history.
            conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
        }
    }
}

/// The condition of type `type_`, if set.
pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether condition `type_` is set to True.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    get(conditions, type_).is_some_and(|c| c.status == capmvm_api::conditions::status::TRUE)
}

/// The reason of condition `type_`, if set.
pub fn reason<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a str> {
    get(conditions, type_).map(|c| c.reason.as_str())
}

/// An object's conditions as an engine decides them: every condition it sets carries the object's
/// generation and the decision's time.
#[derive(Clone, Debug)]
pub(crate) struct Conditions {
    /// The conditions, as stored before the decision and as set since.
    pub(crate) list: Vec<Condition>,
    generation: Option<i64>,
    now: Timestamp,
}

impl Conditions {
    /// The conditions `list`, set at `generation` and `now` from here on.
    pub(crate) fn new(list: Vec<Condition>, generation: Option<i64>, now: Timestamp) -> Self {
        Self {
            list,
            generation,
            now,
        }
    }

    /// Sets condition `type_` (see [`set`]).
    pub(crate) fn set(
        &mut self,
        type_: &str,
        status: Status,
        reason: &str,
        message: impl Into<String>,
    ) {
        set(
            &mut self.list,
            type_,
            status,
            reason,
            message,
            self.generation,
            self.now,
        );
    }
}

impl crate::preamble::Report for Conditions {
    fn condition(&mut self, type_: &str, status: Status, reason: &str, message: String) {
        self.set(type_, status, reason, message);
    }

    fn is_ready(&self) -> bool {
        is_true(&self.list, capmvm_api::conditions::types::READY)
    }

    fn hold_status(&mut self) {
        // Only the machine has a settle grace (`preamble::settle_left`): its
        // engine holds its own status; a pool's and a cluster's waits are always written.
    }
}

fn truncate_to_seconds(t: Timestamp) -> Timestamp {
    Timestamp::from_second(t.as_second()).unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_moves_only_with_status() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(2_000).unwrap();
        let mut c = Vec::new();
        set(&mut c, "Ready", Status::False, "A", "a", Some(1), t0);
        set(&mut c, "Ready", Status::False, "B", "b", Some(2), t1);
        assert_eq!(
            c[0].last_transition_time.0, t0,
            "reason change keeps the time"
        );
        assert_eq!(c[0].reason, "B");
        assert_eq!(c[0].observed_generation, Some(2));
        set(&mut c, "Ready", Status::True, "Ready", "", Some(2), t1);
        assert_eq!(
            c[0].last_transition_time.0, t1,
            "status change moves the time"
        );
    }

    #[test]
    fn conditions_stay_sorted_by_type() {
        let t = Timestamp::from_second(1).unwrap();
        let mut c = Vec::new();
        set(&mut c, "Ready", Status::True, "R", "", None, t);
        set(&mut c, "Paused", Status::False, "P", "", None, t);
        let types: Vec<_> = c.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["Paused", "Ready"]);
    }
}
