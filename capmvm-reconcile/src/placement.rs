//! Choosing a host for a new microVM.
//!
//! Rules, in order: the Machine's failure domain (CAPI requires it); hosts whose labels the machine's
//! `hostSelector` matches; hosts in service (not cordoned or evacuating); hosts that answer and whose
//! credentials are in place; hosts that allow control planes, for control-plane machines; then the least
//! allocated host; ties broken by a stable hash of the machine and the host, so a burst of machines
//! spreads over equal hosts instead of piling onto the first. A selector never widens: a machine no
//! usable host matches waits instead of landing elsewhere.

use std::collections::BTreeMap;

use capmvm_api::host_selection;
use capmvm_api::{HostEndpoint, MicrovmHost, StaticPoolPlacement};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::microvm::{FNV1A64_OFFSET, fnv1a64_extend};
use crate::observe::{HostFacts, Reachability};

/// The host chosen for a machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Its endpoint.
    pub host: HostEndpoint,
    /// The failure domain it belongs to.
    pub failure_domain: String,
}

/// What a machine asks of its host.
pub struct Request<'a> {
    /// `namespace/name` of the machine, for the tie-breaking hash.
    pub machine_key: &'a str,
    /// `Machine.spec.failureDomain`, if set.
    pub failure_domain: Option<&'a str>,
    /// Whether the machine is a control-plane machine.
    pub control_plane: bool,
    /// The machine's `hostSelector`, if any.
    pub host_selector: Option<&'a LabelSelector>,
}

/// Why no host fits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoHost {
    /// A message naming each host's problem.
    pub message: String,
    /// Every candidate host is held back only by missing credentials (a Secret or key).
    pub only_credentials: bool,
    /// The machine has a `hostSelector` and no usable host matches it (the message names the
    /// selector and every host considered).
    pub no_matching_host: bool,
}

