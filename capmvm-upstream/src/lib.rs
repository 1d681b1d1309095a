//! Upstream Kubernetes, Cluster API and flintlock on loopback, for tests that need the real thing.
//!
//! The binaries come from `hack/upstream.sh build`, which builds them from the Go module proxy into a
//! cache outside the repository ([`Binaries`]). This crate starts them the way a cluster runs them,
//! without kind, a container runtime or cert-manager:
//!
//! - [`Etcd`]: one etcd member on loopback;
//! - [`KubeApiServer`]: kube-apiserver with generated certificates ([`pki`]), RBAC, the default
//!   admission plugins and an audit log at metadata level ([`audit`]) so the server itself counts
//!   every request; several can share one etcd under different prefixes;
//! - [`capi`]: Cluster API's CRDs and webhooks taken from the CAPI module and pointed at its managers by
//!   URL with a generated CA (as CAPI's own envtest does), and the managers themselves;
//! - [`tools`]: the pinned kubectl and clusterctl;
//! - [`Flintlockd`]: flintlock's flintlockd on loopback, on a containerd of its own ([`flintlock`]);
//! - [`autoscaler`]: cluster-autoscaler with its Cluster API provider;
//! - [`link`]: a loopback TCP link that can be cut, for partitions between processes;
//! - [`ScratchDir`]: their working directories, removed on every way out.
//!
//! It depends on no capmvm crate, so the API emulator's contract suite can run against it as well.

pub mod audit;
pub mod autoscaler;
pub mod binaries;
pub mod capi;
pub mod controllers;
pub mod etcd;
pub mod flintlock;
pub mod go_provider;
pub mod kubeapi;
pub mod link;
pub mod pki;
pub mod process;
pub mod scratch;
pub mod skip;
pub mod tools;

pub use audit::{AuditEvent, AuditLog};
pub use autoscaler::{AutoscalerOptions, ClusterAutoscaler};
pub use binaries::Binaries;
pub use controllers::ControlPlaneComponent;
pub use etcd::Etcd;
pub use flintlock::{Containerd, Flintlockd, FlintlockdOptions};
pub use kubeapi::{ApiServerOptions, KubeApiServer};
pub use scratch::ScratchDir;

use std::path::PathBuf;

/// Why an upstream component could not be run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A binary is not in the cache (`hack/upstream.sh build` has not run, or a pin changed).
    #[error(
        "{binary} is not in {dir}: build the upstream binaries first with `hack/upstream.sh build` \
         (or point CAPMVM_UPSTREAM_BIN at a directory holding them)"
    )]
    MissingBinary {
        /// The binary's name.
        binary: String,
        /// Where it was looked for.
        dir: PathBuf,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// A process could not be started.
    #[error("starting {what}: {source}")]
    Spawn {
        /// The component.
        what: String,
        /// What failed.
        source: std::io::Error,
    },
    /// A component exited or did not become ready in time; the end of its log says why.
    #[error("{what} did not become ready: {why}\n--- last lines of {log} ---\n{tail}")]
    NotReady {
        /// The component.
        what: String,
        /// What was seen.
        why: String,
        /// Its log file.
        log: PathBuf,
        /// The log's last lines.
        tail: String,
    },
    /// Certificates could not be generated.
    #[error("generating certificates: {0}")]
    Pki(#[from] rcgen::Error),
    /// A kubeconfig could not be turned into a client.
    #[error("building a client from {path}: {message}")]
    Kubeconfig {
        /// The kubeconfig file.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// An API request failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// A manifest could not be parsed.
    #[error("{path}: {message}")]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// A command (kubectl, clusterctl) failed.
    #[error("`{command}` exited with {status}: {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// What it wrote to stderr.
        stderr: String,
    },
}

/// The crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn io_error(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.into();
    move |source| Error::Io { path, source }
}

/// A loopback port free at the time of asking.
pub fn free_port() -> Result<u16> {
    free_port_on(std::net::Ipv4Addr::LOCALHOST.into())
}

/// A port free on `ip` at the time of asking.
pub fn free_port_on(ip: std::net::IpAddr) -> Result<u16> {
    let listener = std::net::TcpListener::bind((ip, 0)).map_err(|source| Error::Io {
        path: PathBuf::from(format!("{ip}:0")),
        source,
    })?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(io_error(format!("{ip}:0")))
}
