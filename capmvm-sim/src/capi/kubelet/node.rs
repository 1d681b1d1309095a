//! The Node a hollow kubelet registers: what a real kubelet reports of a microVM of this size.

use std::collections::BTreeMap;
use std::hash::{Hash as _, Hasher as _};

use capmvm_flintlock::Microvm;
use k8s_openapi::api::core::v1::{
    Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus, NodeSystemInfo,
    Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::boot::KubeletBoot;

/// A stable 128-bit digest of `parts`, as 32 lower-case hex digits.
pub(super) fn digest(parts: &[&str]) -> String {
    let half = |seed: u64| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        seed.hash(&mut h);
        parts.hash(&mut h);
        h.finish()
    };
    format!("{:016x}{:016x}", half(1), half(2))
}

fn as_uuid(hex: &str) -> String {
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The kernel version a microVM runs: the tag of its kernel image (`kernel-bin:5.10.77`).
fn kernel_version(microvm: &Microvm) -> String {
    microvm
        .spec
        .kernel
        .image
        .rsplit_once(':')
        .map(|(_, tag)| tag)
        .filter(|t| !t.is_empty() && !t.contains('/'))
        .unwrap_or("5.10.77")
        .to_string()
}

/// The Node a kubelet registers for `microvm`.
pub(super) fn node_object(
    kubelet: &KubeletBoot,
    microvm: &Microvm,
    version: &str,
    ready: bool,
) -> Node {
    let uid = microvm.uid();
    let vcpu = if microvm.spec.vcpu > 0 {
        microvm.spec.vcpu
    } else {
        2
    };
    let memory_kib = i64::from(if microvm.spec.memory_mb > 0 {
        microvm.spec.memory_mb
    } else {
        1024
    }) * 1024;
    // The kubelet reserves the default hard eviction threshold (memory.available < 100Mi).
    let allocatable_kib = (memory_kib - 100 * 1024).max(0);
    let quantities = |memory: i64| {
        BTreeMap::from([
            ("cpu".to_string(), Quantity(vcpu.to_string())),
            (
                "ephemeral-storage".to_string(),
                Quantity("10218772Ki".into()),
            ),
            ("hugepages-1Gi".to_string(), Quantity("0".into())),
            ("hugepages-2Mi".to_string(), Quantity("0".into())),
            ("memory".to_string(), Quantity(format!("{memory}Ki"))),
            ("pods".to_string(), Quantity("110".into())),
        ])
    };
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let condition = |type_: &str, status: &str, reason: &str, message: &str| NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
    };
    let mut labels = BTreeMap::from([
        ("beta.kubernetes.io/arch".to_string(), "amd64".to_string()),
        ("beta.kubernetes.io/os".to_string(), "linux".to_string()),
        ("kubernetes.io/arch".to_string(), "amd64".to_string()),
        (
            "kubernetes.io/hostname".to_string(),
            kubelet.node_name.clone(),
        ),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
    ]);
    let mut taints = None;
    if kubelet.control_plane {
        // What kubeadm init (or join --control-plane) puts on the Node.
        labels.insert(
            "node-role.kubernetes.io/control-plane".to_string(),
            String::new(),
        );
        taints = Some(vec![Taint {
            key: "node-role.kubernetes.io/control-plane".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }]);
    }
    let machine_id = digest(&["machine-id", uid]);
    Node {
        metadata: ObjectMeta {
            name: Some(kubelet.node_name.clone()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                "volumes.kubernetes.io/controller-managed-attach-detach".to_string(),
                "true".to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: kubelet.provider_id.clone(),
            taints,
            ..Default::default()
        }),
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "Hostname".into(),
                address: kubelet.node_name.clone(),
            }]),
            capacity: Some(quantities(memory_kib)),
            allocatable: Some(quantities(allocatable_kib)),
            conditions: Some(vec![
                condition(
                    "MemoryPressure",
                    "False",
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                ),
                condition(
                    "DiskPressure",
                    "False",
                    "KubeletHasNoDiskPressure",
                    "kubelet has no disk pressure",
                ),
                condition(
                    "PIDPressure",
                    "False",
                    "KubeletHasSufficientPID",
                    "kubelet has sufficient PID available",
                ),
                if ready {
                    condition(
                        "Ready",
                        "True",
                        "KubeletReady",
                        "kubelet is posting ready status",
                    )
                } else {
                    condition(
                        "Ready",
                        "False",
                        "KubeletNotReady",
                        "container runtime is down",
                    )
                },
            ]),
            daemon_endpoints: Some(NodeDaemonEndpoints {
                kubelet_endpoint: Some(k8s_openapi::api::core::v1::DaemonEndpoint { port: 10250 }),
            }),
            node_info: Some(NodeSystemInfo {
                architecture: "amd64".into(),
                boot_id: as_uuid(&digest(&["boot-id", uid, &now.0.to_string()])),
                container_runtime_version: "containerd://1.7.27".into(),
                kernel_version: kernel_version(microvm),
                kube_proxy_version: version.to_string(),
                kubelet_version: version.to_string(),
                machine_id: machine_id.clone(),
                operating_system: "linux".into(),
                os_image: "Ubuntu 22.04.5 LTS".into(),
                // MicroVMs have no swap device, and a kubelet without swap leaves `swap` out: the
                // real API server refuses a capacity of 0 ("must be greater than zero").
                swap: None,
                system_uuid: as_uuid(&digest(&["system-uuid", uid])),
            }),
            ..Default::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_node_reports_what_a_kubelet_reports() {
        let mut microvm = Microvm::default();
        microvm.spec.uid = Some("01KE75BHT9H6D7V5YG0KYGRXX2".into());
        microvm.spec.vcpu = 4;
        microvm.spec.memory_mb = 2048;
        microvm.spec.kernel.image = "ghcr.io/liquidmetal-dev/kernel-bin:5.10.77".into();
        let kubelet = KubeletBoot {
            node_name: "cp-0".into(),
            provider_id: Some("microvm://h:1/01KE75BHT9H6D7V5YG0KYGRXX2".into()),
            control_plane: true,
        };
        let node = node_object(&kubelet, &microvm, "v1.32.4", true);
        let status = node.status.unwrap();
        let info = status.node_info.unwrap();
        assert_eq!(info.kubelet_version, "v1.32.4");
        assert_eq!(info.kernel_version, "5.10.77");
        assert_eq!(info.swap, None, "a kubelet without swap reports none");
        assert_eq!(info.machine_id.len(), 32);
        assert_eq!(info.system_uuid.len(), 36);
        let capacity = status.capacity.unwrap();
        assert_eq!(capacity["cpu"], Quantity("4".into()));
        assert_eq!(capacity["memory"], Quantity("2097152Ki".into()));
        assert_eq!(capacity["pods"], Quantity("110".into()));
        assert_eq!(
            status.allocatable.unwrap()["memory"],
            Quantity("1994752Ki".into())
        );
        let ready = status
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.status, "True");
        assert!(
            node.metadata
                .labels
                .unwrap()
                .contains_key("node-role.kubernetes.io/control-plane")
        );
        assert_eq!(
            node.spec.unwrap().provider_id.as_deref(),
            Some("microvm://h:1/01KE75BHT9H6D7V5YG0KYGRXX2")
        );
    }
}
