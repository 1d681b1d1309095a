//! The MicrovmMachineTemplate controller: capacity and node info for cluster-autoscaler's scale from zero.

use std::sync::Arc;

use capmvm_api::MicrovmMachineTemplate;
use capmvm_reconcile::{Requeue, decide_template};
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use tracing::instrument;

use super::{Error, Outcome, Reconciled, note_version, wrap};
use crate::context::Ctx;
use crate::patch;

/// Controller name in metrics.
pub const CONTROLLER: &str = "microvmmachinetemplate";

/// Reconciles one MicrovmMachineTemplate.
#[instrument(skip_all, fields(template = %format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())))]
pub async fn reconcile(obj: Arc<MicrovmMachineTemplate>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    wrap(
        CONTROLLER,
        obj,
        ctx,
        |_, _| false,
        |template, ctx| async move {
            let mut versions = vec![template.resource_version().unwrap_or_default()];
            let result = reconcile_once(&template, &ctx, &mut versions).await;
            Reconciled { result, versions }
        },
    )
    .await
}

/// The engine's status, written when it differs; the template is looked at again each sync period.
async fn reconcile_once(
    template: &MicrovmMachineTemplate,
    ctx: &Ctx,
    versions: &mut Vec<String>,
) -> Result<Outcome, Error> {
    let desired = decide_template(template);
    let api: Api<MicrovmMachineTemplate> = Api::namespaced(
        ctx.client.clone(),
        &template.namespace().unwrap_or_default(),
    );
    if let Some(updated) = patch::status(&api, template, template.status.as_ref(), &desired).await?
    {
        note_version(versions, &updated);
    }
    Ok(Outcome::Requeue(Requeue::Await))
}
