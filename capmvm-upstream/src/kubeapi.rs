//! kube-apiserver on loopback: generated certificates, RBAC (with the Node authorizer), the default
//! admission plugins plus NodeRestriction, and an audit log at metadata level.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;
use kube::api::PostParams;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::audit::AuditLog;
use crate::pki::{Ca, KeyPairPem, service_account_key, write_private};
use crate::process::Process;
use crate::{Binaries, Error, Result, free_port_on, io_error};

/// How to run one kube-apiserver.
#[derive(Debug)]
pub struct ApiServerOptions {
    /// Names its directory (`<dir>/<name>`) and its log.
    pub name: String,
    /// The directory its files go under.
    pub dir: PathBuf,
    /// The etcd it stores in.
    pub etcd_url: String,
    /// Its key prefix in etcd (several servers can share one etcd).
    pub etcd_prefix: String,
    /// The address it listens on (a workload cluster takes one 127.0.0.x of its own so it can keep
    /// the usual port 6443).
    pub bind: IpAddr,
    /// Its port; `None` picks a free one.
    pub port: Option<u16>,
    /// The CA that signs its serving certificate and the client certificates it accepts; `None`
    /// generates one. A workload cluster passes the CA of its `<cluster>-ca` Secret, so the
    /// kubeconfig Cluster API writes from that Secret reaches it.
    pub ca: Option<Ca>,
    /// Whether to keep an audit log (metadata level, every request once it completes).
    pub audit: bool,
    /// More flags.
    pub extra_args: Vec<String>,
}

impl ApiServerOptions {
    /// A server named `name` under `dir`, storing in `etcd_url` under `/registry`, on a free
    /// loopback port, with an audit log.
    pub fn new(name: &str, dir: &Path, etcd_url: &str) -> Self {
        Self {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            etcd_url: etcd_url.to_string(),
            etcd_prefix: "/registry".to_string(),
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: None,
            ca: None,
            audit: true,
            extra_args: Vec::new(),
        }
    }
}

/// A running kube-apiserver; dropping it kills it.
pub struct KubeApiServer {
    process: Process,
    dir: PathBuf,
    url: String,
    ca: Ca,
    kubeconfig: PathBuf,
    audit_log: Option<PathBuf>,
}

impl std::fmt::Debug for KubeApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeApiServer")
            .field("url", &self.url)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// The audit policy: every request at metadata level, logged once it completes.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [\"RequestReceived\"]\nrules:\n- level: Metadata\n";

