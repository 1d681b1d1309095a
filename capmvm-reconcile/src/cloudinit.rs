//! The cloud-init documents a microVM boots with, as the Go provider sends them (A4), plus the marker
//! that makes creation exactly-once.
//!
//! - `user-data`: the bootstrap Secret's `value`, verbatim.
//! - `vendor-data`: `#cloud-config` with hostname, users and their keys, final_message and bootcmd.
//! - `meta-data`: `local_hostname`, `platform: liquid_metal`, `vm_host`, and `capmvm_machine_uid` and
//!   `capmvm_cluster_name` (ours); flintlock adds `instance_id` itself.
//!
//! Every value is standard base64 with padding. Documents are rendered from structs and sorted maps,
//! so the same inputs give byte-identical output.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use capmvm_api::SshPublicKey;
use capmvm_api::keys::metadata as keys;
use serde::{Deserialize, Serialize};

/// The final message the Go provider sets.
pub const FINAL_MESSAGE: &str =
    "The Liquid Metal booted system is good to go after $UPTIME seconds";
/// The boot command the Go provider sets (systemd-resolved stub as resolv.conf).
pub const BOOT_COMMAND: &str = "ln -sf /run/systemd/resolve/stub-resolv.conf /etc/resolv.conf";

/// Inputs of the cloud-init documents.
pub struct CloudInit<'a> {
    /// The machine's name (hostname and `local_hostname`).
    pub hostname: &'a str,
    /// The MicrovmMachine uid, carried in meta-data to recognise the microVM later.
    pub machine_uid: &'a str,
    /// The CAPI Cluster's name, carried in meta-data to tell which cluster made a microVM.
    pub cluster_name: &'a str,
    /// The host endpoint (`vm_host`, templated into kubelet's `--provider-id`).
    pub vm_host: &'a str,
    /// SSH users: the machine's when it has any, else the cluster's.
    pub ssh_public_keys: &'a [SshPublicKey],
    /// The bootstrap data (the Secret's `value`).
    pub user_data: &'a [u8],
}

#[derive(Serialize)]
struct VendorData<'a> {
    hostname: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    users: Vec<User<'a>>,
    final_message: &'static str,
    bootcmd: [&'static str; 1],
}

#[derive(Serialize)]
struct User<'a> {
    name: &'a str,
    ssh_authorized_keys: &'a [String],
}

/// Renders the metadata map of a microVM: `meta-data`, `user-data`, `vendor-data`, each base64.
pub fn metadata(
    input: &CloudInit<'_>,
) -> Result<BTreeMap<String, String>, serde_saphyr::SerializeError> {
    let vendor = VendorData {
        hostname: input.hostname,
        users: input
            .ssh_public_keys
            .iter()
            .map(|k| User {
                name: &k.user,
                ssh_authorized_keys: &k.authorized_keys,
            })
            .collect(),
        final_message: FINAL_MESSAGE,
        bootcmd: [BOOT_COMMAND],
    };
    let vendor_data = format!("#cloud-config\n{}", serde_saphyr::to_string(&vendor)?);

    let meta: BTreeMap<&str, &str> = BTreeMap::from([
        (keys::LOCAL_HOSTNAME, input.hostname),
        (keys::PLATFORM, keys::PLATFORM_LIQUID_METAL),
        (keys::VM_HOST, input.vm_host),
        (keys::MACHINE_UID, input.machine_uid),
        (keys::CLUSTER_NAME, input.cluster_name),
    ]);
    let meta_data = serde_saphyr::to_string(&meta)?;

    Ok(BTreeMap::from([
        (keys::META_DATA.to_string(), STANDARD.encode(meta_data)),
        (
            keys::USER_DATA.to_string(),
            STANDARD.encode(input.user_data),
        ),
        (keys::VENDOR_DATA.to_string(), STANDARD.encode(vendor_data)),
    ]))
}

#[derive(Deserialize)]
struct MachineMarker {
    capmvm_machine_uid: Option<String>,
    capmvm_cluster_name: Option<String>,
}

/// What capmvm wrote into a microVM's meta-data to know it again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Marker {
    /// The uid of the MicrovmMachine that asked for it (see [`machine_uid_from_metadata`]).
    pub machine_uid: Option<String>,
    /// The name of its CAPI Cluster; microVMs created before it was written carry none.
    pub cluster: Option<String>,
}

/// The marker in a microVM's meta-data; empty for microVMs that are not ours.
pub fn marker_from_metadata(metadata: &BTreeMap<String, String>) -> Marker {
    let marker = || -> Option<MachineMarker> {
        let encoded = metadata.get(keys::META_DATA)?;
        let decoded = STANDARD.decode(encoded).ok()?;
        let text = String::from_utf8(decoded).ok()?;
        serde_saphyr::from_str(&text).ok()
    };
    marker()
        .map(|m| Marker {
            machine_uid: m.capmvm_machine_uid.filter(|u| !u.is_empty()),
            cluster: m.capmvm_cluster_name.filter(|c| !c.is_empty()),
        })
        .unwrap_or_default()
}

