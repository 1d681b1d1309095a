//! End to end against the real flintlockd v0.11.0: the operator in a process of its own, the API
//! emulator and the CAPI stand-in, and MicrovmClusters whose hosts are real flintlockd processes
//! (`capmvm-upstream` starts each on a containerd of its own, with mTLS and a basic-auth token).
//!
//! No microVM boots on these machines and no image can be pulled, so every microVM stays PENDING,
//! flintlock failing each attempt and counting `retry` up, until it is FAILED (`--maximum-retry`):
//! this is what the operator sees of a host that cannot provision, on the real server.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use capmvm_api::capi::Cluster;
use capmvm_api::keys::MACHINE_FINALIZER;
use capmvm_api::{HostEndpoint, MicrovmCluster, MicrovmMachine, VmState};
use capmvm_flintlock::hollow::pki::TestPki;
use capmvm_flintlock::{
    ClientPool, ErrorKind, HostConfig, Microvm, MicrovmState, PoolOptions, SecretString,
};
use capmvm_sim::world::{HostAuth, World, wait_for};
use capmvm_upstream::flintlock::{ContainerdTools, FlintlockdTls};
use capmvm_upstream::{Binaries, Flintlockd, FlintlockdOptions};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

mod e2e_support;
use e2e_support::*;

const TOKEN: &str = "real-fl1ntlock-t0ken";

