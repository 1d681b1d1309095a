//! MicrovmMachineTemplate: `v1alpha1` <-> `v1alpha2`. The Go provider's template has no status;
//! ours (capacity and node info for cluster-autoscaler) is kept in the annotation at `v1alpha1`.

use super::machine::{spec_down as machine_spec_down, spec_up as machine_spec_up};
use super::{ConversionError, Direction, convert_parts};
use crate::template::{
    MicrovmMachineTemplate, MicrovmMachineTemplateResource, MicrovmMachineTemplateSpec,
    MicrovmMachineTemplateStatus, TemplateMeta,
};
use crate::v1alpha1;

/// A `v1alpha1` MicrovmMachineTemplate at `v1alpha2`.
pub fn template_to_v1alpha2(
    old: &v1alpha1::MicrovmMachineTemplate,
) -> Result<MicrovmMachineTemplate, ConversionError> {
    let (metadata, spec, status) = convert_parts(
        &old.metadata,
        Direction::UP,
        &old.spec,
        spec_up,
        spec_down,
        // `v1alpha1` cannot change the status (it has none), so the kept one is current.
        |kept: Option<MicrovmMachineTemplateStatus>| (kept, None::<()>),
    )?;
    Ok(MicrovmMachineTemplate {
        metadata,
        spec,
        status,
    })
}

/// A `v1alpha2` MicrovmMachineTemplate at `v1alpha1`.
pub fn template_to_v1alpha1(
    new: &MicrovmMachineTemplate,
) -> Result<v1alpha1::MicrovmMachineTemplate, ConversionError> {
    let (metadata, spec, ()) = convert_parts(
        &new.metadata,
        Direction::DOWN,
        &new.spec,
        |s, _| spec_down(s),
        |s| spec_up(s, None),
        // `v1alpha1` has no status: all of it is kept.
        |_: Option<()>| ((), new.status.clone()),
    )?;
    Ok(v1alpha1::MicrovmMachineTemplate { metadata, spec })
}

fn spec_up(
    old: &v1alpha1::MicrovmMachineTemplateSpec,
    kept: Option<&MicrovmMachineTemplateSpec>,
) -> MicrovmMachineTemplateSpec {
    let meta = &old.template.metadata;
    MicrovmMachineTemplateSpec {
        template: MicrovmMachineTemplateResource {
            metadata: (!meta.labels.is_empty() || !meta.annotations.is_empty()).then(|| {
                TemplateMeta {
                    labels: meta.labels.clone(),
                    annotations: meta.annotations.clone(),
                }
            }),
            spec: machine_spec_up(&old.template.spec, kept.map(|k| &k.template.spec)),
        },
    }
}

fn spec_down(new: &MicrovmMachineTemplateSpec) -> v1alpha1::MicrovmMachineTemplateSpec {
    let meta = new.template.metadata.clone().unwrap_or_default();
    v1alpha1::MicrovmMachineTemplateSpec {
        template: v1alpha1::MicrovmMachineTemplateResource {
            metadata: v1alpha1::TemplateObjectMeta {
                labels: meta.labels,
                annotations: meta.annotations,
            },
            spec: machine_spec_down(&new.template.spec),
        },
    }
}
