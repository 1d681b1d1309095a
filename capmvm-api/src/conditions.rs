//! Condition types and reasons written by this provider (metav1.Condition shape, CAPI v1beta2 vocabulary
//! where CAPI has a word for it).
//!
//! `Ready` describes the object over its whole life; its reason names the one thing it waits for.

/// Condition types.
pub mod types {
    /// Summary condition, mirrored by CAPI into `InfrastructureReady` of the Cluster or Machine.
    pub const READY: &str = "Ready";
    /// Whether reconciliation is paused (CAPI contract: SHOULD be maintained).
    pub const PAUSED: &str = "Paused";
    /// MicrovmCluster: whether every static-pool host answers.
    pub const HOSTS_REACHABLE: &str = "HostsReachable";
    /// Whether microVMs on the cluster's hosts carry the uid of a machine that no longer exists
    /// (True: some do; they are reported, never deleted silently).
    pub const ORPHANED_MICROVMS: &str = "OrphanedMicrovms";
    /// MicrovmMachine: whether its microVM runs with what the spec asks (vCPUs, memory, kernel and
    /// root images). A microVM cannot be changed in place: an edit after create is reported here.
    pub const MICROVM_UP_TO_DATE: &str = "MicrovmUpToDate";
    /// MicrovmMachinePool: fewer instances exist than the MachinePool asks for.
    pub const SCALING_UP: &str = "ScalingUp";
    /// MicrovmMachinePool: more instances exist than the MachinePool asks for.
    pub const SCALING_DOWN: &str = "ScalingDown";
    /// MicrovmMachinePool: instances made from an older template are being replaced.
    pub const ROLLING_OUT: &str = "RollingOut";
    /// MicrovmMachinePool: failed, vanished or health-check-remediated instances are being replaced.
    pub const REMEDIATING: &str = "Remediating";
}

/// Condition reasons.
pub mod reasons {
    // --- shared ---
    /// Ready=True.
    pub const READY: &str = "Ready";
    /// Paused=True, and Ready while paused.
    pub const PAUSED: &str = "Paused";
    /// Paused=False.
    pub const NOT_PAUSED: &str = "NotPaused";
    /// No owner (Machine or Cluster) has claimed the object yet.
    pub const WAITING_FOR_OWNER: &str = "WaitingForOwner";
    /// The spec fails validation; the message lists every field error.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// A Secret or key named by the MicrovmCluster is missing or malformed.
    pub const MISSING_CREDENTIALS: &str = "MissingCredentials";
    /// The object is being deleted.
    pub const DELETING: &str = "Deleting";

    // --- MicrovmCluster ---
    /// Neither the Cluster nor the MicrovmCluster has a control-plane endpoint.
    pub const WAITING_FOR_CONTROL_PLANE_ENDPOINT: &str = "WaitingForControlPlaneEndpoint";
    /// HostsReachable=True.
    pub const HOSTS_REACHABLE: &str = "HostsReachable";
    /// HostsReachable=False: at least one host does not answer.
    pub const HOSTS_UNREACHABLE: &str = "HostsUnreachable";
    /// HostsReachable=Unknown: no host has been asked yet.
    pub const HOSTS_NOT_OBSERVED: &str = "HostsNotObserved";
    /// A host refused the credentials (a wrong basic-auth token or client certificate).
    pub const HOST_AUTHENTICATION_FAILED: &str = "HostAuthenticationFailed";
    /// The MicrovmCluster is deleted and waits for its MicrovmMachines to go first.
    pub const WAITING_FOR_MACHINES: &str = "WaitingForMachines";
    /// OrphanedMicrovms=True.
    pub const ORPHANED_MICROVMS_FOUND: &str = "OrphanedMicrovmsFound";
    /// OrphanedMicrovms=False.
    pub const NO_ORPHANED_MICROVMS: &str = "NoOrphanedMicrovms";

