//! `--basic-auth-token`, `--tls-cert`/`--tls-key`, `--tls-client-ca` and `--tls-client-validate`
//! as the server checks them.

use capmvm_flintlock::hollow::pki::TestPki;
use capmvm_flintlock::proto::services::ListMicroVMsRequest;
use capmvm_flintlock::proto::services::micro_vm_client::MicroVmClient;
use capmvm_flintlock::{ErrorKind, HostConfig, SecretString, TlsMaterial};
use futures::StreamExt as _;
use tonic::Code;

use crate::servers::{Backend, Options, Tls};
use crate::support::valid_spec;

crate::on_both_servers!(
    the_right_token_passes_and_a_wrong_or_missing_one_is_unauthenticated,
    malformed_authorization_headers_get_flintlocks_texts,
    tls_with_the_right_ca_works_and_another_ca_or_plaintext_fails,
    a_client_ca_without_validation_asks_no_client_certificate,
    mtls_takes_our_client_certificate_and_refuses_others_or_none,
);

const TOKEN: &str = "f1intl0ck-t0ken";

async fn the_right_token_passes_and_a_wrong_or_missing_one_is_unauthenticated(backend: Backend) {
    let server = backend
        .start(Options {
            token: Some(TOKEN),
            ..Options::default()
        })
        .await;
    let good = server.client();
    let created = good.create(valid_spec("m")).await.unwrap();
    assert_eq!(good.list("", None).await.unwrap().len(), 1);

    let wrong = server.client_for(&HostConfig {
        basic_auth_token: Some(SecretString::new("not-the-token")),
        ..server.host_config()
    });
    for err in [
        wrong.list("", None).await.unwrap_err(),
        wrong.get(created.uid()).await.unwrap_err(),
        wrong.delete(created.uid()).await.unwrap_err(),
    ] {
        assert_eq!(
            (err.kind(), err.code()),
            (ErrorKind::Unauthenticated, Some(Code::Unauthenticated))
        );
        assert_eq!(
            err.message(),
            "invalid auth token: failed basic authentication. Check the token supplied"
        );
        assert!(!format!("{err} {err:?}").contains("not-the-token"));
    }

    let none = server.client_for(&HostConfig {
        basic_auth_token: None,
        ..server.host_config()
    });
    let err = none.create(valid_spec("m2")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unauthenticated);
    assert_eq!(
        err.message(),
        "could not extract token from request header: rpc error: code = Unauthenticated desc = Request unauthenticated with basic"
    );
    // The stream is guarded too.
    let err = match none.list_stream("ns1").await {
        Ok(mut stream) => stream.next().await.unwrap().unwrap_err(),
        Err(err) => err,
    };
    assert_eq!(err.kind(), ErrorKind::Unauthenticated);
    // Nothing refused reached the store: still the one microVM, not deleted.
    let all = good.list("", None).await.unwrap();
    assert_eq!(all.len(), 1);
    assert_ne!(
        all[0].status.state,
        capmvm_flintlock::MicrovmState::Deleting
    );
    server.stop().await;
}

async fn malformed_authorization_headers_get_flintlocks_texts(backend: Backend) {
    let server = backend
        .start(Options {
            token: Some(TOKEN),
            ..Options::default()
        })
        .await;
    let mut raw = MicroVmClient::connect(format!("http://{}", server.endpoint()))
        .await
        .unwrap();
    let prefix =
        "could not extract token from request header: rpc error: code = Unauthenticated desc = ";
    let cases = [
        ("Basic", format!("{prefix}Bad authorization string")),
        (
            "Bearer abc",
            format!("{prefix}Request unauthenticated with basic"),
        ),
        (
            "Basic ",
            "invalid auth token: empty authentication token".to_owned(),
        ),
        (
            "Basic Zm9v",
            "invalid auth token: failed basic authentication. Check the token supplied".to_owned(),
        ),
        // The scheme is case-insensitive; this is base64(TOKEN).
        ("basic ZjFpbnRsMGNrLXQwa2Vu", String::new()),
    ];
    for (header, expected) in cases {
        let mut request = tonic::Request::new(ListMicroVMsRequest::default());
        request
            .metadata_mut()
            .insert("authorization", header.parse().unwrap());
        match raw.list_micro_v_ms(request).await {
            Ok(_) => assert!(expected.is_empty(), "{header:?} was accepted"),
            Err(status) => {
                assert_eq!(status.code(), Code::Unauthenticated, "{header:?}");
                assert_eq!(status.message(), expected, "{header:?}");
            }
        }
    }
    server.stop().await;
}

