//! Two operator replicas with leader election on real coordination.k8s.io Leases, and certificates
//! rotated under load, on one real stack (etcd, kube-apiserver, Cluster API's own managers, hollow
//! flintlock hosts with mTLS and a token). Issue 36, requirements 2 and 3. In order, while a
//! MachineDeployment scales up:
//!
//! 1. the hosts' certificates and CA are rotated (the hosts serve a new PKI, the cluster's TLS
//!    Secret gets its content) and the conversion webhook's serving certificate is renewed: no
//!    conversion fails, host calls fail only until the operator reads the new Secret, no restart;
//! 2. the leader is SIGKILLed mid scale-up of 20: the standby takes the Lease within lease duration
//!    + renew deadline (from the Lease and the audit log) and finishes;
//! 3. the new leader is partitioned from the API server alone (a blackholed link; the hosts still
//!    reach it): it exits before the other replica acquires the Lease, and its last API write
//!    precedes the other's first (audit log, replicas told apart by user agent).
//!
//! After each step every machine is Ready with its Node and the hosts hold exactly one microVM per
//! machine. Needs the upstream binaries (`hack/upstream.sh build`): under CI a missing one fails
//! the test, locally it is reported as skipped.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod real_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use capmvm_flintlock::hollow::pki::TestPki;
use capmvm_sim::real::{BINARIES, RealStack};
use capmvm_sim::stack::{self, Stack};
use capmvm_sim::world::{DEMO_CLUSTER, HostAuth, OperatorProcess, wait_for};
use capmvm_upstream::link::{Cut, Link};
use capmvm_upstream::{AuditEvent, Binaries};
use jiff::Timestamp;
use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use real_support::{assert_no_forbidden, live_vms, options, wait_ready_with_nodes};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};

const NS: &str = "default";
const CLUSTER: &str = "demo";
const MD: &str = "demo-md-0";
const TOKEN: &str = "failover-t0ken";
const LEASE_NAME: &str = "controller-leader-elect-capmvm";
const LEASE_NAMESPACE: &str = "capmvm-system";
/// Shorter than the defaults (15 s, 10 s, 2 s) so the test is quick; nested as client-go requires.
const LEASE: Duration = Duration::from_secs(8);
const RENEW: Duration = Duration::from_secs(5);
const RETRY: Duration = Duration::from_secs(1);
/// How many machines each step adds.
const STEP: usize = 20;
/// How many of a step's microVMs exist on the hosts when the fault strikes: mid scale-up.
const STRIKE_AFTER: usize = 5;

fn election_flags() -> Vec<String> {
    vec![
        "--leader-elect".to_string(),
        format!("--leader-election-namespace={LEASE_NAMESPACE}"),
        format!("--leader-elect-lease-duration={}s", LEASE.as_secs()),
        format!("--leader-elect-renew-deadline={}s", RENEW.as_secs()),
        format!("--leader-elect-retry-period={}s", RETRY.as_secs()),
    ]
}

fn md_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "MachineDeployment"),
        "machinedeployments",
    )
}

/// The Lease's holder and acquire time, once its holder's identity starts with `replica`.
async fn wait_leader(real: &RealStack, replica: &str, timeout: Duration) -> (String, Timestamp) {
    let leases: Api<Lease> = Api::namespaced(real.client.clone(), LEASE_NAMESPACE);
    let prefix = format!("{replica}_");
    wait_for(
        &format!("{replica} to hold the Lease"),
        timeout,
        Duration::from_millis(100),
        || async {
            let Some(spec) = leases.get_opt(LEASE_NAME).await?.and_then(|l| l.spec) else {
                return Ok(None);
            };
            Ok(match (spec.holder_identity, spec.acquire_time) {
                (Some(h), Some(at)) if h.starts_with(&prefix) => Some((h, at.0)),
                _ => None,
            })
        },
    )
    .await
    .unwrap()
}

