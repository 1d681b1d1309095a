//! Calls per second of `get` and `list` against one hollow host, over one shared channel.
//!
//! `cargo bench -p capmvm-flintlock --bench client` (seconds per measurement:
//! `CAPMVM_BENCH_SECS`, default 2). For each host size (1, 100, 1000 microVMs) and each concurrency
//! (1, 16, 64 callers sharing one `FlintlockClient`), it runs `get` (uids round-robin) and
//! `list` (the whole namespace) for the set time and prints calls/s with p50/p99 latency.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use capmvm_flintlock::hollow::{HollowConfig, HollowHost};
use capmvm_flintlock::{
    ClientPool, FlintlockClient, HostConfig, IfaceType, Kernel, MicrovmSpec, NetworkInterface,
    PoolOptions, Volume, VolumeSource,
};

const SIZES: [usize; 3] = [1, 100, 1000];
const CONCURRENCY: [usize; 3] = [1, 16, 64];

fn spec(i: usize) -> MicrovmSpec {
    MicrovmSpec {
        id: format!("vm-{i}"),
        namespace: "bench".to_owned(),
        vcpu: 2,
        memory_mb: 2048,
        kernel: Kernel {
            image: "ghcr.io/liquidmetal-dev/flintlock-kernel:5.10.77".to_owned(),
            filename: Some("boot/vmlinux".to_owned()),
            add_network_config: true,
            ..Kernel::default()
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
            ..Default::default()
        }],
        // About the size of CAPMVM's cloud-init payload (user-data dominates).
        metadata: [
            ("user-data".to_owned(), "A".repeat(4096)),
            ("vendor-data".to_owned(), "B".repeat(512)),
        ]
        .into(),
        ..MicrovmSpec::default()
    }
}

#[derive(Clone, Copy)]
enum Call {
    Get,
    List,
}

struct Measurement {
    calls: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

async fn measure(
    client: &FlintlockClient,
    call: Call,
    uids: Arc<Vec<String>>,
    concurrency: usize,
    run_for: Duration,
) -> Measurement {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let stop_at = started + run_for;
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let client = client.clone();
            let uids = uids.clone();
            let next = next.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < stop_at {
                    let began = Instant::now();
                    match call {
                        Call::Get => {
                            let uid = &uids[next.fetch_add(1, Ordering::Relaxed) % uids.len()];
                            client.get(uid).await.unwrap();
                        }
                        Call::List => {
                            let vms = client.list("bench", None).await.unwrap();
                            assert_eq!(vms.len(), uids.len());
                        }
                    }
                    latencies.push(began.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for worker in workers {
        latencies.extend(worker.await.unwrap());
    }
    let elapsed = started.elapsed();
    latencies.sort();
    Measurement {
        calls: latencies.len(),
        elapsed,
        latencies,
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn main() {
    let seconds: f64 = std::env::var("CAPMVM_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    let run_for = Duration::from_secs_f64(seconds);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let host = HollowHost::start(HollowConfig { provision_time: Duration::from_millis(10), ..HollowConfig::default() })
            .await
            .unwrap();
        let pool = ClientPool::new(PoolOptions::default());
        let client = pool.client(&HostConfig::new(host.endpoint())).unwrap();
        let control = host.control();

        println!("flintlock client against one hollow host ({}), one shared channel, {seconds} s per row", host.endpoint());
        println!("{:>6} {:>5} {:>11} {:>12} {:>10} {:>10}", "vms", "call", "concurrency", "calls/s", "p50", "p99");
        let mut uids = Vec::new();
        for size in SIZES {
            while uids.len() < size {
                uids.push(client.create(spec(uids.len())).await.unwrap().uid().to_owned());
            }
            let uids = Arc::new(uids.clone());
            for (name, call) in [("get", Call::Get), ("list", Call::List)] {
                for concurrency in CONCURRENCY {
                    control.reset_counters();
                    let m = measure(&client, call, uids.clone(), concurrency, run_for).await;
                    let counters = control.counters();
                    let answered = match call {
                        Call::Get => counters.get,
                        Call::List => counters.list,
                    };
                    assert_eq!(answered, m.calls as u64, "every call reached the host");
                    println!(
                        "{:>6} {:>5} {:>11} {:>12.0} {:>10.2?} {:>10.2?}",
                        size,
                        name,
                        concurrency,
                        m.calls as f64 / m.elapsed.as_secs_f64(),
                        percentile(&m.latencies, 0.50),
                        percentile(&m.latencies, 0.99),
                    );
                }
            }
        }
        assert_eq!(pool.channel_count(), 1, "one channel served every call");
        host.shutdown().await;
    });
}
