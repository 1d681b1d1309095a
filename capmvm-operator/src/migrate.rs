//! `capmvm-operator migrate-storage`: the last step of a move from the Go provider.
//!
//! The Go provider's objects are stored at `v1alpha1`. Once our CRDs serve both versions with
//! `v1alpha2` as storage, and our conversion webhook runs, every object is written back unchanged,
//! which stores it at `v1alpha2`; then the CRDs' `status.storedVersions` is set to `[v1alpha2]`, so
//! a later release may stop serving `v1alpha1` (CAPI's clusterctl migrates the same way).
//!
//! Before writing anything it checks that nothing left by the Go provider refuses those writes: its
//! admission webhooks point at a webhook server that no longer runs (our operator serves none).

use std::collections::BTreeMap;

use capmvm_api::{GROUP, VERSION};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt as _};
use serde_json::json;

/// The kinds the Go provider stored, by plural.
pub const MIGRATED: [(&str, &str); 3] = [
    ("MicrovmCluster", "microvmclusters"),
    ("MicrovmMachine", "microvmmachines"),
    ("MicrovmMachineTemplate", "microvmmachinetemplates"),
];

/// Field manager of the rewrites (they change no field).
pub const FIELD_MANAGER: &str = "capmvm-migrate-storage";

/// The paths the Go provider's admission webhooks served (`/mutate-...` and `/validate-...` of its
/// v1alpha1 kinds); nothing serves them any more.
const GO_WEBHOOK_PATH_MARK: &str = "-infrastructure-cluster-x-k8s-io-v1alpha1-microvm";

/// Why the migration stopped. Nothing is half done: objects already rewritten are simply stored at
/// `v1alpha2`, and running the command again continues.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// Our CRDs are not installed (or an older version is).
    #[error(
        "CRD {crd} {problem}: install capmvm's components first (infrastructure-components.yaml), which serve v1alpha1 and v1alpha2 and store v1alpha2"
    )]
    CrdNotReady {
        /// The CRD.
        crd: String,
        /// What is wrong.
        problem: String,
    },
    /// The Go provider's admission webhooks would refuse every write.
    #[error(
        "the Go provider's admission webhooks are still registered and refuse writes to these objects now that it is stopped: {0}; delete them (capmvm serves no admission webhook) and run again"
    )]
    GoWebhooksLeft(String),
    /// An API call failed.
    #[error("{what}: {source}{hint}")]
    Api {
        /// What was being done.
        what: String,
        /// The API server's answer.
        source: kube::Error,
        /// What to check.
        hint: &'static str,
    },
}

/// What the migration did, per kind.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Objects rewritten, by kind.
    pub rewritten: BTreeMap<&'static str, usize>,
    /// CRDs whose `status.storedVersions` was changed (the others were `[v1alpha2]` already).
    pub trimmed: Vec<String>,
}

const CONVERSION_HINT: &str = " (if it names the conversion webhook: the operator must be running with its serving certificate, and the CRDs must carry its CA; see README, Moving from the Go provider)";

/// Rewrites every object of [`MIGRATED`] at `v1alpha2` and trims the CRDs' stored versions.
pub async fn migrate_storage(client: &kube::Client) -> Result<Report, MigrateError> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (_, plural) in MIGRATED {
        let crd = read_crd(&crds, plural).await?;
        check_crd(&crd)?;
    }
    let left = go_webhooks(client).await?;
    if !left.is_empty() {
        return Err(MigrateError::GoWebhooksLeft(left.join(", ")));
    }

    let mut report = Report::default();
    for (kind, plural) in MIGRATED {
        let resource =
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, kind), plural);
        let all: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        let objects = all
            .list(&ListParams::default())
            .await
            .map_err(|source| MigrateError::Api {
                what: format!("listing {plural} at {VERSION}"),
                source,
                hint: CONVERSION_HINT,
            })?
            .items;
        let mut count = 0;
        for object in objects {
            let namespace = object.namespace().unwrap_or_default();
            let name = object.name_any();
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), &namespace, &resource);
            // An empty merge patch changes no field, yet the API server encodes the object at the
            // storage version and writes it, since its stored bytes (v1alpha1) differ.
            match api
                .patch(
                    &name,
                    &PatchParams {
                        field_manager: Some(FIELD_MANAGER.to_string()),
                        ..PatchParams::default()
                    },
                    &Patch::Merge(json!({})),
                )
                .await
            {
                Ok(_) => count += 1,
                // Deleted since the list: nothing left to store.
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(source) => {
                    return Err(MigrateError::Api {
                        what: format!("rewriting {kind} {namespace}/{name}"),
                        source,
                        hint: CONVERSION_HINT,
                    });
                }
            }
        }
        report.rewritten.insert(kind, count);
    }

    for (_, plural) in MIGRATED {
        let crd = read_crd(&crds, plural).await?;
        let name = crd.name_any();
        let stored = crd
            .status
            .as_ref()
            .and_then(|s| s.stored_versions.clone())
            .unwrap_or_default();
        if stored == [VERSION] {
            continue;
        }
        crds.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"storedVersions": [VERSION]}})),
        )
        .await
        .map_err(|source| MigrateError::Api {
            what: format!("setting status.storedVersions of CRD {name} to [{VERSION}]"),
            source,
            hint: "",
        })?;
        report.trimmed.push(name);
    }
    Ok(report)
}