/// Waits until the hosts hold `n` live microVMs.
async fn wait_vms(real: &RealStack, n: usize) {
    wait_for(
        &format!("{n} microVMs on the hosts"),
        Duration::from_secs(120),
        Duration::from_millis(100),
        || async { Ok((live_vms(real).len() >= n).then_some(())) },
    )
    .await
    .unwrap();
}

/// Exactly one microVM per machine on the hosts, none being deleted; the creates the hosts
/// answered.
fn assert_one_vm_per_machine(real: &RealStack, machines: usize) -> u64 {
    let all = real.all_vms();
    let mut per_machine: BTreeMap<String, usize> = BTreeMap::new();
    for (_, vm) in &all {
        *per_machine
            .entry(format!(
                "{}/{}",
                vm.microvm.spec.namespace, vm.microvm.spec.id
            ))
            .or_default() += 1;
    }
    let twice: Vec<_> = per_machine.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "microVMs created twice: {twice:?}");
    assert_eq!(
        (all.len(), live_vms(real).len()),
        (machines, machines),
        "one live microVM per machine, none left over"
    );
    real.flintlock_calls()
        .get("CreateMicroVM")
        .copied()
        .unwrap_or(0)
}

/// The audit log's completed writes of replica `name` (its user agent names it).
fn writes_of(real: &RealStack, name: &str) -> Vec<AuditEvent> {
    let agent = format!("({name})");
    let mut writes: Vec<AuditEvent> = real
        .audit()
        .unwrap()
        .requests()
        .unwrap()
        .into_iter()
        .filter(|e| e.stage == "ResponseComplete" && e.is_write() && e.user_agent.ends_with(&agent))
        .collect();
    writes.sort_by_key(received);
    writes
}

fn received(e: &AuditEvent) -> Timestamp {
    e.request_received_timestamp.parse().unwrap()
}

fn completed(e: &AuditEvent) -> Timestamp {
    e.stage_timestamp.parse().unwrap()
}

fn is_lease(e: &AuditEvent) -> bool {
    e.object_ref
        .as_ref()
        .is_some_and(|o| o.resource == "leases")
}

/// Seconds from `earlier` to `later` (negative if `later` is earlier).
fn secs(later: Timestamp, earlier: Timestamp) -> f64 {
    later.duration_since(earlier).as_secs_f64()
}

/// Timestamps of the operator log's lines whose message is one of `messages`.
fn logged(log: &std::path::Path, messages: &[&str]) -> Vec<(Timestamp, String)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| messages.contains(&v["message"].as_str().unwrap_or_default()))
        .filter_map(|v| {
            let at = v["timestamp"].as_str()?.parse().ok()?;
            Some((at, v.to_string()))
        })
        .collect()
}

/// Flintlock calls the operator made that failed, from its metrics.
async fn failed_host_calls(operator: &OperatorProcess) -> u64 {
    let metrics = operator.scrape_metrics().await.unwrap();
    let failed: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("capmvm_flintlock_calls_total{") && !l.contains("code=\"ok\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    failed as u64
}

/// The leaf certificate (DER) served on 127.0.0.1:`port`, verified against `ca_pem`.
async fn served_certificate(port: u16, ca_pem: &str) -> anyhow::Result<Vec<u8>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let server = ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(server, tcp)
        .await?;
    let leaf = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec());
    leaf.ok_or_else(|| anyhow::anyhow!("no certificate served"))
}

