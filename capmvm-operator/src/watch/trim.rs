//! What the watch caches keep of each kind: only what the operator reads. At 10 000 machines the
//! rest (CAPI's labels and annotations, conditions, the metadata of every other Secret) is tens of MiB.

use std::collections::BTreeMap;

use capmvm_api::MicrovmMachine;
use capmvm_api::capi::{Machine, OWNER_REMEDIATED_CONDITION};
use capmvm_api::conditions::types::READY as MACHINE_READY_CONDITION;
use capmvm_api::keys::{
    CLUSTER_NAME_LABEL, CONTROL_PLANE_LABEL, DELETE_MACHINE_ANNOTATION, DEPLOYMENT_NAME_LABEL,
    PAUSED_ANNOTATION, POOL_NAME_LABEL,
};
use k8s_openapi::api::core::v1::Secret;
use kube::Resource;
use kube::core::PartialObjectMeta;

/// Keeps of a Secret's metadata only what the operator reads: its version and finalizers (and the
/// name and namespace that key it). Every Secret in scope but Cluster API's own is cached,
/// credentials or not.
pub(super) fn secret(secret: &mut PartialObjectMeta<Secret>) {
    let meta = &mut secret.metadata;
    meta.labels = None;
    meta.annotations = None;
    meta.owner_references = None;
    meta.creation_timestamp = None;
    meta.generation = None;
}

/// Keeps of a CAPI Machine only what the operator reads, before the cache holds it (at 10 000
/// Machines the labels CAPI sets, deployment, set and template hash, cost about 5 MiB). The
/// operator never writes a Machine, so nothing is written back from the trimmed copy.
/// - Labels: `cluster.x-k8s.io/control-plane` (placement), `cluster.x-k8s.io/deployment-name` (the
///   group a machine on an evacuating host is released within).
/// - Annotations: `cluster.x-k8s.io/delete-machine` (a pool's scale-down choice).
/// - Conditions (core writes about ten): `OwnerRemediated`, `Ready` (an evacuating group's health).
/// - Not `spec.version` nor `spec.bootstrap.configRef`.
pub(super) fn machine(m: &mut Machine) {
    let meta = m.meta_mut();
    meta.labels = keep_keys(
        meta.labels.take(),
        &[CONTROL_PLANE_LABEL, DEPLOYMENT_NAME_LABEL],
    );
    meta.annotations = keep_keys(meta.annotations.take(), &[DELETE_MACHINE_ANNOTATION]);
    m.spec.version = None;
    m.spec.bootstrap.config_ref = None;
    if let Some(status) = &mut m.status {
        status.conditions.retain(|c| {
            c.r#type == OWNER_REMEDIATED_CONDITION || c.r#type == MACHINE_READY_CONDITION
        });
    }
}

/// The labels of a MicrovmMachine the operator reads.
const MICROVM_MACHINE_LABELS: &[&str] = &[CLUSTER_NAME_LABEL, POOL_NAME_LABEL];

/// The annotations of a MicrovmMachine the operator reads, besides its own (under
/// [`OWN_ANNOTATION_PREFIXES`]).
const MICROVM_MACHINE_ANNOTATIONS: &[&str] = &[PAUSED_ANNOTATION, DELETE_MACHINE_ANNOTATION];

/// The prefixes of the annotations the operator writes and reads on MicrovmMachines.
const OWN_ANNOTATION_PREFIXES: &[&str] = &[
    "microvmmachine.infrastructure.cluster.x-k8s.io/",
    "microvmmachinepool.infrastructure.cluster.x-k8s.io/",
];

/// Keeps of a MicrovmMachine's labels and annotations only those the operator reads, before the
/// cache holds it: CAPI's MachineSet adds deployment, set and template-hash labels and cloned-from
/// annotations to every one (about 5 MiB at 10 000). Spec and status stay whole: the status is
/// diffed against, the spec compared with the running microVM.
///
/// Annotations stay `Some` (perhaps empty) when the object has any: the operator's JSON patch adds
/// the whole map only to an object without annotations, which would otherwise replace CAPI's.
pub(super) fn microvm_machine(m: &mut MicrovmMachine) {
    let meta = m.meta_mut();
    meta.labels = keep_keys(meta.labels.take(), MICROVM_MACHINE_LABELS);
    if let Some(annotations) = &mut meta.annotations {
        annotations.retain(|k, _| {
            MICROVM_MACHINE_ANNOTATIONS.contains(&k.as_str())
                || OWN_ANNOTATION_PREFIXES.iter().any(|p| k.starts_with(p))
        });
    }
}

