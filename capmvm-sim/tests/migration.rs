//! The move from the Go provider (`cluster-api-provider-microvm` v0.10.1) to us, end to end on
//! the real stack (etcd, kube-apiserver, kube-controller-manager, Cluster API v1.14's core and
//! CABPK, the real clusterctl and kubectl, hollow flintlock hosts).
//!
//! The cluster is made by the Go provider itself: its manager built from its pinned archive
//! (`hack/upstream.sh build go-provider`), its CRDs, RBAC and webhooks from the archive's
//! `config/` as `clusterctl init` installs them, running as its ServiceAccount and creating the
//! microVMs through its own flintlock Go client.
//!
//! Needs the upstream binaries (`hack/upstream.sh build`): under CI a missing one fails the test,
//! locally the test is reported as skipped.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod real_support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use capmvm_api::keys::{HOST_ANNOTATION, MACHINE_FINALIZER};
use capmvm_api::{GROUP, MicrovmMachine, MicrovmMachineTemplate};
use capmvm_flintlock::{Method, MicrovmState};
use capmvm_sim::bench_provider::as_go_provider_users_write;
use capmvm_sim::real::go_provider;
use capmvm_sim::real::{BINARIES, RealStack};
use capmvm_sim::stack::{self, Stack};
use capmvm_sim::world::{DEMO_CLUSTER, wait_for};
use capmvm_upstream::Binaries;
use capmvm_upstream::audit::AuditEvent;
use capmvm_upstream::capi::Provider;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::{Api, ResourceExt};
use real_support::options;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(240);
const POLL: Duration = Duration::from_millis(500);
const NS: &str = "default";
const CLUSTER: &str = "moving";

fn resource(version: &str, kind: &str, plural: &str) -> ApiResource {
    let group = if kind.starts_with("Microvm") {
        GROUP
    } else {
        "cluster.x-k8s.io"
    };
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn str_at<'a>(o: &'a DynamicObject, pointer: &str) -> Option<&'a str> {
    o.data.pointer(pointer).and_then(Value::as_str)
}

