//! flintlockd on loopback, on a containerd of its own: both with every folder (root, state, socket,
//! flintlock's state) under one temporary directory, so a test shares nothing with the machine, and
//! [`Flintlockd::stop`] leaves nothing behind (no containerd namespace, lease or mount, no folder).
//!
//! containerd is Debian's package (1.6; `.ci/run` installs it) found on `PATH`, run as root with a
//! configuration of its own: the CRI plugin (and its TCP streaming service) and the `opt` plugin
//! (which writes to `/opt/containerd`) disabled, and the snapshotters this machine's kernel cannot
//! serve (devmapper, btrfs, zfs, aufs) left out. flintlockd is the one `hack/upstream.sh build`
//! made from flintlock v0.11.0.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::process::Process;
use crate::{Binaries, Error, Result, free_port, io_error};

/// The containerd namespace flintlockd works in unless told otherwise (its `--containerd-ns`).
pub const FLINTLOCK_NAMESPACE: &str = "flintlock";

/// containerd and its `ctr` on `PATH` (or in `$CAPMVM_CONTAINERD_BIN`).
#[derive(Clone, Debug)]
pub struct ContainerdTools {
    containerd: PathBuf,
    ctr: PathBuf,
}

impl ContainerdTools {
    /// Finds `containerd` and `ctr`.
    pub fn locate() -> Result<ContainerdTools> {
        Ok(ContainerdTools {
            containerd: find_program("containerd")?,
            ctr: find_program("ctr")?,
        })
    }
}

fn find_program(name: &str) -> Result<PathBuf> {
    let dirs: Vec<PathBuf> =
        match std::env::var_os("CAPMVM_CONTAINERD_BIN").filter(|v| !v.is_empty()) {
            Some(dir) => vec![PathBuf::from(dir)],
            None => std::env::var_os("PATH")
                .map(|path| std::env::split_paths(&path).collect())
                .unwrap_or_default(),
        };
    dirs.iter()
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
        .ok_or_else(|| Error::MissingBinary {
            binary: format!("{name} (Debian's `containerd` package: apt-get install containerd)"),
            dir: PathBuf::from(std::env::var("PATH").unwrap_or_default()),
        })
}

/// Whether this process runs as root (containerd needs it): the effective uid in `/proc/self/status`.
pub fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

/// What a real flintlock host needs, for a test: flintlockd built, containerd installed, and root.
/// Otherwise, under CI (`CI` set to anything but `false`) a failure, and locally the test is reported
/// as skipped (on stderr) and `None` returned.
#[allow(clippy::panic)]
pub fn for_test(test: &str) -> Option<(Binaries, ContainerdTools)> {
    let binaries = Binaries::for_test(test, &["flintlockd"])?;
    let missing = match ContainerdTools::locate() {
        Ok(tools) if running_as_root() => return Some((binaries, tools)),
        Ok(_) => "root (containerd runs as root)".to_string(),
        Err(err) => err.to_string(),
    };
    let message = format!("{test}: a real flintlock host needs {missing}");
    if std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false") {
        panic!("{message}");
    }
    eprintln!("SKIPPED {message}");
    None
}

/// A containerd serving only its own folders.
#[derive(Debug)]
pub struct Containerd {
    process: Process,
    tools: ContainerdTools,
    dir: PathBuf,
    socket: PathBuf,
}

