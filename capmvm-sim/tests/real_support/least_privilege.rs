//! Least privilege, checked on the real stack (issue 36): the operator's ClusterRole and Role, as
//! clusterctl installed them, held against the calls its ServiceAccount made (the API server's audit
//! log); the Secrets it read held against those our objects name; and its log, every Event and our
//! objects' status searched for the host credentials and the bootstrap data.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use capmvm_api::capi::Machine;
use capmvm_sim::real::RealStack;
use capmvm_sim::real::components::NAMESPACE;
use capmvm_sim::stack::Stack as _;
use capmvm_upstream::AuditEvent;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde_json::json;

/// Verbs the ClusterRole or Role grant that a run may not exercise, and why each is still needed.
/// Every other granted verb must appear in the audit log of the run.
pub(crate) const RARELY_EXERCISED: &[(&str, &str, &str, &str)] = &[
    (
        "infrastructure.cluster.x-k8s.io",
        "microvmmachines",
        "delete",
        "a MicrovmMachinePool deleted before core made a Machine for its instance deletes that instance itself (no Machine would)",
    ),
    (
        "infrastructure.cluster.x-k8s.io",
        "microvmmachines",
        "get",
        "a write lost to another writer (409) is followed by a fresh read, to decide again at once",
    ),
    (
        "infrastructure.cluster.x-k8s.io",
        "microvmmachinepools/finalizers",
        "update",
        "never a request of its own: where the OwnerReferencesPermissionEnforcement admission plugin is on (not on this stack, which runs the default plugins), creating an instance with blockOwnerDeletion on its pool needs it",
    ),
    (
        "apiextensions.k8s.io",
        "customresourcedefinitions/status",
        "patch",
        "`migrate-storage` trims status.storedVersions only while v1alpha1 is listed there (a move from the Go provider); capmvm-sim/tests/migration.rs runs that on the real stack",
    ),
    (
        "cluster.x-k8s.io",
        "machinedeployments",
        "get",
        "only a machine on a host under `maintenance: Evacuate` reads its MachineDeployment's replicas (its turn to be released); real_stack/evacuation.rs runs that",
    ),
    (
        "events.k8s.io",
        "events",
        "patch",
        "an Event repeated within the series window is patched into a series, not created again",
    ),
];

/// One granted permission: (group, resource[/subresource], verb).
type Grant = (String, String, String);

/// What the shipped roles grant, expanded to one entry per verb, with the rule's resourceNames.
async fn granted(real: &RealStack) -> BTreeMap<Grant, Vec<String>> {
    let roles: Api<ClusterRole> = Api::all(real.client.clone());
    let cluster_role = roles.get("capmvm-manager-role").await.unwrap();
    let leader: Api<Role> = Api::namespaced(real.client.clone(), NAMESPACE);
    let role = leader.get("capmvm-leader-election-role").await.unwrap();
    let labels = cluster_role.labels();
    assert_eq!(
        labels.get("cluster.x-k8s.io/provider").map(String::as_str),
        Some("infrastructure-microvm"),
        "the ClusterRole keeps its provider label: {labels:?}"
    );
    let rules: Vec<PolicyRule> = cluster_role
        .rules
        .unwrap_or_default()
        .into_iter()
        .chain(role.rules.unwrap_or_default())
        .collect();
    let mut out = BTreeMap::new();
    for rule in rules {
        let wildcard = |v: &Option<Vec<String>>| v.iter().flatten().any(|s| s.contains('*'));
        assert!(
            !wildcard(&rule.api_groups)
                && !wildcard(&rule.resources)
                && !rule.verbs.iter().any(|v| v.contains('*'))
                && !wildcard(&rule.resource_names),
            "no wildcard: {rule:?}"
        );
        assert!(
            rule.non_resource_urls.is_none(),
            "no non-resource URL: {rule:?}"
        );
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    out.insert(
                        (group.clone(), resource.clone(), verb.clone()),
                        rule.resource_names.clone().unwrap_or_default(),
                    );
                }
            }
        }
    }
    out
}

/// The operator's requests, once each.
fn operator_requests(real: &RealStack) -> Vec<AuditEvent> {
    let audit = real.audit().expect("the management API keeps an audit log");
    audit
        .requests()
        .unwrap()
        .into_iter()
        .filter(|e| e.user.username == RealStack::operator_user())
        .collect()
}

fn grant_of(e: &AuditEvent) -> Option<Grant> {
    let o = e.object_ref.as_ref()?;
    Some((o.api_group.clone(), e.resource(), e.verb.clone()))
}