/// The MicrovmMachine uid in a microVM's meta-data, if it carries one (ours do; others' do not).
pub fn machine_uid_from_metadata(metadata: &BTreeMap<String, String>) -> Option<String> {
    marker_from_metadata(metadata).machine_uid
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(m: &BTreeMap<String, String>, key: &str) -> String {
        String::from_utf8(STANDARD.decode(&m[key]).unwrap()).unwrap()
    }

    fn keys() -> Vec<SshPublicKey> {
        vec![SshPublicKey {
            user: "ubuntu".into(),
            authorized_keys: vec!["ssh-ed25519 AAAAC3Nza ops@example.com".into()],
        }]
    }

    #[test]
    fn documents_match_the_go_provider() {
        let keys = keys();
        let m = metadata(&CloudInit {
            hostname: "demo-md-0-abc",
            machine_uid: "6f1c2a9e-0000-4000-8000-000000000001",
            cluster_name: "demo",
            vm_host: "10.0.0.5:9090",
            ssh_public_keys: &keys,
            user_data: b"#cloud-config\nruncmd: [kubeadm join]\n",
        })
        .unwrap();
        assert_eq!(
            decode(&m, "vendor-data"),
            "#cloud-config\nhostname: demo-md-0-abc\nusers:\n- name: ubuntu\n  ssh_authorized_keys:\n  - ssh-ed25519 AAAAC3Nza ops@example.com\nfinal_message: The Liquid Metal booted system is good to go after $UPTIME seconds\nbootcmd:\n- ln -sf /run/systemd/resolve/stub-resolv.conf /etc/resolv.conf\n"
        );
        assert_eq!(
            decode(&m, "meta-data"),
            "capmvm_cluster_name: demo\ncapmvm_machine_uid: 6f1c2a9e-0000-4000-8000-000000000001\nlocal_hostname: demo-md-0-abc\nplatform: liquid_metal\nvm_host: 10.0.0.5:9090\n"
        );
        assert_eq!(
            decode(&m, "user-data"),
            "#cloud-config\nruncmd: [kubeadm join]\n"
        );
    }

    #[test]
    fn no_keys_means_no_users() {
        let m = metadata(&CloudInit {
            hostname: "h",
            machine_uid: "u",
            cluster_name: "demo",
            vm_host: "h:1",
            ssh_public_keys: &[],
            user_data: b"",
        })
        .unwrap();
        assert!(!decode(&m, "vendor-data").contains("users"));
    }

    #[test]
    fn the_machine_uid_survives_flintlock_rewriting_meta_data() {
        let m = metadata(&CloudInit {
            hostname: "h",
            machine_uid: "6f1c2a9e-0000-4000-8000-000000000001",
            cluster_name: "demo",
            vm_host: "[fd00::5]:9090",
            ssh_public_keys: &[],
            user_data: b"",
        })
        .unwrap();
        assert_eq!(
            marker_from_metadata(&m),
            Marker {
                machine_uid: Some("6f1c2a9e-0000-4000-8000-000000000001".into()),
                cluster: Some("demo".into()),
            }
        );
        // The IPv6 vm_host is quoted so it stays a string (a bare `[` starts a YAML sequence).
        let meta: BTreeMap<String, String> =
            serde_saphyr::from_str(&decode(&m, "meta-data")).unwrap();
        assert_eq!(meta["vm_host"], "[fd00::5]:9090");
        // Flintlock re-encodes meta-data with instance_id added and keys sorted.
        let rewritten = "capmvm_machine_uid: 6f1c2a9e-0000-4000-8000-000000000001\ninstance_id: 01KE75BHT9H6D7V5YG0KYGRXX2\nlocal_hostname: h\n";
        let m2 = BTreeMap::from([("meta-data".to_string(), STANDARD.encode(rewritten))]);
        assert!(machine_uid_from_metadata(&m2).is_some());
        // A microVM made before the cluster was written down: its uid, no cluster.
        assert_eq!(marker_from_metadata(&m2).cluster, None);
        // Someone else's VM, or garbage, carries no uid.
        let other =
            BTreeMap::from([("meta-data".to_string(), STANDARD.encode("instance_id: x\n"))]);
        assert_eq!(machine_uid_from_metadata(&other), None);
        let garbage = BTreeMap::from([("meta-data".to_string(), "!!!".to_string())]);
        assert_eq!(machine_uid_from_metadata(&garbage), None);
    }

    #[test]
    fn same_inputs_give_byte_identical_output() {
        let keys = keys();
        let input = CloudInit {
            hostname: "n",
            machine_uid: "u",
            cluster_name: "demo",
            vm_host: "h:1",
            ssh_public_keys: &keys,
            user_data: b"x",
        };
        assert_eq!(metadata(&input).unwrap(), metadata(&input).unwrap());
    }
}
