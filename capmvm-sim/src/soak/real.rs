//! `capmvm-sim soak --control-plane real`: the soak on the real management stack (etcd,
//! kube-apiserver, kube-controller-manager, CAPI v1.14's own core and kubeadm bootstrap managers,
//! our operator as its ServiceAccount; docs/real-stack.md). Two workload clusters, each with a
//! control plane, a MachineDeployment and a MachinePool; before each fault one of the four groups
//! is scaled, so the fault lands mid-scale. The faults ([`super::real_faults`], seeded, every one
//! logged with its time): etcd, kube-apiserver, CAPI's managers and the operator SIGKILLed and
//! restarted; a hollow flintlock host restarted (its microVMs survive); one host cut off and back
//! through a [`Link`] in front of it (the MicrovmClusters name the link, not the host). After each
//! fault the harness waits for convergence (every Machine Ready with its Node) and records how long
//! it took. When the faults stop: every Machine Ready, every Node registered; from the hosts no
//! duplicate microVM and none leaked, from the hosts and the API no finalizer released early, and
//! from the kube-apiserver's audit log no request of the operator refused by RBAC. Then both
//! clusters are deleted and the hosts must end empty.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use capmvm_api::MicrovmMachine;
use capmvm_api::capi::Machine;
use capmvm_flintlock::hollow::HostControl;
use capmvm_reconcile::machine::origin_uid;
use capmvm_upstream::AuditEvent;
use capmvm_upstream::link::Link;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::{Api, ResourceExt};

use super::monitor::{self, Findings, Monitors, Rng};
use super::real_faults::{Fault, FaultRecord, Targets, inject};
use crate::capi::MachineDeployment;
use crate::capi::workload::ClusterKey;
use crate::real::RealStack;
use crate::stack::{self, Stack};
use crate::world::{DEMO_CLUSTER, MACHINEPOOL_CLUSTER, WorldOptions, template_variables};

/// The two workload clusters: (namespace, name).
pub const CLUSTERS: [(&str, &str); 2] = [("soak-a", "alpha"), ("soak-b", "bravo")];

/// Options of the real-stack soak.
#[derive(Debug, Clone)]
pub struct RealSoakArgs {
    /// Keep injecting faults for this many minutes (and until every kind happened once).
    pub minutes: f64,
    /// Seed of the fault schedule and of the scale churn.
    pub seed: u64,
    /// Hollow flintlock hosts (the first behind the link).
    pub hosts: usize,
    /// Give up on a convergence after this many seconds.
    pub step_timeout_secs: u64,
}

/// What a real-stack soak saw.
#[derive(Debug)]
pub struct RealSoakReport {
    /// The options.
    pub args: RealSoakArgs,
    /// Time to the first convergence (both clusters created), `None` if it did not.
    pub created_in: Option<Duration>,
    /// Every fault, in order.
    pub faults: Vec<FaultRecord>,
    /// Every scale: (time from the start, what).
    pub scales: Vec<(Duration, String)>,
    /// After the faults stopped: every Machine Ready with its Node (`None`: not within the timeout).
    pub final_converged_in: Option<Duration>,
    /// Machines at the end, both clusters.
    pub final_machines: usize,
    /// Duplicates and early releases.
    pub findings: Findings,
    /// MicroVMs no MicrovmMachine accounted for once converged after the faults.
    pub orphans: Vec<String>,
    /// MicroVMs left on the hosts after both clusters were deleted.
    pub leaks: Vec<String>,
    /// Both clusters deleted and the hosts empty in this time (`None`: not within the timeout).
    pub deleted_in: Option<Duration>,
    /// The operator's requests in the audit log, and those RBAC refused.
    pub operator_requests: u64,
    /// Requests of the operator refused by RBAC (`verb uri`), outside the management API
    /// server's restarts.
    pub denials: Vec<String>,
    /// Requests of the operator refused while the management kube-apiserver was starting (it
    /// serves before its RBAC authorizer has loaded the roles; `/readyz` says so): each for a
    /// verb and resource the same operator was allowed outside those windows.
    pub denials_while_starting: Vec<String>,
    /// The load average when the run ended.
    pub load: String,
    /// Wall time of the whole run.
    pub total: Duration,
    /// Where the logs are (kept when the run fails).
    pub dir: PathBuf,
}

