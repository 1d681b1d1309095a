//! Nodes as the real registry keeps them: the served schema and the columns `kubectl get nodes`
//! prints, the quantities of `status.capacity` and `status.allocatable` in their canonical form (the
//! real server decodes them into `resource.Quantity`, which writes itself canonically: `2048Mi` is
//! stored as `2Gi`), and the create rule on the swap capacity.

use serde_json::{Value, json};

use super::builtin::{age_column, path_column, type_meta};
use super::error::{ApiError, FieldError};
use super::registry::{CellSource, Column};

/// A quantity (`"2"`, `"2048Mi"` or a number), as `resource.Quantity` publishes itself.
fn quantity_map() -> Value {
    json!({"type": "object", "additionalProperties": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]}})
}

pub(crate) fn node_schema() -> Value {
    let string = json!({"type": "string"});
    let time = json!({"type": "string", "format": "date-time"});
    type_meta(json!({
        "type": "object",
        "description": "Node is a worker node in Kubernetes. Each node will have a unique identifier in the cache (i.e. in etcd).",
        "properties": {
            "spec": {"type": "object", "description": "Spec defines the behavior of a node.", "properties": {
                "configSource": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "externalID": string,
                "podCIDR": {"type": "string", "description": "PodCIDR represents the pod IP range assigned to the node."},
                "podCIDRs": {"type": "array", "items": string, "x-kubernetes-list-type": "set"},
                "providerID": {"type": "string", "description": "ID of the node assigned by the cloud provider in the format: <ProviderName>://<ProviderSpecificNodeID>"},
                "taints": {"type": "array", "items": {"type": "object", "properties": {
                    "effect": string, "key": string, "timeAdded": time, "value": string
                }, "required": ["key", "effect"]}},
                "unschedulable": {"type": "boolean", "description": "Unschedulable controls node schedulability of new pods."}
            }},
            "status": {"type": "object", "description": "Most recently observed status of the node.", "properties": {
                "addresses": {"type": "array", "items": {"type": "object", "properties": {
                    "address": string, "type": string
                }, "required": ["type", "address"]}},
                "allocatable": quantity_map(),
                "capacity": quantity_map(),
                "conditions": {"type": "array", "items": {"type": "object", "properties": {
                    "lastHeartbeatTime": time, "lastTransitionTime": time, "message": string,
                    "reason": string, "status": string, "type": string
                }, "required": ["type", "status"]}},
                "config": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "daemonEndpoints": {"type": "object", "properties": {
                    "kubeletEndpoint": {"type": "object", "properties": {"Port": {"type": "integer", "format": "int32"}}}
                }},
                "features": {"type": "object", "properties": {"supplementalGroupsPolicy": {"type": "boolean"}}},
                "images": {"type": "array", "items": {"type": "object", "properties": {
                    "names": {"type": "array", "items": string},
                    "sizeBytes": {"type": "integer", "format": "int64"}
                }}},
                "nodeInfo": {"type": "object", "description": "Set of ids/uuids to uniquely identify the node.", "properties": {
                    "architecture": string, "bootID": string, "containerRuntimeVersion": string,
                    "kernelVersion": string, "kubeProxyVersion": string, "kubeletVersion": string,
                    "machineID": string, "operatingSystem": string, "osImage": string,
                    "swap": {"type": "object", "properties": {"capacity": {"type": "integer", "format": "int64"}}},
                    "systemUUID": string
                }, "required": ["machineID", "systemUUID", "bootID", "kernelVersion", "osImage", "containerRuntimeVersion", "kubeletVersion", "kubeProxyVersion", "operatingSystem", "architecture"]},
                "phase": string,
                "runtimeHandlers": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                "volumesAttached": {"type": "array", "items": {"type": "object", "properties": {"devicePath": string, "name": string}}},
                "volumesInUse": {"type": "array", "items": string}
            }}
        }
    }))
}

