//! Observations: everything the engine decides from, gathered by the operator.
//!
//! The operator fills these from its watch caches, Secrets and the flintlock hosts. The engine never
//! asks for more; where it needs something the operator did not gather, it waits with a reason.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use capmvm_api::capi::{Cluster, Machine, MachinePool};
use capmvm_api::{ApiEndpoint, MicrovmCluster, MicrovmMachine};

use crate::host_call::HostCallFailure;
use crate::plan::HostCall;

/// Bytes that must never reach a log line, a `Debug` print or an error message (bootstrap data).
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Sensitive(Vec<u8>);

impl Sensitive {
    /// Wraps secret bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Self(bytes.into())
    }

    /// The secret bytes. Callers must not log them.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Sensitive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<redacted {} bytes>", self.0.len())
    }
}

/// What the operator saw for one MicrovmMachine.
#[derive(Clone, Debug)]
pub struct ObservedMachine {
    /// The MicrovmMachine as read (metadata, spec, status). Its CAPI owner, pool and Cluster come
    /// distilled ([`MachineFacts`], [`MachinePoolFacts`], [`ClusterFacts`]): the engine reads what
    /// it decides from, not whole API objects.
    pub machine: MicrovmMachine,
    /// The CAPI Machine that owns it (ownerReference kind Machine, group cluster.x-k8s.io), if any.
    pub owner: Option<MachineFacts>,
    /// For a pool's instance ([`crate::machine::instance_pool`]): the CAPI MachinePool that owns its
    /// MicrovmMachinePool, if found. It speaks for an instance placed before core's Machine showed,
    /// and its `spec.template.spec.bootstrap.dataSecretName` is where the instance's bootstrap data
    /// comes from.
    pub machine_pool: Option<MachinePoolFacts>,
    /// The CAPI Cluster named by the `cluster.x-k8s.io/cluster-name` label, if it exists.
    pub cluster: Option<ClusterFacts>,
    /// The MicrovmCluster of that Cluster (by `spec.infrastructureRef`), if it exists. Shared with
    /// the cache it was read from: every machine of a cluster reads the same one.
    pub infra_cluster: Option<Arc<MicrovmCluster>>,
    /// The bootstrap data Secret, when the operator fetched it (see [`crate::machine::wants_bootstrap_data`]).
    pub bootstrap: BootstrapData,
    /// Facts about every host of the MicrovmCluster's static pool while the machine is to be placed
    /// (see [`crate::machine::wants_pool_facts`]), else about its recorded host, keyed by canonical
    /// endpoint.
    pub hosts: BTreeMap<String, HostFacts>,
    /// What the machine's recorded host answered (see [`crate::machine::recorded_host`]).
    pub recorded_host: HostLookup,
    /// The identity of the operator process deciding: a placement claimed by another process is
    /// waited out while its create may still be under way (see [`crate::machine::CREATE_CLAIM_TTL`]).
    pub operator: String,
    /// How long the deciding process has seen the machine's current placement claim, by its own
    /// monotonic clock from the moment it first saw that claim: a claim's age never depends on the
    /// clocks of the processes (one written by a replica whose clock runs ahead is not young, nor one
    /// read by a replica whose clock runs ahead old). `None`: not seen before (age zero).
    pub claim_seen_for: Option<Duration>,
    /// A host call of the last plan that failed, when this observation follows it: the engine reports
    /// it and says whether it is retried ([`crate::machine::record_host_call_failure`]).
    pub failed_host_call: Option<FailedHostCall>,
    /// The machine's group, while its microVM is on a host being evacuated (see
    /// [`crate::machine::wants_evacuation_group`]): it is released to Cluster API one at a time.
    pub evacuation: Option<EvacuationGroup>,
}

/// The Machines a machine on an evacuating host is replaced among: its MachineDeployment's, or its
/// cluster's control plane. Cluster API replaces a released machine through this group, so the group
/// must be whole and Ready before the next is released.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EvacuationGroup {
    /// How many Machines the group wants (the MachineDeployment's `spec.replicas`), if known.
    pub desired: Option<i32>,
    /// Every other Machine of the group.
    pub peers: Vec<EvacuationPeer>,
}

/// Another Machine of an [`EvacuationGroup`], with its MicrovmMachine.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EvacuationPeer {
    /// The MicrovmMachine's name (the Machine's `spec.infrastructureRef.name`); the Machine's when it
    /// has none yet.
    pub name: String,
    /// The Machine is being deleted.
    pub deleting: bool,
    /// The Machine's `Ready` condition is `True` (its Node is healthy).
    pub ready: bool,
    /// The MicrovmMachine's recorded host (canonical endpoint), if any.
    pub host: Option<String>,
    /// The reason of the MicrovmMachine's `Ready` condition, if any.
    pub ready_reason: Option<String>,
}

