//! ProviderIDs: `microvm://<host endpoint>/<flintlock uid>`.
//!
//! The same string is templated into kubelet's `--provider-id` from the VM's cloud-init meta-data
//! (`microvm://{{ ds.meta_data.vm_host }}/{{ ds.meta_data.instance_id }}`), and CAPI matches Nodes to
//! Machines by exact string equality, so formatting must be stable. The last path segment is the
//! flintlock uid, which is globally unique as cluster-autoscaler requires.

use std::fmt;
use std::str::FromStr;

use crate::endpoint::{EndpointError, HostEndpoint};

/// The scheme prefix every providerID of this provider starts with.
pub const PROVIDER_ID_PREFIX: &str = "microvm://";

/// CAPI's limit on `spec.providerID`.
pub const PROVIDER_ID_MAX_LEN: usize = 512;

/// A parsed providerID: the host the microVM lives on and flintlock's uid for it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ProviderId {
    /// The flintlock host that runs the microVM.
    pub host: HostEndpoint,
    /// Flintlock's uid for the microVM (a 26-character ULID on real flintlock).
    pub uid: String,
}

/// Why a string is not a providerID of this provider.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProviderIdError {
    /// Missing `microvm://` prefix.
    #[error("does not start with {PROVIDER_ID_PREFIX}")]
    Scheme,
    /// No `/<uid>` after the endpoint.
    #[error("has no /<uid> after the host endpoint")]
    MissingUid,
    /// The uid holds characters flintlock never generates.
    #[error("has uid {0:?}, which is not a flintlock uid (letters and digits only)")]
    BadUid(String),
    /// The endpoint part does not parse.
    #[error("has a host endpoint that {0}")]
    Endpoint(#[from] EndpointError),
    /// Longer than CAPI allows.
    #[error("is longer than {PROVIDER_ID_MAX_LEN} characters")]
    TooLong,
}

impl ProviderId {
    /// Builds the providerID of microVM `uid` on `host`.
    pub fn new(host: HostEndpoint, uid: impl Into<String>) -> Self {
        Self {
            host,
            uid: uid.into(),
        }
    }
}

impl fmt::Display for ProviderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PROVIDER_ID_PREFIX}{}/{}", self.host, self.uid)
    }
}

impl FromStr for ProviderId {
    type Err = ProviderIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() > PROVIDER_ID_MAX_LEN {
            return Err(ProviderIdError::TooLong);
        }
        let rest = s
            .strip_prefix(PROVIDER_ID_PREFIX)
            .ok_or(ProviderIdError::Scheme)?;
        let (host, uid) = rest.rsplit_once('/').ok_or(ProviderIdError::MissingUid)?;
        if uid.is_empty() {
            return Err(ProviderIdError::MissingUid);
        }
        if !uid.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(ProviderIdError::BadUid(uid.to_string()));
        }
        Ok(Self {
            host: host.parse()?,
            uid: uid.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn formats_like_the_go_provider() {
        let id = ProviderId::new(
            "10.0.0.5:9090".parse().unwrap(),
            "01KE75BHT9H6D7V5YG0KYGRXX2",
        );
        assert_eq!(
            id.to_string(),
            "microvm://10.0.0.5:9090/01KE75BHT9H6D7V5YG0KYGRXX2"
        );
    }

    #[test]
    fn parses_ipv6() {
        let id: ProviderId = "microvm://[fd00::5]:9090/01KE75BHT9H6D7V5YG0KYGRXX2"
            .parse()
            .unwrap();
        assert_eq!(id.host.host(), "fd00::5");
        assert_eq!(id.uid, "01KE75BHT9H6D7V5YG0KYGRXX2");
    }

    #[test]
    fn rejects_foreign_ids() {
        assert_eq!(
            "aws:///us-east-1a/i-1".parse::<ProviderId>(),
            Err(ProviderIdError::Scheme)
        );
        assert_eq!(
            "microvm://10.0.0.5:9090".parse::<ProviderId>().unwrap_err(),
            ProviderIdError::MissingUid
        );
        assert_eq!(
            "microvm://10.0.0.5:9090/".parse::<ProviderId>(),
            Err(ProviderIdError::MissingUid)
        );
        assert!(matches!(
            "microvm://10.0.0.5/01A".parse::<ProviderId>(),
            Err(ProviderIdError::Endpoint(_))
        ));
        assert!(matches!(
            "microvm://h:1/a-b".parse::<ProviderId>(),
            Err(ProviderIdError::BadUid(_))
        ));
    }

    fn endpoint() -> impl Strategy<Value = HostEndpoint> {
        let v4 = (any::<[u8; 4]>(), 1u16..)
            .prop_map(|(o, p)| format!("{}.{}.{}.{}:{p}", o[0], o[1], o[2], o[3]));
        let v6 = (any::<[u16; 8]>(), 1u16..)
            .prop_map(|(s, p)| format!("[{}]:{p}", std::net::Ipv6Addr::from(s)));
        let dns = (
            "[a-z][a-z0-9-]{0,20}[a-z0-9](\\.[a-z][a-z0-9]{0,10}){0,3}",
            1u16..,
        )
            .prop_map(|(h, p)| format!("{h}:{p}"));
        prop_oneof![v4, v6, dns].prop_map(|s| s.parse().unwrap())
    }

    proptest! {
        #[test]
        fn round_trips(host in endpoint(), uid in "[0-9A-HJKMNP-TV-Z]{26}") {
            let id = ProviderId::new(host, uid);
            let text = id.to_string();
            prop_assert_eq!(text.parse::<ProviderId>().unwrap(), id.clone());
            // Printing the parsed form gives the same text: the Node's providerID keeps matching.
            prop_assert_eq!(text.parse::<ProviderId>().unwrap().to_string(), text);
        }
    }
}
