//! Deciding for one MicrovmMachineTemplate: the capacity a machine from it offers, for
//! cluster-autoscaler's scale from zero. Every value is a string, as the autoscaler requires.

use std::collections::BTreeMap;

use capmvm_api::{MicrovmMachineTemplate, MicrovmMachineTemplateStatus, NodeInfo};

/// Label on the template's `spec.template.metadata` that overrides the reported architecture.
pub const ARCH_LABEL: &str = "kubernetes.io/arch";

/// The status a template should have.
pub fn decide_template(template: &MicrovmMachineTemplate) -> MicrovmMachineTemplateStatus {
    let spec = &template.spec.template.spec;
    let architecture = template
        .spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.get(ARCH_LABEL).cloned())
        .unwrap_or_else(|| "amd64".to_string());
    MicrovmMachineTemplateStatus {
        capacity: BTreeMap::from([
            ("cpu".to_string(), spec.vcpu.to_string()),
            ("memory".to_string(), format!("{}Mi", spec.memory_mb)),
        ]),
        node_info: Some(NodeInfo {
            architecture: Some(architecture),
            // Flintlock boots Linux kernels only.
            operating_system: Some("linux".to_string()),
        }),
    }
}
