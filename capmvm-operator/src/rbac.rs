//! The permissions the operator needs: exactly the verbs its code uses, generated from these tables.
//! The ClusterRole is committed as `config/rbac/role.yaml` (a test keeps the two equal); the leader
//! Lease needs rights only in the operator's own namespace, so those are a Role there (see
//! [`crate::components`]).

use std::collections::BTreeMap;

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Name of the ClusterRole.
pub const ROLE_NAME: &str = "capmvm-manager-role";

/// Name of the namespaced Role for the leader Lease.
pub const LEADER_ELECTION_ROLE_NAME: &str = "capmvm-leader-election-role";

/// The label clusterctl and CAPI use to tell which provider an object belongs to.
pub const PROVIDER_LABEL: (&str, &str) = ("cluster.x-k8s.io/provider", "infrastructure-microvm");

/// One rule: verbs on resources of a group.
pub struct Rule {
    /// API group ("" is the core group).
    pub group: &'static str,
    /// Resources (with `/status` for the status subresource).
    pub resources: &'static [&'static str],
    /// Verbs.
    pub verbs: &'static [&'static str],
    /// The objects the rule is limited to (`resourceNames`); empty means every object.
    pub names: &'static [&'static str],
}

/// Every permission the operator uses, and why.
pub const RULES: &[Rule] = &[
    // Watch cache; `migrate-storage` rewrites each template unchanged (patch), which stores it at
    // v1alpha2 (the real stack's migration test showed the 403 without it).
    Rule {
        group: "infrastructure.cluster.x-k8s.io",
        resources: &["microvmmachinetemplates"],
        verbs: &["list", "patch", "watch"],
        names: &[],
    },
    // Watch caches; finalizers, host annotations and providerID (patch).
    Rule {
        group: "infrastructure.cluster.x-k8s.io",
        resources: &["microvmclusters", "microvmmachinepools"],
        verbs: &["list", "patch", "watch"],
        names: &[],
    },
    // A pool's instances: created and (while the pool is deleted, before core made their Machine)
    // deleted by the pool; finalizers, host annotations, providerID and the delete mark (patch); read
    // afresh (get) after a write lost to another writer, to decide again at once.
    Rule {
        group: "infrastructure.cluster.x-k8s.io",
        resources: &["microvmmachines"],
        verbs: &["create", "delete", "get", "list", "patch", "watch"],
        names: &[],
    },
    // An instance's ownerReference blocks the pool's deletion (blockOwnerDeletion), which the API
    // server allows only to who may update the pool's finalizers.
    Rule {
        group: "infrastructure.cluster.x-k8s.io",
        resources: &["microvmmachinepools/finalizers"],
        verbs: &["update"],
        names: &[],
    },
    // Status writes (merge patch).
    Rule {
        group: "infrastructure.cluster.x-k8s.io",
        resources: &[
            "microvmclusters/status",
            "microvmmachinepools/status",
            "microvmmachines/status",
            "microvmmachinetemplates/status",
        ],
        verbs: &["patch"],
        names: &[],
    },
    // Owners, read from watch caches only.
    Rule {
        group: "cluster.x-k8s.io",
        resources: &["clusters", "machinepools", "machines"],
        verbs: &["list", "watch"],
        names: &[],
    },
    // A machine on an evacuating host is released only while its MachineDeployment has all the
    // Machines it wants (`spec.replicas`), read by name when its turn is decided.
    Rule {
        group: "cluster.x-k8s.io",
        resources: &["machinedeployments"],
        verbs: &["get"],
        names: &[],
    },
    // A pool scales down, rolls and repairs by deleting its instances' Machines (CAPI drains them).
    Rule {
        group: "cluster.x-k8s.io",
        resources: &["machines"],
        verbs: &["delete"],
        names: &[],
    },
    // Bootstrap data and host credentials, read by name; their metadata watched (a corrected token
    // is picked up at once); the credentials finalizer on the Secrets a MicrovmCluster names (patch:
    // metadata only, so a namespace deletion cannot take the credentials before the microVMs that
    // need them are deleted; the content is never written). The real-stack test holds every call
    // to these names (capmvm-sim/tests/real_support/least_privilege.rs).
    Rule {
        group: "",
        resources: &["secrets"],
        verbs: &["get", "list", "patch", "watch"],
        names: &[],
    },
    // Events (a repeated event is patched into a series).
    Rule {
        group: "events.k8s.io",
        resources: &["events"],
        verbs: &["create", "patch"],
        names: &[],
    },
    // `migrate-storage` (run in the operator's Pod, as its ServiceAccount): our three CRDs read and
    // their storedVersions trimmed, and no other CRD.
    Rule {
        group: "apiextensions.k8s.io",
        resources: &["customresourcedefinitions"],
        verbs: &["get"],
        names: MIGRATED_CRDS,
    },
    Rule {
        group: "apiextensions.k8s.io",
        resources: &["customresourcedefinitions/status"],
        verbs: &["patch"],
        names: MIGRATED_CRDS,
    },
    // `migrate-storage` looks for the Go provider's admission webhooks, which refuse its writes.
    Rule {
        group: "admissionregistration.k8s.io",
        resources: &[
            "mutatingwebhookconfigurations",
            "validatingwebhookconfigurations",
        ],
        verbs: &["list"],
        names: &[],
    },
];

/// The CRDs `migrate-storage` reads and whose stored versions it trims.
pub const MIGRATED_CRDS: &[&str] = &[
    "microvmclusters.infrastructure.cluster.x-k8s.io",
    "microvmmachines.infrastructure.cluster.x-k8s.io",
    "microvmmachinetemplates.infrastructure.cluster.x-k8s.io",
];

