//! Builders for observations: a valid, fully gated-open machine that tests then bend one way.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use capmvm_api::capi::{
    Bootstrap, Cluster, ClusterInitialization, ClusterSpec, ClusterStatus,
    ContractVersionedObjectReference, Machine, MachineSpec,
};
use capmvm_api::keys::{CLUSTER_NAME_LABEL, CONTROL_PLANE_LABEL, MACHINE_FINALIZER};
use capmvm_api::*;
use capmvm_reconcile::VmState;
use capmvm_reconcile::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

pub const MACHINE_UID: &str = "8c1e1d2a-5b8e-4b1e-9a51-0d6a3f1c2b7e";
/// The identity of the operator process deciding in these tests.
pub const OPERATOR: &str = "capmvm-0_4242_17";
pub const HOSTS: [&str; 3] = ["10.0.0.1:9090", "10.0.0.2:9090", "10.0.0.3:9090"];

pub fn now() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap()
}

pub fn later() -> Timestamp {
    Timestamp::from_second(1_800_000_100).unwrap()
}

pub fn machine_spec() -> MicrovmMachineSpec {
    MicrovmMachineSpec {
        provider: None,
        vcpu: 2,
        memory_mb: 2048,
        root_volume: Volume {
            id: "root".into(),
            image: Some("ghcr.io/liquidmetal-dev/capmvm-kubernetes:1.23.5".into()),
            ..Default::default()
        },
        volumes: vec![],
        kernel: Kernel {
            image: "ghcr.io/liquidmetal-dev/kernel-bin:5.10.77".into(),
            filename: "boot/vmlinux".into(),
        },
        kernel_cmdline: BTreeMap::new(),
        initrd: None,
        network_interfaces: vec![NetworkInterface {
            guest_device_name: "eth1".into(),
            guest_mac: None,
            iface_type: IfaceType::Tap,
            address: Some("10.0.0.50/24".into()),
            gateway: Some("10.0.0.1".into()),
            nameservers: vec![],
        }],
        labels: BTreeMap::new(),
        ssh_public_keys: vec![],
        host_selector: None,
        provider_id: None,
    }
}

pub fn microvm_machine() -> MicrovmMachine {
    let mut m = MicrovmMachine::new("m1", machine_spec());
    m.metadata = ObjectMeta {
        name: Some("m1".into()),
        namespace: Some("default".into()),
        uid: Some(MACHINE_UID.into()),
        generation: Some(1),
        labels: Some(BTreeMap::from([(
            CLUSTER_NAME_LABEL.to_string(),
            "demo".to_string(),
        )])),
        ..Default::default()
    };
    m
}

pub fn owner() -> Machine {
    let mut m = Machine::new(
        "m1",
        MachineSpec {
            cluster_name: "demo".into(),
            bootstrap: Bootstrap {
                data_secret_name: Some("m1-bootstrap".into()),
                ..Default::default()
            },
            infrastructure_ref: ContractVersionedObjectReference {
                api_group: GROUP.into(),
                kind: "MicrovmMachine".into(),
                name: "m1".into(),
            },
            ..Default::default()
        },
    );
    m.metadata.namespace = Some("default".into());
    m
}

pub fn control_plane_owner() -> Machine {
    let mut m = owner();
    m.metadata.labels = Some(BTreeMap::from([(
        CONTROL_PLANE_LABEL.to_string(),
        String::new(),
    )]));
    m
}

pub fn cluster() -> Cluster {
    let mut c = Cluster::new(
        "demo",
        ClusterSpec {
            infrastructure_ref: Some(ContractVersionedObjectReference {
                api_group: GROUP.into(),
                kind: "MicrovmCluster".into(),
                name: "demo".into(),
            }),
            ..Default::default()
        },
    );
    c.metadata.namespace = Some("default".into());
    c.status = Some(ClusterStatus {
        initialization: Some(ClusterInitialization {
            infrastructure_provisioned: Some(true),
        }),
    });
    c
}

