#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The real `kubectl` against the emulator: discovery, `get` with short names, categories and printer
//! columns, client-side `apply`, `patch`, `delete`, `wait --for=condition`, `explain`.
//!
//! The kubectl is the pinned one `hack/upstream.sh build` makes (skipped locally when it is missing, a
//! failure under CI); each test uses its own kubeconfig and cache dir.

mod kube_support;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use capmvm_kube_emulator::EmulatorHandle;
use kube::api::{Patch, PatchParams};
use kube_support::*;
use serde_json::json;

struct Kubectl {
    bin: PathBuf,
    dir: PathBuf,
    kubeconfig: PathBuf,
}

impl Kubectl {
    /// The pinned kubectl (`hack/upstream.sh build`) for the emulator; `None` (the test skipped)
    /// when it is not built, outside CI.
    fn new(emu: &EmulatorHandle, name: &str) -> Option<Self> {
        let bin = capmvm_upstream::Binaries::for_test(name, &["kubectl"])?
            .path("kubectl")
            .ok()?;
        let dir =
            std::env::temp_dir().join(format!("capmvm-kubectl-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let kubeconfig = dir.join("kubeconfig");
        emu.write_kubeconfig(&kubeconfig).unwrap();
        Some(Self {
            bin,
            dir,
            kubeconfig,
        })
    }

    fn run(&self, args: &[&str]) -> Output {
        self.run_stdin(args, None)
    }

    fn run_stdin(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.dir.join("cache"))
            .args(args);
        cmd.env("HOME", &self.dir).env_remove("KUBECONFIG");
        match stdin {
            None => cmd.output().expect("kubectl runs"),
            Some(input) => {
                use std::io::Write as _;
                let mut child = cmd
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("kubectl runs");
                child
                    .stdin
                    .take()
                    .unwrap()
                    .write_all(input.as_bytes())
                    .unwrap();
                child.wait_with_output().unwrap()
            }
        }
    }

    /// Runs and expects failure; returns stderr.
    fn fails(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.run_stdin(args, stdin);
        assert!(!out.status.success(), "kubectl {args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// Runs and expects success without anything on stderr; returns stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert_clean(args, &out);
        String::from_utf8(out.stdout).unwrap()
    }

    /// Applies CRDs: success, and on stderr nothing but the emulator's documented warning for a
    /// CRD whose versions convert through a webhook (ours serve v1alpha1 beside v1alpha2), which it
    /// accepts without calling.
    fn apply_crds(&self, dir: &std::path::Path) -> String {
        let args = ["apply", "-f", dir.to_str().unwrap()];
        let out = self.run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success()
                && stderr
                    .lines()
                    .filter(|l| !l.trim().is_empty())
                    .all(|l| l == WEBHOOK_CONVERSION_WARNING),
            "kubectl {args:?} failed or warned: {}\nstderr: {stderr}\nstdout: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn apply(&self, manifest: &str) -> String {
        let out = self.run_stdin(&["apply", "-f", "-"], Some(manifest));
        assert_clean(&["apply"], &out);
        String::from_utf8(out.stdout).unwrap()
    }
}

impl Drop for Kubectl {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An emulator with the project's CRDs installed, a client and a kubectl for it; `None` (the test
/// skipped) as for `Kubectl::new`.
async fn with_project_crds(name: &str) -> Option<(EmulatorHandle, kube::Client, Kubectl)> {
    let (emu, client) = start_with_project_crds().await;
    let k = Kubectl::new(&emu, name)?;
    Some((emu, client, k))
}

/// The emulator's warning for a CRD converting through a webhook (a deliberate difference, README).
const WEBHOOK_CONVERSION_WARNING: &str = "Warning: conversion webhooks are not called by the API emulator: versions differ only in apiVersion";

fn assert_clean(args: &[&str], out: &Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "kubectl {args:?} failed or warned: {}\nstderr: {stderr}\nstdout: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Cells of a `kubectl get` table, cut at the header's column starts (empty cells stay empty).
fn table(out: &str) -> Vec<Vec<String>> {
    let mut lines = out.lines();
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let mut starts = vec![0];
    let bytes = header.as_bytes();
    for i in 1..bytes.len() {
        // Columns are separated by at least two spaces ("LAST SEEN" is one column).
        if bytes[i] != b' ' && bytes[i - 1] == b' ' && i >= 2 && bytes[i - 2] == b' ' {
            starts.push(i);
        }
    }
    let cut = |l: &str| -> Vec<String> {
        starts
            .iter()
            .enumerate()
            .map(|(n, &s)| {
                let e = starts.get(n + 1).copied().unwrap_or(l.len()).min(l.len());
                l.get(s.min(l.len())..e).unwrap_or("").trim().to_string()
            })
            .collect()
    };
    std::iter::once(header).chain(lines).map(cut).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_discovers_builtin_and_custom_resources() {
    let Some((_emu, _client, k)) = with_project_crds("discovery").await else {
        return;
    };
    let out = k.ok(&["api-resources"]);
    // kubectl pads its columns to the longest name in the table, so rows are compared as
    // fields: a new CRD with a longer name must not break the assertion.
    let rows: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    for expected in [
        "microvmmachines mvmm infrastructure.cluster.x-k8s.io/v1alpha2 true MicrovmMachine",
        "microvmclusters mvmc infrastructure.cluster.x-k8s.io/v1alpha2 true MicrovmCluster",
        "microvmmachinetemplates mvmmt infrastructure.cluster.x-k8s.io/v1alpha2 true MicrovmMachineTemplate",
        "microvmclustertemplates mvmct infrastructure.cluster.x-k8s.io/v1alpha2 true MicrovmClusterTemplate",
        "namespaces ns v1 false Namespace",
        "leases coordination.k8s.io/v1 true Lease",
        "customresourcedefinitions crd,crds apiextensions.k8s.io/v1 false CustomResourceDefinition",
    ] {
        let want: Vec<&str> = expected.split(' ').collect();
        assert!(rows.contains(&want), "missing row {expected:?} in:\n{out}");
    }
    let cats = k.ok(&["api-resources", "--categories=cluster-api", "-o", "name"]);
    let mut names: Vec<&str> = cats.lines().collect();
    names.sort_unstable();
    assert_eq!(
        names,
        vec![
            "microvmclusters.infrastructure.cluster.x-k8s.io",
            "microvmclustertemplates.infrastructure.cluster.x-k8s.io",
            "microvmmachinepools.infrastructure.cluster.x-k8s.io",
            "microvmmachinepooltemplates.infrastructure.cluster.x-k8s.io",
            "microvmmachines.infrastructure.cluster.x-k8s.io",
            "microvmmachinetemplates.infrastructure.cluster.x-k8s.io"
        ]
    );
    let version = k.ok(&["version", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&version).unwrap();
    assert_eq!(v["serverVersion"]["major"], "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_prints_the_printer_columns() {
    let Some((_emu, client, k)) = with_project_crds("get").await else {
        return;
    };
    create_machine(&client, "default", "m1").await;
    create_machine(&client, "default", "m2").await;
    machines(&client, "default")
        .patch_status(
            "m1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"host": "10.0.0.1:9090", "vmState": "running", "conditions": [
                {"type": "Paused", "status": "False", "reason": "NotPaused", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "Ready", "status": "True", "reason": "Running", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}
            ]}})),
        )
        .await
        .unwrap();

    let rows = table(&k.ok(&["get", "mvmm"]));
    assert_eq!(
        rows[0],
        vec![
            "NAME",
            "CLUSTER",
            "HOST",
            "STATE",
            "PROVIDERID",
            "READY",
            "AGE"
        ]
    );
    assert_eq!(
        rows[1][..6],
        ["m1", "c1", "10.0.0.1:9090", "running", "", "True"]
    );
    assert_eq!(
        rows[2][..3],
        ["m2", "c1", ""],
        "a missing value is an empty cell"
    );
    assert!(rows[1][6].ends_with('s'), "age {:?}", rows[1][6]);

    // Full names, categories, several kinds at once, all namespaces, labels, selectors, output formats.
    assert_eq!(
        table(&k.ok(&["get", "microvmmachines.infrastructure.cluster.x-k8s.io"])).len(),
        3
    );
    let cat = k.ok(&["get", "cluster-api"]);
    assert!(
        cat.contains("microvmmachine.infrastructure.cluster.x-k8s.io/m1"),
        "{cat}"
    );
    let several = k.ok(&["get", "mvmc,mvmm,mvmmt", "-o", "name"]);
    assert_eq!(several.lines().count(), 2, "{several}");
    let all = table(&k.ok(&["get", "mvmm", "-A", "--show-labels"]));
    assert_eq!(all[0][0], "NAMESPACE");
    assert_eq!(all[1][0], "default");
    assert!(
        all[1]
            .last()
            .unwrap()
            .contains("cluster.x-k8s.io/cluster-name=c1")
    );
    let selected = k.ok(&[
        "get",
        "mvmm",
        "-l",
        "cluster.x-k8s.io/cluster-name=c1",
        "-o",
        "name",
    ]);
    assert_eq!(selected.lines().count(), 2);
    let host = k.ok(&["get", "mvmm", "m1", "-o", "jsonpath={.status.host}"]);
    assert_eq!(host, "10.0.0.1:9090");
    let yaml = k.ok(&["get", "mvmm", "m1", "-o", "yaml"]);
    assert!(
        yaml.contains("kind: MicrovmMachine") && yaml.contains("generation: 1"),
        "{yaml}"
    );
    let ns = table(&k.ok(&["get", "ns"]));
    assert_eq!(ns[0], vec!["NAME", "STATUS", "AGE"]);
    assert!(ns.iter().any(|r| r[0] == "kube-system" && r[1] == "Active"));
    let stderr = k.fails(&["get", "mvmm", "nope"], None);
    assert!(
        stderr.contains("Error from server (NotFound): microvmmachines.infrastructure.cluster.x-k8s.io \"nope\" not found"),
        "{stderr}"
    );
}

const MACHINE: &str = "apiVersion: infrastructure.cluster.x-k8s.io/v1alpha2
kind: MicrovmMachine
metadata:
  name: applied
  namespace: default
  labels:
    cluster.x-k8s.io/cluster-name: demo
spec:
  kernel: {image: ghcr.io/kernel:6.1, filename: boot/vmlinux}
  memoryMb: 2048
  vcpu: 2
  rootVolume: {id: root, image: ghcr.io/root:1}
  networkInterfaces:
  - {guestDeviceName: eth1, type: tap}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_creates_configures_and_leaves_unchanged() {
    let (emu, client) = start().await;
    let Some(k) = Kubectl::new(&emu, "apply") else {
        return;
    };
    let crds = repo_root().join("config/crd/bases");
    let files = std::fs::read_dir(&crds).unwrap().count();
    let out = k.apply_crds(&crds);
    assert_eq!(out.matches(" created").count(), files, "{out}");
    let out = k.apply_crds(&crds);
    assert_eq!(out.matches(" unchanged").count(), files, "{out}");

    assert_eq!(
        k.apply(MACHINE).trim(),
        "microvmmachine.infrastructure.cluster.x-k8s.io/applied created"
    );
    assert_eq!(
        k.apply(MACHINE).trim(),
        "microvmmachine.infrastructure.cluster.x-k8s.io/applied unchanged"
    );
    let changed = MACHINE.replace("vcpu: 2", "vcpu: 4");
    assert_eq!(
        k.apply(&changed).trim(),
        "microvmmachine.infrastructure.cluster.x-k8s.io/applied configured"
    );
    let m = machines(&client, "default").get("applied").await.unwrap();
    assert_eq!(m.data["spec"]["vcpu"], 4);
    assert_eq!(m.metadata.generation, Some(2));
    assert!(
        m.metadata
            .annotations
            .unwrap()
            .contains_key("kubectl.kubernetes.io/last-applied-configuration")
    );

    // Built-in kinds go through strategic merge patches.
    let secret = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: creds\n  namespace: default\nstringData:\n  token: abc\n";
    assert_eq!(k.apply(secret).trim(), "secret/creds created");
    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\ndata:\n  a: \"1\"\n";
    assert_eq!(k.apply(cm).trim(), "configmap/cfg created");
    assert_eq!(k.apply(cm).trim(), "configmap/cfg unchanged");
    assert_eq!(
        k.apply(&cm.replace("a: \"1\"", "b: \"2\"")).trim(),
        "configmap/cfg configured"
    );
    let data = k.ok(&["get", "cm", "cfg", "-o", "jsonpath={.data}"]);
    assert_eq!(
        data, r#"{"b":"2"}"#,
        "the removed key is deleted by the three-way patch"
    );

    // Server-side validation (kubectl's default is strict): an unknown field fails.
    let bad = MACHINE.replace("vcpu: 2", "vcpu: 2\n  bogus: 1");
    let stderr = k.fails(&["apply", "-f", "-"], Some(&bad));
    assert!(stderr.contains("unknown field \"spec.bogus\""), "{stderr}");
    // And a schema violation is reported with its field.
    let stderr = k.fails(
        &["apply", "-f", "-"],
        Some(&MACHINE.replace("vcpu: 2", "vcpu: 100")),
    );
    assert!(stderr.contains("spec.vcpu: Invalid value: 100"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_patch_merge_and_json_and_strategic_is_415_on_custom_resources() {
    let Some((_emu, client, k)) = with_project_crds("patch").await else {
        return;
    };
    create_machine(&client, "default", "m").await;
    let patch_m = |args: &[&str]| k.ok(&[&["patch", "mvmm", "m"], args].concat());
    let out = patch_m(&[
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"providerID":"microvm://h/1"}}"#,
    ]);
    assert_eq!(
        out.trim(),
        "microvmmachine.infrastructure.cluster.x-k8s.io/m patched"
    );
    let out = patch_m(&[
        "--type",
        "json",
        "-p",
        r#"[{"op":"replace","path":"/spec/vcpu","value":6}]"#,
    ]);
    assert_eq!(
        out.trim(),
        "microvmmachine.infrastructure.cluster.x-k8s.io/m patched"
    );
    let out = patch_m(&[
        "--subresource",
        "status",
        "--type",
        "merge",
        "-p",
        r#"{"status":{"host":"h"}}"#,
    ]);
    assert!(out.contains("patched"), "{out}");
    let m = machines(&client, "default").get("m").await.unwrap();
    assert_eq!(m.data["spec"]["providerID"], "microvm://h/1");
    assert_eq!(m.data["spec"]["vcpu"], 6);
    assert_eq!(m.data["status"]["host"], "h");
    // kubectl's default patch type is strategic, which custom resources refuse as a real server does.
    let stderr = k.fails(
        &["patch", "mvmm", "m", "-p", r#"{"spec":{"vcpu":3}}"#],
        None,
    );
    assert!(
        stderr.contains("application/strategic-merge-patch+json is not supported"),
        "{stderr}"
    );
    // A failed JSON patch test.
    assert!(
        k.fails(
            &[
                "patch",
                "mvmm",
                "m",
                "--type",
                "json",
                "-p",
                r#"[{"op":"test","path":"/spec/vcpu","value":1}]"#,
            ],
            None
        )
        .contains("test failed")
    );
    // Strategic merge on a built-in.
    k.ok(&[
        "create",
        "configmap",
        "cfg",
        "--from-literal=a=1",
        "--dry-run=client",
        "-o",
        "yaml",
    ]);
    k.apply("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\ndata:\n  a: \"1\"\n");
    let out = k.ok(&["patch", "cm", "cfg", "-p", r#"{"data":{"b":"2"}}"#]);
    assert_eq!(out.trim(), "configmap/cfg patched");
    assert_eq!(k.ok(&["get", "cm", "cfg", "-o", "jsonpath={.data.b}"]), "2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_wait_for_a_condition_and_delete() {
    let Some((_emu, client, k)) = with_project_crds("wait").await else {
        return;
    };
    create_machine(&client, "default", "m").await;
    // The condition becomes true while kubectl waits on its watch.
    let client2 = client.clone();
    let setter = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(700)).await;
        machines(&client2, "default")
            .patch_status(
                "m",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"conditions": [
                    {"type": "Ready", "status": "True", "reason": "Running", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}
                ]}})),
            )
            .await
            .unwrap();
    });
    let started = std::time::Instant::now();
    let out = k.ok(&["wait", "--for=condition=Ready", "mvmm/m", "--timeout=30s"]);
    assert_eq!(
        out.trim(),
        "microvmmachine.infrastructure.cluster.x-k8s.io/m condition met"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "kubectl waited for the change"
    );
    setter.await.unwrap();

