//! MicrovmCluster: `v1alpha1` <-> `v1alpha2`.
//!
//! The Go provider names every host's failure domain by its endpoint, `v1alpha2` by its
//! `failureDomain`, else its name, else its endpoint: a named `v1alpha1` host gets its endpoint as
//! `failureDomain`, so Machines keep the failure domains they were placed in.

use std::collections::BTreeMap;

use super::{
    ConversionError, conditions, convert_object_with_status, initialization_up, non_empty,
    ready_down,
};
use crate::cluster::{
    ApiEndpoint, FailureDomain, MicrovmCluster, MicrovmClusterSpec, MicrovmClusterStatus,
    MicrovmHost, Placement, Proxy, SshPublicKey, StaticPoolPlacement,
};
use crate::v1alpha1;

/// A `v1alpha1` MicrovmCluster at `v1alpha2`.
pub fn cluster_to_v1alpha2(
    old: &v1alpha1::MicrovmCluster,
) -> Result<MicrovmCluster, ConversionError> {
    convert_object_with_status(old, spec_up, spec_down, status_up, status_down)
}

/// A `v1alpha2` MicrovmCluster at `v1alpha1`.
pub fn cluster_to_v1alpha1(
    new: &MicrovmCluster,
) -> Result<v1alpha1::MicrovmCluster, ConversionError> {
    convert_object_with_status(
        new,
        |s, _| spec_down(s),
        |s| spec_up(s, None),
        status_down,
        status_up,
    )
}

/// `kept` is the `v1alpha2` spec this object had when it was read at `v1alpha1` and then changed:
/// the hosts it still lists (by endpoint) keep the failure domain, labels and maintenance they had.
fn spec_up(
    old: &v1alpha1::MicrovmClusterSpec,
    kept: Option<&MicrovmClusterSpec>,
) -> MicrovmClusterSpec {
    let kept_hosts: BTreeMap<&str, &MicrovmHost> = kept
        .and_then(|k| k.placement.static_pool.as_ref())
        .map(|p| p.hosts.iter().map(|h| (h.endpoint.as_str(), h)).collect())
        .unwrap_or_default();
    let endpoint = &old.control_plane_endpoint;
    MicrovmClusterSpec {
        control_plane_endpoint: (!endpoint.host.is_empty() || endpoint.port != 0).then(|| {
            ApiEndpoint {
                host: non_empty(&endpoint.host),
                port: (endpoint.port != 0).then_some(endpoint.port),
            }
        }),
        ssh_public_keys: old.ssh_public_keys.iter().map(key_up).collect(),
        placement: Placement {
            static_pool: old
                .placement
                .static_pool
                .as_ref()
                .map(|pool| StaticPoolPlacement {
                    hosts: pool
                        .hosts
                        .iter()
                        .map(|h| host_up(h, kept_hosts.get(h.endpoint.as_str()).copied()))
                        .collect(),
                    basic_auth_secret: non_empty(&pool.basic_auth_secret),
                }),
        },
        microvm_proxy: old.microvm_proxy.as_ref().map(|p| Proxy {
            endpoint: p.endpoint.clone(),
        }),
        tls_secret_ref: non_empty(&old.tls_secret_ref),
    }
}

fn host_up(old: &v1alpha1::MicrovmHost, kept: Option<&MicrovmHost>) -> MicrovmHost {
    let failure_domain = match kept {
        Some(k) => k.failure_domain.clone(),
        // Unnamed, the endpoint names the domain in both versions.
        None => (!old.name.is_empty()).then(|| old.endpoint.clone()),
    };
    MicrovmHost {
        name: non_empty(&old.name),
        endpoint: old.endpoint.clone(),
        controlplane_allowed: old.controlplane_allowed,
        failure_domain,
        labels: kept.map(|k| k.labels.clone()).unwrap_or_default(),
        maintenance: kept.and_then(|k| k.maintenance),
    }
}

fn spec_down(new: &MicrovmClusterSpec) -> v1alpha1::MicrovmClusterSpec {
    let endpoint = new.control_plane_endpoint.clone().unwrap_or_default();
    v1alpha1::MicrovmClusterSpec {
        control_plane_endpoint: v1alpha1::ApiEndpoint {
            host: endpoint.host.unwrap_or_default(),
            port: endpoint.port.unwrap_or(0),
        },
        ssh_public_keys: new.ssh_public_keys.iter().map(key_down).collect(),
        placement: v1alpha1::Placement {
            static_pool: new.placement.static_pool.as_ref().map(|pool| {
                v1alpha1::StaticPoolPlacement {
                    hosts: pool
                        .hosts
                        .iter()
                        .map(|h| v1alpha1::MicrovmHost {
                            name: h.name.clone().unwrap_or_default(),
                            endpoint: h.endpoint.clone(),
                            controlplane_allowed: h.controlplane_allowed,
                        })
                        .collect(),
                    basic_auth_secret: pool.basic_auth_secret.clone().unwrap_or_default(),
                }
            }),
        },
        microvm_proxy: new.microvm_proxy.as_ref().map(|p| v1alpha1::Proxy {
            endpoint: p.endpoint.clone(),
        }),
        tls_secret_ref: new.tls_secret_ref.clone().unwrap_or_default(),
    }
}

pub(super) fn key_up(k: &v1alpha1::SshPublicKey) -> SshPublicKey {
    SshPublicKey {
        user: k.user.clone(),
        authorized_keys: k.authorized_keys.clone(),
    }
}

pub(super) fn key_down(k: &SshPublicKey) -> v1alpha1::SshPublicKey {
    v1alpha1::SshPublicKey {
        user: k.user.clone(),
        authorized_keys: k.authorized_keys.clone(),
    }
}

fn status_up(old: &v1alpha1::MicrovmClusterStatus) -> MicrovmClusterStatus {
    MicrovmClusterStatus {
        initialization: initialization_up(old.ready),
        failure_domains: old
            .failure_domains
            .iter()
            .map(|(name, fd)| FailureDomain {
                name: name.clone(),
                control_plane: Some(fd.control_plane),
                attributes: fd.attributes.clone(),
            })
            .collect(),
        // v1alpha1 has no per-host status; the controller writes it anew at v1alpha2.
        hosts: Vec::new(),
        conditions: conditions::up(&old.conditions),
    }
}

fn status_down(new: &MicrovmClusterStatus) -> v1alpha1::MicrovmClusterStatus {
    v1alpha1::MicrovmClusterStatus {
        ready: ready_down(new.initialization.as_ref()),
        conditions: conditions::down(&new.conditions),
        failure_domains: new
            .failure_domains
            .iter()
            .map(|fd| {
                (
                    fd.name.clone(),
                    v1alpha1::FailureDomainSpec {
                        control_plane: fd.control_plane.unwrap_or(false),
                        attributes: fd.attributes.clone(),
                    },
                )
            })
            .collect(),
    }
}
