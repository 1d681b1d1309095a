//! The capmvm operator: kube-runtime controllers that gather observations, call the
//! `capmvm-reconcile` engine, carry out its plans and write status. It works unchanged against a real
//! cluster and against the `capmvm-sim` emulator.
//!
//! [`run`] is the whole operator; the binary only parses flags, sets up logging and the client.

pub mod config;
pub mod context;
pub mod controllers;
pub mod convert;
pub mod credentials;
pub mod fault;
pub mod hosts;
pub mod leader;
pub mod metrics;
pub mod patch;
pub mod rbac;
pub mod server;
pub mod watch;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use capmvm_api::MicrovmMachineTemplate;
use capmvm_flintlock::{ClientPool, PoolOptions};
use futures::StreamExt;
use kube::runtime::Controller;
use kube::runtime::controller::Config as ControllerConfig;
use kube::runtime::events::{Recorder, Reporter};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tracing::{info, warn};

use crate::config::{Flags, parse_listen_addr};
use crate::context::{Backoff, Ctx};
use crate::hosts::Hosts;
use crate::metrics::Metrics;
use crate::server::Readiness;
use crate::watch::{HostWake, Scope, Triggers};

/// Runs the operator until `shutdown` completes (clean stop) or leadership is lost (an error: the
/// process should exit and be restarted).
pub async fn run(
    flags: Flags,
    client: kube::Client,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let metrics = Metrics::new();
    let readiness = Readiness::default();
    let mut servers = Vec::new();
    if let Some(addr) = parse_listen_addr(&flags.health_addr).map_err(anyhow::Error::msg)? {
        let r = readiness.clone();
        servers.push(tokio::spawn(async move {
            if let Err(e) = server::serve_health(addr, r).await {
                warn!(%addr, error = %e, "health endpoint stopped");
            }
        }));
    }
    if let Some(addr) = parse_listen_addr(&flags.diagnostics_address).map_err(anyhow::Error::msg)? {
        let m = metrics.clone();
        servers.push(tokio::spawn(async move {
            if let Err(e) = server::serve_metrics(addr, m).await {
                warn!(%addr, error = %e, "metrics endpoint stopped");
            }
        }));
    }

    let shutdown = futures::future::FutureExt::shared(Box::pin(shutdown));
    let leadership = if flags.leader_elect {
        let namespace = [&flags.leader_election_namespace, &flags.namespace]
            .into_iter()
            .find(|s| !s.is_empty())
            .cloned()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .unwrap_or_else(|| "default".to_string());
        let election = leader::Election {
            name: flags.leader_election_id.clone(),
            namespace,
            identity: leader::identity(),
            lease_duration: flags.leader_elect_lease_duration,
            renew_deadline: flags.leader_elect_renew_deadline,
            retry_period: flags.leader_elect_retry_period,
        };
        // A standby is a healthy candidate.
        readiness.set_ready();
        tokio::select! {
            leadership = election.acquire(client.clone()) => Some(leadership),
            () = shutdown.clone() => return Ok(()),
        }
    } else {
        None
    };

    let scope = Scope {
        namespace: flags.namespace.clone(),
        watch_filter: flags.watch_filter.clone(),
    };
    let (machine_tx, machine_rx) = tokio::sync::mpsc::unbounded_channel();
    let (cluster_tx, cluster_rx) = tokio::sync::mpsc::unbounded_channel();
    let triggers = Triggers {
        machine: machine_tx,
        cluster: cluster_tx,
    };
    let (stores, watch_tasks) = watch::start(&client, &scope, &triggers);
    let pool = ClientPool::new(PoolOptions {
        call_timeout: flags.flintlock_call_timeout,
        observer: Some(metrics.clone()),
        ..PoolOptions::default()
    });
    let hosts = Hosts::new(
        pool,
        metrics.clone(),
        Arc::new(HostWake {
            triggers: triggers.clone(),
            stores: stores.clone(),
        }),
        flags.host_poll_interval,
        flags.host_poll_interval_busy,
    );
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        scope: scope.clone(),
        stores: stores.clone(),
        hosts: hosts.clone(),
        credentials: credentials::Credentials::new(client.clone()),
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "capmvm-operator".into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        ),
        metrics: metrics.clone(),
        backoff: Backoff::default(),
        sync_period: flags.sync_period,
        fault: fault::Fault::from_env(),
    });

    info!("waiting for watch caches");
    tokio::select! {
        ready = stores.wait_until_ready() => ready.context("watch caches stopped before their first list")?,
        () = shutdown.clone() => return Ok(()),
    }
    readiness.set_ready();
    info!(namespace = %scope.namespace, watch_filter = %scope.watch_filter, "caches synced; starting controllers");

    let machines = Controller::for_stream(futures::stream::empty(), stores.machines.clone())
        .with_config(ControllerConfig::default().concurrency(flags.microvmmachine_concurrency))
        .reconcile_on(UnboundedReceiverStream::new(machine_rx))
        .graceful_shutdown_on(shutdown.clone())
        .run(
            controllers::machine::reconcile,
            controllers::error_policy,
            ctx.clone(),
        )
        .for_each(|_| async {});
    let clusters =
        Controller::for_stream(futures::stream::empty(), stores.microvm_clusters.clone())
            .with_config(ControllerConfig::default().concurrency(flags.microvmcluster_concurrency))
            .reconcile_on(UnboundedReceiverStream::new(cluster_rx))
            .graceful_shutdown_on(shutdown.clone())
            .run(
                controllers::cluster::reconcile,
                controllers::error_policy,
                ctx.clone(),
            )
            .for_each(|_| async {});
    let templates = Controller::new(
        scope.api::<MicrovmMachineTemplate>(&client),
        watcher_config(&scope),
    )
    .with_config(ControllerConfig::default().concurrency(flags.microvmmachinetemplate_concurrency))
    .graceful_shutdown_on(shutdown.clone())
    .run(
        controllers::template::reconcile,
        controllers::error_policy,
        ctx.clone(),
    )
    .for_each(|_| async {});
    let reaper = {
        let hosts = hosts.clone();
        let unwanted_after = flags.sync_period * 2 + Duration::from_secs(60);
        async move {
            loop {
                tokio::time::sleep(Duration::from_secs(60)).await;
                hosts.forget_unwanted(unwanted_after);
            }
        }
    };

    let lost = async {
        match &leadership {
            Some(l) => {
                let mut lost = l.lost.clone();
                let _ = lost.wait_for(|lost| *lost).await;
            }
            None => futures::future::pending::<()>().await,
        }
    };
    let outcome = tokio::select! {
        _ = futures::future::join3(machines, clusters, templates) => Ok(()),
        () = reaper => Ok(()),
        () = lost => Err(anyhow::anyhow!("leadership lost")),
    };
    for task in watch_tasks.iter().chain(servers.iter()) {
        task.abort();
    }
    if let Some(l) = leadership
        && outcome.is_ok()
    {
        l.release().await;
    }
    info!("operator stopped");
    outcome
}

fn watcher_config(scope: &Scope) -> kube::runtime::watcher::Config {
    let config = kube::runtime::watcher::Config::default().any_semantic();
    if scope.watch_filter.is_empty() {
        config
    } else {
        config.labels(&format!(
            "{}={}",
            capmvm_api::keys::WATCH_FILTER_LABEL,
            scope.watch_filter
        ))
    }
}
