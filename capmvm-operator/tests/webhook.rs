//! The conversion webhook over real TLS, as the API server calls it: a `ConversionReview` POSTed to
//! `/convert` is answered with each object converted; a renewed certificate is served without a
//! restart; unusable certificate files are refused naming the file and the fix.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code

use std::path::{Path, PathBuf};
use std::sync::Arc;

use capmvm_operator::webhook::{CertStore, Webhook};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

const V1ALPHA1: &str = "infrastructure.cluster.x-k8s.io/v1alpha1";
const V1ALPHA2: &str = "infrastructure.cluster.x-k8s.io/v1alpha2";

struct Pki {
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    fn new() -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Pki { ca }
    }

    /// A serving certificate for localhost with common name `cn`, written as tls.crt and tls.key.
    fn write_serving(&self, dir: &Path, cn: &str) {
        let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("tls.crt"), cert.pem()).unwrap();
        std::fs::write(dir.join("tls.key"), key.serialize_pem()).unwrap();
    }

    fn connector(&self) -> tokio_rustls::TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(self.ca.pem().as_bytes()).unwrap())
            .unwrap();
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        tokio_rustls::TlsConnector::from(Arc::new(config))
    }
}

fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "capmvm-webhook-{test}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// POSTs `body` to `/convert` over TLS; the status code, the body, and the server certificate's
/// common name.
async fn post(pki: &Pki, addr: std::net::SocketAddr, body: &[u8]) -> (u16, Value, String) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut tls = pki
        .connector()
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("the TLS handshake succeeds with the CA's certificate");
    let peer = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    let cn = common_name(&peer);
    let head = format!(
        "POST /convert HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    tls.write_all(body).await.unwrap();
    let mut response = Vec::new();
    let _ = tls.read_to_end(&mut response).await;
    let text = String::from_utf8_lossy(&response).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    // Chunked or not: the JSON document is between the first `{` and the last `}`.
    let json = match (body.find('{'), body.rfind('}')) {
        (Some(a), Some(b)) => serde_json::from_str(&body[a..=b]).unwrap_or(Value::Null),
        _ => Value::String(body.to_string()),
    };
    (status, json, cn)
}

fn common_name(cert: &CertificateDer<'_>) -> String {
    // The subject follows the issuer in the DER: its common name is the last one (OID 2.5.4.3).
    let der = cert.as_ref();
    let oid = [0x06, 0x03, 0x55, 0x04, 0x03];
    der.windows(oid.len())
        .rposition(|w| w == oid)
        .map(|at| {
            let len = der[at + oid.len() + 1] as usize;
            let start = at + oid.len() + 2;
            String::from_utf8_lossy(&der[start..start + len]).to_string()
        })
        .unwrap_or_default()
}

fn review(objects: Vec<Value>, desired: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "request": {"uid": "0c6a1a4e-0000-4000-8000-000000000001", "desiredAPIVersion": desired, "objects": objects},
    }))
    .unwrap()
}

fn go_cluster() -> Value {
    json!({
        "apiVersion": V1ALPHA1,
        "kind": "MicrovmCluster",
        "metadata": {"name": "demo", "namespace": "default", "resourceVersion": "7"},
        "spec": {
            "controlPlaneEndpoint": {"host": "10.0.0.100", "port": 6443},
            "placement": {"staticPool": {"hosts": [
                {"name": "one", "endpoint": "10.0.0.5:9090", "controlplaneAllowed": true},
            ]}},
        },
        "status": {"ready": true, "failureDomains": {"10.0.0.5:9090": {"controlPlane": true}}},
    })
}

#[tokio::test]
async fn reviews_are_answered_over_tls_and_a_renewed_certificate_is_served() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pki = Pki::new();
    let dir = temp_dir("serve");
    pki.write_serving(&dir, "first");
    let certs = Arc::new(CertStore::load(&dir).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let webhook = Webhook::new(listener, certs.clone());
    let addr = webhook.local_addr().unwrap();
    let server = tokio::spawn(webhook.serve());

    let (status, answer, cn) = post(&pki, addr, &review(vec![go_cluster()], V1ALPHA2)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(cn, "first");
    let response = &answer["response"];
    assert_eq!(response["uid"], "0c6a1a4e-0000-4000-8000-000000000001");
    assert_eq!(response["result"]["status"], "Success", "{answer}");
    let converted = &response["convertedObjects"][0];
    assert_eq!(converted["apiVersion"], V1ALPHA2);
    assert_eq!(converted["metadata"]["resourceVersion"], "7");
    assert_eq!(
        converted["spec"]["placement"]["staticPool"]["hosts"][0]["failureDomain"],
        "10.0.0.5:9090"
    );
    assert_eq!(converted["status"]["initialization"]["provisioned"], true);
    assert_eq!(
        converted["status"]["failureDomains"],
        json!([{"name": "10.0.0.5:9090", "controlPlane": true}])
    );

    // Back to v1alpha1: the object the Go provider stored.
    let (_, back, _) = post(&pki, addr, &review(vec![converted.clone()], V1ALPHA1)).await;
    assert_eq!(back["response"]["convertedObjects"][0], go_cluster());

    // Renewal: new files, picked up without a restart.
    std::thread::sleep(std::time::Duration::from_millis(20));
    pki.write_serving(&dir, "renewed");
    assert!(certs.refresh().unwrap(), "the new files are read");
    assert!(
        !certs.refresh().unwrap(),
        "unchanged files are not read again"
    );
    let (status, _, cn) = post(&pki, addr, &review(vec![go_cluster()], V1ALPHA2)).await;
    assert_eq!((status, cn.as_str()), (200, "renewed"));

    // A half-written renewal keeps the served certificate.
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(dir.join("tls.key"), "not a key").unwrap();
    let err = certs.refresh().unwrap_err().to_string();
    assert!(err.contains("tls.key"), "{err}");
    let (status, _, cn) = post(&pki, addr, b"{}").await;
    assert_eq!((status, cn.as_str()), (400, "renewed"));

    server.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn certificate_problems_name_the_file_and_the_fix() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = temp_dir("bad");
    let err = Webhook::from_flags(9443, Some(&dir))
        .await
        .err()
        .expect("an explicit directory without files is refused")
        .to_string();
    assert!(err.contains("tls.crt"), "{err}");
    assert!(err.contains("--webhook-port=0"), "{err}");

    let pki = Pki::new();
    pki.write_serving(&dir, "one");
    let other = temp_dir("other");
    pki.write_serving(&other, "two");
    std::fs::copy(other.join("tls.key"), dir.join("tls.key")).unwrap();
    let err = CertStore::load(&dir).unwrap_err().to_string();
    assert!(err.contains("is not the key of the certificate"), "{err}");
    assert!(!err.contains("PRIVATE KEY"), "never the key: {err}");

    std::fs::write(dir.join("tls.crt"), "garbage").unwrap();
    let err = CertStore::load(&dir).unwrap_err().to_string();
    assert!(
        err.contains("tls.crt") && err.contains("no PEM certificate"),
        "{err}"
    );

    assert!(Webhook::from_flags(0, Some(&dir)).await.unwrap().is_none());
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&other);
}
