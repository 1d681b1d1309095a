//! `decide_pool`: scale, the autoscaler's pick, rolls within maxSurge / maxUnavailable, bootstrap-only
//! changes, repair, deletion; and a property test stepping a small world model (instances get their
//! Machine, become ready, and go once their Machine is deleted, in any interleaving).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeSet;

use capmvm_api::capi::{MachinePool, MachinePoolSpec};
use capmvm_api::conditions::{reasons, types};
use capmvm_api::keys::{
    CLUSTER_NAME_LABEL, POOL_FINALIZER, POOL_NAME_LABEL, TEMPLATE_HASH_ANNOTATION,
};
use capmvm_api::*;
use capmvm_reconcile::pool::*;
use capmvm_reconcile::{Requeue, conditions};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use proptest::prelude::*;
use support::{cluster, machine_spec, microvm_cluster};

fn pool(surge: i32, unavailable: i32, policy: DeletePolicy) -> MicrovmMachinePool {
    let mut p = MicrovmMachinePool::new(
        "workers",
        MicrovmMachinePoolSpec {
            template: machine_spec(),
            strategy: PoolStrategy {
                strategy_type: PoolStrategyType::RollingUpdate,
                rolling_update: Some(RollingUpdate {
                    max_surge: Some(IntOrString::Int(surge)),
                    max_unavailable: Some(IntOrString::Int(unavailable)),
                    delete_policy: Some(policy),
                }),
            },
            provider_id_list: vec![],
            provider_id: None,
        },
    );
    p.metadata = ObjectMeta {
        name: Some("workers".into()),
        namespace: Some("default".into()),
        uid: Some("pool-uid-1".into()),
        generation: Some(1),
        labels: Some([(CLUSTER_NAME_LABEL.to_string(), "demo".to_string())].into()),
        ..Default::default()
    };
    p
}

fn machine_pool(replicas: i32) -> MachinePool {
    let mut mp = MachinePool::new(
        "workers",
        MachinePoolSpec {
            cluster_name: "demo".into(),
            replicas: Some(replicas),
            ..Default::default()
        },
    );
    mp.spec.template.spec.bootstrap.data_secret_name = Some("workers-bootstrap".into());
    mp
}

/// A world of one pool: the engine decides, the plan is applied, and CAPI and the hosts move on.
struct World {
    obs: ObservedPool,
    clock: i64,
}

impl World {
    fn new(replicas: i32, surge: i32, unavailable: i32, policy: DeletePolicy) -> Self {
        Self {
            obs: ObservedPool {
                pool: pool(surge, unavailable, policy),
                machine_pool: Some((&machine_pool(replicas)).into()),
                cluster: Some((&cluster()).into()),
                infra_cluster: Some(std::sync::Arc::new(microvm_cluster())),
                instances: vec![],
                reserved_names: BTreeSet::new(),
                last_status_write: None,
            },
            clock: 1_800_000_000,
        }
    }

    fn now(&self) -> Timestamp {
        Timestamp::from_second(self.clock).unwrap()
    }

    fn set_replicas(&mut self, replicas: i32) {
        self.obs.machine_pool.as_mut().unwrap().desired_replicas = replicas.max(0);
    }

    fn decide(&self) -> PoolPlan {
        decide_pool(&self.obs, self.now())
    }

