//! A test-only fault-injection switch: `CAPMVM_FAULT_CRASH_AT=<point>` makes the process exit at once
//! when it reaches that point, to prove that a crash there loses nothing and duplicates nothing.
//!
//! Points:
//! - `after-create`: a microVM was created on its host, before its providerID is written;
//! - `after-host-recorded`: the chosen host (and the finalizer) were written to the object's
//!   annotations, before the create.

// The switch is read once at start; an operator without the variable never crashes on purpose.
// docs/decisions.md (section 5) and the README's test section describe how the e2e suite uses it.

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

/// The configured crash point, if any.
#[derive(Clone, Copy, Debug, Default)]
pub struct Fault(Option<Point>);

impl Fault {
    /// Reads [`FAULT_ENV`]; an unknown value is reported and ignored.
    pub fn from_env() -> Self {
        match std::env::var(FAULT_ENV).ok().as_deref() {
            None | Some("") => Self(None),
            Some("after-create") => Self(Some(Point::AfterCreate)),
            Some("after-host-recorded") => Self(Some(Point::AfterHostRecorded)),
            Some(other) => {
                error!(
                    value = other,
                    "{FAULT_ENV} names no crash point; ignoring it"
                );
                Self(None)
            }
        }
    }

    /// Exits the process if `point` is the configured crash point.
    pub fn reached(self, point: Point) {
        if self.0 == Some(point) {
            error!(point = point.name(), "fault injection: crashing on purpose");
            std::process::exit(FAULT_EXIT_CODE);
        }
    }
}
