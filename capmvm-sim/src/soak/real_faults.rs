//! The real-stack soak's faults: each takes a component of the management stack away (a SIGKILL, a
//! host's flintlockd restarting, a network cut) and brings it back, and says how long it was away
//! and how long the component took to be ready again.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use capmvm_flintlock::hollow::HostControl;
use capmvm_upstream::capi::Provider;
use capmvm_upstream::link::{Cut, Link};

use super::monitor::Rng;
use crate::real::RealStack;

/// A kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// etcd SIGKILLed, then started on the same data directory.
    Etcd,
    /// The management kube-apiserver SIGKILLed, then started with the same flags.
    ApiServer,
    /// CAPI's core manager SIGKILLed, then started.
    CapiCore,
    /// CAPI's kubeadm bootstrap manager SIGKILLed, then started.
    CapiBootstrap,
    /// Our operator SIGKILLed, then started.
    Operator,
    /// A hollow flintlock host's flintlockd restarts: its listener closes and every connection
    /// drops, its microVMs keep running (as firecracker's processes do on a real host).
    HostRestart,
    /// The host behind the link is cut off (packets dropped, or connections refused), then
    /// reachable again.
    HostCut,
}

impl Fault {
    /// Every kind, in the order a report lists them.
    pub const ALL: [Fault; 7] = [
        Fault::Etcd,
        Fault::ApiServer,
        Fault::CapiCore,
        Fault::CapiBootstrap,
        Fault::Operator,
        Fault::HostRestart,
        Fault::HostCut,
    ];

    /// Its name in the log and the report.
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::Etcd => "etcd SIGKILL + restart",
            Fault::ApiServer => "kube-apiserver SIGKILL + restart",
            Fault::CapiCore => "CAPI core manager SIGKILL + restart",
            Fault::CapiBootstrap => "CAPI kubeadm bootstrap manager SIGKILL + restart",
            Fault::Operator => "operator SIGKILL + restart",
            Fault::HostRestart => "flintlock host restart",
            Fault::HostCut => "host cut off (link)",
        }
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One fault as it happened.
#[derive(Clone, Debug)]
pub struct FaultRecord {
    /// What.
    pub fault: Fault,
    /// Which host, which cut, which scale it landed on.
    pub detail: String,
    /// When it began, from the start of the run.
    pub at: Duration,
    /// How long the component was away (killed to restarted, cut to healed).
    pub down: Duration,
    /// From the restart until the component was ready again (etcd healthy, `/readyz`, the
    /// manager's readiness; zero for what has no probe: the operator, a host, the link).
    pub restored_in: Duration,
    /// From the restart until every Machine was Ready with its Node again (`None`: not within
    /// the step timeout).
    pub converged_in: Option<Duration>,
}

/// The hosts and the link the faults act on.
pub struct Targets<'a> {
    /// Every host (a restart picks one).
    pub hosts: &'a [HostControl],
    /// The link in front of one host.
    pub link: &'a Link,
}

/// Carries out `fault` (away for a seeded time) and brings the component back: the detail, the
/// time away, and the time the component took to be ready after its restart.
pub async fn inject(
    real: &mut RealStack,
    targets: &Targets<'_>,
    fault: Fault,
    rng: &mut Rng,
    log: &dyn Fn(String),
) -> anyhow::Result<(String, Duration, Duration)> {
    let began = Instant::now();
    let restarted;
    let detail;
    match fault {
        Fault::Etcd => {
            let away = rng.millis(2_000, 15_000);
            real.crash_etcd().await?;
            detail = format!("away {:.1} s", away.as_secs_f64());
            log(format!("{fault}: killed, {detail}"));
            tokio::time::sleep(away).await;
            restarted = Instant::now();
            real.restart_etcd().await?;
        }
        Fault::ApiServer => {
            let away = rng.millis(2_000, 15_000);
            real.crash_management().await?;
            detail = format!("away {:.1} s", away.as_secs_f64());
            log(format!("{fault}: killed, {detail}"));
            tokio::time::sleep(away).await;
            restarted = Instant::now();
            real.restart_management().await?;
        }
        Fault::CapiCore | Fault::CapiBootstrap => {
            let provider = if fault == Fault::CapiCore {
                Provider::Core
            } else {
                Provider::KubeadmBootstrap
            };
            let away = rng.millis(1_000, 8_000);
            let stopped = real
                .kill_capi(provider)
                .await
                .with_context(|| format!("{fault}: the manager is not running"))?;
            detail = format!("away {:.1} s", away.as_secs_f64());
            log(format!("{fault}: killed, {detail}"));
            tokio::time::sleep(away).await;
            restarted = Instant::now();
            real.start_capi(stopped).await?;
        }
        Fault::Operator => {
            let away = rng.millis(500, 5_000);
            real.kill_operator().await;
            detail = format!("away {:.1} s", away.as_secs_f64());
            log(format!("{fault}: killed, {detail}"));
            tokio::time::sleep(away).await;
            restarted = Instant::now();
            real.start_operator(&[])?;
        }
        Fault::HostRestart => {
            let host = &targets.hosts[rng.below(targets.hosts.len())];
            let away = rng.millis(1_000, 8_000);
            host.set_reachable(false).await?;
            detail = format!("host {}, away {:.1} s", host.endpoint(), away.as_secs_f64());
            log(format!("{fault}: down, {detail}"));
            tokio::time::sleep(away).await;
            restarted = Instant::now();
            host.set_reachable(true).await?;
        }
        Fault::HostCut => {
            let how = if rng.next_u64().is_multiple_of(2) {
                Cut::Blackhole
            } else {
                Cut::Refuse
            };
            let away = rng.millis(5_000, 30_000);
            targets.link.cut(how);
            detail = format!(
                "{how:?} in front of {}, away {:.1} s",
                targets.link.target(),
                away.as_secs_f64()
            );
            log(format!("{fault}: cut, {detail}"));
            tokio::time::sleep(away).await;
            restarted = Instant::now();
            targets.link.heal();
        }
    }
    let down = restarted.duration_since(began);
    let restored_in = restarted.elapsed();
    log(format!(
        "{fault}: back after {:.1} s, ready {:.1} s after its restart",
        down.as_secs_f64(),
        restored_in.as_secs_f64()
    ));
    Ok((detail, down, restored_in))
}
