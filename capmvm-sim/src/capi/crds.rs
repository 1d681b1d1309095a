//! The CAPI CRDs the emulator serves for the stand-in.
//!
//! Where CAPI's own CRDs are available ([`real_crds_dir`]: CI and development machines), the world
//! installs those, unchanged ([`capi_crds`]). On a fresh machine it installs built-in ones ([`crds`]):
//! small schemas that keep every field (`x-kubernetes-preserve-unknown-fields`) but declare, with
//! CAPI's types and required-ness, every path the stand-in and the operator read or write
//! ([`TOUCHED`]), so an object the stand-in accepts on a fresh machine is one CAPI accepts. A test
//! compares both on those paths.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResource;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The CAPI release whose CRDs are looked for.
pub const CAPI_CRDS_VERSION: &str = "v1.14.0";

/// `MachineDeployment.spec` (v1beta2), the fields the stand-in uses.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "MachineDeployment",
    plural = "machinedeployments",
    namespaced,
    status = "serde_json::Value",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct MachineDeploymentSpec {
    /// The Cluster.
    #[serde(default)]
    pub cluster_name: String,
    /// Desired Machines.
    #[serde(default)]
    pub replicas: Option<i32>,
    /// Which Machines are its own (CAPI defaults it from the template's labels).
    #[serde(default)]
    pub selector: LabelSelector,
    /// What each Machine gets.
    #[serde(default)]
    pub template: MachineTemplateSpec,
}

/// A label selector (`matchLabels` only: what the stand-in reads).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    /// Labels a Machine must carry.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
}

/// `MachineDeployment.spec.template`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct MachineTemplateSpec {
    /// Labels and annotations of the Machines.
    #[serde(default)]
    pub metadata: TemplateMetadata,
    /// The Machine spec (kept as JSON: clusterName, bootstrap, infrastructureRef, version...).
    #[serde(default)]
    pub spec: serde_json::Value,
}

/// Labels and annotations.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct TemplateMetadata {
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// Why CAPI's CRDs could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A file is not a CustomResourceDefinition.
    #[error("{path} is not a CustomResourceDefinition: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// A built-in CRD: names, printer columns, subresources and the paths it declares.
struct Builtin {
    group: &'static str,
    kind: &'static str,
    plural: &'static str,
    short: &'static str,
    columns: &'static [(&'static str, &'static str)],
    scale: Scale,
}

/// A built-in CRD's scale subresource.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scale {
    None,
    /// With `labelSelectorPath: .status.selector`.
    WithSelector,
    /// Without a selector (CAPI's MachinePool).
    WithoutSelector,
}

const BUILTINS: &[Builtin] = &[
    Builtin {
        group: "cluster.x-k8s.io",
        kind: "Cluster",
        plural: "clusters",
        short: "cl",
        columns: &[("Phase", ".status.phase"), ("Paused", ".spec.paused")],
        scale: Scale::None,
    },
    Builtin {
        group: "cluster.x-k8s.io",
        kind: "Machine",
        plural: "machines",
        short: "ma",
        columns: &[
            ("Cluster", ".spec.clusterName"),
            ("NodeName", ".status.nodeRef.name"),
            ("ProviderID", ".spec.providerID"),
            ("Phase", ".status.phase"),
        ],
        scale: Scale::None,
    },
    Builtin {
        group: "cluster.x-k8s.io",
        kind: "MachineDeployment",
        plural: "machinedeployments",
        short: "md",
        columns: &[
            ("Cluster", ".spec.clusterName"),
            ("Replicas", ".spec.replicas"),
            ("Ready", ".status.readyReplicas"),
        ],
        scale: Scale::WithSelector,
    },
    Builtin {
        group: "cluster.x-k8s.io",
        kind: "MachinePool",
        plural: "machinepools",
        short: "mp",
        columns: &[
            ("Cluster", ".spec.clusterName"),
            ("Desired", ".spec.replicas"),
            ("Current", ".status.replicas"),
            ("Ready", ".status.readyReplicas"),
            ("Phase", ".status.phase"),
        ],
        scale: Scale::WithoutSelector,
    },
    Builtin {
        group: "cluster.x-k8s.io",
        kind: "MachineHealthCheck",
        plural: "machinehealthchecks",
        short: "mhc",
        columns: &[("Cluster", ".spec.clusterName")],
        scale: Scale::None,
    },
    Builtin {
        group: "controlplane.cluster.x-k8s.io",
        kind: "KubeadmControlPlane",
        plural: "kubeadmcontrolplanes",
        short: "kcp",
        columns: &[
            (
                "Initialized",
                ".status.initialization.controlPlaneInitialized",
            ),
            ("Replicas", ".status.replicas"),
            ("Ready", ".status.readyReplicas"),
            ("Version", ".spec.version"),
        ],
        scale: Scale::WithSelector,
    },
    Builtin {
        group: "bootstrap.cluster.x-k8s.io",
        kind: "KubeadmConfig",
        plural: "kubeadmconfigs",
        short: "",
        columns: &[(
            "Cluster",
            ".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']",
        )],
        scale: Scale::None,
    },
    Builtin {
        group: "bootstrap.cluster.x-k8s.io",
        kind: "KubeadmConfigTemplate",
        plural: "kubeadmconfigtemplates",
        short: "",
        columns: &[],
        scale: Scale::None,
    },
];