/// The CRD serves both versions and stores `v1alpha2`.
fn check_crd(crd: &CustomResourceDefinition) -> Result<(), MigrateError> {
    let name = crd.name_any();
    let version = |v: &str| crd.spec.versions.iter().find(|x| x.name == v);
    let problem = match (version(VERSION), version(capmvm_api::v1alpha1::VERSION)) {
        (None, _) => Some(format!("does not serve {VERSION}")),
        (Some(v), _) if !v.storage => Some(format!("does not store {VERSION}")),
        (Some(_), Some(old)) if !old.served => Some(format!(
            "no longer serves {}, so its objects stored there cannot be read",
            capmvm_api::v1alpha1::VERSION
        )),
        _ => None,
    };
    match problem {
        Some(problem) => Err(MigrateError::CrdNotReady { crd: name, problem }),
        None => Ok(()),
    }
}

/// Our CRD of `plural`.
async fn read_crd(
    crds: &Api<CustomResourceDefinition>,
    plural: &str,
) -> Result<CustomResourceDefinition, MigrateError> {
    let name = format!("{plural}.{GROUP}");
    crds.get(&name).await.map_err(|source| MigrateError::Api {
        what: format!("reading CRD {name}"),
        source,
        hint: "",
    })
}

/// The admission webhook configurations that still send our kinds to the Go provider's paths.
async fn go_webhooks(client: &kube::Client) -> Result<Vec<String>, MigrateError> {
    let mut found = calling_go::<ValidatingWebhookConfiguration>(client, |c| {
        c.webhooks
            .iter()
            .flatten()
            .map(|w| &w.client_config)
            .collect()
    })
    .await?;
    found.extend(
        calling_go::<MutatingWebhookConfiguration>(client, |c| {
            c.webhooks
                .iter()
                .flatten()
                .map(|w| &w.client_config)
                .collect()
        })
        .await?,
    );
    Ok(found)
}

/// `kind/name` of each configuration of type `K` one of whose webhooks (`clients`) calls the Go
/// provider.
async fn calling_go<K>(
    client: &kube::Client,
    clients: impl Fn(&K) -> Vec<&WebhookClientConfig>,
) -> Result<Vec<String>, MigrateError>
where
    K: kube::Resource<Scope = kube::core::ClusterResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let kind = K::kind(&()).to_lowercase();
    let configs = Api::<K>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|source| MigrateError::Api {
            what: format!("listing {kind}s"),
            source,
            hint: "",
        })?;
    Ok(configs
        .items
        .iter()
        .filter(|c| sends_to_go(clients(c).into_iter()))
        .map(|c| format!("{kind}/{}", c.name_any()))
        .collect())
}

/// Whether any of a configuration's webhooks calls the Go provider, by service path or URL.
fn sends_to_go<'a>(mut clients: impl Iterator<Item = &'a WebhookClientConfig>) -> bool {
    clients.any(|c| {
        let path = c.service.as_ref().and_then(|s| s.path.as_deref());
        path.into_iter()
            .chain(c.url.as_deref())
            .any(|p| p.contains(GO_WEBHOOK_PATH_MARK))
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use k8s_openapi::api::admissionregistration::v1::ServiceReference;

    #[test]
    fn our_crds_pass_the_check_and_the_go_providers_do_not() {
        for crd in capmvm_api::crds()
            .into_iter()
            .filter(|c| !c.spec.names.plural.contains("pool"))
        {
            check_crd(&crd).unwrap();
        }
        for crd in capmvm_api::v1alpha1::crds() {
            let err = check_crd(&crd).unwrap_err().to_string();
            assert!(err.contains("does not serve v1alpha2"), "{err}");
            assert!(err.contains("install capmvm's components first"), "{err}");
        }
    }

    #[test]
    fn the_go_providers_webhook_paths_are_recognised() {
        let by_path = |path: &str| WebhookClientConfig {
            service: Some(ServiceReference {
                path: Some(path.into()),
                ..ServiceReference::default()
            }),
            ..WebhookClientConfig::default()
        };
        let by_url = |url: &str| WebhookClientConfig {
            url: Some(url.into()),
            ..WebhookClientConfig::default()
        };
        let go = |c: WebhookClientConfig| sends_to_go([&c].into_iter());
        assert!(go(by_path(
            "/validate-infrastructure-cluster-x-k8s-io-v1alpha1-microvmcluster"
        )));
        assert!(go(by_url(
            "https://127.0.0.1:1/mutate-infrastructure-cluster-x-k8s-io-v1alpha1-microvmmachine"
        )));
        assert!(!go(by_path("/convert")));
        assert!(!go(by_path("/validate-cluster-x-k8s-io-v1beta2-machine")));
    }
}
