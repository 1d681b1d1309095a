//! Properties of the machine decision, against a simulated operator and simulated hosts:
//!
//! - a plan applied to the observation it came from, re-decided, converges with no further effects;
//! - with the operator crashing between any two steps of any plan, and the object moved (new uid) at
//!   any point, no machine ever has two microVMs;
//! - no plan creates when a providerID exists, a microVM carrying the machine's uid is there, or a
//!   same-name microVM that is not the machine's is there; every create comes after the conditional
//!   write that records its host, and that write always changes the object (a compare-and-swap);
//! - no plan creates, nor releases a deleted machine's finalizer, while another operator process's
//!   recent placement claim may still be creating;
//! - deciding is deterministic.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;

use capmvm_api::keys::MACHINE_FINALIZER;
use capmvm_reconcile::cloudinit::machine_uid_from_metadata;
use capmvm_reconcile::machine::{origin_uid, provider_id, recorded_host};
use capmvm_reconcile::*;
use proptest::prelude::*;
use support::*;

/// Simulated flintlock hosts: what they hold, and whether each answers.
#[derive(Clone, Debug)]
struct World {
    vms: BTreeMap<String, Vec<ObservedVm>>,
    reachable: BTreeMap<String, bool>,
    next_uid: u32,
}

impl World {
    fn new(reachable: [bool; 3]) -> Self {
        Self {
            vms: HOSTS.iter().map(|h| (h.to_string(), Vec::new())).collect(),
            reachable: HOSTS
                .iter()
                .zip(reachable)
                .map(|(h, r)| (h.to_string(), r))
                .collect(),
            next_uid: 0,
        }
    }

    /// The machine's microVMs that are alive (not being deleted), on every host, whatever uid they
    /// carry (the machine may have been moved, which changes its uid).
    fn ours_alive(&self) -> Vec<&ObservedVm> {
        self.vms
            .values()
            .flatten()
            .filter(|v| v.name == "m1" && v.state != VmState::Deleting)
            .collect()
    }

    /// What the operator would observe: reachability of every host, and a fresh answer from the
    /// machine's recorded host.
    fn observe(&self, obs: &mut ObservedMachine) {
        for (host, facts) in &mut obs.hosts {
            facts.reachability = if self.reachable[host] {
                Reachability::Reachable
            } else {
                Reachability::Unreachable("connection refused".into())
            };
        }
        obs.recorded_host = match recorded_host(&obs.machine) {
            None => HostLookup::NotAsked,
            Some(host) if !self.reachable[&host.to_string()] => {
                HostLookup::Unreachable("connection refused".into())
            }
            Some(host) => {
                let pid = provider_id(&obs.machine).map(|p| p.uid);
                let vms = self.vms[&host.to_string()]
                    .iter()
                    .filter(|v| {
                        (v.namespace == "default" && v.name == "m1")
                            || pid.as_deref() == Some(v.uid.as_str())
                    })
                    .cloned()
                    .collect();
                HostLookup::Answered { vms }
            }
        };
    }
}