/// Every path (dotted, `[]` for array items) the stand-in or the operator reads or writes, per kind,
/// with CAPI v1beta2's type and whether CAPI requires it (`!`).
pub const TOUCHED: &[(&str, &[&str])] = &[
    (
        "Cluster",
        &[
            "spec! object",
            "spec.paused boolean",
            "spec.infrastructureRef object",
            "spec.infrastructureRef.apiGroup! string",
            "spec.infrastructureRef.kind! string",
            "spec.infrastructureRef.name! string",
            "spec.controlPlaneRef object",
            "spec.controlPlaneRef.apiGroup! string",
            "spec.controlPlaneRef.kind! string",
            "spec.controlPlaneRef.name! string",
            "spec.controlPlaneEndpoint object",
            "spec.controlPlaneEndpoint.host string",
            "spec.controlPlaneEndpoint.port integer",
            "status.phase string",
            "status.initialization object",
            "status.initialization.infrastructureProvisioned boolean",
            "status.initialization.controlPlaneInitialized boolean",
            "status.failureDomains array",
            "status.failureDomains[].name! string",
            "status.failureDomains[].controlPlane boolean",
            "status.failureDomains[].attributes object",
        ],
    ),
    (
        "Machine",
        &[
            "spec! object",
            "spec.clusterName! string",
            "spec.version string",
            "spec.failureDomain string",
            "spec.providerID string",
            "spec.bootstrap! object",
            "spec.bootstrap.dataSecretName string",
            "spec.bootstrap.configRef object",
            "spec.bootstrap.configRef.apiGroup! string",
            "spec.bootstrap.configRef.kind! string",
            "spec.bootstrap.configRef.name! string",
            "spec.infrastructureRef! object",
            "spec.infrastructureRef.apiGroup! string",
            "spec.infrastructureRef.kind! string",
            "spec.infrastructureRef.name! string",
            "status.phase string",
            "status.initialization object",
            "status.initialization.infrastructureProvisioned boolean",
            "status.initialization.bootstrapDataSecretCreated boolean",
            "status.addresses array",
            "status.addresses[].type! string",
            "status.addresses[].address! string",
            "status.failureDomain string",
            "status.nodeRef object",
            "status.nodeRef.name! string",
            "status.nodeInfo object",
        ],
    ),
    (
        "MachineDeployment",
        &[
            "spec! object",
            "spec.clusterName! string",
            "spec.replicas integer",
            "spec.selector! object",
            "spec.selector.matchLabels object",
            "spec.template! object",
            "spec.template.metadata object",
            "spec.template.metadata.labels object",
            "spec.template.metadata.annotations object",
            "spec.template.spec! object",
            "spec.template.spec.clusterName! string",
            "spec.template.spec.version string",
            "spec.template.spec.failureDomain string",
            "spec.template.spec.bootstrap! object",
            "spec.template.spec.bootstrap.dataSecretName string",
            "spec.template.spec.bootstrap.configRef object",
            "spec.template.spec.bootstrap.configRef.apiGroup! string",
            "spec.template.spec.bootstrap.configRef.kind! string",
            "spec.template.spec.bootstrap.configRef.name! string",
            "spec.template.spec.infrastructureRef! object",
            "spec.template.spec.infrastructureRef.apiGroup! string",
            "spec.template.spec.infrastructureRef.kind! string",
            "spec.template.spec.infrastructureRef.name! string",
            "status.replicas integer",
            "status.readyReplicas integer",
            "status.selector string",
        ],
    ),
    (
        "MachinePool",
        &[
            "spec! object",
            "spec.clusterName! string",
            "spec.replicas integer",
            "spec.failureDomains array",
            "spec.providerIDList array",
            "spec.template! object",
            "spec.template.metadata object",
            "spec.template.metadata.labels object",
            "spec.template.metadata.annotations object",
            "spec.template.spec! object",
            "spec.template.spec.clusterName! string",
            "spec.template.spec.version string",
            "spec.template.spec.minReadySeconds integer",
            "spec.template.spec.bootstrap! object",
            "spec.template.spec.bootstrap.dataSecretName string",
            "spec.template.spec.bootstrap.configRef object",
            "spec.template.spec.bootstrap.configRef.apiGroup! string",
            "spec.template.spec.bootstrap.configRef.kind! string",
            "spec.template.spec.bootstrap.configRef.name! string",
            "spec.template.spec.infrastructureRef! object",
            "spec.template.spec.infrastructureRef.apiGroup! string",
            "spec.template.spec.infrastructureRef.kind! string",
            "spec.template.spec.infrastructureRef.name! string",
            "spec.template.spec.deletion object",
            "spec.template.spec.deletion.nodeDeletionTimeoutSeconds integer",
            "status.phase string",
            "status.replicas integer",
            "status.readyReplicas integer",
            "status.availableReplicas integer",
            "status.upToDateReplicas integer",
            "status.nodeRefs array",
            "status.nodeRefs[].apiVersion string",
            "status.nodeRefs[].kind string",
            "status.nodeRefs[].name string",
            "status.nodeRefs[].uid string",
            "status.initialization object",
            "status.initialization.infrastructureProvisioned boolean",
            "status.initialization.bootstrapDataSecretCreated boolean",
        ],
    ),
    (
        "MachineHealthCheck",
        &[
            "spec! object",
            "spec.clusterName! string",
            "spec.selector! object",
        ],
    ),
    (
        "KubeadmControlPlane",
        &[
            "spec! object",
            "spec.replicas integer",
            "spec.version! string",
            "spec.machineTemplate! object",
            "spec.machineTemplate.metadata object",
            "spec.machineTemplate.metadata.labels object",
            "spec.machineTemplate.metadata.annotations object",
            "spec.machineTemplate.spec! object",
            "spec.machineTemplate.spec.infrastructureRef! object",
            "spec.machineTemplate.spec.infrastructureRef.apiGroup! string",
            "spec.machineTemplate.spec.infrastructureRef.kind! string",
            "spec.machineTemplate.spec.infrastructureRef.name! string",
            "spec.kubeadmConfigSpec object",
            "status.replicas integer",
            "status.readyReplicas integer",
            "status.selector string",
            "status.version string",
            "status.initialization object",
            "status.initialization.controlPlaneInitialized boolean",
        ],
    ),
    (
        "KubeadmConfig",
        &[
            "spec object",
            "spec.format string",
            "spec.files array",
            "spec.files[].path! string",
            "spec.files[].content string",
            "spec.files[].owner string",
            "spec.files[].permissions string",
            "spec.preKubeadmCommands array",
            "spec.postKubeadmCommands array",
            "spec.users array",
            "spec.users[].name! string",
            "spec.users[].sshAuthorizedKeys array",
            "spec.users[].sudo string",
            "spec.initConfiguration object",
            "spec.initConfiguration.nodeRegistration object",
            "spec.initConfiguration.nodeRegistration.name string",
            "spec.initConfiguration.nodeRegistration.kubeletExtraArgs array",
            "spec.initConfiguration.nodeRegistration.kubeletExtraArgs[].name! string",
            "spec.initConfiguration.nodeRegistration.kubeletExtraArgs[].value! string",
            "spec.joinConfiguration object",
            "spec.joinConfiguration.nodeRegistration object",
            "spec.joinConfiguration.nodeRegistration.name string",
            "spec.joinConfiguration.nodeRegistration.kubeletExtraArgs array",
            "spec.joinConfiguration.nodeRegistration.kubeletExtraArgs[].name! string",
            "spec.joinConfiguration.nodeRegistration.kubeletExtraArgs[].value! string",
            "spec.clusterConfiguration object",
            "status.dataSecretName string",
            "status.initialization object",
            "status.initialization.dataSecretCreated boolean",
        ],
    ),
    (
        "KubeadmConfigTemplate",
        &[
            "spec object",
            "spec.template! object",
            "spec.template.spec object",
        ],
    ),
];