/// `map` with only the entries under `keys`; `None` when none is left (an empty map still allocates
/// nothing, but `None` says the same and compares equal to what an unlabelled object has).
fn keep_keys(
    map: Option<BTreeMap<String, String>>,
    keys: &[&str],
) -> Option<BTreeMap<String, String>> {
    let kept: BTreeMap<_, _> = map?
        .into_iter()
        .filter(|(k, _)| keys.contains(&k.as_str()))
        .collect();
    (!kept.is_empty()).then_some(kept)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use capmvm_api::GROUP;
    use kube::ResourceExt;

    use super::*;

    /// The trimmed Machine still answers every question the operator asks of it, and keeps nothing
    /// else of CAPI's labels and annotations.
    #[test]
    fn a_trimmed_machine_answers_what_the_operator_reads() {
        let mut machine: Machine = serde_json::from_value(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Machine",
            "metadata": {
                "name": "m", "namespace": "ns",
                "labels": {
                    CLUSTER_NAME_LABEL: "demo",
                    CONTROL_PLANE_LABEL: "",
                    "cluster.x-k8s.io/set-name": "demo-md-0-abc",
                    DEPLOYMENT_NAME_LABEL: "demo-md-0",
                    "machine-template-hash": "123",
                },
                "annotations": {
                    DELETE_MACHINE_ANNOTATION: "yes",
                    "cluster.x-k8s.io/cloned-from-name": "t",
                },
            },
            "spec": {
                "clusterName": "demo",
                "bootstrap": {"dataSecretName": "m"},
                "infrastructureRef": {"apiGroup": GROUP, "kind": "MicrovmMachine", "name": "m"},
            },
            "status": {"conditions": [
                {"type": "Ready", "status": "False", "reason": "x", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": OWNER_REMEDIATED_CONDITION, "status": "False", "reason": "y", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "NodeHealthy", "status": "True", "reason": "z", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            ]},
        }))
        .unwrap();
        super::machine(&mut machine);
        assert!(machine.is_control_plane());
        assert!(machine.owner_remediation_requested());
        assert!(
            machine
                .annotations()
                .contains_key(DELETE_MACHINE_ANNOTATION)
        );
        assert_eq!(
            capmvm_reconcile::MachineFacts::from(&machine)
                .deployment
                .as_deref(),
            Some("demo-md-0")
        );
        assert_eq!(machine.labels().len(), 2);
        assert_eq!(machine.annotations().len(), 1);
        let kept: Vec<&str> = machine
            .status
            .as_ref()
            .unwrap()
            .conditions
            .iter()
            .map(|c| c.r#type.as_str())
            .collect();
        assert_eq!(kept, ["Ready", OWNER_REMEDIATED_CONDITION]);
        assert_eq!(
            machine.spec.bootstrap.data_secret_name.as_deref(),
            Some("m")
        );

        let mut worker: Machine = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "w", "labels": {CLUSTER_NAME_LABEL: "demo"}},
            "spec": {"clusterName": "demo", "bootstrap": {}, "infrastructureRef": {"apiGroup": GROUP, "kind": "MicrovmMachine", "name": "w"}},
        }))
        .unwrap();
        super::machine(&mut worker);
        assert!(!worker.is_control_plane());
        assert_eq!(worker.metadata.labels, None);
    }

    fn named(name: &str) -> MicrovmMachine {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha2",
            "kind": "MicrovmMachine",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {
                "vcpu": 2, "memoryMb": 2048,
                "rootVolume": {"id": "root", "image": "ghcr.io/liquidmetal-dev/ubuntu:22.04"},
                "kernel": {"image": "ghcr.io/liquidmetal-dev/kernel-bin:5.10.77", "filename": "boot/vmlinux"},
                "networkInterfaces": [],
            },
        }))
        .unwrap()
    }

    /// Every label and annotation the operator reads of a MicrovmMachine survives the trim (each
    /// key constant of `capmvm_api::keys` that names one), CAPI's others do not, and an object with
    /// annotations keeps a map.
    #[test]
    fn a_trimmed_microvm_machine_keeps_what_the_operator_reads() {
        use capmvm_api::keys::*;
        let read_labels = [CLUSTER_NAME_LABEL, POOL_NAME_LABEL];
        let read_annotations = [
            PAUSED_ANNOTATION,
            DELETE_MACHINE_ANNOTATION,
            TEMPLATE_HASH_ANNOTATION,
            POOL_FAILURE_DOMAIN_ANNOTATION,
            ABANDON_MICROVM_ANNOTATION,
            HOST_ANNOTATION,
            ORIGIN_UID_ANNOTATION,
            PLACEMENT_ATTEMPT_ANNOTATION,
            PLACEMENT_CLAIM_ANNOTATION,
        ];
        let mut labels: BTreeMap<String, String> = read_labels
            .iter()
            .map(|k| (k.to_string(), "x".to_string()))
            .collect();
        labels.insert("cluster.x-k8s.io/set-name".into(), "s".into());
        labels.insert("machine-template-hash".into(), "1".into());
        let mut annotations: BTreeMap<String, String> = read_annotations
            .iter()
            .map(|k| (k.to_string(), "x".to_string()))
            .collect();
        annotations.insert(CLONED_FROM_NAME_ANNOTATION.into(), "t".into());
        annotations.insert(CLONED_FROM_GROUPKIND_ANNOTATION.into(), "g".into());
        let mut m = named("m");
        m.metadata.labels = Some(labels);
        m.metadata.annotations = Some(annotations);
        microvm_machine(&mut m);
        let kept: Vec<&str> = m.labels().keys().map(String::as_str).collect();
        assert_eq!(kept, read_labels);
        let mut want = read_annotations.to_vec();
        want.sort_unstable();
        let kept: Vec<&str> = m.annotations().keys().map(String::as_str).collect();
        assert_eq!(kept, want);

        // CAPI's annotations only: an empty map, not none.
        let mut clone = named("c");
        clone.metadata.annotations = Some(
            [(CLONED_FROM_NAME_ANNOTATION.to_string(), "t".to_string())]
                .into_iter()
                .collect(),
        );
        microvm_machine(&mut clone);
        assert_eq!(clone.metadata.annotations, Some(Default::default()));
    }
}