/// Carries out `plan` in the operator's order, stopping after `crash_after` steps (a crash).
/// Returns false once the machine is gone (finalizer released while deleting).
fn execute(
    obs: &mut ObservedMachine,
    world: &mut World,
    plan: &MachinePlan,
    crash_after: usize,
) -> bool {
    let mut steps = 0;
    let mut step = || {
        steps += 1;
        steps <= crash_after
    };
    // The finalizer and the recorded host go in one metadata write.
    let adds_finalizer = plan.add_finalizer;
    let recorded = plan.record_host.as_ref().map(
        |HostRecord {
             host,
             origin_uid,
             attempt,
             claim,
         }| {
            (
                host.to_string(),
                origin_uid.clone(),
                *attempt,
                claim.clone(),
            )
        },
    );
    if adds_finalizer || recorded.is_some() {
        if !step() {
            return true;
        }
        if adds_finalizer {
            obs.machine
                .metadata
                .finalizers
                .get_or_insert_with(Vec::new)
                .push(MACHINE_FINALIZER.into());
        }
        if let Some((host, origin_uid, attempt, claim)) = recorded {
            let annotations = obs
                .machine
                .metadata
                .annotations
                .get_or_insert_with(Default::default);
            annotations.insert(capmvm_api::keys::HOST_ANNOTATION.to_string(), host);
            annotations.insert(
                capmvm_api::keys::ORIGIN_UID_ANNOTATION.to_string(),
                origin_uid,
            );
            annotations.insert(
                capmvm_api::keys::PLACEMENT_ATTEMPT_ANNOTATION.to_string(),
                attempt.to_string(),
            );
            annotations.insert(
                capmvm_api::keys::PLACEMENT_CLAIM_ANNOTATION.to_string(),
                claim,
            );
        }
    }
    if let Some(id) = &plan.provider_id {
        if !step() {
            return true;
        }
        obs.machine.spec.provider_id = Some(id.clone());
    }
    if plan.status.is_some() && plan.status != obs.machine.status {
        if !step() {
            return true;
        }
        obs.machine.status = plan.status.clone();
    }
    for call in &plan.host_calls {
        match call {
            HostCall::Create { host, spec } => {
                if !step() {
                    return true;
                }
                world.next_uid += 1;
                let vm = ObservedVm {
                    // Zero-padded so lexical order is creation order, like ULIDs.
                    uid: format!("01{:08}", world.next_uid),
                    namespace: spec.namespace.clone(),
                    name: spec.id.clone(),
                    state: VmState::Pending,
                    retry: 0,
                    machine_uid: machine_uid_from_metadata(&spec.metadata),
                    cluster: None,
                    running: Some(RunningSpec {
                        vcpu: spec.vcpu.into(),
                        memory_mb: spec.memory_mb.into(),
                        kernel_image: spec.kernel.image.as_str().into(),
                        root_volume_image: spec
                            .root_volume
                            .as_ref()
                            .and_then(|v| v.source.container_source.as_deref().map(Into::into)),
                    }),
                };
                world.vms.get_mut(&host.to_string()).unwrap().push(vm);
            }
            HostCall::Delete { host, uid } => {
                if !step() {
                    return true;
                }
                for v in world.vms.get_mut(&host.to_string()).unwrap() {
                    if v.uid == *uid {
                        v.state = VmState::Deleting;
                    }
                }
            }
        }
    }
    if plan.remove_finalizer {
        if !step() {
            return true;
        }
        obs.machine
            .metadata
            .finalizers
            .get_or_insert_with(Vec::new)
            .retain(|f| f != MACHINE_FINALIZER);
        if obs.machine.metadata.deletion_timestamp.is_some() {
            return false;
        }
    }
    true
}

/// Flintlock finishes what it was asked: PENDING becomes CREATED, DELETING disappears.
fn hosts_progress(world: &mut World) {
    for vms in world.vms.values_mut() {
        vms.retain(|v| v.state != VmState::Deleting);
        for v in vms.iter_mut() {
            if v.state == VmState::Pending {
                v.state = VmState::Created;
            }
        }
    }
}

/// A plan that changes nothing: no effects and the status already written.
fn is_quiet(obs: &ObservedMachine, plan: &MachinePlan) -> bool {
    plan.has_no_effects() && (plan.status.is_none() || plan.status == obs.machine.status)
}

fn arb_lookup_vm() -> impl Strategy<Value = ObservedVm> {
    (
        prop_oneof![Just("01A"), Just("01B"), Just("01C")],
        prop_oneof![
            Just(VmState::Pending),
            Just(VmState::Created),
            Just(VmState::Failed),
            Just(VmState::Deleting),
            Just(VmState::Unknown(9))
        ],
        any::<bool>(),
    )
        .prop_map(|(uid, state, ours)| vm(uid, state, ours))
}

