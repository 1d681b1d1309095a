//! The MicrovmCluster controller: failure domains, provisioned, host reachability.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use capmvm_api::MicrovmCluster;
use capmvm_api::capi::CAPI_GROUP;
use capmvm_reconcile::{HostFacts, ObservedCluster, decide_cluster};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tracing::instrument;

use super::{Error, publish};
use crate::context::Ctx;
use crate::metrics::ReconcileResult;
use crate::patch;

/// Controller name in metrics and events.
pub const CONTROLLER: &str = "microvmcluster";

/// Reconciles one MicrovmCluster.
#[instrument(skip_all, fields(cluster = %format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())))]
pub async fn reconcile(obj: Arc<MicrovmCluster>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = reconcile_once(obj.as_ref(), &ctx).await;
    match &result {
        Ok(_) => {
            ctx.backoff.reset(&super::key(obj.as_ref()));
            ctx.metrics
                .reconciled(CONTROLLER, ReconcileResult::Success, started.elapsed());
        }
        Err(_) => ctx
            .metrics
            .reconciled(CONTROLLER, ReconcileResult::Error, started.elapsed()),
    }
    result
}

async fn reconcile_once(mc: &MicrovmCluster, ctx: &Ctx) -> Result<Action, Error> {
    let ns = mc.namespace().unwrap_or_default();
    let owner = mc
        .owner_references()
        .iter()
        .find(|o| o.kind == "Cluster" && crate::watch::api_group(&o.api_version) == CAPI_GROUP)
        .and_then(|o| {
            ctx.stores
                .clusters
                .get(&ObjectRef::new(&o.name).within(&ns))
        })
        .map(|c| c.as_ref().clone());

    // Observe every host of the pool (the observers also serve the cluster's machines).
    let mut hosts = BTreeMap::new();
    for (endpoint, config) in ctx.credentials.host_configs(mc).await? {
        let facts = match config {
            Ok(config) => {
                ctx.hosts.ensure(&config);
                ctx.hosts.facts(&endpoint)
            }
            Err(problem) => HostFacts {
                credentials_problem: Some(problem),
                ..ctx.hosts.facts(&endpoint)
            },
        };
        hosts.insert(endpoint, facts);
    }

    let obs = ObservedCluster {
        microvm_cluster: mc.clone(),
        owner,
        hosts,
    };
    let plan = decide_cluster(&obs, Timestamp::now());
    let api: Api<MicrovmCluster> = Api::namespaced(ctx.client.clone(), &ns);
    let mut current = mc.clone();
    if let Some(status) = &plan.status
        && let Some(updated) = patch::status(&api, mc, mc.status.as_ref(), status).await?
    {
        current = updated;
    }
    for event in plan.events() {
        publish(ctx, &current, event).await;
    }
    Ok(Action::requeue(ctx.sync_period))
}
