//! Deciding for one MicrovmMachineTemplate: the capacity a machine from it offers, for
//! cluster-autoscaler's scale from zero. Every value is a string, as the autoscaler requires.

use std::collections::BTreeMap;

use capmvm_api::{
    MicrovmMachineSpec, MicrovmMachineTemplate, MicrovmMachineTemplateStatus, NodeInfo,
};

/// Label on the template's `spec.template.metadata` that overrides the reported architecture.
pub const ARCH_LABEL: &str = "kubernetes.io/arch";

/// The status a template should have.
pub fn decide_template(template: &MicrovmMachineTemplate) -> MicrovmMachineTemplateStatus {
    let architecture = template
        .spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.get(ARCH_LABEL).map(String::as_str));
    offer(&template.spec.template.spec, architecture)
}

/// What one machine of `spec` offers (a template's, or a pool's for its own scale from zero);
/// `architecture` defaults to amd64.
pub fn offer(
    spec: &MicrovmMachineSpec,
    architecture: Option<&str>,
) -> MicrovmMachineTemplateStatus {
    MicrovmMachineTemplateStatus {
        capacity: BTreeMap::from([
            ("cpu".to_string(), spec.vcpu.to_string()),
            ("memory".to_string(), format!("{}Mi", spec.memory_mb)),
        ]),
        node_info: Some(NodeInfo {
            architecture: Some(architecture.unwrap_or("amd64").to_string()),
            // Flintlock boots Linux kernels only.
            operating_system: Some("linux".to_string()),
        }),
    }
}
