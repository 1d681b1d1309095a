//! The placement turn and its reservations, without a host.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use super::*;
use capmvm_flintlock::PoolOptions;
use capmvm_reconcile::ObservedVm;

struct NoWake;

impl Wake for NoWake {
    fn microvm_changed(&self, _: &str, _: &str) {}
    fn unmarked_microvm_changed(&self, _: &str, _: &str) {}
    fn host_changed(&self, _: &str) {}
}

const ENDPOINTS: [&str; 3] = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"];

fn hosts() -> Arc<Hosts> {
    let hour = Duration::from_secs(3600);
    let hosts = Hosts::new(
        ClientPool::new(PoolOptions::default()),
        Metrics::new(),
        Arc::new(NoWake),
        hour,
        hour,
    );
    for endpoint in ENDPOINTS {
        hosts.ensure(&HostConfig::new(endpoint));
    }
    hosts
}

/// One placement as the machine controller makes it: read the allocation, take the least
/// allocated host, claim it.
fn place_one(hosts: &Hosts, machine: usize) -> String {
    hosts.place(|| {
        let chosen = ENDPOINTS
            .iter()
            .min_by_key(|e| (hosts.allocation(e).0, **e))
            .unwrap()
            .to_string();
        let claim = Claim {
            endpoint: chosen.clone(),
            machine_uid: format!("uid-{machine}"),
            vcpu: 2,
            memory_mb: 2048,
        };
        (chosen, Some(claim))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placements_at_the_same_instant_see_each_other() {
    let hosts = hosts();
    let per_host = std::thread::scope(|s| {
        let placed: Vec<_> = (0..30)
            .map(|i| {
                let hosts = &hosts;
                s.spawn(move || place_one(hosts, i))
            })
            .collect();
        let mut per_host: BTreeMap<String, usize> = BTreeMap::new();
        for p in placed {
            *per_host.entry(p.join().unwrap()).or_default() += 1;
        }
        per_host
    });
    assert_eq!(per_host.values().copied().collect::<Vec<_>>(), [10, 10, 10]);
    for endpoint in ENDPOINTS {
        assert_eq!(hosts.allocation(endpoint).0, 20);
        assert_eq!(hosts.allocation(endpoint).1, 10 * 2048);
    }
    // A placement's read of every host at once says the same, and nothing of a host not there.
    let mut facts: BTreeMap<String, HostFacts> = ENDPOINTS
        .iter()
        .chain(&["unobserved.invalid:9090"])
        .map(|e| (e.to_string(), HostFacts::default()))
        .collect();
    hosts.fill_allocation(&mut facts);
    for (endpoint, fact) in &facts {
        assert_eq!(
            (fact.allocated_vcpu, fact.allocated_memory_mb),
            hosts.allocation(endpoint),
            "{endpoint}"
        );
    }
    assert_eq!(facts["unobserved.invalid:9090"].allocated_vcpu, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_placement_no_longer_counts() {
    let hosts = hosts();
    let chosen = place_one(&hosts, 1);
    assert_eq!(hosts.allocation(&chosen).0, 2);
    // Placing the same machine again replaces its reservation rather than adding one.
    hosts.reserve(&chosen, "uid-1", 2, 2048);
    assert_eq!(hosts.allocation(&chosen).0, 2);
    hosts.release_reservation(&chosen, "uid-1");
    assert_eq!(hosts.allocation(&chosen).0, 0);
}

pub(super) fn vm(uid: &str, machine_uid: &str, state: VmState) -> HostVm {
    HostVm {
        vm: ObservedVm {
            uid: uid.to_string(),
            namespace: "ns".to_string(),
            name: uid.to_string(),
            state,
            retry: 0,
            machine_uid: Some(machine_uid.to_string()),
            cluster: None,
            running: None,
        },
        vcpu: 2,
        memory_mb: 2048,
    }
}

/// The totals a list carries follow every change recorded on the snapshot: a created microVM is
/// counted once (not again through its placement's reservation), a deleting one no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocation_follows_listed_and_recorded_microvms() {
    let hosts = hosts();
    let endpoint = ENDPOINTS[0];
    // The observer's first list (nothing listens there) must not overwrite what is set below.
    let config = HostConfig::new(endpoint);
    for _ in 0..250 {
        if hosts.snapshot(&config).unwrap().reachability != Reachability::Unknown {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    {
        let entries = hosts.entries.lock().unwrap();
        let entry = entries[endpoint].values().next().unwrap();
        let mut snapshot = entry.state.snapshot.write().unwrap();
        snapshot.reachability = Reachability::Reachable;
        snapshot.vms = Arc::new(ListedVms::new(vec![
            vm("vm-a", "uid-a", VmState::Created),
            vm("vm-b", "uid-b", VmState::Deleting),
        ]));
    }
    assert_eq!(
        hosts.allocation(endpoint),
        (2, 2048),
        "deleting holds nothing"
    );
    hosts.reserve(endpoint, "uid-c", 2, 2048);
    assert_eq!(hosts.allocation(endpoint), (4, 4096));
    hosts.update(endpoint, "vm-c", InFlight::created, |vms| {
        vms.push(vm("vm-c", "uid-c", VmState::Pending))
    });
    assert_eq!(
        hosts.allocation(endpoint),
        (4, 4096),
        "listed and reserved count once"
    );
    hosts.update(endpoint, "vm-a", InFlight::deleted, |vms| {
        vms[0].vm.state = VmState::Deleting
    });
    assert_eq!(hosts.allocation(endpoint), (2, 2048));
    assert_eq!(hosts.allocation(ENDPOINTS[1]), (0, 0));
}

#[derive(Default)]
struct RecordWake(std::sync::Mutex<Vec<String>>);

impl Wake for RecordWake {
    fn microvm_changed(&self, ns: &str, name: &str) {
        self.0.lock().unwrap().push(format!("ours {ns}/{name}"));
    }
    fn unmarked_microvm_changed(&self, ns: &str, name: &str) {
        self.0.lock().unwrap().push(format!("unmarked {ns}/{name}"));
    }
    fn host_changed(&self, _: &str) {}
}

/// A microVM without our marker (another provider's, adopted) wakes its machine by name when it
/// changes or goes, as ours do; it is told apart, so that only a machine of that name is woken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unmarked_microvm_that_changes_or_goes_wakes_by_name() {
    let wake = Arc::new(RecordWake::default());
    let hour = Duration::from_secs(3600);
    let hosts = Hosts::new(
        ClientPool::new(PoolOptions::default()),
        Metrics::new(),
        wake.clone(),
        hour,
        hour,
    );
    let endpoint = ENDPOINTS[0];
    hosts.ensure(&HostConfig::new(endpoint));
    let state = {
        let entries = hosts.entries.lock().unwrap();
        entries[endpoint].values().next().unwrap().state.clone()
    };
    let mut theirs = vm("vm-go", "", VmState::Created);
    theirs.vm.machine_uid = None;
    let ours = vm("vm-ours", "uid-a", VmState::Created);
    hosts.publish(
        endpoint,
        &state,
        Reachability::Reachable,
        Some(vec![ours.clone(), theirs.clone()]),
    );
    let seen = std::mem::take(&mut *wake.0.lock().unwrap());
    assert_eq!(seen, ["unmarked ns/vm-go", "ours ns/vm-ours"], "appeared");
    theirs.vm.state = VmState::Deleting;
    hosts.publish(
        endpoint,
        &state,
        Reachability::Reachable,
        Some(vec![ours.clone(), theirs]),
    );
    let seen = std::mem::take(&mut *wake.0.lock().unwrap());
    assert_eq!(seen, ["unmarked ns/vm-go"], "deleting");
    hosts.publish(endpoint, &state, Reachability::Reachable, Some(vec![ours]));
    let seen = std::mem::take(&mut *wake.0.lock().unwrap());
    assert_eq!(seen, ["unmarked ns/vm-go"], "gone");
}

/// A busy host is asked about its microVMs in flight alone (a Get each), and listed whole only
/// at the poll interval: a microVM created here is seen CREATED without another list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_host_is_asked_about_its_microvms_in_flight_not_listed_whole() {
    use capmvm_flintlock::hollow::{HollowConfig, HollowHost};
    let host = HollowHost::start(HollowConfig {
        provision_time: Duration::from_millis(300),
        ..HollowConfig::default()
    })
    .await
    .unwrap();
    let config = HostConfig::new(host.endpoint());
    let hosts = Hosts::new(
        ClientPool::new(PoolOptions::default()),
        Metrics::new(),
        Arc::new(NoWake),
        Duration::from_secs(3600),
        Duration::from_millis(50),
    );
    hosts.ensure(&config);
    for _ in 0..250 {
        if hosts.snapshot(&config).unwrap().reachability == Reachability::Reachable {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        host.control().counters().of(capmvm_flintlock::Method::List),
        1
    );

    let client = hosts.client(&config).unwrap();
    let spec = capmvm_flintlock::MicrovmSpec {
        id: "m1".to_string(),
        namespace: "ns".to_string(),
        vcpu: 2,
        memory_mb: 2048,
        kernel: capmvm_flintlock::Kernel {
            image: "ghcr.io/liquidmetal-dev/flintlock-kernel:5.10.77".to_string(),
            filename: Some("boot/vmlinux".to_string()),
            ..Default::default()
        },
        root_volume: Some(capmvm_flintlock::Volume {
            id: "root".to_string(),
            source: capmvm_flintlock::VolumeSource {
                container_source: Some("ghcr.io/liquidmetal-dev/ubuntu:22.04".to_string()),
                virtiofs_source: None,
            },
            ..Default::default()
        }),
        interfaces: vec![capmvm_flintlock::NetworkInterface {
            device_id: "eth1".to_string(),
            iface_type: capmvm_flintlock::IfaceType::Tap,
            guest_mac: None,
            address: None,
        }],
        ..Default::default()
    };
    let vm = client.create(spec).await.unwrap();
    hosts.record_created(&config.endpoint, &vm);
    let mut state = VmState::Pending;
    for _ in 0..100 {
        let snapshot = hosts.snapshot(&config).unwrap();
        state = snapshot
            .vms
            .iter()
            .find(|hv| hv.vm.uid == vm.uid())
            .unwrap()
            .vm
            .state;
        if state == VmState::Created {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(state, VmState::Created);
    let counters = host.control().counters();
    assert_eq!(
        counters.of(capmvm_flintlock::Method::List),
        1,
        "no list while busy"
    );
    assert!(counters.of(capmvm_flintlock::Method::Get) >= 1);
}

/// Observers are per credentials: two configs of one endpoint are two observers, and one no
/// MicrovmCluster declares any more stops, with its gauges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_are_per_credentials_and_stop_with_their_gauges() {
    let hosts = hosts();
    hosts.sweep(Duration::ZERO);
    assert!(
        hosts.entries.lock().unwrap().is_empty(),
        "nobody declared them"
    );

    let mut a = HostConfig::new(ENDPOINTS[0]);
    a.basic_auth_token = Some(capmvm_flintlock::SecretString::new("token-a".to_string()));
    let mut b = a.clone();
    b.basic_auth_token = Some(capmvm_flintlock::SecretString::new("token-b".to_string()));
    hosts.declare("ns/a", [a.clone()]);
    hosts.declare("ns/b", [b.clone()]);
    assert_eq!(hosts.entries.lock().unwrap()[ENDPOINTS[0]].len(), 2);
    // The first list (nothing listens there) publishes the endpoint's gauge.
    let gauge = format!("capmvm_host_reachable{{host=\"{}\"}}", ENDPOINTS[0]);
    for _ in 0..100 {
        if hosts.metrics.encode().contains(&gauge) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(hosts.metrics.encode().contains(&gauge));

    hosts.forget_owner("ns/a");
    hosts.sweep(Duration::ZERO);
    assert!(hosts.snapshot(&a).is_none(), "a is not observed any more");
    assert!(hosts.snapshot(&b).is_some(), "b still is");
    assert!(
        hosts.metrics.encode().contains(&gauge),
        "b speaks for the host"
    );

    hosts.forget_owner("ns/b");
    hosts.sweep(Duration::ZERO);
    assert!(hosts.entries.lock().unwrap().is_empty());
    assert!(
        !hosts.metrics.encode().contains(&gauge),
        "no observer left: the gauge goes"
    );
}

/// Rotated credentials: the MicrovmCluster declares the host under the new ones, and the observer
/// under the old ones stops at once (it could only fail against a host that moved on), unless
/// another MicrovmCluster still declares them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaced_credentials_stop_their_observer_at_once() {
    let hosts = hosts();
    hosts.sweep(Duration::ZERO);
    let mut old = HostConfig::new(ENDPOINTS[0]);
    old.basic_auth_token = Some(capmvm_flintlock::SecretString::new("old".to_string()));
    let mut new = old.clone();
    new.basic_auth_token = Some(capmvm_flintlock::SecretString::new("new".to_string()));

    hosts.declare("ns/a", [old.clone()]);
    hosts.declare("ns/b", [old.clone()]);
    hosts.declare("ns/a", [new.clone()]);
    assert!(
        hosts.snapshot(&old).is_some(),
        "ns/b still uses the old ones"
    );
    assert!(hosts.snapshot(&new).is_some());

    hosts.declare("ns/b", [new.clone()]);
    assert!(hosts.snapshot(&old).is_none(), "nobody uses the old ones");
    assert!(hosts.snapshot(&new).is_some());
    assert_eq!(hosts.entries.lock().unwrap()[ENDPOINTS[0]].len(), 1);

    // A host leaving the pool is not a replacement: its observer waits for the sweep (a machine
    // may still live there).
    let other = HostConfig::new(ENDPOINTS[1]);
    hosts.declare("ns/a", [new.clone(), other.clone()]);
    hosts.declare("ns/a", [new.clone()]);
    assert!(hosts.snapshot(&other).is_some());
}