/// What leader election uses, in the Lease's namespace only.
pub const LEADER_ELECTION_RULES: &[Rule] = &[Rule {
    group: "coordination.k8s.io",
    resources: &["leases"],
    verbs: &["create", "get", "update"],
    names: &[],
}];

fn policy_rules(rules: &[Rule]) -> Vec<PolicyRule> {
    rules
        .iter()
        .map(|r| PolicyRule {
            api_groups: Some(vec![r.group.to_string()]),
            resources: Some(r.resources.iter().map(|s| s.to_string()).collect()),
            verbs: r.verbs.iter().map(|s| s.to_string()).collect(),
            resource_names: (!r.names.is_empty())
                .then(|| r.names.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        })
        .collect()
}

fn provider_labels() -> BTreeMap<String, String> {
    BTreeMap::from([(PROVIDER_LABEL.0.to_string(), PROVIDER_LABEL.1.to_string())])
}

/// The ClusterRole.
pub fn cluster_role() -> ClusterRole {
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(ROLE_NAME.to_string()),
            labels: Some(provider_labels()),
            ..Default::default()
        },
        rules: Some(policy_rules(RULES)),
        ..Default::default()
    }
}

/// The Role for the leader Lease in `namespace` (the operator's own).
pub fn leader_election_role(namespace: &str) -> Role {
    Role {
        metadata: ObjectMeta {
            name: Some(LEADER_ELECTION_ROLE_NAME.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(provider_labels()),
            ..Default::default()
        },
        rules: Some(policy_rules(LEADER_ELECTION_RULES)),
    }
}

/// Whether the ClusterRole, or the leader-election Role in the Lease's namespace, allows `verb` on
/// `resource` (`name` or `name/subresource`) of `group`.
pub fn allows(group: &str, resource: &str, verb: &str) -> bool {
    RULES
        .iter()
        .chain(LEADER_ELECTION_RULES)
        .any(|r| r.group == group && r.resources.contains(&resource) && r.verbs.contains(&verb))
}

/// The ClusterRole as YAML, with the kind and apiVersion a manifest needs.
pub fn cluster_role_yaml() -> Result<String, serde_saphyr::SerializeError> {
    let mut value = serde_json::to_value(cluster_role()).unwrap_or_default();
    if let Some(map) = value.as_object_mut() {
        map.insert("apiVersion".into(), "rbac.authorization.k8s.io/v1".into());
        map.insert("kind".into(), "ClusterRole".into());
    }
    serde_saphyr::to_string(&value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_role_is_the_generated_one() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/rbac/role.yaml");
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        let generated = format!(
            "# Generated by `cargo run -p capmvm-operator -- rbac`; do not edit.\n{}",
            cluster_role_yaml().unwrap()
        );
        assert_eq!(
            committed, generated,
            "config/rbac/role.yaml is stale: run `cargo run -p capmvm-operator -- rbac > config/rbac/role.yaml`"
        );
    }

    #[test]
    fn allows_reads_the_table() {
        assert!(allows(
            "infrastructure.cluster.x-k8s.io",
            "microvmmachines/status",
            "patch"
        ));
        assert!(
            allows(
                "infrastructure.cluster.x-k8s.io",
                "microvmmachines",
                "create"
            ) && allows(
                "infrastructure.cluster.x-k8s.io",
                "microvmmachines",
                "delete"
            ),
            "a pool creates its instances, and deletes those whose Machine never appeared"
        );
        assert!(
            allows("infrastructure.cluster.x-k8s.io", "microvmmachines", "get"),
            "a machine whose write lost to another writer is read afresh"
        );
        assert!(
            allows("cluster.x-k8s.io", "machines", "delete")
                && !allows("cluster.x-k8s.io", "machines", "patch"),
            "a pool deletes Machines and never edits them"
        );
        assert!(!allows(
            "infrastructure.cluster.x-k8s.io",
            "microvmclusters",
            "delete"
        ));
        assert!(
            allows("", "secrets", "watch") && allows("", "secrets", "patch"),
            "Secret metadata is watched and credential Secrets get a finalizer"
        );
        assert!(
            !allows("", "secrets", "create") && !allows("", "secrets", "delete"),
            "Secrets are never created or deleted"
        );
    }

    #[test]
    fn no_wildcard_and_secrets_never_created_updated_or_deleted() {
        for r in RULES.iter().chain(LEADER_ELECTION_RULES) {
            let all = std::iter::once(&r.group)
                .chain(r.resources)
                .chain(r.verbs)
                .chain(r.names);
            assert!(
                all.clone().all(|s| !s.contains('*')),
                "no wildcard: {:?}",
                all.collect::<Vec<_>>()
            );
        }
        let secret_verbs: Vec<&str> = RULES
            .iter()
            .filter(|r| r.group.is_empty() && r.resources.contains(&"secrets"))
            .flat_map(|r| r.verbs.iter().copied())
            .collect();
        assert_eq!(secret_verbs, ["get", "list", "patch", "watch"]);
    }

    #[test]
    fn leases_are_granted_in_the_operators_namespace_only() {
        assert!(allows("coordination.k8s.io", "leases", "update"));
        let cluster_wide = cluster_role().rules.unwrap_or_default();
        assert!(
            !cluster_wide
                .iter()
                .flat_map(|r| r.resources.clone().unwrap_or_default())
                .any(|r| r == "leases"),
            "the ClusterRole grants no Lease anywhere"
        );
        let role = leader_election_role("capmvm-system");
        assert_eq!(role.metadata.namespace.as_deref(), Some("capmvm-system"));
        assert_eq!(
            role.rules.unwrap()[0].resources.as_deref(),
            Some(&["leases".to_string()][..])
        );
    }
}
