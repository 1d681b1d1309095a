//! What every engine decides first, the same way for machines, pools and clusters (as CAPI's
//! reconcilers do: one paused preamble, then `reconcileDelete` or `reconcileNormal`):
//!
//! 1. **pause**: the object's own `cluster.x-k8s.io/paused` annotation or its Cluster's
//!    `spec.paused`, shown on the `Paused` condition. A paused object changes nothing, also while it
//!    is deleted; a Ready one stays Ready (clusterctl move pauses every cluster), another says why it
//!    waits;
//! 2. **deletion** takes the delete path, which needs no gate: an object is deleted whatever CAPI
//!    still has to set up;
//! 3. else the **normal path** starts with the gates: an owner, the Cluster, the cluster's
//!    infrastructure provisioned and its MicrovmCluster found. Each waiting gate has its own reason on
//!    `Ready`; an object CAPI is still assembling (never reported on, younger than a kind's settle
//!    grace) leaves its waits unwritten.

use std::collections::BTreeMap;
use std::time::Duration;

use capmvm_api::MicrovmCluster;
use capmvm_api::conditions::{reasons, types};
use capmvm_api::keys::PAUSED_ANNOTATION;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;

use crate::conditions::Status;
use crate::observe::ClusterFacts;
use crate::plan::Requeue;

/// The conditions an engine writes while it decides: what the preamble and the gates need of it.
pub(crate) trait Report {
    /// Sets condition `type_`.
    fn condition(&mut self, type_: &str, status: Status, reason: &str, message: String);
    /// Whether `Ready` is True now.
    fn is_ready(&self) -> bool;
    /// Leaves the status unwritten: the object is still being assembled by CAPI.
    fn hold_status(&mut self);
}

/// Why reconciliation is paused, if it is: the object's paused annotation, or the Cluster's
/// `spec.paused`.
pub fn paused(
    annotations: &BTreeMap<String, String>,
    cluster: Option<&ClusterFacts>,
) -> Option<String> {
    if annotations.contains_key(PAUSED_ANNOTATION) {
        return Some(format!("annotation {PAUSED_ANNOTATION} is set"));
    }
    if cluster.is_some_and(|c| c.paused) {
        return Some("Cluster spec.paused is set to true".to_string());
    }
    None
}

/// Which path an engine takes after the preamble.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    /// Paused: nothing changes; the conditions say so.
    Paused,
    /// Being deleted.
    Delete,
    /// Everything else.
    Normal,
}

/// The preamble: the `Paused` condition, and the path. `cluster` is the Cluster whose
/// `spec.paused` pauses the object (its owner for a MicrovmCluster).
pub(crate) fn preamble(
    meta: &ObjectMeta,
    cluster: Option<&ClusterFacts>,
    report: &mut impl Report,
) -> Path {
    let annotations = meta.annotations.as_ref();
    let empty = BTreeMap::new();
    match paused(annotations.unwrap_or(&empty), cluster) {
        Some(why) => {
            report.condition(types::PAUSED, Status::True, reasons::PAUSED, why.clone());
            // A ready object stays Ready (clusterctl move pauses every cluster).
            if !report.is_ready() {
                report.condition(types::READY, Status::False, reasons::PAUSED, why);
            }
            Path::Paused
        }
        None => {
            report.condition(
                types::PAUSED,
                Status::False,
                reasons::NOT_PAUSED,
                String::new(),
            );
            if meta.deletion_timestamp.is_some() {
                Path::Delete
            } else {
                Path::Normal
            }
        }
    }
}

/// What the gates of the normal path see of one object.
#[derive(Clone, Copy, Debug)]
pub struct Gates<'a> {
    /// Whether its CAPI owner (a Machine, a MachinePool, a Cluster) exists.
    pub has_owner: bool,
    /// What to say while there is no owner, for example "waiting for a Cluster API Machine to own
    /// this MicrovmMachine".
    pub owner_wait: &'a str,
    /// The Cluster's name, for messages.
    pub cluster_name: &'a str,
    /// The Cluster, if it exists.
    pub cluster: Option<&'a ClusterFacts>,
}

