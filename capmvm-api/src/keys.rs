//! Well-known names: the finalizer, label and annotation keys, and the meta-data keys sent to flintlock.

/// Finalizer on every MicrovmMachine that may own a microVM; removed only once the VM is gone.
pub const MACHINE_FINALIZER: &str = "microvmmachine.infrastructure.cluster.x-k8s.io";

/// Finalizer on every MicrovmCluster: removed only once none of its MicrovmMachines exists, so their
/// deletion always has the cluster's hosts and credentials (the Go provider's name).
pub const CLUSTER_FINALIZER: &str = "microvmcluster.infrastructure.cluster.x-k8s.io";

/// Finalizer on the Secrets a MicrovmCluster names for host credentials: a namespace deletion removes
/// Secrets at once, and the machines still need them to delete their microVMs.
pub const CREDENTIALS_FINALIZER: &str =
    "microvmcluster.infrastructure.cluster.x-k8s.io/credentials";

/// Label CAPI sets on infrastructure objects: the owning Cluster's name.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";

/// Label on a pool's instances: CAPI's `MustFormatValue` of the MachinePool's name
/// ([`crate::pool::must_format_label_value`]). Core lists instances by it and this cluster-name label.
pub const POOL_NAME_LABEL: &str = "cluster.x-k8s.io/pool-name";

/// Annotation cluster-autoscaler (or a person) sets on a Machine to pick it for deletion on scale
/// down; the pool copies it onto the instance and deletes those first.
pub const DELETE_MACHINE_ANNOTATION: &str = "cluster.x-k8s.io/delete-machine";

/// Annotation on a pool's instance: the hash of the pool template it was made from
/// (see `capmvm_reconcile::pool::template_hash`). An instance whose hash differs is outdated.
pub const TEMPLATE_HASH_ANNOTATION: &str =
    "microvmmachinepool.infrastructure.cluster.x-k8s.io/template-hash";

/// Annotation on a pool's instance: the failure domain the pool chose for it.
pub const POOL_FAILURE_DOMAIN_ANNOTATION: &str =
    "microvmmachinepool.infrastructure.cluster.x-k8s.io/failure-domain";

/// Finalizer on every MicrovmMachinePool: removed once none of its instances exists, so deleting a
/// pool ends with zero microVMs.
pub const POOL_FINALIZER: &str = "microvmmachinepool.infrastructure.cluster.x-k8s.io";

/// Label CAPI sets on control-plane Machines (and, by template cloning, on their MicrovmMachines).
pub const CONTROL_PLANE_LABEL: &str = "cluster.x-k8s.io/control-plane";

/// Label CAPI's MachineSet puts on the Machines of a MachineDeployment: the deployment's name.
pub const DEPLOYMENT_NAME_LABEL: &str = "cluster.x-k8s.io/deployment-name";

/// Annotation that pauses reconciliation of the object carrying it.
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";

/// Annotation that marks an infrastructure cluster as managed by someone else: we leave it alone.
pub const MANAGED_BY_ANNOTATION: &str = "cluster.x-k8s.io/managed-by";

/// Label that makes `clusterctl move` carry an object outside the ownership chain, such as the
/// credentials Secrets a MicrovmCluster names (`basicAuthSecret`, `tlsSecretRef`).
pub const CLUSTERCTL_MOVE_LABEL: &str = "clusterctl.cluster.x-k8s.io/move";

/// Label selected by the operator's `--watch-filter`.
pub const WATCH_FILTER_LABEL: &str = "cluster.x-k8s.io/watch-filter";

/// Annotation CAPI sets on clones of a template: the template's name.
pub const CLONED_FROM_NAME_ANNOTATION: &str = "cluster.x-k8s.io/cloned-from-name";

/// Annotation CAPI sets on clones of a template: the template's `Kind.group`.
pub const CLONED_FROM_GROUPKIND_ANNOTATION: &str = "cluster.x-k8s.io/cloned-from-groupkind";

/// Annotation an administrator sets to `"true"` on a MicrovmMachine being deleted whose host is gone
/// for good: the finalizer is released without confirming the microVM is gone (it may leak on the host,
/// if the host ever returns), and a Warning event records it.
pub const ABANDON_MICROVM_ANNOTATION: &str =
    "microvmmachine.infrastructure.cluster.x-k8s.io/abandon-microvm";

/// Annotation on a MicrovmMachine naming the flintlock host (`host:port`) chosen for its microVM.
///
/// Written with the finalizer, in one conditional write, before the microVM is created, and never
/// changed after. It is metadata, not status, because `clusterctl move` does not carry status: a
/// machine moved between its create and its providerID write still knows which host to ask.
pub const HOST_ANNOTATION: &str = "microvmmachine.infrastructure.cluster.x-k8s.io/host";

/// Annotation on a MicrovmMachine holding the uid its microVMs carry in meta-data: the object's uid
/// when its host was recorded, written in the same write as [`HOST_ANNOTATION`] and never changed
/// after.
///
/// `clusterctl move` and backup/restore recreate the object with a new uid but keep annotations, so
/// a machine moved between its create and its providerID write still recognises (and adopts, or
/// deletes) the microVM it created. Without it, identity falls back to the object's uid.
pub const ORIGIN_UID_ANNOTATION: &str = "microvmmachine.infrastructure.cluster.x-k8s.io/origin-uid";

