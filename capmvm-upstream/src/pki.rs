//! Certificates for loopback clusters: a CA per cluster, serving certificates for 127.0.0.x, client
//! certificates whose organisation is the Kubernetes group (`system:masters` for an administrator).

use std::net::IpAddr;
use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};

use crate::{Result, io_error};

/// A certificate and its private key, PEM-encoded.
#[derive(Clone)]
pub struct KeyPairPem {
    /// The certificate.
    pub cert: String,
    /// The private key (PKCS#8).
    pub key: String,
}

impl std::fmt::Debug for KeyPairPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyPairPem").finish_non_exhaustive()
    }
}

impl KeyPairPem {
    /// Writes `<stem>.crt` and `<stem>.key` (owner-only) into `dir`.
    pub fn write(&self, dir: &Path, stem: &str) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(io_error(dir))?;
        let cert = dir.join(format!("{stem}.crt"));
        std::fs::write(&cert, &self.cert).map_err(io_error(&cert))?;
        write_private(&dir.join(format!("{stem}.key")), self.key.as_bytes())
    }
}

/// A certificate authority.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    key_pem: String,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

impl Ca {
    /// A new self-signed CA named `common_name`.
    pub fn generate(common_name: &str) -> Result<Ca> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = name(common_name, &[]);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate()?;
        let key_pem = key.serialize_pem();
        let issuer = CertifiedIssuer::self_signed(params, key)?;
        Ok(Ca { issuer, key_pem })
    }

    /// The CA's certificate and key.
    pub fn pem(&self) -> KeyPairPem {
        KeyPairPem {
            cert: self.issuer.pem(),
            key: self.key_pem.clone(),
        }
    }

    /// The CA's certificate.
    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// A serving certificate for `ips` and `dns_names`.
    pub fn issue_server(
        &self,
        common_name: &str,
        ips: &[IpAddr],
        dns_names: &[&str],
    ) -> Result<KeyPairPem> {
        let mut params =
            CertificateParams::new(dns_names.iter().map(|d| d.to_string()).collect::<Vec<_>>())?;
        params
            .subject_alt_names
            .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
        params.distinguished_name = name(common_name, &[]);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        self.sign(params)
    }

    /// A client certificate for user `common_name` in the groups `organizations`.
    pub fn issue_client(&self, common_name: &str, organizations: &[&str]) -> Result<KeyPairPem> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = name(common_name, organizations);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> Result<KeyPairPem> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(KeyPairPem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}

/// A key pair for signing service account tokens (ECDSA P-256): the private key (PKCS#8 PEM) and
/// the public key (PEM), which kube-apiserver reads from a file of its own.
pub fn service_account_key() -> Result<(String, String)> {
    let key = KeyPair::generate()?;
    Ok((key.serialize_pem(), key.public_key_pem()))
}

fn name(common_name: &str, organizations: &[&str]) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    for org in organizations {
        name.push(DnType::OrganizationName, *org);
    }
    name
}

/// Writes a private key readable by its owner only.
pub fn write_private(path: &Path, contents: &[u8]) -> Result<()> {
    std::fs::write(path, contents).map_err(io_error(path))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(io_error(path))?;
    }
    Ok(())
}
