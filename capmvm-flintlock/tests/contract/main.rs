//! The flintlock contract: what a client sees of flintlockd's API (create, get, list, the list
//! stream, delete, retries, basic auth, TLS), one test per rule. Every test runs twice, unchanged:
//! on the hollow host (`hollow::`) and on the real flintlockd v0.11.0 (`real::`, which needs the
//! binary of `hack/upstream.sh build` and Debian's containerd). The real server is the oracle:
//! where they disagreed, the hollow host was fixed (docs/hollow-host.md lists what).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../support/mod.rs"]
mod support;

mod auth;
mod creates;
mod deletes;
mod reads;
mod retries;
mod servers;

/// Every test of the suite, on both servers (the README's count).
#[test]
fn the_suite_runs_every_test_on_both_servers() {
    let all: Vec<&str> = [
        auth::ON_BOTH_SERVERS,
        creates::ON_BOTH_SERVERS,
        deletes::ON_BOTH_SERVERS,
        reads::ON_BOTH_SERVERS,
        retries::ON_BOTH_SERVERS,
    ]
    .concat();
    let mut unique = all.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), all.len(), "test names are unique");
    eprintln!("{} contract tests on both servers", all.len());
}
