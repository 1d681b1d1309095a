//! The flintlock requests the Go provider builds: its client options (CPKG `client/client.go`) and
//! its CreateMicroVM spec (CPKG `services/microvm/convert.go` and `service.go`).

use std::collections::BTreeMap;
use std::hash::{BuildHasher as _, Hasher as _};

use anyhow::Context as _;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use capmvm_api::v1alpha1;
use capmvm_flintlock::{
    FlintlockClient, HostConfig, IfaceType, Initrd, Kernel, MicrovmSpec, NetworkInterface,
    SecretBytes, SecretString, StaticAddress, TlsMaterial, Volume, VolumeSource,
};
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, ResourceExt as _};
use serde_json::{Value, json};

use super::Ctx;

impl Ctx {
    /// A flintlock client for `endpoint` with the MicrovmCluster's credentials: the basic-auth token
    /// under the host without its port, the TLS Secret's three keys.
    pub(super) async fn flintlock(
        &self,
        mc: &v1alpha1::MicrovmCluster,
        endpoint: &str,
    ) -> anyhow::Result<FlintlockClient> {
        let ns = mc.namespace().unwrap_or_default();
        let secrets = Api::<Secret>::namespaced(self.client.clone(), &ns);
        let mut host = HostConfig::new(endpoint);
        if let Some(pool) = &mc.spec.placement.static_pool
            && !pool.basic_auth_secret.is_empty()
        {
            let secret = secrets.get(&pool.basic_auth_secret).await?;
            let key = endpoint.split(':').next().unwrap_or_default();
            let token = secret
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|t| String::from_utf8_lossy(&t.0).to_string())
                .unwrap_or_default();
            host.basic_auth_token = (!token.is_empty()).then(|| SecretString::new(token));
        }
        if !mc.spec.tls_secret_ref.is_empty() {
            let secret = secrets.get(&mc.spec.tls_secret_ref).await?;
            let data = secret.data.unwrap_or_default();
            let key = |k: &str| {
                data.get(k)
                    .map(|v| v.0.clone())
                    .with_context(|| format!("required key missing from TLS config data: {k}"))
            };
            host.tls = Some(TlsMaterial {
                ca_pem: Some(key("ca.crt")?),
                client_cert_pem: Some(key("tls.crt")?),
                client_key_pem: Some(SecretBytes::new(key("tls.key")?)),
            });
        }
        if let Some(proxy) = &mc.spec.microvm_proxy {
            host.proxy = Some(proxy.endpoint.clone());
        }
        Ok(self.hosts.client(&host)?)
    }

    /// The CreateMicroVM request its convert.go and service.go build.
    pub(super) fn microvm_spec(
        &self,
        mvm: &v1alpha1::MicrovmMachine,
        mc: &v1alpha1::MicrovmCluster,
        cluster_name: &str,
        vm_host: &str,
        bootstrap: &[u8],
    ) -> anyhow::Result<MicrovmSpec> {
        let spec = &mvm.spec;
        let name = mvm.name_any();
        let mut labels = spec.labels.clone();
        labels.insert("cluster-name".into(), cluster_name.to_string());
        let keys = if spec.ssh_public_keys.is_empty() {
            &mc.spec.ssh_public_keys
        } else {
            &spec.ssh_public_keys
        };
        let users: Vec<Value> = keys
            .iter()
            .map(|k| json!({"name": k.user, "ssh_authorized_keys": k.authorized_keys}))
            .collect();
        let mut vendor = serde_json::Map::new();
        vendor.insert("hostname".into(), json!(name));
        if !users.is_empty() {
            vendor.insert("users".into(), json!(users));
        }
        vendor.insert(
            "final_message".into(),
            json!("The Liquid Metal booted system is good to go after $UPTIME seconds"),
        );
        vendor.insert(
            "bootcmd".into(),
            json!(["ln -sf /run/systemd/resolve/stub-resolv.conf /etc/resolv.conf"]),
        );
        let vendor_data = format!(
            "#cloud-config\n{}",
            serde_saphyr::to_string(&Value::Object(vendor))?
        );
        let meta_data = serde_saphyr::to_string(&BTreeMap::from([
            ("local_hostname", name.as_str()),
            ("platform", "liquid_metal"),
            ("vm_host", vm_host),
        ]))?;
        let metadata = BTreeMap::from([
            // Its GetRawBootstrapData base64-encodes the Secret's value.
            ("user-data".to_string(), STANDARD.encode(bootstrap)),
            ("vendor-data".to_string(), STANDARD.encode(vendor_data)),
            ("meta-data".to_string(), STANDARD.encode(meta_data)),
        ]);
        let volume = |v: &v1alpha1::Volume| Volume {
            id: v.id.clone(),
            is_read_only: v.read_only,
            mount_point: (!v.mount_point.is_empty()).then(|| v.mount_point.clone()),
            source: VolumeSource {
                container_source: Some(v.image.clone()),
                virtiofs_source: (!v.virtiofs_path.is_empty()).then(|| v.virtiofs_path.clone()),
            },
            ..Volume::default()
        };
        Ok(MicrovmSpec {
            id: name.clone(),
            namespace: mvm.namespace().unwrap_or_default(),
            labels,
            vcpu: i32::try_from(spec.vcpu).unwrap_or(i32::MAX),
            memory_mb: i32::try_from(spec.memory_mb).unwrap_or(i32::MAX),
            kernel: Kernel {
                image: spec.kernel.image.clone(),
                filename: Some(spec.kernel.filename.clone()),
                cmdline: spec.kernel_cmdline.clone(),
                add_network_config: true,
            },
            initrd: spec.initrd.as_ref().map(|i| Initrd {
                image: i.image.clone(),
                filename: Some(i.filename.clone()),
            }),
            root_volume: Some(Volume {
                mount_point: None,
                ..volume(&spec.root_volume)
            }),
            additional_volumes: spec.volumes.iter().map(volume).collect(),
            interfaces: spec
                .network_interfaces
                .iter()
                .map(|n| NetworkInterface {
                    device_id: n.guest_device_name.clone(),
                    iface_type: match n.iface_type {
                        v1alpha1::IfaceType::Macvtap => IfaceType::Macvtap,
                        v1alpha1::IfaceType::Tap => IfaceType::Tap,
                    },
                    guest_mac: Some(if n.guest_mac.is_empty() {
                        random_mac()
                    } else {
                        n.guest_mac.clone()
                    }),
                    address: (!n.address.is_empty()).then(|| StaticAddress {
                        address: n.address.clone(),
                        gateway: None,
                        nameservers: Vec::new(),
                    }),
                })
                .collect(),
            metadata,
            uid: None,
            provider: (!spec.provider.is_empty()).then(|| spec.provider.clone()),
            allow_guest_agent: false,
        })
    }
}

/// A fresh random locally administered unicast MAC, as its `macpot` makes one per create.
fn random_mac() -> String {
    let mut bytes = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
        .to_be_bytes();
    bytes[0] = (bytes[0] | 0x02) & 0xfe;
    bytes[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_are_local_unicast() {
        for _ in 0..50 {
            let mac = random_mac();
            let first = u8::from_str_radix(&mac[..2], 16).unwrap_or(1);
            assert_eq!(first & 0x03, 0x02, "{mac}");
            assert_eq!(mac.len(), 17);
        }
    }
}
