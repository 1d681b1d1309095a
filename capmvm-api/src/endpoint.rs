//! Flintlock host endpoints: `host:port`, with IPv6 literals written `[addr]:port`.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::str::FromStr;

/// The address of one flintlock host, as written in `placement.staticPool.hosts[].endpoint`.
///
/// The canonical text form (its `Display`) is what goes into providerIDs, failure-domain names and the
/// `vm_host` meta-data key, so parsing then printing an endpoint never changes it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostEndpoint {
    host: Host,
    port: u16,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Host {
    /// A DNS name or an IPv4 literal, exactly as written.
    Name(String),
    Ipv6(Ipv6Addr),
}

/// Why a string is not a `host:port` endpoint.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    /// The string is empty.
    #[error("is empty; write host:port, for example 10.0.0.5:9090")]
    Empty,
    /// No `:port` suffix.
    #[error("has no port; write host:port, for example 10.0.0.5:9090")]
    MissingPort,
    /// The port is not a number in 1..=65535.
    #[error("has port {0:?}, which is not a number between 1 and 65535")]
    BadPort(String),
    /// An IPv6 address without brackets, such as `::1:9090`.
    #[error(
        "looks like an IPv6 address without brackets; write [addr]:port, for example [fd00::5]:9090"
    )]
    UnbracketedIpv6,
    /// Bracketed text that is not an IPv6 address.
    #[error("has {0:?} in brackets, which is not an IPv6 address")]
    BadIpv6(String),
    /// A URL such as `http://host:9090` where `host:port` is expected.
    #[error("is a URL; write host:port without a scheme, for example 10.0.0.5:9090")]
    Url,
    /// A host part with characters a DNS name or IPv4 address cannot hold.
    #[error("has host {0:?}, which is not a DNS name or IP address")]
    BadHost(String),
}

impl HostEndpoint {
    /// The host part without brackets: a DNS name, an IPv4 or an IPv6 address.
    pub fn host(&self) -> String {
        match &self.host {
            Host::Name(name) => name.clone(),
            Host::Ipv6(addr) => addr.to_string(),
        }
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The IP address, when the host is an IP literal (used as TLS server name and to skip DNS).
    pub fn ip(&self) -> Option<IpAddr> {
        match &self.host {
            Host::Name(name) => name.parse().ok(),
            Host::Ipv6(addr) => Some(IpAddr::V6(*addr)),
        }
    }

    /// The key under which this host's basic-auth token is stored in the `basicAuthSecret` Secret.
    ///
    /// It is the host without the port, as in the Go provider. Secret keys may not contain `:`, so an
    /// IPv6 address has each `:` replaced by `-` (`fd00::5` is looked up as `fd00--5`).
    pub fn secret_key(&self) -> String {
        self.host().replace(':', "-")
    }

    /// The `http://host:port` URI a gRPC channel dials.
    pub fn http_uri(&self) -> String {
        format!("http://{self}")
    }

    /// The `https://host:port` URI a TLS gRPC channel dials.
    pub fn https_uri(&self) -> String {
        format!("https://{self}")
    }
}

impl fmt::Display for HostEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Host::Name(name) => write!(f, "{name}:{}", self.port),
            Host::Ipv6(addr) => write!(f, "[{addr}]:{}", self.port),
        }
    }
}

impl FromStr for HostEndpoint {
    type Err = EndpointError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            return Err(EndpointError::Empty);
        }
        if s.contains("://") {
            return Err(EndpointError::Url);
        }
        if let Some(rest) = s.strip_prefix('[') {
            let (addr, after) = rest
                .split_once(']')
                .ok_or_else(|| EndpointError::BadIpv6(rest.to_string()))?;
            let addr: Ipv6Addr = addr
                .parse()
                .map_err(|_| EndpointError::BadIpv6(addr.to_string()))?;
            let port = after.strip_prefix(':').ok_or(EndpointError::MissingPort)?;
            return Ok(Self {
                host: Host::Ipv6(addr),
                port: parse_port(port)?,
            });
        }
        let (host, port) = s.rsplit_once(':').ok_or(EndpointError::MissingPort)?;
        if host.contains(':') {
            return Err(EndpointError::UnbracketedIpv6);
        }
        if !is_host_name(host) {
            return Err(EndpointError::BadHost(host.to_string()));
        }
        Ok(Self {
            host: Host::Name(host.to_string()),
            port: parse_port(port)?,
        })
    }
}

fn parse_port(port: &str) -> Result<u16, EndpointError> {
    match port.parse::<u16>() {
        Ok(p) if p > 0 && port.bytes().all(|b| b.is_ascii_digit()) => Ok(p),
        _ => Err(EndpointError::BadPort(port.to_string())),
    }
}

/// A DNS name (RFC 1123 labels, any case) or an IPv4 literal.
fn is_host_name(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_every_form() {
        for s in [
            "10.0.0.5:9090",
            "host-a.example.com:443",
            "[fd00::5]:9090",
            "[::1]:1",
        ] {
            let e: HostEndpoint = s.parse().unwrap();
            assert_eq!(e.to_string(), s);
        }
    }

    #[test]
    fn ipv6_host_and_secret_key() {
        let e: HostEndpoint = "[fd00::5]:9090".parse().unwrap();
        assert_eq!(e.host(), "fd00::5");
        assert_eq!(e.secret_key(), "fd00--5");
        assert_eq!(e.port(), 9090);
        let v4: HostEndpoint = "10.0.0.5:9090".parse().unwrap();
        assert_eq!(v4.secret_key(), "10.0.0.5");
        assert!(v4.ip().is_some());
    }

    #[test]
    fn rejects_bad_endpoints_with_a_reason() {
        assert_eq!("".parse::<HostEndpoint>(), Err(EndpointError::Empty));
        assert_eq!(
            "host".parse::<HostEndpoint>(),
            Err(EndpointError::MissingPort)
        );
        assert_eq!(
            "::1:9090".parse::<HostEndpoint>(),
            Err(EndpointError::UnbracketedIpv6)
        );
        assert!(matches!(
            "h:0".parse::<HostEndpoint>(),
            Err(EndpointError::BadPort(_))
        ));
        assert!(matches!(
            "h:+80".parse::<HostEndpoint>(),
            Err(EndpointError::BadPort(_))
        ));
        assert!(matches!(
            "h:70000".parse::<HostEndpoint>(),
            Err(EndpointError::BadPort(_))
        ));
        assert!(matches!(
            "[zz]:1".parse::<HostEndpoint>(),
            Err(EndpointError::BadIpv6(_))
        ));
        assert!(matches!(
            "a b:1".parse::<HostEndpoint>(),
            Err(EndpointError::BadHost(_))
        ));
        assert_eq!(
            "http://h:1".parse::<HostEndpoint>(),
            Err(EndpointError::Url)
        );
    }
}
