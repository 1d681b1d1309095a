//! The API of capmvm, a Cluster API infrastructure provider for microVMs on flintlock hosts.
//!
//! Group `infrastructure.cluster.x-k8s.io`, version `v1alpha2`, implementing the CAPI v1beta2 contract:
//!
//! - [`MicrovmCluster`]: the flintlock hosts a cluster may use, grouped into failure domains.
//! - [`MicrovmMachine`]: one machine's microVM.
//! - [`MicrovmMachineTemplate`]: what CAPI clones MicrovmMachines from.
//! - [`MicrovmMachinePool`]: a MachinePool's microVMs, one MicrovmMachine each.
//! - [`MicrovmClusterTemplate`] and [`MicrovmMachinePoolTemplate`]: what a ClusterClass clones
//!   MicrovmClusters and MicrovmMachinePools from.
//!
//! MicrovmCluster, MicrovmMachine and MicrovmMachineTemplate are also served at the Go provider's
//! `v1alpha1` ([`v1alpha1`]), converted by the operator's webhook with the pure functions of
//! [`conversion`].
//!
//! Plus the names everything else agrees on ([`keys`], [`conditions`]), the providerID format
//! ([`ProviderId`]), host endpoints ([`HostEndpoint`]), validation as plain functions ([`validation`]) and
//! read-only views of CAPI's own Cluster and Machine ([`capi`]).

pub mod capi;
#[cfg(feature = "test-support")]
pub mod capi_fixtures;
pub mod cluster;
pub mod cluster_template;
pub mod conditions;
pub mod conversion;
pub mod endpoint;
pub mod host_selection;
pub mod keys;
pub mod machine;
pub mod pool;
pub mod pool_template;
pub mod provider_id;
mod schema;
pub mod secret_refs;
pub mod template;
pub mod v1alpha1;
pub mod validation;

pub use cluster::{
    ApiEndpoint, FailureDomain, HostMaintenance, HostState, HostStatus, Initialization,
    MicrovmCluster, MicrovmClusterSpec, MicrovmClusterStatus, MicrovmHost, Placement, Proxy,
    SshPublicKey, StaticPoolPlacement,
};
pub use cluster_template::{
    MicrovmClusterTemplate, MicrovmClusterTemplateResource, MicrovmClusterTemplateSpec,
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
pub use pool_template::{
    MicrovmMachinePoolTemplate, MicrovmMachinePoolTemplateResource, MicrovmMachinePoolTemplateSpec,
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

/// Where the API server sends `ConversionReview`s: the operator's Service, as clusterctl installs it.
pub mod webhook {
    /// Namespace of the operator and its webhook Service.
    pub const NAMESPACE: &str = "capmvm-system";
    /// The webhook Service (port 443 to the operator's `webhook-server` port).
    pub const SERVICE: &str = "capmvm-webhook-service";
    /// The path of the conversion webhook.
    pub const CONVERT_PATH: &str = "/convert";
    /// The cert-manager Certificate of the webhook's serving certificate.
    pub const CERTIFICATE: &str = "capmvm-serving-cert";
    /// The Secret cert-manager writes that Certificate to (mounted into the operator).
    pub const CERTIFICATE_SECRET: &str = "capmvm-webhook-service-cert";
    /// cert-manager's CA injector fills a CRD's `spec.conversion.webhook.clientConfig.caBundle`
    /// from the Certificate this annotation names (`namespace/name`).
    pub const INJECT_CA_ANNOTATION: &str = "cert-manager.io/inject-ca-from";
}

/// Every CRD of this provider, in a stable order. MicrovmCluster, MicrovmMachine and
/// MicrovmMachineTemplate serve `v1alpha1` beside `v1alpha2` (the storage version), converted by the
/// operator's webhook; the caBundle is injected by cert-manager. The ClusterClass templates
/// (MicrovmClusterTemplate, MicrovmMachinePoolTemplate) are `v1alpha2` only: the Go provider had
/// neither. A MicrovmCluster's Secret names are refused when they name another namespace
/// ([`secret_refs`]).
pub fn crds()
-> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    use kube::CustomResourceExt;
    let mut crds = vec![
        with_v1alpha1(MicrovmCluster::crd(), v1alpha1::MicrovmCluster::crd()),
        with_v1alpha1(MicrovmMachine::crd(), v1alpha1::MicrovmMachine::crd()),
        with_v1alpha1(
            MicrovmMachineTemplate::crd(),
            v1alpha1::MicrovmMachineTemplate::crd(),
        ),
        MicrovmMachinePool::crd(),
        MicrovmClusterTemplate::crd(),
        MicrovmMachinePoolTemplate::crd(),
    ];
    crds.iter_mut()
        .for_each(secret_refs::refuse_other_namespaces);
    crds
}

/// `crd` (v1alpha2) serving `old` (v1alpha1) too, converted by the webhook.
fn with_v1alpha1(
    crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    old: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceConversion, ServiceReference, WebhookClientConfig, WebhookConversion,
    };
    // Both come from this crate's derives with one version each, the same group, kind and scope:
    // merging cannot fail; should it ever, the v1alpha2 CRD alone is still correct to serve.
    let mut merged = match kube::core::crd::merge_crds(vec![crd.clone(), old], VERSION) {
        Ok(merged) => merged,
        Err(_) => return crd,
    };
    merged.spec.conversion = Some(CustomResourceConversion {
        strategy: "Webhook".to_string(),
        webhook: Some(WebhookConversion {
            conversion_review_versions: vec!["v1".to_string()],
            client_config: Some(WebhookClientConfig {
                service: Some(ServiceReference {
                    namespace: webhook::NAMESPACE.to_string(),
                    name: webhook::SERVICE.to_string(),
                    path: Some(webhook::CONVERT_PATH.to_string()),
                    port: None,
                }),
                ..Default::default()
            }),
        }),
    });
    merged.metadata.annotations.get_or_insert_default().insert(
        webhook::INJECT_CA_ANNOTATION.to_string(),
        format!("{}/{}", webhook::NAMESPACE, webhook::CERTIFICATE),
    );
    merged
}
