//! Command-line flags, named as CAPI providers name them so operators' muscle memory works.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

/// The capmvm operator: a Cluster API infrastructure provider for microVMs on flintlock hosts.
#[derive(Parser, Debug, Clone)]
#[command(version, about)]
pub struct Flags {
    /// Path to a kubeconfig. Without it: $KUBECONFIG (a `:`-separated list is merged, as kubectl
    /// does), ~/.kube/config, then the in-cluster service account.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,

    /// Watch only this namespace (default: all namespaces).
    #[arg(long, default_value = "")]
    pub namespace: String,

    /// Reconcile only objects labelled cluster.x-k8s.io/watch-filter=<value> (default: all).
    #[arg(long, default_value = "")]
    pub watch_filter: String,

    /// Run the controllers only while holding the leader Lease.
    #[arg(long)]
    pub leader_elect: bool,

    /// How long a leader's Lease is valid without renewal.
    #[arg(long, default_value = "15s", value_parser = parse_positive_duration)]
    pub leader_elect_lease_duration: Duration,

    /// How long the leader keeps trying to renew before it gives up (and exits).
    #[arg(long, default_value = "10s", value_parser = parse_positive_duration)]
    pub leader_elect_renew_deadline: Duration,

    /// How often candidates try to acquire, and the leader renews, the Lease.
    #[arg(long, default_value = "2s", value_parser = parse_positive_duration)]
    pub leader_elect_retry_period: Duration,

    /// Namespace of the leader Lease (default: --namespace, else the pod's namespace, else default).
    #[arg(long, default_value = "")]
    pub leader_election_namespace: String,

    /// Name of the leader Lease.
    #[arg(long, default_value = "controller-leader-elect-capmvm")]
    pub leader_election_id: String,

    /// MicrovmClusters reconciled at once.
    #[arg(long, default_value_t = 10)]
    pub microvmcluster_concurrency: u16,

    /// MicrovmMachines reconciled at once.
    #[arg(long, default_value_t = 50)]
    pub microvmmachine_concurrency: u16,

    /// MicrovmMachineTemplates reconciled at once.
    #[arg(long, default_value_t = 10)]
    pub microvmmachinetemplate_concurrency: u16,

    /// MicrovmMachinePools reconciled at once.
    #[arg(long, default_value_t = 10)]
    pub microvmmachinepool_concurrency: u16,

    /// Reconcile every object at least this often, even without a change (past its first two
    /// minutes, or this period if shorter: a new object is reconciled on its changes). One timer
    /// serves all objects, a slice of them at a time.
    #[arg(long, default_value = "10m", value_parser = parse_positive_duration)]
    pub sync_period: Duration,

    /// How long each watch request lasts before the API server ends it and it is renewed. A watch
    /// cache without a successful list, watch or event for twice this long makes /readyz fail,
    /// naming it (a CRD removed, RBAC taken away), until its watch succeeds again.
    #[arg(long, default_value = "60s", value_parser = parse_positive_duration)]
    pub watch_timeout: Duration,

    /// How often each flintlock host is listed.
    #[arg(long, default_value = "10s", value_parser = parse_positive_duration)]
    pub host_poll_interval: Duration,

    /// How often a host is listed while a microVM on it is being created or deleted.
    #[arg(long, default_value = "1s", value_parser = parse_positive_duration)]
    pub host_poll_interval_busy: Duration,

    /// Deadline of each flintlock call.
    #[arg(long, default_value = "10s", value_parser = parse_positive_duration)]
    pub flintlock_call_timeout: Duration,

    /// Address of the Prometheus /metrics endpoint (plain HTTP; empty disables it).
    #[arg(long, default_value = ":8443")]
    pub diagnostics_address: String,

    /// Accepted for compatibility with CAPI providers' manifests; metrics are served over plain HTTP.
    #[arg(long, hide = true)]
    pub insecure_diagnostics: bool,

    /// Port of the conversion webhook (HTTPS, `POST /convert`); 0 disables it. The API server calls it
    /// to serve MicrovmClusters, MicrovmMachines and MicrovmMachineTemplates at v1alpha1.
    #[arg(long, default_value_t = 9443)]
    pub webhook_port: u16,