/// The columns `kubectl get nodes` prints (`-o wide` adds those of priority 1).
pub(crate) fn node_columns() -> Vec<Column> {
    let mut status = path_column(
        "Status",
        "string",
        ".status.conditions",
        "The status of the node",
        0,
    );
    status.source = CellSource::NodeStatus;
    let mut roles = path_column(
        "Roles",
        "string",
        ".metadata.labels",
        "The roles of the node",
        0,
    );
    roles.source = CellSource::NodeRoles;
    vec![
        status,
        roles,
        age_column(),
        path_column(
            "Version",
            "string",
            ".status.nodeInfo.kubeletVersion",
            "Kubelet Version reported by the node.",
            0,
        ),
        path_column(
            "Internal-IP",
            "string",
            r#".status.addresses[?(@.type=="InternalIP")].address"#,
            "List of internal IPs for the node.",
            1,
        ),
        path_column(
            "External-IP",
            "string",
            r#".status.addresses[?(@.type=="ExternalIP")].address"#,
            "List of external IPs for the node.",
            1,
        ),
        path_column(
            "OS-Image",
            "string",
            ".status.nodeInfo.osImage",
            "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).",
            1,
        ),
        path_column(
            "Kernel-Version",
            "string",
            ".status.nodeInfo.kernelVersion",
            "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).",
            1,
        ),
        path_column(
            "Container-Runtime",
            "string",
            ".status.nodeInfo.containerRuntimeVersion",
            "Container Runtime Version reported by the node through runtime remote API (e.g. containerd://1.4.2).",
            1,
        ),
    ]
}

