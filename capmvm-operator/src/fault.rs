//! Test-only fault-injection switches:
//!
//! - `CAPMVM_FAULT_CRASH_AT=<point>` makes the process exit at once when it reaches that point, to
//!   prove that a crash there loses nothing and duplicates nothing;
//! - `CAPMVM_FAULT_CLOCK_SKEW_SECS=<seconds>` shifts the wall clock the machine controller decides
//!   with by that many seconds (negative: behind), as a replica whose clock is off, to prove that
//!   exactly-once creation does not depend on the replicas' clocks.
//!
//! Points:
//! - `after-create`: a microVM was created on its host, before its providerID is written;
//! - `after-host-recorded`: the chosen host (and the finalizer) were written to the object's
//!   annotations, before the create.

// The switch is read once at start; an operator without the variable never crashes on purpose.
// docs/decisions.md (section 5) and the README's test section describe how the e2e suite uses it.

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tracing::error;

/// Environment variable naming the crash point.
pub const FAULT_ENV: &str = "CAPMVM_FAULT_CRASH_AT";

/// Exit code of a deliberate crash, so tests can tell it from a real failure.
pub const FAULT_EXIT_CODE: i32 = 86;

/// Where the process may be told to crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Point {
    /// After a successful CreateMicroVM, before the providerID write.
    AfterCreate,
    /// After the metadata write that records the host, before CreateMicroVM.
    AfterHostRecorded,
}

impl Point {
    fn name(self) -> &'static str {
        match self {
            Self::AfterCreate => "after-create",
            Self::AfterHostRecorded => "after-host-recorded",
        }
    }
}

/// Environment variable giving the clock skew, in seconds.
pub const CLOCK_SKEW_ENV: &str = "CAPMVM_FAULT_CLOCK_SKEW_SECS";

/// The configured crash point and clock skew, if any.
#[derive(Clone, Copy, Debug, Default)]
pub struct Fault {
    crash: Option<Point>,
    clock_skew: SignedDuration,
}

impl Fault {
    /// Reads [`FAULT_ENV`] and [`CLOCK_SKEW_ENV`]; an unknown value is reported and ignored.
    pub fn from_env() -> Self {
        let crash = match std::env::var(FAULT_ENV).ok().as_deref() {
            None | Some("") => None,
            Some("after-create") => Some(Point::AfterCreate),
            Some("after-host-recorded") => Some(Point::AfterHostRecorded),
            Some(other) => {
                error!(
                    value = other,
                    "{FAULT_ENV} names no crash point; ignoring it"
                );
                None
            }
        };
        let clock_skew = match std::env::var(CLOCK_SKEW_ENV).ok().as_deref() {
            None | Some("") => SignedDuration::ZERO,
            Some(secs) => match secs.trim().parse::<i64>() {
                Ok(secs) => SignedDuration::from_secs(secs),
                Err(_) => {
                    error!(
                        value = secs,
                        "{CLOCK_SKEW_ENV} is not a number of seconds; ignoring it"
                    );
                    SignedDuration::ZERO
                }
            },
        };
        Self { crash, clock_skew }
    }

    /// The wall clock machine decisions are made with: now, shifted by the configured skew.
    pub fn now(self) -> Timestamp {
        let now = Timestamp::now();
        now.checked_add(self.clock_skew).unwrap_or(now)
    }

    /// Exits the process if `point` is the configured crash point.
    pub fn reached(self, point: Point) {
        if self.crash == Some(point) {
            error!(point = point.name(), "fault injection: crashing on purpose");
            std::process::exit(FAULT_EXIT_CODE);
        }
    }
}
