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
    /// Creates `<temp>/<prefix>-<pid>-<n>`, `n` unique within the process.
    pub fn create(prefix: &str) -> Result<ScratchDir, Error> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "{prefix}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        Ok(ScratchDir {
            path,
            keep: std::env::var_os(KEEP_ENV).is_some(),
        })
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
    fn two_scratch_directories_of_one_prefix_differ() {
        let a = ScratchDir::create("capmvm-scratch-test").unwrap();
        let b = ScratchDir::create("capmvm-scratch-test").unwrap();
        assert_ne!(a.path(), b.path());
    }
}
