//! Working directories for upstream processes, removed when dropped.
//!
//! An etcd member preallocates 64 MB for its WAL and a kube-apiserver writes an audit log: a run
//! that leaves a directory behind for every failed or panicking test fills the disk the next
//! build and tests share. A [`ScratchDir`] is removed on every path out, kept only when asked.

use std::path::{Path, PathBuf};

use crate::Error;

/// Keeps every scratch directory for a post-mortem when set (to anything).
pub const KEEP_ENV: &str = "CAPMVM_KEEP_SCRATCH";

/// A fresh directory under the system's temporary directory, removed when dropped unless kept.
///
/// Drop it after the processes writing into it: as the last field of the struct that owns them,
/// or the last local of a function.
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
    keep: bool,
}

impl ScratchDir {
    /// Creates a new `<temp>/<prefix>-<pid>-<n>`, never one left behind by an earlier process of
    /// the same pid (a kept run's etcd data must not be started on again).
    pub fn create(prefix: &str) -> Result<ScratchDir, Error> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        loop {
            let path = std::env::temp_dir().join(format!(
                "{prefix}-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            match std::fs::create_dir(&path) {
                Ok(()) => {
                    return Ok(ScratchDir {
                        path,
                        keep: std::env::var_os(KEEP_ENV).is_some(),
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(source) => return Err(Error::Io { path, source }),
            }
        }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Leaves the directory in place when dropped (its logs, certificates and kubeconfigs).
    pub fn keep(&mut self) {
        self.keep = true;
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if self.keep {
            tracing::info!(dir = %self.path.display(), "scratch directory kept");
        } else if let Err(e) = std::fs::remove_dir_all(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %self.path.display(), error = %e, "scratch directory not removed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scratch_directory_is_removed_when_dropped_and_kept_when_asked() {
        if std::env::var_os(KEEP_ENV).is_some() {
            return; // every directory is kept by request
        }
        let dir = ScratchDir::create("capmvm-scratch-test").unwrap();
        let path = dir.path().to_path_buf();
        std::fs::write(path.join("etcd.log"), "x").unwrap();
        drop(dir);
        assert!(!path.exists(), "{} is left behind", path.display());

        let mut kept = ScratchDir::create("capmvm-scratch-test").unwrap();
        let path = kept.path().to_path_buf();
        kept.keep();
        drop(kept);
        assert!(path.exists(), "{} was removed though kept", path.display());
        std::fs::remove_dir_all(&path).unwrap();
    }

    #[test]
    fn a_directory_left_behind_is_never_reused() {
        let a = ScratchDir::create("capmvm-scratch-reuse").unwrap();
        let b = ScratchDir::create("capmvm-scratch-reuse").unwrap();
        assert_ne!(a.path(), b.path());
        // The next name this process would take, left behind by an earlier process of its pid.
        let n: u64 = b
            .path()
            .to_string_lossy()
            .rsplit('-')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap();
        let left = std::env::temp_dir().join(format!(
            "capmvm-scratch-reuse-{}-{}",
            std::process::id(),
            n + 1
        ));
        std::fs::create_dir_all(left.join("etcd")).unwrap();
        let c = ScratchDir::create("capmvm-scratch-reuse").unwrap();
        assert_ne!(
            c.path(),
            left.as_path(),
            "a new directory, not the one left behind"
        );
        assert!(!c.path().join("etcd").exists());
        std::fs::remove_dir_all(&left).unwrap();
    }
}