/// Holds the shipped roles against the operator's calls in this run: every granted verb was used
/// or is in [`RARELY_EXERCISED`]; no wildcard; a named rule was used only on its names; Secrets
/// were only read, and patched (the credentials finalizer) only where a MicrovmCluster names them;
/// every Secret read is one `named` holds. Returns the table for docs/reliability.md.
pub(crate) async fn assert_least_privilege(
    real: &RealStack,
    named: &SecretNames,
    credentials: &BTreeSet<(String, String)>,
) -> String {
    let granted = granted(real).await;
    let requests = operator_requests(real);
    assert!(
        !requests.is_empty(),
        "the audit log holds the operator's requests"
    );
    let seen: BTreeSet<Grant> = requests.iter().filter_map(grant_of).collect();
    for (group, resource, verb, _) in RARELY_EXERCISED {
        let key = (group.to_string(), resource.to_string(), verb.to_string());
        assert!(
            granted.contains_key(&key),
            "RARELY_EXERCISED names {key:?}, which the roles no longer grant: drop it"
        );
    }
    let unused: Vec<&Grant> = granted
        .keys()
        .filter(|g| !seen.contains(*g))
        .filter(|(g, r, v)| {
            !RARELY_EXERCISED
                .iter()
                .any(|(eg, er, ev, _)| eg == g && er == r && ev == v)
        })
        .collect();
    assert!(
        unused.is_empty(),
        "granted but never used in this run, and no reason written in RARELY_EXERCISED: {unused:?}"
    );
    // A rule limited to resourceNames was used on those names only.
    for e in &requests {
        let (Some(o), Some(g)) = (&e.object_ref, grant_of(e)) else {
            continue;
        };
        if let Some(names) = granted.get(&g).filter(|n| !n.is_empty()) {
            assert!(
                names.contains(&o.name),
                "{} {} outside {names:?}",
                e.verb,
                e.request_uri
            );
        }
    }
    // Secrets: read, and only those our objects name.
    let secret_calls: Vec<&AuditEvent> = requests
        .iter()
        .filter(|e| {
            e.object_ref
                .as_ref()
                .is_some_and(|o| o.api_group.is_empty() && o.resource == "secrets")
        })
        .collect();
    let named = named.get();
    for e in &secret_calls {
        let o = e.object_ref.as_ref().unwrap();
        let key = (o.namespace.clone(), o.name.clone());
        match e.verb.as_str() {
            "get" => assert!(
                named.contains(&key) || credentials.contains(&key),
                "read Secret {key:?}, which none of our objects names ({})",
                e.request_uri
            ),
            "list" | "watch" => assert!(
                e.request_uri.contains("fieldSelector=type"),
                "Secret metadata is watched without Cluster API's own: {}",
                e.request_uri
            ),
            "patch" => assert!(
                credentials.contains(&key),
                "patched Secret {key:?}, which no MicrovmCluster names for credentials"
            ),
            other => panic!(
                "Secrets are only read (and their finalizer patched): {other} {}",
                e.request_uri
            ),
        }
    }
    assert!(
        secret_calls.iter().any(|e| e.verb == "get"),
        "the run read its bootstrap and credential Secrets"
    );
    let mut table = String::from(
        "| API group | resource | verb | resourceNames | seen in the audit log | why, when not seen |\n|---|---|---|---|---|---|\n",
    );
    for ((group, resource, verb), names) in &granted {
        let key = (group.clone(), resource.clone(), verb.clone());
        let why = RARELY_EXERCISED
            .iter()
            .find(|(g, r, v, _)| g == group && r == resource && v == verb)
            .map_or("", |(_, _, _, why)| why);
        let group = if group.is_empty() {
            "\"\" (core)"
        } else {
            group
        };
        table.push_str(&format!(
            "| {group} | {resource} | {verb} | {} | {} | {why} |\n",
            names.join(", "),
            if seen.contains(&key) { "yes" } else { "no" }
        ));
    }
    table
}

