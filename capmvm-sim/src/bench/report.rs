//! The bench's report: its ratios, its targets checked, and its Markdown tables.

use std::time::Duration;

use super::Report;

impl Report {
    /// `time to ready / (provision + poll interval)`.
    pub fn time_ratio(&self) -> f64 {
        let budget = Duration::from_millis(self.args.provision_ms)
            + Duration::from_secs(self.args.poll_secs);
        self.time_to_ready.as_secs_f64() / budget.as_secs_f64()
    }

    /// The operator's writes per machine until ready.
    pub fn writes_per_machine(&self) -> f64 {
        self.operator_requests.writes() as f64 / self.args.machines as f64
    }

    /// The operator's writes that each machine causes, per machine until ready: everything but the
    /// per-cluster writes (MicrovmCluster and MicrovmMachineTemplate status, a handful per cluster
    /// whatever its size).
    pub fn machine_caused_writes_per_machine(&self) -> f64 {
        let writes: u64 = self
            .operator_requests
            .iter()
            .filter(|(v, r, _)| {
                crate::stack::is_write(v)
                    && !r.starts_with("infrastructure.cluster.x-k8s.io/microvmclusters")
                    && !r.starts_with("infrastructure.cluster.x-k8s.io/microvmmachinetemplates")
            })
            .map(|(_, _, n)| n)
            .sum();
        writes as f64 / self.args.machines as f64
    }

    /// The operator's writes to MicrovmMachines (main resource and status) per machine until ready.
    pub fn machine_writes_per_machine(&self) -> f64 {
        let writes: u64 = self
            .operator_requests
            .iter()
            .filter(|(v, r, _)| {
                crate::stack::is_write(v)
                    && r.starts_with("infrastructure.cluster.x-k8s.io/microvmmachines")
            })
            .map(|(_, _, n)| n)
            .sum();
        writes as f64 / self.args.machines as f64
    }

    /// The time ratio's target: 1.25 up to 1 000 machines, 2.0 beyond (issue 15).
    pub fn time_ratio_target(&self) -> f64 {
        if self.args.machines <= 1000 {
            1.25
        } else {
            2.0
        }
    }

    /// The operator's peak RSS target in MiB: 64 up to 1 000 machines; beyond, 128 (issue 15) or
    /// about 10 KiB per machine where that is more (issue 37: 300 MiB at 30 000).
    pub fn rss_target_mib(&self) -> u64 {
        match self.args.machines as u64 {
            m if m <= 1000 => 64,
            m => m.div_ceil(100).max(128),
        }
    }

    /// ListMicroVMs calls per machine until ready (the observers' lists and the fresh lookups).
    pub fn lists_per_machine(&self) -> f64 {
        self.flintlock_to_ready
            .get(capmvm_flintlock::Method::List.as_str())
            .copied()
            .unwrap_or(0) as f64
            / self.args.machines as f64
    }

    /// ListMicroVMs calls per host per poll interval in the steady state.
    pub fn steady_lists_per_host_per_poll(&self) -> f64 {
        let lists = self
            .flintlock_steady
            .get(capmvm_flintlock::Method::List.as_str())
            .copied()
            .unwrap_or(0) as f64;
        let polls = self.steady.as_secs_f64() / self.args.poll_secs as f64;
        lists / self.args.hosts as f64 / polls.max(1.0)
    }

    /// The operator's CPU milliseconds per machine (whole run).
    pub fn operator_cpu_ms_per_machine(&self) -> Option<f64> {
        self.operator_usage
            .map(|(cpu, _)| cpu * 1000.0 / self.args.machines as f64)
    }

    /// Flintlock calls per minute in the steady state.
    pub fn steady_calls_per_minute(&self) -> f64 {
        self.flintlock_steady.values().sum::<u64>() as f64 * 60.0
            / self.steady.as_secs_f64().max(1.0)
    }

    /// Whether this run was on the real stack, where real CAPI's pace sets the time.
    fn on_real_stack(&self) -> bool {
        self.args.control_plane == crate::demo::ControlPlane::Real
    }

    /// The operator's writes per machine allowed: 4, and on the real stack one more (the transient
    /// status a wait behind real CABPK makes visible, docs/benchmarks.md).
    pub fn writes_target(&self) -> f64 {
        if self.on_real_stack() { 5.0 } else { 4.0 }
    }