impl RealSoakReport {
    /// What went wrong; empty when the run proved its point.
    pub fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.created_in.is_none() {
            out.push("the clusters never became Ready".to_string());
        }
        for f in &self.faults {
            if f.converged_in.is_none() {
                out.push(format!(
                    "no convergence after {} at {:.0} s",
                    f.fault,
                    f.at.as_secs_f64()
                ));
            }
        }
        if self.created_in.is_some() {
            for kind in Fault::ALL {
                if !self.faults.iter().any(|f| f.fault == kind) {
                    out.push(format!("no {kind} happened"));
                }
            }
        }
        if self.final_converged_in.is_none() {
            out.push("not every Machine Ready with its Node after the faults".to_string());
        }
        if !self.findings.duplicates.is_empty() {
            out.push(format!(
                "{} duplicate microVM(s)",
                self.findings.duplicate_vms()
            ));
        }
        if !self.findings.early_releases.is_empty() {
            out.push(format!(
                "{} finalizer(s) released before the microVM was gone",
                self.findings.early_releases.len()
            ));
        }
        if !self.orphans.is_empty() || !self.leaks.is_empty() {
            out.push(format!(
                "{} microVM(s) leaked",
                self.orphans.len() + self.leaks.len()
            ));
        }
        if self.deleted_in.is_none() {
            out.push("the clusters' deletion did not finish".to_string());
        }
        if self.operator_requests == 0 {
            out.push("the audit log holds no request of the operator".to_string());
        }
        if !self.denials.is_empty() {
            out.push(format!("{} authorization denial(s)", self.denials.len()));
        }
        out
    }

    /// The report as text (Markdown tables).
    pub fn render(&self) -> String {
        let secs = |d: Option<Duration>| {
            d.map_or_else(
                || "NOT CONVERGED".to_string(),
                |d| format!("{:.1}", d.as_secs_f64()),
            )
        };
        let mut s = format!(
            "real-stack soak: {} min of faults, seed {}, {} hosts, clusters {} (load at the end: {})\n\n",
            self.args.minutes,
            self.args.seed,
            self.args.hosts,
            CLUSTERS.map(|(ns, n)| format!("{ns}/{n}")).join(", "),
            self.load
        );
        s.push_str("| at (s) | fault | detail | down (s) | ready after restart (s) | converged after restart (s) |\n|---:|---|---|---:|---:|---:|\n");
        for f in &self.faults {
            s.push_str(&format!(
                "| {:.0} | {} | {} | {:.1} | {:.1} | {} |\n",
                f.at.as_secs_f64(),
                f.fault,
                f.detail,
                f.down.as_secs_f64(),
                f.restored_in.as_secs_f64(),
                secs(f.converged_in)
            ));
        }
        s.push_str("\n| fault | count | down, mean / max (s) | converged after restart, mean / max (s) |\n|---|---:|---:|---:|\n");
        for kind in Fault::ALL {
            let of: Vec<&FaultRecord> = self.faults.iter().filter(|f| f.fault == kind).collect();
            if of.is_empty() {
                continue;
            }
            let (down_mean, down_max) = mean_max(of.iter().map(|f| f.down));
            let (conv_mean, conv_max) = mean_max(of.iter().filter_map(|f| f.converged_in));
            s.push_str(&format!(
                "| {kind} | {} | {down_mean:.1} / {down_max:.1} | {conv_mean:.1} / {conv_max:.1} |\n",
                of.len()
            ));
        }
        s.push_str(&format!(
            "\n| measure | value |\n|---|---:|\n| clusters created and Ready in (s) | {} |\n| scales | {} |\n| faults | {} |\n| Machines Ready with Nodes after the faults, in (s) | {} ({} Machines) |\n| duplicate microVMs | {} |\n| finalizers released early | {} |\n| leaked microVMs | {} |\n| clusters deleted, hosts empty in (s) | {} |\n| operator requests (audit log) | {} |\n| authorization denials | {} |\n| refused while kube-apiserver was starting (allowed otherwise) | {} |\n| total time | {:.0} s |\n",
            secs(self.created_in),
            self.scales.len(),
            self.faults.len(),
            secs(self.final_converged_in),
            self.final_machines,
            self.findings.duplicate_vms(),
            self.findings.early_releases.len(),
            self.orphans.len() + self.leaks.len(),
            secs(self.deleted_in),
            self.operator_requests,
            self.denials.len(),
            self.denials_while_starting.len(),
            self.total.as_secs_f64()
        ));
        for (uid, vms) in &self.findings.duplicates {
            s.push_str(&format!("duplicate: machine {uid}: {vms:?}\n"));
        }
        for r in &self.findings.early_releases {
            s.push_str(&format!("early release: {r}\n"));
        }
        for l in self.orphans.iter().chain(&self.leaks) {
            s.push_str(&format!("leak: {l}\n"));
        }
        for d in &self.denials {
            s.push_str(&format!("denied: {d}\n"));
        }
        for d in &self.denials_while_starting {
            s.push_str(&format!("refused while kube-apiserver was starting: {d}\n"));
        }
        let failures = self.failures();
        if failures.is_empty() {
            s.push_str("\nresult: PASS\n");
        } else {
            s.push_str(&format!(
                "\nresult: FAIL: {} (logs in {})\n",
                failures.join("; "),
                self.dir.display()
            ));
        }
        s
    }
}

