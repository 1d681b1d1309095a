//! The gates every infrastructure object of a cluster passes before anything is done for it, shared by
//! the machine and pool engines: an owner, the Cluster, not paused, the cluster's infrastructure
//! provisioned and its MicrovmCluster found. Each waiting gate has its own reason on `Ready`.

use std::collections::BTreeMap;

use capmvm_api::MicrovmCluster;
use capmvm_api::capi::Cluster;
use capmvm_api::conditions::reasons;
use capmvm_api::keys::PAUSED_ANNOTATION;
use kube::ResourceExt;

/// Why reconciliation is paused, if it is: the object's paused annotation, or the Cluster's
/// `spec.paused`.
pub fn paused(annotations: &BTreeMap<String, String>, cluster: Option<&Cluster>) -> Option<String> {
    if annotations.contains_key(PAUSED_ANNOTATION) {
        return Some(format!("annotation {PAUSED_ANNOTATION} is set"));
    }
    if cluster.is_some_and(Cluster::is_paused) {
        return Some("Cluster spec.paused is set to true".to_string());
    }
    None
}

/// What the gates see of one object.
#[derive(Clone, Copy, Debug)]
pub struct Gates<'a> {
    /// Whether its CAPI owner (a Machine, a MachinePool) exists.
    pub has_owner: bool,
    /// What to say while there is no owner, for example "waiting for a Cluster API Machine to own
    /// this MicrovmMachine".
    pub owner_wait: &'a str,
    /// The Cluster's name, for messages.
    pub cluster_name: &'a str,
    /// The Cluster, if it exists.
    pub cluster: Option<&'a Cluster>,
    /// The Cluster's MicrovmCluster, if it exists.
    pub infra_cluster: Option<&'a MicrovmCluster>,
    /// Why reconciliation is paused ([`paused`]).
    pub paused: Option<&'a str>,
}

/// The outcome of the gates.
#[derive(Clone, Debug, PartialEq)]
pub enum Gate<'a> {
    /// Every gate is open.
    Open {
        /// The Cluster.
        cluster: &'a Cluster,
        /// Its MicrovmCluster.
        infra_cluster: &'a MicrovmCluster,
    },
    /// Paused (checked once owner and Cluster exist): the reason.
    Paused(String),
    /// Waiting on Cluster API: the reason for `Ready` and its message.
    Waiting {
        /// Condition reason.
        reason: &'static str,
        /// Condition message.
        message: String,
    },
}

impl<'a> Gates<'a> {
    /// Checks the gates in order: owner, Cluster, paused, infrastructure provisioned, MicrovmCluster.
    pub fn check(&self) -> Gate<'a> {
        if !self.has_owner {
            return Gate::Waiting {
                reason: reasons::WAITING_FOR_OWNER,
                message: self.owner_wait.to_string(),
            };
        }
        let Some(cluster) = self.cluster else {
            return Gate::Waiting {
                reason: reasons::WAITING_FOR_CLUSTER,
                message: format!("Cluster {:?} not found", self.cluster_name),
            };
        };
        if let Some(why) = self.paused {
            return Gate::Paused(why.to_string());
        }
        if !cluster.infrastructure_provisioned() {
            return Gate::Waiting {
                reason: reasons::WAITING_FOR_CLUSTER_INFRASTRUCTURE,
                message: format!(
                    "waiting for the infrastructure of Cluster {:?} to be provisioned",
                    cluster.name_any()
                ),
            };
        }
        let Some(infra_cluster) = self.infra_cluster else {
            return Gate::Waiting {
                reason: reasons::WAITING_FOR_CLUSTER_INFRASTRUCTURE,
                message: format!(
                    "the MicrovmCluster of Cluster {:?} was not found",
                    cluster.name_any()
                ),
            };
        };
        Gate::Open {
            cluster,
            infra_cluster,
        }
    }
}
