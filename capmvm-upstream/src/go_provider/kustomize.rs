//! The subset of kustomize the Go provider's `config/default` uses, read from its files as they
//! are: `resources` and `bases` (files and folders), `patchesStrategicMerge` (maps merged, as
//! every patch there is), `commonLabels`, `namespace`, `namePrefix` and `vars` (an object's name
//! or namespace substituted into `$(NAME)` in annotations). kustomize itself is not needed:
//! nothing here reaches a network.
//!
//! References follow the objects they name, as kustomize's built-in `nameReference` and
//! `namespace` configurations (and the folders' `kustomizeconfig.yaml`) make them: role
//! bindings' `roleRef` and ServiceAccount `subjects`, webhooks' and conversion webhooks'
//! `clientConfig.service`.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};

use crate::{Error, Result, io_error};

/// One rendered object and the name it had in its file (what `vars` and patches refer to).
#[derive(Clone, Debug)]
pub struct Rendered {
    /// The object.
    pub object: Value,
    /// `metadata.name` before `namePrefix`.
    pub original_name: String,
}

impl Rendered {
    /// Its kind.
    pub fn kind(&self) -> &str {
        self.object["kind"].as_str().unwrap_or_default()
    }

    /// Its (rendered) name.
    pub fn name(&self) -> &str {
        self.object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }
}

/// Kinds with no namespace (among those the config holds).
fn cluster_scoped(kind: &str) -> bool {
    matches!(
        kind,
        "Namespace"
            | "CustomResourceDefinition"
            | "ClusterRole"
            | "ClusterRoleBinding"
            | "MutatingWebhookConfiguration"
            | "ValidatingWebhookConfiguration"
    )
}