    // --- MicrovmMachine gates, in the order they are checked ---
    /// The Cluster named by the owner Machine does not exist (yet).
    pub const WAITING_FOR_CLUSTER: &str = "WaitingForCluster";
    /// The Cluster's infrastructure (the MicrovmCluster) is not provisioned yet.
    pub const WAITING_FOR_CLUSTER_INFRASTRUCTURE: &str = "WaitingForClusterInfrastructureReady";
    /// The Machine has no bootstrap data Secret yet, or the Secret is missing.
    pub const WAITING_FOR_BOOTSTRAP_DATA: &str = "WaitingForBootstrapData";
    /// The bootstrap data is in a format flintlock cannot deliver (Ignition).
    pub const INVALID_BOOTSTRAP_FORMAT: &str = "InvalidBootstrapFormat";
    /// No host can take the machine (failure domain, control-plane permission, reachability).
    pub const NO_ELIGIBLE_HOST: &str = "NoEligibleHost";
    /// The machine's `hostSelector` matches no usable host; it is placed nowhere else.
    pub const NO_MATCHING_HOST: &str = "NoMatchingHost";
    /// The machine's host is being evacuated (`maintenance: Evacuate`): its microVM keeps running
    /// until CAPI replaces the Machine (a MachineHealthCheck on `InfrastructureReady=False`).
    pub const HOST_EVACUATING: &str = "HostEvacuating";
    /// The host the machine lives on (or was placed on) does not answer.
    pub const HOST_UNREACHABLE: &str = "HostUnreachable";

    // --- MicrovmMachine microVM states ---
    /// The microVM was asked for and flintlock has not started it yet.
    pub const MICROVM_PENDING: &str = "MicrovmPending";
    /// Flintlock gave up on the microVM (FAILED is terminal in flintlock).
    pub const MICROVM_PROVISION_FAILED: &str = "MicrovmProvisionFailed";
    /// Flintlock reports the microVM as being deleted while the machine is not.
    pub const MICROVM_DELETING: &str = "MicrovmDeleting";
    /// The machine has a providerID but its host no longer has the microVM. It is never re-created.
    pub const MICROVM_NOT_FOUND: &str = "MicrovmNotFound";
    /// Flintlock reported a state this provider does not know.
    pub const MICROVM_UNKNOWN_STATE: &str = "MicrovmUnknownState";
    /// The host refused a call (for example InvalidArgument or a flintlock validation error).
    pub const MICROVM_CREATE_FAILED: &str = "MicrovmCreateFailed";
    /// The host refused the create of this spec as invalid (flintlock's InvalidArgument or validation
    /// error). Final for the spec's generation: not retried until the spec changes.
    pub const MICROVM_SPEC_REJECTED: &str = "MicrovmSpecRejected";
    /// The recorded host has a microVM with this machine's namespace/name that the machine cannot
    /// recognise as its own (no readable origin uid in its meta-data, or another machine's uid).
    /// Creation waits until it is gone, rather than risk a second microVM.
    pub const UNKNOWN_MICROVM_ON_HOST: &str = "UnknownMicrovmOnHost";
    /// Another provider (the Go provider) began to provision the machine and stopped before it set
    /// a providerID: a microVM it may have created carries nothing this provider can recognise, so
    /// none is created or deleted until a person says which (see the message).
    pub const UNFINISHED_BY_PREVIOUS_PROVIDER: &str = "UnfinishedByPreviousProvider";

    // --- MicrovmMachine MicrovmUpToDate ---
    /// MicrovmUpToDate=True.
    pub const UP_TO_DATE: &str = "UpToDate";
    /// MicrovmUpToDate=False: the spec was edited after the microVM was created.
    pub const SPEC_CHANGED_AFTER_CREATE: &str = "SpecChangedAfterCreate";

    // --- MicrovmMachinePool ---
    /// Ready=False: fewer ready instances than desired.
    pub const INSTANCES_NOT_READY: &str = "InstancesNotReady";
    /// ScalingUp=True.
    pub const SCALING_UP: &str = "ScalingUp";
    /// ScalingUp=False.
    pub const NOT_SCALING_UP: &str = "NotScalingUp";
    /// ScalingDown=True.
    pub const SCALING_DOWN: &str = "ScalingDown";
    /// ScalingDown=False.
    pub const NOT_SCALING_DOWN: &str = "NotScalingDown";
    /// RollingOut=True.
    pub const ROLLING_OUT: &str = "RollingOut";
    /// RollingOut=False.
    pub const NOT_ROLLING_OUT: &str = "NotRollingOut";
    /// Remediating=True.
    pub const REMEDIATING: &str = "Remediating";
    /// Remediating=False.
    pub const NOT_REMEDIATING: &str = "NotRemediating";
}

/// Condition status values.
pub mod status {
    /// The condition holds.
    pub const TRUE: &str = "True";
    /// The condition does not hold.
    pub const FALSE: &str = "False";
    /// Not known.
    pub const UNKNOWN: &str = "Unknown";
}