/// A real flintlockd with mTLS and [`TOKEN`], in a short folder of its own.
async fn real_host(
    binaries: &Binaries,
    tools: &ContainerdTools,
    pki: &TestPki,
    n: usize,
    maximum_retry: Option<u32>,
) -> Flintlockd {
    let dir = std::env::temp_dir().join(format!("capmvm-e2e-fl-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let pem = dir.join("pki");
    pki.write_to(&pem).unwrap();
    let options = FlintlockdOptions {
        basic_auth_token: Some(TOKEN.to_owned()),
        tls: Some(FlintlockdTls {
            cert: pem.join("server.crt"),
            key: pem.join("server.key"),
            client_ca: Some(pem.join("ca.crt")),
            validate_client: true,
        }),
        maximum_retry,
    };
    Flintlockd::start(binaries, tools, &dir, &options)
        .await
        .unwrap()
}

/// The Secrets a user writes for one cluster: the host's token (under its address) and the TLS
/// client material.
async fn credentials(w: &World, cluster: &str, endpoint: &str, token: &str, pki: &TestPki) {
    let key = endpoint.parse::<HostEndpoint>().unwrap().secret_key();
    let client_tls = pki.client_tls(true);
    let secrets: Api<Secret> = Api::namespaced(w.client.clone(), NS);
    let secret = |name: String, data: BTreeMap<String, ByteString>| Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    };
    secrets
        .create(
            &PostParams::default(),
            &secret(
                format!("{cluster}-flintlock-token"),
                BTreeMap::from([(key, ByteString(token.as_bytes().to_vec()))]),
            ),
        )
        .await
        .unwrap();
    secrets
        .create(
            &PostParams::default(),
            &secret(
                format!("{cluster}-flintlock-tls"),
                BTreeMap::from([
                    (
                        "ca.crt".into(),
                        ByteString(client_tls.ca_pem.clone().unwrap()),
                    ),
                    (
                        "tls.crt".into(),
                        ByteString(client_tls.client_cert_pem.clone().unwrap()),
                    ),
                    (
                        "tls.key".into(),
                        ByteString(
                            client_tls
                                .client_key_pem
                                .as_ref()
                                .unwrap()
                                .expose()
                                .to_vec(),
                        ),
                    ),
                ]),
            ),
        )
        .await
        .unwrap();
}

/// Applies the shipped template as cluster `name` with one worker, on `endpoint` alone.
async fn apply_cluster(w: &World, name: &str, endpoint: &str) {
    let mut vars = counts(0, 1).to_vec();
    vars.push(("CLUSTER_NAME", name.to_string()));
    let (token, tls) = (
        format!("{name}-flintlock-token"),
        format!("{name}-flintlock-tls"),
    );
    w.apply_demo_cluster(&vars, |objects| {
        for o in objects.iter_mut() {
            if o.types.as_ref().unwrap().kind == "MicrovmCluster" {
                o.data["spec"]["placement"]["staticPool"]["hosts"] =
                    json!([{"name": "host-0", "endpoint": endpoint, "controlplaneAllowed": true}]);
                o.data["spec"]["placement"]["staticPool"]["basicAuthSecret"] = json!(token);
                o.data["spec"]["tlsSecretRef"] = json!(tls);
            }
        }
    })
    .await
    .unwrap();
}

/// The one MicrovmMachine of cluster `name`.
async fn machine_of(w: &World, name: &str) -> Option<MicrovmMachine> {
    w.microvm_machines(NS)
        .await
        .unwrap()
        .into_iter()
        .find(|m| m.name_any().starts_with(&format!("{name}-md-0")))
}

/// Waits until cluster `name`'s machine's Ready condition satisfies `check`.
async fn wait_machine(
    w: &World,
    name: &str,
    within: Duration,
    what: &str,
    check: impl Fn(&MicrovmMachine, &str, &str) -> bool,
) -> MicrovmMachine {
    wait_for(&format!("{name}: {what}"), within, POLL, || async {
        let Some(m) = machine_of(w, name).await else {
            return Ok(None);
        };
        let ok =
            ready_condition(&m).is_some_and(|(_, reason, message)| check(&m, &reason, &message));
        Ok(ok.then_some(m))
    })
    .await
    .unwrap()
}

/// The operator's flintlock calls to `endpoint` (of `method`, a gRPC method name such as
/// `CreateMicroVM`, or every one), from its metrics, whatever their outcome.
async fn calls_to(w: &World, endpoint: &str, method: Option<&str>) -> u64 {
    let text = w.operator().unwrap().scrape_metrics().await.unwrap();
    text.lines()
        .filter(|l| l.starts_with("capmvm_flintlock_calls"))
        .filter(|l| l.contains(&format!("host=\"{endpoint}\"")))
        .filter(|l| method.is_none_or(|m| l.contains(&format!("method=\"{m}\""))))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// What the real server holds, asked with the right credentials.
async fn on_host(pool: &ClientPool, pki: &TestPki, endpoint: &str) -> Vec<Microvm> {
    let client = pool
        .client(&HostConfig {
            tls: Some(pki.client_tls(true)),
            basic_auth_token: Some(SecretString::new(TOKEN)),
            ..HostConfig::new(endpoint)
        })
        .unwrap();
    client.list("", None).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_against_real_flintlockd_hosts() {
    let Some((binaries, tools)) = capmvm_upstream::flintlock::for_test("e2e_real_flintlock") else {
        return;
    };
    let mut o = options(0);
    o.auth = HostAuth::MtlsAndToken(TOKEN.into());
    let w = world(o).await;
    let pki = w.pki.clone().unwrap();
    // `patient`: flintlock's defaults; `doomed`: --maximum-retry 0; `guarded`: reached with a
    // wrong token.
    let patient = real_host(&binaries, &tools, &pki, 0, None).await;
    let doomed = real_host(&binaries, &tools, &pki, 1, Some(0)).await;
    let guarded = real_host(&binaries, &tools, &pki, 2, None).await;
    let (p, d, g) = (patient.endpoint(), doomed.endpoint(), guarded.endpoint());
    credentials(&w, "patient", &p, TOKEN, &pki).await;
    credentials(&w, "doomed", &d, TOKEN, &pki).await;
    credentials(&w, "guarded", &g, "not-the-token", &pki).await;
    for (name, endpoint) in [("patient", &p), ("doomed", &d), ("guarded", &g)] {
        apply_cluster(&w, name, endpoint).await;
    }
    let pool = ClientPool::new(PoolOptions::default());

    // FAILED, with flintlock's retry count, and not replaced.
    let failed = wait_machine(&w, "doomed", WAIT, "failed", |_, reason, _| {
        reason == "MicrovmProvisionFailed"
    })
    .await;
    assert_eq!(
        failed.status.as_ref().unwrap().vm_state,
        Some(VmState::Failed)
    );
    let (_, _, message) = ready_condition(&failed).unwrap();
    assert!(
        message.contains("after 1 retries") && message.contains(&d),
        "{message}"
    );
    assert_eq!(on_host(&pool, &pki, &d).await.len(), 1);

    // A wrong token: the MicrovmCluster says so, and the operator does not hammer the host.
    let guarded_cluster = wait_for("guarded: authentication failure", WAIT, POLL, || async {
        let c = Api::<MicrovmCluster>::namespaced(w.client.clone(), NS)
            .get("guarded")
            .await?;
        let ready = c
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready").cloned());
        Ok(ready.filter(|r| r.reason == "HostAuthenticationFailed"))
    })
    .await
    .unwrap();
    assert!(
        guarded_cluster.message.contains(&g) && !guarded_cluster.message.contains("not-the-token"),
        "{}",
        guarded_cluster.message
    );
    let before = calls_to(&w, &g, None).await;
    assert!(before > 0, "the operator's metrics count its calls to {g}");
    tokio::time::sleep(Duration::from_secs(10)).await;
    let during = calls_to(&w, &g, None).await - before;
    assert!(
        during <= 10,
        "{during} calls in 10 s to a host refusing the token"
    );
    let held = machine_of(&w, "guarded")
        .await
        .and_then(|m| ready_condition(&m));
    eprintln!("guarded: {during} calls in 10 s; its machine: {held:?}");
    assert_eq!(
        calls_to(&w, &g, Some("CreateMicroVM")).await,
        0,
        "no create without credentials"
    );
    assert!(on_host(&pool, &pki, &g).await.is_empty());

    // PENDING: provisioning, with flintlock's retry count; created once however long it lasts.
    let started = Instant::now();
    let pending = wait_machine(
        &w,
        "patient",
        WAIT,
        "retried twice",
        |_, reason, message| {
            reason == "MicrovmPending" && message.contains("flintlock retried 2 times")
        },
    )
    .await;
    assert_eq!(
        pending.status.as_ref().unwrap().vm_state,
        Some(VmState::Pending)
    );
    eprintln!("patient: retried twice after {:?}", started.elapsed());
    let vms = on_host(&pool, &pki, &p).await;
    assert_eq!(vms.len(), 1, "one microVM on the host: {vms:?}");
    assert_eq!(
        (vms[0].status.state, vms[0].status.retry),
        (MicrovmState::Pending, 2)
    );
    assert_eq!(
        calls_to(&w, &p, Some("CreateMicroVM")).await,
        1,
        "one create while it stays PENDING"
    );

    // Deletion: DELETING until flintlock's backoff is over, the finalizer kept until not found.
    for name in ["patient", "doomed", "guarded"] {
        Api::<Cluster>::namespaced(w.client.clone(), NS)
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    let deleting_since = Instant::now();
    let uid = vms[0].uid().to_owned();
    let seen_held = std::sync::atomic::AtomicBool::new(false);
    let client = pool
        .client(&HostConfig {
            tls: Some(pki.client_tls(true)),
            basic_auth_token: Some(SecretString::new(TOKEN)),
            ..HostConfig::new(p.as_str())
        })
        .unwrap();
    wait_for(
        "the patient machine to go",
        Duration::from_secs(120),
        POLL,
        || async {
            let machine = machine_of(&w, "patient").await;
            let on_host = client.get(&uid).await;
            match (&machine, &on_host) {
                (Some(m), Ok(vm)) if vm.status.state == MicrovmState::Deleting => {
                    assert!(
                        m.finalizers().contains(&MACHINE_FINALIZER.to_string()),
                        "the finalizer stays while the microVM is DELETING"
                    );
                    seen_held.store(true, std::sync::atomic::Ordering::Relaxed);
                    Ok(None)
                }
                (None, Ok(vm)) => panic!(
                    "the machine went while its microVM is {:?}",
                    vm.status.state
                ),
                (None, Err(e)) => {
                    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
                    Ok(Some(()))
                }
                _ => Ok(None),
            }
        },
    )
    .await
    .unwrap();
    assert!(
        seen_held.into_inner(),
        "the machine was seen held while its microVM was DELETING"
    );
    wait_for(
        "every machine to go",
        Duration::from_secs(120),
        POLL,
        || async { Ok(w.microvm_machines(NS).await?.is_empty().then_some(())) },
    )
    .await
    .unwrap();
    for endpoint in [&p, &d, &g] {
        assert!(
            on_host(&pool, &pki, endpoint).await.is_empty(),
            "{endpoint}"
        );
    }
    assert_eq!(calls_to(&w, &p, Some("CreateMicroVM")).await, 1);
    let deletes = calls_to(&w, &p, Some("DeleteMicroVM")).await;
    eprintln!(
        "patient: held {:?} through DELETING with {deletes} delete calls",
        deleting_since.elapsed()
    );
    assert!(
        (1..=3).contains(&deletes),
        "no delete storm while DELETING: {deletes}"
    );

    let log = std::fs::read_to_string(w.operator_log()).unwrap();
    assert!(!log.contains(TOKEN) && !log.contains("not-the-token") && !log.contains("PRIVATE KEY"));
    for host in [patient, doomed, guarded] {
        let leftovers = host.stop().await.unwrap();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
    w.shutdown().await;
}