pub(crate) fn read_yaml_docs(path: &Path) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).map_err(io_error(path))?;
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).map_err(|e| Error::Manifest {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect()
}

/// Whether every item of a list is an object with a `name` (containers, volumes, ports: the
/// lists whose strategic merge key is `name`).
fn named_items(list: &[Value]) -> bool {
    list.iter()
        .all(|i| i.get("name").is_some_and(Value::is_string))
}

/// Merges `patch` into `target` as a strategic merge patch does for what the Go provider's
/// patches hold: maps merged key by key, lists of named objects merged item by item on `name`,
/// any other value replaced.
fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                match t.get_mut(k) {
                    Some(existing) => merge(existing, v),
                    None => {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (Value::Array(t), Value::Array(p)) if named_items(t) && named_items(p) => {
            for item in p {
                match t.iter_mut().find(|i| i["name"] == item["name"]) {
                    Some(existing) => merge(existing, item),
                    None => t.push(item.clone()),
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

/// Renders the kustomization in `dir`.
pub fn render(dir: &Path) -> Result<Vec<Rendered>> {
    let file = dir.join("kustomization.yaml");
    let k = read_yaml_docs(&file)?
        .into_iter()
        .next()
        .unwrap_or_else(|| json!({}));
    let mut out = Vec::new();
    for entry in strings(&k["resources"])
        .into_iter()
        .chain(strings(&k["bases"]))
    {
        let path = dir.join(&entry);
        if path.is_dir() {
            out.extend(render(&path)?);
        } else {
            for object in read_yaml_docs(&path)? {
                let original_name = object
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                out.push(Rendered {
                    object,
                    original_name,
                });
            }
        }
    }
    for patch_file in strings(&k["patchesStrategicMerge"]) {
        let path = dir.join(&patch_file);
        for patch in read_yaml_docs(&path)? {
            let kind = patch["kind"].as_str().unwrap_or_default();
            let name = patch
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let target = out
                .iter_mut()
                .find(|r| r.kind() == kind && r.original_name == name)
                .ok_or_else(|| Error::Manifest {
                    path: path.clone(),
                    message: format!("the patch's target {kind} {name} is not among the resources"),
                })?;
            let mut patch = patch.clone();
            // Identity fields are the target's, not the patch's (`namespace: system` in a patch
            // of an already-namespaced object).
            if let Some(meta) = patch.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.remove("name");
                meta.remove("namespace");
            }
            merge(&mut target.object, &patch);
        }
    }
    if let Some(labels) = k["commonLabels"].as_object() {
        for r in &mut out {
            for (key, value) in labels {
                r.object["metadata"]["labels"][key] = value.clone();
            }
        }
    }
    if let Some(namespace) = k["namespace"].as_str() {
        for r in &mut out {
            set_namespace(&mut r.object, namespace);
        }
    }
    if let Some(prefix) = k["namePrefix"].as_str() {
        let names: Vec<(String, String)> = out
            .iter()
            .map(|r| (r.kind().to_string(), r.original_name.clone()))
            .collect();
        for r in &mut out {
            add_prefix(&mut r.object, prefix, &names);
        }
    }
    substitute_vars(&k, &mut out);
    Ok(out)
}

fn set_namespace(o: &mut Value, namespace: &str) {
    let kind = o["kind"].as_str().unwrap_or_default().to_string();
    if kind == "Namespace" {
        o["metadata"]["name"] = json!(namespace);
    } else if !cluster_scoped(&kind) {
        o["metadata"]["namespace"] = json!(namespace);
    }
    for subject in o
        .get_mut("subjects")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if subject["kind"] == "ServiceAccount" {
            subject["namespace"] = json!(namespace);
        }
    }
    for service in services(o) {
        service["namespace"] = json!(namespace);
    }
}

/// The `clientConfig.service` stanzas of webhooks and of a CRD's conversion webhook.
fn services(o: &mut Value) -> Vec<&mut Value> {
    let mut out = Vec::new();
    if o["kind"] == "CustomResourceDefinition" {
        if let Some(s) = o.pointer_mut("/spec/conversion/webhook/clientConfig/service") {
            out.push(s);
        }
    } else if let Some(hooks) = o.get_mut("webhooks").and_then(Value::as_array_mut) {
        for hook in hooks {
            if let Some(s) = hook.pointer_mut("/clientConfig/service") {
                out.push(s);
            }
        }
    }
    out
}

/// `namePrefix`: every name but a CRD's and a Namespace's, and the references to renamed objects.
fn add_prefix(o: &mut Value, prefix: &str, names: &[(String, String)]) {
    let renamed = |kind: &str, name: &str| {
        names
            .iter()
            .any(|(k, n)| k == kind && n == name)
            .then(|| format!("{prefix}{name}"))
    };
    let kind = o["kind"].as_str().unwrap_or_default().to_string();
    if kind != "CustomResourceDefinition"
        && kind != "Namespace"
        && let Some(name) = o.pointer("/metadata/name").and_then(Value::as_str)
    {
        o["metadata"]["name"] = json!(format!("{prefix}{name}"));
    }
    if let Some(role) = o.get_mut("roleRef") {
        let kind = role["kind"].as_str().unwrap_or_default().to_string();
        if let Some(new) = role["name"].as_str().and_then(|n| renamed(&kind, n)) {
            role["name"] = json!(new);
        }
    }
    for subject in o
        .get_mut("subjects")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if let Some(new) = subject["name"]
            .as_str()
            .and_then(|n| renamed("ServiceAccount", n))
        {
            subject["name"] = json!(new);
        }
    }
    for service in services(o) {
        if let Some(new) = service["name"].as_str().and_then(|n| renamed("Service", n)) {
            service["name"] = json!(new);
        }
    }
}

/// `vars`: `$(NAME)` in annotations replaced by the named object's name or `fieldref` field.
fn substitute_vars(k: &Value, out: &mut [Rendered]) {
    let mut values = BTreeMap::new();
    for var in k["vars"].as_array().into_iter().flatten() {
        let (Some(name), Some(kind), Some(target)) = (
            var["name"].as_str(),
            var.pointer("/objref/kind").and_then(Value::as_str),
            var.pointer("/objref/name").and_then(Value::as_str),
        ) else {
            continue;
        };
        let field = var
            .pointer("/fieldref/fieldpath")
            .and_then(Value::as_str)
            .unwrap_or("metadata.name");
        let pointer = format!("/{}", field.replace('.', "/"));
        if let Some(value) = out
            .iter()
            .find(|r| r.kind() == kind && r.original_name == target)
            .and_then(|r| r.object.pointer(&pointer))
            .and_then(Value::as_str)
        {
            values.insert(format!("$({name})"), value.to_string());
        }
    }
    for r in out {
        if let Some(annotations) = r
            .object
            .pointer_mut("/metadata/annotations")
            .and_then(Value::as_object_mut)
        {
            for value in annotations.values_mut() {
                if let Some(s) = value.as_str() {
                    let mut s = s.to_string();
                    for (var, with) in &values {
                        s = s.replace(var, with);
                    }
                    *value = json!(s);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn merge_keeps_what_the_patch_does_not_name() {
        let mut target = json!({"a": {"b": 1, "c": 2}, "d": [1], "n": [{"name": "x", "v": 1}]});
        merge(
            &mut target,
            &json!({"a": {"c": 3, "e": 4}, "d": [2], "n": [{"name": "x", "w": 2}, {"name": "y"}]}),
        );
        assert_eq!(
            target,
            json!({"a": {"b": 1, "c": 3, "e": 4}, "d": [2], "n": [{"name": "x", "v": 1, "w": 2}, {"name": "y"}]})
        );
    }

    #[test]
    fn a_small_kustomization_renders_as_kustomize_does() {
        let dir = std::env::temp_dir().join(format!("capmvm-kustomize-{}", std::process::id()));
        let base = dir.join("rbac");
        std::fs::create_dir_all(&base).unwrap();
        std::fs::write(
            dir.join("kustomization.yaml"),
            "namePrefix: p-\nnamespace: p-system\ncommonLabels:\n  l: v\nresources:\n- ns.yaml\nbases:\n- rbac\nvars:\n- name: SA\n  objref:\n    kind: ServiceAccount\n    version: v1\n    name: sa\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("ns.yaml"),
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: system\n  annotations:\n    a: $(SA)\n",
        )
        .unwrap();
        std::fs::write(base.join("kustomization.yaml"), "resources:\n- all.yaml\n").unwrap();
        std::fs::write(
            base.join("all.yaml"),
            "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: sa\n  namespace: system\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: b\nroleRef:\n  kind: ClusterRole\n  name: r\nsubjects:\n- kind: ServiceAccount\n  name: sa\n  namespace: system\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: r\n",
        )
        .unwrap();
        let out = render(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let by_kind = |k: &str| out.iter().find(|r| r.kind() == k).unwrap().object.clone();
        let ns = by_kind("Namespace");
        assert_eq!(ns["metadata"]["name"], "p-system");
        assert_eq!(ns["metadata"]["annotations"]["a"], "p-sa");
        assert_eq!(ns["metadata"]["labels"]["l"], "v");
        let sa = by_kind("ServiceAccount");
        assert_eq!(sa["metadata"]["namespace"], "p-system");
        assert_eq!(sa["metadata"]["name"], "p-sa");
        let binding = by_kind("ClusterRoleBinding");
        assert_eq!(binding["metadata"]["name"], "p-b");
        assert!(binding["metadata"].get("namespace").is_none());
        assert_eq!(binding["roleRef"]["name"], "p-r");
        assert_eq!(
            binding["subjects"][0],
            json!({"kind": "ServiceAccount", "name": "p-sa", "namespace": "p-system"})
        );
    }
}
