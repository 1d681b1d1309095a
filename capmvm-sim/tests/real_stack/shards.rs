//! Operators sharded by `--watch-filter`, as CAPI providers shard: several Deployments, each with
//! its own label value and Lease, splitting the clusters (and their hosts) between them.

use super::*;
use capmvm_api::keys::WATCH_FILTER_LABEL;

/// Two operators, `--watch-filter=shard-a` and `=shard-b`, each with its own Lease, and two clusters
/// labelled one for each, on disjoint hosts (each MicrovmCluster names its shard's two of four), on
/// real Cluster API: the label reaches the workers' Machines and MicrovmMachines through real core's
/// MachineSet (the control plane's through the stack's KubeadmControlPlane stand-in, which copies
/// `machineTemplate.metadata.labels` as real KCP does); every list and watch of a shard but the
/// Secrets' (unfiltered by design, metadata only) asks the API server for its label; each cluster
/// becomes ready with one microVM per machine; every write a shard makes is to its own cluster's
/// namespace (or its own Lease); and a cluster deleted is cleaned up by its shard, finalizers
/// released, while the other's microVMs stay untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_sharded_by_watch_filter_each_reconcile_only_their_clusters() {
    let _one = ONE_AT_A_TIME.lock().await;
    let test = "operators_sharded_by_watch_filter_each_reconcile_only_their_clusters";
    if Binaries::for_test(test, BINARIES).is_none() {
        return;
    }
    let mut opts = options();
    opts.hosts = 4;
    let mut real = RealStack::start(opts).await.expect("the real stack starts");
    let endpoints = real.endpoints();
    let kubeconfig = real.operator_kubeconfig.clone();
    let shard_flags = |shard: &str| {
        vec![
            format!("--watch-filter={shard}"),
            "--leader-elect".to_string(),
            format!("--leader-election-namespace={}", components::NAMESPACE),
            format!("--leader-election-id=capmvm-{shard}"),
        ]
    };
    // One serves the conversion webhook the CRDs name (out of cluster there is no Service to
    // spread it over both); the API server calls it for either shard's objects.
    let shard_a = real
        .spawn_replica("shard-a", &kubeconfig, &shard_flags("shard-a"), true)
        .expect("shard-a starts");
    let shard_b = real
        .spawn_replica("shard-b", &kubeconfig, &shard_flags("shard-b"), false)
        .expect("shard-b starts");

    let shards = [
        ("shard-a", "team-a", "alpha", &endpoints[..2]),
        ("shard-b", "team-b", "beta", &endpoints[2..]),
    ];
    for (shard, ns, name, hosts) in shards {
        apply_cluster_with(&mut real, ns, name, [1, 2, 0], |objects| {
            label_for_shard(objects, shard, hosts)
        })
        .await;
    }
    for (_, ns, name, _) in shards {
        wait_ready_with_nodes(&real, ns, name, 3).await;
    }

    // Real core carried the label from the templates to every Machine and MicrovmMachine.
    for (shard, ns, _, hosts) in shards {
        for m in machines_in(&real, ns).await {
            assert_eq!(
                m.labels().get(WATCH_FILTER_LABEL).map(String::as_str),
                Some(shard),
                "Machine {ns}/{}",
                m.name_any()
            );
        }
        // One microVM per machine, each on one of its shard's hosts.
        let vms = live_vms_in(&real, ns);
        assert_eq!(vms.len(), 3, "{ns}'s microVMs: {vms:?}");
        for (host, _, id) in &vms {
            assert!(
                hosts.contains(host),
                "{id} is on {host}, not {shard}'s hosts {hosts:?}"
            );
        }
    }
    assert_eq!(
        real.flintlock_calls()
            .get("CreateMicroVM")
            .copied()
            .unwrap_or(0),
        6,
        "one create per machine, none twice"
    );

    // Each shard holds its own Lease, both at once.
    for (shard, ..) in shards {
        let holder = real
            .kubectl
            .run(&[
                "get",
                "lease",
                &format!("capmvm-{shard}"),
                "-n",
                components::NAMESPACE,
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ])
            .await
            .unwrap();
        assert!(
            holder.starts_with(&format!("{shard}_")),
            "lease capmvm-{shard} held by {holder:?}"
        );
    }

    // The cluster of shard-a deleted: shard-a removes its microVMs; shard-b's stay as they were.
    let beta_before = live_vms_in(&real, "team-b");
    real.kubectl
        .run(&["delete", "cluster", "alpha", "-n", "team-a", "--wait=false"])
        .await
        .unwrap();
    wait_no_vms_in(&real, "team-a").await;
    wait_cluster_objects_gone(&real, "team-a").await.unwrap();
    let beta_after = live_vms_in(&real, "team-b");
    assert_eq!(beta_before, beta_after, "shard-b's microVMs untouched");

    // What each shard asked the API server for and wrote, from its audit log entries.
    let requests = real.audit().unwrap().requests().unwrap();
    for (shard, ns, ..) in shards {
        let agent = format!("({shard})");
        let mine: Vec<_> = requests
            .iter()
            .filter(|e| e.user_agent.ends_with(&agent))
            .collect();
        let selector = format!("labelSelector=cluster.x-k8s.io%2Fwatch-filter%3D{shard}");
        let reads_of_many: Vec<_> = mine
            .iter()
            .filter(|e| matches!(e.verb.as_str(), "list" | "watch"))
            .filter_map(|e| Some((e.object_ref.as_ref()?.resource.as_str(), e)))
            .filter(|(resource, _)| *resource != "secrets")
            .collect();
        let watched: BTreeSet<&str> = reads_of_many.iter().map(|(r, _)| *r).collect();
        for kind in ["clusters", "machines", "microvmclusters", "microvmmachines"] {
            assert!(
                watched.contains(kind),
                "{shard} watches {kind}: {watched:?}"
            );
        }
        let unfiltered: Vec<_> = reads_of_many
            .iter()
            .filter(|(_, e)| !e.request_uri.contains(&selector))
            .map(|(_, e)| format!("{} {}", e.verb, e.request_uri))
            .collect();
        assert!(
            unfiltered.is_empty(),
            "{shard} asks for its label only: {unfiltered:?}"
        );
        let writes: Vec<_> = mine.iter().filter(|e| e.is_write()).collect();
        assert!(
            writes.iter().any(|e| e
                .object_ref
                .as_ref()
                .is_some_and(|o| o.resource == "microvmmachines" && o.namespace == ns)),
            "{shard} wrote its MicrovmMachines"
        );
        let lease = format!("capmvm-{shard}");
        let elsewhere: Vec<_> = writes
            .iter()
            .filter(|e| {
                !e.object_ref.as_ref().is_some_and(|o| {
                    o.namespace == ns || (o.resource == "leases" && o.name == lease)
                })
            })
            .map(|e| format!("{} {}", e.verb, e.request_uri))
            .collect();
        assert!(
            elsewhere.is_empty(),
            "{shard} wrote outside {ns}: {elsewhere:?}"
        );
        println!(
            "{shard}: {} requests, {} writes, all in {ns} or its Lease",
            mine.len(),
            writes.len()
        );
    }
    assert_no_forbidden(&real);
    shard_a.stop().await;
    shard_b.stop().await;
    real.shutdown().await;
}