/// What the real decoder does to a Node's quantities: each is parsed (a string or a number) and
/// written back canonically; one that is no quantity fails the decoding (400).
pub(crate) fn prepare(obj: &mut Value) -> Result<(), ApiError> {
    for field in ["capacity", "allocatable"] {
        let Some(Value::Object(map)) = obj.pointer_mut(&format!("/status/{field}")) else {
            continue;
        };
        for v in map.values_mut() {
            let text = match v {
                Value::String(s) => s.trim().to_string(),
                Value::Number(n) => n.to_string(),
                _ => continue,
            };
            match canonical_quantity(&text) {
                Ok(Some(canonical)) => *v = Value::String(canonical),
                // Beyond what 128 bits of nano-units hold: kept as written.
                Ok(None) => {}
                Err(()) => {
                    return Err(ApiError::bad_request(
                        "Node in version \"v1\" cannot be handled as a Node: quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Create rules of the Node strategy beyond its schema: a swap capacity, when reported, must be
/// positive. The real `ValidateNode` checks it on create only (its update validation does not),
/// under the path it has always used, `metadata.nodeSwapStatus.capacity`.
pub(crate) fn validate_create(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(capacity) = obj.pointer("/status/nodeInfo/swap/capacity")
        && capacity.as_i64().is_some_and(|c| c <= 0)
    {
        errs.push(FieldError::invalid(
            "metadata.nodeSwapStatus.capacity",
            capacity,
            "must be greater than zero",
        ));
    }
    errs
}

/// How a quantity writes its number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    DecimalSi,
    BinarySi,
    DecimalExponent,
}

const NANO: i128 = 1_000_000_000;

/// The canonical form of a quantity, as `resource.Quantity` writes itself after `ParseQuantity`
/// (rounded up to nano-units): `Err` when it is no quantity, `None` when it is too large to compute
/// here.
fn canonical_quantity(s: &str) -> Result<Option<String>, ()> {
    let (negative, rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let number_end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_end);
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if (int_part.is_empty() && frac_part.is_empty()) || frac_part.contains('.') {
        return Err(());
    }
    let (format, base, exponent): (Format, i128, u32) = match suffix {
        "" => (Format::DecimalSi, 10, 0),
        "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" => {
            let power = "KMGTPE".find(&suffix[..1]).unwrap_or(0) as u32 + 1;
            (Format::BinarySi, 1024, power)
        }
        "n" | "u" | "m" | "k" | "M" | "G" | "T" | "P" | "E" => (Format::DecimalSi, 10, 0),
        _ if suffix.starts_with(['e', 'E']) => (Format::DecimalExponent, 10, 0),
        _ => return Err(()),
    };
    // The value in nano-units: digits * 10^(9 - fraction digits) * multiplier.
    let digits: String = format!("{int_part}{frac_part}");
    let mut mantissa: i128 = 0;
    for d in digits.bytes() {
        mantissa = match mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(i128::from(d - b'0')))
        {
            Some(m) => m,
            None => return Ok(None),
        };
    }
    // The power of ten applied to the digits, in nano-units.
    let mut ten_power: i64 = 9 - frac_part.len() as i64;
    ten_power += match suffix {
        "n" => -9,
        "u" => -6,
        "m" => -3,
        "k" => 3,
        "M" => 6,
        "G" => 9,
        "T" => 12,
        "P" => 15,
        "E" => 18,
        _ if format == Format::DecimalExponent => match suffix[1..].parse::<i64>() {
            Ok(e) if e.abs() <= 40 => e,
            Ok(_) => return Ok(None),
            Err(_) => return Err(()),
        },
        _ => 0,
    };
    let mut nanos = mantissa;
    if ten_power >= 0 {
        for _ in 0..ten_power {
            nanos = match nanos.checked_mul(10) {
                Some(n) => n,
                None => return Ok(None),
            };
        }
    } else {
        // Below a nano-unit: rounded up, as the real parser rounds.
        let mut divisor: i128 = 1;
        for _ in 0..(-ten_power) {
            divisor = match divisor.checked_mul(10) {
                Some(d) => d,
                None => return Ok(Some("0".into())),
            };
        }
        nanos = nanos / divisor + i128::from(nanos % divisor != 0);
    }
    for _ in 0..exponent {
        nanos = match nanos.checked_mul(base) {
            Some(n) => n,
            None => return Ok(None),
        };
    }
    if nanos == 0 {
        return Ok(Some("0".into()));
    }
    let sign = if negative { "-" } else { "" };
    let mut format = format;
    if format == Format::BinarySi && (nanos < 1024 * NANO || nanos % NANO != 0) {
        // Small or fractional binary quantities are written in decimal, without rounding.
        format = Format::DecimalSi;
    }
    if format == Format::BinarySi {
        let mut value = nanos / NANO;
        let mut power = 0;
        while value % 1024 == 0 && power < 6 {
            value /= 1024;
            power += 1;
        }
        let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][power];
        return Ok(Some(format!("{sign}{value}{suffix}")));
    }
    let mut value = nanos;
    let mut exp: i32 = -9;
    while value % 1000 == 0 {
        value /= 1000;
        exp += 3;
    }
    let suffix = match (format, exp) {
        (Format::DecimalExponent, 0) => String::new(),
        (Format::DecimalExponent, e) => format!("e{e}"),
        (_, -9) => "n".into(),
        (_, -6) => "u".into(),
        (_, -3) => "m".into(),
        (_, 0) => String::new(),
        (_, 3) => "k".into(),
        (_, 6) => "M".into(),
        (_, 9) => "G".into(),
        (_, 12) => "T".into(),
        (_, 15) => "P".into(),
        (_, 18) => "E".into(),
        (_, e) => format!("e{e}"),
    };
    Ok(Some(format!("{sign}{value}{suffix}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_are_written_as_resource_quantity_writes_them() {
        for (given, canonical) in [
            ("2048Mi", "2Gi"),
            ("2Gi", "2Gi"),
            ("1.5Gi", "1536Mi"),
            ("512Ki", "512Ki"),
            ("1000Ki", "1000Ki"),
            ("0.5Ki", "512"),
            ("100", "100"),
            ("1000", "1k"),
            ("1500", "1500"),
            ("0.5", "500m"),
            ("1000m", "1"),
            ("100m", "100m"),
            ("1e3", "1e3"),
            ("1.5e3", "1500"),
            ("0", "0"),
            ("0Gi", "0"),
            ("-2048Mi", "-2Gi"),
            ("+3", "3"),
            ("0.0000000001", "1n"),
            ("20G", "20G"),
        ] {
            assert_eq!(
                canonical_quantity(given),
                Ok(Some(canonical.to_string())),
                "{given}"
            );
        }
        for bad in ["", "abc", "1.2.3", "5Zi", "1e", "."] {
            assert_eq!(canonical_quantity(bad), Err(()), "{bad}");
        }
    }
}