/// Lists MicrovmMachines at v1alpha1 every 200 ms until `stop`: each list makes the API server
/// call the conversion webhook. The failures, with their times.
fn convert_continuously(
    client: kube::Client,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(u64, Vec<(Timestamp, String)>)> {
    let v1alpha1 = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "infrastructure.cluster.x-k8s.io",
            "v1alpha1",
            "MicrovmMachine",
        ),
        "microvmmachines",
    );
    tokio::spawn(async move {
        let api = Api::<DynamicObject>::namespaced_with(client, NS, &v1alpha1);
        let (mut calls, mut failures) = (0, Vec::new());
        while !stop.load(Ordering::SeqCst) {
            calls += 1;
            match api.list(&ListParams::default()).await {
                Ok(list) if list.items.is_empty() => {
                    failures.push((Timestamp::now(), "no MicrovmMachine listed".to_string()))
                }
                Ok(_) => {}
                Err(e) => failures.push((Timestamp::now(), e.to_string())),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        (calls, failures)
    })
}

/// The TLS Secret's content for `pki`'s client certificate.
fn tls_data(pki: &TestPki) -> BTreeMap<String, ByteString> {
    BTreeMap::from([
        (
            "ca.crt".into(),
            ByteString(pki.ca_cert_pem.clone().into_bytes()),
        ),
        (
            "tls.crt".into(),
            ByteString(pki.client_cert_pem.clone().into_bytes()),
        ),
        (
            "tls.key".into(),
            ByteString(pki.client_key_pem.expose().to_vec()),
        ),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_failover_and_certificate_rotation_on_the_real_stack() {
    if Binaries::for_test(
        "leader_failover_and_certificate_rotation_on_the_real_stack",
        BINARIES,
    )
    .is_none()
    {
        return;
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let wall = Instant::now();
    let mut o = options();
    o.auth = HostAuth::MtlsAndToken(TOKEN.into());
    let mut real = RealStack::start(o).await.expect("the real stack starts");
    // A failed run leaves the directory (shutdown removes it): its logs are named here.
    println!("logs in {}", real.dir.display());
    let link = Link::start(real.management_addr().unwrap()).await.unwrap();
    let direct = real.operator_kubeconfig.clone();
    let via_link = real
        .operator_kubeconfig_via(link.address(), &real.dir.join("operator-b.kubeconfig"))
        .unwrap();
    // Replica a first, so it leads; b through the link.
    let mut a = Some(
        real.spawn_replica("replica-a", &direct, &election_flags(), true)
            .unwrap(),
    );
    wait_leader(&real, "replica-a", Duration::from_secs(60)).await;
    let mut b = Some(
        real.spawn_replica("replica-b", &via_link, &election_flags(), false)
            .unwrap(),
    );

    // The cluster: one control plane, the MachineDeployment at 0, the hosts' token and TLS Secrets.
    let vip = real.prepare_cluster(NS, CLUSTER).await.unwrap();
    let credentials = stack::create_credentials(&real, NS, CLUSTER).await.unwrap();
    let vars = vec![
        ("CLUSTER_NAME", CLUSTER.to_string()),
        ("NAMESPACE", NS.to_string()),
        ("CONTROL_PLANE_VIP", vip.to_string()),
        ("CONTROL_PLANE_MACHINE_COUNT", "1".to_string()),
        ("WORKER_MACHINE_COUNT", "0".to_string()),
    ];
    stack::apply_template(&real, DEMO_CLUSTER, &vars, |objects| {
        stack::use_credentials(objects, &credentials)
    })
    .await
    .unwrap();
    wait_ready_with_nodes(&real, NS, CLUSTER, 1).await;
    let mut machines = 1;
    println!("stack and control plane ready after {:?}", wall.elapsed());

    // 1. Rotation under load: 10 workers being created while the hosts switch to a new PKI (as
    // flintlockd restarted with new files: open connections closed), the Secret gets it, and the
    // webhook's certificate is renewed. Conversions run all along.
    let stop = Arc::new(AtomicBool::new(false));
    let conversions = convert_continuously(real.client.clone(), stop.clone());
    real.scale(&md_resource(), NS, MD, 10).await.unwrap();
    wait_vms(&real, machines + 3).await;
    let new_pki = TestPki::generate().unwrap();
    let rotation_start = Timestamp::now();
    for host in &real.hosts {
        host.control()
            .set_tls(Some(new_pki.server_tls(true)))
            .await
            .unwrap();
    }
    let secrets: Api<Secret> = Api::namespaced(real.client.clone(), NS);
    let tls_name = credentials.1.clone().unwrap();
    let mut secret = secrets.get(&tls_name).await.unwrap();
    secret.data = Some(tls_data(&new_pki));
    secrets
        .replace(&tls_name, &PostParams::default(), &secret)
        .await
        .unwrap();
    let webhook = real.webhook().unwrap().clone();
    let renewed = CertificateDer::from_pem_slice(webhook.renew().unwrap().as_bytes())
        .unwrap()
        .to_vec();
    let rotation_end = Timestamp::now();
    let webhook_swapped = wait_for(
        "the webhook to serve its renewed certificate",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let served = served_certificate(webhook.port, &webhook.ca_pem()).await?;
            Ok((served == renewed).then(Timestamp::now))
        },
    )
    .await
    .unwrap();
    machines += 10;
    wait_ready_with_nodes(&real, NS, CLUSTER, machines).await;
    // A few more conversions on the renewed certificate.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    let (conversion_calls, conversion_failures) = conversions.await.unwrap();
    assert!(
        conversion_failures.is_empty(),
        "conversions failed during the renewal: {conversion_failures:?}"
    );
    let host_failures = logged(
        &real.replica_log("replica-a"),
        &[
            "host call failed",
            "host unreachable",
            "host refused the credentials",
        ],
    );
    let last_failure = host_failures.iter().map(|(at, _)| *at).max();
    // Host calls may fail from the moment the hosts switch until the operator has read the new
    // Secret (its watch sees the change at once); none after that, so none for long.
    let pickup = Duration::from_secs(10);
    if let Some(last) = last_failure {
        assert!(
            secs(last, rotation_end) <= pickup.as_secs_f64(),
            "host calls failed {:.1} s after the rotation ended: {host_failures:#?}",
            secs(last, rotation_end)
        );
    }
    // Nothing goes on failing: the observers under the old credentials are gone (they would
    // list the hosts in vain every poll for the sweep's grace, a minute).
    let failed_after = failed_host_calls(a.as_ref().unwrap()).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        failed_host_calls(a.as_ref().unwrap()).await,
        failed_after,
        "host calls still fail after the rotation"
    );
    assert!(
        a.as_ref().unwrap().pid().is_some(),
        "no restart: replica a still runs"
    );
    let creates = assert_one_vm_per_machine(&real, machines);
    println!(
        "rotation: hosts + Secret + webhook rotated in {:.3} s; host-call failures logged: {} (last {:?} s after the rotation began), {failed_after} failed calls in the metrics and none in the 6 s after; webhook served the renewed certificate {:.1} s after it was written; {conversion_calls} conversions, 0 failed; {creates} creates for {machines} machines",
        secs(rotation_end, rotation_start),
        host_failures.len(),
        last_failure.map(|l| secs(l, rotation_start)),
        secs(webhook_swapped, rotation_end),
    );

    // 2. The leader SIGKILLed mid scale-up of 20: b takes over within lease duration + renew
    // deadline and finishes.
    real.scale(&md_resource(), NS, MD, 10 + STEP).await.unwrap();
    wait_vms(&real, machines + STRIKE_AFTER).await;
    let killed_at = Timestamp::now();
    a.take().unwrap().kill().await;
    let (_, b_acquired) =
        wait_leader(&real, "replica-b", LEASE + RENEW + Duration::from_secs(30)).await;
    let takeover = secs(b_acquired, killed_at);
    assert!(
        takeover <= (LEASE + RENEW).as_secs_f64(),
        "replica b took the Lease {takeover:.1} s after the kill (lease {LEASE:?} + renew deadline {RENEW:?})"
    );
    machines += STEP;
    wait_ready_with_nodes(&real, NS, CLUSTER, machines).await;
    let a_writes = writes_of(&real, "replica-a");
    let b_writes = writes_of(&real, "replica-b");
    let a_last = a_writes.last().map(completed).unwrap();
    let b_first_lease = b_writes.iter().find(|e| is_lease(e)).map(received).unwrap();
    let b_first_act = b_writes
        .iter()
        .find(|e| !is_lease(e))
        .map(received)
        .unwrap();
    assert!(a_last < b_first_lease, "a's last write precedes b's first");
    let creates = assert_one_vm_per_machine(&real, machines);
    println!(
        "kill: Lease acquired {takeover:.1} s after the SIGKILL (audit, from the kill: a's last write answered at {:+.1} s, b's Lease write at {:+.1} s, its first other write at {:+.1} s); {creates} creates for {machines} machines",
        secs(a_last, killed_at),
        secs(b_first_lease, killed_at),
        secs(b_first_act, killed_at),
    );

    // 3. The leader (b) partitioned from the API server alone, mid scale-up of 20; a restarted as
    // the standby. b must stop before a acquires.
    a = Some(
        real.spawn_replica("replica-a", &direct, &election_flags(), true)
            .unwrap(),
    );
    real.scale(&md_resource(), NS, MD, 10 + 2 * STEP)
        .await
        .unwrap();
    wait_vms(&real, machines + STRIKE_AFTER).await;
    let cut_at = Timestamp::now();
    link.cut(Cut::Blackhole);
    let mut b_process = b.take().unwrap();
    let b_exit = b_process
        .wait_exit(LEASE + RENEW + Duration::from_secs(30))
        .await;
    let b_exited_at = Timestamp::now();
    assert_eq!(
        b_exit,
        Some(1),
        "the partitioned leader exits with an error once it cannot renew"
    );
    let (_, a_acquired) =
        wait_leader(&real, "replica-a", LEASE + RENEW + Duration::from_secs(30)).await;
    assert!(
        b_exited_at < a_acquired,
        "the partitioned leader stopped ({b_exited_at}) before the other acquired ({a_acquired})"
    );
    let stopped = logged(
        &real.replica_log("replica-b"),
        &["could not renew the lease in time; stopping"],
    );
    assert_eq!(stopped.len(), 1, "b says why it stopped");
    link.heal();
    machines += STEP;
    wait_ready_with_nodes(&real, NS, CLUSTER, machines).await;
    let b_writes = writes_of(&real, "replica-b");
    let a_writes: Vec<AuditEvent> = writes_of(&real, "replica-a")
        .into_iter()
        .filter(|e| received(e) > cut_at)
        .collect();
    let b_last = b_writes.last().map(completed).unwrap();
    let a_first = a_writes.first().map(received).unwrap();
    let a_first_act = a_writes
        .iter()
        .find(|e| !is_lease(e))
        .map(received)
        .unwrap();
    assert!(
        b_last < a_first,
        "b's last write ({b_last}) precedes a's first after the cut ({a_first})"
    );
    let creates = assert_one_vm_per_machine(&real, machines);
    println!(
        "partition: b stopped acting {:.1} s after the cut ({:.1} s by its log), a acquired the Lease {:.1} s after the cut; audit, from the cut: b's last write answered at {:+.1} s, a's first write at {:+.1} s, its first other write at {:+.1} s; {creates} creates for {machines} machines",
        secs(b_exited_at, cut_at),
        secs(stopped[0].0, cut_at),
        secs(a_acquired, cut_at),
        secs(b_last, cut_at),
        secs(a_first, cut_at),
        secs(a_first_act, cut_at),
    );

    assert_no_forbidden(&real);
    if let Some(a) = a.take() {
        a.stop().await;
    }
    real.shutdown().await;
    println!(
        "wall time {:.0} s (load: {})",
        wall.elapsed().as_secs_f64(),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
}