pub fn microvm_cluster() -> MicrovmCluster {
    let mut mc = MicrovmCluster::new(
        "demo",
        MicrovmClusterSpec {
            control_plane_endpoint: Some(ApiEndpoint {
                host: Some("10.0.0.100".into()),
                port: Some(6443),
            }),
            ssh_public_keys: vec![SshPublicKey {
                user: "ubuntu".into(),
                authorized_keys: vec!["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHmW0bV5Ckb2wA1X8nN2xY2q8C0Qe4yN6q3yF0z1xk7P ops".into()],
            }],
            placement: Placement {
                static_pool: Some(StaticPoolPlacement {
                    hosts: vec![
                        MicrovmHost {
                            controlplane_allowed: true,
                            failure_domain: Some("r1".into()),
                            ..MicrovmHost::new(Some("host-a"), HOSTS[0])
                        },
                        MicrovmHost {
                            controlplane_allowed: false,
                            failure_domain: Some("r1".into()),
                            ..MicrovmHost::new(Some("host-b"), HOSTS[1])
                        },
                        MicrovmHost {
                            controlplane_allowed: true,
                            failure_domain: None,
                            ..MicrovmHost::new(Some("host-c"), HOSTS[2])
                        },
                    ],
                    basic_auth_secret: None,
                }),
            },
            microvm_proxy: None,
            tls_secret_ref: None,
        },
    );
    mc.metadata.namespace = Some("default".into());
    mc.metadata.generation = Some(1);
    mc
}

pub fn reachable_hosts() -> BTreeMap<String, HostFacts> {
    HOSTS
        .iter()
        .map(|h| {
            (
                h.to_string(),
                HostFacts {
                    reachability: Reachability::Reachable,
                    ..Default::default()
                },
            )
        })
        .collect()
}

pub fn bootstrap() -> BootstrapData {
    BootstrapData::Found {
        value: Some(Sensitive::new(
            b"#cloud-config\nruncmd: [kubeadm join]\n".to_vec(),
        )),
        format: Some("cloud-config".into()),
    }
}

/// A machine whose every gate is open and which has no microVM and no recorded host yet (nor the
/// finalizer, which is added with the host).
pub fn observed() -> ObservedMachine {
    ObservedMachine {
        machine: microvm_machine(),
        owner: Some((&owner()).into()),
        machine_pool: None,
        cluster: Some((&cluster()).into()),
        infra_cluster: Some(std::sync::Arc::new(microvm_cluster())),
        bootstrap: bootstrap(),
        hosts: reachable_hosts(),
        recorded_host: HostLookup::NotAsked,
        operator: OPERATOR.into(),
        claim_seen_for: None,
        failed_host_call: None,
        evacuation: None,
    }
}

pub fn vm(uid: &str, state: VmState, ours: bool) -> ObservedVm {
    ObservedVm {
        uid: uid.into(),
        namespace: "default".into(),
        name: "m1".into(),
        state,
        retry: 0,
        machine_uid: ours.then(|| MACHINE_UID.to_string()),
        cluster: None,
        running: Some(running_spec()),
    }
}

/// What a microVM created from [`machine_spec`] runs with.
pub fn running_spec() -> RunningSpec {
    let spec = machine_spec();
    RunningSpec {
        vcpu: spec.vcpu,
        memory_mb: spec.memory_mb,
        kernel_image: spec.kernel.image.into(),
        root_volume_image: spec.root_volume.image.map(Into::into),
    }
}

/// Records the host and origin-uid annotations (the machine was placed) without providerID, with
/// the finalizer added in the same write.
pub fn with_recorded_host(obs: &mut ObservedMachine, host: &str) {
    let finalizers = obs.machine.metadata.finalizers.get_or_insert_default();
    if !finalizers.iter().any(|f| f == MACHINE_FINALIZER) {
        finalizers.push(MACHINE_FINALIZER.to_string());
    }
    let annotations = obs
        .machine
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    annotations.insert(capmvm_api::keys::HOST_ANNOTATION.to_string(), host.into());
    annotations.insert(
        capmvm_api::keys::ORIGIN_UID_ANNOTATION.to_string(),
        MACHINE_UID.into(),
    );
}

