//! What cloud-init does with a microVM's documents before the kubelet starts: reads the instance
//! meta-data, renders the user-data as a jinja template when its first line asks for it
//! (`## template: jinja`), and runs kubeadm with the config file the cloud-config writes. From that
//! we learn what the kubelet registers: the Node's name, its `--provider-id` (kubeadm's
//! `nodeRegistration.kubeletExtraArgs`, a list of `{name, value}` in kubeadm v1beta4 or a map in
//! v1beta3) and whether it is a control-plane node.
//!
//! The jinja subset is what cluster templates use: `{{ v1.KEY }}` and `{{ ds.meta_data.KEY }}`
//! (dotted or `['KEY']`), whitespace inside braces, `{{-`/`-}}`, `{# comments #}`. As cloud-init
//! renders it, an unknown key of a known map renders as `CI_MISSING_JINJA_VAR/<key>`; an attribute of
//! something undefined is an error, and cloud-init then ignores the whole user-data (so kubeadm
//! never runs). Anything beyond that subset (filters, statements) is treated the same way here.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value};

/// Rendered by cloud-init in place of an undefined variable.
pub const MISSING_JINJA_PREFIX: &str = "CI_MISSING_JINJA_VAR/";

/// Why a microVM's documents could not be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BootError {
    /// `meta-data` is missing, not base64 or not a YAML map.
    #[error("meta-data: {0}")]
    MetaData(String),
    /// The user-data is a jinja template cloud-init cannot render.
    #[error("user-data jinja template: {0}")]
    Template(String),
}

/// The instance meta-data (`ds.meta_data`), as cloud-init reads it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetaData(pub Map<String, Value>);

impl MetaData {
    /// A string value.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(Value::as_str)
    }
}

/// Decodes `metadata["meta-data"]` (base64 of a YAML map).
pub fn meta_data(metadata: &BTreeMap<String, String>) -> Result<MetaData, BootError> {
    let encoded = metadata
        .get("meta-data")
        .ok_or_else(|| BootError::MetaData("the microVM has no meta-data".into()))?;
    let bytes = STANDARD
        .decode(encoded)
        .map_err(|e| BootError::MetaData(format!("not base64: {e}")))?;
    let text = String::from_utf8(bytes).map_err(|_| BootError::MetaData("not UTF-8".into()))?;
    match serde_saphyr::from_str::<Value>(&text) {
        Ok(Value::Object(map)) => Ok(MetaData(map)),
        Ok(_) => Err(BootError::MetaData("not a YAML map".into())),
        Err(e) => Err(BootError::MetaData(format!("not YAML: {e}"))),
    }
}

/// Decodes `metadata["user-data"]` (base64); `None` when absent or unreadable.
pub fn user_data(metadata: &BTreeMap<String, String>) -> Option<String> {
    let bytes = STANDARD.decode(metadata.get("user-data")?).ok()?;
    String::from_utf8(bytes).ok()
}

/// What the kubelet of a booted microVM registers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeletBoot {
    /// The Node's name: kubeadm's `nodeRegistration.name`, else the hostname.
    pub node_name: String,
    /// The kubelet's `--provider-id`, if given.
    pub provider_id: Option<String>,
    /// `kubeadm init`, or `kubeadm join` with `controlPlane`.
    pub control_plane: bool,
}

/// What booting a microVM leads to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Boot {
    /// kubeadm ran: a kubelet registers.
    Kubelet(KubeletBoot),
    /// No kubelet starts (the reason, for logs).
    NoKubelet(String),
}