async fn tls_with_the_right_ca_works_and_another_ca_or_plaintext_fails(backend: Backend) {
    let server = backend
        .start(Options {
            tls: Some(Tls::ServerOnly),
            ..Options::default()
        })
        .await;
    let client = server.client();
    client.create(valid_spec("m")).await.unwrap();
    assert_eq!(client.list("", None).await.unwrap().len(), 1);

    // "localhost" is in the certificate too: the server name is the endpoint's host.
    let port = server.endpoint().rsplit_once(':').unwrap().1.to_owned();
    let by_name = server.client_for(&HostConfig {
        endpoint: format!("localhost:{port}"),
        ..server.host_config()
    });
    assert_eq!(by_name.list("", None).await.unwrap().len(), 1);

    let stranger = TestPki::generate().unwrap();
    let err = server
        .client_for(&HostConfig {
            tls: Some(stranger.client_tls(false)),
            ..server.host_config()
        })
        .list("", None)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.message().contains("TLS handshake"), "{err}");

    let err = server
        .client_for(&HostConfig::new(server.endpoint()))
        .list("", None)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    server.stop().await;
}

async fn a_client_ca_without_validation_asks_no_client_certificate(backend: Backend) {
    let server = backend
        .start(Options {
            tls: Some(Tls::ClientCaOnly),
            ..Options::default()
        })
        .await;
    // Without --tls-client-validate a client CA is loaded but no certificate is required: a
    // client without one is served, and so is one with a certificate of another CA.
    let anonymous = server.client_for(&HostConfig {
        tls: Some(server.pki().client_tls(false)),
        ..server.host_config()
    });
    anonymous.create(valid_spec("m")).await.unwrap();
    let stranger = TestPki::generate().unwrap();
    let foreign = server.client_for(&HostConfig {
        tls: Some(TlsMaterial {
            ca_pem: Some(server.pki().ca_cert_pem.clone().into_bytes()),
            client_cert_pem: Some(stranger.client_cert_pem.clone().into_bytes()),
            client_key_pem: Some(stranger.client_key_pem.clone()),
        }),
        ..server.host_config()
    });
    assert_eq!(foreign.list("", None).await.unwrap().len(), 1);
    server.stop().await;
}

async fn mtls_takes_our_client_certificate_and_refuses_others_or_none(backend: Backend) {
    let server = backend
        .start(Options {
            tls: Some(Tls::ClientValidated),
            token: Some(TOKEN),
            ..Options::default()
        })
        .await;
    let ours = server.client();
    ours.create(valid_spec("m")).await.unwrap();
    assert_eq!(ours.list("", None).await.unwrap().len(), 1);

    let stranger = TestPki::generate().unwrap();
    let foreign = server.client_for(&HostConfig {
        tls: Some(TlsMaterial {
            ca_pem: Some(server.pki().ca_cert_pem.clone().into_bytes()),
            client_cert_pem: Some(stranger.client_cert_pem.clone().into_bytes()),
            client_key_pem: Some(stranger.client_key_pem.clone()),
        }),
        ..server.host_config()
    });
    let err = foreign.list("", None).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");

    let anonymous = server.client_for(&HostConfig {
        tls: Some(server.pki().client_tls(false)),
        ..server.host_config()
    });
    let err = anonymous.list("", None).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    // What was refused at the handshake created nothing.
    assert_eq!(ours.list("", None).await.unwrap().len(), 1);
    server.stop().await;
}