    /// On the real stack, the rows marked FAIL that [`Report::failures`] does not count (real
    /// CAPI's pace sets them): said in the verdict, so "All targets met" never sits under a FAIL.
    fn uncounted_on_real_stack(&self) -> Vec<String> {
        if !self.on_real_stack() {
            return Vec::new();
        }
        let mut misses = self.paced_failures();
        if let Some(ms) = self
            .operator_cpu_to_ready
            .map(|cpu| cpu * 1000.0 / self.args.machines as f64)
            && ms > 3.0
        {
            misses.push(format!(
                "operator CPU {ms:.2} ms per machine until ready > 3 ms"
            ));
        }
        misses
    }

    /// Which targets were missed. On the real stack only what the operator controls is checked.
    pub fn failures(&self) -> Vec<String> {
        if self.on_real_stack() {
            return self.operator_failures();
        }
        let mut failures = Vec::new();
        let ratio_target = self.time_ratio_target();
        if self.time_ratio() > ratio_target {
            failures.push(format!(
                "time ratio {:.2} > {ratio_target}",
                self.time_ratio()
            ));
        }
        failures.extend(self.paced_failures());
        failures.extend(self.operator_failures());
        failures
    }

    /// The targets the pace of machine creation moves as much as the operator does: flintlock
    /// lists and operator CPU per machine (on the real stack CAPI's pace stretches both).
    fn paced_failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        if self.lists_per_machine() > 0.5 {
            failures.push(format!(
                "{:.2} flintlock list calls per machine until ready > 0.5",
                self.lists_per_machine()
            ));
        }
        if let Some(ms) = self.operator_cpu_ms_per_machine()
            && ms > 5.0
        {
            failures.push(format!("operator CPU {ms:.2} ms per machine > 5 ms"));
        }
        failures
    }

    /// The targets the operator alone controls: writes per machine, steady-state flintlock
    /// calls, peak RSS.
    fn operator_failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        if self.machine_caused_writes_per_machine() > self.writes_target() {
            failures.push(format!(
                "{:.2} API writes per machine > {}",
                self.machine_caused_writes_per_machine(),
                self.writes_target()
            ));
        }
        // Steady state: one list per host per poll interval, whatever the number of machines.
        let per_host_per_minute = self.steady_calls_per_minute() / self.args.hosts as f64;
        let expected = 60.0 / self.args.poll_secs as f64;
        if per_host_per_minute > expected * 1.5 + 1.0 {
            failures.push(format!(
                "{per_host_per_minute:.1} steady flintlock calls per host per minute > {:.1} (one list per poll)",
                expected * 1.5 + 1.0
            ));
        }
        if let Some((_, rss_kib)) = self.operator_usage
            && rss_kib > self.rss_target_mib() * 1024
        {
            failures.push(format!(
                "operator peak RSS {:.1} MiB > {} MiB",
                rss_kib as f64 / 1024.0,
                self.rss_target_mib()
            ));
        }
        failures
    }

    /// The report as Markdown.
    pub fn render(&self) -> String {
        let a = &self.args;
        let m = a.machines as f64;
        let mut out = String::new();
        let mut line = |s: String| {
            out.push_str(&s);
            out.push('\n');
        };
        let real = a.control_plane == crate::demo::ControlPlane::Real;
        line(format!(
            "### {}: {} machines on {} hosts{} (provision {} ms, host poll {} s){}\n",
            a.provider.describe(),
            a.machines,
            a.hosts,
            a.host_auth.describe(),
            a.provision_ms,
            a.poll_secs,
            if real {
                ", real stack: kube-apiserver, etcd, CAPI core and CABPK; counts from the audit log"
            } else {
                ", embedded API emulator and CAPI stand-in"
            }
        ));
        line("| measure | value | target |".into());
        line("|---|---|---|".into());
        line(match self.unfinished {
            Some((ready, expected)) => format!(
                "| time to all ready | not reached: {ready} of {expected} ready after {:.1} s | |",
                self.time_to_ready.as_secs_f64()
            ),
            None => format!(
                "| time to all ready | {:.1} s | |",
                self.time_to_ready.as_secs_f64()
            ),
        });
        if real {
            line(format!(
                "| time to ready / (provision + poll) | {:.2} | none: real CAPI's pace |",
                self.time_ratio()
            ));
        } else {
            line(format!(
                "| time to ready / (provision + poll) | {:.2} | ≤ {} {} |",
                self.time_ratio(),
                self.time_ratio_target(),
                mark(self.time_ratio() <= self.time_ratio_target())
            ));
        }
        line(format!(
            "| operator API writes per machine (MicrovmMachine and Event writes) | {:.2} | ≤ {} {} |",
            self.machine_caused_writes_per_machine(),
            self.writes_target(),
            mark(self.machine_caused_writes_per_machine() <= self.writes_target())
        ));
        line(format!(
            "| of which to MicrovmMachines | {:.2} | |",
            self.machine_writes_per_machine()
        ));
        line(format!(
            "| operator API requests per machine (every verb) | {:.2} | |",
            self.operator_requests.total() as f64 / m
        ));
        line(format!(
            "| all operator writes / machines (adds the per-cluster status writes) | {:.3} | |",
            self.writes_per_machine()
        ));
        line(format!(
            "| flintlock calls per machine to ready | {:.2} | |",
            self.flintlock_to_ready.values().sum::<u64>() as f64 / m
        ));
        line(format!(
            "| flintlock list calls per machine to ready | {:.3} | ≤ 0.5 {} |",
            self.lists_per_machine(),
            mark(self.lists_per_machine() <= 0.5)
        ));
        line(format!(
            "| flintlock calls per minute, steady state | {:.1} ({:.1} per host) | one list per host per poll |",
            self.steady_calls_per_minute(),
            self.steady_calls_per_minute() / a.hosts as f64
        ));
        line(format!(
            "| flintlock lists per host per poll, steady state | {:.2} | ≤ 1 |",
            self.steady_lists_per_host_per_poll()
        ));
        if let Some((cpu, rss)) = self.operator_usage {
            line(format!("| operator CPU | {cpu:.1} s | |"));
            let ms = cpu * 1000.0 / m;
            line(format!(
                "| operator CPU per machine | {ms:.2} ms | ≤ 5 ms {} |",
                mark(ms <= 5.0)
            ));
            if let Some(to_ready) = self.operator_cpu_to_ready {
                let ms = to_ready * 1000.0 / m;
                line(format!(
                    "| operator CPU per machine, clock start to all ready | {ms:.2} ms | {} |",
                    if real {
                        format!("≤ 3 ms {}", mark(ms <= 3.0))
                    } else {
                        String::new()
                    }
                ));
            }
            // The same rows for every provider, so reports compare side by side; the Go provider
            // has no such metrics.
            match &self.operator_counts {
                Some(counts) => {
                    let total: u64 = counts.watch_events.values().sum();
                    let by: Vec<String> = counts
                        .watch_events
                        .iter()
                        .filter(|(_, n)| **n > 0)
                        .map(|(k, n)| format!("{k} {:.2}", *n as f64 / m))
                        .collect();
                    line(format!(
                        "| watch events the operator received per machine, clock start to all ready | {:.2} ({}) | |",
                        total as f64 / m,
                        by.join(", ")
                    ));
                    line(format!(
                        "| MicrovmMachine reconciles per machine, clock start to all ready | {:.2} | |",
                        counts.machine_reconciles as f64 / m
                    ));
                }
                None => {
                    let why = if a.provider == crate::bench_provider::BenchProvider::Go {
                        "not counted (the Go provider has no such metric)"
                    } else {
                        "not read (the operator's metrics did not answer)"
                    };
                    line(format!(
                        "| watch events the operator received per machine, clock start to all ready | {why} | |"
                    ));
                    line(format!(
                        "| MicrovmMachine reconciles per machine, clock start to all ready | {why} | |"
                    ));
                }
            }
            if let Some(floor) = &self.watch_floor {
                let what = match floor.kind {
                    super::WatchFloor::Watches => {
                        "the operator's watches alone (`--watch-floor`: its watch layer, no controller behind it)"
                    }
                    super::WatchFloor::Bare => {
                        "the same watches read as text, nothing decoded (`--watch-floor bare`)"
                    }
                };
                line(format!(
                    "| {what}, CPU per machine, clock start to all ready | {:.2} ms | |",
                    floor.cpu * 1000.0 / m
                ));
                if floor.kind == super::WatchFloor::Watches {
                    let (machine, cluster, pool) = floor.counts.wakes;
                    line(format!(
                        "| wake-ups their mappers sent per machine, clock start to all ready (machine, cluster, pool controllers) | {:.2}, {:.2}, {:.2} | |",
                        machine as f64 / m,
                        cluster as f64 / m,
                        pool as f64 / m
                    ));
                }
                for (path, events, bytes) in &floor.counts.bare {
                    line(format!(
                        "| watch events per machine of `{path}`, clock start to all ready | {:.2} ({:.1} KiB) | |",
                        *events as f64 / m,
                        *bytes as f64 / 1024.0 / m
                    ));
                }
            }
            if let Some(steady) = self.operator_cpu_steady {
                let per_second = steady * 1000.0 / self.steady.as_secs_f64().max(f64::EPSILON);
                line(format!(
                    "| operator CPU in the steady window (all machines ready: polls, watches, CAPI's last writes) | {per_second:.2} ms/s ({:.2} ms/s per host) | |",
                    per_second / a.hosts as f64
                ));
            }
            line(format!(
                "| operator peak RSS | {:.1} MiB | ≤ {} MiB {} |",
                rss as f64 / 1024.0,
                self.rss_target_mib(),
                mark(rss <= self.rss_target_mib() * 1024)
            ));
        }
        if let Some(cpu) = self.upstream_cpu {
            line(format!(
                "| upstream CPU (etcd, kube-apiservers, kube-controller-manager, CAPI core and CABPK) | {cpu:.1} s | |"
            ));
            line(format!(
                "| upstream CPU per machine | {:.2} ms | |",
                cpu * 1000.0 / m
            ));
        }
        if let Some(reviews) = &self.conversion_reviews {
            let total: u64 = reviews.values().sum();
            let by: Vec<String> = reviews
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(k, n)| format!("{k}: {n}"))
                .collect();
            line(format!(
                "| conversion reviews the API server sent us, clock start to end{} | {total} ({:.2} per machine) | {} |",
                if self.args.v1alpha1_unserved {
                    " (v1alpha1 unserved)"
                } else {
                    ""
                },
                total as f64 / m,
                by.join("; ")
            ));
        }
        if let Some((all, operator)) = self.throttled {
            line(format!(
                "| requests answered 429 (priority and fairness) until ready | {all} ({operator} of the operator's) | |"
            ));
        }
        if let Some(cpu) = self.simulators_cpu {
            line(format!(
                "| simulators CPU (bench process: {}) | {cpu:.1} s | |",
                if real {
                    "hollow hosts and kubelets, KubeadmControlPlane stand-in"
                } else {
                    "emulator, CAPI stand-in, hollow hosts and kubelets"
                }
            ));
            line(format!(
                "| simulators CPU per machine | {:.2} ms | |",
                cpu * 1000.0 / m
            ));
        }
        line(String::new());
        line("Operator API requests until ready, per machine, by verb and resource:\n".into());
        line("| verb | resource | per machine | total |".into());
        line("|---|---|---|---|".into());
        for (verb, resource, n) in self.operator_requests.iter() {
            line(format!(
                "| {verb} | {resource} | {:.3} | {n} |",
                n as f64 / m
            ));
        }
        line(String::new());
        line(format!(
            "All API requests until ready ({}), per machine: {:.1}\n",
            if real {
                "operator, CAPI core, CABPK, kube-controller-manager, the stand-in, the bench"
            } else {
                "operator, CAPI stand-in, hollow kubelets"
            },
            self.all_requests.total() as f64 / m
        ));
        line("| verb | resource | per machine | total |".into());
        line("|---|---|---|---|".into());
        let mut all: Vec<_> = self.all_requests.iter().collect();
        all.sort_by_key(|(_, _, n)| std::cmp::Reverse(*n));
        for (verb, resource, n) in all.into_iter().filter(|(_, _, n)| *n as f64 / m >= 0.01) {
            line(format!(
                "| {verb} | {resource} | {:.3} | {n} |",
                n as f64 / m
            ));
        }
        line(String::new());
        line("Flintlock calls until ready and in the steady state:\n".into());
        line("| method | until ready | per machine | steady, per minute |".into());
        line("|---|---|---|---|".into());
        let methods: std::collections::BTreeSet<&str> = self
            .flintlock_to_ready
            .keys()
            .chain(self.flintlock_steady.keys())
            .copied()
            .collect();
        for method in methods {
            let ready = self.flintlock_to_ready.get(method).copied().unwrap_or(0);
            let steady = self.flintlock_steady.get(method).copied().unwrap_or(0) as f64 * 60.0
                / self.steady.as_secs_f64().max(1.0);
            line(format!(
                "| {method} | {ready} | {:.2} | {steady:.1} |",
                ready as f64 / m
            ));
        }
        line(String::new());
        let failures = self.failures();
        let uncounted = self.uncounted_on_real_stack();
        if uncounted.is_empty() {
            line(verdict(&failures));
        } else {
            let counted = if failures.is_empty() {
                "The operator's own targets (writes, steady-state calls, peak RSS) met.".to_string()
            } else {
                verdict(&failures)
            };
            line(format!(
                "{counted} Not counted on the real stack, where real CAPI sets the pace: {}.",
                uncounted.join("; ")
            ));
        }
        out
    }
}

/// A target's cell in a report's table.
pub(crate) fn mark(ok: bool) -> &'static str {
    if ok { "PASS" } else { "FAIL" }
}

/// A report's last line: every target met, or the ones missed.
pub(crate) fn verdict(failures: &[String]) -> String {
    if failures.is_empty() {
        "All targets met.".into()
    } else {
        format!("Targets missed: {}.", failures.join("; "))
    }
}
