//! Leader election on a coordination.k8s.io/v1 Lease, as client-go does it: get, then create or replace
//! with the read resourceVersion (optimistic concurrency); no server-side apply.
//!
//! A lease held by someone else counts as expired only when its record has not changed for a whole
//! lease duration of *local* time, so clocks that disagree do not matter. The leader renews every retry
//! period; if it cannot renew within the renew deadline it reports the loss and must stop (the process
//! exits, and its replacement starts from a clean state).

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;
use tracing::{debug, info, warn};

/// Settings of one election.
#[derive(Clone, Debug)]
pub struct Election {
    /// Lease name.
    pub name: String,
    /// Lease namespace.
    pub namespace: String,
    /// Who we are (unique per process).
    pub identity: String,
    /// How long a lease is valid without renewal.
    pub lease_duration: Duration,
    /// How long the leader tries to renew before giving up.
    pub renew_deadline: Duration,
    /// How often to try to acquire or renew.
    pub retry_period: Duration,
}

/// A held leadership. `lost` turns true when it is lost; dropping it stops renewing.
pub struct Leadership {
    /// Becomes `true` once the lease could not be renewed within the renew deadline.
    pub lost: watch::Receiver<bool>,
    task: tokio::task::JoinHandle<()>,
    api: Api<Lease>,
    election: Election,
}

impl Leadership {
    /// Stops renewing and hands the lease over at once (the next candidate need not wait it out).
    pub async fn release(self) {
        self.task.abort();
        if let Ok(Some(mut lease)) = self.api.get_opt(&self.election.name).await {
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if spec.holder_identity.as_deref() == Some(self.election.identity.as_str()) {
                spec.holder_identity = None;
                spec.lease_duration_seconds = Some(1);
                match self
                    .api
                    .replace(&self.election.name, &PostParams::default(), &lease)
                    .await
                {
                    Ok(_) => info!(lease = %self.election.name, "leadership released"),
                    Err(e) => debug!(error = %e, "could not release the lease"),
                }
            }
        }
    }
}

/// What we last saw of someone else's lease, and when (local time).
struct Observed {
    record: (Option<String>, Option<MicroTime>),
    at: Instant,
}

impl Election {
    /// Waits until this process holds the lease, then keeps renewing it in the background.
    pub async fn acquire(self, client: kube::Client) -> Leadership {
        let api: Api<Lease> = Api::namespaced(client, &self.namespace);
        let mut observed = None;
        info!(lease = %self.name, namespace = %self.namespace, identity = %self.identity, "waiting for leadership");
        let acquired_at = loop {
            let started = Instant::now();
            match self.try_acquire_or_renew(&api, &mut observed).await {
                Ok(true) => break started,
                Ok(false) => {}
                Err(e) => warn!(error = %e, "leader election: lease call failed"),
            }
            tokio::time::sleep(self.retry_period).await;
        };
        info!(lease = %self.name, identity = %self.identity, "became leader");
        let (tx, lost) = watch::channel(false);
        let this = self.clone();
        let renew_api = api.clone();
        let task = tokio::spawn(async move {
            // Renewing: the holder is us, so there is no one else's record to track between calls.
            let why = keep_renewing(this.retry_period, this.renew_deadline, acquired_at, || {
                let (this, api) = (this.clone(), renew_api.clone());
                async move { this.try_acquire_or_renew(&api, &mut None).await }
            })
            .await;
            match why {
                Loss::TakenOver => warn!(lease = %this.name, "lease taken by another candidate"),
                Loss::DeadlinePassed => {
                    warn!(lease = %this.name, deadline = ?this.renew_deadline, "could not renew the lease in time; stopping")
                }
            }
            let _ = tx.send(true);
        });
        Leadership {
            lost,
            task,
            api,
            election: self,
        }
    }

