//! The MicrovmMachineTemplate controller: capacity and node info for cluster-autoscaler's scale from zero.

use std::sync::Arc;
use std::time::Instant;

use capmvm_api::MicrovmMachineTemplate;
use capmvm_reconcile::decide_template;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use tracing::instrument;

use super::Error;
use crate::context::Ctx;
use crate::metrics::ReconcileResult;
use crate::patch;

/// Controller name in metrics.
pub const CONTROLLER: &str = "microvmmachinetemplate";

/// Reconciles one MicrovmMachineTemplate.
#[instrument(skip_all, fields(template = %format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())))]
pub async fn reconcile(obj: Arc<MicrovmMachineTemplate>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let started = Instant::now();
    let desired = decide_template(&obj);
    let api: Api<MicrovmMachineTemplate> =
        Api::namespaced(ctx.client.clone(), &obj.namespace().unwrap_or_default());
    let result = patch::status(&api, obj.as_ref(), obj.status.as_ref(), &desired).await;
    let outcome = if result.is_ok() {
        ReconcileResult::Success
    } else {
        ReconcileResult::Error
    };
    ctx.metrics
        .reconciled(CONTROLLER, outcome, started.elapsed());
    result?;
    ctx.backoff.reset(&super::key(obj.as_ref()));
    Ok(Action::requeue(ctx.sync_period))
}
