//! Property: any valid spec sent through `create` comes back through `get` (and `list`) with the
//! fields flintlock echoes, transformed the way flintlock transforms them (A2.6).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use capmvm_flintlock::hollow::HollowConfig;
use capmvm_flintlock::{
    IfaceType, Initrd, Kernel, MicrovmSpec, MicrovmState, NetworkInterface, StaticAddress, Volume,
    VolumeSource,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use support::*;

fn image() -> impl Strategy<Value = String> {
    ("[a-z]{1,8}", "[a-z]{1,8}", "[0-9]{1,3}")
        .prop_map(|(org, repo, tag)| format!("ghcr.io/{org}/{repo}:{tag}"))
}

fn volume(id: String) -> impl Strategy<Value = Volume> {
    (
        image(),
        any::<bool>(),
        proptest::option::of("/[a-z]{1,8}"),
        proptest::option::of("[a-f0-9]{0,8}"),
        proptest::option::of(0..4096i32),
    )
        .prop_map(
            move |(image, is_read_only, mount_point, partition_id, size_in_mb)| Volume {
                id: id.clone(),
                is_read_only,
                mount_point,
                source: VolumeSource {
                    container_source: Some(image),
                    virtiofs_source: None,
                },
                partition_id,
                size_in_mb,
            },
        )
}

fn interface(index: usize) -> impl Strategy<Value = NetworkInterface> {
    let mac = proptest::option::of(proptest::array::uniform6(any::<u8>()).prop_map(|b| {
        format!(
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0] & 0xfe | 0x02,
            b[1],
            b[2],
            b[3],
            b[4],
            b[5]
        )
    }));
    let address = proptest::option::of(
        (
            1..250u8,
            8..=30u8,
            any::<bool>(),
            proptest::collection::vec(1..250u8, 0..3),
        )
            .prop_map(|(host, prefix, gateway, nameservers)| StaticAddress {
                address: format!("10.0.0.{host}/{prefix}"),
                gateway: gateway.then(|| format!("10.0.0.254/{prefix}")),
                nameservers: nameservers
                    .into_iter()
                    .map(|n| format!("192.168.0.{n}"))
                    .collect(),
            }),
    );
    (mac, address).prop_map(move |(guest_mac, address)| NetworkInterface {
        device_id: format!("eth{}", index + 1),
        iface_type: IfaceType::Tap,
        guest_mac,
        address,
    })
}

