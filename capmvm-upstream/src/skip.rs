//! A test that lacks an input it needs (an upstream binary, CAPI's CRDs): skipped where a developer
//! sees it, a failure under CI.
//!
//! libtest captures what the print macros write (`print!`, `eprintln!`: std's output-capture hook)
//! and shows it only for a failing test, so a skip said with `eprintln!` reads as a pass. A line
//! written to the process's stderr handle bypasses that hook: it reaches the terminal whatever
//! `--nocapture` says (tests/skip.rs proves both halves). libtest's own summary can only count a
//! test as ignored when `#[ignore]` was decided at compile time, so a skip decided at run time is
//! counted by us: when the test binary exits, right under libtest's `test result:` line, one line
//! says how many of the tests it counted as passed were skipped, and which.

use std::io::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Skips reported by this process (one test binary).
static SKIPPED: AtomicUsize = AtomicUsize::new(0);
/// Their tests' names, for the summary at exit.
static SKIPPED_TESTS: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// The summary is registered with the first skip.
static SUMMARY: std::sync::Once = std::sync::Once::new();

/// Whether `CI` (its value, `None` when unset) says this run is CI's: anything but unset, empty,
/// `0` or `false` (any case, spaces trimmed). CI services set `CI=true`; `CI=0` or `CI=false` is how
/// a developer says "not CI". Every reader of `CI` in the repository (the tests' helpers, `.ci/run`)
/// uses this rule.
pub fn means_ci(value: Option<&str>) -> bool {
    value.is_some_and(|v| {
        let v = v.trim();
        !(v.is_empty() || v == "0" || v.eq_ignore_ascii_case("false"))
    })
}

/// Whether this run is CI's ([`means_ci`] of the environment's `CI`).
pub fn under_ci() -> bool {
    means_ci(std::env::var("CI").ok().as_deref())
}

/// Reports `test` skipped because `why` (which names the fix). Under CI ([`under_ci`]) a check that
/// lacks its input must not pass: this panics. Otherwise one line goes to stderr past the harness's
/// capture, numbered with this test binary's running count of skips (the last one is its total).
#[allow(clippy::panic)]
pub fn skip(test: &str, why: &str) {
    if under_ci() {
        let ci = std::env::var("CI").unwrap_or_default();
        panic!("{test}: {why}; CI={ci}: a check that lacks its input cannot be skipped under CI");
    }
    let n = SKIPPED.fetch_add(1, Ordering::Relaxed) + 1;
    if let Ok(mut names) = SKIPPED_TESTS.lock() {
        names.push(test.to_string());
    }
    SUMMARY.call_once(summary_at_exit);
    say(&format!(
        "SKIPPED {test}: {why} [skip {n} of this test binary; counted as passed by cargo test; CI=true fails it]\n"
    ));
}

/// Writes `line` to stderr in one write: the handle is unbuffered, and `writeln!` would write each
/// piece of the format on its own, between libtest's lines.
fn say(line: &str) {
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// Registers [`print_summary`] to run when the process exits: after libtest printed its summary
/// (a passing run returns from main, a failing one calls `exit`; both run the C library's exit
/// handlers).
#[allow(unsafe_code)]
fn summary_at_exit() {
    // SAFETY: atexit only records the function pointer; `print_summary` takes no arguments,
    // touches only statics that outlive it and cannot unwind (it panics nowhere).
    let registered = unsafe { libc::atexit(print_summary) };
    if registered != 0 {
        say("(the skip summary could not be registered)\n");
    }
}

/// The skip summary: how many of this binary's tests, counted as passed, were skipped.
extern "C" fn print_summary() {
    let names = SKIPPED_TESTS
        .lock()
        .map(|names| names.join(", "))
        .unwrap_or_default();
    say(&format!(
        "SKIPPED {} of the tests counted as passed above (their inputs are missing: \
         `hack/upstream.sh build`, CAPMVM_SHARED_DIR): {names}\n\n",
        SKIPPED.load(Ordering::Relaxed)
    ));
}

/// How many tests this process has reported skipped.
pub fn skipped() -> usize {
    SKIPPED.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::means_ci;

    #[test]
    fn ci_is_anything_but_unset_empty_zero_or_false() {
        for not_ci in [
            None,
            Some(""),
            Some(" "),
            Some("0"),
            Some("false"),
            Some("FALSE"),
            Some("False "),
        ] {
            assert!(!means_ci(not_ci), "{not_ci:?}");
        }
        for ci in [
            Some("true"),
            Some("1"),
            Some("yes"),
            Some("TRUE"),
            Some("github"),
        ] {
            assert!(means_ci(ci), "{ci:?}");
        }
    }
}
