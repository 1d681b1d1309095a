//! The MicrovmCluster controller: gather the cluster's hosts (through its own credentials), machines,
//! credential Secrets and the microVMs on its hosts; let the engine decide; carry out the plan.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use capmvm_api::keys::{CLUSTER_FINALIZER, CREDENTIALS_FINALIZER};
use capmvm_api::{HostEndpoint, MicrovmCluster};
use capmvm_flintlock::HostConfig;
use capmvm_reconcile::cluster::hosts_to_observe;
use capmvm_reconcile::machine::{origin_uid, recorded_host};
use capmvm_reconcile::{
    CredentialSecret, HostFacts, HostedVm, ObservedCluster, Reachability, decide_cluster,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tracing::{debug, info, instrument};

use super::{Error, Outcome, Reconciled, publish, wrap};
use crate::context::Ctx;
use crate::patch;
use crate::watch::{credential_secret_names, owner_cluster_name};

/// Controller name in metrics and events.
pub const CONTROLLER: &str = "microvmcluster";

/// Reconciles one MicrovmCluster.
#[instrument(skip_all, fields(cluster = %format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())))]
pub async fn reconcile(obj: Arc<MicrovmCluster>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    wrap(
        CONTROLLER,
        obj,
        ctx,
        |_, _| false,
        |mc, ctx| async move {
            let versions = vec![mc.resource_version().unwrap_or_default()];
            let result = reconcile_once(&mc, &ctx).await;
            Reconciled { result, versions }
        },
    )
    .await
}

/// The key a MicrovmCluster declares its host observers under.
pub fn observer_owner(mc: &MicrovmCluster) -> String {
    format!("{}/{}", mc.namespace().unwrap_or_default(), mc.name_any())
}

async fn reconcile_once(mc: &MicrovmCluster, ctx: &Ctx) -> Result<Outcome, Error> {
    let obs = gather(ctx, mc).await?;
    let plan = decide_cluster(&obs, Timestamp::now());
    debug!(
        add_finalizer = plan.add_finalizer,
        protect = plan.protect_secrets.len(),
        release = plan.release_secrets.len(),
        remove_finalizer = plan.remove_finalizer,
        machines = obs.machines.len(),
        microvms = obs.microvms.len(),
        requeue = ?plan.requeue,
        "decided"
    );
    ctx.metrics.orphaned_microvms(
        &observer_owner(mc),
        capmvm_reconcile::cluster::orphans(&obs).len(),
    );
    let ns = mc.namespace().unwrap_or_default();
    let api: Api<MicrovmCluster> = Api::namespaced(ctx.client.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let mut current = mc.clone();

    // 1. The finalizer; 2. the credential Secrets' finalizers.
    if plan.add_finalizer {
        current = patch::add_metadata(&api, &current, Some(CLUSTER_FINALIZER), &[]).await?;
    }
    for name in &plan.protect_secrets {
        secret_finalizer(ctx, &secrets, &ns, name, true).await?;
    }
    // 3. The status.
    if let Some(status) = &plan.status
        && let Some(updated) =
            patch::status(&api, &current, current.status.as_ref(), status).await?
    {
        current = updated;
    }
    // 4. Events.
    for event in &plan.events {
        publish(ctx, &current, event).await;
    }
    // 5. Releases; 6. the object's own finalizer last.
    for name in &plan.release_secrets {
        secret_finalizer(ctx, &secrets, &ns, name, false).await?;
    }
    if plan.remove_finalizer {
        patch::remove_finalizer(&api, &current, CLUSTER_FINALIZER).await?;
        info!("every MicrovmMachine is gone; finalizer released");
        ctx.hosts.forget_owner(&observer_owner(mc));
        ctx.metrics.cluster_forgotten(&observer_owner(mc));
        return Ok(Outcome::Gone);
    }
    Ok(Outcome::Requeue(plan.requeue))
}

/// Adds or removes the credentials finalizer on Secret `name`, as the watched metadata shows it.
async fn secret_finalizer(
    ctx: &Ctx,
    api: &Api<Secret>,
    ns: &str,
    name: &str,
    add: bool,
) -> Result<(), Error> {
    let Some(meta) = ctx.stores.secrets.get(&ObjectRef::new(name).within(ns)) else {
        return Ok(());
    };
    patch::metadata_finalizer(api, meta.as_ref(), CREDENTIALS_FINALIZER, add).await?;
    Ok(())
}

/// Everything the engine decides a MicrovmCluster from.
async fn gather(ctx: &Ctx, mc: &MicrovmCluster) -> Result<ObservedCluster, Error> {
    let ns = mc.namespace().unwrap_or_default();
    let owner = ctx.stores.owner_cluster(mc);
    let cluster_name = owner_cluster_name(mc);
    let in_namespace: Vec<_> = ctx
        .stores
        .machines
        .state()
        .into_iter()
        .filter(|m| m.namespace().as_deref() == Some(ns.as_str()))
        .collect();
    let own_machines: Vec<_> = in_namespace
        .iter()
        .filter(|m| {
            cluster_name.is_some()
                && m.labels().get(capmvm_api::keys::CLUSTER_NAME_LABEL) == cluster_name.as_ref()
        })
        .collect();

    // The hosts the engine says the cluster observes (paused or deleted too), each through this
    // cluster's own credentials: the pool's configs come built.
    let observed = hosts_to_observe(mc, own_machines.iter().filter_map(|m| recorded_host(m)));
    let mut configs = ctx.credentials.host_configs(mc).await?.as_ref().clone();
    configs.retain(|endpoint, _| observed.contains(endpoint));
    for endpoint in &observed {
        if configs.contains_key(endpoint) {
            continue;
        }
        let Ok(host) = endpoint.parse::<HostEndpoint>() else {
            continue;
        };
        let config = ctx.credentials.host_config(mc, &host).await?;
        configs.insert(endpoint.clone(), config);
    }
    let usable: Vec<HostConfig> = configs
        .values()
        .filter_map(|c| c.as_ref().ok())
        .cloned()
        .collect();
    ctx.hosts.declare(&observer_owner(mc), usable);

    let mut hosts = BTreeMap::new();
    let mut microvms = Vec::new();
    for (endpoint, config) in configs {
        let facts = match config {
            Ok(config) => {
                if let Some(snapshot) = ctx.hosts.snapshot(&config)
                    && snapshot.reachability == Reachability::Reachable
                {
                    microvms.extend(snapshot.vms.iter().filter(|hv| hv.vm.namespace == ns).map(
                        |hv| HostedVm {
                            host: endpoint.clone(),
                            vm: hv.vm.clone(),
                        },
                    ));
                }
                ctx.hosts.facts(&config)
            }
            Err(problem) => HostFacts {
                credentials_problem: Some(problem),
                ..HostFacts::default()
            },
        };
        hosts.insert(endpoint, facts);
    }

    let others: Vec<Arc<MicrovmCluster>> = ctx
        .stores
        .microvm_clusters
        .state()
        .into_iter()
        .filter(|o| o.namespace().as_deref() == Some(ns.as_str()) && o.uid() != mc.uid())
        .collect();
    // Which of its hosts the namespace's other MicrovmClusters list, and for which Clusters.
    let mut shared_hosts: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for other in &others {
        let Some(cluster) = owner_cluster_name(other) else {
            continue;
        };
        for host in other
            .spec
            .placement
            .static_pool
            .iter()
            .flat_map(|p| &p.hosts)
        {
            if let Ok(endpoint) = host.endpoint.parse::<HostEndpoint>()
                && hosts.contains_key(&endpoint.to_string())
            {
                shared_hosts
                    .entry(endpoint.to_string())
                    .or_default()
                    .insert(cluster.clone());
            }
        }
    }
    let credential_secrets = credential_secret_names(mc)
        .into_iter()
        .map(|name| {
            let meta = ctx.stores.secrets.get(&ObjectRef::new(name).within(&ns));
            CredentialSecret {
                name: name.to_string(),
                exists: meta.is_some(),
                protected: meta
                    .is_some_and(|m| m.finalizers().iter().any(|f| f == CREDENTIALS_FINALIZER)),
                other_users: others
                    .iter()
                    .filter(|o| credential_secret_names(o).contains(&name))
                    .count(),
            }
        })
        .collect();
    let protected_secrets = ctx
        .stores
        .secrets
        .state()
        .iter()
        .filter(|s| s.namespace().as_deref() == Some(ns.as_str()))
        .filter(|s| s.finalizers().iter().any(|f| f == CREDENTIALS_FINALIZER))
        .map(|s| s.name_any())
        .collect();
    let named_by_others = others
        .iter()
        .flat_map(|o| credential_secret_names(o))
        .map(str::to_string)
        .collect();

    Ok(ObservedCluster {
        microvm_cluster: mc.clone(),
        owner,
        hosts,
        machines: own_machines.iter().map(|m| m.name_any()).collect(),
        known_machine_uids: in_namespace
            .iter()
            .flat_map(|m| [m.uid(), origin_uid(m).map(str::to_string)])
            .flatten()
            .collect(),
        microvms,
        shared_hosts,
        credential_secrets,
        protected_secrets,
        named_by_others,
        sees_every_cluster: ctx.scope.watch_filter.is_empty(),
    })
}