    // A finalizer holds the deletion; `kubectl delete --wait=false` returns, `wait --for=delete` waits.
    machines(&client, "default")
        .merge(
            "m",
            json!({"metadata": {"finalizers": ["example.com/hold"]}}),
        )
        .await;
    let out = k.ok(&["delete", "mvmm", "m", "--wait=false"]);
    assert_eq!(
        out.trim(),
        "microvmmachine.infrastructure.cluster.x-k8s.io \"m\" deleted from default namespace"
    );
    let client3 = client.clone();
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        machines(&client3, "default").release_finalizers("m").await;
    });
    let out = k.ok(&["wait", "--for=delete", "mvmm/m", "--timeout=30s"]);
    assert!(out.contains("condition met"), "{out}");
    release.await.unwrap();
    // A plain delete waits for the object to go.
    create_machine(&client, "default", "n").await;
    let out = k.ok(&["delete", "mvmm", "n"]);
    assert_eq!(
        out.trim(),
        "microvmmachine.infrastructure.cluster.x-k8s.io \"n\" deleted from default namespace"
    );
    assert!(k.ok(&["get", "mvmm", "-o", "name"]).trim().is_empty());
    let out = k.run(&["delete", "mvmm", "gone"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("NotFound"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_explain_reads_the_openapi_v3_documents() {
    let Some((_emu, _client, k)) = with_project_crds("explain").await else {
        return;
    };
    let out = k.ok(&["explain", "mvmm.spec.kernel"]);
    assert!(out.contains("KIND:       MicrovmMachine"), "{out}");
    assert!(
        out.contains("The kernel, as a file inside a container image."),
        "{out}"
    );
    assert!(out.contains("filename\t<string> -required-"), "{out}");
    let out = k.ok(&["explain", "mvmm.metadata.labels"]);
    assert!(out.contains("map[string]string"), "{out}");
    let out = k.ok(&["explain", "leases.spec"]);
    assert!(out.contains("holderIdentity"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_create_sends_protobuf_for_builtins_and_events_print() {
    let (emu, client) = start().await;
    let Some(k) = Kubectl::new(&emu, "create") else {
        return;
    };
    assert_eq!(
        k.ok(&["create", "namespace", "demo"]).trim(),
        "namespace/demo created"
    );
    assert_eq!(
        k.ok(&[
            "create",
            "secret",
            "generic",
            "creds",
            "-n",
            "demo",
            "--from-literal=token=s3cr3t"
        ])
        .trim(),
        "secret/creds created"
    );
    assert_eq!(
        k.ok(&[
            "create",
            "configmap",
            "cfg",
            "-n",
            "demo",
            "--from-literal=a=1"
        ])
        .trim(),
        "configmap/cfg created"
    );
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client.clone(), "demo");
    let s = secrets.get("creds").await.unwrap();
    assert_eq!(s.data.unwrap()["token"].0, b"s3cr3t");
    assert_eq!(s.type_.as_deref(), Some("Opaque"));
    let rows = table(&k.ok(&["get", "secrets", "-n", "demo"]));
    assert_eq!(rows[0], vec!["NAME", "TYPE", "DATA", "AGE"]);
    assert_eq!(rows[1][..3], ["creds", "Opaque", "1"]);
    // `kubectl create -f` of a custom resource sends JSON.
    install_project_crds(&client).await;
    let out = k.run_stdin(&["create", "-f", "-"], Some(MACHINE));
    assert_clean(&["create", "-f", "-"], &out);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "microvmmachine.infrastructure.cluster.x-k8s.io/applied created"
    );

    // Events written through events.k8s.io/v1 print in both APIs.
    let ev = "apiVersion: events.k8s.io/v1
kind: Event
metadata: {name: ev1, namespace: demo}
eventTime: \"2026-01-01T00:00:00.000000Z\"
reportingController: capmvm
reportingInstance: capmvm-0
action: Provision
reason: Created
type: Normal
note: microVM created
regarding: {kind: MicrovmMachine, name: m1, namespace: demo}
";
    assert_eq!(k.apply(ev).trim(), "event.events.k8s.io/ev1 created");
    for resource in ["events", "events.events.k8s.io"] {
        let rows = table(&k.ok(&["get", resource, "-n", "demo"]));
        assert_eq!(
            rows[0],
            vec!["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"],
            "{resource}"
        );
        assert_eq!(
            rows[1][1..],
            ["Normal", "Created", "microvmmachine/m1", "microVM created"],
            "{resource}"
        );
    }
}

/// A `capmvm-kube-emulator` child process, killed if a test fails before it ends.
struct ChildGuard(std::process::Child);

impl ChildGuard {
    /// Starts the command on a free port, writing its kubeconfig to `kubeconfig`, with `args` after
    /// the port.
    fn spawn(args: &[&str], kubeconfig: &std::path::Path, stdout: Stdio, stderr: Stdio) -> Self {
        Self(
            Command::new(env!("CARGO_BIN_EXE_capmvm-kube-emulator"))
                .args(["--port", "0"])
                .args(args)
                .arg("--kubeconfig")
                .arg(kubeconfig)
                .stdin(Stdio::null())
                .stdout(stdout)
                .stderr(stderr)
                .spawn()
                .expect("capmvm-kube-emulator starts"),
        )
    }

    /// Sends the signal named `signal` (`TERM`, `INT`) and expects a clean exit within 20 s.
    fn stop_cleanly(&mut self, signal: &str) {
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &self.0.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        let status = wait_exit(&mut self.0, Duration::from_secs(20))
            .unwrap_or_else(|| panic!("exits on SIG{signal}"));
        assert!(status.success(), "{status}");
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits for a child to exit, up to `limit`.
fn wait_exit(child: &mut std::process::Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

fn command_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("capmvm-kube-cmd-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn the_kube_command_serves_kubectl_through_the_kubeconfig_it_writes() {
    use std::io::BufRead as _;
    let dir = command_dir("serve");
    let kubeconfig = dir.join("kubeconfig");
    let mut child = ChildGuard::spawn(&[], &kubeconfig, Stdio::piped(), Stdio::inherit());
    // The command prints the URL (with the port it was given for `--port 0`), then the kubeconfig path.
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut url = None;
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("capmvm-kube-emulator reports where it serves");
        if let Some(u) = line.strip_prefix("Kubernetes API emulator at ") {
            url = Some(u.to_string());
        }
        if line.starts_with("kubeconfig written to") {
            break;
        }
    }
    let url = url.expect("the URL is printed before the kubeconfig line");
    let port: u16 = url
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    assert!(url.starts_with("http://127.0.0.1:") && port != 0, "{url}");
    let written = std::fs::read_to_string(&kubeconfig).unwrap();
    assert!(written.contains(&format!("server: {url}")), "{written}");

    let Some(binaries) = capmvm_upstream::Binaries::for_test("kube_command", &["kubectl"]) else {
        return;
    };
    let k = Kubectl {
        bin: binaries.path("kubectl").unwrap(),
        dir: dir.clone(),
        kubeconfig,
    };
    let crds = repo_root().join("config/crd/bases");
    k.apply_crds(&crds);
    let names = k.ok(&["get", "crd", "-o", "name"]);
    for crd in [
        "customresourcedefinition.apiextensions.k8s.io/microvmclusters.infrastructure.cluster.x-k8s.io",
        "customresourcedefinition.apiextensions.k8s.io/microvmmachines.infrastructure.cluster.x-k8s.io",
        "customresourcedefinition.apiextensions.k8s.io/microvmmachinetemplates.infrastructure.cluster.x-k8s.io",
    ] {
        assert!(
            names.lines().any(|l| l == crd),
            "missing {crd} in:\n{names}"
        );
    }
    let kinds = k.ok(&[
        "api-resources",
        "--api-group=infrastructure.cluster.x-k8s.io",
    ]);
    for kind in ["MicrovmCluster", "MicrovmMachine", "MicrovmMachineTemplate"] {
        assert!(
            kinds
                .lines()
                .any(|l| l.trim_end().ends_with(&format!(" {kind}"))),
            "missing {kind} in:\n{kinds}"
        );
    }

    // SIGTERM stops it cleanly.
    child.stop_cleanly("TERM");
}

/// A Ctrl-C (SIGINT) sent as soon as the command prints its URL stops it cleanly: its handlers are in
/// place before anything is printed (a signal before they were ended the process with the signal's
/// default action, without the exit report).
#[test]
fn the_kube_command_stops_cleanly_on_sigint_right_after_its_url() {
    use std::io::BufRead as _;
    let dir = command_dir("sigint");
    let kubeconfig = dir.join("kubeconfig");
    let mut child = ChildGuard::spawn(&[], &kubeconfig, Stdio::piped(), Stdio::null());
    let stdout = child.0.stdout.take().unwrap();
    let mut lines = std::io::BufReader::new(stdout).lines();
    let first = lines
        .next()
        .expect("a line")
        .expect("capmvm-kube-emulator reports where it serves");
    assert!(first.starts_with("Kubernetes API emulator at "), "{first}");
    // Drain the rest so the command never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    child.stop_cleanly("INT");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_kube_command_refuses_a_non_loopback_address_without_the_opt_in() {
    let dir = command_dir("refuse");
    let kubeconfig = dir.join("kubeconfig");
    let mut child = ChildGuard::spawn(
        &["--address", "0.0.0.0"],
        &kubeconfig,
        Stdio::null(),
        Stdio::piped(),
    );
    let status = wait_exit(&mut child.0, Duration::from_secs(60))
        .expect("refuses instead of serving unauthenticated HTTP beyond loopback");
    assert!(!status.success());
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.0.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(
        stderr.contains("refusing to listen on 0.0.0.0") && stderr.contains("--insecure-bind-any"),
        "{stderr}"
    );
    assert!(!kubeconfig.exists());
    let _ = std::fs::remove_dir_all(&dir);
}