/// Annotation on a MicrovmMachine counting its placement attempts: written with [`HOST_ANNOTATION`]
/// and [`ORIGIN_UID_ANNOTATION`] before every create, one more than the value the decision read.
///
/// The write is conditional on the resourceVersion the decision read, and because the count always
/// changes it always produces a new version: two operators (or replicas without leader election)
/// deciding from the same version cannot both pass it, so only one of them creates. Without it, a
/// re-record of an already recorded host would change nothing and could pass twice.
pub const PLACEMENT_ATTEMPT_ANNOTATION: &str =
    "microvmmachine.infrastructure.cluster.x-k8s.io/placement-attempt";

/// Annotation on a MicrovmMachine naming who made its last placement attempt and when:
/// `<RFC 3339 time> <operator identity>`, written with [`PLACEMENT_ATTEMPT_ANNOTATION`].
///
/// The attempt's create may still be on its way to the host when another operator process reads the
/// new version (it is woken by that very write) and finds no microVM yet. Another process therefore
/// waits until the claim is older than a create can take before it creates itself, or releases the
/// finalizer of the machine if it is being deleted; the process that made the claim goes on at once
/// (its own create is over when it decides again).
pub const PLACEMENT_CLAIM_ANNOTATION: &str =
    "microvmmachine.infrastructure.cluster.x-k8s.io/placement-claim";

/// Annotation on an object read at `v1alpha1`: what its `v1alpha2` spec and status hold that
/// `v1alpha1` cannot (JSON), so writing it back at `v1alpha1` loses nothing. Written by the conversion
/// webhook, consumed by the conversion back (see `capmvm_api::conversion`).
pub const V1ALPHA2_FIELDS_ANNOTATION: &str =
    "microvm.infrastructure.cluster.x-k8s.io/v1alpha2-fields";

/// Annotation on an object converted from `v1alpha1` (the Go provider's): what its `v1alpha1` spec
/// and status held that `v1alpha2` cannot (JSON), so reading it at `v1alpha1` again shows it as it
/// was. Used only while the part it holds is unchanged since the conversion.
pub const V1ALPHA1_FIELDS_ANNOTATION: &str =
    "microvm.infrastructure.cluster.x-k8s.io/v1alpha1-fields";

/// Label carried on the microVM sent to flintlock (flintlock drops labels today; kept for parity).
pub const MICROVM_CLUSTER_NAME_LABEL: &str = "cluster-name";

/// The Secret type Cluster API gives the Secrets it writes per machine and per cluster (bootstrap
/// data, kubeconfigs, certificates). The operator's Secret watch leaves them out: there is one per
/// machine, and none of them is a credential.
pub const CAPI_SECRET_TYPE: &str = "cluster.x-k8s.io/secret";

/// Key of the bootstrap data in the bootstrap Secret (CAPI bootstrap contract).
pub const BOOTSTRAP_DATA_KEY: &str = "value";

/// Key of the bootstrap data format in the bootstrap Secret (`cloud-config` or `ignition`).
pub const BOOTSTRAP_FORMAT_KEY: &str = "format";

/// Keys of the TLS Secret named by `tlsSecretRef`.
pub const TLS_CERT_KEY: &str = "tls.crt";
/// See [`TLS_CERT_KEY`].
pub const TLS_KEY_KEY: &str = "tls.key";
/// See [`TLS_CERT_KEY`].
pub const TLS_CA_KEY: &str = "ca.crt";

/// Metadata keys of a flintlock microVM (cloud-init NoCloud documents, base64-encoded).
pub mod metadata {
    /// cloud-init instance meta-data (YAML map).
    pub const META_DATA: &str = "meta-data";
    /// cloud-init user-data: the bootstrap data.
    pub const USER_DATA: &str = "user-data";
    /// cloud-init vendor-data: hostname, users and SSH keys.
    pub const VENDOR_DATA: &str = "vendor-data";

    /// Instance meta-data key flintlock fills with the microVM uid.
    pub const INSTANCE_ID: &str = "instance_id";
    /// Instance meta-data key with the machine's hostname.
    pub const LOCAL_HOSTNAME: &str = "local_hostname";
    /// Instance meta-data key with the platform name.
    pub const PLATFORM: &str = "platform";
    /// Instance meta-data key with the host endpoint (templated into kubelet's `--provider-id`).
    pub const VM_HOST: &str = "vm_host";
    /// Instance meta-data key with the uid of the MicrovmMachine that asked for the VM. It is how we
    /// recognise our own VM after a crash between create and the providerID write (exactly-once).
    pub const MACHINE_UID: &str = "capmvm_machine_uid";
    /// Instance meta-data key with the name of the CAPI Cluster the machine belongs to: tells which
    /// of the MicrovmClusters sharing a host a microVM left behind came from (flintlock drops labels).
    pub const CLUSTER_NAME: &str = "capmvm_cluster_name";
    /// The platform value the Go provider sends.
    pub const PLATFORM_LIQUID_METAL: &str = "liquid_metal";
}
