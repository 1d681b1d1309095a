//! A throw-away PKI for hollow hosts and tests: a CA, a server certificate for loopback and a
//! client certificate, all generated with rcgen (ring).
//!
//! Files written by [`TestPki::write_to`] (PEM):
//!
//! | file | content |
//! |---|---|
//! | `ca.crt` | the CA certificate (trust anchor for both sides) |
//! | `server.crt`, `server.key` | the host's certificate (SANs `127.0.0.1`, `::1`, `localhost`) and key |
//! | `client.crt`, `client.key` | a client certificate (for mTLS) and key |
//!
//! A capmvm TLS Secret for these hosts holds `ca.crt`, `tls.crt` = `client.crt` and
//! `tls.key` = `client.key`.

use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};

use crate::client::TlsMaterial;
use crate::hollow::ServerTls;
use crate::secret::SecretBytes;

/// The file names [`TestPki::write_to`] writes and [`TestPki::read_from`] reads.
pub const FILES: [&str; 5] = [
    "ca.crt",
    "server.crt",
    "server.key",
    "client.crt",
    "client.key",
];

/// A CA with one server and one client certificate, PEM-encoded.
#[derive(Clone)]
pub struct TestPki {
    /// The CA certificate.
    pub ca_cert_pem: String,
    /// The server certificate (SANs `127.0.0.1`, `::1`, `localhost`).
    pub server_cert_pem: String,
    /// The server's private key.
    pub server_key_pem: SecretBytes,
    /// The client certificate.
    pub client_cert_pem: String,
    /// The client's private key.
    pub client_key_pem: SecretBytes,
}

impl std::fmt::Debug for TestPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestPki").finish_non_exhaustive()
    }
}

/// Generating or storing a [`TestPki`] failed.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// rcgen refused to build a certificate.
    #[error("generating certificates: {0}")]
    Generate(#[from] rcgen::Error),
    /// Reading or writing a PEM file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
}

impl TestPki {
    /// Generates a fresh CA, server and client certificate.
    pub fn generate() -> Result<TestPki, PkiError> {
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.distinguished_name = name("capmvm hollow flintlock CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;

        let mut server_params = CertificateParams::new(vec![
            "127.0.0.1".to_owned(),
            "::1".to_owned(),
            "localhost".to_owned(),
        ])?;
        server_params.distinguished_name = name("hollow flintlock host");
        server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        server_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let server_key = KeyPair::generate()?;
        let server_cert = server_params.signed_by(&server_key, &ca)?;

        let mut client_params = CertificateParams::new(Vec::<String>::new())?;
        client_params.distinguished_name = name("capmvm");
        client_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        client_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let client_key = KeyPair::generate()?;
        let client_cert = client_params.signed_by(&client_key, &ca)?;

        Ok(TestPki {
            ca_cert_pem: ca.pem(),
            server_cert_pem: server_cert.pem(),
            server_key_pem: SecretBytes::new(server_key.serialize_pem().into_bytes()),
            client_cert_pem: client_cert.pem(),
            client_key_pem: SecretBytes::new(client_key.serialize_pem().into_bytes()),
        })
    }

    /// What a client needs: the CA, plus the client certificate and key when `mtls`.
    pub fn client_tls(&self, mtls: bool) -> TlsMaterial {
        TlsMaterial {
            ca_pem: Some(self.ca_cert_pem.clone().into_bytes()),
            client_cert_pem: mtls.then(|| self.client_cert_pem.clone().into_bytes()),
            client_key_pem: mtls.then(|| self.client_key_pem.clone()),
        }
    }

    /// What a hollow host needs: its certificate and key, plus the CA for client certificates
    /// that are required when `require_client_cert`.
    pub fn server_tls(&self, require_client_cert: bool) -> ServerTls {
        ServerTls {
            cert_pem: self.server_cert_pem.clone().into_bytes(),
            key_pem: self.server_key_pem.clone(),
            client_ca_pem: require_client_cert.then(|| self.ca_cert_pem.clone().into_bytes()),
            require_client_cert,
        }
    }

    /// Writes the five PEM files into `dir` (created if missing). Key files are made readable by
    /// the owner only.
    pub fn write_to(&self, dir: &Path) -> Result<(), PkiError> {
        std::fs::create_dir_all(dir).map_err(|source| io_error(dir, source))?;
        let contents: [&[u8]; 5] = [
            self.ca_cert_pem.as_bytes(),
            self.server_cert_pem.as_bytes(),
            self.server_key_pem.expose(),
            self.client_cert_pem.as_bytes(),
            self.client_key_pem.expose(),
        ];
        for (file, content) in FILES.iter().zip(contents) {
            let path = dir.join(file);
            std::fs::write(&path, content).map_err(|source| io_error(&path, source))?;
            if file.ends_with(".key") {
                restrict_to_owner(&path)?;
            }
        }
        Ok(())
    }

    /// Reads the five PEM files from `dir`.
    pub fn read_from(dir: &Path) -> Result<TestPki, PkiError> {
        let read = |file: &str| {
            let path = dir.join(file);
            std::fs::read(&path).map_err(|source| io_error(&path, source))
        };
        let text =
            |file: &str| read(file).map(|bytes| String::from_utf8_lossy(&bytes).into_owned());
        Ok(TestPki {
            ca_cert_pem: text("ca.crt")?,
            server_cert_pem: text("server.crt")?,
            server_key_pem: SecretBytes::new(read("server.key")?),
            client_cert_pem: text("client.crt")?,
            client_key_pem: SecretBytes::new(read("client.key")?),
        })
    }

    /// Whether `dir` holds all five files.
    pub fn exists_in(dir: &Path) -> bool {
        FILES.iter().all(|file| dir.join(file).is_file())
    }
}

fn name(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name
}

fn io_error(path: &Path, source: std::io::Error) -> PkiError {
    PkiError::Io {
        path: path.display().to_string(),
        source,
    }
}

#[cfg(unix)]
fn restrict_to_owner(path: &Path) -> Result<(), PkiError> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|source| io_error(path, source))
}

#[cfg(not(unix))]
fn restrict_to_owner(_path: &Path) -> Result<(), PkiError> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_reads_back_the_same_files() {
        let pki = TestPki::generate().unwrap();
        let dir = std::env::temp_dir().join(format!("capmvm-pki-test-{}", std::process::id()));
        pki.write_to(&dir).unwrap();
        assert!(TestPki::exists_in(&dir));
        let back = TestPki::read_from(&dir).unwrap();
        assert_eq!(back.ca_cert_pem, pki.ca_cert_pem);
        assert_eq!(back.client_key_pem, pki.client_key_pem);
        assert!(
            back.server_cert_pem
                .starts_with("-----BEGIN CERTIFICATE-----")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