/// A touched path: its segments, type and whether it is required.
pub fn parse_touched(line: &str) -> (Vec<&str>, &str, bool) {
    let (path, ty) = line.split_once(' ').unwrap_or((line, "object"));
    let required = path.ends_with('!');
    let path = path.trim_end_matches('!');
    (path.split('.').collect(), ty, required)
}

/// Declares property `name` of type `ty` on `parent` (an object node), required or not. Objects keep
/// fields they do not declare; array items keep whatever they hold until a `[]` path declares them.
fn declare(parent: &mut Value, name: &str, ty: &str, required: bool) {
    if required {
        match parent["required"].as_array_mut() {
            Some(list) if !list.iter().any(|v| v == name) => list.push(json!(name)),
            Some(_) => {}
            None => parent["required"] = json!([name]),
        }
    }
    let node = &mut parent["properties"][name];
    node["type"] = json!(ty);
    match ty {
        "object" => node["x-kubernetes-preserve-unknown-fields"] = json!(true),
        "array" if node.get("items").is_none() => {
            node["items"] = json!({"x-kubernetes-preserve-unknown-fields": true});
        }
        _ => {}
    }
}

fn builtin_schema(kind: &str) -> Value {
    let mut root = json!({"type": "object", "properties": {
        "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true, "properties": {}},
        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true, "properties": {}},
    }});
    let paths = TOUCHED
        .iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, p)| *p)
        .unwrap_or_default();
    for line in paths {
        let (segments, ty, required) = parse_touched(line);
        // The requirement sits on the parent of the last segment.
        let (last, parents) = match segments.split_last() {
            Some(x) => x,
            None => continue,
        };
        let mut node = &mut root;
        for seg in parents {
            node = match seg.strip_suffix("[]") {
                Some(name) => {
                    // An array whose items are declared: objects.
                    let items = &mut node["properties"][name]["items"];
                    items["type"] = json!("object");
                    items
                }
                None => &mut node["properties"][*seg],
            };
        }
        declare(node, last, ty, required);
    }
    root
}

