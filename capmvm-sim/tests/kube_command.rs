#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `capmvm-sim kube` serves the emulator of `capmvm-kube-emulator` (whose own suites test it in depth):
//! it prints where it serves, writes a kubeconfig pointing there, answers HTTP, and stops on SIGTERM.

use std::io::{BufRead as _, Read as _, Write as _};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The child process, killed if the test fails before it ends.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_kube_command_serves_the_emulator_and_stops_on_sigterm() {
    let dir = std::env::temp_dir().join(format!("capmvm-sim-kube-cmd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    let mut child = ChildGuard(
        Command::new(env!("CARGO_BIN_EXE_capmvm-sim"))
            .args(["kube", "--port", "0", "--kubeconfig"])
            .arg(&kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("capmvm-sim kube starts"),
    );
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut url = None;
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("capmvm-sim kube reports where it serves");
        if let Some(u) = line.strip_prefix("Kubernetes API emulator at ") {
            url = Some(u.to_string());
        }
        if line.starts_with("kubeconfig written to") {
            break;
        }
    }
    let url = url.expect("the URL is printed before the kubeconfig line");
    let written = std::fs::read_to_string(&kubeconfig).unwrap();
    assert!(written.contains(&format!("server: {url}")), "{written}");

    let addr = url.strip_prefix("http://").unwrap();
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        conn,
        "GET /version HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.contains("\"gitVersion\""),
        "{answer}"
    );

    let term = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "capmvm-sim kube exits on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
    let _ = std::fs::remove_dir_all(&dir);
}
