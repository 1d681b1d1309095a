//! kube-controller-manager and kube-scheduler beside a [`KubeApiServer`]: a management cluster needs
//! the garbage collector (ownerReferences) and the namespace controller (namespace deletion); a
//! workload cluster that schedules needs the scheduler and the workload controllers too.

use std::time::Duration;

use crate::process::Process;
use crate::{Binaries, KubeApiServer, Result, free_port};

/// A running kube-controller-manager or kube-scheduler; dropping it kills it.
#[derive(Debug)]
pub struct ControlPlaneComponent {
    process: Process,
}

impl ControlPlaneComponent {
    /// Starts kube-controller-manager for `server` with `controllers` (its `--controllers` list,
    /// such as `garbage-collector-controller,namespace-controller`; `*` for all).
    pub async fn controller_manager(
        binaries: &Binaries,
        server: &KubeApiServer,
        controllers: &str,
        extra: &[String],
    ) -> Result<ControlPlaneComponent> {
        let dir = server.dir();
        let port = free_port()?;
        let mut args = common_args(server, port);
        args.extend([
            format!("--controllers={controllers}"),
            format!(
                "--service-account-private-key-file={}",
                dir.join("sa.key").display()
            ),
            format!("--root-ca-file={}", dir.join("ca.crt").display()),
            format!(
                "--cluster-signing-cert-file={}",
                dir.join("ca.crt").display()
            ),
            format!(
                "--cluster-signing-key-file={}",
                dir.join("ca.key").display()
            ),
            "--use-service-account-credentials=false".to_string(),
        ]);
        args.extend(extra.iter().cloned());
        Self::start(binaries, "kube-controller-manager", server, args, port).await
    }

    /// Starts kube-scheduler for `server`.
    pub async fn scheduler(
        binaries: &Binaries,
        server: &KubeApiServer,
        extra: &[String],
    ) -> Result<ControlPlaneComponent> {
        let port = free_port()?;
        let mut args = common_args(server, port);
        args.extend(extra.iter().cloned());
        Self::start(binaries, "kube-scheduler", server, args, port).await
    }

    async fn start(
        binaries: &Binaries,
        binary: &str,
        server: &KubeApiServer,
        args: Vec<String>,
        port: u16,
    ) -> Result<ControlPlaneComponent> {
        let program = binaries.path(binary)?;
        let mut process = Process::spawn(
            binary,
            &program,
            &args,
            &[],
            &server.dir().join(format!("{binary}.log")),
        )?;
        // It opens its secure port once its informers and controllers are set up.
        process
            .wait_ready(
                Duration::from_secs(60),
                || async move { listening(port).await },
            )
            .await?;
        Ok(ControlPlaneComponent { process })
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

/// Whether something listens on loopback `port`.
async fn listening(port: u16) -> std::result::Result<bool, String> {
    tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map(|_| true)
        .map_err(|e| e.to_string())
}

/// The flags both components take: the admin's kubeconfig for everything, serving on loopback
/// `port`, and no leader election (one replica).
fn common_args(server: &KubeApiServer, port: u16) -> Vec<String> {
    let kubeconfig = server.kubeconfig().display().to_string();
    vec![
        format!("--kubeconfig={kubeconfig}"),
        format!("--authentication-kubeconfig={kubeconfig}"),
        format!("--authorization-kubeconfig={kubeconfig}"),
        "--bind-address=127.0.0.1".to_string(),
        format!("--secure-port={port}"),
        "--leader-elect=false".to_string(),
    ]
}