    /// Decides and applies the plan, as the operator would.
    fn step(&mut self) -> PoolPlan {
        self.clock += 1;
        let plan = self.decide();
        // The API server gives every write a new resourceVersion (the status is written each step).
        self.obs.pool.metadata.resource_version = Some(self.clock.to_string());
        if plan.add_finalizer {
            self.obs.pool.metadata.finalizers = Some(vec![POOL_FINALIZER.to_string()]);
        }
        for (i, new) in plan.create_instances.iter().enumerate() {
            assert!(
                !self.obs.instances.iter().any(|x| x.name == new.name),
                "duplicate name {}",
                new.name
            );
            assert_eq!(new.labels[POOL_NAME_LABEL], "workers");
            self.obs.instances.push(ObservedInstance {
                name: new.name.clone(),
                machine: None,
                template_hash: new.annotations.get(TEMPLATE_HASH_ANNOTATION).cloned(),
                health: InstanceHealth::Provisioning,
                deleting: false,
                created: Timestamp::from_second(self.clock * 100 + i64::try_from(i).unwrap())
                    .unwrap(),
                provider_id: None,
                failure_domain: None,
                delete_annotated: false,
                host: None,
            });
        }
        for d in &plan.delete_machines {
            let instance = self.instance_mut(&d.machine);
            let machine = instance
                .machine
                .as_mut()
                .expect("never a Machine that does not exist");
            machine.deleting = true;
        }
        for name in &plan.delete_instances {
            self.instance_mut(name).deleting = true;
        }
        let pool = &mut self.obs.pool;
        if let Some(list) = &plan.provider_id_list {
            pool.spec.provider_id_list = list.clone();
        }
        if let Some(status) = &plan.status {
            pool.status = Some(status.clone());
        }
        plan
    }

    /// CAPI and the hosts move on; `allow(k)` says whether the k-th pending transition happens now.
    fn advance(&mut self, mut allow: impl FnMut(usize) -> bool) {
        let mut k = 0;
        let mut next = || {
            k += 1;
            allow(k)
        };
        let mut kept = Vec::new();
        for mut i in std::mem::take(&mut self.obs.instances) {
            if i.leaving() {
                if next() {
                    continue; // drained and gone, with its microVM
                }
            } else if i.machine.is_none() {
                if next() {
                    i.machine = Some(InstanceMachine::default());
                }
            } else if i.health == InstanceHealth::Provisioning && next() {
                i.health = InstanceHealth::Ready;
                // Its Node registers with it (a separate step would only slow the model).
                if let Some(m) = i.machine.as_mut() {
                    m.joined = true;
                }
                i.provider_id = Some(format!("microvm://10.0.0.1:9090/{}", i.name));
            }
            kept.push(i);
        }
        self.obs.instances = kept;
    }

    fn instance_mut(&mut self, name: &str) -> &mut ObservedInstance {
        self.obs
            .instances
            .iter_mut()
            .find(|i| i.name == name)
            .unwrap()
    }

    fn converge(&mut self) {
        for _ in 0..50 {
            self.step();
            if self.settled() {
                return;
            }
            self.advance(|_| true);
        }
        panic!("did not converge: {:#?}", self.obs.instances);
    }

    fn desired(&self) -> usize {
        usize::try_from(self.obs.machine_pool.as_ref().unwrap().desired_replicas).unwrap()
    }

    fn current_hash(&self) -> String {
        template_hash(&self.obs.pool.spec.template)
    }

    fn settled(&self) -> bool {
        let hash = self.current_hash();
        self.obs.instances.len() == self.desired()
            && self.obs.instances.iter().all(|i| {
                !i.leaving()
                    && i.health == InstanceHealth::Ready
                    && i.template_hash.as_deref() == Some(hash.as_str())
            })
    }

    fn ready_live(&self) -> usize {
        self.obs
            .instances
            .iter()
            .filter(|i| !i.leaving() && i.health == InstanceHealth::Ready)
            .count()
    }

    fn names_by_age(&self) -> Vec<String> {
        let mut v: Vec<_> = self.obs.instances.iter().collect();
        v.sort_by_key(|i| i.created);
        v.into_iter().map(|i| i.name.clone()).collect()
    }

    fn change_template(&mut self) {
        self.obs.pool.spec.template.vcpu += 1;
        self.obs.pool.metadata.generation = Some(2);
    }
}

fn deleted(plan: &PoolPlan) -> Vec<(String, DeletionReason)> {
    plan.delete_machines
        .iter()
        .map(|d| (d.machine.clone(), d.reason))
        .collect()
}