fn mean_max(values: impl Iterator<Item = Duration>) -> (f64, f64) {
    let v: Vec<f64> = values.map(|d| d.as_secs_f64()).collect();
    if v.is_empty() {
        return (0.0, 0.0);
    }
    (
        v.iter().sum::<f64>() / v.len() as f64,
        v.iter().copied().fold(0.0, f64::max),
    )
}

/// The scalable groups of one cluster: (resource, name).
fn groups(cluster: &str) -> [(ApiResource, String); 2] {
    [
        (
            ApiResource::erase::<MachineDeployment>(&()),
            format!("{cluster}-md-0"),
        ),
        (
            crate::capi::machinepool::machine_pool_resource(),
            format!("{cluster}-mp-0"),
        ),
    ]
}

/// Runs the real-stack soak; `exe` runs the operator (`capmvm-sim operator`).
pub async fn run(args: RealSoakArgs, exe: PathBuf) -> anyhow::Result<RealSoakReport> {
    let started = Instant::now();
    let mut options = WorldOptions::new(args.hosts.max(2), Duration::from_millis(500), exe);
    options.operator_flags = vec![
        "--host-poll-interval=2s".to_string(),
        "--host-poll-interval-busy=200ms".to_string(),
        format!(
            "--log-level={}",
            std::env::var("CAPMVM_SOAK_LOG").unwrap_or_else(|_| "info".to_string())
        ),
    ];
    let mut real = RealStack::start(options).await?;
    let dir = real.dir.clone();
    let log = move |line: String| {
        eprintln!("soak {:>7.1} s: {line}", started.elapsed().as_secs_f64());
    };
    log(format!("stack up, logs in {}", dir.display()));
    real.start_operator(&[])?;
    let hosts: Vec<HostControl> = real.hosts.iter().map(|h| h.control()).collect();
    let target: SocketAddr = real.hosts[0]
        .endpoint()
        .parse()
        .context("the first host's endpoint")?;
    let link = Link::start(target).await.context("starting the link")?;
    let mut endpoints = real.endpoints();
    endpoints[0] = link.address().to_string();
    let flintlock_hosts = template_variables(&endpoints)
        .remove("FLINTLOCK_HOSTS")
        .context("FLINTLOCK_HOSTS")?;
    let monitors = Monitors::start(Api::all(real.client.clone()), hosts.clone());

    // Desired replicas per (namespace, group name).
    let mut desired: BTreeMap<(String, String), usize> = BTreeMap::new();
    for (ns, name) in CLUSTERS {
        let vip = real.prepare_cluster(ns, name).await?;
        let vars = vec![
            ("CLUSTER_NAME", name.to_string()),
            ("NAMESPACE", ns.to_string()),
            ("CONTROL_PLANE_VIP", vip.to_string()),
            ("CONTROL_PLANE_MACHINE_COUNT", "1".to_string()),
            ("WORKER_MACHINE_COUNT", "1".to_string()),
            ("FLINTLOCK_HOSTS", flintlock_hosts.clone()),
        ];
        stack::apply_template(&real, DEMO_CLUSTER, &vars, |_| {}).await?;
        stack::apply_template(&real, MACHINEPOOL_CLUSTER, &vars, |objects| {
            objects.retain(|o| {
                o.types.as_ref().is_some_and(|t| {
                    matches!(
                        t.kind.as_str(),
                        "MachinePool" | "MicrovmMachinePool" | "KubeadmConfig"
                    )
                })
            });
        })
        .await?;
        for (_, group) in groups(name) {
            desired.insert((ns.to_string(), group), 1);
        }
    }
    let timeout = Duration::from_secs(args.step_timeout_secs);
    let t = Instant::now();
    let created_in = converged(&real, &desired, timeout, &log)
        .await?
        .then(|| t.elapsed());
    log(format!("clusters created: {created_in:?}"));

    let mut rng = Rng::new(args.seed);
    let mut faults: Vec<FaultRecord> = Vec::new();
    let mut scales = Vec::new();
    let targets = Targets {
        hosts: &hosts,
        link: &link,
    };
    let budget = Duration::from_secs_f64(args.minutes.max(0.0) * 60.0);
    let mut round: Vec<Fault> = Vec::new();
    // When the management kube-apiserver was down or starting.
    let mut api_starting: Vec<(Timestamp, Timestamp)> = Vec::new();
    while created_in.is_some() {
        let every_kind = Fault::ALL
            .iter()
            .all(|k| faults.iter().any(|f| f.fault == *k));
        if every_kind && started.elapsed() >= budget + created_in.unwrap_or_default() {
            break;
        }
        // Every kind once per round, in a seeded order.
        if round.is_empty() {
            round = Fault::ALL.to_vec();
            for i in (1..round.len()).rev() {
                round.swap(i, rng.below(i + 1));
            }
        }
        let fault = round.pop().context("a fault")?;
        // Scale one group to a new size in 1..=3, then strike while the scale is under way.
        let (ns, cluster) = CLUSTERS[rng.below(CLUSTERS.len())];
        let [md, mp] = groups(cluster);
        // MachineDeployments and MachinePools take turns.
        let (resource, group) = if scales.len().is_multiple_of(2) {
            md
        } else {
            mp
        };
        let key = (ns.to_string(), group.clone());
        let now = desired.get(&key).copied().unwrap_or(1);
        let mut size = 1 + rng.below(3);
        if size == now {
            size = 1 + size % 3;
        }
        real.scale(&resource, ns, &group, size).await?;
        desired.insert(key, size);
        let what = format!("{ns}/{group}: {now} -> {size}");
        log(format!("scale {what}"));
        scales.push((started.elapsed(), what.clone()));
        tokio::time::sleep(rng.millis(0, 3_000)).await;
        let at = started.elapsed();
        let before = Timestamp::now();
        let (detail, down, restored_in) = inject(&mut real, &targets, fault, &mut rng, &log)
            .await
            .with_context(|| format!("{fault} at {:.0} s", at.as_secs_f64()))?;
        if fault == Fault::ApiServer {
            api_starting.push((before, Timestamp::now()));
        }
        let back = Instant::now() - restored_in;
        let ok = converged(&real, &desired, timeout, &log).await?;
        let converged_in = ok.then(|| back.elapsed());
        log(format!(
            "{fault}: converged {converged_in:?} after its restart"
        ));
        faults.push(FaultRecord {
            fault,
            detail: format!("{detail}; during scale {what}"),
            at,
            down,
            restored_in,
            converged_in,
        });
        if !ok {
            break;
        }
    }

    // The faults have stopped: everything converges, nothing is left over.
    let t = Instant::now();
    let final_converged_in = converged(&real, &desired, timeout, &log)
        .await?
        .then(|| t.elapsed());
    let machines = Api::<MicrovmMachine>::all(real.client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let owners: BTreeSet<String> = machines
        .iter()
        .filter_map(|m| origin_uid(m).map(str::to_string))
        .collect();
    let orphans = monitor::leaks(&hosts, &owners);
    let (operator_requests, denials, denials_while_starting) =
        denials(&real, &api_starting).context("reading the audit log")?;

    for (ns, name) in CLUSTERS {
        real.kubectl
            .run(&["delete", "cluster", name, "-n", ns, "--wait=false"])
            .await
            .context("kubectl delete cluster")?;
    }
    let t = Instant::now();
    let deleted_in = deleted(&real, &hosts, timeout).await?.then(|| t.elapsed());
    let leaks = monitor::leaks(&hosts, &BTreeSet::new());
    let findings = monitors.finish().await?;
    let load = std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    let report = RealSoakReport {
        args,
        created_in,
        faults,
        scales,
        final_converged_in,
        final_machines: machines.len(),
        findings,
        orphans,
        leaks,
        deleted_in,
        operator_requests,
        denials,
        denials_while_starting,
        load,
        total: started.elapsed(),
        dir,
    };
    if !report.failures().is_empty() || std::env::var("CAPMVM_SOAK_LOG").is_ok() {
        real.keep_dir();
    }
    real.shutdown().await;
    Ok(report)
}

/// The operator's requests in the audit log, classified by [`classify_denials`].
fn denials(
    real: &RealStack,
    starting: &[(Timestamp, Timestamp)],
) -> anyhow::Result<(u64, Vec<String>, Vec<String>)> {
    let audit = real
        .audit()
        .context("the management API keeps no audit log")?;
    let operator = RealStack::operator_user();
    let requests: Vec<AuditEvent> = audit
        .requests()?
        .into_iter()
        .filter(|e| e.user.username == operator)
        .collect();
    let (denied, while_starting) = classify_denials(&requests, starting);
    Ok((requests.len() as u64, denied, while_starting))
}

/// Of `requests`, those RBAC refused: refused outside `starting` (the windows in which the
/// management kube-apiserver was restarting), and refused inside them for a verb and resource
/// allowed outside them. One refused inside a window and never allowed outside is a denial: the
/// windows excuse a server that is not ready, never a rule that is missing.
fn classify_denials(
    requests: &[AuditEvent],
    starting: &[(Timestamp, Timestamp)],
) -> (Vec<String>, Vec<String>) {
    let while_starting = |e: &AuditEvent| {
        e.request_received_timestamp
            .parse::<Timestamp>()
            .is_ok_and(|t| starting.iter().any(|(a, b)| *a <= t && t <= *b))
    };
    let what = |e: &AuditEvent| {
        let group = e.object_ref.as_ref().map(|o| o.api_group.clone());
        (e.verb.clone(), group.unwrap_or_default(), e.resource())
    };
    let allowed: BTreeSet<(String, String, String)> = requests
        .iter()
        .filter(|e| !e.denied_by_authorization() && !while_starting(e))
        .map(what)
        .collect();
    let (mut denied, mut starting_denied) = (Vec::new(), Vec::new());
    for e in requests.iter().filter(|e| e.denied_by_authorization()) {
        let line = format!(
            "{} {} {} at {}",
            e.verb,
            e.resource(),
            e.request_uri,
            e.request_received_timestamp
        );
        if while_starting(e) && allowed.contains(&what(e)) {
            starting_denied.push(line);
        } else {
            denied.push(line);
        }
    }
    (denied, starting_denied)
}

/// Waits until each namespace has the Machines `desired` asks for (its control plane and its
/// groups), each Ready, each MicrovmMachine Ready, each Machine's `nodeRef` naming the Node of its
/// providerID in the workload cluster. `false` on timeout. Errors from the API (it may be coming
/// back) count as not yet.
async fn converged(
    real: &RealStack,
    desired: &BTreeMap<(String, String), usize>,
    timeout: Duration,
    log: &dyn Fn(String),
) -> anyhow::Result<bool> {
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    while Instant::now() < deadline {
        match check(real, desired).await {
            Ok(None) => return Ok(true),
            Ok(Some(why)) => last = why,
            Err(e) => last = format!("{e:#}"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    log(format!("not converged after {timeout:?}: {last}"));
    Ok(false)
}

/// `None` when converged, or what is not yet.
async fn check(
    real: &RealStack,
    desired: &BTreeMap<(String, String), usize>,
) -> anyhow::Result<Option<String>> {
    for (ns, cluster) in CLUSTERS {
        let want = 1 + desired
            .iter()
            .filter(|((n, _), _)| n == ns)
            .map(|(_, r)| r)
            .sum::<usize>();
        let infra = Api::<MicrovmMachine>::namespaced(real.client.clone(), ns)
            .list(&ListParams::default())
            .await?
            .items;
        let ready = infra.iter().filter(|m| is_ready(m)).count();
        if infra.len() != want || ready != want {
            return Ok(Some(format!(
                "{ns}: {ready} of {} MicrovmMachines Ready, {want} wanted",
                infra.len()
            )));
        }
        let machines = Api::<DynamicObject>::namespaced_with(
            real.client.clone(),
            ns,
            &ApiResource::erase::<Machine>(&()),
        )
        .list(&ListParams::default())
        .await?
        .items;
        let key = ClusterKey::new(ns, cluster);
        let settled = machines.iter().filter(|m| {
            let ready = m
                .data
                .pointer("/status/conditions")
                .and_then(|c| c.as_array())
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                });
            let node = m
                .data
                .pointer("/spec/providerID")
                .and_then(|p| p.as_str())
                .and_then(|p| real.workloads().node_by_provider_id(&key, p));
            let node_ref = m
                .data
                .pointer("/status/nodeRef/name")
                .and_then(|n| n.as_str());
            m.metadata.deletion_timestamp.is_none()
                && ready
                && node.is_some_and(|n| Some(n.name_any().as_str()) == node_ref)
        });
        let settled = settled.count();
        if machines.len() != want || settled != want {
            return Ok(Some(format!(
                "{ns}: {settled} of {} Machines Ready with their Node, {want} wanted",
                machines.len()
            )));
        }
    }
    Ok(None)
}

fn is_ready(m: &MicrovmMachine) -> bool {
    m.metadata.deletion_timestamp.is_none()
        && m.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

/// Waits until no MicrovmMachine is left in the soak's namespaces and the hosts hold no microVM.
async fn deleted(
    real: &RealStack,
    hosts: &[HostControl],
    timeout: Duration,
) -> anyhow::Result<bool> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let mut left = 0;
        for (ns, _) in CLUSTERS {
            left += Api::<MicrovmMachine>::namespaced(real.client.clone(), ns)
                .list(&ListParams::default())
                .await?
                .items
                .len();
        }
        let vms: usize = hosts.iter().map(|h| h.vms().len()).sum();
        if left == 0 && vms == 0 {
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn event(verb: &str, resource: &str, at: &str, forbid: bool) -> AuditEvent {
        serde_json::from_value(serde_json::json!({
            "auditID": format!("{verb}-{resource}-{at}"),
            "verb": verb,
            "requestURI": format!("/apis/cluster.x-k8s.io/v1beta2/{resource}"),
            "objectRef": {"resource": resource, "apiGroup": "cluster.x-k8s.io"},
            "requestReceivedTimestamp": at,
            "annotations": {"authorization.k8s.io/decision": if forbid { "forbid" } else { "allow" }},
        }))
        .unwrap()
    }

    /// A restart window excuses only a refusal of what the operator is allowed otherwise: a
    /// refusal outside it, or of something never allowed, stays a denial.
    #[test]
    fn a_restart_window_excuses_only_what_is_allowed_otherwise() {
        let window = [(
            "2026-01-01T00:00:10Z".parse::<Timestamp>().unwrap(),
            "2026-01-01T00:00:20Z".parse::<Timestamp>().unwrap(),
        )];
        let requests = [
            event("watch", "machines", "2026-01-01T00:00:05.000001Z", false),
            event("watch", "machines", "2026-01-01T00:00:15.000001Z", true),
            // Never allowed: a missing rule, whenever it was refused.
            event("delete", "clusters", "2026-01-01T00:00:15.000001Z", true),
            // Allowed, but refused outside the window.
            event("watch", "machines", "2026-01-01T00:00:30.000001Z", true),
        ];
        let (denied, starting) = classify_denials(&requests, &window);
        assert_eq!(starting.len(), 1, "{starting:?}");
        assert!(starting[0].starts_with("watch machines"), "{starting:?}");
        assert_eq!(denied.len(), 2, "{denied:?}");
        assert!(denied.iter().any(|d| d.starts_with("delete clusters")));
        assert!(denied.iter().any(|d| d.contains("00:00:30")));
        // Without a window nothing is excused.
        let (denied, starting) = classify_denials(&requests, &[]);
        assert_eq!((denied.len(), starting.len()), (3, 0));
    }
}