/// A CAPI Cluster, as the engines read it: pause, provisioning and endpoint, not the object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterFacts {
    /// Its name.
    pub name: String,
    /// `spec.paused`: reconciliation of the Cluster and every object of it is paused.
    pub paused: bool,
    /// CAPI marked the cluster's infrastructure provisioned.
    pub infrastructure_provisioned: bool,
    /// `spec.controlPlaneEndpoint`, once known.
    pub control_plane_endpoint: Option<ApiEndpoint>,
}

impl From<&Cluster> for ClusterFacts {
    fn from(cluster: &Cluster) -> Self {
        Self {
            name: cluster.metadata.name.clone().unwrap_or_default(),
            paused: cluster.is_paused(),
            infrastructure_provisioned: cluster.infrastructure_provisioned(),
            control_plane_endpoint: cluster.spec.control_plane_endpoint.clone(),
        }
    }
}

/// The CAPI Machine that owns a MicrovmMachine, as the engine reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineFacts {
    /// `spec.clusterName`.
    pub cluster_name: String,
    /// `spec.bootstrap.dataSecretName`, once CAPI set it.
    pub bootstrap_data_secret_name: Option<String>,
    /// `spec.failureDomain`: where the machine must be placed.
    pub failure_domain: Option<String>,
    /// CAPI marks it a control-plane machine.
    pub control_plane: bool,
    /// The MachineDeployment it belongs to (label `cluster.x-k8s.io/deployment-name`), if any.
    pub deployment: Option<String>,
}

impl From<&Machine> for MachineFacts {
    fn from(machine: &Machine) -> Self {
        Self {
            cluster_name: machine.spec.cluster_name.clone(),
            bootstrap_data_secret_name: machine.spec.bootstrap.data_secret_name.clone(),
            failure_domain: machine.spec.failure_domain.clone(),
            control_plane: machine.is_control_plane(),
            deployment: machine
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(capmvm_api::keys::DEPLOYMENT_NAME_LABEL))
                .cloned(),
        }
    }
}

/// A CAPI MachinePool, as the engines read it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachinePoolFacts {
    /// Its name.
    pub name: String,
    /// `spec.clusterName`.
    pub cluster_name: String,
    /// How many instances it wants (`spec.replicas`, 1 as CAPI defaults it).
    pub desired_replicas: i32,
    /// `spec.failureDomains`: empty means all of the cluster's.
    pub failure_domains: Vec<String>,
    /// The bootstrap data Secret every new instance boots with, once CAPI set it.
    pub bootstrap_data_secret_name: Option<String>,
}

impl From<&MachinePool> for MachinePoolFacts {
    fn from(pool: &MachinePool) -> Self {
        Self {
            name: pool.metadata.name.clone().unwrap_or_default(),
            cluster_name: pool.spec.cluster_name.clone(),
            desired_replicas: pool.desired_replicas(),
            failure_domains: pool.spec.failure_domains.clone(),
            bootstrap_data_secret_name: pool.bootstrap_data_secret_name().map(str::to_string),
        }
    }
}

/// A host call that failed while a plan was carried out.
#[derive(Clone, Debug, PartialEq)]
pub struct FailedHostCall {
    /// The call.
    pub call: HostCall,
    /// How it failed.
    pub failure: HostCallFailure,
    /// What the host or the client said; safe to show.
    pub message: String,
}

/// The bootstrap data Secret named by `Machine.spec.bootstrap.dataSecretName`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum BootstrapData {
    /// The operator did not look (not needed: the microVM exists, or no Secret is named yet).
    #[default]
    NotAsked,
    /// The named Secret does not exist.
    SecretNotFound,
    /// The Secret exists.
    Found {
        /// Its `value` key, if present.
        value: Option<Sensitive>,
        /// Its `format` key (`cloud-config` or `ignition`), if present.
        format: Option<String>,
    },
}

/// Whether a host answers.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum Reachability {
    /// Not asked yet (the operator just started, or cannot build a client).
    #[default]
    Unknown,
    /// The last call answered.
    Reachable,
    /// The last call failed to reach the host; the reason is safe to show.
    Unreachable(String),
    /// The host answered but refused the credentials (a wrong or missing basic-auth token); the
    /// reason is safe to show. Nothing listed with these credentials is known.
    Refused(String),
}

/// What the operator knows about one flintlock host.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct HostFacts {
    /// Whether the host answers.
    pub reachability: Reachability,
    /// Why calls to this host cannot even be attempted (a missing Secret or key), safe to show.
    pub credentials_problem: Option<String>,
    /// vCPUs allocated on the host: its microVMs plus machines placed there and not yet created.
    pub allocated_vcpu: i64,
    /// Memory allocated on the host in MiB, counted like `allocated_vcpu`.
    pub allocated_memory_mb: i64,
}

