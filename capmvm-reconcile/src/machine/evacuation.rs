//! Releasing the machines of an evacuating host to Cluster API one at a time.
//!
//! A machine that is not a pool's instance is replaced by whoever keeps its count (a
//! MachineDeployment through a MachineHealthCheck, a control-plane provider); the machine only says
//! `HostEvacuating` on `Ready`. Said by every machine of the host at once, core's MachineSet starts
//! the next remediation as soon as the previous replacement Machine exists, before its Node is Ready,
//! and the deployment dips by more than one (measured on the real stack: 2 of 4 with `maxInFlight: 1`).
//! So a machine is released only while its group is whole and Ready: no other Machine of the group is
//! released, being deleted or not Ready, the group has as many Machines as it wants, and the machine
//! is the first by name of the group's machines on evacuating hosts. Once released it stays released.

use std::collections::BTreeSet;

use capmvm_api::conditions::{reasons, types};
use capmvm_api::{HostEndpoint, MicrovmCluster, MicrovmMachine};

use super::{instance_pool, recorded_host};
use crate::conditions;
use crate::observe::{EvacuationGroup, ObservedMachine};

/// Whether a machine on an evacuating host goes now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Turn {
    /// Released: it says `HostEvacuating` and Cluster API replaces it.
    Now,
    /// It stays Ready and waits; the text says for what.
    Waiting(String),
}

/// Which group the operator should gather for this machine, if any: only for a placed machine that
/// is not a pool's instance, whose recorded host is being evacuated, and that is not released yet.
/// Every other machine costs nothing.
pub fn wants_evacuation_group(obs: &ObservedMachine) -> bool {
    let Some(infra) = obs.infra_cluster.as_deref() else {
        return false;
    };
    instance_pool(&obs.machine).is_none()
        && obs.owner.is_some()
        && obs.machine.metadata.deletion_timestamp.is_none()
        && !released(&obs.machine)
        && recorded_host(&obs.machine).is_some_and(|h| evacuating_host(infra, &h).is_some())
}

/// Whether the machine already said `HostEvacuating`: it stays released (Cluster API may have
/// started replacing it).
fn released(machine: &MicrovmMachine) -> bool {
    machine.status.as_ref().is_some_and(|s| {
        conditions::reason(&s.conditions, types::READY) == Some(reasons::HOST_EVACUATING)
    })
}

/// Whether `machine`, on an evacuating host of `infra`, goes now (see the module's rule).
pub(super) fn turn(
    machine: &MicrovmMachine,
    infra: &MicrovmCluster,
    group: Option<&EvacuationGroup>,
) -> Turn {
    let own = machine.metadata.name.as_deref().unwrap_or_default();
    turn_of(own, released(machine), infra, group)
}

/// [`turn`] for the machine named `own`, released already or not.
fn turn_of(
    own: &str,
    already_released: bool,
    infra: &MicrovmCluster,
    group: Option<&EvacuationGroup>,
) -> Turn {
    if already_released {
        return Turn::Now;
    }
    // A Machine of no deployment or control plane has no group to keep whole.
    let Some(group) = group else {
        return Turn::Now;
    };
    let evacuating = crate::pool::evacuating_hosts(Some(infra));
    let mut blocking = Vec::new();
    for peer in &group.peers {
        let peer_released = peer.ready_reason.as_deref() == Some(reasons::HOST_EVACUATING);
        if peer.deleting {
            blocking.push(format!("{} is being deleted", peer.name));
        } else if peer_released {
            blocking.push(format!("{} is being replaced", peer.name));
        } else if !peer.ready {
            blocking.push(format!("{} is not Ready", peer.name));
        }
    }
    if !blocking.is_empty() {
        return Turn::Waiting(blocking.join(", "));
    }
    let machines = group.peers.len() + 1;
    if let Some(desired) = group.desired
        && i64::try_from(machines).unwrap_or(i64::MAX) < i64::from(desired)
    {
        return Turn::Waiting(format!(
            "its group has {machines} of {desired} Machines (a replacement is still to be created)"
        ));
    }
    let first = group
        .peers
        .iter()
        .filter(|p| p.host.as_ref().is_some_and(|h| evacuating.contains(h)))
        .map(|p| p.name.as_str())
        .chain(std::iter::once(own))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .next()
        .unwrap_or(own);
    if first == own {
        Turn::Now
    } else {
        Turn::Waiting(format!("{first} goes first"))
    }
}

/// The display name of `host` when the MicrovmCluster lists it under `maintenance: Evacuate`.
pub(super) fn evacuating_host<'a>(
    infra: &'a MicrovmCluster,
    host: &HostEndpoint,
) -> Option<&'a str> {
    let key = host.to_string();
    infra
        .spec
        .placement
        .static_pool
        .as_ref()?
        .hosts
        .iter()
        .filter(|h| h.evacuating())
        .find(|h| canonical(&h.endpoint).as_deref() == Some(key.as_str()))
        .map(|h| h.display_name())
}

