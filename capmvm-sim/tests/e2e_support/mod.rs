//! Helpers shared by end-to-end test files: a world with its operator, waiting for machines, and
//! reading what a user would see on the API and the hosts.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use capmvm_api::MicrovmMachine;
use capmvm_flintlock::{Method, MicrovmState};
use capmvm_sim::world::{World, WorldOptions, wait_for};
use k8s_openapi::api::events::v1::Event;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

pub const NS: &str = "default";
pub const WAIT: Duration = Duration::from_secs(90);
pub const POLL: Duration = Duration::from_millis(200);

pub fn options(hosts: usize) -> WorldOptions {
    let mut o = WorldOptions::new(
        hosts,
        Duration::from_millis(500),
        PathBuf::from(env!("CARGO_BIN_EXE_capmvm-sim")),
    );
    o.operator_flags = vec![
        "--host-poll-interval=2s".into(),
        "--host-poll-interval-busy=200ms".into(),
        "--log-level=capmvm_operator=debug,info".into(),
    ];
    o
}

/// A world with its operator running.
pub async fn world(options: WorldOptions) -> World {
    let mut w = World::start(options).await.expect("world starts");
    w.start_operator(&[]).expect("operator starts");
    w
}

pub fn counts(control_planes: usize, workers: usize) -> [(&'static str, String); 2] {
    [
        ("CONTROL_PLANE_MACHINE_COUNT", control_planes.to_string()),
        ("WORKER_MACHINE_COUNT", workers.to_string()),
    ]
}

pub fn ready_condition(m: &MicrovmMachine) -> Option<(String, String, String)> {
    m.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

pub fn is_ready(m: &MicrovmMachine) -> bool {
    ready_condition(m).is_some_and(|(s, _, _)| s == "True")
}

/// Waits until exactly `n` MicrovmMachines exist and all are Ready, for up to `within`.
pub async fn wait_ready_within(w: &World, n: usize, within: Duration) -> Vec<MicrovmMachine> {
    let log = w.operator_log();
    wait_for(
        &format!("{n} ready machines (operator log: {})", log.display()),
        within,
        POLL,
        || async {
            let ms = w.microvm_machines(NS).await?;
            Ok((ms.len() == n && ms.iter().all(is_ready)).then_some(ms))
        },
    )
    .await
    .unwrap()
}

/// Waits until every machine whose name starts with `prefix` has Ready reason `reason`.
pub async fn wait_reason(w: &World, prefix: &str, n: usize, reason: &str) -> Vec<MicrovmMachine> {
    wait_for(
        &format!("{n} machines {prefix}* with reason {reason}"),
        WAIT,
        POLL,
        || async {
            let ms: Vec<MicrovmMachine> = w
                .microvm_machines(NS)
                .await?
                .into_iter()
                .filter(|m| m.name_any().starts_with(prefix))
                .collect();
            let ok = ms.len() == n
                && ms
                    .iter()
                    .all(|m| ready_condition(m).is_some_and(|(_, r, _)| r == reason));
            Ok(ok.then_some(ms))
        },
    )
    .await
    .unwrap()
}

/// Microvms on the hosts that are not being deleted, with their host's endpoint.
pub fn live_vms(w: &World) -> Vec<(String, capmvm_flintlock::Microvm)> {
    w.all_vms()
        .into_iter()
        .filter(|(_, vm)| vm.state() != MicrovmState::Deleting)
        .map(|(h, vm)| (h, vm.microvm))
        .collect()
}

/// Create calls the hosts answered (successful or not).
pub fn creates_on_hosts(w: &World) -> u64 {
    capmvm_sim::stack::host_calls(&w.hosts, Method::Create)
}

pub async fn events_for(w: &World, name: &str) -> Vec<Event> {
    Api::<Event>::namespaced(w.client.clone(), NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect()
}

/// Reconciles counted in a metrics scrape, of one controller or all.
pub fn reconciles_in(text: &str, controller: Option<&str>) -> u64 {
    text.lines()
        .filter(|l| l.starts_with("controller_runtime_reconcile_total{"))
        .filter(|l| controller.is_none_or(|c| l.contains(&format!("controller=\"{c}\""))))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}