fn valid_specs() -> impl Strategy<Value = MicrovmSpec> {
    let kernel = (
        image(),
        "[a-z][a-z/]{0,11}",
        proptest::collection::btree_map("[a-z]{1,6}", "[a-z0-9=]{0,6}", 0..4),
        any::<bool>(),
    )
        .prop_map(|(image, filename, cmdline, add_network_config)| Kernel {
            image,
            filename: Some(filename),
            cmdline,
            add_network_config,
        });
    let initrd = proptest::option::of(
        (image(), proptest::option::of("[a-z]{1,8}"))
            .prop_map(|(image, filename)| Initrd { image, filename }),
    );
    let interfaces = (1..4usize).prop_flat_map(|n| (0..n).map(interface).collect::<Vec<_>>());
    let additional = (0..3usize).prop_flat_map(|n| {
        (0..n)
            .map(|i| volume(format!("data{i}")))
            .collect::<Vec<_>>()
    });
    let metadata = (
        proptest::option::of(proptest::collection::btree_map(
            "[a-z_]{1,10}",
            "[a-z0-9.]{1,12}",
            0..4,
        )),
        proptest::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(|(meta, user)| {
            let mut metadata = BTreeMap::new();
            if let Some(meta) = meta {
                let yaml: String = meta
                    .iter()
                    .filter(|(k, _)| *k != "instance_id")
                    .map(|(k, v)| format!("{k}: \"{v}\"\n"))
                    .collect();
                metadata.insert("meta-data".to_owned(), b64(&yaml));
            }
            metadata.insert(
                "user-data".to_owned(),
                base64::engine::general_purpose::STANDARD.encode(user),
            );
            metadata
        });
    (
        (
            "[a-z][a-z0-9-]{0,20}",
            prop_oneof![Just(String::new()), "[a-z]{1,10}"],
        ),
        (
            prop_oneof![Just(0), 1..=64i32],
            prop_oneof![Just(0), 1024..=32768i32],
        ),
        (kernel, initrd, any::<bool>()),
        (additional, interfaces, metadata),
        (
            proptest::collection::btree_map("[a-z]{1,5}", "[a-z]{0,5}", 0..3),
            prop_oneof![Just(None), Just(Some("firecracker".to_owned()))],
            any::<bool>(),
        ),
    )
        .prop_flat_map(|(names, sizes, boot, rest, extra)| {
            let needs_root = boot.1.is_none() || boot.2;
            let root = if needs_root {
                volume("root".to_owned()).prop_map(Some).boxed()
            } else {
                Just(None).boxed()
            };
            (Just((names, sizes, boot, rest, extra)), root)
        })
        .prop_map(
            |(
                (
                    (id, namespace),
                    (vcpu, memory_mb),
                    (kernel, initrd, _),
                    (additional_volumes, interfaces, metadata),
                    (labels, provider, allow_guest_agent),
                ),
                root_volume,
            )| {
                MicrovmSpec {
                    id,
                    namespace,
                    labels,
                    vcpu,
                    memory_mb,
                    kernel,
                    initrd,
                    root_volume,
                    additional_volumes,
                    interfaces,
                    metadata,
                    uid: None,
                    provider,
                    allow_guest_agent,
                }
            },
        )
}

/// What flintlock stores and returns for `sent`, independent of the host's implementation.
fn echoed(sent: &MicrovmSpec, uid: &str, metadata: BTreeMap<String, String>) -> MicrovmSpec {
    let echo_volume = |volume: &Volume| Volume {
        mount_point: None,
        partition_id: Some(volume.partition_id.clone().unwrap_or_default()),
        size_in_mb: Some(volume.size_in_mb.unwrap_or_default()),
        ..volume.clone()
    };
    let mut interfaces = vec![NetworkInterface {
        device_id: "eth0".to_owned(),
        iface_type: IfaceType::Tap,
        guest_mac: Some("AA:FF:00:00:00:01".to_owned()),
        address: Some(StaticAddress {
            address: "169.254.0.1/16".to_owned(),
            gateway: None,
            nameservers: vec![],
        }),
    }];
    interfaces.extend(sent.interfaces.iter().map(|iface| NetworkInterface {
        guest_mac: Some(iface.guest_mac.clone().unwrap_or_default()),
        ..iface.clone()
    }));
    MicrovmSpec {
        id: sent.id.clone(),
        namespace: if sent.namespace.is_empty() {
            "default".to_owned()
        } else {
            sent.namespace.clone()
        },
        labels: BTreeMap::new(),
        vcpu: if sent.vcpu == 0 { 2 } else { sent.vcpu },
        memory_mb: if sent.memory_mb == 0 {
            1024
        } else {
            sent.memory_mb
        },
        kernel: sent.kernel.clone(),
        initrd: sent.initrd.as_ref().map(|initrd| Initrd {
            filename: Some(initrd.filename.clone().unwrap_or_default()),
            ..initrd.clone()
        }),
        root_volume: sent.root_volume.as_ref().map(echo_volume),
        additional_volumes: sent.additional_volumes.iter().map(echo_volume).collect(),
        interfaces,
        metadata,
        uid: Some(uid.to_owned()),
        provider: None,
        allow_guest_agent: sent.allow_guest_agent,
    }
}

fn decode_meta(metadata: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let yaml = base64::engine::general_purpose::STANDARD
        .decode(&metadata["meta-data"])
        .unwrap();
    serde_saphyr::from_str(std::str::from_utf8(&yaml).unwrap()).unwrap()
}

#[test]
fn any_valid_spec_comes_back_through_get_as_flintlock_echoes_it() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // The test reads every microVM as PENDING right after its create, so none may provision while
    // it runs, however slow the machine: a provisioning time of a day.
    let config = HollowConfig {
        provision_time: Duration::from_secs(24 * 3600),
        ..fast_config()
    };
    let (host, pool) = runtime.block_on(async { (start(config).await, pool()) });
    let client = runtime.block_on(async { client(&pool, &host.endpoint()) });
    let mut runner = TestRunner::new(Config {
        cases: 96,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&valid_specs(), |sent| {
            let (created, got, listed) = runtime.block_on(async {
                let created = client.create(sent.clone()).await.unwrap();
                let got = client.get(created.uid()).await.unwrap();
                let listed = client
                    .list(&got.spec.namespace, Some(&sent.id))
                    .await
                    .unwrap();
                (created, got, listed)
            });
            let uid = created.uid().to_owned();
            prop_assert!(capmvm_flintlock::hollow::is_ulid(&uid));
            prop_assert_eq!(got.status.state, MicrovmState::Pending);

            // meta-data: what was sent plus instance_id; every other metadata value verbatim.
            let mut expected_meta = sent
                .metadata
                .get("meta-data")
                .map(|_| decode_meta(&sent.metadata))
                .unwrap_or_default();
            expected_meta.insert("instance_id".to_owned(), uid.clone());
            prop_assert_eq!(decode_meta(&got.spec.metadata), expected_meta);
            let mut metadata = sent.metadata.clone();
            metadata.insert(
                "meta-data".to_owned(),
                got.spec.metadata["meta-data"].clone(),
            );

            prop_assert_eq!(&got.spec, &echoed(&sent, &uid, metadata));
            prop_assert_eq!(&got.spec, &created.spec);
            prop_assert!(listed.iter().any(|vm| vm.spec == got.spec));
            Ok(())
        })
        .unwrap();
}