/// The uid the object has on the target cluster after `clusterctl move`.
pub const MOVED_UID: &str = "0b7d4c11-9e2f-4c6a-8d3b-5e1f2a9c7d40";

/// What `clusterctl move` does to the object: recreated with a new uid, annotations and spec kept,
/// status lost.
pub fn moved(obs: &mut ObservedMachine) {
    obs.machine.metadata.uid = Some(MOVED_UID.into());
    obs.machine.status = None;
}

pub fn with_provider_id(obs: &mut ObservedMachine, host: &str, uid: &str) {
    obs.machine.spec.provider_id = Some(format!("microvm://{host}/{uid}"));
    with_recorded_host(obs, host);
    obs.machine.status.get_or_insert_with(Default::default).host = Some(host.into());
}

pub fn deleting(obs: &mut ObservedMachine) {
    obs.machine.metadata.deletion_timestamp = Some(Time(now()));
}

pub fn ready(plan: &MachinePlan) -> (String, String, String) {
    let c = plan
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready is always set")
        .clone();
    (c.status, c.reason, c.message)
}

pub fn creates(plan: &MachinePlan) -> Vec<(String, Box<capmvm_reconcile::microvm::MicrovmSpec>)> {
    plan.creates()
        .map(|(host, spec)| (host.to_string(), Box::new(spec.clone())))
        .collect()
}

pub fn deletes(plan: &MachinePlan) -> Vec<(String, String)> {
    plan.deletes()
        .map(|(host, uid)| (host.to_string(), uid.to_string()))
        .collect()
}

pub fn event_reasons(plan: &MachinePlan) -> Vec<&'static str> {
    plan.events.iter().map(|e| e.reason).collect()
}

/// What the operator gathers for the `microvm_cluster()` fixture: owned, every host reachable, no
/// machines, microVMs or Secrets.
pub fn observed_cluster() -> ObservedCluster {
    ObservedCluster {
        microvm_cluster: microvm_cluster(),
        owner: Some((&cluster()).into()),
        hosts: reachable_hosts(),
        machines: Vec::new(),
        known_machine_uids: Default::default(),
        shared_hosts: Default::default(),
        microvms: Vec::new(),
        credential_secrets: Vec::new(),
        protected_secrets: Vec::new(),
        named_by_others: Default::default(),
        sees_every_cluster: true,
    }
}

/// Asserts a condition's status and reason (given as [`ready`] and [`cluster_condition`] return it)
/// and returns its message, for the test to check.
#[track_caller]
pub fn expect_condition(condition: (String, String, String), expected: (&str, &str)) -> String {
    let (status, reason, message) = condition;
    assert_eq!((status.as_str(), reason.as_str()), expected);
    message
}

/// Condition `t` of a MicrovmCluster plan's status: (status, reason, message).
pub fn cluster_condition(plan: &ClusterPlan, t: &str) -> (String, String, String) {
    let c = plan
        .status
        .as_ref()
        .expect("a status")
        .conditions
        .iter()
        .find(|c| c.type_ == t)
        .unwrap_or_else(|| panic!("no condition {t}"));
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

/// The recorded host's answer: it holds `vms`.
pub fn answered(vms: Vec<ObservedVm>) -> HostLookup {
    HostLookup::Answered { vms }
}

/// A machine placed on `host` (see [`with_recorded_host`]) whose host answers with `vms`.
pub fn placed_on(host: &str, vms: Vec<ObservedVm>) -> ObservedMachine {
    let mut obs = observed();
    with_recorded_host(&mut obs, host);
    obs.recorded_host = answered(vms);
    obs
}

/// Asserts the plan writes the providerID of microVM `uid` on `host`: it adopted that microVM.
#[track_caller]
pub fn assert_adopted(plan: &MachinePlan, host: &str, uid: &str) {
    assert_eq!(plan.provider_id, Some(format!("microvm://{host}/{uid}")));
}

/// The MicrovmCluster's static pool, for tests that bend it.
pub fn static_pool(obs: &mut ObservedCluster) -> &mut StaticPoolPlacement {
    obs.microvm_cluster
        .spec
        .placement
        .static_pool
        .as_mut()
        .expect("the fixture has a static pool")
}
