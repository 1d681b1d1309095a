//! One etcd member on loopback.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::process::{Process, http_status};
use crate::{Binaries, Result, free_port};

/// A running etcd; dropping it kills it.
#[derive(Debug)]
pub struct Etcd {
    process: Process,
    client_port: u16,
    data_dir: PathBuf,
}

impl Etcd {
    /// Starts etcd with its data in `dir/etcd` and its log in `dir/etcd.log`. Writes are not synced
    /// to disk (`--unsafe-no-fsync`): it serves tests, and fsync on a shared CI disk dominates
    /// every write's latency.
    pub async fn start(binaries: &Binaries, dir: &Path) -> Result<Etcd> {
        let program = binaries.path("etcd")?;
        let client_port = free_port()?;
        let peer_port = free_port()?;
        let data_dir = dir.join("etcd");
        let client = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let args = vec![
            "--name=default".to_string(),
            format!("--data-dir={}", data_dir.display()),
            format!("--listen-client-urls={client}"),
            format!("--advertise-client-urls={client}"),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--initial-cluster=default={peer}"),
            "--unsafe-no-fsync".to_string(),
            "--log-level=warn".to_string(),
            // Room for 10 000 objects and their history between compactions.
            "--quota-backend-bytes=8589934592".to_string(),
        ];
        let mut process = Process::spawn("etcd", &program, &args, &[], &dir.join("etcd.log"))?;
        process
            .wait_ready(Duration::from_secs(30), || async move {
                http_status(client_port, "/health").await.map(|c| c == 200)
            })
            .await?;
        Ok(Etcd {
            process,
            client_port,
            data_dir,
        })
    }

    /// Its client URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Its data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Its process id.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Stops it.
    pub async fn stop(self) {
        self.process.stop().await;
    }
}