/// Labels a cluster's objects for `shard` (and the Machines real core makes from them, through the
/// MachineDeployment's and KubeadmControlPlane's machine templates), and keeps only `hosts` in its
/// MicrovmCluster: a placement's reservations live in one operator, so shards must not share hosts.
fn label_for_shard(objects: &mut [DynamicObject], shard: &str, hosts: &[String]) {
    for o in objects.iter_mut() {
        o.labels_mut()
            .insert(WATCH_FILTER_LABEL.to_string(), shard.to_string());
        let kind = o.types.as_ref().map(|t| t.kind.clone()).unwrap_or_default();
        let machine_labels = match kind.as_str() {
            "MachineDeployment" => o.data.pointer_mut("/spec/template"),
            "KubeadmControlPlane" => o.data.pointer_mut("/spec/machineTemplate"),
            "MicrovmCluster" => {
                if let Some(list) = o
                    .data
                    .pointer_mut("/spec/placement/staticPool/hosts")
                    .and_then(|h| h.as_array_mut())
                {
                    list.retain(|h| {
                        h["endpoint"]
                            .as_str()
                            .is_some_and(|e| hosts.iter().any(|x| x == e))
                    });
                }
                None
            }
            _ => None,
        };
        if let Some(template) = machine_labels {
            template["metadata"]["labels"][WATCH_FILTER_LABEL] = json!(shard);
        }
    }
}

/// The live microVMs of namespace `ns`: (host, uid, namespace/name).
fn live_vms_in(real: &RealStack, ns: &str) -> Vec<(String, String, String)> {
    let prefix = format!("{ns}/");
    live_vms(real)
        .into_iter()
        .filter(|(_, _, id)| id.starts_with(&prefix))
        .collect()
}