/// Boots: renders `user_data` with `meta` as cloud-init would, and finds what the kubelet registers.
pub fn boot(user_data: &str, meta: &MetaData) -> Result<Boot, BootError> {
    let hostname = meta.get("local_hostname").unwrap_or_default().to_string();
    let rendered = match user_data.split_once('\n') {
        Some((first, rest)) if is_jinja_header(first) => render(rest, &context(meta))?,
        None if is_jinja_header(user_data) => String::new(),
        _ => user_data.to_string(),
    };
    let Some(body) = rendered.trim_start().strip_prefix("#cloud-config") else {
        return Ok(from_script(&rendered, hostname));
    };
    let config: Value = match serde_saphyr::from_str(body) {
        Ok(v) => v,
        Err(e) => {
            return Ok(Boot::NoKubelet(format!(
                "the cloud-config is not YAML: {e}"
            )));
        }
    };
    let Some(command) = kubeadm_command(&config) else {
        return Ok(Boot::NoKubelet(
            "the cloud-config runs no kubeadm init or join".into(),
        ));
    };
    let init = command.contains("kubeadm init");
    let config_path = flag_value(&command, "--config");
    let mut boot = KubeletBoot {
        node_name: hostname,
        provider_id: None,
        control_plane: init,
    };
    let wanted_kind = if init {
        "InitConfiguration"
    } else {
        "JoinConfiguration"
    };
    for (path, content) in written_files(&config) {
        if config_path.as_deref().is_some_and(|p| p != path) {
            continue;
        }
        let docs: Vec<Value> = serde_saphyr::from_multiple(&content).unwrap_or_default();
        for doc in docs
            .iter()
            .filter(|d| d.get("kind").and_then(Value::as_str) == Some(wanted_kind))
        {
            let registration = doc.get("nodeRegistration");
            if let Some(name) = registration
                .and_then(|r| r.get("name"))
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
            {
                boot.node_name = name.to_string();
            }
            if let Some(pid) = registration
                .and_then(|r| r.get("kubeletExtraArgs"))
                .and_then(|args| kubelet_arg(args, "provider-id"))
            {
                boot.provider_id = Some(pid);
            }
            if doc.get("controlPlane").is_some_and(|c| !c.is_null()) {
                boot.control_plane = true;
            }
        }
    }
    // A kubelet flag written elsewhere (KUBELET_EXTRA_ARGS in a file, a runcmd).
    if boot.provider_id.is_none() {
        boot.provider_id = flag_value(body, "--provider-id");
    }
    Ok(Boot::Kubelet(boot))
}

fn is_jinja_header(line: &str) -> bool {
    // cloud-init: `##\s*template:(.*)` on the first line, the type compared lower-cased.
    line.trim_end()
        .strip_prefix("##")
        .map(str::trim_start)
        .and_then(|l| {
            l.get(..9)
                .filter(|p| p.eq_ignore_ascii_case("template:"))
                .map(|_| &l[9..])
        })
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("jinja"))
}

/// A shell-script user-data: a kubelet starts if it runs kubeadm.
fn from_script(text: &str, hostname: String) -> Boot {
    let Some(line) = text
        .lines()
        .find(|l| l.contains("kubeadm init") || l.contains("kubeadm join"))
    else {
        return Boot::NoKubelet("the user-data runs no kubeadm init or join".into());
    };
    Boot::Kubelet(KubeletBoot {
        node_name: hostname,
        provider_id: flag_value(text, "--provider-id"),
        control_plane: line.contains("kubeadm init"),
    })
}

/// The first `runcmd` entry that runs `kubeadm init` or `kubeadm join` (a string or an argv list).
fn kubeadm_command(config: &Value) -> Option<String> {
    config
        .get("runcmd")?
        .as_array()?
        .iter()
        .map(|c| match c {
            Value::String(s) => s.clone(),
            Value::Array(argv) => argv
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(" "),
            _ => String::new(),
        })
        .find(|c| c.contains("kubeadm init") || c.contains("kubeadm join"))
}

