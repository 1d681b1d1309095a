//! Basic auth, TLS, mTLS and the CONNECT proxy, against hollow hosts over loopback TCP.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use capmvm_flintlock::hollow::pki::TestPki;
use capmvm_flintlock::hollow::proxy::ConnectProxy;
use capmvm_flintlock::proto::services::micro_vm_client::MicroVmClient;
use capmvm_flintlock::proto::services::{CreateMicroVmRequest, ListMicroVMsRequest};
use capmvm_flintlock::{ClientPool, ErrorKind, HostConfig, PoolOptions, SecretString, TlsMaterial};
use support::*;
use tonic::Code;

const TOKEN: &str = "f1intl0ck-t0ken";

/// The error a list through `pool` to `host` fails with.
async fn refused_list(pool: &ClientPool, host: &HostConfig) -> capmvm_flintlock::Error {
    pool.client(host)
        .unwrap()
        .list("", None)
        .await
        .expect_err("the list is refused")
}

/// A deliberate divergence: `overrides {}` without a bridge name makes flintlockd v0.11.0
/// dereference nil and exit (checked against the real one: the caller gets Unavailable, "error
/// reading from server: EOF", and the host is gone); the hollow host refuses it and keeps serving.
#[tokio::test]
async fn overrides_without_a_bridge_name_are_refused_and_the_host_keeps_serving() {
    let host = start(fast_config()).await;
    let mut raw = MicroVmClient::connect(format!("http://{}", host.endpoint()))
        .await
        .unwrap();
    let mut spec = capmvm_flintlock::proto::types::MicroVmSpec::from(&valid_spec("m"));
    spec.interfaces[0].overrides = Some(Default::default());
    let status = raw
        .create_micro_vm(CreateMicroVmRequest {
            microvm: Some(spec),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    // And it is still serving.
    raw.list_micro_v_ms(ListMicroVMsRequest::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn tls_to_an_ipv6_literal_uses_the_address_as_server_name() {
    let pki = TestPki::generate().unwrap();
    let mut config = fast_config();
    config.bind = "[::1]:0".parse().unwrap();
    config.tls = Some(pki.server_tls(false));
    let host = start(config).await;
    let pool = pool();
    let tls = HostConfig {
        tls: Some(pki.client_tls(false)),
        ..HostConfig::new(host.endpoint())
    };
    assert!(
        pool.client(&tls)
            .unwrap()
            .list("", None)
            .await
            .unwrap()
            .is_empty()
    );
}

/// A server that speaks TLS 1.2 and nothing newer, with a certificate our CA signed: only the
/// protocol version stands between it and the client.
async fn tls12_only_server(pki: &TestPki) -> String {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let chain = CertificateDer::pem_slice_iter(pki.server_cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(pki.server_key_pem.expose()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS12])
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                // Fails: the client offers TLS 1.3 only. The server answers with an alert.
                let _ = acceptor.accept(stream).await;
            });
        }
    });
    endpoint
}

#[tokio::test]
async fn a_tls_1_2_only_host_is_refused_as_unavailable_saying_why() {
    let pki = TestPki::generate().unwrap();
    let endpoint = tls12_only_server(&pki).await;
    let pool = pool();
    let client = pool
        .client(&HostConfig {
            tls: Some(pki.client_tls(true)),
            basic_auth_token: Some(SecretString::new(TOKEN)),
            ..HostConfig::new(&endpoint)
        })
        .unwrap();
    let err = client.list("", None).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    let text = format!("{err} {err:?}");
    assert!(
        text.contains(&format!("TLS handshake with {endpoint}")),
        "says which step failed: {text}"
    );
    assert!(
        text.contains("TLS 1.3"),
        "says the client needs TLS 1.3: {text}"
    );
    // Nothing secret in it: not the token, not a line of either private key.
    assert!(!text.contains(TOKEN), "{text}");
    for key in [&pki.client_key_pem, &pki.server_key_pem] {
        let pem = String::from_utf8(key.expose().to_vec()).unwrap();
        for line in pem.lines().filter(|line| !line.starts_with("-----")) {
            assert!(!text.contains(line), "key material in: {text}");
        }
    }
}

#[tokio::test]
async fn mtls_accepts_our_client_certificate_and_refuses_others() {
    let pki = TestPki::generate().unwrap();
    let mut config = fast_config();
    config.tls = Some(pki.server_tls(true));
    config.basic_auth_token = Some(SecretString::new(TOKEN));
    let host = start(config).await;
    let pool = pool();

    let ours = HostConfig {
        tls: Some(pki.client_tls(true)),
        basic_auth_token: Some(SecretString::new(TOKEN)),
        ..HostConfig::new(host.endpoint())
    };
    let client = pool.client(&ours).unwrap();
    client.create(valid_spec("m")).await.unwrap();

    // A certificate from another CA: the host refuses the handshake.
    let stranger = TestPki::generate().unwrap();
    let foreign = HostConfig {
        tls: Some(TlsMaterial {
            ca_pem: Some(pki.ca_cert_pem.clone().into_bytes()),
            client_cert_pem: Some(stranger.client_cert_pem.clone().into_bytes()),
            client_key_pem: Some(stranger.client_key_pem.clone()),
        }),
        ..ours.clone()
    };
    let err = refused_list(&pool, &foreign).await;
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");

    // No certificate at all.
    let anonymous = HostConfig {
        tls: Some(pki.client_tls(false)),
        ..ours.clone()
    };
    let err = refused_list(&pool, &anonymous).await;
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");

    assert_eq!(
        host.control().counters().list,
        0,
        "refused connections never reach the service"
    );
}