prop_compose! {
    /// Any observation: gates open or closed, any host answers, any microVMs.
    fn arb_observation()(
        has_owner in any::<bool>(),
        has_cluster in any::<bool>(),
        paused in any::<bool>(),
        provisioned in any::<bool>(),
        bootstrap_variant in 0..4u8,
        has_finalizer in any::<bool>(),
        is_deleting in any::<bool>(),
        recorded in prop::option::of(0..3usize),
        pid_uid in prop::option::of(prop_oneof![Just("01A"), Just("01B")]),
        reach in prop::array::uniform3(0..3u8),
        lookup_kind in 0..3u8,
        vms in prop::collection::vec(arb_lookup_vm(), 0..4),
        was_moved in any::<bool>(),
    ) -> ObservedMachine {
        let mut obs = observed();
        if !has_owner { obs.owner = None; }
        if !has_cluster { obs.cluster = None; }
        if paused { obs.cluster.iter_mut().for_each(|c| c.paused = true); }
        if !provisioned { obs.cluster.iter_mut().for_each(|c| c.infrastructure_provisioned = false); }
        obs.bootstrap = match bootstrap_variant {
            0 => bootstrap(),
            1 => BootstrapData::SecretNotFound,
            2 => BootstrapData::NotAsked,
            _ => BootstrapData::Found { value: None, format: None },
        };
        if !has_finalizer { obs.machine.metadata.finalizers = None; }
        if is_deleting { deleting(&mut obs); }
        if let Some(i) = recorded {
            match pid_uid {
                Some(uid) => with_provider_id(&mut obs, HOSTS[i], uid),
                None => with_recorded_host(&mut obs, HOSTS[i]),
            }
        }
        if was_moved { moved(&mut obs); }
        for (host, r) in HOSTS.iter().zip(reach) {
            obs.hosts.get_mut(*host).unwrap().reachability = match r {
                0 => Reachability::Reachable,
                1 => Reachability::Unreachable("refused".into()),
                _ => Reachability::Unknown,
            };
        }
        obs.recorded_host = match lookup_kind {
            0 => HostLookup::Answered { vms },
            1 => HostLookup::Unreachable("refused".into()),
            _ => HostLookup::NotAsked,
        };
        obs
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn deciding_is_deterministic(obs in arb_observation()) {
        prop_assert_eq!(decide(&obs, now()), decide(&obs.clone(), now()));
    }

    #[test]
    fn no_create_when_a_provider_id_or_our_vm_exists(obs in arb_observation()) {
        // The operator asks a host only when one is recorded; an answer without one is not an observation.
        let ours_listed = recorded_host(&obs.machine).is_some()
            && matches!(&obs.recorded_host, HostLookup::Answered { vms }
                if vms.iter().any(|v| v.machine_uid.is_some() && v.machine_uid.as_deref() == origin_uid(&obs.machine)));
        let plan = decide(&obs, now());
        if obs.machine.spec.provider_id.is_some() || ours_listed {
            prop_assert!(creates(&plan).is_empty(), "created with providerID or our VM present: {:?}", plan);
        }
        // A same-name microVM on the recorded host that is not ours (no readable uid, or another
        // one) and not being deleted blocks creation: creating could make a second one of ours.
        let unknown_listed = recorded_host(&obs.machine).is_some()
            && matches!(&obs.recorded_host, HostLookup::Answered { vms }
                if vms.iter().any(|v| v.state != VmState::Deleting
                    && (v.machine_uid.is_none() || v.machine_uid.as_deref() != origin_uid(&obs.machine))));
        if unknown_listed {
            prop_assert!(creates(&plan).is_empty(), "created next to an unknown microVM: {:?}", plan);
        }
        // And never a create together with a finalizer release, nor a create while deleting.
        if obs.machine.metadata.deletion_timestamp.is_some() {
            prop_assert!(creates(&plan).is_empty());
        }
        prop_assert!(creates(&plan).len() <= 1);
        // Every create is preceded by the conditional write that records its host: a decision made
        // from a stale read fails that write and never reaches the host.
        for (host, _) in creates(&plan) {
            // The record is the plan's first step, every host call its fourth.
            let recorded = plan.record_host.as_ref().is_some_and(|r| r.host.to_string() == host);
            prop_assert!(recorded, "create without a recorded host first: {:?}", plan);
        }
        if !plan.host_calls.is_empty() {
            prop_assert!(!plan.remove_finalizer);
        }
    }

    #[test]
    fn the_write_before_a_create_always_changes_the_object(
        obs in arb_observation(),
        attempts in prop::option::of(prop_oneof![
            Just("0".to_string()),
            Just("1".to_string()),
            Just("41".to_string()),
            Just("x".to_string()),
            Just(u64::MAX.to_string()),
        ]),
    ) {
        // Two writers deciding from one resourceVersion cannot both pass a conditional write that
        // changes the object: the first one's new version fails the second one's test. A write that
        // changed nothing would keep the version and let both create.
        let mut obs = obs;
        if let Some(a) = attempts {
            obs.machine.metadata.annotations.get_or_insert_with(Default::default)
                .insert(capmvm_api::keys::PLACEMENT_ATTEMPT_ANNOTATION.to_string(), a);
        }
        let plan = decide(&obs, now());
        if !creates(&plan).is_empty() {
            let mut written = obs.clone();
            let mut world = World::new([true, true, true]);
            // Only the metadata write (the first step) is carried out.
            execute(&mut written, &mut world, &plan, 1);
            prop_assert_ne!(
                &written.machine.metadata.annotations,
                &obs.machine.metadata.annotations,
                "the record before a create changed nothing: {:?}", plan
            );
        }
    }

    #[test]
    fn no_create_while_another_process_may_be_creating(
        obs in arb_observation(),
        seconds_ago in 0..20i64,
    ) {
        // Another process claimed the placement within the window a create can take: whatever else
        // is observed, this process does not create (the other's microVM may not be listed yet).
        let mut obs = obs;
        let at = now() - k8s_openapi::jiff::SignedDuration::from_secs(seconds_ago);
        obs.machine.metadata.annotations.get_or_insert_with(Default::default).insert(
            capmvm_api::keys::PLACEMENT_CLAIM_ANNOTATION.to_string(),
            format!("{at} another-process"),
        );
        if recorded_host(&obs.machine).is_some() {
            prop_assert!(creates(&decide(&obs, now())).is_empty());
        }
    }

    #[test]
    fn no_release_while_another_process_may_be_creating(
        obs in arb_observation(),
        seen_for in prop::option::of(0..20u64),
    ) {
        // Another process claimed the placement and this process has seen that claim for less than
        // a create can take: whatever the host lists, a deleted machine without providerID keeps
        // its finalizer (the other's microVM may land after the list, and nobody would delete it).
        let mut obs = obs;
        obs.machine.metadata.annotations.get_or_insert_with(Default::default).insert(
            capmvm_api::keys::PLACEMENT_CLAIM_ANNOTATION.to_string(),
            format!("{} another-process", now()),
        );
        obs.claim_seen_for = seen_for.map(std::time::Duration::from_secs);
        deleting(&mut obs);
        if recorded_host(&obs.machine).is_some() && obs.machine.spec.provider_id.is_none() {
            let plan = decide(&obs, now());
            prop_assert!(!plan.remove_finalizer, "released: {:?}", plan);
        }
    }

    #[test]
    fn a_plan_applied_and_re_decided_converges(obs in arb_observation()) {
        // The world the observation describes: the recorded host holds the listed microVMs.
        let mut world = World::new([true, true, true]);
        if let (Some(host), HostLookup::Answered { vms }) = (recorded_host(&obs.machine), &obs.recorded_host) {
            world.vms.insert(host.to_string(), vms.clone());
        }
        let mut obs = obs;
        world.observe(&mut obs);
        let mut converged = false;
        for _ in 0..8 {
            let plan = decide(&obs, now());
            if is_quiet(&obs, &plan) {
                converged = true;
                break;
            }
            if !execute(&mut obs, &mut world, &plan, usize::MAX) {
                converged = true; // the machine is gone
                break;
            }
            world.observe(&mut obs);
        }
        prop_assert!(converged, "no fixed point after 8 rounds: {:?}", decide(&obs, now()));
    }

    #[test]
    fn crashes_anywhere_never_give_a_machine_two_microvms(
        crashes in prop::collection::vec(0..8usize, 12),
        reach in prop::array::uniform3(any::<bool>()),
        delete_at in prop::option::of(0..12usize),
        move_at in prop::option::of(0..12usize),
    ) {
        let mut world = World::new(reach);
        let mut obs = observed();
        obs.machine.metadata.finalizers = None;
        world.observe(&mut obs);
        let mut alive = true;
        for (round, crash_after) in crashes.iter().enumerate() {
            if move_at == Some(round) {
                // `clusterctl move`: the object is recreated with a new uid and no status.
                moved(&mut obs);
            }
            if delete_at == Some(round) {
                deleting(&mut obs);
                // The API server removes an object without finalizers at once.
                if obs.machine.metadata.finalizers.as_ref().is_none_or(Vec::is_empty) {
                    alive = false;
                    break;
                }
            }
            let plan = decide(&obs, now());
            alive = execute(&mut obs, &mut world, &plan, *crash_after);
            prop_assert!(world.ours_alive().len() <= 1, "two microVMs: {:?}", world.vms);
            if !alive {
                break;
            }
            if round % 3 == 2 {
                hosts_progress(&mut world);
            }
            world.observe(&mut obs);
        }
        // Finish without crashes, with every host back, and check the end state.
        world.reachable.values_mut().for_each(|r| *r = true);
        for _ in 0..12 {
            if !alive {
                break;
            }
            world.observe(&mut obs);
            let plan = decide(&obs, now());
            alive = execute(&mut obs, &mut world, &plan, usize::MAX);
            hosts_progress(&mut world);
            prop_assert!(world.ours_alive().len() <= 1, "two microVMs: {:?}", world.vms);
        }
        if alive {
            // Never deleted: exactly one microVM, and the providerID names it.
            let ours = world.ours_alive();
            prop_assert_eq!(ours.len(), 1, "{:?}", world.vms);
            let pid = provider_id(&obs.machine).expect("providerID set");
            prop_assert_eq!(&pid.uid, &ours[0].uid);
        } else {
            // Deleted: the finalizer went only after every microVM of the machine was gone.
            prop_assert!(world.ours_alive().is_empty(), "released with a VM left: {:?}", world.vms);
        }
    }
}
