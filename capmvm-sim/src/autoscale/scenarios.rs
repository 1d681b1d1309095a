//! The scenarios, in order, on one real stack and one Cluster: a control plane, a MachineDeployment
//! and a MachinePool both at 0 replicas, and a Deployment `load` in the workload cluster whose Pods
//! ask 900m CPU and 900Mi memory each (two fit on a 2 vCPU / 2 GiB microVM both as the autoscaler
//! sees it from zero, capacity less kube-proxy's 100m, and as the kubelet reports it, memory less
//! its 100Mi eviction reserve). Each step leaves the state the next starts from.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use capmvm_flintlock::Method;
use capmvm_upstream::tools::Kubectl;
use k8s_openapi::api::core::v1::Event;
use kube::Api;
use kube::api::ListParams;

use super::observe::{
    MAX_PROVISION_TIME, MAX_SIZE, MIN_SIZE, Observed, Watch, autoscaler_status, brief,
};
use crate::real::RealStack;
use crate::stack::{self, Stack as _};

/// The namespace of the Cluster and of the load.
pub const NAMESPACE: &str = "default";
/// The Cluster.
pub const CLUSTER: &str = "auto";
/// The load's Pods' requests.
pub const POD_CPU: &str = "900m";
/// The load's Pods' memory request.
pub const POD_MEMORY: &str = "900Mi";

/// The MachineDeployment's name.
pub fn md() -> String {
    format!("{CLUSTER}-md-0")
}

/// The MachinePool's name.
pub fn mp() -> String {
    format!("{CLUSTER}-mp-0")
}

/// What a scenario found.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The scenario.
    pub name: &'static str,
    /// Whether everything it checks held.
    pub held: bool,
    /// What was seen (numbers, or why it failed).
    pub detail: String,
}

/// The figures measured on the way.
#[derive(Clone, Debug, Default)]
pub struct Figures {
    /// MachineDeployment from zero: first pending Pod to all Running.
    pub md_scale_up: Option<Duration>,
    /// MicroVMs created by that scale-up.
    pub md_created: Option<u64>,
    /// MachinePool from zero: first pending Pod to all Running.
    pub mp_scale_up: Option<Duration>,
    /// MicroVMs created by that scale-up.
    pub mp_created: Option<u64>,
    /// Pods deleted to the last unneeded microVM gone.
    pub scale_down: Option<Duration>,
    /// A never-registering microVM's creation to its removal by the autoscaler.
    pub failed_removed_after: Option<Duration>,
    /// Disruptor lifted to the waiting Pods Running.
    pub recovered_after: Option<Duration>,
}

/// Timings the run is configured with.
#[derive(Clone, Copy, Debug)]
pub struct Timings {
    /// The hosts' provisioning time.
    pub provision: Duration,
    /// The operator's host poll while a microVM is pending.
    pub poll: Duration,
    /// The autoscaler's `--scan-interval`.
    pub scan: Duration,
    /// The failed scale-up's provision time: the MachineDeployment's own
    /// `maxnodeprovisiontime` while that scenario waits (the flag keeps upstream's 15 min).
    pub max_provision: Duration,
    /// Longest wait for any step.
    pub timeout: Duration,
}

/// The scenarios' driver: the stack, the workload cluster's kubectl, and the watch.
pub struct Scenarios<'a> {
    watch: Watch<'a>,
    workload_kubectl: Kubectl,
    timings: Timings,
    /// Figures measured so far.
    pub figures: Figures,
}

fn outcome(name: &'static str, checks: &[(bool, String)]) -> Outcome {
    let failed: Vec<&str> = checks
        .iter()
        .filter(|(ok, _)| !ok)
        .map(|(_, what)| what.as_str())
        .collect();
    let all: Vec<&str> = checks.iter().map(|(_, w)| w.as_str()).collect();
    Outcome {
        name,
        held: failed.is_empty(),
        detail: if failed.is_empty() {
            all.join("; ")
        } else {
            format!("did not hold: {}", failed.join("; "))
        },
    }
}