    /// One attempt: `Ok(true)` if we hold the lease afterwards.
    async fn try_acquire_or_renew(
        &self,
        api: &Api<Lease>,
        observed: &mut Option<Observed>,
    ) -> Result<bool, kube::Error> {
        let now = MicroTime(Timestamp::now());
        let duration_secs = i32::try_from(self.lease_duration.as_secs())
            .unwrap_or(i32::MAX)
            .max(1);
        let Some(mut lease) = api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    namespace: Some(self.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        if holder.as_deref() != Some(self.identity.as_str()) {
            let record = (holder.clone(), spec.renew_time.clone());
            let their_duration = Duration::from_secs(
                u64::try_from(spec.lease_duration_seconds.unwrap_or(duration_secs)).unwrap_or(1),
            );
            let expired = match observed {
                Some(seen) if seen.record == record => seen.at.elapsed() > their_duration,
                _ => {
                    *observed = Some(Observed {
                        record,
                        at: Instant::now(),
                    });
                    false
                }
            };
            if holder.is_some() && !expired {
                debug!(holder = ?holder, "lease held by another candidate");
                return Ok(false);
            }
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        }
        spec.holder_identity = Some(self.identity.clone());
        spec.lease_duration_seconds = Some(duration_secs);
        spec.renew_time = Some(now);
        match api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// Why a leader stopped renewing.
#[derive(Debug, PartialEq, Eq)]
enum Loss {
    /// Another candidate holds the lease.
    TakenOver,
    /// No renewal succeeded within the renew deadline.
    DeadlinePassed,
}

/// Renews every `retry_period` until a renewal says someone else holds the lease, or none succeeds
/// within `renew_deadline` of the start of the last one that did (`renewed_at` at first).
///
/// Each attempt is cut off when the deadline passes: against an API server that stopped answering
/// (a partition drops packets, so a request hangs until the client's own timeout, minutes) an
/// attempt would otherwise outlive the deadline, and this replica would go on acting after another
/// one, seeing the lease unrenewed for its duration, took over. The deadline counts from the
/// *start* of the last successful attempt: its renew time was written no earlier, so the other
/// candidates' wait of a lease duration starts no earlier either, and renew deadline < lease duration
/// leaves this replica the difference to stop.
async fn keep_renewing<F, Fut>(
    retry_period: Duration,
    renew_deadline: Duration,
    mut renewed_at: Instant,
    mut attempt: F,
) -> Loss
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool, kube::Error>>,
{
    loop {
        let deadline = renewed_at + renew_deadline;
        if tokio::time::timeout_at(deadline.into(), tokio::time::sleep(retry_period))
            .await
            .is_err()
        {
            return Loss::DeadlinePassed;
        }
        let started = Instant::now();
        match tokio::time::timeout_at(deadline.into(), attempt()).await {
            Ok(Ok(true)) => renewed_at = started,
            Ok(Ok(false)) => return Loss::TakenOver,
            Ok(Err(e)) => debug!(error = %e, "lease renewal failed; retrying"),
            Err(_) => return Loss::DeadlinePassed,
        }
    }
}

/// A unique identity for this process: the pod name (or host name) plus the process id and start time.
pub fn identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "capmvm".to_string());
    let nanos = Timestamp::now().as_nanosecond() % 1_000_000_000;
    format!("{host}_{}_{nanos}", std::process::id())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    const RETRY: Duration = Duration::from_millis(20);
    const DEADLINE: Duration = Duration::from_millis(300);
    /// Room for a loaded machine's scheduling: the assertions are about never hanging on a call.
    const SLACK: Duration = Duration::from_secs(2);

    fn unavailable() -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("the server is unavailable", "ServiceUnavailable")
                .with_code(503)
                .boxed(),
        )
    }

    /// A partitioned API server: the first renewal succeeds, every later one hangs (as a request
    /// whose packets are dropped does). The leader gives up at the renew deadline, not when the
    /// hung request would end.
    #[tokio::test]
    async fn a_renewal_that_hangs_ends_leadership_at_the_renew_deadline() {
        let calls = Arc::new(AtomicU32::new(0));
        let start = Instant::now();
        let counted = calls.clone();
        let loss = tokio::time::timeout(
            DEADLINE + SLACK,
            keep_renewing(RETRY, DEADLINE, start, move || {
                let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
                async move {
                    if first {
                        Ok(true)
                    } else {
                        futures::future::pending().await
                    }
                }
            }),
        )
        .await
        .expect("leadership ends although the renewal never returns");
        assert_eq!(loss, Loss::DeadlinePassed);
        // The deadline counts from the start of the successful renewal, one retry period in.
        assert!(start.elapsed() >= RETRY + DEADLINE, "{:?}", start.elapsed());
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    /// Renewals that fail fast (the server answers 503) are retried until the deadline.
    #[tokio::test]
    async fn failing_renewals_are_retried_until_the_deadline() {
        let calls = Arc::new(AtomicU32::new(0));
        let counted = calls.clone();
        let start = Instant::now();
        let loss = keep_renewing(RETRY, DEADLINE, start, move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Err(unavailable()) }
        })
        .await;
        assert_eq!(loss, Loss::DeadlinePassed);
        assert!(start.elapsed() >= DEADLINE, "{:?}", start.elapsed());
        assert!(start.elapsed() < DEADLINE + SLACK, "{:?}", start.elapsed());
        assert!(calls.load(Ordering::SeqCst) >= 2, "retried");
    }

    /// Another holder: leadership ends at once.
    #[tokio::test]
    async fn a_lease_held_by_another_ends_leadership_at_once() {
        let loss = keep_renewing(RETRY, DEADLINE, Instant::now(), || async { Ok(false) }).await;
        assert_eq!(loss, Loss::TakenOver);
    }

    /// Renewals that succeed keep the leadership well past one deadline.
    #[tokio::test]
    async fn successful_renewals_keep_leadership() {
        let kept = tokio::time::timeout(
            DEADLINE * 4,
            keep_renewing(RETRY, DEADLINE, Instant::now(), || async { Ok(true) }),
        )
        .await;
        assert!(kept.is_err(), "still leading: {kept:?}");
    }
}