/// `--flag=value` or `--flag value` in `text` (quotes around the value removed).
fn flag_value(text: &str, flag: &str) -> Option<String> {
    let start = text.find(flag)? + flag.len();
    let rest = text[start..]
        .strip_prefix('=')
        .or_else(|| text[start..].strip_prefix(' '))?;
    let value: String = rest
        .trim_start()
        .chars()
        .take_while(|c| !c.is_whitespace() && !matches!(c, '&' | ';'))
        .collect();
    let value = value.trim_matches(|c| c == '"' || c == '\'').to_string();
    (!value.is_empty()).then_some(value)
}

/// `write_files` entries as (path, text content); base64 contents decoded, gzip ones skipped.
fn written_files(config: &Value) -> Vec<(String, String)> {
    let Some(files) = config.get("write_files").and_then(Value::as_array) else {
        return Vec::new();
    };
    files
        .iter()
        .filter_map(|f| {
            let path = f.get("path")?.as_str()?.to_string();
            let content = f.get("content").and_then(Value::as_str).unwrap_or_default();
            let content = match f.get("encoding").and_then(Value::as_str).unwrap_or("text") {
                "b64" | "base64" => {
                    String::from_utf8(STANDARD.decode(content.trim()).ok()?).ok()?
                }
                "text/plain" | "text" => content.to_string(),
                _ => return None,
            };
            Some((path, content))
        })
        .collect()
}

/// A kubelet argument from `kubeletExtraArgs`: `[{name, value}]` (v1beta4) or `{name: value}` (v1beta3).
fn kubelet_arg(args: &Value, name: &str) -> Option<String> {
    let value = match args {
        Value::Array(list) => list
            .iter()
            .find(|a| a.get("name").and_then(Value::as_str) == Some(name))?
            .get("value")?,
        Value::Object(map) => map.get(name)?,
        _ => return None,
    };
    value.as_str().map(str::to_string).filter(|v| !v.is_empty())
}

/// The variables cloud-init offers a template: `ds.meta_data` and the standard `v1` keys, each
/// hyphenated key also reachable with underscores.
fn context(meta: &MetaData) -> Value {
    let mut meta_data = meta.0.clone();
    for (k, v) in &meta.0 {
        if k.contains('-') {
            meta_data
                .entry(k.replace('-', "_"))
                .or_insert_with(|| v.clone());
        }
    }
    let mut v1 = Map::new();
    for key in ["instance_id", "local_hostname", "platform"] {
        if let Some(v) = meta_data.get(key) {
            v1.insert(key.to_string(), v.clone());
            v1.insert(key.replace('_', "-"), v.clone());
        }
    }
    let mut ds = Map::new();
    ds.insert("meta_data".into(), Value::Object(meta_data));
    let mut root = Map::new();
    root.insert("v1".into(), Value::Object(v1));
    root.insert("ds".into(), Value::Object(ds));
    Value::Object(root)
}

/// Renders the jinja subset described in the module documentation.
fn render(template: &str, ctx: &Value) -> Result<String, BootError> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let close = match after.chars().next() {
            Some('{') => "}}",
            Some('#') => "#}",
            Some('%') => {
                return Err(BootError::Template(
                    "statements ({% ... %}) are not supported by the hollow kubelet".into(),
                ));
            }
            _ => {
                out.push_str(&rest[..=open]);
                rest = after;
                continue;
            }
        };
        let mut inner_start = 1;
        let mut literal = &rest[..open];
        if after[1..].starts_with('-') {
            literal = literal.trim_end();
            inner_start = 2;
        }
        out.push_str(literal);
        let body = &after[inner_start..];
        let end = body
            .find(close)
            .ok_or_else(|| BootError::Template(format!("unclosed {{{}", &after[..1])))?;
        let mut inner = &body[..end];
        let mut trim_after = false;
        if let Some(stripped) = inner.strip_suffix('-') {
            inner = stripped;
            trim_after = true;
        }
        if close == "}}" {
            out.push_str(&evaluate(inner.trim(), ctx)?);
        }
        rest = &body[end + 2..];
        if trim_after {
            rest = rest.trim_start();
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// Evaluates `a.b['c']`: a defined value prints as Python prints it; an undefined last step prints
/// as cloud-init's `CI_MISSING_JINJA_VAR/<name>`; a step after an undefined one is an error.
fn evaluate(expr: &str, ctx: &Value) -> Result<String, BootError> {
    let steps = parse_path(expr)
        .ok_or_else(|| BootError::Template(format!("unsupported expression {{{{ {expr} }}}}")))?;
    let mut current = Some(ctx);
    let mut undefined = "";
    for step in &steps {
        let Some(value) = current else {
            return Err(BootError::Template(format!(
                "'{undefined}' is undefined (in {{{{ {expr} }}}})"
            )));
        };
        current = value.get(step.as_str());
        undefined = step;
    }
    Ok(match current {
        None => format!("{MISSING_JINJA_PREFIX}{undefined}"),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(true)) => "True".into(),
        Some(Value::Bool(false)) => "False".into(),
        Some(Value::Null) => "None".into(),
        Some(other) => other.to_string(),
    })
}

