//! Start-up checks: the APIs the operator watches must be served, or it stops with what to install.
//!
//! Without them a watch's first list fails forever and no controller ever runs, while the process looks
//! alive. Discovery answers in one round trip, so the operator says so at once instead.

use capmvm_api::capi::CAPI_GROUP;
use capmvm_api::{GROUP, VERSION};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIGroupList;

/// The CAPI API version whose Machines and Clusters the operator reads.
pub const CAPI_VERSION: &str = "v1beta2";
/// CAPI resources the operator watches.
pub const CAPI_RESOURCES: [&str; 3] = ["machines", "clusters", "machinepools"];
/// This provider's resources.
pub const PROVIDER_RESOURCES: [&str; 4] = [
    "microvmmachines",
    "microvmmachinepools",
    "microvmclusters",
    "microvmmachinetemplates",
];

/// A required API is not served.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    /// Discovery itself failed.
    #[error("cannot read the API server's discovery documents (/apis): {0}")]
    Discovery(#[source] kube::Error),
    /// CAPI core is missing or too old.
    #[error(
        "Cluster API v1.11 or later is required ({CAPI_GROUP}/{CAPI_VERSION} machines, clusters and machinepools \
         must be served); found: {found}: install or upgrade it with clusterctl \
         (`clusterctl init`, or `clusterctl upgrade apply --contract v1beta2`)"
    )]
    CapiMissing {
        /// What the API server serves instead.
        found: String,
    },
    /// This provider's CRDs are missing.
    #[error(
        "the provider's CRDs are not served: {GROUP}/{VERSION} {missing} (found: {found}); install \
         them with `kubectl apply -f config/crd/bases` or `clusterctl init --infrastructure microvm`"
    )]
    ProviderCrdsMissing {
        /// The resources not served.
        missing: String,
        /// What the API server serves of the group.
        found: String,
    },
}

/// What discovery says about `group/version` and `resources`.
#[derive(Debug, PartialEq, Eq)]
enum Served {
    /// Every resource is served.
    All,
    /// Some are not; `found` says what is there.
    Missing { missing: Vec<String>, found: String },
}

/// Checks that CAPI v1beta2 Machines and Clusters and this provider's kinds are served.
pub async fn check_required_apis(client: &kube::Client) -> Result<(), PreflightError> {
    let groups = client
        .list_api_groups()
        .await
        .map_err(PreflightError::Discovery)?;
    if let Served::Missing { found, .. } =
        served(client, &groups, CAPI_GROUP, CAPI_VERSION, &CAPI_RESOURCES).await?
    {
        return Err(PreflightError::CapiMissing { found });
    }
    if let Served::Missing { missing, found } =
        served(client, &groups, GROUP, VERSION, &PROVIDER_RESOURCES).await?
    {
        return Err(PreflightError::ProviderCrdsMissing {
            missing: missing.join(", "),
            found,
        });
    }
    Ok(())
}

async fn served(
    client: &kube::Client,
    groups: &APIGroupList,
    group: &str,
    version: &str,
    resources: &[&str],
) -> Result<Served, PreflightError> {
    let all_missing = || resources.iter().map(|r| r.to_string()).collect();
    let Some(found) = groups.groups.iter().find(|g| g.name == group) else {
        return Ok(Served::Missing {
            missing: all_missing(),
            found: format!("{group} not installed"),
        });
    };
    let versions: Vec<&str> = found.versions.iter().map(|v| v.version.as_str()).collect();
    if !versions.contains(&version) {
        return Ok(Served::Missing {
            missing: all_missing(),
            found: format!("{group} {} only", versions.join(", ")),
        });
    }
    let list = client
        .list_api_group_resources(&format!("{group}/{version}"))
        .await
        .map_err(PreflightError::Discovery)?;
    let missing: Vec<String> = resources
        .iter()
        .filter(|r| !list.resources.iter().any(|served| served.name == **r))
        .map(|r| r.to_string())
        .collect();
    if missing.is_empty() {
        Ok(Served::All)
    } else {
        Ok(Served::Missing {
            found: format!("{group}/{version} without {}", missing.join(", ")),
            missing,
        })
    }
}