impl Containerd {
    /// Starts containerd with its root, state, sockets, configuration and log under `dir`.
    pub async fn start(tools: &ContainerdTools, dir: &Path) -> Result<Containerd> {
        std::fs::create_dir_all(dir).map_err(io_error(dir))?;
        let socket = dir.join("containerd.sock");
        // containerd refuses socket paths longer than 104 bytes (its ttrpc socket adds `.ttrpc`).
        let ttrpc = format!("{}.ttrpc", socket.display());
        if ttrpc.len() > 104 {
            return Err(Error::Io {
                path: socket,
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "containerd's socket {ttrpc} would be {} bytes long; containerd takes at most 104: use a shorter directory",
                        ttrpc.len()
                    ),
                ),
            });
        }
        let config = dir.join("containerd.toml");
        let text = format!(
            r#"version = 2
root = "{root}"
state = "{state}"
# No CRI (no Kubernetes here, and its streaming service would listen on TCP); no `opt` plugin (it
# writes to /opt/containerd); no snapshotter this kernel cannot serve.
disabled_plugins = [
  "io.containerd.grpc.v1.cri",
  "io.containerd.internal.v1.opt",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.aufs",
]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"
"#,
            root = dir.join("root").display(),
            state = dir.join("state").display(),
            socket = socket.display(),
        );
        std::fs::write(&config, text).map_err(io_error(&config))?;
        let args = vec!["--config".to_string(), config.display().to_string()];
        let mut process = Process::spawn(
            "containerd",
            &tools.containerd,
            &args,
            &[],
            &dir.join("containerd.log"),
        )?;
        let ctr = tools.ctr.clone();
        let address = socket.clone();
        process
            .wait_ready(Duration::from_secs(30), || {
                let ctr = ctr.clone();
                let address = address.clone();
                async move {
                    if !address.exists() {
                        return Ok(false);
                    }
                    run_ctr(&ctr, &address, None, &["version"])
                        .await
                        .map(|_| true)
                        .map_err(|e| e.to_string())
                }
            })
            .await?;
        Ok(Containerd {
            process,
            tools: tools.clone(),
            dir: dir.to_path_buf(),
            socket,
        })
    }

    /// Its gRPC socket (flintlockd's `--containerd-socket`).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Its process id.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// `ctr --address <socket> [--namespace ns] args`: its stdout.
    pub async fn ctr(&self, namespace: Option<&str>, args: &[&str]) -> Result<String> {
        run_ctr(&self.tools.ctr, &self.socket, namespace, args).await
    }

    /// Its namespaces.
    pub async fn namespaces(&self) -> Result<Vec<String>> {
        Ok(lines(
            &self.ctr(None, &["namespaces", "list", "--quiet"]).await?,
        ))
    }

    /// The leases in `namespace`.
    pub async fn leases(&self, namespace: &str) -> Result<Vec<String>> {
        Ok(lines(
            &self
                .ctr(Some(namespace), &["leases", "list", "--quiet"])
                .await?,
        ))
    }

    /// Removes everything in `namespace` (leases, images, snapshots, content), then the namespace.
    pub async fn purge_namespace(&self, namespace: &str) -> Result<()> {
        let ns = Some(namespace);
        for lease in self.leases(namespace).await? {
            self.ctr(ns, &["leases", "delete", &lease]).await?;
        }
        for image in lines(&self.ctr(ns, &["images", "list", "--quiet"]).await?) {
            self.ctr(ns, &["images", "remove", &image]).await?;
        }
        for snapshotter in ["native", "overlayfs"] {
            let listed = self
                .ctr(ns, &["snapshots", "--snapshotter", snapshotter, "list"])
                .await?;
            // `KEY PARENT KIND` after a header line.
            for key in listed
                .lines()
                .skip(1)
                .filter_map(|l| l.split_whitespace().next())
            {
                self.ctr(
                    ns,
                    &["snapshots", "--snapshotter", snapshotter, "remove", key],
                )
                .await?;
            }
        }
        for digest in lines(&self.ctr(ns, &["content", "list", "--quiet"]).await?) {
            self.ctr(ns, &["content", "remove", &digest]).await?;
        }
        self.ctr(None, &["namespaces", "remove", namespace]).await?;
        Ok(())
    }

    /// Stops it (SIGTERM, then SIGKILL after 10 s) and unmounts whatever is still mounted under
    /// its folder.
    pub async fn stop(self) -> Vec<PathBuf> {
        self.process.stop().await;
        unmount_under(&self.dir).await
    }
}

async fn run_ctr(
    ctr: &Path,
    socket: &Path,
    namespace: Option<&str>,
    args: &[&str],
) -> Result<String> {
    let address = socket.display().to_string();
    let mut all = vec!["--address", address.as_str()];
    if let Some(namespace) = namespace {
        all.extend(["--namespace", namespace]);
    }
    all.extend(args);
    crate::tools::run(ctr, &all, &[], None).await
}