    /// Directory with the webhook's serving certificate, `tls.crt` and `tls.key` (cert-manager's
    /// Secret, mounted). Re-read when the files change. Given explicitly, the files must be there;
    /// by default (/tmp/k8s-webhook-server/serving-certs) their absence only leaves the webhook off.
    #[arg(long)]
    pub webhook_cert_dir: Option<PathBuf>,

    /// Address of /healthz and /readyz (empty disables it).
    #[arg(long, default_value = ":9440")]
    pub health_addr: String,

    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Json)]
    pub log_format: LogFormat,

    /// Log level or tracing filter (for example `info`, `debug`, `capmvm_operator=debug,info`).
    #[arg(long, default_value = "info", env = "CAPMVM_LOG")]
    pub log_level: String,

    /// Generate manifests instead of running.
    #[command(subcommand)]
    pub command: Option<Command>,
}

impl Flags {
    /// Checks what no single flag's parser can: the leader-election periods must nest as client-go
    /// requires (lease duration > renew deadline > retry period), or a healthy leader could lose its
    /// lease between two renewals.
    pub fn check(&self) -> Result<(), String> {
        if self.leader_elect
            && !(self.leader_elect_lease_duration > self.leader_elect_renew_deadline
                && self.leader_elect_renew_deadline > self.leader_elect_retry_period)
        {
            return Err(format!(
                "--leader-elect-lease-duration ({:?}) must be longer than --leader-elect-renew-deadline ({:?}), which must be longer than --leader-elect-retry-period ({:?})",
                self.leader_elect_lease_duration,
                self.leader_elect_renew_deadline,
                self.leader_elect_retry_period
            ));
        }
        // A manifest filled by a tool that ignores `${VAR:=default}` (GNU gettext's envsubst) passes
        // the text through; as a watch filter it would silently match no object.
        for (flag, value) in [
            ("--namespace", &self.namespace),
            ("--watch-filter", &self.watch_filter),
            (
                "--leader-election-namespace",
                &self.leader_election_namespace,
            ),
            ("--log-level", &self.log_level),
        ] {
            if value.contains("${") {
                return Err(format!(
                    "{flag} is {value:?}, an unfilled clusterctl variable: install with clusterctl (or `clusterctl generate yaml`), or an envsubst that applies ${{VAR:=default}} such as drone/envsubst, or set every variable"
                ));
            }
        }
        Ok(())
    }
}

/// Subcommands.
#[derive(Subcommand, Debug, Clone)]
pub enum Command {
    /// Print the ClusterRole with exactly the permissions the operator uses.
    Rbac,
    /// Print infrastructure-components.yaml: what clusterctl (or `kubectl apply`) installs.
    Components,
    /// Print config/manager/manager.yaml: the operator's Deployment.
    Manager,
    /// Rewrite every MicrovmCluster, MicrovmMachine and MicrovmMachineTemplate at the storage version
    /// (v1alpha2), then record v1alpha2 as the only stored version of their CRDs: the last step of a
    /// move from the Go provider (needs the conversion webhook serving; idempotent).
    MigrateStorage,
}

/// Log output format.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable lines.
    Text,
}

/// Longest duration a flag accepts: far beyond any sensible period, and safe to add to an `Instant`.
const MAX_FLAG_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);

/// Like [`parse_duration`], refusing zero: every duration flag is a period or a deadline, and zero
/// would make a loop spin (a poll, a resync, a lease retry).
pub fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(format!(
            "{s:?} is zero; give a positive duration such as 1s"
        ));
    }
    Ok(d)
}

/// Parses `90s`, `15m`, `1h`, `500ms`, `1h30m` or a number of seconds, at most a year.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let too_long = || format!("{s:?} is longer than a year; give a shorter duration");
    if let Ok(secs) = s.parse::<u64>() {
        let d = Duration::from_secs(secs);
        return if d > MAX_FLAG_DURATION {
            Err(too_long())
        } else {
            Ok(d)
        };
    }
    if s.is_empty() {
        return Err("an empty duration; write for example 30s, 10m or 1h30m".to_string());
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(digits);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let n: f64 = number
            .parse()
            .map_err(|_| format!("{s:?} is not a duration; write for example 30s, 10m or 1h30m"))?;
        let secs = match unit {
            "ms" => n / 1000.0,
            "s" => n,
            "m" => n * 60.0,
            "h" => n * 3600.0,
            _ => return Err(format!("{s:?} has unit {unit:?}; use ms, s, m or h")),
        };
        let part = Duration::try_from_secs_f64(secs).map_err(|_| too_long())?;
        total = total
            .checked_add(part)
            .filter(|t| *t <= MAX_FLAG_DURATION)
            .ok_or_else(too_long)?;
        rest = tail;
    }
    Ok(total)
}

