//! What is served: one `ResourceDef` per (group, version, resource), for the built-in kinds and for every
//! version of every established CustomResourceDefinition.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::builtin;
use super::error::FieldError;
use super::jsonpath::JsonPath;
use super::meta::{self, NameRule};
use super::schema::Schema;

/// The built-in kinds, which have behaviour of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Builtin {
    Namespace,
    Secret,
    ConfigMap,
    Event,
    EventV1,
    Lease,
    Crd,
    Node,
}

/// How objects are converted between the served version and the stored one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Conversion {
    /// Served as stored.
    None,
    /// Another version of a custom resource: only `apiVersion` changes (the `None` strategy).
    ApiVersion { stored: String },
    /// `events.k8s.io/v1` Events, stored as core `v1` Events.
    EventsV1,
}

/// Where a table cell comes from.
#[derive(Debug, Clone)]
pub(crate) enum CellSource {
    Path(JsonPath),
    /// Number of entries of `data` plus `binaryData` (Secrets, ConfigMaps).
    DataCount,
    /// `kind/name` of the object an Event is about.
    EventObject,
    /// How long ago an Event was last seen.
    EventLastSeen,
    /// A Node's readiness as kubectl prints it: `Ready`, `NotReady` or `Unknown`, plus
    /// `,SchedulingDisabled` when cordoned.
    NodeStatus,
    /// A Node's roles from its `node-role.kubernetes.io/<role>` labels, or `<none>`.
    NodeRoles,
}

/// A column of the Table output.
#[derive(Debug, Clone)]
pub(crate) struct Column {
    pub(crate) name: String,
    pub(crate) ty: String,
    pub(crate) format: String,
    pub(crate) description: String,
    pub(crate) priority: i64,
    pub(crate) source: CellSource,
}

/// Where a custom resource keeps what its `/scale` subresource shows: JSON paths (`.spec.replicas`)
/// as the CRD's `subresources.scale` gives them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ScalePaths {
    pub(crate) spec_replicas: String,
    pub(crate) status_replicas: String,
    pub(crate) label_selector: Option<String>,
}

impl ScalePaths {
    fn from_crd_version(v: &Value) -> Option<Self> {
        let scale = v.pointer("/subresources/scale")?;
        let path = |key: &str| scale.get(key).and_then(Value::as_str).map(str::to_string);
        Some(Self {
            spec_replicas: path("specReplicasPath")?,
            status_replicas: path("statusReplicasPath")?,
            label_selector: path("labelSelectorPath").filter(|p| !p.is_empty()),
        })
    }
}

/// One served (group, version, resource).
#[derive(Debug)]
pub(crate) struct ResourceDef {
    pub(crate) group: String,
    pub(crate) version: String,
    pub(crate) plural: String,
    pub(crate) singular: String,
    pub(crate) kind: String,
    pub(crate) list_kind: String,
    pub(crate) namespaced: bool,
    pub(crate) short_names: Vec<String>,
    pub(crate) categories: Vec<String>,
    /// The collection in the store, shared by every version of a resource: `group/plural`.
    pub(crate) storage: Arc<str>,
    pub(crate) conversion: Conversion,
    pub(crate) builtin: Option<Builtin>,
    pub(crate) status_subresource: bool,
    /// The scale subresource's paths, for CRD versions that declare `subresources.scale`.
    pub(crate) scale: Option<ScalePaths>,
    pub(crate) schema: Option<Arc<Schema>>,
    /// The schema as written, for the OpenAPI documents.
    pub(crate) raw_schema: Option<Value>,
    pub(crate) columns: Vec<Column>,
    /// Field selector labels and the paths they read.
    pub(crate) field_selectors: Vec<(String, String)>,
    pub(crate) name_rule: NameRule,
    pub(crate) has_generation: bool,
    pub(crate) allow_unconditional_update: bool,
    pub(crate) allow_create_on_update: bool,
    /// Counter labels: `group/resource` and `group/resource/status`.
    pub(crate) counter_name: Arc<str>,
    pub(crate) counter_name_status: Arc<str>,
    pub(crate) deprecation_warning: Option<String>,
}