impl KubeApiServer {
    /// Starts it and waits until `/readyz` answers (RBAC's bootstrap roles included).
    pub async fn start(binaries: &Binaries, options: ApiServerOptions) -> Result<KubeApiServer> {
        let program = binaries.path("kube-apiserver")?;
        let dir = options.dir.join(&options.name);
        std::fs::create_dir_all(&dir).map_err(io_error(&dir))?;
        let port = match options.port {
            Some(p) => p,
            None => free_port_on(options.bind)?,
        };
        let host = match options.bind {
            IpAddr::V6(ip) => format!("[{ip}]"),
            IpAddr::V4(ip) => ip.to_string(),
        };
        let url = format!("https://{host}:{port}");
        let ca = match options.ca {
            Some(ca) => ca,
            None => Ca::generate(&format!("{} CA", options.name))?,
        };
        ca.pem().write(&dir, "ca")?;
        let mut ips = vec![options.bind, IpAddr::V4(Ipv4Addr::LOCALHOST)];
        ips.dedup();
        // 10.96.0.1 is the `kubernetes` Service's address in the default service range.
        ips.push(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1)));
        ca.issue_server(
            "kube-apiserver",
            &ips,
            &[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
            ],
        )?
        .write(&dir, "apiserver")?;
        let (sa_private, sa_public) = service_account_key()?;
        write_private(&dir.join("sa.key"), sa_private.as_bytes())?;
        let sa_pub = dir.join("sa.pub");
        std::fs::write(&sa_pub, sa_public).map_err(io_error(&sa_pub))?;
        let admin = ca.issue_client("kubernetes-admin", &["system:masters"])?;
        let kubeconfig = dir.join("kubeconfig");
        write_private(
            &kubeconfig,
            client_kubeconfig(
                &options.name,
                &url,
                &ca.cert_pem(),
                Credentials::Certificate(&admin),
            )
            .as_bytes(),
        )?;

        let file = |name: &str| dir.join(name).display().to_string();
        let mut args = vec![
            format!("--etcd-servers={}", options.etcd_url),
            format!("--etcd-prefix={}", options.etcd_prefix),
            format!("--bind-address={}", options.bind),
            format!("--advertise-address={}", options.bind),
            format!("--secure-port={port}"),
            format!("--tls-cert-file={}", file("apiserver.crt")),
            format!("--tls-private-key-file={}", file("apiserver.key")),
            format!("--client-ca-file={}", file("ca.crt")),
            format!("--service-account-key-file={}", file("sa.pub")),
            format!("--service-account-signing-key-file={}", file("sa.key")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_string(),
            "--service-cluster-ip-range=10.96.0.0/12".to_string(),
            "--authorization-mode=Node,RBAC".to_string(),
            // The default plugins stay on; NodeRestriction is what kubeadm adds.
            "--enable-admission-plugins=NodeRestriction".to_string(),
            "--allow-privileged=true".to_string(),
            // A loopback advertise address is not a valid endpoint for the `kubernetes` Service.
            "--endpoint-reconciler-type=none".to_string(),
            "--profiling=false".to_string(),
        ];
        let audit_log = if options.audit {
            let policy = dir.join("audit-policy.yaml");
            std::fs::write(&policy, AUDIT_POLICY).map_err(io_error(&policy))?;
            let log = dir.join("audit.log");
            args.push(format!("--audit-policy-file={}", policy.display()));
            args.push(format!("--audit-log-path={}", log.display()));
            args.push("--audit-log-format=json".to_string());
            args.push("--audit-log-mode=blocking".to_string());
            Some(log)
        } else {
            None
        };
        args.extend(options.extra_args);
        let process = Process::spawn(
            &format!("kube-apiserver ({})", options.name),
            &program,
            &args,
            &[],
            &dir.join("kube-apiserver.log"),
        )?;
        let mut server = KubeApiServer {
            process,
            dir,
            url,
            ca,
            kubeconfig,
            audit_log,
        };
        server.wait_ready().await?;
        tracing::info!(name = %options.name, url = %server.url, "kube-apiserver ready");
        Ok(server)
    }

    /// Waits until `/readyz` answers `ok`.
    async fn wait_ready(&mut self) -> Result<()> {
        let client = client_from(&self.kubeconfig).await?;
        self.process
            .wait_ready(Duration::from_secs(90), || {
                let client = client.clone();
                async move {
                    let request = http::Request::get("/readyz")
                        .body(Vec::new())
                        .map_err(|e| e.to_string())?;
                    match client.request_text(request).await {
                        Ok(body) => Ok(body.trim() == "ok"),
                        Err(e) => Err(e.to_string()),
                    }
                }
            })
            .await
    }

    /// Kills it at once (SIGKILL), as a crash would; [`KubeApiServer::restart`] starts it again.
    pub async fn crash(&mut self) {
        self.process.crash().await;
    }

    /// Starts it again with the same flags, certificates, port and audit log (killing it first if
    /// it runs); returns once `/readyz` answers `ok`.
    pub async fn restart(&mut self) -> Result<()> {
        self.process.respawn().await?;
        self.wait_ready().await
    }

    /// Its URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Its directory (certificates, kubeconfig, logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The administrator's kubeconfig (`system:masters`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Its CA.
    pub fn ca(&self) -> &Ca {
        &self.ca
    }

    /// Its process id.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Its log.
    pub fn log(&self) -> &Path {
        self.process.log()
    }

    /// An administrator's client.
    pub async fn client(&self) -> Result<kube::Client> {
        client_from(&self.kubeconfig).await
    }

    /// Its audit log, when it keeps one.
    pub fn audit(&self) -> Option<AuditLog> {
        self.audit_log.as_deref().map(AuditLog::new)
    }

    /// Writes a kubeconfig at `path` that authenticates as ServiceAccount `namespace/name` with a
    /// token from the TokenRequest API (valid `ttl`), as a Pod of that ServiceAccount would.
    pub async fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
        ttl: Duration,
        path: &Path,
    ) -> Result<PathBuf> {
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client().await?, namespace);
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: Vec::new(),
                expiration_seconds: Some(i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX)),
                ..Default::default()
            },
            ..Default::default()
        };
        let token = accounts
            .create_token_request(name, &PostParams::default(), &request)
            .await?
            .status
            .map(|s| s.token)
            .unwrap_or_default();
        write_private(
            path,
            client_kubeconfig(
                name,
                &self.url,
                &self.ca.cert_pem(),
                Credentials::Token(&token),
            )
            .as_bytes(),
        )?;
        Ok(path.to_path_buf())
    }

    /// Writes a kubeconfig at `path` for user `user` in `groups`, with a client certificate.
    pub fn user_kubeconfig(&self, user: &str, groups: &[&str], path: &Path) -> Result<PathBuf> {
        let cert = self.ca.issue_client(user, groups)?;
        write_private(
            path,
            client_kubeconfig(
                user,
                &self.url,
                &self.ca.cert_pem(),
                Credentials::Certificate(&cert),
            )
            .as_bytes(),
        )?;
        Ok(path.to_path_buf())
    }

    /// Stops it (SIGTERM).
    pub async fn stop(self) {
        self.process.stop().await;
    }
}

/// How a kubeconfig's user authenticates.
pub enum Credentials<'a> {
    /// A client certificate.
    Certificate(&'a KeyPairPem),
    /// A bearer token.
    Token(&'a str),
}

/// A kubeconfig with one cluster, user and context, all named `name`.
pub fn client_kubeconfig(
    name: &str,
    server: &str,
    ca_pem: &str,
    credentials: Credentials<'_>,
) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let user = match credentials {
        Credentials::Certificate(pair) => format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(&pair.cert),
            b64(&pair.key)
        ),
        Credentials::Token(token) => format!("    token: {token}\n"),
    };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\ncontexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: {name}\ncurrent-context: {name}\nusers:\n- name: {name}\n  user:\n{user}preferences: {{}}\n",
        ca = b64(ca_pem),
    )
}

/// A client from a kubeconfig file.
pub async fn client_from(path: &Path) -> Result<kube::Client> {
    let fail = |message: String| Error::Kubeconfig {
        path: path.to_path_buf(),
        message,
    };
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| fail(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| fail(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| fail(e.to_string()))
}
