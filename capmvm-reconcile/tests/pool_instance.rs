//! The machine engine for a pool's instance (a MicrovmMachine labelled with a pool name and owned by a
//! MicrovmMachinePool): it is placed once core's Machine owns it, its bootstrap data is always the
//! MachinePool's, and its failure domain is the one the pool chose.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use capmvm_api::capi::{MachinePool, MachinePoolSpec};
use capmvm_api::conditions::reasons;
use capmvm_api::keys::{POOL_FAILURE_DOMAIN_ANNOTATION, POOL_NAME_LABEL};
use capmvm_reconcile::machine::{instance_pool, wants_bootstrap_data};
use capmvm_reconcile::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use support::*;

const POOL_SECRET: &str = "workers-bootstrap";

fn machine_pool(secret: Option<&str>) -> MachinePool {
    let mut mp = MachinePool::new(
        "workers",
        MachinePoolSpec {
            cluster_name: "demo".into(),
            replicas: Some(3),
            ..Default::default()
        },
    );
    mp.metadata.namespace = Some("default".into());
    mp.spec.template.spec.bootstrap.data_secret_name = secret.map(str::to_string);
    mp
}

/// An instance the pool just created: no Machine yet, owned by its MachinePool.
fn instance() -> ObservedMachine {
    let mut obs = observed();
    let meta = &mut obs.machine.metadata;
    meta.labels
        .get_or_insert_default()
        .insert(POOL_NAME_LABEL.into(), "workers".into());
    meta.owner_references = Some(vec![OwnerReference {
        api_version: "infrastructure.cluster.x-k8s.io/v1alpha2".into(),
        kind: "MicrovmMachinePool".into(),
        name: "workers".into(),
        uid: "pool-uid".into(),
        ..Default::default()
    }]);
    obs.owner = None;
    obs.machine_pool = Some((&machine_pool(Some(POOL_SECRET))).into());
    obs
}

/// The Machine core creates for an instance: `dataSecretName: ""` (bootstrap treated as done).
fn with_core_machine(obs: &mut ObservedMachine) {
    let mut m = owner();
    m.spec.bootstrap.data_secret_name = Some(String::new());
    obs.owner = Some((&m).into());
}

/// An instance core has adopted: its Machine owns it.
fn adopted() -> ObservedMachine {
    let mut obs = instance();
    with_core_machine(&mut obs);
    obs
}

#[test]
fn an_instance_is_recognised_by_label_and_pool_owner() {
    let obs = instance();
    assert_eq!(instance_pool(&obs.machine), Some("workers"));
    // The label alone is not enough (a person may copy labels), nor an ownerReference alone.
    let mut unlabelled = instance();
    unlabelled.machine.metadata.labels = None;
    assert_eq!(instance_pool(&unlabelled.machine), None);
    assert_eq!(instance_pool(&observed().machine), None);
}

/// Core adopts a new instance (its Machine becomes the instance's owner) moments after the pool
/// creates it. A placement decided before would record the host by a write conditional on the
/// instance's version, which adoption changes: a lost compare-and-swap, a second write. So the
/// instance waits for its Machine, quietly (a brand-new object's wait is not written), as CAPD's
/// DockerMachine does, and is then placed with the MachinePool's bootstrap data.
#[test]
fn an_instance_is_placed_only_once_cores_machine_owns_it() {
    let mut obs = instance();
    obs.machine.metadata.creation_timestamp = Some(Time(now()));
    let plan = decide(&obs, now());
    assert!(creates(&plan).is_empty(), "{plan:#?}");
    assert!(
        plan.record_host.is_none() && !plan.add_finalizer,
        "no write before adoption: {:?}",
        plan
    );
    assert_eq!(
        plan.status, None,
        "a brand-new instance's short wait writes nothing"
    );
    // Past the grace, the wait says what for.
    let (_, reason, message) = ready(&decide(&obs, later()));
    assert_eq!(reason, reasons::WAITING_FOR_OWNER);
    assert!(
        message.contains("create the Machine of this instance of MachinePool \"workers\""),
        "{message}"
    );

    let obs = adopted();
    assert_eq!(wants_bootstrap_data(&obs), Some(POOL_SECRET));
    assert_eq!(creates(&decide(&obs, now())).len(), 1);
}

