//! The pinned kubectl and clusterctl, run as a user runs them.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::io::AsyncWriteExt as _;

use crate::{Binaries, Error, Result};

/// Runs `program args` with `env`, `stdin` fed in; its stdout on success.
pub(crate) async fn run(
    program: &Path,
    args: &[&str],
    env: &[(String, String)],
    stdin: Option<&[u8]>,
) -> Result<String> {
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .env_remove("KUBECONFIG")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    crate::process::die_with_parent(&mut command);
    for (k, v) in env {
        command.env(k, v);
    }
    let line = format!("{} {}", program.display(), args.join(" "));
    let mut child = command.spawn().map_err(|source| Error::Spawn {
        what: line.clone(),
        source,
    })?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input).await.map_err(|source| Error::Spawn {
            what: line.clone(),
            source,
        })?;
        drop(pipe);
    }
    let output = child
        .wait_with_output()
        .await
        .map_err(|source| Error::Spawn {
            what: line.clone(),
            source,
        })?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(Error::Command {
            command: line,
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        })
    }
}

/// The pinned kubectl with a kubeconfig.
#[derive(Clone, Debug)]
pub struct Kubectl {
    program: PathBuf,
    kubeconfig: PathBuf,
}

impl Kubectl {
    /// kubectl from `binaries`, using `kubeconfig`.
    pub fn new(binaries: &Binaries, kubeconfig: &Path) -> Result<Kubectl> {
        Ok(Kubectl {
            program: binaries.path("kubectl")?,
            kubeconfig: kubeconfig.to_path_buf(),
        })
    }

    /// The binary.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// `kubectl --kubeconfig <k> args...`; its stdout.
    pub async fn run(&self, args: &[&str]) -> Result<String> {
        let kubeconfig = self.kubeconfig.display().to_string();
        let mut all = vec!["--kubeconfig", kubeconfig.as_str()];
        all.extend_from_slice(args);
        run(&self.program, &all, &[], None).await
    }

    /// `kubectl apply -f -` (with `extra` flags) of `manifest`; its stdout.
    pub async fn apply(&self, manifest: &str, extra: &[&str]) -> Result<String> {
        let kubeconfig = self.kubeconfig.display().to_string();
        let mut all = vec!["--kubeconfig", kubeconfig.as_str(), "apply", "-f", "-"];
        all.extend_from_slice(extra);
        run(&self.program, &all, &[], Some(manifest.as_bytes())).await
    }
}

/// The pinned clusterctl, with its configuration kept in a directory of its own (no version
/// check, no user configuration read).
#[derive(Clone, Debug)]
pub struct Clusterctl {
    program: PathBuf,
    home: PathBuf,
}

impl Clusterctl {
    /// clusterctl from `binaries`, keeping its configuration under `home`.
    pub fn new(binaries: &Binaries, home: &Path) -> Result<Clusterctl> {
        std::fs::create_dir_all(home).map_err(crate::io_error(home))?;
        Ok(Clusterctl {
            program: binaries.path("clusterctl")?,
            home: home.to_path_buf(),
        })
    }

    /// The binary.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// The configuration file it reads (`<home>/clusterctl.yaml`).
    pub fn config_file(&self) -> PathBuf {
        self.home.join("clusterctl.yaml")
    }

    /// `clusterctl args...` with `vars` in its environment (clusterctl reads template variables
    /// from there); its stdout.
    pub async fn run(&self, args: &[&str], vars: &[(String, String)]) -> Result<String> {
        let config = self.config_file();
        if !config.exists() {
            std::fs::write(&config, "{}\n").map_err(crate::io_error(&config))?;
        }
        let config = config.display().to_string();
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--config", config.as_str()]);
        let mut env: Vec<(String, String)> = vec![
            ("HOME".into(), self.home.display().to_string()),
            ("XDG_CONFIG_HOME".into(), self.home.display().to_string()),
            ("CLUSTERCTL_DISABLE_VERSIONCHECK".into(), "true".into()),
        ];
        env.extend(vars.iter().cloned());
        run(&self.program, &all, &env, None).await
    }

    /// `clusterctl generate yaml --from <file>`: a components file or template with its variables
    /// filled from `vars` (and their defaults).
    pub async fn generate_yaml(&self, from: &Path, vars: &[(String, String)]) -> Result<String> {
        let from = from.display().to_string();
        self.run(&["generate", "yaml", "--from", &from], vars).await
    }

    /// `clusterctl generate cluster <name> --from <template> --target-namespace <ns>`.
    pub async fn generate_cluster(
        &self,
        name: &str,
        template: &Path,
        namespace: &str,
        vars: &[(String, String)],
    ) -> Result<String> {
        let from = template.display().to_string();
        self.run(
            &[
                "generate",
                "cluster",
                name,
                "--from",
                &from,
                "--target-namespace",
                namespace,
            ],
            vars,
        )
        .await
    }

    /// `clusterctl generate cluster <name> --from <template> --list-variables`.
    pub async fn list_variables(&self, template: &Path) -> Result<String> {
        let from = template.display().to_string();
        self.run(
            &[
                "generate",
                "cluster",
                "x",
                "--from",
                &from,
                "--list-variables",
            ],
            &[],
        )
        .await
    }
}
