//! One etcd member on loopback.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::process::{Process, http_post, http_status};
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
        let process = Process::spawn("etcd", &program, &args, &[], &dir.join("etcd.log"))?;
        let mut etcd = Etcd {
            process,
            client_port,
            data_dir,
        };
        etcd.wait_healthy().await?;
        Ok(etcd)
    }

    async fn wait_healthy(&mut self) -> Result<()> {
        let client_port = self.client_port;
        self.process
            .wait_ready(Duration::from_secs(30), || async move {
                http_status(client_port, "/health").await.map(|c| c == 200)
            })
            .await
    }

    /// Kills it at once (SIGKILL), as a crash would; [`Etcd::restart`] starts it again.
    pub async fn crash(&mut self) {
        self.process.crash().await;
    }

    /// Starts it again on the same data directory and ports (killing it first if it runs);
    /// returns once it reports healthy.
    pub async fn restart(&mut self) -> Result<()> {
        self.process.respawn().await?;
        self.wait_healthy().await
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

    /// Every key under `prefix` and its value, read through etcd's JSON gateway (`/v3/kv/range`):
    /// what the API servers stored, for a test to see the encoding (the version an object is
    /// stored at) that no API returns.
    pub async fn get_prefix(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut end = prefix.as_bytes().to_vec();
        // The range end of a prefix: the prefix with its last byte incremented.
        if let Some(last) = end.last_mut() {
            *last = last.wrapping_add(1);
        }
        let body = serde_json::json!({"key": b64.encode(prefix), "range_end": b64.encode(&end)})
            .to_string();
        let text = http_post(self.client_port, "/v3/kv/range", &body)
            .await
            .map_err(|why| crate::Error::NotReady {
                what: "etcd's JSON gateway".to_string(),
                why,
                log: PathBuf::new(),
                tail: String::new(),
            })?;
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| crate::Error::Manifest {
                path: PathBuf::from("/v3/kv/range"),
                message: format!("{e}: {text}"),
            })?;
        let decode = |v: &serde_json::Value| {
            v.as_str()
                .and_then(|s| b64.decode(s).ok())
                .unwrap_or_default()
        };
        Ok(value["kvs"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|kv| {
                (
                    String::from_utf8_lossy(&decode(&kv["key"])).to_string(),
                    decode(&kv["value"]),
                )
            })
            .collect())
    }

    /// Stops it.
    pub async fn stop(self) {
        self.process.stop().await;
    }
}
