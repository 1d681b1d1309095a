//! Dialling one host: the endpoint and proxy parsed, TCP (through an HTTP CONNECT proxy when
//! configured), then TLS 1.3 with rustls when TLS material is given, all within the connect timeout.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;

use super::TlsMaterial;
use crate::error::Error;

/// A `host:port` split into its parts.
#[derive(Debug, Clone)]
pub(super) struct Authority {
    /// As given: `host:port` or `[v6]:port`.
    pub(super) authority: String,
    /// The host without brackets: the TLS server name.
    pub(super) host: String,
}

impl Authority {
    pub(super) fn parse(text: &str) -> Result<Authority, String> {
        if text.contains("://") {
            return Err("expected host:port without a scheme".to_owned());
        }
        let (host, port) = text.rsplit_once(':').ok_or("expected host:port")?;
        if port.is_empty() || port.parse::<u16>().is_err() {
            return Err("the port is not a number from 0 to 65535".to_owned());
        }
        let host = if let Some(inner) = host.strip_prefix('[') {
            let inner = inner
                .strip_suffix(']')
                .ok_or("an IPv6 address needs a closing ']'")?;
            inner
                .parse::<std::net::Ipv6Addr>()
                .map_err(|_| "the bracketed host is not an IPv6 address".to_owned())?;
            inner
        } else {
            if host.contains(':') {
                return Err("write IPv6 addresses as [address]:port".to_owned());
            }
            host
        };
        if host.is_empty() {
            return Err("the host is empty".to_owned());
        }
        if host
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '/' | '@' | '?' | '#'))
        {
            return Err("the host contains characters not allowed in a host name".to_owned());
        }
        Ok(Authority {
            authority: text.to_owned(),
            host: host.to_owned(),
        })
    }
}

pub(super) fn parse_proxy(text: &str) -> Result<Authority, String> {
    let rest = match text.split_once("://") {
        Some(("http", rest)) => rest,
        Some(_) => return Err("only http:// proxies (HTTP CONNECT) are supported".to_owned()),
        None => text,
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains('@') {
        return Err("proxy credentials in the address are not supported".to_owned());
    }
    Authority::parse(rest)
}

pub(super) fn tls_connector(
    tls: &TlsMaterial,
    target: &Authority,
) -> Result<(tokio_rustls::TlsConnector, ServerName<'static>), Error> {
    let ca = tls
        .ca_pem
        .as_deref()
        .ok_or_else(|| Error::invalid_config("TLS needs a CA bundle (ca.crt)"))?;
    let mut roots = rustls::RootCertStore::empty();
    let mut found = 0usize;
    for cert in CertificateDer::pem_slice_iter(ca) {
        let cert =
            cert.map_err(|err| Error::invalid_config(format!("CA bundle (ca.crt): {err}")))?;
        roots
            .add(cert)
            .map_err(|err| Error::invalid_config(format!("CA bundle (ca.crt): {err}")))?;
        found += 1;
    }
    if found == 0 {
        return Err(Error::invalid_config(
            "CA bundle (ca.crt): no PEM certificate found",
        ));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|err| Error::invalid_config(format!("TLS: {err}")))?
        .with_root_certificates(roots);
    let mut config = match (&tls.client_cert_pem, &tls.client_key_pem) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|err| {
                    Error::invalid_config(format!("client certificate (tls.crt): {err}"))
                })?;
            if chain.is_empty() {
                return Err(Error::invalid_config(
                    "client certificate (tls.crt): no PEM certificate found",
                ));
            }
            // The parse error of a key is not shown: it could quote key material.
            let key = PrivateKeyDer::from_pem_slice(key.expose()).map_err(|_| {
                Error::invalid_config("client key (tls.key): not a PEM private key")
            })?;
            builder.with_client_auth_cert(chain, key).map_err(|err| {
                Error::invalid_config(format!("client certificate and key: {err}"))
            })?
        }
        (None, None) => builder.with_no_client_auth(),
        (Some(_), None) => {
            return Err(Error::invalid_config(
                "a client certificate (tls.crt) needs its key (tls.key)",
            ));
        }
        (None, Some(_)) => {
            return Err(Error::invalid_config(
                "a client key (tls.key) needs its certificate (tls.crt)",
            ));
        }
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    let server_name = ServerName::try_from(target.host.clone()).map_err(|err| {
        Error::invalid_config(format!("TLS server name {:?}: {err}", target.host))
    })?;
    Ok((
        tokio_rustls::TlsConnector::from(Arc::new(config)),
        server_name,
    ))
}