/// What the machine's recorded host answered about this machine's microVMs.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum HostLookup {
    /// No answer is available (no recorded host, or the operator did not ask).
    #[default]
    NotAsked,
    /// The host did not answer; the reason is safe to show.
    Unreachable(String),
    /// The host answered. `vms` holds the microVMs with this machine's namespace and name, and the one
    /// whose uid the providerID names if it exists. For a machine without providerID the answer must be
    /// fresh (listed after the last create), never from a cache: it decides whether to create.
    Answered {
        /// The matching microVMs, in any order.
        vms: Vec<ObservedVm>,
    },
}

/// One microVM as its host reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedVm {
    /// Flintlock's uid (a ULID: lexical order is creation order).
    pub uid: String,
    /// Flintlock namespace (the MicrovmMachine's namespace).
    pub namespace: String,
    /// Flintlock name (`spec.id`, the MicrovmMachine's name).
    pub name: String,
    /// State.
    pub state: VmState,
    /// Flintlock's failed-attempt counter.
    pub retry: i32,
    /// The MicrovmMachine uid carried in the VM's meta-data, if any
    /// (see [`crate::cloudinit::machine_uid_from_metadata`]).
    pub machine_uid: Option<String>,
    /// The CAPI Cluster name carried in the VM's meta-data, if any (microVMs created before it was
    /// written carry none).
    pub cluster: Option<String>,
    /// What the microVM runs with, as its host echoes it; `None` if not known.
    pub running: Option<RunningSpec>,
}

/// The size and images a microVM runs with, as flintlock echoes them. Flintlock cannot change a
/// microVM in place, so a MicrovmMachine spec edited after its create differs from this.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunningSpec {
    /// vCPUs.
    pub vcpu: i64,
    /// Memory in MiB.
    pub memory_mb: i64,
    /// The kernel's container image (shared: the microVMs of a host's list name few images).
    pub kernel_image: Arc<str>,
    /// The root volume's container image (flintlock returns the root volume only when set).
    pub root_volume_image: Option<Arc<str>>,
}

/// Flintlock's microVM states.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VmState {
    /// Created, not started yet (flintlock retries with backoff while here).
    Pending,
    /// The VMM process was started.
    Created,
    /// Flintlock gave up (terminal).
    Failed,
    /// Being deleted.
    Deleting,
    /// A state number this provider does not know.
    Unknown(i32),
}

/// What the operator saw for one MicrovmCluster.
#[derive(Clone, Debug)]
pub struct ObservedCluster {
    /// The MicrovmCluster as read.
    pub microvm_cluster: MicrovmCluster,
    /// The CAPI Cluster that owns it (ownerReference kind Cluster, group cluster.x-k8s.io), if any.
    pub owner: Option<ClusterFacts>,
    /// Facts about every host of its static pool, keyed by canonical endpoint.
    pub hosts: BTreeMap<String, HostFacts>,
    /// The MicrovmMachines of its Cluster that still exist (`name`s, deleting ones included): the
    /// MicrovmCluster stays while they need its hosts and credentials.
    pub machines: Vec<String>,
    /// The origin uids of every MicrovmMachine in the namespace, whatever its cluster: a microVM that
    /// carries one of them belongs to an object.
    pub known_machine_uids: BTreeSet<String>,
    /// The microVMs in its namespace on the hosts it uses, as listed with its own credentials.
    pub microvms: Vec<HostedVm>,
    /// For each of its hosts that other MicrovmClusters of the namespace also list (canonical
    /// endpoint): those MicrovmClusters' Cluster names. A microVM left behind there is reported by
    /// the cluster its meta-data names, else by each, saying the host is shared.
    pub shared_hosts: BTreeMap<String, BTreeSet<String>>,
    /// The Secrets its spec names for host credentials.
    pub credential_secrets: Vec<CredentialSecret>,
    /// The Secrets of the namespace that carry the credentials finalizer (names).
    pub protected_secrets: Vec<String>,
    /// The Secrets the namespace's other MicrovmClusters name for credentials (names).
    pub named_by_others: BTreeSet<String>,
    /// Whether the operator sees every MicrovmCluster of the namespace. Behind a watch filter it
    /// does not: a Secret only another operator's clusters name looks unclaimed from here.
    pub sees_every_cluster: bool,
}

/// A microVM and the host it lives on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostedVm {
    /// Canonical endpoint of the host.
    pub host: String,
    /// The microVM.
    pub vm: ObservedVm,
}

/// A Secret a MicrovmCluster names for host credentials (basic-auth tokens, TLS material).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CredentialSecret {
    /// Its name (in the MicrovmCluster's namespace).
    pub name: String,
    /// Whether it exists.
    pub exists: bool,
    /// Whether it carries the credentials finalizer, which keeps it through a namespace deletion
    /// until the machines that need it are gone.
    pub protected: bool,
    /// Other MicrovmClusters in the namespace that name it and are not gone: the last one to go
    /// releases it.
    pub other_users: usize,
}