impl ResourceDef {
    pub(crate) fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    pub(crate) fn selectors(&self) -> Vec<(&str, &str)> {
        self.field_selectors
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect()
    }

    /// `group/resource` for errors and counters (the core group is spelled `core`).
    pub(crate) fn group_for_counters(group: &str) -> &str {
        if group.is_empty() { "core" } else { group }
    }
}

pub(crate) fn storage_key(group: &str, plural: &str) -> Arc<str> {
    Arc::from(format!("{group}/{plural}"))
}

/// The served resources, by group and version.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    /// (group, version) → resources; core is `("", "v1")`.
    by_gv: BTreeMap<(String, String), Vec<Arc<ResourceDef>>>,
    /// Group order of discovery: built-in groups first, then custom ones in creation order.
    group_order: Vec<String>,
}

impl Registry {
    pub(crate) fn with_builtins() -> Self {
        let mut r = Self::default();
        for def in builtin::defs() {
            r.add(Arc::new(def));
        }
        r
    }

    fn add(&mut self, def: Arc<ResourceDef>) {
        if !self.group_order.contains(&def.group) {
            self.group_order.push(def.group.clone());
        }
        let list = self
            .by_gv
            .entry((def.group.clone(), def.version.clone()))
            .or_default();
        list.retain(|d| d.plural != def.plural);
        list.push(def);
    }

    pub(crate) fn lookup(
        &self,
        group: &str,
        version: &str,
        plural: &str,
    ) -> Option<Arc<ResourceDef>> {
        self.by_gv
            .get(&(group.to_string(), version.to_string()))
            .and_then(|l| l.iter().find(|d| d.plural == plural))
            .cloned()
    }

    pub(crate) fn has_group_version(&self, group: &str, version: &str) -> bool {
        self.by_gv
            .contains_key(&(group.to_string(), version.to_string()))
    }

    pub(crate) fn resources(&self, group: &str, version: &str) -> Vec<Arc<ResourceDef>> {
        self.by_gv
            .get(&(group.to_string(), version.to_string()))
            .cloned()
            .unwrap_or_default()
    }

    /// Groups with their versions, preferred version first.
    pub(crate) fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut out = Vec::new();
        for g in &self.group_order {
            let mut versions: Vec<String> = self
                .by_gv
                .keys()
                .filter(|(gg, _)| gg == g)
                .map(|(_, v)| v.clone())
                .collect();
            if versions.is_empty() {
                continue;
            }
            versions.sort_by(|a, b| {
                version_priority(b)
                    .cmp(&version_priority(a))
                    .then_with(|| a.cmp(b))
            });
            out.push((g.clone(), versions));
        }
        out
    }

    pub(crate) fn all(&self) -> Vec<Arc<ResourceDef>> {
        self.by_gv
            .values()
            .flat_map(|l| l.iter().cloned())
            .collect()
    }

    /// Replaces what a CRD serves (an empty list stops serving it).
    pub(crate) fn set_crd(&mut self, group: &str, plural: &str, defs: Vec<ResourceDef>) {
        for list in self.by_gv.values_mut() {
            list.retain(|d| !(d.group == group && d.plural == plural && d.builtin.is_none()));
        }
        self.by_gv.retain(|_, l| !l.is_empty());
        for d in defs {
            self.add(Arc::new(d));
        }
        let used: Vec<String> = self.by_gv.keys().map(|(g, _)| g.clone()).collect();
        self.group_order.retain(|g| used.contains(g));
    }
}

/// Kube-like version priority: GA > beta > alpha, then by numbers, then others.
pub(crate) fn version_priority(v: &str) -> (u8, u64, u64) {
    let Some(rest) = v.strip_prefix('v') else {
        return (0, 0, 0);
    };
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let Ok(major) = digits.parse::<u64>() else {
        return (0, 0, 0);
    };
    let tail = &rest[digits.len()..];
    if tail.is_empty() {
        return (3, major, 0);
    }
    for (prefix, rank) in [("beta", 2u8), ("alpha", 1u8)] {
        if let Some(n) = tail.strip_prefix(prefix)
            && let Ok(minor) = n.parse::<u64>()
        {
            return (rank, major, minor);
        }
    }
    (0, 0, 0)
}