/// Ready as the version's writer says it: the Go provider's `status.ready`, our `Ready` condition.
fn ready_at(o: &DynamicObject, version: &str) -> bool {
    if version == "v1alpha1" {
        return o.data.pointer("/status/ready") == Some(&json!(true));
    }
    o.data
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// Waits until the cluster has exactly `n` MicrovmMachines (read at `version`), all Ready, each
/// with a CAPI Machine of the same providerID whose nodeRef names a Node of that providerID.
/// Returns name -> providerID.
async fn wait_ready(real: &RealStack, version: &str, n: usize) -> BTreeMap<String, String> {
    let key = capmvm_sim::capi::workload::ClusterKey::new(NS, CLUSTER);
    let mvms = resource(version, "MicrovmMachine", "microvmmachines");
    let machines = resource("v1beta2", "Machine", "machines");
    let what = format!(
        "{n} Ready MicrovmMachines at {version} with Machines and Nodes of the same providerID \
         (operator log {}, Go provider log {:?})",
        real.operator_log().display(),
        real.go_provider().map(|g| g.log().display().to_string())
    );
    wait_for(&what, WAIT, POLL, || async {
        let ms = Api::<DynamicObject>::namespaced_with(real.client.clone(), NS, &mvms)
            .list(&ListParams::default())
            .await?
            .items;
        if ms.len() != n || !ms.iter().all(|m| ready_at(m, version)) {
            return Ok(None);
        }
        let capi = Api::<DynamicObject>::namespaced_with(real.client.clone(), NS, &machines)
            .list(&ListParams::default())
            .await?
            .items;
        let mut ids = BTreeMap::new();
        for m in &ms {
            let Some(pid) = str_at(m, "/spec/providerID") else {
                return Ok(None);
            };
            let Some(node) = real.workloads().node_by_provider_id(&key, pid) else {
                return Ok(None);
            };
            let matched = capi.iter().any(|c| {
                str_at(c, "/spec/providerID") == Some(pid)
                    && str_at(c, "/spec/infrastructureRef/name") == Some(m.name_any().as_str())
                    && str_at(c, "/status/nodeRef/name") == Some(node.name_any().as_str())
            });
            if !matched {
                return Ok(None);
            }
            ids.insert(m.name_any(), pid.to_string());
        }
        Ok(Some(ids))
    })
    .await
    .unwrap()
}

/// The versions at which CAPI core's manager watched MicrovmMachines in `events`.
fn capi_core_watches(events: &[AuditEvent]) -> BTreeSet<&str> {
    events
        .iter()
        .filter(|e| e.verb == "watch" && e.user_agent.starts_with(Provider::Core.binary()))
        .filter_map(|e| {
            let path = e.request_uri.split('?').next()?;
            let rest = path.strip_prefix(&format!("/apis/{GROUP}/"))?;
            // Cluster-wide (`<version>/microvmmachines`) or in a namespace.
            let version = rest.split('/').next()?;
            rest.ends_with("/microvmmachines").then_some(version)
        })
        .collect()
}

fn calls(real: &RealStack, method: Method) -> u64 {
    stack::host_calls(&real.hosts, method)
}

/// The flintlock uids of the live microVMs, by `namespace/name`.
fn live_uids(real: &RealStack) -> BTreeMap<String, String> {
    real.all_vms()
        .into_iter()
        .filter(|(_, vm)| vm.state() != MicrovmState::Deleting)
        .map(|(_, vm)| {
            let id = format!("{}/{}", vm.microvm.spec.namespace, vm.microvm.spec.id);
            (id, vm.uid().to_string())
        })
        .collect()
}

/// The `apiVersion` each stored object of our three kinds has in etcd, by key: what the API
/// server wrote, which no API returns (it converts on every read).
async fn stored_versions_in_etcd(real: &RealStack) -> BTreeMap<String, String> {
    let etcd = real.etcd().expect("the stack runs");
    let mut out = BTreeMap::new();
    for plural in [
        "microvmclusters",
        "microvmmachines",
        "microvmmachinetemplates",
    ] {
        let prefix = format!("/registry/{GROUP}/{plural}/");
        for (key, value) in etcd.get_prefix(&prefix).await.unwrap() {
            // Custom resources are stored as JSON.
            let stored: Value = serde_json::from_slice(&value)
                .unwrap_or_else(|e| panic!("{key} is not JSON in etcd: {e}"));
            let version = stored["apiVersion"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            out.insert(key, version);
        }
    }
    out
}

/// The demo template as a Go-provider user had it: the infrastructure kinds at `v1alpha1` (with
/// nothing of ours in them).
async fn apply_go_provider_cluster(real: &mut RealStack, workers: usize) {
    let vip = real.prepare_cluster(NS, CLUSTER).await.unwrap();
    let vars = vec![
        ("CLUSTER_NAME", CLUSTER.to_string()),
        ("NAMESPACE", NS.to_string()),
        ("CONTROL_PLANE_VIP", vip.to_string()),
        ("CONTROL_PLANE_MACHINE_COUNT", "1".to_string()),
        ("WORKER_MACHINE_COUNT", workers.to_string()),
    ];
    let mut rewritten = Ok(());
    stack::apply_template(&*real, DEMO_CLUSTER, &vars, |objects| {
        rewritten = as_go_provider_users_write(objects);
    })
    .await
    .unwrap();
    rewritten.unwrap();
}

/// Prints what the Go provider wrote (its objects at v1alpha1) and what it asked the hosts for
/// (each microVM's labels, interfaces and meta-data keys): the record of what its users have.
async fn print_what_it_made(real: &RealStack) {
    for (kind, plural) in [
        ("MicrovmCluster", "microvmclusters"),
        ("MicrovmMachine", "microvmmachines"),
    ] {
        let api = Api::<DynamicObject>::namespaced_with(
            real.client.clone(),
            NS,
            &resource("v1alpha1", kind, plural),
        );
        for mut o in api.list(&ListParams::default()).await.unwrap() {
            o.metadata.managed_fields = None;
            println!(
                "the Go provider's {kind}:\n{}",
                serde_json::to_string_pretty(&o).unwrap()
            );
        }
    }
    for (endpoint, vm) in real.all_vms() {
        let spec = &vm.microvm.spec;
        println!(
            "on {endpoint}: {}/{} uid {} labels {:?} interfaces {:?} metadata keys {:?} meta-data {:?} vendor-data {:?}",
            spec.namespace,
            spec.id,
            vm.uid(),
            spec.labels,
            spec.interfaces,
            spec.metadata.keys().collect::<Vec<_>>(),
            spec.metadata.get("meta-data").map(|d| decode(d)),
            spec.metadata.get("vendor-data").map(|d| decode(d)),
        );
    }
}

fn decode(b64: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map(|b| String::from_utf8_lossy(&b).to_string())
        .unwrap_or_else(|e| format!("not base64: {e}"))
}

/// A cluster of 1 control plane and 3 workers made Ready by the Go provider v0.10.1 moves to
/// us: our components installed over its CRDs, storage migrated (every object rewritten at v1alpha2
/// in etcd, storedVersions v1alpha2 only), every MicrovmMachine adopted with its microVM untouched
/// (same uid, no create, no delete) and the same providerID on MicrovmMachine, Machine and Node;
/// then the MachineDeployment is scaled and rolled by us and the cluster deleted with nothing left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_provider_cluster_moves_to_us_with_no_microvm_touched() {
    let needs: Vec<&str> = BINARIES
        .iter()
        .copied()
        .chain([go_provider::BINARY])
        .collect();
    if Binaries::for_test(
        "a_go_provider_cluster_moves_to_us_with_no_microvm_touched",
        &needs,
    )
    .is_none()
    {
        return;
    }
    let mut real = RealStack::start_without_components(options())
        .await
        .expect("the real stack starts");

    // Under the Go provider: its components as clusterctl installed them, its manager running.
    real.install_go_provider(&[]).await.unwrap();
    apply_go_provider_cluster(&mut real, 3).await;
    let before = wait_ready(&real, "v1alpha1", 4).await;
    print_what_it_made(&real).await;
    let uids_before = live_uids(&real);
    assert_eq!(uids_before.len(), 4, "{uids_before:?}");
    for (name, pid) in &before {
        // Its providerID: microvm://<failure domain (the host's endpoint)>/<flintlock uid>.
        let uid = &uids_before[&format!("{NS}/{name}")];
        let rest = pid.strip_prefix("microvm://").expect(pid);
        let (domain, id) = rest.rsplit_once('/').expect(pid);
        assert_eq!(id, uid, "{pid}");
        assert!(real.endpoints().iter().any(|e| e == domain), "{pid}");
    }
    let v1alpha1_machines = Api::<DynamicObject>::namespaced_with(
        real.client.clone(),
        NS,
        &resource("v1alpha1", "MicrovmMachine", "microvmmachines"),
    );
    for m in v1alpha1_machines
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        assert!(
            m.finalizers().iter().any(|f| f == MACHINE_FINALIZER),
            "its finalizer: {:?}",
            m.finalizers()
        );
    }

    // The Go provider stopped as a user does (its Deployment scaled to zero): its admission webhook
    // configurations stay, pointing at nothing.
    real.stop_go_provider().await;
    let webhooks = real
        .go_provider()
        .unwrap()
        .webhook_configurations()
        .to_vec();
    assert_eq!(
        webhooks,
        [
            "capmvm-mutating-webhook-configuration",
            "capmvm-validating-webhook-configuration"
        ]
    );
    let (creates, deletes) = (calls(&real, Method::Create), calls(&real, Method::Delete));
    let stored = stored_versions_in_etcd(&real).await;
    assert!(
        stored.len() == 7 && stored.values().all(|v| v == &format!("{GROUP}/v1alpha1")),
        "the Go provider's objects are stored at v1alpha1: {stored:?}"
    );

    // Ours installed over its CRDs, the operator started (it serves the conversion webhook).
    real.install_components().await.unwrap();
    real.start_operator(&[]).unwrap();

    // migrate-storage refuses while the Go provider's webhooks would refuse its writes; they are
    // deleted as the README says, and it runs.
    let refused = real
        .migrate_storage()
        .await
        .unwrap()
        .expect_err("migrate-storage refuses while the Go provider's webhooks remain");
    assert!(refused.contains("admission webhooks"), "{refused}");
    for (kind, name) in [
        ("mutatingwebhookconfiguration", &webhooks[0]),
        ("validatingwebhookconfiguration", &webhooks[1]),
    ] {
        real.kubectl.run(&["delete", kind, name]).await.unwrap();
    }
    // The API server drops deleted webhook configurations from its cache within a second or so: a
    // refusal naming them may repeat that long; any other failure is the test's.
    let mut migrated = Err(String::new());
    for _ in 0..30 {
        migrated = real.migrate_storage().await.unwrap();
        match &migrated {
            Err(e) if e.contains("admission webhooks") => {
                tokio::time::sleep(Duration::from_secs(2)).await
            }
            _ => break,
        }
    }
    let migrated = migrated.unwrap_or_else(|e| panic!("migrate-storage failed: {e}"));
    println!("migrate-storage: {migrated}");

    // Every object rewritten at v1alpha2, as etcd holds it; storedVersions v1alpha2 only.
    let after = stored_versions_in_etcd(&real).await;
    assert_eq!(
        after.keys().collect::<BTreeSet<_>>(),
        stored.keys().collect::<BTreeSet<_>>(),
        "the same objects"
    );
    assert!(
        after.values().all(|v| v == &format!("{GROUP}/v1alpha2")),
        "every object stored at v1alpha2: {after:?}"
    );
    let crds = Api::<CustomResourceDefinition>::all(real.client.clone());
    for plural in [
        "microvmclusters",
        "microvmmachines",
        "microvmmachinetemplates",
    ] {
        let crd = crds.get(&format!("{plural}.{GROUP}")).await.unwrap();
        let stored_versions = crd.status.and_then(|s| s.stored_versions);
        assert_eq!(
            stored_versions,
            Some(vec!["v1alpha2".to_string()]),
            "{plural}"
        );
    }

    // README step 6: CAPI core restarted. Its watch of MicrovmMachines (what wakes a deleting
    // Machine once its MicrovmMachine is gone) was started at the version the Go provider's contract
    // label named, v1alpha1, and is kept for the life of the process (keyed by group and kind), while
    // since our CRDs it reads them at v1alpha2, from a second cache: woken by the first, a Machine
    // could read its MicrovmMachine still there from the second and was never woken again.
    // Read between stop and start: a watch the old process reopens late must not count as new.
    let audit = real.audit().expect("the management API keeps an audit log");
    let stopped = real
        .stop_capi(Provider::Core)
        .await
        .expect("CAPI core runs");
    let before_restart = audit.requests().unwrap();
    assert!(
        capi_core_watches(&before_restart).contains("v1alpha1"),
        "CAPI core watched MicrovmMachines at v1alpha1: {:?}",
        capi_core_watches(&before_restart)
    );
    real.start_capi(stopped).await.unwrap();

    // Adopted: each machine's host recorded by us, the same machines Ready, the same providerIDs on
    // MicrovmMachine, Machine and Node, the same microVMs, nothing created or deleted on the hosts.
    wait_for(
        "every MicrovmMachine adopted (its host recorded)",
        WAIT,
        POLL,
        || async {
            let ms = Api::<MicrovmMachine>::namespaced(real.client.clone(), NS)
                .list(&ListParams::default())
                .await?
                .items;
            let all = ms.len() == 4
                && ms
                    .iter()
                    .all(|m| m.annotations().contains_key(HOST_ANNOTATION));
            Ok(all.then_some(()))
        },
    )
    .await
    .unwrap();
    let adopted = wait_ready(&real, "v1alpha2", 4).await;
    assert_eq!(adopted, before, "same machines, same providerIDs");
    assert_eq!(live_uids(&real), uids_before, "same microVMs");
    assert_eq!(
        (calls(&real, Method::Create), calls(&real, Method::Delete)),
        (creates, deletes),
        "no CreateMicroVM and no DeleteMicroVM during adoption"
    );

    // The Go provider's version is still served, through our webhook, by kubectl's full name; by
    // the short name kubectl answers too (it resolves `mvmm` at the preferred version).
    let list = |resource: String| {
        let real = &real;
        async move {
            let out = real
                .kubectl
                .run(&[
                    "get",
                    &resource,
                    "-n",
                    NS,
                    "-o",
                    "jsonpath={range .items[*]}{.apiVersion} {.spec.providerID}{\"\\n\"}{end}",
                ])
                .await
                .unwrap();
            println!("kubectl get {resource}:\n{out}");
            out.lines()
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect::<BTreeSet<String>>()
        }
    };
    let at = |version: &str| -> BTreeSet<String> {
        before
            .values()
            .map(|pid| format!("{GROUP}/{version} {pid}"))
            .collect()
    };
    assert_eq!(
        list(format!("microvmmachines.v1alpha1.{GROUP}")).await,
        at("v1alpha1"),
        "kubectl get microvmmachines.v1alpha1"
    );
    // kubectl (client-go's restmapper/shortcut.go, v0.36.3) expands a short name to its group and
    // resource only, dropping the version: `mvmm.v1alpha1.<group>` answers at the preferred
    // version. The README says so; this fails if kubectl starts keeping the version.
    assert_eq!(
        list(format!("mvmm.v1alpha1.{GROUP}")).await,
        at("v1alpha2"),
        "kubectl get mvmm.v1alpha1"
    );

    // Ours from here: the MachineDeployment scaled 3 -> 4 ...
    let md = resource("v1beta2", "MachineDeployment", "machinedeployments");
    let md_name = format!("{CLUSTER}-md-0");
    real.scale(&md, NS, &md_name, 4).await.unwrap();
    let scaled = wait_ready(&real, "v1alpha2", 5).await;
    assert_eq!(calls(&real, Method::Create), creates + 1, "one create");
    for (name, pid) in &before {
        assert_eq!(scaled.get(name), Some(pid), "{name} kept");
    }

    // ... and rolled to a new template: every worker replaced, the control plane kept.
    let templates = Api::<MicrovmMachineTemplate>::namespaced(real.client.clone(), NS);
    let mut rolled = templates.get(&md_name).await.unwrap();
    let new_template = format!("{CLUSTER}-md-1");
    rolled.metadata = kube::api::ObjectMeta {
        name: Some(new_template.clone()),
        namespace: Some(NS.to_string()),
        ..Default::default()
    };
    rolled.spec.template.spec.vcpu += 1;
    templates
        .create(&PostParams::default(), &rolled)
        .await
        .unwrap();
    real.kubectl
        .run(&[
            "patch",
            "machinedeployment",
            &md_name,
            "-n",
            NS,
            "--type=merge",
            "-p",
            &json!({"spec": {"template": {"spec": {"infrastructureRef": {"name": new_template}}}}})
                .to_string(),
        ])
        .await
        .unwrap();
    let workers_rolled = wait_for("every worker on the new template", WAIT, POLL, || async {
        let ms = Api::<MicrovmMachine>::namespaced(real.client.clone(), NS)
            .list(&ListParams::default())
            .await?
            .items;
        let workers: Vec<&MicrovmMachine> = ms
            .iter()
            .filter(|m| !m.labels().contains_key("cluster.x-k8s.io/control-plane"))
            .collect();
        let done = ms.len() == 5
            && workers.len() == 4
            && workers
                .iter()
                .all(|m| m.spec.vcpu == rolled.spec.template.spec.vcpu);
        Ok(done.then_some(()))
    })
    .await;
    if let Err(e) = workers_rolled {
        real.keep_dir();
        panic!("{e} (logs in {})", real.dir.display());
    }
    let rolled_ids = wait_ready(&real, "v1alpha2", 5).await;
    let kept: Vec<&String> = before
        .keys()
        .filter(|name| rolled_ids.contains_key(*name))
        .collect();
    assert_eq!(kept.len(), 1, "only the control plane kept: {kept:?}");

    // Deleted with nothing left: no microVM, no object of the cluster.
    real.kubectl
        .run(&["delete", "cluster", CLUSTER, "-n", NS, "--wait=false"])
        .await
        .unwrap();
    wait_for("every microVM gone", WAIT, POLL, || async {
        Ok(real.all_vms().is_empty().then_some(()))
    })
    .await
    .unwrap();
    let kinds = "clusters.cluster.x-k8s.io,machines.cluster.x-k8s.io,machinesets.cluster.x-k8s.io,\
                 machinedeployments.cluster.x-k8s.io,microvmmachines,microvmclusters,\
                 microvmmachinetemplates,kubeadmconfigs";
    // The control plane's MicrovmMachineTemplate goes with the Cluster too: the KubeadmControlPlane
    // (its stand-in as the real one) made the Cluster its owner.
    let left = wait_for("the cluster's objects gone", WAIT, POLL, || async {
        let left = real
            .kubectl
            .run(&["get", kinds, "-n", NS, "-o", "name"])
            .await?;
        Ok(left.trim().is_empty().then_some(()))
    })
    .await;
    if let Err(e) = left {
        real.keep_dir();
        let dump = real
            .kubectl
            .run(&["get", kinds, "-n", NS, "-o", "yaml"])
            .await
            .unwrap_or_default();
        panic!("{e}; left (logs in {}):\n{dump}", real.dir.display());
    }
    // By request id, not position: a line still being written at the first read is skipped then.
    let seen: BTreeSet<&str> = before_restart.iter().map(|e| e.audit_id.as_str()).collect();
    let since_restart: Vec<AuditEvent> = audit
        .requests()
        .unwrap()
        .into_iter()
        .filter(|e| !seen.contains(e.audit_id.as_str()))
        .collect();
    assert_eq!(
        capi_core_watches(&since_restart),
        BTreeSet::from(["v1alpha2"]),
        "CAPI core restarted watches MicrovmMachines at v1alpha2 only"
    );
    let forbidden = audit.forbidden_for(&RealStack::operator_user()).unwrap();
    assert!(
        forbidden.is_empty(),
        "403s for our ServiceAccount: {:?}",
        forbidden
            .iter()
            .map(|e| format!("{} {}", e.verb, e.request_uri))
            .collect::<Vec<_>>()
    );
    real.shutdown().await;
}