/// The `Ready` reasons of a wait on CAPI: the gates above and the machine's bootstrap data.
const WAITS_ON_CAPI: [&str; 4] = [
    reasons::WAITING_FOR_OWNER,
    reasons::WAITING_FOR_CLUSTER,
    reasons::WAITING_FOR_CLUSTER_INFRASTRUCTURE,
    reasons::WAITING_FOR_BOOTSTRAP_DATA,
];

/// Whether `reason` on `Ready` is a wait on CAPI.
pub(crate) fn is_wait_on_capi(reason: &str) -> bool {
    WAITS_ON_CAPI.contains(&reason)
}

/// A gate that is not open: the reason for `Ready` and its message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    /// Condition reason.
    pub reason: &'static str,
    /// Condition message.
    pub message: String,
}

impl<'a> Gates<'a> {
    /// The owner and the Cluster, in this order: the Cluster, if both exist.
    pub fn owner_and_cluster(&self) -> Result<&'a ClusterFacts, Waiting> {
        if !self.has_owner {
            return Err(Waiting {
                reason: reasons::WAITING_FOR_OWNER,
                message: self.owner_wait.to_string(),
            });
        }
        self.cluster.ok_or_else(|| Waiting {
            reason: reasons::WAITING_FOR_CLUSTER,
            message: format!("Cluster {:?} not found", self.cluster_name),
        })
    }

    /// Every gate of an object that lives on the cluster's hosts (a machine, a pool): owner,
    /// Cluster, the cluster's infrastructure provisioned, its MicrovmCluster found.
    pub fn with_infrastructure(
        &self,
        infra_cluster: Option<&'a MicrovmCluster>,
    ) -> Result<(&'a ClusterFacts, &'a MicrovmCluster), Waiting> {
        let cluster = self.owner_and_cluster()?;
        if !cluster.infrastructure_provisioned {
            return Err(Waiting {
                reason: reasons::WAITING_FOR_CLUSTER_INFRASTRUCTURE,
                message: format!(
                    "waiting for the infrastructure of Cluster {:?} to be provisioned",
                    cluster.name
                ),
            });
        }
        let infra = infra_cluster.ok_or_else(|| Waiting {
            reason: reasons::WAITING_FOR_CLUSTER_INFRASTRUCTURE,
            message: format!(
                "the MicrovmCluster of Cluster {:?} was not found",
                cluster.name
            ),
        })?;
        Ok((cluster, infra))
    }
}

/// How long a kind's settle grace still runs for an object never reported on: its transient waits
/// are not written until then (CAPI assembles a new object in a burst of writes, and reporting each
/// passing wait would cost a status write, and a conflict, apiece). `None` once reported on, or
/// once the grace is over.
pub(crate) fn settle_left(
    meta: &ObjectMeta,
    reported: bool,
    grace: Duration,
    now: Timestamp,
) -> Option<Duration> {
    if reported {
        return None;
    }
    grace_left(meta.creation_timestamp.as_ref()?.0, grace, now)
}

/// How much of `grace`, counted from `since`, is left at `now`: `None` once it is over.
pub(crate) fn grace_left(since: Timestamp, grace: Duration, now: Timestamp) -> Option<Duration> {
    let age = Duration::try_from(now.duration_since(since)).ok()?;
    grace.checked_sub(age).filter(|d| !d.is_zero())
}

/// Reports a waiting gate: unwritten while the settle grace runs (`settle_left`), else `Ready=False`
/// with the gate's reason. Returns when to look again.
pub(crate) fn wait(
    report: &mut impl Report,
    waiting: Waiting,
    settle_left: Option<Duration>,
) -> Requeue {
    match settle_left {
        Some(left) => {
            report.hold_status();
            Requeue::After(left)
        }
        None => {
            report.condition(types::READY, Status::False, waiting.reason, waiting.message);
            Requeue::Await
        }
    }
}
