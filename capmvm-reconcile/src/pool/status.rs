//! A pool's status: counts, the contract's `ready`, capacity for scale from zero, and conditions that
//! say whether it scales, rolls or repairs, and what it waits for.

use capmvm_api::conditions::{reasons, types};
use capmvm_api::pool::INSTANCE_KIND;
use capmvm_api::{Initialization, MicrovmMachinePoolStatus};

use super::observe::{InstanceHealth, ObservedPool};
use crate::conditions::{Conditions, Status};
use crate::template::{ARCH_LABEL, offer};

/// What one decision did and why it waits, for the conditions.
#[derive(Clone, Debug, Default)]
pub(super) struct Progress {
    pub(super) repaired: Vec<String>,
    pub(super) scaled_down: Vec<String>,
    pub(super) rolled: Vec<String>,
    pub(super) waiting_for_machines: Vec<String>,
    pub(super) outdated: usize,
    pub(super) to_create: usize,
    pub(super) roll_blocked: bool,
    pub(super) surge_blocked: bool,
    pub(super) max_surge: i32,
    pub(super) max_unavailable: i32,
}

/// Where a decision ended, for the status: stopped by the preamble, a gate or the delete path (their
/// conditions are set), or decided with the progress the conditions describe.
#[derive(Clone, Debug)]
pub(super) enum Verdict {
    /// Paused, waiting on a gate, an invalid spec, or deleting.
    Stopped,
    /// Scaled, rolled and repaired towards `desired` instances of template `current`.
    Decided {
        desired: i32,
        current: String,
        progress: Progress,
    },
}

/// The pool's status after a decision: capacity from its template, counts from the observation, the
/// conditions the preamble and gates set, and those of the decision's progress. The one call of a
/// decision into this module.
pub(super) fn report(
    obs: &ObservedPool,
    conditions: Conditions,
    verdict: &Verdict,
) -> MicrovmMachinePoolStatus {
    let pool = &obs.pool;
    let mut status = pool.status.clone().unwrap_or_default();
    let offered = offer(
        &pool.spec.template,
        pool.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(ARCH_LABEL))
            .map(String::as_str),
    );
    status.capacity = offered.capacity;
    status.node_info = offered.node_info;
    status.infrastructure_machine_kind = Some(INSTANCE_KIND.to_string());
    let mut report = Report { status, conditions };
    report.counts(obs, verdict);
    report.status.conditions = report.conditions.list;
    report.status
}

struct Report {
    status: MicrovmMachinePoolStatus,
    conditions: Conditions,
}

impl Report {
    fn set(&mut self, type_: &str, status: Status, reason: &str, message: impl Into<String>) {
        self.conditions.set(type_, status, reason, message);
    }

    /// Counts from the observation, conditions from the decision's progress (none when stopped).
    fn counts(&mut self, obs: &ObservedPool, verdict: &Verdict) {
        let live: Vec<_> = obs.instances.iter().filter(|i| !i.leaving()).collect();
        let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
        self.status.replicas = count(obs.instances.len());
        self.status.ready_replicas = count(
            live.iter()
                .filter(|i| i.health == InstanceHealth::Ready)
                .count(),
        );
        let Verdict::Decided {
            desired,
            current,
            progress,
        } = verdict
        else {
            return;
        };
        let desired = *desired;
        self.status.up_to_date_replicas = count(
            live.iter()
                .filter(|i| i.template_hash.as_deref() == Some(current.as_str()))
                .count(),
        );
        let ready = self.status.ready_replicas;
        // Once provisioned, always: core stops syncing providerIDs while `ready` is false (CAPZ #4982).
        if ready >= desired && !self.status.ready {
            self.status.ready = true;
            self.status.initialization = Some(Initialization {
                provisioned: Some(true),
            });
        }
        if ready >= desired {
            self.set(types::READY, Status::True, reasons::READY, "");
        } else {
            self.set(
                types::READY,
                Status::False,
                reasons::INSTANCES_NOT_READY,
                format!("{ready} of {desired} instances ready"),
            );
        }
        self.conditions(desired, progress);
    }

    fn conditions(&mut self, desired: i32, p: &Progress) {
        let machines_wait = if p.waiting_for_machines.is_empty() {
            String::new()
        } else {
            format!(
                "; waiting for Cluster API to create the Machine of {} before it can go",
                p.waiting_for_machines.join(", ")
            )
        };
        if p.to_create > 0 || p.surge_blocked {
            let surge = if p.surge_blocked {
                format!(
                    "; waiting for deleted instances to go (maxSurge {})",
                    p.max_surge
                )
            } else {
                String::new()
            };
            self.set(
                types::SCALING_UP,
                Status::True,
                reasons::SCALING_UP,
                format!(
                    "scaling up to {desired}: creating {} instance(s){surge}",
                    p.to_create
                ),
            );
        } else {
            self.set(
                types::SCALING_UP,
                Status::False,
                reasons::NOT_SCALING_UP,
                "",
            );
        }
        if p.scaled_down.is_empty() {
            self.set(
                types::SCALING_DOWN,
                Status::False,
                reasons::NOT_SCALING_DOWN,
                "",
            );
        } else {
            self.set(
                types::SCALING_DOWN,
                Status::True,
                reasons::SCALING_DOWN,
                format!(
                    "scaling down to {desired}: deleting the Machine(s) of {}{machines_wait}",
                    p.scaled_down.join(", ")
                ),
            );
        }
        if p.outdated == 0 {
            self.set(
                types::ROLLING_OUT,
                Status::False,
                reasons::NOT_ROLLING_OUT,
                "every instance is made from the current template",
            );
        } else {
            let blocked = if p.roll_blocked {
                format!(
                    "; waiting for replacements to be ready before removing more (maxUnavailable {})",
                    p.max_unavailable
                )
            } else {
                String::new()
            };
            self.set(
                types::ROLLING_OUT,
                Status::True,
                reasons::ROLLING_OUT,
                format!(
                    "{} instance(s) made from an older template; {} up to date of {desired}{blocked}{machines_wait}",
                    p.outdated, self.status.up_to_date_replicas
                ),
            );
        }
        if p.repaired.is_empty() {
            self.set(
                types::REMEDIATING,
                Status::False,
                reasons::NOT_REMEDIATING,
                "",
            );
        } else {
            self.set(
                types::REMEDIATING,
                Status::True,
                reasons::REMEDIATING,
                format!("replacing {}", p.repaired.join(", ")),
            );
        }
    }
}