/// Chooses a host, or explains why none fits.
pub fn choose(
    pool: &StaticPoolPlacement,
    facts: &BTreeMap<String, HostFacts>,
    request: &Request<'_>,
) -> Result<Placement, NoHost> {
    let in_domain: Vec<&MicrovmHost> = pool
        .hosts
        .iter()
        .filter(|h| {
            request
                .failure_domain
                .is_none_or(|fd| h.failure_domain_name() == fd)
        })
        .collect();
    if let Some(fd) = request.failure_domain
        && in_domain.is_empty()
    {
        return Err(NoHost {
            message: format!("failure domain {fd:?} has no hosts in the MicrovmCluster"),
            only_credentials: false,
            no_matching_host: false,
        });
    }

    let mut problems = Vec::new();
    // Hosts the selector leaves out are named too, with their labels: the message must show the
    // user every host considered and why each did not fit.
    let (selected, unselected): (Vec<&MicrovmHost>, Vec<&MicrovmHost>) =
        in_domain.into_iter().partition(|h| {
            request
                .host_selector
                .is_none_or(|sel| host_selection::matches(sel, &h.labels))
        });
    for host in &unselected {
        problems.push(format!(
            "{}: labels {} do not match",
            host.display_name(),
            host_selection::describe_labels(&host.labels)
        ));
    }
    let considered = selected.len() + unselected.len();
    let matching = selected.len();
    let mut credential_problems = 0;
    // The tie-break hashes "{machine_key}|{endpoint}"; the machine's part is the same for every host.
    let machine_hash = fnv1a64_extend(
        fnv1a64_extend(FNV1A64_OFFSET, request.machine_key.as_bytes()),
        b"|",
    );
    // The least allocated reachable host, as (load, tie, host, endpoint); the first one on equal keys.
    let mut best: Option<(i64, u64, &MicrovmHost, HostEndpoint)> = None;
    for host in selected {
        let name = host.display_name();
        let Ok(endpoint) = host.endpoint.parse::<HostEndpoint>() else {
            problems.push(format!("{name}: endpoint {:?} is invalid", host.endpoint));
            continue;
        };
        if let Some(maintenance) = host.maintenance {
            problems.push(format!(
                "{name}: {} for maintenance",
                match maintenance {
                    capmvm_api::HostMaintenance::Cordon => "cordoned",
                    capmvm_api::HostMaintenance::Evacuate => "being evacuated",
                }
            ));
            continue;
        }
        if request.control_plane && !host.controlplane_allowed {
            problems.push(format!("{name}: control planes not allowed"));
            continue;
        }
        let key = endpoint.to_string();
        let Some(fact) = facts.get(&key) else {
            problems.push(format!("{name}: not observed yet"));
            continue;
        };
        if let Some(problem) = &fact.credentials_problem {
            problems.push(format!("{name}: {problem}"));
            credential_problems += 1;
            continue;
        }
        match &fact.reachability {
            Reachability::Reachable => {
                // One vCPU weighs like one GiB: neither resource alone decides.
                let load = fact
                    .allocated_memory_mb
                    .saturating_add(fact.allocated_vcpu.saturating_mul(1024));
                let tie = fnv1a64_extend(machine_hash, key.as_bytes());
                if best
                    .as_ref()
                    .is_none_or(|(l, t, ..)| (load, tie) < (*l, *t))
                {
                    best = Some((load, tie, host, endpoint));
                }
            }
            Reachability::Unknown => problems.push(format!("{name}: not observed yet")),
            Reachability::Unreachable(why) => problems.push(format!("{name}: unreachable ({why})")),
            Reachability::Refused(why) => {
                problems.push(format!("{name}: refused the credentials ({why})"));
            }
        }
    }

    best.map(|(_, _, host, endpoint)| Placement {
        failure_domain: host.failure_domain_name().to_string(),
        host: endpoint,
    })
    .ok_or_else(|| {
        let scope = match request.failure_domain {
            Some(fd) => format!("in failure domain {fd:?} "),
            None => String::new(),
        };
        match request.host_selector {
            Some(selector) => NoHost {
                message: format!(
                    "no usable host {scope}matches hostSelector {:?} ({} of {} considered match): {}",
                    host_selection::describe(selector),
                    matching,
                    considered,
                    problems.join("; ")
                ),
                // Credentials are the user's to fix too, but a selector that matches nothing
                // usable is what the condition must say first.
                only_credentials: false,
                no_matching_host: true,
            },
            None => NoHost {
                message: format!(
                    "no host {scope}can take the machine: {}",
                    problems.join("; ")
                ),
                only_credentials: credential_problems > 0 && credential_problems == problems.len(),
                no_matching_host: false,
            },
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str, ep: &str, fd: Option<&str>, cp: bool) -> MicrovmHost {
        MicrovmHost {
            controlplane_allowed: cp,
            failure_domain: fd.map(Into::into),
            ..MicrovmHost::new(Some(name), ep)
        }
    }

    fn reachable(vcpu: i64, mem: i64) -> HostFacts {
        HostFacts {
            reachability: Reachability::Reachable,
            allocated_vcpu: vcpu,
            allocated_memory_mb: mem,
            ..Default::default()
        }
    }

    fn pool() -> StaticPoolPlacement {
        StaticPoolPlacement {
            hosts: vec![
                host("a", "10.0.0.1:9090", Some("r1"), true),
                host("b", "10.0.0.2:9090", Some("r1"), false),
                host("c", "10.0.0.3:9090", None, true),
            ],
            basic_auth_secret: None,
        }
    }

    fn req<'a>(fd: Option<&'a str>, cp: bool) -> Request<'a> {
        Request {
            machine_key: "default/m1",
            failure_domain: fd,
            control_plane: cp,
            host_selector: None,
        }
    }

    #[test]
    fn least_allocated_host_wins() {
        let facts = BTreeMap::from([
            ("10.0.0.1:9090".to_string(), reachable(4, 8192)),
            ("10.0.0.2:9090".to_string(), reachable(2, 2048)),
            ("10.0.0.3:9090".to_string(), reachable(8, 16384)),
        ]);
        let p = choose(&pool(), &facts, &req(None, false)).unwrap();
        assert_eq!(p.host.to_string(), "10.0.0.2:9090");
        assert_eq!(p.failure_domain, "r1");
    }

    #[test]
    fn failure_domain_and_control_plane_are_honoured() {
        let facts = BTreeMap::from([
            ("10.0.0.1:9090".to_string(), reachable(40, 80000)),
            ("10.0.0.2:9090".to_string(), reachable(0, 0)),
            ("10.0.0.3:9090".to_string(), reachable(0, 0)),
        ]);
        let p = choose(&pool(), &facts, &req(Some("r1"), true)).unwrap();
        assert_eq!(
            p.host.to_string(),
            "10.0.0.1:9090",
            "b is idle but refuses control planes"
        );
        let p = choose(&pool(), &facts, &req(Some("c"), false)).unwrap();
        assert_eq!(p.failure_domain, "c");
    }

    #[test]
    fn unreachable_unobserved_and_credentialless_hosts_are_skipped_with_reasons() {
        let facts = BTreeMap::from([
            (
                "10.0.0.1:9090".to_string(),
                HostFacts {
                    reachability: Reachability::Unreachable("connection refused".into()),
                    ..Default::default()
                },
            ),
            (
                "10.0.0.2:9090".to_string(),
                HostFacts {
                    credentials_problem: Some("Secret \"tokens\" has no key \"10.0.0.2\"".into()),
                    ..reachable(0, 0)
                },
            ),
        ]);
        let err = choose(&pool(), &facts, &req(None, false))
            .unwrap_err()
            .message;
        assert!(err.contains("a: unreachable (connection refused)"), "{err}");
        assert!(err.contains("b: Secret \"tokens\" has no key"), "{err}");
        assert!(err.contains("c: not observed yet"), "{err}");
        let err = choose(&pool(), &facts, &req(Some("r9"), false))
            .unwrap_err()
            .message;
        assert!(err.contains("\"r9\" has no hosts"), "{err}");
    }

    #[test]
    fn ties_spread_by_machine() {
        let facts: BTreeMap<_, _> = ["10.0.0.1:9090", "10.0.0.2:9090", "10.0.0.3:9090"]
            .into_iter()
            .map(|e| (e.to_string(), reachable(0, 0)))
            .collect();
        let chosen: std::collections::BTreeSet<String> = (0..30)
            .map(|i| {
                let key = format!("default/m{i}");
                let r = Request {
                    machine_key: &key,
                    failure_domain: None,
                    control_plane: false,
                    host_selector: None,
                };
                choose(&pool(), &facts, &r).unwrap().host.to_string()
            })
            .collect();
        assert_eq!(chosen.len(), 3, "equal hosts all get machines");
        // The tie-break is a stable hash: the same machine gets the same host on every decision,
        // whatever order the facts were gathered in.
        let reversed: BTreeMap<_, _> = facts.clone().into_iter().rev().collect();
        for i in 0..30 {
            let key = format!("default/m{i}");
            let r = Request {
                machine_key: &key,
                failure_domain: None,
                control_plane: false,
                host_selector: None,
            };
            let first = choose(&pool(), &facts, &r).unwrap().host;
            assert_eq!(choose(&pool(), &reversed, &r).unwrap().host, first);
            assert_eq!(choose(&pool(), &facts, &r).unwrap().host, first);
        }
    }

    fn labelled(host: MicrovmHost, pairs: &[(&str, &str)]) -> MicrovmHost {
        MicrovmHost {
            labels: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..host
        }
    }

    fn selector(pairs: &[(&str, &str)]) -> LabelSelector {
        LabelSelector {
            match_labels: Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            match_expressions: None,
        }
    }

    /// a (disk=nvme, r1), b (disk=nvme, r1, no control planes), c (disk=hdd, own domain).
    fn labelled_pool() -> StaticPoolPlacement {
        let mut pool = pool();
        pool.hosts = vec![
            labelled(pool.hosts[0].clone(), &[("disk", "nvme")]),
            labelled(pool.hosts[1].clone(), &[("disk", "nvme")]),
            labelled(pool.hosts[2].clone(), &[("disk", "hdd")]),
        ];
        pool
    }

    fn idle() -> BTreeMap<String, HostFacts> {
        ["10.0.0.1:9090", "10.0.0.2:9090", "10.0.0.3:9090"]
            .into_iter()
            .map(|e| (e.to_string(), reachable(0, 0)))
            .collect()
    }

    fn with_maintenance(
        mut pool: StaticPoolPlacement,
        index: usize,
        maintenance: capmvm_api::HostMaintenance,
    ) -> StaticPoolPlacement {
        pool.hosts[index].maintenance = Some(maintenance);
        pool
    }

    /// Each row: the pool, the request's failure domain, control plane, selector; the hosts the
    /// machine may land on (over many machines), or the words the refusal must contain.
    #[test]
    fn host_selection_table() {
        use capmvm_api::HostMaintenance::{Cordon, Evacuate};
        let nvme = selector(&[("disk", "nvme")]);
        let hdd = selector(&[("disk", "hdd")]);
        let ssd = selector(&[("disk", "ssd")]);
        type Row<'a> = (
            StaticPoolPlacement,
            Option<&'a str>,
            bool,
            Option<&'a LabelSelector>,
            Result<&'a [&'a str], &'a [&'a str]>,
        );
        let rows: Vec<Row<'_>> = vec![
            // No selector: every host.
            (
                labelled_pool(),
                None,
                false,
                None,
                Ok(&["10.0.0.1:9090", "10.0.0.2:9090", "10.0.0.3:9090"]),
            ),
            // The selector narrows, and still spreads over what it matches.
            (
                labelled_pool(),
                None,
                false,
                Some(&nvme),
                Ok(&["10.0.0.1:9090", "10.0.0.2:9090"]),
            ),
            (
                labelled_pool(),
                None,
                false,
                Some(&hdd),
                Ok(&["10.0.0.3:9090"]),
            ),
            // Control planes: b matches but refuses them.
            (
                labelled_pool(),
                None,
                true,
                Some(&nvme),
                Ok(&["10.0.0.1:9090"]),
            ),
            // Failure domain and selector together.
            (
                labelled_pool(),
                Some("c"),
                false,
                Some(&hdd),
                Ok(&["10.0.0.3:9090"]),
            ),
            (
                labelled_pool(),
                Some("c"),
                false,
                Some(&nvme),
                Err(&[
                    "NoMatch",
                    "disk=nvme",
                    "0 of 1 considered match",
                    "c: labels disk=hdd do not match",
                ]),
            ),
            // Matching nothing: never anywhere else, every host named with its labels.
            (
                labelled_pool(),
                None,
                false,
                Some(&ssd),
                Err(&[
                    "NoMatch",
                    "disk=ssd",
                    "0 of 3 considered match",
                    "a: labels disk=nvme do not match",
                    "c: labels disk=hdd do not match",
                ]),
            ),
            // Cordoned and evacuating hosts take nothing new, selector or not.
            (
                with_maintenance(labelled_pool(), 2, Cordon),
                None,
                false,
                None,
                Ok(&["10.0.0.1:9090", "10.0.0.2:9090"]),
            ),
            (
                with_maintenance(labelled_pool(), 0, Evacuate),
                None,
                true,
                None,
                Ok(&["10.0.0.3:9090"]),
            ),
            (
                with_maintenance(labelled_pool(), 0, Evacuate),
                Some("r1"),
                true,
                None,
                Err(&[
                    "a: being evacuated for maintenance",
                    "b: control planes not allowed",
                ]),
            ),
            (
                with_maintenance(labelled_pool(), 2, Cordon),
                None,
                false,
                Some(&hdd),
                Err(&[
                    "NoMatch",
                    "1 of 3 considered match",
                    "c: cordoned for maintenance",
                ]),
            ),
        ];
        for (i, (pool, fd, cp, sel, want)) in rows.into_iter().enumerate() {
            let mut landed = std::collections::BTreeSet::new();
            let mut refusal = None;
            for m in 0..40 {
                let key = format!("default/m{m}");
                let request = Request {
                    machine_key: &key,
                    failure_domain: fd,
                    control_plane: cp,
                    host_selector: sel,
                };
                match choose(&pool, &idle(), &request) {
                    Ok(p) => {
                        landed.insert(p.host.to_string());
                    }
                    Err(no) => refusal = Some(no),
                }
            }
            match want {
                Ok(hosts) => {
                    assert!(refusal.is_none(), "row {i}: refused: {refusal:?}");
                    assert_eq!(
                        landed.iter().map(String::as_str).collect::<Vec<_>>(),
                        hosts,
                        "row {i}"
                    );
                }
                Err(words) => {
                    assert!(landed.is_empty(), "row {i}: placed on {landed:?}");
                    let no = refusal.unwrap();
                    for word in words {
                        if *word == "NoMatch" {
                            assert!(no.no_matching_host, "row {i}: {no:?}");
                        } else {
                            assert!(
                                no.message.contains(word),
                                "row {i}: {word:?} not in {}",
                                no.message
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_label_added_later_lets_the_machine_proceed() {
        let ssd = selector(&[("disk", "ssd")]);
        let request = Request {
            machine_key: "default/m1",
            failure_domain: None,
            control_plane: false,
            host_selector: Some(&ssd),
        };
        let mut pool = labelled_pool();
        assert!(choose(&pool, &idle(), &request).is_err());
        pool.hosts[1].labels.insert("disk".into(), "ssd".into());
        assert_eq!(
            choose(&pool, &idle(), &request).unwrap().host.to_string(),
            "10.0.0.2:9090"
        );
    }
}
