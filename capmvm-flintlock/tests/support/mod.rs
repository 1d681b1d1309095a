//! Shared helpers for the integration tests: fast hollow hosts, valid specs, polling.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use capmvm_flintlock::hollow::{HollowConfig, HollowHandle, HollowHost};
use capmvm_flintlock::{
    ClientPool, Error, ErrorKind, FlintlockClient, HostConfig, IfaceType, Kernel, Microvm,
    MicrovmSpec, MicrovmState, NetworkInterface, PoolOptions, Volume, VolumeSource,
};

/// A host whose clock runs 1000 times faster for flintlock's intervals (20 s backoff = 20 ms) and
/// that provisions in 50 ms.
pub fn fast_config() -> HollowConfig {
    HollowConfig {
        provision_time: Duration::from_millis(50),
        delete_time: Duration::from_secs(1),
        time_scale: 0.001,
        ..HollowConfig::default()
    }
}

pub async fn start(config: HollowConfig) -> HollowHandle {
    HollowHost::start(config).await.unwrap()
}

pub fn pool() -> ClientPool {
    ClientPool::new(PoolOptions {
        connect_timeout: Duration::from_secs(2),
        call_timeout: Duration::from_secs(5),
        ..PoolOptions::default()
    })
}

pub fn client(pool: &ClientPool, endpoint: &str) -> FlintlockClient {
    pool.client(&HostConfig::new(endpoint)).unwrap()
}

pub fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// A spec the default (Firecracker) provider accepts.
pub fn valid_spec(name: &str) -> MicrovmSpec {
    MicrovmSpec {
        id: name.to_owned(),
        namespace: "ns1".to_owned(),
        vcpu: 2,
        memory_mb: 2048,
        kernel: Kernel {
            image: "ghcr.io/liquidmetal-dev/flintlock-kernel:5.10.77".to_owned(),
            filename: Some("boot/vmlinux".to_owned()),
            cmdline: BTreeMap::new(),
            add_network_config: true,
        },
        root_volume: Some(Volume {
            id: "root".to_owned(),
            source: VolumeSource {
                container_source: Some("ghcr.io/liquidmetal-dev/ubuntu:22.04".to_owned()),
                virtiofs_source: None,
            },
            ..Volume::default()
        }),
        interfaces: vec![NetworkInterface {
            device_id: "eth1".to_owned(),
            iface_type: IfaceType::Tap,
            guest_mac: None,
            address: None,
        }],
        metadata: BTreeMap::from([
            (
                "meta-data".to_owned(),
                b64("local_hostname: m1\nplatform: liquid_metal\n"),
            ),
            (
                "user-data".to_owned(),
                b64("#cloud-config\nbootstrap: s3cret-join-token\n"),
            ),
        ]),
        ..MicrovmSpec::default()
    }
}

/// Polls `get` until the microVM reaches `state` (or the time is up).
pub async fn wait_for_state(
    client: &FlintlockClient,
    uid: &str,
    state: MicrovmState,
    within: Duration,
) -> Microvm {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let microvm = client.get(uid).await.unwrap();
        if microvm.status.state == state {
            return microvm;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{uid} still {:?} (retry {}) after {within:?}, wanted {state:?}",
            microvm.status.state,
            microvm.status.retry
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls `get` until it answers NotFound.
pub async fn wait_for_removal(client: &FlintlockClient, uid: &str, within: Duration) -> Error {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match client.get(uid).await {
            Err(err) if err.kind() == ErrorKind::NotFound => return err,
            // Real flintlockd can answer a Get with another error for a moment while it removes the
            // microVM's records (seen in CI: code Unknown); removal ends in NotFound.
            Err(err) if tokio::time::Instant::now() >= deadline => return err,
            Err(_) => {}
            Ok(microvm) => assert!(
                tokio::time::Instant::now() < deadline,
                "{uid} still there ({:?}) after {within:?}",
                microvm.status.state
            ),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