/// A host's certificate and CA rotated at run time (flintlockd restarted with new files): clients
/// trusting only the old CA are refused from then on, even on a connection opened before; the new
/// material is served, and the host's microVMs are still there.
#[tokio::test]
async fn a_rotated_certificate_is_served_to_every_new_and_open_connection() {
    let old = TestPki::generate().unwrap();
    let new = TestPki::generate().unwrap();
    let mut config = fast_config();
    config.tls = Some(old.server_tls(true));
    let host = start(config).await;
    let pool = pool();
    let with = |pki: &TestPki| HostConfig {
        tls: Some(pki.client_tls(true)),
        ..HostConfig::new(host.endpoint())
    };
    pool.client(&with(&old))
        .unwrap()
        .create(valid_spec("m"))
        .await
        .unwrap();

    host.control()
        .set_tls(Some(new.server_tls(true)))
        .await
        .unwrap();
    let err = refused_list(&pool, &with(&old)).await;
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    let listed = pool
        .client(&with(&new))
        .unwrap()
        .list("", None)
        .await
        .unwrap();
    assert_eq!(listed.len(), 1, "the microVM survived the rotation");

    // Unusable material is refused and the new certificate stays served.
    let mut broken = new.server_tls(true);
    broken.cert_pem = b"not a certificate".to_vec();
    assert!(host.control().set_tls(Some(broken)).await.is_err());
    pool.client(&with(&new))
        .unwrap()
        .list("", None)
        .await
        .unwrap();
}

#[tokio::test]
async fn unusable_tls_material_is_invalid_config_and_keys_never_show() {
    let pki = TestPki::generate().unwrap();
    let pool = pool();
    let half = HostConfig {
        tls: Some(TlsMaterial {
            client_key_pem: Some(pki.client_key_pem.clone()),
            ..pki.client_tls(false)
        }),
        ..HostConfig::new("127.0.0.1:1")
    };
    let err = pool.client(&half).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);

    let garbage_key = capmvm_flintlock::SecretBytes::new(
        b"-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n".to_vec(),
    );
    let bad = HostConfig {
        tls: Some(TlsMaterial {
            client_key_pem: Some(garbage_key),
            ..pki.client_tls(true)
        }),
        ..HostConfig::new("127.0.0.1:1")
    };
    let err = pool.client(&bad).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    assert!(!err.to_string().contains("c2VjcmV0"), "{err}");
    let key_text = String::from_utf8(pki.client_key_pem.expose().to_vec()).unwrap();
    let debug = format!(
        "{:?}",
        HostConfig {
            tls: Some(pki.client_tls(true)),
            ..HostConfig::new("h:1")
        }
    );
    assert!(!debug.contains(key_text.lines().nth(1).unwrap()), "{debug}");
}

#[tokio::test]
async fn connect_timeout_when_the_host_never_answers_the_handshake() {
    // A listener that is never accepted from: TCP connects (kernel backlog), TLS never starts.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = silent.local_addr().unwrap().to_string();
    let pki = TestPki::generate().unwrap();
    let pool = ClientPool::new(PoolOptions {
        connect_timeout: Duration::from_millis(200),
        call_timeout: Duration::from_secs(5),
        ..PoolOptions::default()
    });
    let client = pool
        .client(&HostConfig {
            tls: Some(pki.client_tls(false)),
            ..HostConfig::new(&endpoint)
        })
        .unwrap();
    let started = std::time::Instant::now();
    let err = client.list("", None).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.message().contains("no connection within"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    drop(silent);
}

#[tokio::test]
async fn calls_go_through_the_connect_proxy_with_tls_and_auth() {
    let pki = TestPki::generate().unwrap();
    let mut config = fast_config();
    config.tls = Some(pki.server_tls(true));
    config.basic_auth_token = Some(SecretString::new(TOKEN));
    let host = start(config).await;
    let proxy = ConnectProxy::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let pool = pool();

    let through_proxy = HostConfig {
        endpoint: host.endpoint(),
        tls: Some(pki.client_tls(true)),
        basic_auth_token: Some(SecretString::new(TOKEN)),
        proxy: Some(format!("http://{}", proxy.endpoint())),
    };
    let client = pool.client(&through_proxy).unwrap();
    let created = client.create(valid_spec("m")).await.unwrap();
    client.get(created.uid()).await.unwrap();
    let streamed: Vec<_> =
        futures::StreamExt::collect::<Vec<_>>(client.list_stream("ns1").await.unwrap()).await;
    assert_eq!(streamed.len(), 1);
    assert_eq!(proxy.tunnels(), 1, "one tunnel carried every call");

    // A proxy that is not there: Unavailable, naming the proxy.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dead_proxy = HostConfig {
        proxy: Some(format!("127.0.0.1:{port}")),
        ..through_proxy.clone()
    };
    let err = refused_list(&pool, &dead_proxy).await;
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert!(err.message().contains("proxy"), "{err}");

    // The proxy cannot reach the host: it answers 502 and the client reports Unavailable.
    let nowhere = HostConfig {
        endpoint: format!("127.0.0.1:{port}"),
        ..through_proxy
    };
    let err = refused_list(&pool, &nowhere).await;
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert!(err.message().contains("502"), "{err}");
}
