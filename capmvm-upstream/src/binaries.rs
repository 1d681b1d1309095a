//! Where `hack/upstream.sh build` put the binaries.

use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// The directory of upstream binaries (and of the Cluster API manifests taken from its module).
#[derive(Clone, Debug)]
pub struct Binaries {
    dir: PathBuf,
}

impl Binaries {
    /// The directory `hack/upstream.sh` fills: `$CAPMVM_UPSTREAM_BIN`, else `bin` under
    /// `$CAPMVM_UPSTREAM_CACHE`, else under `${XDG_CACHE_HOME:-$HOME/.cache}/capmvm-upstream`.
    pub fn locate() -> Binaries {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        let dir = if let Some(bin) = var("CAPMVM_UPSTREAM_BIN") {
            PathBuf::from(bin)
        } else {
            let cache = var("CAPMVM_UPSTREAM_CACHE")
                .map(PathBuf::from)
                .or_else(|| var("XDG_CACHE_HOME").map(|c| PathBuf::from(c).join("capmvm-upstream")))
                .or_else(|| {
                    var("HOME").map(|h| PathBuf::from(h).join(".cache").join("capmvm-upstream"))
                })
                .unwrap_or_else(|| PathBuf::from(".cache/capmvm-upstream"));
            cache.join("bin")
        };
        Binaries { dir }
    }

    /// For a test that needs `names`: the binaries when they are all there. Otherwise the test is
    /// skipped ([`crate::skip::skip`]: said on the terminal past the harness's capture, and a failure
    /// under CI) and `None` returned.
    pub fn for_test(test: &str, names: &[&str]) -> Option<Binaries> {
        let binaries = Binaries::locate();
        let missing: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| !binaries.dir.join(n).is_file())
            .collect();
        if missing.is_empty() {
            return Some(binaries);
        }
        crate::skip::skip(
            test,
            &format!(
                "needs the upstream binaries {missing:?} in {}: run `hack/upstream.sh build`",
                binaries.dir.display()
            ),
        );
        None
    }

    /// Binaries in `dir`.
    pub fn in_dir(dir: impl Into<PathBuf>) -> Binaries {
        Binaries { dir: dir.into() }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of binary `name`, if it is there.
    pub fn path(&self, name: &str) -> Result<PathBuf> {
        let path = self.dir.join(name);
        if path.is_file() {
            Ok(path)
        } else {
            Err(Error::MissingBinary {
                binary: name.to_string(),
                dir: self.dir.clone(),
            })
        }
    }

    /// Whether every binary of `names` is there.
    pub fn have(&self, names: &[&str]) -> bool {
        names.iter().all(|n| self.dir.join(n).is_file())
    }

    /// Cluster API's manifests copied from its module by the build (`core/config/...`,
    /// `bootstrap/kubeadm/config/...`, `controlplane/kubeadm/config/...`, `cmd/clusterctl/config/...`).
    pub fn capi_config(&self) -> Result<PathBuf> {
        let path = self.dir.join("capi-config");
        if path.is_dir() {
            Ok(path)
        } else {
            Err(Error::MissingBinary {
                binary: "capi-config (Cluster API's manifests)".to_string(),
                dir: self.dir.clone(),
            })
        }
    }
}
