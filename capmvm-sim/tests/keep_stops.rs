//! `capmvm-sim demo --keep` leaves nothing behind when it stops: SIGTERM (a supervisor, `timeout`)
//! stops what it started, and SIGKILL, where no handler runs, takes its processes with it (they
//! carry a parent-death signal). Checked by pid, from /proc, for the embedded stack (operator) and
//! the real one (etcd, both kube-apiservers, CAPI's managers, kube-controller-manager, the operator).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A process as /proc shows it: its pid, its start time (so a reused pid is not mistaken for it)
/// and its command name.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Proc {
    pid: u32,
    start: u64,
    comm: String,
}

/// `(ppid, state, start time, comm)` of `pid` from /proc/PID/stat; `None` once it is gone.
fn stat(pid: u32) -> Option<(u32, char, u64, String)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid ...`: comm may hold spaces and parentheses, so split at the last ')'.
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text[open + 1..close].to_string();
    let fields: Vec<&str> = text[close + 1..].split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let ppid = fields.get(1)?.parse().ok()?;
    // Field 22 of stat, the 20th after the comm.
    let start = fields.get(19)?.parse().ok()?;
    Some((ppid, state, start, comm))
}

/// Every live descendant of `root`.
fn descendants(root: u32) -> Vec<Proc> {
    let all: Vec<(u32, u32, char, u64, String)> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            stat(pid).map(|(ppid, state, start, comm)| (pid, ppid, state, start, comm))
        })
        .collect();
    let mut found = Vec::new();
    let mut parents = vec![root];
    while let Some(parent) = parents.pop() {
        for (pid, ppid, state, start, comm) in &all {
            if *ppid == parent && !matches!(state, 'Z' | 'X') {
                found.push(Proc {
                    pid: *pid,
                    start: *start,
                    comm: comm.clone(),
                });
                parents.push(*pid);
            }
        }
    }
    found
}

/// Whether `p` still runs: the same pid with the same start time, not a zombie.
fn alive(p: &Proc) -> bool {
    stat(p.pid).is_some_and(|(_, state, start, _)| start == p.start && !matches!(state, 'Z' | 'X'))
}

/// The demo, killed when the test ends whatever happens.
struct Demo {
    child: Child,
    lines: mpsc::Receiver<String>,
    stdout: Vec<String>,
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Demo {
    fn start(extra: &[&str]) -> Demo {
        let mut child = Command::new(env!("CARGO_BIN_EXE_capmvm-sim"))
            .args([
                "demo",
                "--keep",
                "--provision-ms",
                "300",
                "--timeout-secs",
                "240",
            ])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the demo starts");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Demo {
            child,
            lines,
            stdout: Vec::new(),
        }
    }

    /// Reads its output until `marker`, failing after `timeout` or if it exits first.
    fn wait_for(&mut self, marker: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.stdout.iter().any(|l| l.contains(marker)) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.stdout.push(line),
                Err(_) => panic!(
                    "no {marker:?} from the demo within {timeout:?} (exit: {:?}):\n{}",
                    self.child.try_wait(),
                    self.stdout.join("\n")
                ),
            }
        }
    }

    /// The operator's pid, as the demo prints it.
    fn operator_pid(&self) -> u32 {
        self.stdout
            .iter()
            .find_map(|l| {
                l.trim()
                    .strip_prefix("operator     pid ")?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("no operator pid in:\n{}", self.stdout.join("\n")))
    }

    fn signal(&self, name: &str) {
        capmvm_upstream::process::signal(self.child.id(), name);
    }

    /// Waits for it to exit; its status.
    fn exited(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the demo still runs {timeout:?} after its signal"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Runs `demo --keep` with `extra`, waits until it keeps running, checks that it started at least
/// `expected` (command names), sends `signal`, and asserts that none of its processes outlives it.
fn nothing_outlives(extra: &[&str], signal: &str, expected: &[&str]) {
    let mut demo = Demo::start(extra);
    demo.wait_for("Ctrl-C stops it all.", Duration::from_secs(300));
    let operator = demo.operator_pid();
    let started = descendants(demo.child.id());
    assert!(
        started.iter().any(|p| p.pid == operator),
        "the operator (pid {operator}) is among the demo's processes: {started:?}"
    );
    for name in expected {
        assert!(
            started
                .iter()
                .any(|p| p.comm.starts_with(&name[..name.len().min(15)])),
            "{name} is among the demo's processes: {started:?}"
        );
    }
    demo.signal(signal);
    let status = demo.exited(Duration::from_secs(90));
    if signal == "TERM" {
        // Its handler stopped everything and it ended as it does after a run, not by the signal.
        assert!(status.success(), "{status:?}:\n{}", demo.stdout.join("\n"));
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let left: Vec<&Proc> = started.iter().filter(|p| alive(p)).collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after SIG{signal} of the demo these of its processes still run: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // `--keep` keeps its directory (the kubeconfig it printed lies in it): removed here.
    let kept = demo.stdout.iter().find_map(|l| {
        let path = std::path::Path::new(l.trim().strip_prefix("kubeconfig")?.trim());
        let tmp = std::env::temp_dir();
        path.ancestors()
            .find(|a| a.parent() == Some(tmp.as_path()))
            .filter(|d| {
                d.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("capmvm-"))
            })
            .map(std::path::Path::to_path_buf)
    });
    if let Some(dir) = kept {
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn sigterm_stops_the_embedded_demo_and_its_operator() {
    nothing_outlives(&[], "TERM", &[]);
}

#[test]
fn sigkill_of_the_embedded_demo_takes_its_operator_along() {
    nothing_outlives(&[], "KILL", &[]);
}

/// The real stack: every upstream process dies with a demo killed by SIGKILL (its SIGTERM path is
/// the same shutdown the embedded test checks). Needs the upstream binaries (skipped locally
/// without them, a failure under CI).
#[test]
fn sigkill_of_the_real_stack_demo_takes_every_upstream_process_along() {
    if capmvm_upstream::Binaries::for_test(
        "sigkill_of_the_real_stack_demo_takes_every_upstream_process_along",
        capmvm_sim::real::BINARIES,
    )
    .is_none()
    {
        return;
    }
    nothing_outlives(
        &["--control-plane", "real"],
        "KILL",
        &[
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "capi-manager",
        ],
    );
}