/// An instance placed already (its host recorded) before core's Machine showed is not held back:
/// its create is retried, and it is adopted or observed as any machine.
#[test]
fn an_instance_placed_before_its_machine_showed_carries_on() {
    let mut obs = instance();
    with_recorded_host(&mut obs, HOSTS[1]);
    obs.recorded_host = answered(vec![]);
    let plan = decide(&obs, now());
    assert_eq!(creates(&plan).len(), 1, "{plan:#?}");
    assert_eq!(creates(&plan)[0].0, HOSTS[1]);
}

#[test]
fn an_instance_with_its_machine_still_reads_the_machine_pools_secret() {
    let mut obs = instance();
    with_core_machine(&mut obs);
    assert_eq!(
        wants_bootstrap_data(&obs),
        Some(POOL_SECRET),
        "core's empty dataSecretName is never the source"
    );
    assert_eq!(creates(&decide(&obs, now())).len(), 1);
}

#[test]
fn an_instance_without_a_machine_pool_waits_for_its_owner() {
    let mut obs = instance();
    obs.machine_pool = None;
    let plan = decide(&obs, now());
    assert!(creates(&plan).is_empty());
    let (_, reason, message) = ready(&plan);
    assert_eq!(reason, reasons::WAITING_FOR_OWNER);
    assert!(
        message.contains("MicrovmMachinePool \"workers\""),
        "{message}"
    );
}

#[test]
fn an_instance_waits_for_the_machine_pools_bootstrap_secret() {
    for secret in [None, Some("")] {
        let mut obs = instance();
        with_core_machine(&mut obs);
        obs.machine_pool = Some((&machine_pool(secret)).into());
        assert_eq!(wants_bootstrap_data(&obs), None);
        let plan = decide(&obs, now());
        assert!(creates(&plan).is_empty());
        let (_, reason, message) = ready(&plan);
        assert_eq!(reason, reasons::WAITING_FOR_BOOTSTRAP_DATA);
        assert!(message.contains("MachinePool"), "{message}");
    }
}

#[test]
fn an_instance_is_placed_in_the_failure_domain_the_pool_chose() {
    let mut obs = adopted();
    // host-c (no failure domain) is the least allocated: without the pool's choice it would win.
    obs.hosts.get_mut(HOSTS[0]).unwrap().allocated_vcpu = 8;
    obs.hosts.get_mut(HOSTS[1]).unwrap().allocated_vcpu = 4;
    assert_eq!(creates(&decide(&obs, now()))[0].0, HOSTS[2]);
    obs.machine
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(POOL_FAILURE_DOMAIN_ANNOTATION.into(), "r1".into());
    assert_eq!(creates(&decide(&obs, now()))[0].0, HOSTS[1]);
    // The Machine's failure domain (core sets none for MachinePool Machines) does not override it.
    obs.owner.as_mut().unwrap().failure_domain = Some("elsewhere".into());
    assert_eq!(creates(&decide(&obs, now()))[0].0, HOSTS[1]);
}

#[test]
fn a_plain_machine_ignores_a_machine_pool() {
    let mut obs = observed();
    obs.machine_pool = Some((&machine_pool(Some(POOL_SECRET))).into());
    assert_eq!(wants_bootstrap_data(&obs), Some("m1-bootstrap"));
    obs.owner = None;
    assert!(creates(&decide(&obs, now())).is_empty());
}

#[test]
fn an_instance_create_is_announced_by_its_pool_not_by_an_event_of_its_own() {
    // The pool's `InstancesCreated` event names its new instances; an Event per instance would be a
    // fifth write per instance and a flood when an autoscaler grows the pool.
    let plan = decide(&adopted(), now());
    assert_eq!(creates(&plan).len(), 1, "{plan:#?}");
    assert!(
        !event_reasons(&plan).contains(&plan::reasons::MICROVM_CREATED),
        "{:?}",
        event_reasons(&plan)
    );
    // A machine of a MachineDeployment still records its create.
    let plan = decide(&observed(), now());
    assert_eq!(creates(&plan).len(), 1, "{plan:#?}");
    assert!(event_reasons(&plan).contains(&plan::reasons::MICROVM_CREATED));
}
