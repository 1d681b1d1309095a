//! Manifests: clusterctl-style variable substitution and applying multi-document YAML through API
//! discovery, the way `kubectl apply` resolves kinds.

use std::collections::BTreeMap;

use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::pinned_kind;
use kube::{Api, ResourceExt};

/// Why a manifest could not be rendered or applied.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A `${VAR}` has no value and no default.
    #[error("variable {0} is not set and has no default (write ${{{0}:=value}})")]
    Unset(String),
    /// An unterminated `${`.
    #[error("unterminated ${{ at byte {0}")]
    Unterminated(usize),
    /// The YAML does not parse.
    #[error("document {index}: {message}")]
    Yaml {
        /// Which document (0-based).
        index: usize,
        /// The parser's message.
        message: String,
    },
    /// An apiVersion that is not `group/version` or `version`.
    #[error("{kind} {name}: apiVersion {api_version:?} is not group/version")]
    ApiVersion {
        /// Kind of the object.
        kind: String,
        /// Name of the object.
        name: String,
        /// The apiVersion.
        api_version: String,
    },
    /// A document lacks apiVersion or kind.
    #[error("document {0} has no apiVersion or kind")]
    NoKind(usize),
    /// The API server refused.
    #[error("{kind} {name}: {source}")]
    Api {
        /// Kind of the object.
        kind: String,
        /// Name of the object.
        name: String,
        /// The error.
        source: kube::Error,
    },
}

/// Replaces `${VAR}`, `${VAR:=default}`, `${VAR:-default}` and `${VAR=default}` with `vars[VAR]`, else
/// the default (as clusterctl's envsubst does).
pub fn envsubst(text: &str, vars: &BTreeMap<String, String>) -> Result<String, Error> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut offset = 0;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find('}').ok_or(Error::Unterminated(offset + start))?;
        let (name, default) = split_expression(after[..end].trim());
        // clusterctl (drone/envsubst with its own check) treats an empty default as no default:
        // `${VAR:=}` with VAR unset refuses to render, as here.
        let default = default.filter(|d| !d.is_empty());
        match vars.get(name).map(String::as_str).or(default) {
            Some(value) => out.push_str(value),
            None => return Err(Error::Unset(name.to_string())),
        }
        offset += start + 2 + end + 1;
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The variables of `text` as `clusterctl generate cluster --list-variables` sorts them: name to
/// `None` when required (some use has no default, or an empty one, which clusterctl takes for
/// none), else to its default.
pub fn variables(text: &str) -> Result<BTreeMap<String, Option<String>>, Error> {
    let mut found: BTreeMap<String, Option<String>> = BTreeMap::new();
    let mut rest = text;
    let mut offset = 0;
    while let Some(start) = rest.find("${") {
        let after = &rest[start + 2..];
        let end = after.find('}').ok_or(Error::Unterminated(offset + start))?;
        let (name, default) = split_expression(after[..end].trim());
        let default = default.filter(|d| !d.is_empty());
        let entry = found
            .entry(name.to_string())
            .or_insert(default.map(str::to_string));
        if default.is_none() {
            *entry = None;
        }
        offset += start + 2 + end + 1;
        rest = &after[end + 1..];
    }
    Ok(found)
}

/// `NAME`, `NAME:=default`, `NAME:-default` or `NAME=default`: the name and the default.
fn split_expression(expr: &str) -> (&str, Option<&str>) {
    match expr.find([':', '=']) {
        Some(i) => {
            let (name, tail) = expr.split_at(i);
            (
                name.trim(),
                Some(tail.trim_start_matches([':', '=', '-']).trim()),
            )
        }
        None => (expr, None),
    }
}

/// Parses multi-document YAML into objects (empty documents skipped).
pub fn parse(yaml: &str) -> Result<Vec<DynamicObject>, Error> {
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(yaml).map_err(|e| Error::Yaml {
            index: 0,
            message: e.to_string(),
        })?;
    docs.into_iter()
        .filter(|d| !d.is_null())
        .enumerate()
        .map(|(index, doc)| {
            if doc.get("apiVersion").is_none() || doc.get("kind").is_none() {
                return Err(Error::NoKind(index));
            }
            serde_json::from_value(doc).map_err(|e| Error::Yaml {
                index,
                message: e.to_string(),
            })
        })
        .collect()
}