/// The built-in CAPI CRDs (for machines without CAPI's own: see [`capi_crds`]).
pub fn crds() -> Vec<CustomResourceDefinition> {
    BUILTINS
        .iter()
        .map(|b| {
            let mut printer: Vec<Value> = b
                .columns
                .iter()
                .map(|(name, path)| json!({"name": name, "type": "string", "jsonPath": path}))
                .collect();
            printer.push(
                json!({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}),
            );
            // Templates have no status in CAPI.
            let mut subresources = if b.kind.ends_with("Template") {
                json!({})
            } else {
                json!({"status": {}})
            };
            if b.scale != Scale::None {
                subresources["scale"] = json!({
                    "specReplicasPath": ".spec.replicas",
                    "statusReplicasPath": ".status.replicas",
                });
            }
            if b.scale == Scale::WithSelector {
                subresources["scale"]["labelSelectorPath"] = json!(".status.selector");
            }
            let mut names = json!({
                "kind": b.kind,
                "listKind": format!("{}List", b.kind),
                "plural": b.plural,
                "singular": b.kind.to_lowercase(),
                "categories": ["cluster-api"],
            });
            if !b.short.is_empty() {
                names["shortNames"] = json!([b.short]);
            }
            let crd = json!({
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": format!("{}.{}", b.plural, b.group)},
                "spec": {
                    "group": b.group,
                    "names": names,
                    "scope": "Namespaced",
                    "versions": [{
                        "name": "v1beta2",
                        "served": true,
                        "storage": true,
                        "subresources": subresources,
                        "additionalPrinterColumns": printer,
                        "schema": {"openAPIV3Schema": builtin_schema(b.kind)},
                    }],
                },
            });
            // A literal known to match the CRD type.
            serde_json::from_value(crd).unwrap_or_default()
        })
        .collect()
}

