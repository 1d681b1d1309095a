//! Embedding the decision engine: build an observation of a MicrovmMachine, call
//! `capmvm_reconcile::decide`, and print the plan. No cluster, no host, no async runtime.
//!
//! The loop below is a miniature operator: it carries out each plan's metadata effects on its copy of
//! the machine and pretends to be the flintlock host, until the machine is Ready.
//!
//! ```sh
//! cargo run -p capmvm-reconcile --example decide
//! ```

use std::collections::BTreeMap;

use capmvm_api::capi::{
    Bootstrap, Cluster, ClusterInitialization, ClusterSpec, ClusterStatus,
    ContractVersionedObjectReference, Machine, MachineSpec,
};
use capmvm_api::keys::{
    HOST_ANNOTATION, MACHINE_FINALIZER, ORIGIN_UID_ANNOTATION, PLACEMENT_ATTEMPT_ANNOTATION,
    PLACEMENT_CLAIM_ANNOTATION,
};
use capmvm_api::{GROUP, HostEndpoint, MicrovmCluster, MicrovmMachine};
use capmvm_reconcile::{
    BootstrapData, HostCall, HostFacts, HostLookup, HostRecord, MachinePlan, ObservedMachine,
    ObservedVm, Reachability, Requeue, RunningSpec, Sensitive, VmState, decide,
};
use k8s_openapi::jiff::Timestamp;

/// The repository's examples, as a user would write them.
const MICROVM_CLUSTER: &str = include_str!("../../examples/microvmcluster.yaml");
const MICROVM_MACHINE: &str = include_str!("../../examples/microvmmachine.yaml");

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let infra_cluster: MicrovmCluster = serde_saphyr::from_str(MICROVM_CLUSTER)?;
    let mut machine: MicrovmMachine = serde_saphyr::from_str(MICROVM_MACHINE)?;
    // What the API server assigns on create.
    machine.metadata.uid = Some("6f1c1f0e-2a4b-4c8e-9d7a-1b2c3d4e5f60".to_string());
    let namespace = machine.metadata.namespace.clone().unwrap_or_default();
    let name = machine.metadata.name.clone().unwrap_or_default();

    // Every host of the pool answers and has room.
    let mut hosts = BTreeMap::new();
    for host in infra_cluster
        .spec
        .placement
        .static_pool
        .iter()
        .flat_map(|pool| &pool.hosts)
    {
        let endpoint: HostEndpoint = host.endpoint.parse()?;
        let facts = HostFacts {
            reachability: Reachability::Reachable,
            ..Default::default()
        };
        hosts.insert(endpoint.to_string(), facts);
    }

    let owner = owner_machine(&machine, &namespace, &name);
    let mut observed = ObservedMachine {
        machine,
        owner: Some((&owner).into()),
        machine_pool: None,
        cluster: Some((&provisioned_cluster(&namespace)).into()),
        infra_cluster: Some(std::sync::Arc::new(infra_cluster)),
        bootstrap: BootstrapData::Found {
            value: Some(Sensitive::new(
                b"#cloud-config\nruncmd: [kubeadm init]\n".to_vec(),
            )),
            format: Some("cloud-config".to_string()),
        },
        hosts,
        recorded_host: HostLookup::NotAsked,
        operator: "decide-example".to_string(),
        claim_seen_for: None,
        failed_host_call: None,
        evacuation: None,
    };

    let mut now = Timestamp::from_second(1_800_000_000)?;
    for step in 1..=5 {
        let plan = decide(&observed, now);
        println!("--- decision {step} at {now}");
        for step in describe(&plan) {
            println!("  step: {step}");
        }
        if let Some(status) = &plan.status {
            for c in &status.conditions {
                println!(
                    "  condition: {}={} ({}) {}",
                    c.type_, c.status, c.reason, c.message
                );
            }
        }
        println!("  requeue: {:?}", plan.requeue);

        // Carry the plan out on our copy, as the operator does against the API and the host.
        let mut vms = match &observed.recorded_host {
            HostLookup::Answered { vms } => vms.clone(),
            _ => Vec::new(),
        };
        let meta = &mut observed.machine.metadata;
        if plan.add_finalizer {
            meta.finalizers
                .get_or_insert_with(Vec::new)
                .push(MACHINE_FINALIZER.to_string());
        }
        if let Some(HostRecord {
            host,
            origin_uid,
            attempt,
            claim,
        }) = plan.record_host.clone()
        {
            let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
            annotations.insert(HOST_ANNOTATION.to_string(), host.to_string());
            annotations.insert(ORIGIN_UID_ANNOTATION.to_string(), origin_uid);
            annotations.insert(
                PLACEMENT_ATTEMPT_ANNOTATION.to_string(),
                attempt.to_string(),
            );
            annotations.insert(PLACEMENT_CLAIM_ANNOTATION.to_string(), claim);
        }
        if let Some(id) = plan.provider_id.clone() {
            observed.machine.spec.provider_id = Some(id);
        }
        for (_, spec) in plan.creates() {
            vms.push(ObservedVm {
                uid: "01J9Z3Q4S5T6V7W8X9Y0ZABCDE".to_string(),
                namespace: spec.namespace.clone(),
                name: spec.id.clone(),
                // The host boots it at once, for the example's sake.
                state: VmState::Created,
                retry: 0,
                machine_uid: observed.machine.metadata.uid.clone(),
                cluster: None,
                running: Some(RunningSpec {
                    vcpu: i64::from(spec.vcpu),
                    memory_mb: i64::from(spec.memory_mb),
                    kernel_image: spec.kernel.image.as_str().into(),
                    root_volume_image: spec
                        .root_volume
                        .as_ref()
                        .and_then(|v| v.source.container_source.as_deref().map(Into::into)),
                }),
            });
        }
        if let Some(status) = plan.status {
            observed.machine.status = Some(status);
        }
        observed.recorded_host = HostLookup::Answered { vms };
        if plan.requeue != Requeue::Immediately {
            println!(
                "--- settled: providerID {}",
                observed
                    .machine
                    .spec
                    .provider_id
                    .as_deref()
                    .unwrap_or("(none)")
            );
            break;
        }
        now = now.checked_add(std::time::Duration::from_secs(1))?;
    }
    Ok(())
}