/// The Secrets our objects name, collected while the run goes: every Machine's and MachinePool's
/// bootstrap `dataSecretName`, as seen by a watch (so also those of Machines deleted since).
pub(crate) struct SecretNames {
    names: Arc<Mutex<BTreeSet<(String, String)>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl SecretNames {
    pub(crate) fn watch(client: &kube::Client) -> SecretNames {
        let names = Arc::new(Mutex::new(BTreeSet::new()));
        let pool = capmvm_sim::capi::machinepool::machine_pool_resource();
        let kinds = [
            (
                ApiResource::erase::<Machine>(&()),
                "/spec/bootstrap/dataSecretName",
            ),
            (pool, "/spec/template/spec/bootstrap/dataSecretName"),
        ];
        let tasks = kinds
            .into_iter()
            .map(|(resource, pointer)| {
                let api = Api::<DynamicObject>::all_with(client.clone(), &resource);
                let names = names.clone();
                tokio::spawn(async move {
                    let mut events = watcher(api, watcher::Config::default())
                        .default_backoff()
                        .boxed();
                    while let Some(event) = events.next().await {
                        let object = match event {
                            Ok(
                                watcher::Event::Apply(o)
                                | watcher::Event::InitApply(o)
                                | watcher::Event::Delete(o),
                            ) => o,
                            _ => continue,
                        };
                        if let Some(name) = object
                            .data
                            .pointer(pointer)
                            .and_then(|v| v.as_str())
                            .filter(|n| !n.is_empty())
                        {
                            let ns = object.namespace().unwrap_or_default();
                            names.lock().unwrap().insert((ns, name.to_string()));
                        }
                    }
                })
            })
            .collect();
        SecretNames { names, tasks }
    }

    /// The names seen so far, as (namespace, name).
    pub(crate) fn get(&self) -> BTreeSet<(String, String)> {
        self.names.lock().unwrap().clone()
    }
}

impl Drop for SecretNames {
    fn drop(&mut self) {
        self.tasks.iter().for_each(tokio::task::JoinHandle::abort);
    }
}

/// Searches the operator's log, every Event (events.k8s.io, all namespaces) and our objects'
/// status for each of `secrets` (what, text); panics naming what was found where.
pub(crate) async fn assert_secrets_nowhere(real: &RealStack, secrets: &[(&str, String)]) {
    let mut places: Vec<(String, String)> = vec![(
        "the operator log".to_string(),
        std::fs::read_to_string(real.operator_log()).unwrap(),
    )];
    let events = Api::<k8s_openapi::api::events::v1::Event>::all(real.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(!events.items.is_empty(), "the run published Events");
    for e in &events.items {
        places.push((
            format!("Event {}", e.name_any()),
            serde_json::to_string(e).unwrap(),
        ));
    }
    for (kind, plural) in [
        ("MicrovmCluster", "microvmclusters"),
        ("MicrovmMachine", "microvmmachines"),
        ("MicrovmMachinePool", "microvmmachinepools"),
    ] {
        let resource = ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk(capmvm_api::GROUP, capmvm_api::VERSION, kind),
            plural,
        );
        for o in Api::<DynamicObject>::all_with(real.client.clone(), &resource)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
        {
            places.push((
                format!("{kind} {}", o.name_any()),
                o.data["status"].to_string(),
            ));
        }
    }
    for (what, secret) in secrets {
        assert!(secret.len() >= 16, "{what} is too short to search for");
        for (place, text) in &places {
            assert!(!text.contains(secret.as_str()), "{what} found in {place}");
        }
    }
    eprintln!(
        "searched the operator log, {} Events and our objects' status for {} secrets: none found",
        events.items.len(),
        secrets.len()
    );
}

/// What must never show: the hosts' basic-auth `password`, any PEM private key and the body of the
/// hosts' TLS client key, the bootstrap data (its `marker`) and the join tokens in it, read from
/// every bootstrap Secret `named` holds that still exists.
pub(crate) async fn secrets_of_the_run(
    real: &RealStack,
    named: &SecretNames,
    password: &str,
    marker: &str,
) -> Vec<(&'static str, String)> {
    let mut secrets = vec![
        ("the hosts' basic-auth password", password.to_string()),
        ("the bootstrap data", marker.to_string()),
        ("a PEM private key", "PRIVATE KEY-----".to_string()),
    ];
    let key = real.host_pki().unwrap().client_key_pem.expose().to_vec();
    let key = String::from_utf8(key).unwrap();
    let body = key.lines().find(|l| !l.starts_with("-----")).unwrap();
    secrets.push(("the TLS client key", body.to_string()));
    let mut bootstrap_seen = 0;
    for (ns, name) in named.get() {
        let Some(secret) = Api::<Secret>::namespaced(real.client.clone(), &ns)
            .get_opt(&name)
            .await
            .unwrap()
        else {
            continue;
        };
        let value = secret
            .data
            .unwrap_or_default()
            .remove("value")
            .unwrap_or_default();
        let value = String::from_utf8_lossy(&value.0).to_string();
        bootstrap_seen += usize::from(value.contains(marker));
        // Join tokens (`token: abcdef.0123456789abcdef`) are the bootstrap data's secret part.
        for line in value.lines() {
            if let Some(token) = line.trim().strip_prefix("token:") {
                let token = token.trim().trim_matches('"').to_string();
                if token.len() >= 16 {
                    secrets.push(("a bootstrap join token", token));
                }
            }
        }
    }
    assert!(bootstrap_seen > 0, "the marker is in the bootstrap data");
    secrets
}

/// Adds a file holding `marker` to the bootstrap configs (KubeadmConfigTemplate, KubeadmConfig),
/// so the rendered bootstrap data carries a string to search for.
pub(crate) fn bootstrap_file(objects: &mut [DynamicObject], marker: &str) {
    let file = json!([{"path": "/etc/capmvm-marker", "content": marker}]);
    for o in objects.iter_mut() {
        match o.types.as_ref().map(|t| t.kind.as_str()) {
            Some("KubeadmConfigTemplate") => {
                o.data["spec"]["template"]["spec"]["files"] = file.clone()
            }
            Some("KubeadmConfig") => o.data["spec"]["files"] = file.clone(),
            _ => {}
        }
    }
}