/// Where CAPI's own CRDs are: `$CAPMVM_SHARED_DIR/capi-crds/<version>`, else `../shared/capi-crds/<version>`
/// beside the workspace root; `None` if neither holds them.
pub fn real_crds_dir() -> Option<PathBuf> {
    let dir = shared_dir().join("capi-crds").join(CAPI_CRDS_VERSION);
    dir.is_dir().then_some(dir)
}

/// `$CAPMVM_SHARED_DIR`, else `../shared` beside the workspace root.
fn shared_dir() -> PathBuf {
    std::env::var_os("CAPMVM_SHARED_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared"))
}

/// Whether this run is CI's: the one rule every reader of `CI` uses ([`capmvm_upstream::skip::means_ci`]:
/// anything but unset, empty, `0` or `false`); there a check that needs an input must not pass by
/// skipping.
pub fn under_ci() -> bool {
    capmvm_upstream::skip::under_ci()
}

/// [`real_crds_dir`] for a test that checks against CAPI's own CRDs: `None` (skip) when they are
/// missing on a developer's machine, said on the terminal whatever the harness captures; a panic
/// naming where they were looked for under CI ([`under_ci`]), where a skip would pass the run
/// without the check ([`capmvm_upstream::skip::skip`]).
pub fn real_crds_dir_or_skip(test: &str) -> Option<PathBuf> {
    if let Some(dir) = real_crds_dir() {
        return Some(dir);
    }
    let looked = shared_dir().join("capi-crds").join(CAPI_CRDS_VERSION);
    capmvm_upstream::skip::skip(
        test,
        &format!(
            "CAPI's CRDs are not at {}: set CAPMVM_SHARED_DIR to the directory holding capi-crds/",
            looked.display()
        ),
    );
    None
}

/// Reads every `*.yaml` CRD of `dir`, sorted by file name.
pub fn read_crds(dir: &Path) -> Result<Vec<CustomResourceDefinition>, CrdError> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|source| CrdError::Read {
            path: dir.to_path_buf(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).map_err(|source| CrdError::Read {
                path: path.clone(),
                source,
            })?;
            let value: Value = serde_saphyr::from_str(&text).map_err(|e| CrdError::Parse {
                path: path.clone(),
                message: e.to_string(),
            })?;
            serde_json::from_value(value).map_err(|e| CrdError::Parse {
                path,
                message: e.to_string(),
            })
        })
        .collect()
}

/// The CAPI CRDs to install and where they come from: CAPI's own when [`real_crds_dir`] finds them
/// (read once per process), else the built-in ones.
pub fn capi_crds() -> Result<(Vec<CustomResourceDefinition>, String), CrdError> {
    static REAL: OnceLock<Option<(Vec<CustomResourceDefinition>, String)>> = OnceLock::new();
    if let Some(found) = REAL.get() {
        return Ok(found
            .clone()
            .unwrap_or_else(|| (crds(), "built-in".to_string())));
    }
    let found = match real_crds_dir() {
        Some(dir) => Some((
            read_crds(&dir)?,
            format!("CAPI {CAPI_CRDS_VERSION} ({})", dir.display()),
        )),
        None => None,
    };
    let found = REAL.get_or_init(|| found).clone();
    Ok(found.unwrap_or_else(|| (crds(), "built-in".to_string())))
}