/// `ident(.ident | ['key'] | ["key"])*`, or `None` for anything else.
fn parse_path(expr: &str) -> Option<Vec<String>> {
    let ident = |s: &str| -> usize {
        s.char_indices()
            .find(|(_, c)| !(c.is_ascii_alphanumeric() || *c == '_'))
            .map_or(s.len(), |(i, _)| i)
    };
    let mut steps = Vec::new();
    let n = ident(expr);
    if n == 0 || expr.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    steps.push(expr[..n].to_string());
    let mut rest = expr[n..].trim_start();
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let r = r.trim_start();
            let n = ident(r);
            if n == 0 {
                return None;
            }
            steps.push(r[..n].to_string());
            rest = r[n..].trim_start();
        } else if let Some(r) = rest.strip_prefix('[') {
            let r = r.trim_start();
            let quote = r.chars().next().filter(|c| *c == '\'' || *c == '"')?;
            let end = r[1..].find(quote)?;
            steps.push(r[1..=end].to_string());
            rest = r[end + 2..].trim_start().strip_prefix(']')?.trim_start();
        } else {
            return None;
        }
    }
    Some(steps)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn meta() -> MetaData {
        MetaData(
            serde_json::json!({
                "instance_id": "01KE75BHT9H6D7V5YG0KYGRXX2",
                "local_hostname": "demo-md-0-abc",
                "vm_host": "127.0.0.1:9090",
                "platform": "liquid_metal",
            })
            .as_object()
            .unwrap()
            .clone(),
        )
    }

    const PID: &str = "microvm://127.0.0.1:9090/01KE75BHT9H6D7V5YG0KYGRXX2";

    fn cabpk(extra_args: &str) -> String {
        format!(
            "## template: jinja\n#cloud-config\nwrite_files:\n- path: /run/kubeadm/kubeadm-join-config.yaml\n  owner: root:root\n  permissions: '0640'\n  content: |\n    ---\n    apiVersion: kubeadm.k8s.io/v1beta4\n    kind: JoinConfiguration\n    nodeRegistration:\n      kubeletExtraArgs:\n{extra_args}\nruncmd:\n  - 'kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml && echo success > /run/cluster-api/bootstrap-success.complete'\n"
        )
    }

    fn kubelet(user_data: &str) -> KubeletBoot {
        match boot(user_data, &meta()).unwrap() {
            Boot::Kubelet(k) => k,
            other => panic!("no kubelet: {other:?}"),
        }
    }

    #[test]
    fn cabpk_v1beta4_list_of_name_value_renders_the_provider_id() {
        let k = kubelet(&cabpk(
            "      - name: provider-id\n        value: \"microvm://{{ ds.meta_data.vm_host }}/{{ ds.meta_data.instance_id }}\"",
        ));
        assert_eq!(k.provider_id.as_deref(), Some(PID));
        assert_eq!(k.node_name, "demo-md-0-abc");
        assert!(!k.control_plane);
    }

    #[test]
    fn v1beta3_map_v1_keys_and_whitespace_inside_braces() {
        let k = kubelet(&cabpk(
            "        provider-id: 'microvm://{{ds.meta_data[\"vm_host\"]}}/{{   v1.instance_id   }}'",
        ));
        assert_eq!(k.provider_id.as_deref(), Some(PID));
    }

    #[test]
    fn an_unknown_key_renders_as_cloud_init_renders_it() {
        let k = kubelet(&cabpk(
            "      - name: provider-id\n        value: microvm://{{ ds.meta_data.vm_hostname }}/{{ v1.instance_id }}",
        ));
        assert_eq!(
            k.provider_id.as_deref(),
            Some("microvm://CI_MISSING_JINJA_VAR/vm_hostname/01KE75BHT9H6D7V5YG0KYGRXX2")
        );
    }

    #[test]
    fn without_the_jinja_header_nothing_is_rendered() {
        let data = cabpk("        provider-id: microvm://{{ ds.meta_data.vm_host }}/x").replacen(
            "## template: jinja\n",
            "",
            1,
        );
        assert_eq!(
            kubelet(&data).provider_id.as_deref(),
            Some("microvm://{{ ds.meta_data.vm_host }}/x")
        );
    }

    #[test]
    fn an_attribute_of_an_undefined_variable_is_an_error_and_no_kubelet_starts() {
        let err = boot(
            &cabpk("        provider-id: microvm://{{ nope.vm_host }}"),
            &meta(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("'nope' is undefined"), "{err}");
        let err = boot(
            &cabpk("        provider-id: {{ v1.instance_id | upper }}"),
            &meta(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("unsupported expression"), "{err}");
    }

    #[test]
    fn the_stand_ins_plain_user_data_registers_without_a_provider_id() {
        let k = kubelet(
            "#cloud-config\nruncmd:\n  - kubeadm init --config /run/kubeadm/kubeadm.yaml  # simulated for cp-0\n",
        );
        assert_eq!(k.provider_id, None);
        assert!(k.control_plane);
        assert_eq!(
            boot("#cloud-config\nruncmd: [echo hi]\n", &meta()).unwrap(),
            Boot::NoKubelet("the cloud-config runs no kubeadm init or join".into())
        );
    }

    #[test]
    fn init_configuration_node_name_control_plane_join_and_base64_files() {
        let config = "apiVersion: kubeadm.k8s.io/v1beta4\nkind: JoinConfiguration\ncontrolPlane:\n  localAPIEndpoint: {}\nnodeRegistration:\n  name: '{{ v1.local_hostname }}-x'\n  kubeletExtraArgs:\n  - name: provider-id\n    value: p1\n";
        let data = format!(
            "## template: jinja\n#cloud-config\nwrite_files:\n- path: /run/kubeadm/kubeadm-join-config.yaml\n  encoding: base64\n  content: {}\nruncmd:\n- [kubeadm, join, --config, /run/kubeadm/kubeadm-join-config.yaml]\n",
            STANDARD.encode(config)
        );
        // Base64 content is not rendered by cloud-init (the template is the user-data text).
        let k = kubelet(&data);
        assert_eq!(k.node_name, "{{ v1.local_hostname }}-x");
        assert_eq!(k.provider_id.as_deref(), Some("p1"));
        assert!(k.control_plane);
    }

    #[test]
    fn meta_data_errors_name_what_is_wrong() {
        let bad = BTreeMap::from([("meta-data".to_string(), "%%%".to_string())]);
        assert!(
            meta_data(&bad)
                .unwrap_err()
                .to_string()
                .contains("not base64")
        );
        assert!(
            meta_data(&BTreeMap::new())
                .unwrap_err()
                .to_string()
                .contains("no meta-data")
        );
    }
}