fn condition(plan: &PoolPlan, type_: &str) -> (String, String, String) {
    let c = conditions::get(&plan.status.as_ref().unwrap().conditions, type_).unwrap();
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

#[test]
fn scales_zero_to_five_to_two_deleting_the_oldest_machines() {
    let mut w = World::new(0, 1, 0, DeletePolicy::Oldest);
    w.converge();
    assert!(w.obs.instances.is_empty());
    let status = w.obs.pool.status.clone().unwrap();
    assert!(status.ready, "an empty pool is provisioned");
    assert_eq!(
        status.infrastructure_machine_kind.as_deref(),
        Some("MicrovmMachine")
    );
    assert_eq!(status.capacity["cpu"], "2");

    w.set_replicas(5);
    let plan = w.step();
    assert_eq!(
        plan.create_instances.len(),
        5,
        "all at once: surge limits only above desired"
    );
    assert_eq!(condition(&plan, types::SCALING_UP).1, reasons::SCALING_UP);
    w.advance(|_| true);
    w.converge();
    assert_eq!(w.ready_live(), 5);
    let by_age = w.names_by_age();

    w.set_replicas(2);
    let plan = w.step();
    assert_eq!(
        deleted(&plan),
        by_age[..3]
            .iter()
            .map(|n| (n.clone(), DeletionReason::ScaleDown))
            .collect::<Vec<_>>()
    );
    assert!(plan.create_instances.is_empty());
    let (status, _, message) = condition(&plan, types::SCALING_DOWN);
    assert_eq!(status, "True");
    assert!(message.contains(&by_age[0]), "{message}");
    // The Machines drain first: their providerIDs stay listed until the instances are gone.
    assert_eq!(w.obs.pool.spec.provider_id_list.len(), 5);
    w.advance(|_| true);
    w.converge();
    let mut left = w.names_by_age();
    left.sort();
    let mut expected = by_age[3..].to_vec();
    expected.sort();
    assert_eq!(left, expected);
    assert_eq!(w.obs.pool.spec.provider_id_list.len(), 2);
}

#[test]
fn scale_down_takes_unready_instances_first_and_newest_by_policy() {
    let mut w = World::new(4, 1, 0, DeletePolicy::Newest);
    w.converge();
    let by_age = w.names_by_age();
    w.instance_mut(&by_age[0]).health = InstanceHealth::Provisioning;
    w.set_replicas(2);
    let plan = w.step();
    assert_eq!(
        deleted(&plan),
        vec![
            (by_age[0].clone(), DeletionReason::ScaleDown),
            (by_age[3].clone(), DeletionReason::ScaleDown),
        ]
    );
}

#[test]
fn the_autoscalers_annotated_machine_is_the_one_removed() {
    let mut w = World::new(5, 1, 0, DeletePolicy::Oldest);
    w.converge();
    let pick = w.names_by_age()[3].clone();
    w.instance_mut(&pick)
        .machine
        .as_mut()
        .unwrap()
        .delete_requested = true;
    // The annotation alone removes nothing: the autoscaler lowers the replicas next. It is copied
    // down onto the instance, as the contract asks.
    let plan = w.step();
    assert!(plan.delete_machines.is_empty() && plan.create_instances.is_empty());
    assert_eq!(
        plan.mark_instances,
        vec![InstanceMark {
            instance: pick.clone(),
            delete_requested: true
        }]
    );
    w.instance_mut(&pick).delete_annotated = true;
    assert!(w.decide().mark_instances.is_empty(), "copied once");
    w.set_replicas(4);
    let plan = w.step();
    assert_eq!(deleted(&plan), vec![(pick, DeletionReason::ScaleDown)]);
}

#[test]
fn an_instance_without_its_machine_is_waited_for_not_substituted() {
    let mut w = World::new(3, 1, 0, DeletePolicy::Oldest);
    w.converge();
    w.set_replicas(4);
    w.step(); // a fourth instance, whose Machine core has not created yet
    let young = w
        .obs
        .instances
        .iter()
        .find(|i| i.machine.is_none())
        .unwrap()
        .name
        .clone();
    w.set_replicas(3);
    let plan = w.step();
    assert!(plan.delete_machines.is_empty(), "{:?}", deleted(&plan));
    assert!(condition(&plan, types::SCALING_DOWN).0 == "False");
    w.advance(|_| true); // its Machine appears
    let plan = w.step();
    assert_eq!(deleted(&plan), vec![(young, DeletionReason::ScaleDown)]);
}

/// Steps a roll to completion, checking the bounds after every plan and every move of the world.
fn roll(w: &mut World, surge: usize, unavailable: usize, mut allow: impl FnMut(usize) -> bool) {
    let desired = w.desired();
    w.change_template();
    for _ in 0..200 {
        let plan = w.step();
        for d in &plan.delete_machines {
            assert_eq!(d.reason, DeletionReason::Outdated);
        }
        let check = |w: &World, when: &str| {
            assert!(
                w.obs.instances.len() <= desired + surge,
                "{when}: {} instances exist, above {desired} + {surge}",
                w.obs.instances.len()
            );
            assert!(
                w.ready_live() + unavailable >= desired,
                "{when}: {} ready, below {desired} - {unavailable}",
                w.ready_live()
            );
        };
        check(w, "after the plan");
        if w.settled() {
            return;
        }
        w.advance(&mut allow);
        check(w, "after the world moved");
    }
    panic!("the roll did not finish: {:#?}", w.obs.instances);
}

#[test]
fn a_roll_with_surge_one_never_drops_below_desired_ready_nor_exceeds_desired_plus_one() {
    let mut w = World::new(3, 1, 0, DeletePolicy::Oldest);
    w.converge();
    let before = w.names_by_age();
    roll(&mut w, 1, 0, |_| true);
    assert!(w.obs.instances.iter().all(|i| !before.contains(&i.name)));
}

#[test]
fn a_roll_with_unavailable_two_never_exceeds_desired() {
    let mut w = World::new(5, 0, 2, DeletePolicy::Oldest);
    w.converge();
    let plan = {
        w.change_template();
        w.decide()
    };
    assert_eq!(plan.delete_machines.len(), 2, "two at a time");
    assert!(
        plan.create_instances.is_empty(),
        "no room until they are gone"
    );
    let (status, _, message) = condition(&plan, types::ROLLING_OUT);
    assert_eq!(status, "True");
    assert!(
        message.contains("5 instance(s) made from an older template"),
        "{message}"
    );
    w.obs.pool.spec.template.vcpu -= 1; // `roll` changes it itself
    roll(&mut w, 0, 2, |_| true);
}

#[test]
fn a_roll_waits_for_replacements_to_be_ready_and_says_so() {
    let mut w = World::new(2, 1, 0, DeletePolicy::Oldest);
    w.converge();
    w.change_template();
    let plan = w.step();
    assert_eq!(plan.create_instances.len(), 1);
    assert!(plan.delete_machines.is_empty());
    w.advance(|_| true); // its Machine; not ready yet
    let plan = w.step();
    assert!(plan.delete_machines.is_empty());
    let (_, _, message) = condition(&plan, types::ROLLING_OUT);
    assert!(
        message.contains("waiting for replacements to be ready"),
        "{message}"
    );
    assert_eq!(
        condition(&plan, types::READY).0,
        "True",
        "no fewer ready than desired"
    );
}

#[test]
fn a_bootstrap_only_change_rolls_nothing() {
    let mut w = World::new(3, 1, 0, DeletePolicy::Oldest);
    w.converge();
    w.obs
        .machine_pool
        .as_mut()
        .unwrap()
        .bootstrap_data_secret_name = Some("workers-bootstrap-rotated".into());
    let plan = w.step();
    assert!(plan.delete_machines.is_empty() && plan.create_instances.is_empty());
    assert_eq!(condition(&plan, types::ROLLING_OUT).0, "False");
    // Neither does a change of the pool's own metadata: only `spec.template` counts.
    w.obs.pool.metadata.annotations = Some([("note".to_string(), "x".to_string())].into());
    let plan = w.step();
    assert!(plan.delete_machines.is_empty() && plan.create_instances.is_empty());
}

#[test]
fn a_vanished_or_failed_or_remediated_instance_is_replaced_through_its_machine() {
    let mut w = World::new(3, 1, 0, DeletePolicy::Oldest);
    w.converge();
    let names = w.names_by_age();
    w.instance_mut(&names[0]).health = InstanceHealth::Vanished;
    w.instance_mut(&names[1]).health = InstanceHealth::Failed;
    w.instance_mut(&names[2])
        .machine
        .as_mut()
        .unwrap()
        .owner_remediation_requested = true;
    let plan = w.step();
    assert_eq!(
        deleted(&plan),
        vec![
            (names[0].clone(), DeletionReason::Vanished),
            (names[1].clone(), DeletionReason::Failed),
            (names[2].clone(), DeletionReason::Remediated),
        ]
    );
    assert_eq!(plan.create_instances.len(), 1, "within maxSurge 1");
    assert_eq!(condition(&plan, types::REMEDIATING).0, "True");
    assert!(
        plan.events
            .iter()
            .any(|e| e.reason == events::INSTANCES_REPLACED)
    );
    w.advance(|_| true);
    w.converge();
    assert!(w.obs.instances.iter().all(|i| !names.contains(&i.name)));
}

#[test]
fn the_provider_id_list_is_sorted_and_keeps_deleting_instances() {
    let mut w = World::new(3, 1, 0, DeletePolicy::Oldest);
    w.converge();
    let list = w.obs.pool.spec.provider_id_list.clone();
    let mut sorted = list.clone();
    sorted.sort();
    assert_eq!(list, sorted);
    assert_eq!(list.len(), 3);
    assert_eq!(
        w.decide().provider_id_list,
        None,
        "unchanged: not written again"
    );
    w.set_replicas(1);
    w.step();
    assert_eq!(w.obs.pool.spec.provider_id_list, list, "still draining");
}

#[test]
fn status_ready_stays_true_while_scaling_and_rolling() {
    let mut w = World::new(2, 1, 0, DeletePolicy::Oldest);
    w.converge();
    w.set_replicas(6);
    let plan = w.step();
    let status = plan.status.unwrap();
    assert!(status.ready);
    assert_eq!(status.initialization.unwrap().provisioned, Some(true));
    assert_eq!(
        condition(&w.decide(), types::READY).1,
        reasons::INSTANCES_NOT_READY
    );
}

#[test]
fn deleting_the_pool_deletes_every_machine_then_releases_the_finalizer() {
    let mut w = World::new(3, 1, 0, DeletePolicy::Oldest);
    w.converge();
    w.set_replicas(4);
    w.step(); // one instance without a Machine
    w.obs.pool.metadata.deletion_timestamp = Some(Time(w.now()));
    let plan = w.step();
    assert_eq!(plan.delete_machines.len(), 3);
    assert_eq!(plan.delete_instances.len(), 1);
    assert!(plan.create_instances.is_empty() && !plan.remove_finalizer);
    w.advance(|_| true);
    let plan = w.step();
    assert!(plan.remove_finalizer && w.obs.instances.is_empty());
}

#[test]
fn gates_wait_for_the_machine_pool_and_report_an_invalid_template() {
    let mut w = World::new(3, 1, 0, DeletePolicy::Oldest);
    w.obs.machine_pool = None;
    let plan = w.decide();
    assert_eq!(condition(&plan, types::READY).1, reasons::WAITING_FOR_OWNER);
    assert!(plan.create_instances.is_empty() && !plan.add_finalizer);

    let mut w = World::new(3, 1, 0, DeletePolicy::Oldest);
    w.obs.pool.spec.template.vcpu = 0;
    let plan = w.decide();
    let (_, reason, message) = condition(&plan, types::READY);
    assert_eq!(reason, reasons::INVALID_SPEC);
    assert!(message.starts_with("spec.template.vcpu"), "{message}");
    assert!(plan.create_instances.is_empty());
}

#[test]
fn new_instances_spread_over_the_machine_pools_failure_domains() {
    let mut w = World::new(4, 1, 0, DeletePolicy::Oldest);
    w.obs.machine_pool.as_mut().unwrap().failure_domains = vec!["a".into(), "b".into()];
    let plan = w.step();
    let domains: Vec<_> = plan
        .create_instances
        .iter()
        .map(|i| i.annotations[capmvm_api::keys::POOL_FAILURE_DOMAIN_ANNOTATION].clone())
        .collect();
    assert_eq!(domains, ["a", "b", "a", "b"]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Any pool size and limits, any interleaving of CAPI and the hosts: a roll stays within its
    /// bounds at every step and ends with every instance up to date.
    #[test]
    fn rolls_stay_within_bounds_and_converge(
        desired in 1..7_i32,
        surge in 0..3_i32,
        unavailable in 0..3_i32,
        moves in proptest::collection::vec(any::<bool>(), 64),
    ) {
        let surge = if surge == 0 && unavailable == 0 { 1 } else { surge };
        let unavailable = unavailable.min(desired);
        let mut w = World::new(desired, surge, unavailable, DeletePolicy::Random);
        w.converge();
        let mut k = 0usize;
        // Some moves are held back; each is let through within a few steps, so the world is fair.
        let allow = move |_| { k += 1; moves[k % moves.len()] || k.is_multiple_of(3) };
        roll(&mut w, usize::try_from(surge).unwrap(), usize::try_from(unavailable).unwrap(), allow);
    }

    /// Any sequence of sizes, with scale-downs racing instances still being created: the pool ends
    /// at the last size, never deletes a Machine that does not exist (World::step checks), and
    /// never exceeds the largest size plus its surge.
    #[test]
    fn scaling_converges_to_the_last_size(
        sizes in proptest::collection::vec(0..8_i32, 1..5),
        moves in proptest::collection::vec(any::<bool>(), 64),
    ) {
        let mut w = World::new(0, 1, 0, DeletePolicy::Oldest);
        let mut k = 0usize;
        for size in &sizes {
            w.set_replicas(*size);
            for _ in 0..3 {
                w.step();
                prop_assert!(w.obs.instances.len() <= 8 + 1);
                w.advance(|_| { k += 1; moves[k % moves.len()] });
            }
        }
        w.converge();
        prop_assert_eq!(w.obs.instances.len(), usize::try_from(*sizes.last().unwrap()).unwrap());
    }
}

#[test]
fn a_delete_mark_removed_from_the_machine_is_removed_from_the_instance() {
    let mut w = World::new(2, 1, 0, DeletePolicy::Oldest);
    w.converge();
    let name = w.names_by_age()[0].clone();
    w.instance_mut(&name).delete_annotated = true;
    assert_eq!(
        w.decide().mark_instances,
        vec![InstanceMark {
            instance: name,
            delete_requested: false
        }]
    );
}

#[test]
fn instances_carry_the_pools_watch_filter_label() {
    use capmvm_api::keys::WATCH_FILTER_LABEL;
    let mut w = World::new(1, 1, 0, DeletePolicy::Oldest);
    w.obs
        .pool
        .metadata
        .labels
        .get_or_insert_default()
        .insert(WATCH_FILTER_LABEL.into(), "team-a".into());
    let plan = w.step();
    assert_eq!(
        plan.create_instances[0].labels[WATCH_FILTER_LABEL],
        "team-a"
    );
}

/// While counts move, the pool's status is written at most once per interval; what is held back is
/// written once the interval ends (the plan asks to be decided again then), so the last state is
/// always written. A status that did not change is never held (there is nothing to write).
#[test]
fn the_status_is_written_at_most_once_a_second_and_the_last_state_always() {
    let mut w = World::new(3, 1, 0, DeletePolicy::Oldest);
    w.step();
    w.step();
    let written_at = w.now();
    w.obs.last_status_write = Some(written_at);
    // Core created the Machines; 300 ms after the write the instances become ready: a count moves.
    w.advance(|_| true);
    let unchanged = decide_pool(&w.obs, written_at + std::time::Duration::from_millis(100));
    assert_eq!(
        unchanged.status.as_ref(),
        w.obs.pool.status.as_ref(),
        "nothing to hold back"
    );
    w.advance(|_| true);
    let soon = written_at + std::time::Duration::from_millis(300);
    let plan = decide_pool(&w.obs, soon);
    assert_eq!(plan.status, None, "held back");
    assert_eq!(
        plan.requeue,
        Requeue::After(std::time::Duration::from_millis(700)),
        "decided again when the interval ends"
    );
    // The interval ended: the latest state is written.
    let plan = decide_pool(&w.obs, written_at + STATUS_WRITE_INTERVAL);
    let status = plan.status.expect("written");
    assert_ne!(Some(&status), w.obs.pool.status.as_ref());
    // Without a recent write of ours (another process wrote it, or none yet), at once.
    w.obs.last_status_write = None;
    assert!(decide_pool(&w.obs, soon).status.is_some());
    // A clock that went back does not hold it forever.
    w.obs.last_status_write = Some(written_at + std::time::Duration::from_secs(3600));
    assert!(decide_pool(&w.obs, soon).status.is_some());
}

/// An instance on a host under `maintenance: Evacuate` is replaced like an outdated one: a surge
/// instance first, the old one's Machine deleted only once the new one is ready, so the pool never
/// has fewer ready instances than desired; instances on other hosts are left alone.
#[test]
fn evacuation_replaces_only_the_hosts_instances_within_the_roll_limits() {
    let mut w = World::new(3, 1, 0, DeletePolicy::Oldest);
    w.converge();
    let names = w.names_by_age();
    w.instance_mut(&names[0]).host = Some(support::HOSTS[0].to_string());
    w.instance_mut(&names[1]).host = Some(support::HOSTS[1].to_string());
    w.instance_mut(&names[2]).host = Some(support::HOSTS[1].to_string());
    let plan = w.step();
    assert!(
        plan.create_instances.is_empty(),
        "nothing to do before maintenance"
    );
    assert!(plan.delete_machines.is_empty());

    let mut mc = support::microvm_cluster();
    mc.spec.placement.static_pool.as_mut().unwrap().hosts[0].maintenance =
        Some(HostMaintenance::Evacuate);
    w.obs.infra_cluster = Some(std::sync::Arc::new(mc));

    let mut deleted_all = Vec::new();
    for _ in 0..20 {
        let plan = w.step();
        assert!(w.ready_live() >= 3, "never below the desired ready count");
        deleted_all.extend(deleted(&plan));
        let on_host = w
            .obs
            .instances
            .iter()
            .any(|i| i.host.as_deref() == Some(support::HOSTS[0]));
        if !on_host && w.obs.instances.len() == 3 && w.ready_live() == 3 {
            break;
        }
        w.advance(|_| true);
    }
    assert_eq!(
        deleted_all,
        [(names[0].clone(), DeletionReason::HostEvacuating)],
        "exactly the evacuated host's instance, once"
    );
    assert!(
        w.obs
            .instances
            .iter()
            .all(|i| i.host.as_deref() != Some(support::HOSTS[0]))
    );
    assert!(w.obs.instances.iter().any(|i| i.name == names[1]));
    assert!(w.obs.instances.iter().any(|i| i.name == names[2]));
}

/// A replacement whose microVM runs but whose Node has not registered does not count as available:
/// the outdated instance it replaces stays until the Node shows (as CAPI counts a MachineSet's).
#[test]
fn a_replacement_counts_only_once_its_node_registered() {
    let mut w = World::new(2, 1, 0, DeletePolicy::Oldest);
    w.converge();
    let old = w.names_by_age();
    w.change_template();
    let plan = w.step();
    assert_eq!(plan.create_instances.len(), 1, "one surge instance");
    w.advance(|_| true); // its Machine
    w.advance(|_| true); // running, Node registered
    let new = plan.create_instances[0].name.clone();
    w.instance_mut(&new).machine.as_mut().unwrap().joined = false;
    let plan = w.step();
    assert!(
        deleted(&plan).is_empty(),
        "no Node yet: nothing goes: {:?}",
        deleted(&plan)
    );
    w.instance_mut(&new).machine.as_mut().unwrap().joined = true;
    let plan = w.step();
    assert_eq!(deleted(&plan), [(old[0].clone(), DeletionReason::Outdated)]);
}