/// A connection to a host, plain or TLS.
pub(super) trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// Dials one host: TCP (through the proxy if any), then TLS if configured, all within the connect
/// timeout.
#[derive(Clone)]
pub(super) struct Connector {
    pub(super) target: Arc<str>,
    pub(super) proxy: Option<Arc<str>>,
    pub(super) tls: Option<(tokio_rustls::TlsConnector, ServerName<'static>)>,
    pub(super) connect_timeout: Duration,
}

impl Connector {
    pub(super) async fn connect(self) -> std::io::Result<TokioIo<Box<dyn Io>>> {
        let timeout = self.connect_timeout;
        let target = self.target.clone();
        match tokio::time::timeout(timeout, self.dial()).await {
            Ok(result) => result,
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("connecting to {target}: no connection within {timeout:?}"),
            )),
        }
    }

    async fn dial(self) -> std::io::Result<TokioIo<Box<dyn Io>>> {
        let target = &*self.target;
        let stream = match &self.proxy {
            Some(proxy) => {
                let mut stream = TcpStream::connect(&**proxy)
                    .await
                    .map_err(|err| annotate(err, format!("connecting to proxy {proxy}")))?;
                stream.set_nodelay(true)?;
                open_tunnel(&mut stream, target)
                    .await
                    .map_err(|err| annotate(err, format!("proxy {proxy}")))?;
                stream
            }
            None => {
                let stream = TcpStream::connect(target)
                    .await
                    .map_err(|err| annotate(err, format!("connecting to {target}")))?;
                stream.set_nodelay(true)?;
                stream
            }
        };
        let io: Box<dyn Io> = match self.tls {
            Some((connector, server_name)) => {
                let tls = connector
                    .connect(server_name, stream)
                    .await
                    .map_err(|err| tls_failure(err, target))?;
                Box::new(tls)
            }
            None => Box::new(stream),
        };
        Ok(TokioIo::new(io))
    }
}

fn annotate(err: std::io::Error, context: String) -> std::io::Error {
    std::io::Error::new(err.kind(), format!("{context}: {err}"))
}

/// A failed handshake, with the likely cause when it is the protocol version: rustls only names
/// the alert (`received fatal alert: ProtocolVersion`), which does not tell an operator that the
/// host is limited to TLS 1.2 while this client (like flintlockd) speaks TLS 1.3 only.
fn tls_failure(err: std::io::Error, target: &str) -> std::io::Error {
    use rustls::PeerIncompatible as Incompatible;
    let version_mismatch = err
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .is_some_and(|tls| {
            matches!(
                tls,
                rustls::Error::AlertReceived(rustls::AlertDescription::ProtocolVersion)
                    | rustls::Error::PeerIncompatible(
                        Incompatible::ServerTlsVersionIsDisabledByOurConfig
                            | Incompatible::SupportedVersionsExtensionRequired
                            | Incompatible::ServerDoesNotSupportTls12Or13
                    )
            )
        });
    let hint = if version_mismatch {
        " (the host does not offer TLS 1.3, the only version this client accepts)"
    } else {
        ""
    };
    std::io::Error::new(
        err.kind(),
        format!("TLS handshake with {target}: {err}{hint}"),
    )
}

/// Asks an HTTP proxy for a tunnel to `target` and reads its answer up to the blank line (byte by
/// byte, so no byte of the tunnelled stream is consumed).
async fn open_tunnel(stream: &mut TcpStream, target: &str) -> std::io::Result<()> {
    const MAX_HEAD: usize = 8 * 1024;
    let request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut head = Vec::with_capacity(128);
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_HEAD {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "answer to CONNECT is too long",
            ));
        }
        if stream.read(&mut byte).await? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "closed the connection before answering CONNECT",
            ));
        }
        head.push(byte[0]);
    }
    let status_line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    let status_line = String::from_utf8_lossy(status_line);
    let mut parts = status_line.split_whitespace();
    let version_ok = parts
        .next()
        .is_some_and(|version| version.starts_with("HTTP/1."));
    let code = parts.next().and_then(|code| code.parse::<u16>().ok());
    match code {
        Some(200..=299) if version_ok => Ok(()),
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            format!("refused the tunnel to {target}: {status_line}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities_parse() {
        let v4 = Authority::parse("10.0.0.5:9090").unwrap();
        assert_eq!(v4.host, "10.0.0.5");
        let v6 = Authority::parse("[fd00::5]:9090").unwrap();
        assert_eq!(v6.host, "fd00::5");
        assert_eq!(v6.authority, "[fd00::5]:9090");
        assert_eq!(
            Authority::parse("flintlock.example:9090").unwrap().host,
            "flintlock.example"
        );
        for bad in [
            "fd00::5:9090",
            "host",
            "host:",
            "host:99999",
            ":9090",
            "http://host:9090",
            "[fd00::5:9090",
            "[x]:1",
        ] {
            assert!(Authority::parse(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn proxies_parse() {
        assert_eq!(
            parse_proxy("http://proxy:3128").unwrap().authority,
            "proxy:3128"
        );
        assert_eq!(
            parse_proxy("http://proxy:3128/").unwrap().authority,
            "proxy:3128"
        );
        assert_eq!(parse_proxy("proxy:3128").unwrap().authority, "proxy:3128");
        assert!(parse_proxy("https://proxy:3128").is_err());
        let err = parse_proxy("http://user:pass@proxy:3128").unwrap_err();
        assert!(!err.contains("pass"), "{err}");
    }
}
