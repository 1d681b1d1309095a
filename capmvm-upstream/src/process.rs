//! Upstream processes: started with their output in a log file, killed when dropped, waited for
//! until a probe says they are ready.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::{Error, Result, io_error};

/// A running upstream process; dropping it kills it.
#[derive(Debug)]
pub struct Process {
    name: String,
    child: tokio::process::Child,
    log: PathBuf,
    /// What [`Process::respawn`] starts again.
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl Process {
    /// Starts `program` with `args`, its stdout and stderr appended to `log`.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, &str)],
        log: &Path,
    ) -> Result<Process> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect();
        let child = spawn_child(name, program, args, &env, log)?;
        tracing::debug!(name, program = %program.display(), log = %log.display(), "upstream process started");
        Ok(Process {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
            program: program.to_path_buf(),
            args: args.to_vec(),
            env,
        })
    }

    /// Kills it at once (SIGKILL), as a crash would, keeping what [`Process::respawn`] needs.
    pub async fn crash(&mut self) {
        let _ = self.child.kill().await;
        let _ = self.child.wait().await;
    }

    /// Starts it again with the same program, arguments and environment, as a service manager
    /// restarts a crashed process (its log continues). Kills the running one first, if any.
    pub async fn respawn(&mut self) -> Result<()> {
        self.crash().await;
        self.child = spawn_child(&self.name, &self.program, &self.args, &self.env, &self.log)?;
        tracing::debug!(name = %self.name, "upstream process restarted");
        Ok(())
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Its process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Polls `probe` until it answers `Ok(true)`, failing if the process exits first or `timeout`
    /// passes. The error carries the end of the log.
    pub async fn wait_ready<F, Fut>(&mut self, timeout: Duration, mut probe: F) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = std::result::Result<bool, String>>,
    {
        let deadline = Instant::now() + timeout;
        let mut last = String::from("no answer yet");
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(self.not_ready(format!("it exited with {status}")));
            }
            match probe().await {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => last = e,
            }
            if Instant::now() > deadline {
                return Err(self.not_ready(format!("not ready after {timeout:?} ({last})")));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// An error naming this process, with the end of its log.
    pub fn not_ready(&self, why: String) -> Error {
        Error::NotReady {
            what: self.name.clone(),
            why,
            log: self.log.clone(),
            tail: tail(&self.log, 30),
        }
    }

    /// Sends SIGTERM and waits up to 10 s, then kills.
    pub async fn stop(mut self) {
        terminate(&mut self.child).await;
    }

    /// Kills it at once (SIGKILL), as a crash would.
    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
        let _ = self.child.wait().await;
    }
}

/// Spawns `program` with its output appended to `log`, dying with this process.
fn spawn_child(
    name: &str,
    program: &Path,
    args: &[String],
    env: &[(String, String)],
    log: &Path,
) -> Result<tokio::process::Child> {
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir).map_err(io_error(dir))?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(io_error(log))?;
    let err = file.try_clone().map_err(io_error(log))?;
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .kill_on_drop(true);
    die_with_parent(&mut command);
    for (k, v) in env {
        command.env(k, v);
    }
    command.spawn().map_err(|source| Error::Spawn {
        what: name.to_string(),
        source,
    })
}

/// Makes the process `command` starts receive SIGKILL when its parent dies: dropping a [`Process`]
/// kills it, but no destructor runs when we are SIGKILLed or stopped by a signal we do not handle,
/// and an etcd or kube-apiserver left behind holds its ports and data. Linux's parent-death signal
/// fires on any death of the parent, SIGKILL included.
///
/// The kernel ties it to the spawning *thread*: spawn from a thread that lives as long as the child
/// should (the main thread, a tokio runtime's worker or the test's own thread), never from a
/// short-lived one (`spawn_blocking`), whose exit would kill the child.
#[allow(unsafe_code)]
pub fn die_with_parent(command: &mut tokio::process::Command) {
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec, where only async-signal-safe calls
    // are allowed: prctl, getppid and reading errno are; nothing here allocates or takes a lock.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died between fork and prctl: no signal will come, so do not start.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Stops `child` as a service manager does: SIGTERM, then SIGKILL if it has not exited in 10 s.
pub async fn terminate(child: &mut tokio::process::Child) {
    if let Some(pid) = child.id() {
        signal(pid, "TERM");
    }
    if tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}

/// Sends `SIG<name>` to `pid`.
pub fn signal(pid: u32, name: &str) {
    let _ = std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// The last `lines` lines of a file (empty if unreadable).
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `GET path` over plain HTTP on loopback; `Ok(status code)`.
pub async fn http_status(port: u16, path: &str) -> std::result::Result<u16, String> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    let response = http_exchange(port, &request).await?;
    response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("no HTTP status in {response:?}"))
}

/// POSTs a JSON `body` to `path` on 127.0.0.1:`port` over plain HTTP/1.1; the response body.
pub async fn http_post(port: u16, path: &str, body: &str) -> std::result::Result<String, String> {
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let response = http_exchange(port, &request).await?;
    let (head, rest) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP response: {response:?}"))?;
    if head.split_whitespace().nth(1).is_none_or(|c| c != "200") {
        return Err(format!("{head}: {rest}"));
    }
    // A chunked body: the JSON document is between its first `{` and its last `}`.
    match (rest.find('{'), rest.rfind('}')) {
        (Some(a), Some(b)) if a <= b => Ok(rest[a..=b].to_string()),
        _ => Ok(rest.to_string()),
    }
}

/// Sends one HTTP/1.1 `request` (with `Connection: close`) to 127.0.0.1:`port`; the whole response.
async fn http_exchange(port: u16, request: &str) -> std::result::Result<String, String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .map_err(|e| e.to_string())?;
    Ok(response)
}