/// Creates each object, or merges it into an existing one of the same name. Returns `Kind/name` of each.
pub async fn apply(client: &kube::Client, objects: &[DynamicObject]) -> Result<Vec<String>, Error> {
    let mut applied = Vec::new();
    for obj in objects {
        let types = obj.types.clone().unwrap_or_default();
        let name = obj.name_any();
        let api_err = |source| Error::Api {
            kind: types.kind.clone(),
            name: name.clone(),
            source,
        };
        let gvk = GroupVersionKind::try_from(&types).map_err(|_| Error::ApiVersion {
            kind: types.kind.clone(),
            name: name.clone(),
            api_version: types.api_version.clone(),
        })?;
        let (resource, caps) = pinned_kind(client, &gvk).await.map_err(api_err)?;
        let api: Api<DynamicObject> = match (&caps.scope, obj.namespace()) {
            (kube::discovery::Scope::Namespaced, Some(ns)) => {
                Api::namespaced_with(client.clone(), &ns, &resource)
            }
            (kube::discovery::Scope::Namespaced, None) => {
                Api::default_namespaced_with(client.clone(), &resource)
            }
            (kube::discovery::Scope::Cluster, _) => Api::all_with(client.clone(), &resource),
        };
        match api.create(&PostParams::default(), obj).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {
                api.patch(&name, &PatchParams::default(), &Patch::Merge(obj))
                    .await
                    .map_err(api_err)?;
            }
            Err(e) => return Err(api_err(e)),
        }
        applied.push(format!("{}/{name}", types.kind));
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substitutes_like_clusterctl() {
        let vars = BTreeMap::from([("A".to_string(), "x".to_string())]);
        assert_eq!(
            envsubst("${A}-${B:=y}-${ C := z }-${D:-w}", &vars).unwrap(),
            "x-y-z-w"
        );
        assert_eq!(envsubst("${A:=ignored}", &vars).unwrap(), "x");
        assert!(matches!(envsubst("${B}", &vars), Err(Error::Unset(v)) if v == "B"));
        // An empty default is no default, as clusterctl has it.
        assert!(matches!(envsubst("${B:=}", &vars), Err(Error::Unset(v)) if v == "B"));
        assert_eq!(envsubst("${A:=}", &vars).unwrap(), "x");
        assert!(matches!(
            envsubst("a ${B", &vars),
            Err(Error::Unterminated(2))
        ));
        assert_eq!(envsubst("no vars", &vars).unwrap(), "no vars");
    }

    #[test]
    fn variables_are_listed_as_clusterctl_lists_them() {
        let listed = variables("${A} ${B:=1} ${C:-} ${A:=x} ${D:=2} ${D}").unwrap();
        assert_eq!(
            listed,
            BTreeMap::from([
                ("A".to_string(), None),
                ("B".to_string(), Some("1".to_string())),
                ("C".to_string(), None),
                ("D".to_string(), None),
            ])
        );
    }

    #[test]
    fn the_cluster_template_renders_into_valid_objects() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../templates/cluster-template.yaml"
        ))
        .unwrap();
        let vars = crate::world::template_variables(&["10.0.0.11:9090".into()]);
        let objects = parse(&envsubst(&text, &vars).unwrap()).unwrap();
        let kinds: Vec<_> = objects
            .iter()
            .map(|o| o.types.as_ref().unwrap().kind.as_str())
            .collect();
        assert_eq!(
            kinds,
            [
                "Cluster",
                "MicrovmCluster",
                "MicrovmMachineTemplate",
                "KubeadmControlPlane",
                "MicrovmMachineTemplate",
                "KubeadmConfigTemplate",
                "MachineDeployment"
            ]
        );
        for obj in &objects {
            let value = serde_json::to_value(obj).unwrap();
            match obj.types.as_ref().unwrap().kind.as_str() {
                "MicrovmCluster" => {
                    let mc: capmvm_api::MicrovmCluster = serde_json::from_value(value).unwrap();
                    capmvm_api::validation::validate_cluster(&mc).unwrap();
                }
                "MicrovmMachineTemplate" => {
                    let t: capmvm_api::MicrovmMachineTemplate =
                        serde_json::from_value(value).unwrap();
                    capmvm_api::validation::validate_template(&t).unwrap();
                }
                _ => {}
            }
        }
    }
}