fn lines(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// The mount points under `dir` (from `/proc/self/mountinfo`), deepest first.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<PathBuf> = text
        .lines()
        .filter_map(|line| line.split_whitespace().nth(4))
        .map(|point| PathBuf::from(point.replace("\\040", " ")))
        .filter(|point| point.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found
}

/// Unmounts (lazily) every mount under `dir`; the ones that stayed.
async fn unmount_under(dir: &Path) -> Vec<PathBuf> {
    for point in mounts_under(dir) {
        let _ = tokio::process::Command::new("umount")
            .arg("-l")
            .arg(&point)
            .status()
            .await;
    }
    mounts_under(dir)
}

/// flintlockd's TLS flags.
#[derive(Clone, Debug)]
pub struct FlintlockdTls {
    /// `--tls-cert`: the serving certificate (PEM file).
    pub cert: PathBuf,
    /// `--tls-key`: its key.
    pub key: PathBuf,
    /// `--tls-client-ca`: the CA client certificates are checked against.
    pub client_ca: Option<PathBuf>,
    /// `--tls-client-validate`: require and verify client certificates.
    pub validate_client: bool,
}

/// How to run one flintlockd.
#[derive(Clone, Default)]
pub struct FlintlockdOptions {
    /// `--basic-auth-token` (on flintlockd's command line, as its flag takes it; `Debug` prints
    /// `<redacted>`).
    pub basic_auth_token: Option<String>,
    /// TLS; `None` is `--insecure`.
    pub tls: Option<FlintlockdTls>,
    /// flintlockd's hidden `--maximum-retry` (its default is 10): failed attempts before FAILED.
    pub maximum_retry: Option<u32>,
}

impl std::fmt::Debug for FlintlockdOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlintlockdOptions")
            .field(
                "basic_auth_token",
                &self.basic_auth_token.as_ref().map(|_| "<redacted>"),
            )
            .field("tls", &self.tls)
            .field("maximum_retry", &self.maximum_retry)
            .finish()
    }
}

/// A flintlockd on 127.0.0.1 with a containerd of its own, in a directory it removes when stopped.
#[derive(Debug)]
pub struct Flintlockd {
    process: Process,
    containerd: Containerd,
    dir: PathBuf,
    port: u16,
    // Last, so it is dropped after both processes were killed: a Flintlockd dropped without `stop`
    // (a failed test) still removes its folder.
    _folder: RemoveOnDrop,
}

/// Removes a folder when dropped.
#[derive(Debug)]
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What [`Flintlockd::stop`] found left behind: empty when everything went.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// containerd namespaces still there after the purge.
    pub namespaces: Vec<String>,
    /// Mounts under the directory still there after containerd stopped.
    pub mounts: Vec<PathBuf>,
    /// The directory, if it could not be removed.
    pub dir: Option<PathBuf>,
}

impl Leftovers {
    /// Whether nothing was left.
    pub fn is_empty(&self) -> bool {
        *self == Leftovers::default()
    }
}