fn str_field<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    let mut cur = v;
    for p in path {
        cur = cur.get(p)?;
    }
    cur.as_str()
}

fn str_list(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Server-side defaults of a CRD (`singular`, `listKind`, `conversion`).
pub(crate) fn default_crd(crd: &mut Value) {
    let Some(spec) = crd.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    if let Some(names) = spec.get_mut("names").and_then(Value::as_object_mut) {
        let kind = names
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if names
            .get("singular")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            names.insert("singular".into(), Value::String(kind.to_ascii_lowercase()));
        }
        if names
            .get("listKind")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
            && !kind.is_empty()
        {
            names.insert("listKind".into(), Value::String(format!("{kind}List")));
        }
    }
    if !spec.contains_key("conversion") {
        spec.insert("conversion".into(), json!({ "strategy": "None" }));
    }
}

/// The CRD validation rules of the real server that decide whether it can be served.
pub(crate) fn validate_crd(crd: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let name = meta::meta_str(crd, "name");
    let group = str_field(crd, &["spec", "group"]).unwrap_or("");
    let plural = str_field(crd, &["spec", "names", "plural"]).unwrap_or("");
    let kind = str_field(crd, &["spec", "names", "kind"]).unwrap_or("");
    if group.is_empty() {
        errs.push(FieldError::required("spec.group"));
    } else if !meta::is_dns1123_subdomain(group) {
        errs.extend(meta::name_errors(
            NameRule::Dns1123Subdomain,
            group,
            "spec.group",
        ));
    } else if !group.contains('.') {
        errs.push(FieldError::invalid(
            "spec.group",
            &json!(group),
            "should be a domain with at least one dot",
        ));
    }
    if plural.is_empty() {
        errs.push(FieldError::required("spec.names.plural"));
    } else if !meta::is_dns1123_label(plural) {
        errs.extend(meta::name_errors(
            NameRule::Dns1123Label,
            plural,
            "spec.names.plural",
        ));
    }
    if kind.is_empty() {
        errs.push(FieldError::required("spec.names.kind"));
    }
    if let Some(s) = str_field(crd, &["spec", "names", "singular"])
        && !s.is_empty()
        && !meta::is_dns1123_label(s)
    {
        errs.extend(meta::name_errors(
            NameRule::Dns1123Label,
            s,
            "spec.names.singular",
        ));
    }
    for (i, sn) in str_list(crd.pointer("/spec/names/shortNames"))
        .iter()
        .enumerate()
    {
        if !meta::is_dns1123_label(sn) {
            errs.extend(meta::name_errors(
                NameRule::Dns1123Label,
                sn,
                &format!("spec.names.shortNames[{i}]"),
            ));
        }
    }
    if !group.is_empty() && !plural.is_empty() && name != format!("{plural}.{group}") {
        errs.push(FieldError::invalid(
            "metadata.name",
            &json!(name),
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    match str_field(crd, &["spec", "scope"]) {
        Some("Namespaced" | "Cluster") => {}
        Some(other) => errs.push(FieldError::not_supported(
            "spec.scope",
            &json!(other),
            &["Cluster".to_string(), "Namespaced".to_string()],
        )),
        None => errs.push(FieldError::required("spec.scope")),
    }
    match str_field(crd, &["spec", "conversion", "strategy"]) {
        None | Some("None" | "Webhook") => {}
        Some(other) => errs.push(FieldError::not_supported(
            "spec.conversion.strategy",
            &json!(other),
            &["None".to_string(), "Webhook".to_string()],
        )),
    }
    let versions = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if versions.is_empty() {
        errs.push(FieldError::invalid(
            "spec.versions",
            &json!([]),
            "must have exactly one version marked as storage version",
        ));
        return errs;
    }
    let storage = versions
        .iter()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .count();
    if storage != 1 {
        errs.push(FieldError::invalid(
            "spec.versions",
            &Value::Array(versions.clone()),
            "must have exactly one version marked as storage version",
        ));
    }
    if !versions
        .iter()
        .any(|v| v.get("served").and_then(Value::as_bool) == Some(true))
    {
        errs.push(FieldError::invalid(
            "spec.versions",
            &Value::Array(versions.clone()),
            "must serve at least one version",
        ));
    }
    let mut seen = Vec::new();
    for (i, v) in versions.iter().enumerate() {
        let vname = v.get("name").and_then(Value::as_str).unwrap_or("");
        let base = format!("spec.versions[{i}]");
        if vname.is_empty() {
            errs.push(FieldError::required(format!("{base}.name")));
        } else if !meta::is_dns1123_label(vname) {
            errs.extend(meta::name_errors(
                NameRule::Dns1123Label,
                vname,
                &format!("{base}.name"),
            ));
        } else if seen.contains(&vname) {
            errs.push(FieldError::duplicate(format!("{base}.name"), &json!(vname)));
        }
        seen.push(vname);
        match v.pointer("/schema/openAPIV3Schema") {
            None => errs.push(FieldError::required_detail(
                format!("{base}.schema.openAPIV3Schema"),
                "schemas are required",
            )),
            Some(s) => {
                if s.get("type").and_then(Value::as_str) != Some("object") {
                    errs.push(FieldError::invalid(
                        format!("{base}.schema.openAPIV3Schema.type"),
                        s.get("type").unwrap_or(&Value::Null),
                        "must be object at the root",
                    ));
                }
                // The real server keeps a schema all versions share once, as `spec.validation`,
                // and names its errors there (once).
                let shared = versions
                    .iter()
                    .all(|o| o.pointer("/schema/openAPIV3Schema") == Some(s));
                let at = if shared {
                    "spec.validation.openAPIV3Schema".to_string()
                } else {
                    format!("{base}.schema.openAPIV3Schema")
                };
                if (!shared || i == 0)
                    && let Err(e) = Schema::compile(s, &at)
                {
                    errs.extend(e);
                }
            }
        }
        if let Some(cols) = v.get("additionalPrinterColumns").and_then(Value::as_array) {
            for (j, c) in cols.iter().enumerate() {
                let cbase = format!("{base}.additionalPrinterColumns[{j}]");
                if c.get("name")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    errs.push(FieldError::required(format!("{cbase}.name")));
                }
                let ty = c.get("type").and_then(Value::as_str).unwrap_or("");
                if !["integer", "number", "string", "boolean", "date"].contains(&ty) {
                    errs.push(FieldError::not_supported(
                        format!("{cbase}.type"),
                        &json!(ty),
                        &["boolean", "date", "integer", "number", "string"].map(str::to_string),
                    ));
                }
                let path = c.get("jsonPath").and_then(Value::as_str).unwrap_or("");
                if path.is_empty() {
                    errs.push(FieldError::required(format!("{cbase}.jsonPath")));
                } else if let Err(e) = JsonPath::parse(path) {
                    errs.push(FieldError::invalid(
                        format!("{cbase}.jsonPath"),
                        &json!(path),
                        &format!("must be a simple json path: {e}"),
                    ));
                }
            }
        }
    }
    errs
}

/// The `status` a CRD gets once it is served: names accepted, established, stored versions.
pub(crate) fn crd_status(crd: &Value, previous: Option<&Value>) -> Value {
    let now = meta::now_rfc3339();
    let names = crd
        .pointer("/spec/names")
        .cloned()
        .unwrap_or(Value::Object(Map::new()));
    let storage: Vec<String> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .map(|vs| {
            vs.iter()
                .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
                .filter_map(|v| v.get("name").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let mut stored: Vec<String> =
        str_list(previous.and_then(|p| p.pointer("/status/storedVersions")));
    for s in storage {
        if !stored.contains(&s) {
            stored.push(s);
        }
    }
    let since = |ty: &str| -> String {
        previous
            .and_then(|p| p.pointer("/status/conditions"))
            .and_then(Value::as_array)
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c.get("type").and_then(Value::as_str) == Some(ty))
            })
            .and_then(|c| c.get("lastTransitionTime").and_then(Value::as_str))
            .map_or_else(|| now.clone(), str::to_string)
    };
    json!({
        "acceptedNames": names,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
             "message": "no conflicts found", "lastTransitionTime": since("NamesAccepted")},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
             "message": "the initial names have been accepted", "lastTransitionTime": since("Established")}
        ],
        "storedVersions": stored
    })
}

