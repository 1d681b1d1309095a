//! A test that lacks the upstream binaries is skipped where the developer sees it, and fails under
//! CI; `CI=0` and `CI=false` mean "not CI". Each case runs `needs_a_binary_that_is_not_there` (below)
//! in a child process of this test binary, as `cargo test` runs it: output captured, no
//! `--nocapture`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

use capmvm_upstream::Binaries;

/// What the probe writes with `eprintln!`, which libtest captures.
const CAPTURED: &str = "said with eprintln, held by the harness";

/// The probe: run by the test below in a child process with CAPMVM_UPSTREAM_BIN at an empty
/// directory (ignored in a plain run, where it would look for the real binaries).
#[test]
#[ignore = "a probe: run by a_missing_binary_is_a_visible_skip_locally_and_a_failure_under_ci"]
fn needs_a_binary_that_is_not_there() {
    eprintln!("{CAPTURED}");
    let first = Binaries::for_test("probe one", &["etcd"]);
    let second = Binaries::for_test("probe two", &["kube-apiserver"]);
    assert!(first.is_none() && second.is_none());
    assert_eq!(capmvm_upstream::skip::skipped(), 2);
}

fn run_probe(ci: Option<&str>, bin: &std::path::Path) -> Output {
    let mut child = Command::new(std::env::current_exe().unwrap());
    child
        .args(["needs_a_binary_that_is_not_there", "--exact", "--ignored"])
        .env("CAPMVM_UPSTREAM_BIN", bin)
        .env_remove("RUST_TEST_NOCAPTURE");
    match ci {
        Some(v) => child.env("CI", v),
        None => child.env_remove("CI"),
    };
    child.output().unwrap()
}

#[test]
fn a_missing_binary_is_a_visible_skip_locally_and_a_failure_under_ci() {
    let empty = std::env::temp_dir().join(format!("capmvm-no-upstream-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();

    for not_ci in [None, Some(""), Some("0"), Some("false"), Some("FALSE")] {
        let out = run_probe(not_ci, &empty);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "CI={not_ci:?}:\n{stdout}\n{stderr}");
        // Both skips are on the terminal, numbered, with the directory and the fix; what the test
        // said with eprintln! is not (the harness held it: a passing test's capture is dropped).
        for (n, (test, binary)) in [("probe one", "etcd"), ("probe two", "kube-apiserver")]
            .iter()
            .enumerate()
        {
            let line = stderr
                .lines()
                .find(|l| l.starts_with(&format!("SKIPPED {test}:")))
                .unwrap_or_else(|| panic!("CI={not_ci:?}: no skip of {test} in\n{stderr}"));
            assert!(
                line.contains(binary) && line.contains(&empty.display().to_string()),
                "{line}"
            );
            assert!(line.contains("hack/upstream.sh build"), "{line}");
            assert!(
                line.contains(&format!("[skip {} of this test binary", n + 1)),
                "{line}"
            );
        }
        assert!(
            !stderr.contains(CAPTURED) && !stdout.contains(CAPTURED),
            "{stderr}"
        );
    }

    for ci in ["true", "1", "TRUE"] {
        let out = run_probe(Some(ci), &empty);
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "CI={ci} passed without its binaries:\n{text}"
        );
        assert!(
            text.contains(&format!("CI={ci}")) && text.contains(&empty.display().to_string()),
            "{text}"
        );
        assert!(!text.contains("SKIPPED"), "{text}");
    }
    let _ = std::fs::remove_dir(&empty);
}

/// `.ci/run` reads `CI` by the same rule as the tests (`CI=0` and `CI=false` are "not CI" in both):
/// its `under_ci` shell function, run with each value, agrees with `skip::means_ci`.
#[test]
fn ci_run_reads_ci_as_the_tests_do() {
    let script =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../.ci/run")).unwrap();
    let start = script
        .find("under_ci() {")
        .expect(".ci/run defines under_ci");
    let end = start + script[start..].find("\n}\n").expect("under_ci ends") + 3;
    let function = &script[start..end];
    for value in [
        None,
        Some(""),
        Some("0"),
        Some("false"),
        Some("FALSE"),
        Some(" False "),
        Some("true"),
        Some("1"),
        Some("yes"),
    ] {
        let mut shell = Command::new("bash");
        shell.args(["-c", &format!("{function}\nunder_ci")]);
        match value {
            Some(v) => shell.env("CI", v),
            None => shell.env_remove("CI"),
        };
        let says_ci = shell.status().unwrap().success();
        assert_eq!(
            says_ci,
            capmvm_upstream::skip::means_ci(value),
            ".ci/run and the tests disagree on CI={value:?}"
        );
    }
}