/// Parses `:8443`, `0.0.0.0:8443` or `127.0.0.1:0` into a socket address; empty means disabled.
pub fn parse_listen_addr(s: &str) -> Result<Option<SocketAddr>, String> {
    if s.is_empty() {
        return Ok(None);
    }
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_string()
    };
    full.parse()
        .map(Some)
        .map_err(|_| format!("{s:?} is not a listen address; write :PORT or HOST:PORT"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert!(parse_duration("10 minutes").is_err());
        assert!(parse_duration("x").is_err());
        assert!(parse_duration("").is_err());
        // Huge values are refused, never a panic.
        for huge in ["99999999999999999999s", "18446744073709551615", "9999999h"] {
            let err = parse_duration(huge).unwrap_err();
            assert!(err.contains("longer than a year"), "{huge}: {err}");
        }
        assert!(parse_duration("-1s").is_err());
        // Zero is a valid duration but not a valid period.
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert!(parse_positive_duration("0s").unwrap_err().contains("zero"));
        assert!(parse_positive_duration("0").is_err());
    }

    #[test]
    fn an_unfilled_manifest_variable_is_refused_with_its_flag() {
        let flags =
            Flags::try_parse_from(["capmvm-operator", "--watch-filter=${CAPMVM_WATCH_FILTER:=}"])
                .unwrap();
        let err = flags.check().unwrap_err();
        assert!(
            err.starts_with(
                "--watch-filter is \"${CAPMVM_WATCH_FILTER:=}\", an unfilled clusterctl variable"
            ),
            "{err}"
        );
        let filled = Flags::try_parse_from(["capmvm-operator", "--watch-filter="]).unwrap();
        assert_eq!(filled.check(), Ok(()));
    }

    #[test]
    fn leader_election_periods_must_nest() {
        let ok = Flags::try_parse_from(["capmvm-operator", "--leader-elect"]).unwrap();
        assert_eq!(ok.check(), Ok(()));
        let bad = Flags::try_parse_from([
            "capmvm-operator",
            "--leader-elect",
            "--leader-elect-lease-duration=5s",
            "--leader-elect-renew-deadline=10s",
        ])
        .unwrap();
        let err = bad.check().unwrap_err();
        assert!(err.contains("--leader-elect-renew-deadline"), "{err}");
    }

    #[test]
    fn zero_periods_are_refused_with_the_flag_named() {
        for flag in [
            "--sync-period=0",
            "--host-poll-interval=0s",
            "--host-poll-interval-busy=0ms",
            "--leader-elect-retry-period=0",
            "--flintlock-call-timeout=0s",
        ] {
            let err = Flags::try_parse_from(["capmvm-operator", flag])
                .unwrap_err()
                .to_string();
            let name = flag.split('=').next().unwrap();
            assert!(err.contains(name) && err.contains("zero"), "{err}");
        }
    }

    #[test]
    fn listen_addresses() {
        assert_eq!(parse_listen_addr(":9440").unwrap().unwrap().port(), 9440);
        assert_eq!(parse_listen_addr("").unwrap(), None);
        assert!(parse_listen_addr("nope").is_err());
    }

    #[test]
    fn flags_parse_like_capi_providers() {
        let f = Flags::try_parse_from([
            "capmvm-operator",
            "--leader-elect",
            "--watch-filter=team-a",
            "--microvmmachine-concurrency=5",
            "--sync-period=5m",
            "--log-format=text",
        ])
        .unwrap();
        assert!(f.leader_elect);
        assert_eq!(f.watch_filter, "team-a");
        assert_eq!(f.microvmmachine_concurrency, 5);
        assert_eq!(f.sync_period, Duration::from_secs(300));
        assert_eq!(f.log_format, LogFormat::Text);
    }
}