impl Flintlockd {
    /// Starts containerd in `dir/containerd` and flintlockd (state in `dir/state`, log in
    /// `dir/flintlockd.log`) on a free loopback port, and waits until it accepts connections.
    pub async fn start(
        binaries: &Binaries,
        tools: &ContainerdTools,
        dir: &Path,
        options: &FlintlockdOptions,
    ) -> Result<Flintlockd> {
        let program = binaries.path("flintlockd")?;
        // Declared first, dropped last: a start that fails removes the folder after killing what
        // it started (the error carries the end of the log).
        let folder = RemoveOnDrop(dir.to_path_buf());
        let containerd = Containerd::start(tools, &dir.join("containerd")).await?;
        let port = free_port()?;
        let state = dir.join("state");
        let mut args = vec![
            "run".to_string(),
            format!("--containerd-socket={}", containerd.socket().display()),
            format!("--containerd-ns={FLINTLOCK_NAMESPACE}"),
            format!("--grpc-endpoint=127.0.0.1:{port}"),
            format!("--state-dir={}", state.display()),
            // No bridge or NIC of the machine's is touched: no microVM gets as far as its network.
            "--parent-iface=lo".to_string(),
        ];
        match &options.tls {
            None => args.push("--insecure".to_string()),
            Some(tls) => {
                args.push(format!("--tls-cert={}", tls.cert.display()));
                args.push(format!("--tls-key={}", tls.key.display()));
                if let Some(ca) = &tls.client_ca {
                    args.push(format!("--tls-client-ca={}", ca.display()));
                }
                if tls.validate_client {
                    args.push("--tls-client-validate".to_string());
                }
            }
        }
        if let Some(token) = &options.basic_auth_token {
            args.push(format!("--basic-auth-token={token}"));
        }
        if let Some(retry) = options.maximum_retry {
            args.push(format!("--maximum-retry={retry}"));
        }
        let mut process = Process::spawn(
            "flintlockd",
            &program,
            &args,
            &[],
            &dir.join("flintlockd.log"),
        )?;
        process
            .wait_ready(Duration::from_secs(30), || async move {
                Ok(tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_ok())
            })
            .await?;
        Ok(Flintlockd {
            process,
            containerd,
            dir: dir.to_path_buf(),
            port,
            _folder: folder,
        })
    }

    /// `127.0.0.1:<port>`: what a client dials.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Its containerd.
    pub fn containerd(&self) -> &Containerd {
        &self.containerd
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its log.
    pub fn log(&self) -> &Path {
        self.process.log()
    }

    /// flintlockd's and containerd's process ids.
    pub fn pids(&self) -> Vec<u32> {
        self.process
            .pid()
            .into_iter()
            .chain(self.containerd.pid())
            .collect()
    }

    /// Stops flintlockd, removes its containerd namespace with everything in it, stops containerd,
    /// unmounts what is left under the directory and removes it; what could not go is returned.
    pub async fn stop(self) -> Result<Leftovers> {
        self.process.stop().await;
        let namespaces = self.containerd.namespaces().await?;
        if namespaces.iter().any(|ns| ns == FLINTLOCK_NAMESPACE) {
            self.containerd.purge_namespace(FLINTLOCK_NAMESPACE).await?;
        }
        let namespaces = self.containerd.namespaces().await?;
        let mounts = self.containerd.stop().await;
        let dir = match std::fs::remove_dir_all(&self.dir) {
            Ok(()) => None,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(_) => Some(self.dir.clone()),
        };
        Ok(Leftovers {
            namespaces,
            mounts,
            dir,
        })
    }
}

/// Whether a process with this id is still running (its `/proc` entry, not a zombie).
pub fn is_running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next().map(|s| s != "Z"))
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[tokio::test]
    async fn a_folder_too_deep_for_containerds_socket_is_refused_saying_why() {
        let tools = ContainerdTools {
            containerd: PathBuf::from("/nonexistent/containerd"),
            ctr: PathBuf::from("/nonexistent/ctr"),
        };
        let dir = std::env::temp_dir()
            .join(format!("capmvm-upstream-deep-{}", std::process::id()))
            .join("a".repeat(80));
        let err = Containerd::start(&tools, &dir).await.unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("containerd takes at most 104") && text.contains("shorter directory"),
            "{text}"
        );
        let _ = std::fs::remove_dir_all(dir.parent().unwrap());
    }

    #[test]
    fn nothing_is_mounted_under_a_fresh_folder() {
        let dir =
            std::env::temp_dir().join(format!("capmvm-upstream-mounts-{}", std::process::id()));
        assert!(mounts_under(&dir).is_empty());
        // `/proc` is a mount point of its own, so the parser does see mounts, deepest first.
        let proc_mounts = mounts_under(Path::new("/proc"));
        assert!(
            proc_mounts.contains(&PathBuf::from("/proc")),
            "{proc_mounts:?}"
        );
        assert_eq!(
            proc_mounts.last().map(PathBuf::as_path),
            Some(Path::new("/proc"))
        );
    }
}
