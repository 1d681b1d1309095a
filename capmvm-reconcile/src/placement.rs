//! Choosing a host for a new microVM.
//!
//! Rules, in order: the Machine's failure domain (CAPI requires it); hosts that answer and whose
//! credentials are in place; hosts that allow control planes, for control-plane machines; then the least
//! allocated host; ties broken by a stable hash of the machine and the host, so a burst of machines
//! spreads over equal hosts instead of piling onto the first.

use std::collections::BTreeMap;

use capmvm_api::{HostEndpoint, MicrovmHost, StaticPoolPlacement};

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
}

/// Why no host fits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoHost {
    /// A message naming each host's problem.
    pub message: String,
    /// Every candidate host is held back only by missing credentials (a Secret or key).
    pub only_credentials: bool,
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
        });
    }

    let mut problems = Vec::new();
    let mut credential_problems = 0;
    // The tie-break hashes "{machine_key}|{endpoint}"; the machine's part is the same for every host.
    let machine_hash = fnv1a64_extend(
        fnv1a64_extend(FNV1A64_OFFSET, request.machine_key.as_bytes()),
        b"|",
    );
    // The least allocated reachable host, as (load, tie, host, endpoint); the first one on equal keys.
    let mut best: Option<(i64, u64, &MicrovmHost, HostEndpoint)> = None;
    for host in in_domain {
        let name = host.display_name();
        let Ok(endpoint) = host.endpoint.parse::<HostEndpoint>() else {
            problems.push(format!("{name}: endpoint {:?} is invalid", host.endpoint));
            continue;
        };
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
        NoHost {
            message: format!(
                "no host {scope}can take the machine: {}",
                problems.join("; ")
            ),
            only_credentials: credential_problems > 0 && credential_problems == problems.len(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str, ep: &str, fd: Option<&str>, cp: bool) -> MicrovmHost {
        MicrovmHost {
            name: Some(name.into()),
            endpoint: ep.into(),
            controlplane_allowed: cp,
            failure_domain: fd.map(Into::into),
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
            };
            let first = choose(&pool(), &facts, &r).unwrap().host;
            assert_eq!(choose(&pool(), &reversed, &r).unwrap().host, first);
            assert_eq!(choose(&pool(), &facts, &r).unwrap().host, first);
        }
    }
}