/// The schema node at `segments` (`[]` for array items) of an `openAPIV3Schema`, and whether its parent
/// requires it.
pub fn schema_at<'a>(root: &'a Value, segments: &[&str]) -> Option<(&'a Value, bool)> {
    let mut node = root;
    let mut required = false;
    for seg in segments {
        let (name, is_array) = match seg.strip_suffix("[]") {
            Some(n) => (n, true),
            None => (*seg, false),
        };
        required = node["required"]
            .as_array()
            .is_some_and(|r| r.iter().any(|v| v == name));
        node = node.get("properties")?.get(name)?;
        if is_array {
            node = node.get("items")?;
        }
    }
    Some((node, required))
}

/// The served v1beta2 `openAPIV3Schema` of a CRD, as JSON.
pub fn v1beta2_schema(crd: &CustomResourceDefinition) -> Option<Value> {
    let version = crd.spec.versions.iter().find(|v| v.name == "v1beta2")?;
    let schema = version.schema.as_ref()?.open_api_v3_schema.as_ref()?;
    serde_json::to_value(schema).ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn builtin_schemas_declare_every_touched_path_with_its_type() {
        for crd in crds() {
            let kind = crd.spec.names.kind.clone();
            let schema = v1beta2_schema(&crd).unwrap();
            let (_, lines) = TOUCHED.iter().find(|(k, _)| *k == kind).unwrap();
            for line in *lines {
                let (segments, ty, required) = parse_touched(line);
                let (node, is_required) = schema_at(&schema, &segments)
                    .unwrap_or_else(|| panic!("{kind}: {line} is not declared"));
                let node_type = if segments.last().unwrap().ends_with("[]") {
                    "object"
                } else {
                    node["type"].as_str().unwrap()
                };
                assert_eq!(node_type, ty, "{kind}: {line}");
                assert_eq!(is_required, required, "{kind}: {line}");
            }
        }
    }

    /// The built-in CRDs agree with CAPI's own on every touched path: type and required-ness, and on
    /// subresources. Runs where CAPI's CRDs are present (CI and development machines).
    #[test]
    fn builtin_crds_agree_with_capi_on_every_touched_path() {
        let Some(dir) = real_crds_dir_or_skip("builtin_crds_agree_with_capi_on_every_touched_path")
        else {
            return;
        };
        let real = read_crds(&dir).unwrap();
        for builtin in crds() {
            let name = builtin.metadata.name.clone().unwrap();
            let capi = real
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(name.as_str()))
                .unwrap_or_else(|| panic!("CAPI has no CRD {name}"));
            assert_eq!(capi.spec.names.kind, builtin.spec.names.kind);
            assert_eq!(capi.spec.names.plural, builtin.spec.names.plural);
            let sub = |c: &CustomResourceDefinition| {
                let v = c
                    .spec
                    .versions
                    .iter()
                    .find(|v| v.name == "v1beta2")
                    .unwrap();
                let s = v.subresources.clone().unwrap_or_default();
                (
                    s.status.is_some(),
                    s.scale.map(|s| {
                        (
                            s.spec_replicas_path,
                            s.status_replicas_path,
                            s.label_selector_path,
                        )
                    }),
                )
            };
            assert_eq!(sub(&builtin), sub(capi), "{name}: subresources");
            let capi_schema = v1beta2_schema(capi).unwrap();
            let kind = builtin.spec.names.kind.clone();
            let (_, lines) = TOUCHED.iter().find(|(k, _)| *k == kind).unwrap();
            for line in *lines {
                let (segments, ty, required) = parse_touched(line);
                let (node, is_required) = schema_at(&capi_schema, &segments)
                    .unwrap_or_else(|| panic!("{kind}: CAPI's schema has no {line}"));
                let capi_type = if segments.last().unwrap().ends_with("[]") {
                    "object"
                } else {
                    node["type"].as_str().unwrap_or("")
                };
                assert_eq!(capi_type, ty, "{kind}: type of {line}");
                assert_eq!(is_required, required, "{kind}: required-ness of {line}");
            }
        }
    }
}