/// A host entry's endpoint in the canonical form hosts are keyed by, if it parses.
pub(crate) fn canonical(endpoint: &str) -> Option<String> {
    endpoint.parse::<HostEndpoint>().ok().map(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use capmvm_api::{HostMaintenance, MicrovmHost, StaticPoolPlacement};

    use super::*;
    use crate::observe::EvacuationPeer;

    const EVACUATING: &str = "10.0.0.1:9090";
    const IN_SERVICE: &str = "10.0.0.2:9090";

    fn infra() -> MicrovmCluster {
        let mut c = MicrovmCluster::default();
        let mut a = MicrovmHost::new(Some("host-a"), EVACUATING);
        a.maintenance = Some(HostMaintenance::Evacuate);
        c.spec.placement.static_pool = Some(StaticPoolPlacement {
            hosts: vec![a, MicrovmHost::new(Some("host-b"), IN_SERVICE)],
            ..StaticPoolPlacement::default()
        });
        c
    }

    fn peer(name: &str, host: &str) -> EvacuationPeer {
        EvacuationPeer {
            name: name.into(),
            deleting: false,
            ready: true,
            host: Some(host.into()),
            ready_reason: Some(reasons::READY.into()),
        }
    }

    fn group(desired: i32, peers: Vec<EvacuationPeer>) -> EvacuationGroup {
        EvacuationGroup {
            desired: Some(desired),
            peers,
        }
    }

    #[test]
    fn the_first_by_name_on_an_evacuating_host_goes_when_the_group_is_whole_and_ready() {
        let peers = vec![
            peer("md-b", EVACUATING),
            peer("md-c", IN_SERVICE),
            peer("md-d", IN_SERVICE),
        ];
        let m = "md-a";
        assert_eq!(
            turn_of(m, false, &infra(), Some(&group(4, peers.clone()))),
            Turn::Now
        );
        let b = "md-b";
        let mut others = peers;
        others[0] = peer("md-a", EVACUATING);
        assert_eq!(
            turn_of(b, false, &infra(), Some(&group(4, others))),
            Turn::Waiting("md-a goes first".into())
        );
    }

    #[test]
    fn one_at_a_time_each_replacement_ready_before_the_next() {
        let m = "md-b";
        let table: Vec<(&str, EvacuationGroup, Option<&str>)> = vec![
            (
                "the first is released",
                group(
                    4,
                    vec![
                        EvacuationPeer {
                            ready: false,
                            ready_reason: Some(reasons::HOST_EVACUATING.into()),
                            ..peer("md-a", EVACUATING)
                        },
                        peer("md-c", IN_SERVICE),
                        peer("md-d", IN_SERVICE),
                    ],
                ),
                Some("md-a is being replaced"),
            ),
            (
                "the first is being deleted",
                group(
                    4,
                    vec![
                        EvacuationPeer {
                            deleting: true,
                            ..peer("md-a", EVACUATING)
                        },
                        peer("md-c", IN_SERVICE),
                        peer("md-d", IN_SERVICE),
                    ],
                ),
                Some("md-a is being deleted"),
            ),
            (
                "the first is gone, its replacement not created yet",
                group(4, vec![peer("md-c", IN_SERVICE), peer("md-d", IN_SERVICE)]),
                Some("its group has 3 of 4 Machines (a replacement is still to be created)"),
            ),
            (
                "the replacement exists, its Node not Ready",
                group(
                    4,
                    vec![
                        peer("md-c", IN_SERVICE),
                        peer("md-d", IN_SERVICE),
                        EvacuationPeer {
                            ready: false,
                            host: None,
                            ready_reason: None,
                            ..peer("md-e", IN_SERVICE)
                        },
                    ],
                ),
                Some("md-e is not Ready"),
            ),
            (
                "the replacement Ready: the next goes",
                group(
                    4,
                    vec![
                        peer("md-c", IN_SERVICE),
                        peer("md-d", IN_SERVICE),
                        peer("md-e", IN_SERVICE),
                    ],
                ),
                None,
            ),
        ];
        for (case, g, waiting) in table {
            let want = waiting.map_or(Turn::Now, |w| Turn::Waiting(w.into()));
            assert_eq!(turn_of(m, false, &infra(), Some(&g)), want, "{case}");
        }
    }

    #[test]
    fn a_released_machine_stays_released_and_a_lone_machine_goes_at_once() {
        let released = "md-b";
        let busy = group(
            4,
            vec![EvacuationPeer {
                ready: false,
                ..peer("md-a", IN_SERVICE)
            }],
        );
        assert_eq!(turn_of(released, true, &infra(), Some(&busy)), Turn::Now);
        assert_eq!(turn_of("lone", false, &infra(), None), Turn::Now);
    }
}