impl<'a> Scenarios<'a> {
    /// A driver over `real`, whose Cluster [`prepare`] made.
    pub async fn new(real: &'a RealStack, timings: Timings, show: bool) -> anyhow::Result<Self> {
        let cluster = crate::capi::workload::ClusterKey::new(NAMESPACE, CLUSTER);
        let workload = real
            .workloads()
            .client(&cluster)
            .context("the workload API is not served")?;
        let path = real
            .workloads()
            .kubeconfig_path(&cluster)
            .context("no workload kubeconfig")?;
        let workload_kubectl = Kubectl::new(&real.binaries, &path)?;
        Ok(Self {
            watch: Watch::new(real, cluster, workload, show),
            workload_kubectl,
            timings,
            figures: Figures::default(),
        })
    }

    /// Narration.
    pub fn say(&mut self, line: &str) {
        self.watch.say(line);
    }

    /// Looks once (and shows the table).
    pub async fn observe(&mut self) -> anyhow::Result<Observed> {
        self.watch.observe().await
    }

    fn real(&self) -> &'a RealStack {
        self.watch.real
    }

    fn creates(&self) -> u64 {
        stack::host_calls(&self.real().hosts, Method::Create)
    }

    async fn scale_load(&self, replicas: usize) -> anyhow::Result<()> {
        self.workload_kubectl
            .run(&[
                "scale",
                "-n",
                NAMESPACE,
                "deployment/load",
                &format!("--replicas={replicas}"),
            ])
            .await
            .context("kubectl scale deployment/load")?;
        Ok(())
    }

    /// `kubectl annotate` of a node group's sizes; `None` removes both annotations.
    pub async fn set_sizes(
        &self,
        resource: &str,
        name: &str,
        sizes: Option<(i64, i64)>,
    ) -> anyhow::Result<()> {
        let (min, max) = match sizes {
            Some((min, max)) => (format!("{MIN_SIZE}={min}"), format!("{MAX_SIZE}={max}")),
            None => (format!("{MIN_SIZE}-"), format!("{MAX_SIZE}-")),
        };
        self.annotate(resource, name, &[&min, &max]).await
    }

    /// Sets (or, with `None`, removes) node group `name`'s own `maxnodeprovisiontime`.
    pub async fn set_provision_time(
        &self,
        resource: &str,
        name: &str,
        time: Option<Duration>,
    ) -> anyhow::Result<()> {
        let annotation = match time {
            Some(t) => format!("{MAX_PROVISION_TIME}={}s", t.as_secs().max(1)),
            None => format!("{MAX_PROVISION_TIME}-"),
        };
        self.annotate(resource, name, &[&annotation]).await
    }

    /// `kubectl annotate --overwrite` of `resource/name` in the scenarios' namespace (`key=value`
    /// sets, `key-` removes).
    async fn annotate(
        &self,
        resource: &str,
        name: &str,
        annotations: &[&str],
    ) -> anyhow::Result<()> {
        let target = format!("{resource}/{name}");
        let mut args = vec!["annotate", "-n", NAMESPACE, target.as_str()];
        args.extend_from_slice(annotations);
        args.push("--overwrite");
        self.real()
            .kubectl
            .run(&args)
            .await
            .with_context(|| format!("kubectl annotate {target}"))?;
        Ok(())
    }

    /// Creates the load: a Deployment of 0 replicas whose Pods ask [`POD_CPU`] and [`POD_MEMORY`].
    pub async fn create_load(&self) -> anyhow::Result<()> {
        let manifest = format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: load\n  namespace: {NAMESPACE}\nspec:\n  replicas: 0\n  selector:\n    matchLabels:\n      app: load\n  template:\n    metadata:\n      labels:\n        app: load\n    spec:\n      terminationGracePeriodSeconds: 1\n      containers:\n      - name: app\n        image: registry.k8s.io/pause:3.10\n        resources:\n          requests:\n            cpu: {POD_CPU}\n            memory: {POD_MEMORY}\n"
        );
        self.workload_kubectl
            .apply(&manifest, &[])
            .await
            .context("kubectl apply of the load Deployment")?;
        Ok(())
    }

    fn group_md(&self) -> String {
        format!("md/{}", md())
    }

    fn group_mp(&self) -> String {
        format!("mp/{}", mp())
    }

    /// Scale from zero on the MachineDeployment: 5 Pods, 3 microVMs (never more), all Running.
    pub async fn md_from_zero(&mut self) -> anyhow::Result<Outcome> {
        let name = "scale from zero on a MachineDeployment";
        self.say(&format!(
            "[1] {name}: deployment/load 0 -> 5 Pods ({POD_CPU} CPU, {POD_MEMORY} each); {} min 0 max 5 at 0 replicas",
            md()
        ));
        let creates = self.creates();
        self.watch.reset_peaks();
        let started = Instant::now();
        self.scale_load(5).await?;
        let key = self.group_md();
        let o = self
            .watch
            .until(
                "5 Pods Running on 3 Nodes of the MachineDeployment",
                self.timings.timeout,
                |o| {
                    let g = o.group(&key);
                    g.replicas == 3 && g.nodes == 3 && o.pods.running == 5 && o.pods.pending == 0
                },
            )
            .await?;
        let took = started.elapsed();
        let created = self.creates() - creates;
        self.figures.md_scale_up = Some(took);
        self.figures.md_created = Some(created);
        let peak = self.watch.peaks.get(&key).copied().unwrap_or(0);
        let log = self.autoscaler_log();
        let plan = format!("MachineDeployment/{NAMESPACE}/{} 0->3", md());
        Ok(outcome(
            name,
            &[
                (
                    true,
                    format!("all 5 Pods Running in {:.1}s", took.as_secs_f64()),
                ),
                (
                    created == 3,
                    format!("{created} microVMs created (3 needed)"),
                ),
                (peak == 3, format!("replicas peaked at {peak}")),
                (
                    o.group(&key).vms == 3,
                    format!("{} microVMs in the group", o.group(&key).vms),
                ),
                (
                    log.contains(&plan),
                    format!("the autoscaler's plan names {plan}"),
                ),
            ],
        ))
    }

    /// Scale from zero on the MachinePool, the MachineDeployment held at its max (3): 4 more Pods,
    /// 2 pool instances from the MicrovmMachinePool's own status.
    pub async fn mp_from_zero(&mut self) -> anyhow::Result<Outcome> {
        let name = "scale from zero on a MachinePool";
        self.say(&format!(
            "[2] {name}: {} max 3 (reached), {} min 0 max 5 at 0; deployment/load 5 -> 9",
            md(),
            mp()
        ));
        self.set_sizes("machinedeployments.cluster.x-k8s.io", &md(), Some((0, 3)))
            .await?;
        self.set_sizes("machinepools.cluster.x-k8s.io", &mp(), Some((0, 5)))
            .await?;
        let creates = self.creates();
        self.watch.reset_peaks();
        let started = Instant::now();
        self.scale_load(9).await?;
        let (md_key, mp_key) = (self.group_md(), self.group_mp());
        let o = self
            .watch
            .until(
                "9 Pods Running, 2 on each pool instance",
                self.timings.timeout,
                |o| {
                    let g = o.group(&mp_key);
                    g.replicas == 2 && g.nodes == 2 && o.pods.running == 9 && o.pods.pending == 0
                },
            )
            .await?;
        let took = started.elapsed();
        let created = self.creates() - creates;
        self.figures.mp_scale_up = Some(took);
        self.figures.mp_created = Some(created);
        let peak = self.watch.peaks.get(&mp_key).copied().unwrap_or(0);
        let plan = format!("MachinePool/{NAMESPACE}/{} 0->2", mp());
        let log = self.autoscaler_log();
        Ok(outcome(
            name,
            &[
                (
                    true,
                    format!("all 9 Pods Running in {:.1}s", took.as_secs_f64()),
                ),
                (
                    created == 2,
                    format!("{created} microVMs created (2 needed)"),
                ),
                (peak == 2, format!("pool replicas peaked at {peak}")),
                (
                    o.group(&md_key).replicas == 3,
                    format!(
                        "the MachineDeployment stayed at {}",
                        o.group(&md_key).replicas
                    ),
                ),
                (
                    log.contains(&plan),
                    format!("the autoscaler's plan names {plan}"),
                ),
            ],
        ))
    }

    /// Max size holds: both groups at their max, 2 more Pods stay Pending, the autoscaler says why.
    pub async fn max_size_holds(&mut self) -> anyhow::Result<Outcome> {
        let name = "max size holds";
        self.say(&format!(
            "[3] {name}: {} max 2 (reached) beside {} at its max 3; deployment/load 9 -> 12",
            mp(),
            md()
        ));
        self.set_sizes("machinepools.cluster.x-k8s.io", &mp(), Some((0, 2)))
            .await?;
        let creates = self.creates();
        self.watch.reset_peaks();
        // 5 Nodes hold 10 Pods: 2 stay Pending.
        self.scale_load(12).await?;
        // Several scans: the autoscaler sees the Pods, finds no group that may grow, says so.
        let hold = self.timings.scan * 6;
        let until = Instant::now() + hold;
        let mut why = None;
        let mut last = self.watch.observe().await?;
        while Instant::now() < until || why.is_none() {
            last = self.watch.observe().await?;
            if why.is_none() {
                why = self.not_triggered().await;
            }
            if Instant::now() > until + self.timings.timeout {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let (md_key, mp_key) = (self.group_md(), self.group_mp());
        let peaks = (
            self.watch.peaks.get(&md_key).copied().unwrap_or(0),
            self.watch.peaks.get(&mp_key).copied().unwrap_or(0),
        );
        let status = autoscaler_status(&self.watch.workload).await;
        let at_max = |group: &str| {
            status.as_ref().is_some_and(|s| {
                s["nodeGroups"].as_array().is_some_and(|gs| {
                    gs.iter().any(|g| {
                        g["name"].as_str().is_some_and(|n| n.ends_with(group))
                            && g["health"]["cloudProviderTarget"] == g["health"]["maxSize"]
                    })
                })
            })
        };
        let created = self.creates() - creates;
        Ok(outcome(
            name,
            &[
                (
                    last.pods.pending == 2,
                    format!(
                        "{} Pods Pending after {}s",
                        last.pods.pending,
                        hold.as_secs()
                    ),
                ),
                (
                    peaks == (3, 2),
                    format!("replicas stayed at {} and {}", peaks.0, peaks.1),
                ),
                (created == 0, format!("{created} microVMs created")),
                (
                    why.as_deref()
                        .is_some_and(|m| m.contains("max node group size reached")),
                    format!(
                        "a Pending Pod's NotTriggerScaleUp event: {:?}",
                        why.unwrap_or_default()
                    ),
                ),
                (
                    at_max(&md()) && at_max(&mp()),
                    "the status ConfigMap shows both groups with cloudProviderTarget = maxSize"
                        .to_string(),
                ),
            ],
        ))
    }

    /// Waits for a status ConfigMap written after this call whose node group `group` has no
    /// unregistered (or long-unregistered) instance.
    async fn until_none_unregistered(&self, group: &str) -> anyhow::Result<()> {
        let entry = |status: &serde_json::Value| {
            status["nodeGroups"].as_array().and_then(|gs| {
                gs.iter()
                    .find(|g| g["name"].as_str().is_some_and(|n| n.ends_with(group)))
                    .cloned()
            })
        };
        let probe = |g: &serde_json::Value| g["health"]["lastProbeTime"].as_str().map(String::from);
        let first = autoscaler_status(&self.watch.workload)
            .await
            .as_ref()
            .and_then(entry)
            .and_then(|g| probe(&g));
        // Past the cache's 2-minute refresh, any stale entry is gone.
        let deadline = Instant::now() + self.timings.timeout + Duration::from_secs(120);
        loop {
            if let Some(g) = autoscaler_status(&self.watch.workload)
                .await
                .as_ref()
                .and_then(entry)
            {
                let counts = &g["health"]["nodeCounts"];
                let none = counts["unregistered"].as_i64() == Some(0)
                    && counts["longUnregistered"].as_i64() == Some(0);
                if none && probe(&g) != first {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                anyhow::bail!(
                    "the autoscaler's status still counts unregistered instances in {group}"
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The message of a `NotTriggerScaleUp` event about one of the load's Pods.
    async fn not_triggered(&self) -> Option<String> {
        let events: Api<Event> = Api::namespaced(self.watch.workload.clone(), NAMESPACE);
        let list = events
            .list(&ListParams::default().fields("reason=NotTriggerScaleUp"))
            .await
            .ok()?;
        list.items
            .into_iter()
            .filter(|e| {
                e.involved_object
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("load-"))
            })
            .filter_map(|e| e.message)
            .next_back()
    }

    /// Scale down by Node: 12 -> 4 Pods; the autoscaler removes the Nodes it finds unneeded through
    /// `delete-machine`, and exactly those microVMs go.
    pub async fn scale_down(&mut self) -> anyhow::Result<Outcome> {
        let name = "scale down by Node through delete-machine";
        self.say(&format!(
            "[4] {name}: deployment/load 12 -> 4 (2 Nodes' worth); the autoscaler removes the rest after the unneeded time"
        ));
        self.watch.marked.clear();
        let before = self.watch.observe().await?;
        let started = Instant::now();
        self.scale_load(4).await?;
        let (md_key, mp_key) = (self.group_md(), self.group_mp());
        let o = self
            .watch
            .until(
                "4 Pods Running on 2 Nodes, nothing more",
                self.timings.timeout * 2,
                |o| {
                    let (d, p) = (o.group(&md_key), o.group(&mp_key));
                    d.nodes + p.nodes == 2
                        && d.vms + p.vms == 2
                        && d.replicas + p.replicas == 2
                        && o.pods.running == 4
                        && o.pods.pending == 0
                },
            )
            .await?;
        self.figures.scale_down = Some(started.elapsed());
        let gone: BTreeSet<String> = before
            .vms
            .keys()
            .filter(|u| !o.vms.contains_key(*u))
            .cloned()
            .collect();
        let marked: BTreeSet<String> = before
            .vms
            .iter()
            .filter(|(_, (machine, _))| self.watch.marked.contains_key(machine))
            .map(|(u, _)| u.clone())
            .collect();
        let new: Vec<&String> = o
            .vms
            .keys()
            .filter(|u| !before.vms.contains_key(*u))
            .collect();
        let cp_kept = before.vms_of("control-plane") == o.vms_of("control-plane");
        Ok(outcome(
            name,
            &[
                (
                    true,
                    format!(
                        "{} Nodes removed in {:.1}s",
                        gone.len(),
                        started.elapsed().as_secs_f64()
                    ),
                ),
                (
                    gone.len() == 3,
                    format!("{} microVMs gone (5 Nodes' worth to 2)", gone.len()),
                ),
                (
                    gone == marked,
                    format!(
                        "the microVMs gone are exactly those of the {} Machines the autoscaler marked",
                        marked.len()
                    ),
                ),
                (new.is_empty(), format!("{} microVMs created", new.len())),
                (cp_kept, "the control plane's microVM untouched".to_string()),
            ],
        ))
    }

    /// A microVM that never registers a Node: the autoscaler gives up on it after
    /// `--max-node-provision-time`, removes it, backs the group off, and scales again once Nodes
    /// register.
    pub async fn failed_scale_up(&mut self) -> anyhow::Result<Outcome> {
        let name = "a microVM that never registers is a failed scale-up, and the group recovers";
        self.say(&format!(
            "[5] {name}: {} alone autoscaled (max 5), its new microVMs' kubelets never register; deployment/load 4 -> 6",
            md()
        ));
        self.set_sizes("machinepools.cluster.x-k8s.io", &mp(), None)
            .await?;
        self.set_sizes("machinedeployments.cluster.x-k8s.io", &md(), Some((0, 5)))
            .await?;
        let kubelets = self.real().kubelets();
        let prefix = format!("{}-", md());
        kubelets.set_never_register_prefix(&prefix, true);
        // The group's provision time is cut short only once the autoscaler counts none of its
        // Machines unregistered. It caches a group's instances for up to 2 minutes while no
        // scale-up is in flight, and an instance cached while its Machine had no nodeRef yet
        // stays "unregistered" there with its Node up: a short provision time would delete that
        // healthy Machine (docs/autoscaler.md, item 9; CI saw it).
        self.until_none_unregistered(&md()).await?;
        let resource = "machinedeployments.cluster.x-k8s.io";
        self.set_provision_time(resource, &md(), Some(self.timings.max_provision))
            .await?;
        self.watch.marked.clear();
        let before = self.watch.observe().await?;
        self.scale_load(6).await?;
        let md_key = self.group_md();
        let o = self
            .watch
            .until(
                "a new microVM in the MachineDeployment",
                self.timings.timeout,
                |o| {
                    o.vms_of(&md_key)
                        .iter()
                        .any(|u| !before.vms.contains_key(u))
                },
            )
            .await?;
        let stuck: BTreeSet<String> = o
            .vms_of(&md_key)
            .into_iter()
            .filter(|u| !before.vms.contains_key(u))
            .collect();
        let stuck_names: BTreeSet<String> = stuck
            .iter()
            .filter_map(|u| o.vms.get(u).map(|(n, _)| n.clone()))
            .collect();
        let appeared = Instant::now();
        let gave_up = self
            .watch
            .until(
                "the autoscaler to remove the microVM that never registered",
                self.timings.max_provision + self.timings.timeout,
                |o| stuck.iter().all(|u| !o.vms.contains_key(u)),
            )
            .await;
        let removed_after = appeared.elapsed();
        let restored = self.set_provision_time(resource, &md(), None).await;
        kubelets.set_never_register_prefix(&prefix, false);
        gave_up?;
        restored?;
        self.figures.failed_removed_after = Some(removed_after);
        let marked = stuck_names
            .iter()
            .all(|n| self.watch.marked.contains_key(n));
        let lifted = Instant::now();
        let recovered = self
            .watch
            .until(
                "6 Pods Running once Nodes register again",
                self.timings.timeout * 2,
                |o| o.pods.running == 6 && o.pods.pending == 0,
            )
            .await?;
        self.figures.recovered_after = Some(lifted.elapsed());
        let others_kept = before.vms.keys().all(|u| recovered.vms.contains_key(u));
        let backoff = self.watch.backoff_seen.iter().any(|g| g.ends_with(&md()));
        let log = self.autoscaler_log();
        // How it went: the autoscaler counts a Machine without a nodeRef as a pending instance
        // (whatever its providerID) and, at the timeout, reverts its scale-up by lowering the
        // replicas without marking a Machine; CAPI's MachineSet deletes the Machine without a Node
        // first. A later pass marks long-unregistered ones with delete-machine.
        let how = if marked {
            "through delete-machine on its Machine"
        } else if log.contains("Reverting timed-out scale-up") {
            "by the autoscaler reverting its scale-up (replicas - 1, no Machine marked) and CAPI's MachineSet deleting the Machine that had no Node"
        } else {
            "by neither delete-machine nor a reverted scale-up"
        };
        Ok(outcome(
            name,
            &[
                (
                    removed_after
                        >= self
                            .timings
                            .max_provision
                            .saturating_sub(Duration::from_secs(5)),
                    format!(
                        "{} never-registering microVM(s) removed {:.1}s after they appeared (the group's maxnodeprovisiontime {}s)",
                        stuck.len(),
                        removed_after.as_secs_f64(),
                        self.timings.max_provision.as_secs()
                    ),
                ),
                (!how.starts_with("by neither"), how.to_string()),
                (others_kept, "no other microVM touched".to_string()),
                (
                    backoff || log.contains("Scale-up timed out"),
                    format!(
                        "the autoscaler reported the failed scale-up (status Backoff seen: {backoff})"
                    ),
                ),
                (
                    true,
                    format!(
                        "recovered: all 6 Pods Running {:.1}s after the kubelets registered again",
                        lifted.elapsed().as_secs_f64()
                    ),
                ),
            ],
        ))
    }

    /// The autoscaler's log holds no error about our objects, and RBAC refused it nothing.
    pub fn clean_logs(&mut self) -> Outcome {
        let name = "the autoscaler's logs hold no error about our objects";
        self.say(&format!("[6] {name}"));
        let log = self.autoscaler_log();
        let errors = capmvm_upstream::autoscaler::error_lines(&log);
        let mut ours: Vec<&str> = errors
            .iter()
            .copied()
            .filter(|l| {
                let l = l.to_ascii_lowercase();
                [
                    "microvm",
                    "providerid",
                    "provider id",
                    "capacity",
                    "infrastructure",
                    "template",
                    "unknown machine",
                    "forbidden",
                ]
                .iter()
                .any(|w| l.contains(w))
            })
            .collect();
        // The autoscaler's own ordering: a node group that appears mid-run (an annotation added)
        // has no template node info until the loop that first lists it has built one, and the
        // scale-up safety check before that logs this. Our template unreadable would repeat it
        // every loop; a few times per group is that first loop.
        let transient = |l: &str| l.contains("failed to get template node info");
        let message = |l: &str| {
            l.split_once("] ")
                .map(|(_, m)| m.to_string())
                .unwrap_or_default()
        };
        let repeated: BTreeSet<String> = ours
            .iter()
            .filter(|l| transient(l))
            .map(|l| message(l))
            .filter(|m| ours.iter().filter(|l| message(l) == *m).count() > 3)
            .collect();
        ours.retain(|l| !transient(l) || repeated.contains(&message(l)));
        let forbidden = self
            .real()
            .audit()
            .and_then(|a| a.forbidden_for(&RealStack::autoscaler_user()).ok())
            .map(|f| {
                f.iter()
                    .map(|e| format!("{} {}", e.verb, e.request_uri))
                    .collect::<Vec<_>>()
            });
        outcome(
            name,
            &[
                (
                    ours.is_empty(),
                    format!(
                        "{} error lines about our objects of {} in all: {:?}",
                        ours.len(),
                        errors.len(),
                        ours.iter().take(3).collect::<Vec<_>>()
                    ),
                ),
                (
                    forbidden.as_ref().is_some_and(Vec::is_empty),
                    format!("RBAC refusals of the autoscaler's ServiceAccount: {forbidden:?}"),
                ),
            ],
        )
    }

    /// The autoscaler's log so far.
    pub fn autoscaler_log(&self) -> String {
        self.real()
            .autoscaler()
            .map(|a| std::fs::read_to_string(a.process.log()).unwrap_or_default())
            .unwrap_or_default()
    }

    /// One line of the current state.
    pub async fn brief(&mut self) -> String {
        match self.watch.observe().await {
            Ok(o) => brief(&o),
            Err(e) => format!("(not observed: {e})"),
        }
    }
}

/// The Cluster the scenarios run on: its workload API, the demo template with 0 workers and the
/// pool flavor's MachinePool at 0; waits for the control plane's Node and for our template's and
/// pool's `status.capacity` (what scale from zero reads).
pub async fn prepare(real: &mut RealStack, timeout: Duration) -> anyhow::Result<()> {
    let vip = real.prepare_cluster(NAMESPACE, CLUSTER).await?;
    let vars = vec![
        ("CLUSTER_NAME", CLUSTER.to_string()),
        ("NAMESPACE", NAMESPACE.to_string()),
        ("CONTROL_PLANE_VIP", vip.to_string()),
        ("WORKER_MACHINE_COUNT", "0".to_string()),
    ];
    stack::apply_template(&*real, crate::world::DEMO_CLUSTER, &vars, |_| {}).await?;
    stack::apply_template(
        &*real,
        crate::world::MACHINEPOOL_CLUSTER,
        &vars,
        |objects| {
            objects.retain(|o| {
                o.types.as_ref().is_some_and(|t| {
                    matches!(
                        t.kind.as_str(),
                        "MachinePool" | "MicrovmMachinePool" | "KubeadmConfig"
                    )
                })
            })
        },
    )
    .await?;
    let client = crate::stack::Stack::client(&*real).clone();
    crate::world::wait_for(
        "the control plane's Node and status.capacity on the template and the pool",
        timeout,
        Duration::from_millis(250),
        || {
            let client = client.clone();
            let real = &*real;
            async move {
                let template = Api::<capmvm_api::MicrovmMachineTemplate>::namespaced(
                    client.clone(),
                    NAMESPACE,
                )
                .get_opt(&md())
                .await?;
                let pool = Api::<capmvm_api::MicrovmMachinePool>::namespaced(client, NAMESPACE)
                    .get_opt(&mp())
                    .await?;
                let has_capacity = template
                    .and_then(|t| t.status)
                    .is_some_and(|s| s.capacity.contains_key("cpu"))
                    && pool
                        .and_then(|p| p.status)
                        .is_some_and(|s| s.capacity.contains_key("memory"));
                let cp_node = real
                    .kubelets()
                    .registered()
                    .iter()
                    .any(|n| n.cluster.name == CLUSTER && n.ready);
                Ok((has_capacity && cp_node).then_some(()))
            }
        },
    )
    .await
}
