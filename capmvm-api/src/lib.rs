//! The API of capmvm, a Cluster API infrastructure provider for microVMs on flintlock hosts.
//!
//! Group `infrastructure.cluster.x-k8s.io`, version `v1alpha2`, implementing the CAPI v1beta2 contract:
//!
//! - [`MicrovmCluster`]: the flintlock hosts a cluster may use, grouped into failure domains.
//! - [`MicrovmMachine`]: one machine's microVM.
//! - [`MicrovmMachineTemplate`]: what CAPI clones MicrovmMachines from.
//! - [`MicrovmMachinePool`]: a MachinePool's microVMs, one MicrovmMachine each.
//!
//! Plus the names everything else agrees on ([`keys`], [`conditions`]), the providerID format
//! ([`ProviderId`]), host endpoints ([`HostEndpoint`]), validation as plain functions ([`validation`]) and
//! read-only views of CAPI's own Cluster and Machine ([`capi`]).

pub mod capi;
#[cfg(feature = "test-support")]
pub mod capi_fixtures;
pub mod cluster;
pub mod conditions;
pub mod endpoint;
pub mod keys;
pub mod machine;
pub mod pool;
pub mod provider_id;
mod schema;
pub mod template;
pub mod validation;

pub use cluster::{
    ApiEndpoint, FailureDomain, Initialization, MicrovmCluster, MicrovmClusterSpec,
    MicrovmClusterStatus, MicrovmHost, Placement, Proxy, SshPublicKey, StaticPoolPlacement,
};
pub use endpoint::{EndpointError, HostEndpoint};
pub use machine::{
    IfaceType, Initrd, Kernel, MachineAddress, MachineAddressType, MicrovmMachine,
    MicrovmMachineSpec, MicrovmMachineStatus, NetworkInterface, VmState, VmmProvider, Volume,
};
pub use pool::{
    DeletePolicy, MicrovmMachinePool, MicrovmMachinePoolSpec, MicrovmMachinePoolStatus,
    PoolStrategy, PoolStrategyType, RollingUpdate,
};
pub use provider_id::{ProviderId, ProviderIdError};
pub use template::{
    MicrovmMachineTemplate, MicrovmMachineTemplateResource, MicrovmMachineTemplateSpec,
    MicrovmMachineTemplateStatus, NodeInfo, TemplateMeta,
};

/// API group of this provider's kinds.
pub const GROUP: &str = "infrastructure.cluster.x-k8s.io";
/// API version of this provider's kinds.
pub const VERSION: &str = "v1alpha2";
/// The CAPI contract these kinds implement, and the CRD label that says so.
pub const CONTRACT_LABEL: (&str, &str) = ("cluster.x-k8s.io/v1beta2", VERSION);

/// Every CRD of this provider, in a stable order.
pub fn crds()
-> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    use kube::CustomResourceExt;
    vec![
        MicrovmCluster::crd(),
        MicrovmMachine::crd(),
        MicrovmMachineTemplate::crd(),
        MicrovmMachinePool::crd(),
    ]
}