/// One line per step of the plan, in its order; a create shows its size, never its cloud-init
/// (user-data holds secrets).
fn describe(plan: &MachinePlan) -> Vec<String> {
    let mut steps = Vec::new();
    if plan.add_finalizer {
        steps.push("add the finalizer".to_string());
    }
    if let Some(HostRecord {
        host,
        origin_uid,
        attempt,
        ..
    }) = &plan.record_host
    {
        steps.push(format!(
            "record host {host}, origin uid {origin_uid} and placement attempt {attempt} (annotations, one conditional write)"
        ));
    }
    if let Some(id) = &plan.provider_id {
        steps.push(format!("set providerID {id}"));
    }
    for call in &plan.host_calls {
        steps.push(match call {
            HostCall::Create { host, spec } => format!(
                "create microVM {}/{} on {host}: {} vCPU, {} MiB",
                spec.namespace, spec.id, spec.vcpu, spec.memory_mb
            ),
            HostCall::Delete { host, uid } => format!("delete microVM {uid} on {host}"),
        });
    }
    for e in &plan.events {
        steps.push(format!("event {:?} {}: {}", e.kind, e.reason, e.note));
    }
    if plan.remove_finalizer {
        steps.push("remove the finalizer".to_string());
    }
    steps
}

/// The CAPI Machine that owns the MicrovmMachine, its bootstrap data ready. CAPI copies a Machine's
/// labels (`cluster.x-k8s.io/control-plane` among them) onto the MicrovmMachine it clones, so the
/// owner carries the same.
fn owner_machine(machine: &MicrovmMachine, namespace: &str, name: &str) -> Machine {
    let mut owner = Machine::new(
        name,
        MachineSpec {
            cluster_name: "demo".to_string(),
            bootstrap: Bootstrap {
                data_secret_name: Some(format!("{name}-bootstrap")),
                ..Default::default()
            },
            infrastructure_ref: ContractVersionedObjectReference {
                api_group: GROUP.to_string(),
                kind: "MicrovmMachine".to_string(),
                name: name.to_string(),
            },
            ..Default::default()
        },
    );
    owner.metadata.namespace = Some(namespace.to_string());
    owner.metadata.labels = machine.metadata.labels.clone();
    owner
}

/// The CAPI Cluster, its infrastructure provisioned.
fn provisioned_cluster(namespace: &str) -> Cluster {
    let mut cluster = Cluster::new(
        "demo",
        ClusterSpec {
            infrastructure_ref: Some(ContractVersionedObjectReference {
                api_group: GROUP.to_string(),
                kind: "MicrovmCluster".to_string(),
                name: "demo".to_string(),
            }),
            ..Default::default()
        },
    );
    cluster.metadata.namespace = Some(namespace.to_string());
    cluster.status = Some(ClusterStatus {
        initialization: Some(ClusterInitialization {
            infrastructure_provisioned: Some(true),
        }),
    });
    cluster
}