/// Builds what a (validated) CRD serves.
pub(crate) fn defs_from_crd(crd: &Value) -> Vec<ResourceDef> {
    let group = str_field(crd, &["spec", "group"]).unwrap_or("").to_string();
    let names = crd.pointer("/spec/names").cloned().unwrap_or(Value::Null);
    let plural = str_field(&names, &["plural"]).unwrap_or("").to_string();
    let kind = str_field(&names, &["kind"]).unwrap_or("").to_string();
    let singular =
        str_field(&names, &["singular"]).map_or_else(|| kind.to_ascii_lowercase(), str::to_string);
    let list_kind =
        str_field(&names, &["listKind"]).map_or_else(|| format!("{kind}List"), str::to_string);
    let namespaced = str_field(crd, &["spec", "scope"]) != Some("Cluster");
    let versions = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let stored = versions
        .iter()
        .find(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .and_then(|v| v.get("name").and_then(Value::as_str))
        .unwrap_or("")
        .to_string();
    let storage = storage_key(&group, &plural);
    let counter_base = format!("{group}/{plural}");
    let mut out = Vec::new();
    for v in versions
        .iter()
        .filter(|v| v.get("served").and_then(Value::as_bool) == Some(true))
    {
        let vname = v
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let raw_schema = v.pointer("/schema/openAPIV3Schema").cloned();
        let schema = raw_schema
            .as_ref()
            .and_then(|s| Schema::compile(s, "schema").ok())
            .map(Arc::new);
        let mut columns = Vec::new();
        for c in v
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Ok(path) = JsonPath::parse(c.get("jsonPath").and_then(Value::as_str).unwrap_or(""))
            else {
                continue;
            };
            columns.push(Column {
                name: c
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                ty: c
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("string")
                    .to_string(),
                format: c
                    .get("format")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                description: c
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                source: CellSource::Path(path),
            });
        }
        if columns.is_empty() {
            columns.push(builtin::age_column());
        }
        let mut field_selectors = vec![
            ("metadata.name".to_string(), "metadata.name".to_string()),
            (
                "metadata.namespace".to_string(),
                "metadata.namespace".to_string(),
            ),
        ];
        for f in v
            .get("selectableFields")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(p) = f.get("jsonPath").and_then(Value::as_str) {
                let p = p.trim_start_matches('.').to_string();
                field_selectors.push((p.clone(), p));
            }
        }
        let conversion = if vname == stored {
            Conversion::None
        } else {
            Conversion::ApiVersion {
                stored: format!("{group}/{stored}"),
            }
        };
        let deprecation_warning = if v.get("deprecated").and_then(Value::as_bool) == Some(true) {
            Some(
                v.get("deprecationWarning")
                    .and_then(Value::as_str)
                    .map_or_else(
                        || format!("{group}/{vname} {kind} is deprecated"),
                        str::to_string,
                    ),
            )
        } else {
            None
        };
        out.push(ResourceDef {
            group: group.clone(),
            version: vname,
            plural: plural.clone(),
            singular: singular.clone(),
            kind: kind.clone(),
            list_kind: list_kind.clone(),
            namespaced,
            short_names: str_list(names.get("shortNames")),
            categories: str_list(names.get("categories")),
            storage: storage.clone(),
            conversion,
            builtin: None,
            status_subresource: v.pointer("/subresources/status").is_some(),
            scale: ScalePaths::from_crd_version(v),
            schema,
            raw_schema,
            columns,
            field_selectors,
            name_rule: NameRule::Dns1123Subdomain,
            has_generation: true,
            allow_unconditional_update: false,
            allow_create_on_update: false,
            counter_name: Arc::from(counter_base.clone()),
            counter_name_status: Arc::from(format!("{counter_base}/status")),
            deprecation_warning,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_ordering() {
        let mut v = vec!["v1alpha1", "v1", "v2beta1", "v1beta2", "foo"];
        v.sort_by_key(|x| std::cmp::Reverse(version_priority(x)));
        assert_eq!(v, vec!["v1", "v2beta1", "v1beta2", "v1alpha1", "foo"]);
    }
}
