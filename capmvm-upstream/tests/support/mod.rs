//! What every upstream test starts from: etcd and a kube-apiserver in a directory of its own.

use std::path::PathBuf;

use capmvm_upstream::{ApiServerOptions, Binaries, Etcd, KubeApiServer, ScratchDir};

/// A management API server on its etcd, in `dir`.
pub(crate) struct Management {
    pub(crate) dir: PathBuf,
    pub(crate) etcd: Etcd,
    pub(crate) server: KubeApiServer,
    /// `dir`, removed last, on every way out (a failed assertion included).
    _scratch: ScratchDir,
}

impl Management {
    /// Starts etcd and kube-apiserver in a fresh directory named after `test`.
    pub(crate) async fn start(binaries: &Binaries, test: &str) -> Management {
        let scratch = ScratchDir::create(&format!("capmvm-upstream-{test}")).unwrap();
        let dir = scratch.path().to_path_buf();
        let etcd = Etcd::start(binaries, &dir).await.unwrap();
        let server = KubeApiServer::start(
            binaries,
            ApiServerOptions::new("management", &dir, &etcd.url()),
        )
        .await
        .unwrap();
        Management {
            dir,
            etcd,
            server,
            _scratch: scratch,
        }
    }

    /// Stops both and removes the directory.
    pub(crate) async fn stop(self) {
        self.server.stop().await;
        self.etcd.stop().await;
    }
}
