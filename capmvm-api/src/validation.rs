//! Validation as plain functions: every error, with its JSON path and what to write instead.
//!
//! The checks cover what flintlock would reject (so a bad spec fails here, with a clear message, before
//! any host is called) and what this provider needs to work. The CRD schema repeats the limits it can
//! express (ranges, patterns, lengths); the cross-field rules live only here.

mod authorized_key;
mod image_uri;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::LazyLock;

use ipnet::IpNet;
use regex::Regex;

use crate::cluster::{MicrovmCluster, MicrovmClusterSpec, SshPublicKey};
use crate::endpoint::HostEndpoint;
use crate::host_selection;
use crate::machine::{
    IfaceType, MAX_MEMORY_MB, MAX_VCPU, MIN_MEMORY_MB, MIN_VCPU, MicrovmMachine,
    MicrovmMachineSpec, VmmProvider, Volume,
};
use crate::pool::{
    DEFAULT_MAX_SURGE, DEFAULT_MAX_UNAVAILABLE, MicrovmMachinePool, MicrovmMachinePoolSpec,
    resolve_limit,
};
use crate::provider_id::ProviderId;
use crate::template::MicrovmMachineTemplate;

/// CAPI's limit on `Cluster.status.failureDomains`.
pub const MAX_FAILURE_DOMAINS: usize = 100;

/// The guest MAC flintlock gives its own metadata interface (`eth0`, Firecracker).
const METADATA_IFACE_MAC: &str = "aa:ff:00:00:00:01";

/// One invalid field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// JSON path of the field, for example `spec.networkInterfaces[0].guestMac`.
    pub path: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Every invalid field of an object, in the order of its fields.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ValidationErrors(pub Vec<FieldError>);

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl ValidationErrors {
    /// The field errors.
    pub fn errors(&self) -> &[FieldError] {
        &self.0
    }
}

/// Collects errors under a path prefix.
struct Errors(Vec<FieldError>);

impl Errors {
    fn add(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError {
            path: path.into(),
            message: message.into(),
        });
    }

    fn finish(self) -> Result<(), ValidationErrors> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ValidationErrors(self.0))
        }
    }
}

/// Validates a MicrovmMachine's spec.
pub fn validate_machine(machine: &MicrovmMachine) -> Result<(), ValidationErrors> {
    validate_machine_spec(&machine.spec)
}

/// Validates a MicrovmMachine spec; paths start at `spec`.
pub fn validate_machine_spec(spec: &MicrovmMachineSpec) -> Result<(), ValidationErrors> {
    let mut errs = Errors(Vec::new());
    machine_spec(spec, "spec", &mut errs);
    errs.finish()
}

/// Validates a MicrovmMachineTemplate; paths start at `spec.template`.
pub fn validate_template(template: &MicrovmMachineTemplate) -> Result<(), ValidationErrors> {
    let mut errs = Errors(Vec::new());
    if let Some(meta) = &template.spec.template.metadata
        && meta.labels.is_empty()
        && meta.annotations.is_empty()
    {
        errs.add(
            "spec.template.metadata",
            "is empty; set labels or annotations, or leave metadata out",
        );
    }
    machine_spec(
        &template.spec.template.spec,
        "spec.template.spec",
        &mut errs,
    );
    if template.spec.template.spec.provider_id.is_some() {
        // Every clone would carry it, and CAPI matches Nodes by providerID: no two machines may share one.
        errs.add(
            "spec.template.spec.providerID",
            "is set by the provider on each MicrovmMachine; remove it from the template",
        );
    }
    errs.finish()
}

/// Validates a MicrovmMachinePool; template paths start at `spec.template`.
pub fn validate_pool(pool: &MicrovmMachinePool) -> Result<(), ValidationErrors> {
    validate_pool_spec(&pool.spec)
}

/// Validates a MicrovmMachinePool spec: its template as a machine's spec, and its strategy.
pub fn validate_pool_spec(spec: &MicrovmMachinePoolSpec) -> Result<(), ValidationErrors> {
    let mut errs = Errors(Vec::new());
    machine_spec(&spec.template, "spec.template", &mut errs);
    if spec.template.provider_id.is_some() {
        errs.add(
            "spec.template.providerID",
            "is set by the provider on each instance; remove it from the pool's template",
        );
    }
    if let Some(rolling) = &spec.strategy.rolling_update {
        // Resolved against 100, so a valid percentage passes whatever the replica count.
        let surge = resolve_limit(rolling.max_surge.as_ref(), DEFAULT_MAX_SURGE, 100, true);
        let unavailable = resolve_limit(
            rolling.max_unavailable.as_ref(),
            DEFAULT_MAX_UNAVAILABLE,
            100,
            false,
        );
        if let Err(e) = &surge {
            errs.add("spec.strategy.rollingUpdate.maxSurge", e.to_string());
        }
        if let Err(e) = &unavailable {
            errs.add("spec.strategy.rollingUpdate.maxUnavailable", e.to_string());
        }
        if surge == Ok(0) && unavailable == Ok(0) {
            errs.add(
                "spec.strategy.rollingUpdate",
                "maxSurge and maxUnavailable are both 0, so no instance could ever be replaced; \
                 set maxSurge to 1 or more (add before removing) or maxUnavailable to 1 or more",
            );
        }
    }
    errs.finish()
}

/// Validates a MicrovmCluster's spec.
pub fn validate_cluster(cluster: &MicrovmCluster) -> Result<(), ValidationErrors> {
    validate_cluster_spec(&cluster.spec)
}

/// Validates a MicrovmCluster spec; paths start at `spec`.
pub fn validate_cluster_spec(spec: &MicrovmClusterSpec) -> Result<(), ValidationErrors> {
    let mut errs = Errors(Vec::new());

    if let Some(ep) = &spec.control_plane_endpoint {
        let path = "spec.controlPlaneEndpoint";
        if ep.host.is_none() && ep.port.is_none() {
            errs.add(
                path,
                "is empty; set host and port, or leave controlPlaneEndpoint out",
            );
        }
        if let Some(host) = &ep.host
            && (host.is_empty() || host.len() > 512)
        {
            errs.add(format!("{path}.host"), "must be 1 to 512 characters long");
        }
        if let Some(port) = ep.port
            && !(1..=65535).contains(&port)
        {
            errs.add(
                format!("{path}.port"),
                format!("{port} is not a port; use 1 to 65535"),
            );
        }
    }

    ssh_keys(&spec.ssh_public_keys, "spec.sshPublicKeys", &mut errs);

    match &spec.placement.static_pool {
        None => errs.add(
            "spec.placement.staticPool",
            "is required; list the flintlock hosts under staticPool.hosts",
        ),
        Some(pool) => {
            let path = "spec.placement.staticPool";
            if pool.hosts.is_empty() {
                errs.add(
                    format!("{path}.hosts"),
                    "is empty; list at least one flintlock host",
                );
            }
            let mut endpoints = BTreeMap::new();
            let mut names = BTreeMap::new();
            for (i, host) in pool.hosts.iter().enumerate() {
                let hpath = format!("{path}.hosts[{i}]");
                match host.endpoint.parse::<HostEndpoint>() {
                    Ok(ep) if ep.to_string() != host.endpoint => errs.add(
                        format!("{hpath}.endpoint"),
                        format!(
                            "{:?} is not in canonical form; write {:?} (the endpoint is used verbatim in providerIDs and failure domains)",
                            host.endpoint,
                            ep.to_string()
                        ),
                    ),
                    Ok(ep) => {
                        // DNS names are case-insensitive: `Host-A:9090` and `host-a:9090` are one host.
                        if let Some(first) = endpoints.insert(ep.to_string().to_ascii_lowercase(), i) {
                            errs.add(
                                format!("{hpath}.endpoint"),
                                format!("{:?} is already the endpoint of hosts[{first}]; endpoints are unique", host.endpoint),
                            );
                        }
                    }
                    Err(e) => errs.add(
                        format!("{hpath}.endpoint"),
                        format!("{:?} {e}", host.endpoint),
                    ),
                }
                if let Some(name) = &host.name {
                    if name.is_empty() || name.len() > 256 {
                        errs.add(format!("{hpath}.name"), "must be 1 to 256 characters long");
                    }
                    if let Some(first) = names.insert(name.clone(), i) {
                        errs.add(
                            format!("{hpath}.name"),
                            format!(
                                "{name:?} is already the name of hosts[{first}]; names are unique"
                            ),
                        );
                    }
                }
                if let Some(fd) = &host.failure_domain
                    && (fd.is_empty() || fd.len() > 256)
                {
                    errs.add(
                        format!("{hpath}.failureDomain"),
                        "must be 1 to 256 characters long",
                    );
                }
                for (key, value) in &host.labels {
                    let at = format!("{hpath}.labels[{key}]");
                    if let Some(why) = host_selection::label_key_problem(key) {
                        errs.add(at.clone(), why);
                    }
                    if let Some(why) = host_selection::label_value_problem(value) {
                        errs.add(at, why);
                    }
                }
            }
            // A host without failureDomain is its own domain, named by its name or endpoint; two
            // such hosts must not share that name (one's name spelling the other's endpoint).
            let mut own_domains = BTreeMap::new();
            for (i, host) in pool.hosts.iter().enumerate() {
                if host.failure_domain.is_none()
                    && let Some(first) = own_domains.insert(host.failure_domain_name(), i)
                    && host.name.is_none() != pool.hosts[first].name.is_none()
                {
                    errs.add(
                        format!("{path}.hosts[{i}]"),
                        format!(
                            "is its own failure domain {:?}, which hosts[{first}] is too; give one of them another name, or set failureDomain on both to group them",
                            host.failure_domain_name()
                        ),
                    );
                }
            }
            // A host without failureDomain is its own domain; it must not silently join a group.
            let groups: BTreeSet<&str> = pool
                .hosts
                .iter()
                .filter_map(|h| h.failure_domain.as_deref())
                .collect();
            for (i, host) in pool.hosts.iter().enumerate() {
                if host.failure_domain.is_none() && groups.contains(host.failure_domain_name()) {
                    errs.add(
                        format!("{path}.hosts[{i}]"),
                        format!(
                            "is its own failure domain {:?}, which is also the failureDomain of other hosts; set failureDomain: {:?} to join that group, or rename the host",
                            host.failure_domain_name(),
                            host.failure_domain_name()
                        ),
                    );
                }
            }
            let domains: BTreeSet<&str> =
                pool.hosts.iter().map(|h| h.failure_domain_name()).collect();
            if domains.len() > MAX_FAILURE_DOMAINS {
                errs.add(
                    format!("{path}.hosts"),
                    format!(
                        "form {} failure domains, more than the {MAX_FAILURE_DOMAINS} a Cluster can hold; group hosts with failureDomain",
                        domains.len()
                    ),
                );
            }
            if let Some(secret) = &pool.basic_auth_secret {
                secret_name(secret, &format!("{path}.basicAuthSecret"), &mut errs);
            }
        }
    }

    if let Some(proxy) = &spec.microvm_proxy {
        let ep = proxy
            .endpoint
            .strip_prefix("http://")
            .unwrap_or(&proxy.endpoint);
        let ep = ep.strip_suffix('/').unwrap_or(ep);
        if let Err(e) = ep.parse::<HostEndpoint>() {
            errs.add(
                "spec.microvmProxy.endpoint",
                format!("{:?} {e} (an http:// prefix is accepted)", proxy.endpoint),
            );
        }
    }
    if let Some(secret) = &spec.tls_secret_ref {
        secret_name(secret, "spec.tlsSecretRef", &mut errs);
    }
    errs.finish()
}

fn machine_spec(spec: &MicrovmMachineSpec, path: &str, errs: &mut Errors) {
    let is_ch = spec.provider == Some(VmmProvider::Cloudhypervisor);

    if let Some(selector) = &spec.host_selector {
        for (at, why) in
            host_selection::selector_problems(selector, &format!("{path}.hostSelector"))
        {
            errs.add(at, why);
        }
    }

    if !(MIN_VCPU..=MAX_VCPU).contains(&spec.vcpu) {
        errs.add(
            format!("{path}.vcpu"),
            format!(
                "{} is out of range; flintlock accepts {MIN_VCPU} to {MAX_VCPU}",
                spec.vcpu
            ),
        );
    }
    if !(MIN_MEMORY_MB..=MAX_MEMORY_MB).contains(&spec.memory_mb) {
        errs.add(
            format!("{path}.memoryMb"),
            format!(
                "{} is out of range; flintlock accepts {MIN_MEMORY_MB} to {MAX_MEMORY_MB} (MiB)",
                spec.memory_mb
            ),
        );
    }

    // Volumes.
    let rpath = format!("{path}.rootVolume");
    volume_common(&spec.root_volume, &rpath, errs);
    match &spec.root_volume.image {
        None => errs.add(
            format!("{rpath}.image"),
            "is required; name the container image of the root filesystem",
        ),
        Some(image) => image_ref(image, &format!("{rpath}.image"), errs),
    }
    if spec.root_volume.virtiofs_path.is_some() {
        errs.add(
            format!("{rpath}.virtiofsPath"),
            "is not allowed on the root volume; flintlock boots only from an image",
        );
    }
    if spec.root_volume.mount_point.is_some() {
        errs.add(
            format!("{rpath}.mountPoint"),
            "is not allowed on the root volume; it is mounted at /",
        );
    }
    let mut ids = BTreeMap::new();
    ids.insert(spec.root_volume.id.as_str(), rpath.clone());
    let mut virtiofs_seen: Option<String> = None;
    for (i, vol) in spec.volumes.iter().enumerate() {
        let vpath = format!("{path}.volumes[{i}]");
        volume_common(vol, &vpath, errs);
        if let Some(first) = ids.insert(vol.id.as_str(), vpath.clone()) {
            errs.add(
                format!("{vpath}.id"),
                format!(
                    "{:?} is already the id of {first}; volume ids are unique",
                    vol.id
                ),
            );
        }
        match (&vol.image, &vol.virtiofs_path) {
            (Some(_), Some(_)) => errs.add(
                vpath.clone(),
                "sets both image and virtiofsPath; a volume has exactly one source",
            ),
            (None, None) => errs.add(vpath.clone(), "has no source; set image or virtiofsPath"),
            (Some(image), None) => image_ref(image, &format!("{vpath}.image"), errs),
            (None, Some(vfs)) => {
                if !vfs.starts_with('/') {
                    errs.add(
                        format!("{vpath}.virtiofsPath"),
                        format!("{vfs:?} is not an absolute host path"),
                    );
                }
                if !is_ch {
                    errs.add(
                        format!("{vpath}.virtiofsPath"),
                        "needs provider: cloudhypervisor; flintlock's firecracker provider has no virtiofs",
                    );
                }
                if let Some(first) = &virtiofs_seen {
                    errs.add(
                        format!("{vpath}.virtiofsPath"),
                        format!("is a second virtiofs volume ({first} is the first); flintlock allows one"),
                    );
                } else {
                    virtiofs_seen = Some(vpath.clone());
                }
            }
        }
        if let Some(mp) = &vol.mount_point
            && !mp.starts_with('/')
        {
            errs.add(
                format!("{vpath}.mountPoint"),
                format!("{mp:?} is not an absolute path in the guest"),
            );
        }
    }

    // Kernel and initrd.
    image_ref(&spec.kernel.image, &format!("{path}.kernel.image"), errs);
    file_name(
        &spec.kernel.filename,
        &format!("{path}.kernel.filename"),
        "the kernel binary, for example boot/vmlinux",
        errs,
    );
    for (key, value) in &spec.kernel_cmdline {
        if key.is_empty() || key.contains('=') || has_space_or_control(key) {
            errs.add(
                format!("{path}.kernelCmdline"),
                format!("key {key:?} is not a kernel argument name (no spaces, no '=')"),
            );
        }
        if has_space_or_control(value) {
            errs.add(
                format!("{path}.kernelCmdline.{key}"),
                format!("{value:?} holds whitespace; each entry is one kernel argument"),
            );
        }
    }
    if let Some(initrd) = &spec.initrd {
        image_ref(&initrd.image, &format!("{path}.initrd.image"), errs);
        if let Some(f) = &initrd.filename {
            file_name(
                f,
                &format!("{path}.initrd.filename"),
                "the initrd inside the image",
                errs,
            );
        }
    }

    // Network interfaces.
    if spec.network_interfaces.is_empty() {
        errs.add(
            format!("{path}.networkInterfaces"),
            "is empty; flintlock needs at least one interface, for example {guestDeviceName: eth1}",
        );
    }
    let mut dev_names = BTreeMap::new();
    let mut macs = BTreeMap::new();
    for (i, nic) in spec.network_interfaces.iter().enumerate() {
        let npath = format!("{path}.networkInterfaces[{i}]");
        let name = &nic.guest_device_name;
        if !is_device_name(name) {
            errs.add(
                format!("{npath}.guestDeviceName"),
                format!("{name:?} is not a device name; use lowercase letters, digits and _ (at most 15, starting with a letter), for example eth1"),
            );
        }
        if let Some(first) = dev_names.insert(name.as_str(), i) {
            errs.add(
                format!("{npath}.guestDeviceName"),
                format!("{name:?} is already the name of networkInterfaces[{first}]"),
            );
        }
        if name == "eth0" && !is_ch {
            errs.add(
                format!("{npath}.guestDeviceName"),
                "eth0 is flintlock's metadata interface on firecracker; name this one eth1 or higher, or set provider: cloudhypervisor",
            );
        }
        if let Some(mac) = &nic.guest_mac {
            match parse_mac(mac) {
                None => errs.add(
                    format!("{npath}.guestMac"),
                    format!("{mac:?} is not a MAC address; write six hex octets like 02:00:00:00:00:01, or leave it out"),
                ),
                Some(octets) => {
                    if octets[0] & 1 == 1 {
                        errs.add(
                            format!("{npath}.guestMac"),
                            format!("{mac:?} is a multicast address; the first octet must be even (02:.. is a safe choice)"),
                        );
                    }
                    let canonical = mac.to_ascii_lowercase();
                    if canonical == METADATA_IFACE_MAC {
                        errs.add(
                            format!("{npath}.guestMac"),
                            format!("{mac:?} is the MAC of flintlock's metadata interface; choose another"),
                        );
                    }
                    if let Some(first) = macs.insert(canonical, i) {
                        errs.add(
                            format!("{npath}.guestMac"),
                            format!("{mac:?} is already the MAC of networkInterfaces[{first}]"),
                        );
                    }
                }
            }
        }
        if nic.iface_type == IfaceType::Macvtap && !is_ch {
            errs.add(
                format!("{npath}.type"),
                "macvtap needs provider: cloudhypervisor; flintlock's firecracker provider supports only tap",
            );
        }
        let address = nic.address.as_deref().map(|a| (a, a.parse::<IpNet>()));
        if let Some((text, Err(_))) = &address {
            errs.add(
                format!("{npath}.address"),
                format!("{text:?} is not an address in CIDR form, for example 10.0.0.12/24"),
            );
        }
        let net = match &address {
            Some((_, Ok(net))) => Some(*net),
            _ => None,
        };
        if let Some(gw) = &nic.gateway {
            let gw_ip = gw
                .parse::<IpAddr>()
                .ok()
                .or_else(|| gw.parse::<IpNet>().ok().map(|n| n.addr()));
            match gw_ip {
                None => errs.add(
                    format!("{npath}.gateway"),
                    format!("{gw:?} is not an IP address, for example 10.0.0.1"),
                ),
                Some(ip) => {
                    if address.is_none() {
                        errs.add(
                            format!("{npath}.gateway"),
                            "needs address; a gateway only applies to a static address",
                        );
                    } else if let Some(net) = net
                        && net.addr().is_ipv4() != ip.is_ipv4()
                    {
                        errs.add(
                            format!("{npath}.gateway"),
                            format!("{gw:?} is not of the same IP family as address {}", net),
                        );
                    }
                }
            }
        }
        if !nic.nameservers.is_empty() && address.is_none() {
            errs.add(
                format!("{npath}.nameservers"),
                "needs address; with DHCP the nameservers come from DHCP",
            );
        }
        for (j, ns) in nic.nameservers.iter().enumerate() {
            if ns.parse::<IpAddr>().is_err() {
                errs.add(
                    format!("{npath}.nameservers[{j}]"),
                    format!("{ns:?} is not an IP address, for example 10.0.0.53"),
                );
            }
        }
    }

    ssh_keys(
        &spec.ssh_public_keys,
        &format!("{path}.sshPublicKeys"),
        errs,
    );

    if let Some(id) = &spec.provider_id
        && let Err(e) = id.parse::<ProviderId>()
    {
        errs.add(format!("{path}.providerID"), format!("{id:?} {e}"));
    }
}

fn volume_common(vol: &Volume, path: &str, errs: &mut Errors) {
    if vol.id.is_empty() {
        errs.add(
            format!("{path}.id"),
            "is required; name the volume, for example root",
        );
    } else if has_space_or_control(&vol.id) || vol.id.contains('/') {
        errs.add(
            format!("{path}.id"),
            format!("{:?} may not hold whitespace or '/'", vol.id),
        );
    }
}

fn ssh_keys(keys: &[SshPublicKey], path: &str, errs: &mut Errors) {
    for (i, key) in keys.iter().enumerate() {
        let kpath = format!("{path}[{i}]");
        if key.user.is_empty() || has_space_or_control(&key.user) || key.user.contains(':') {
            errs.add(
                format!("{kpath}.user"),
                format!("{:?} is not a user name", key.user),
            );
        }
        if key.authorized_keys.is_empty() {
            errs.add(
                format!("{kpath}.authorizedKeys"),
                "is empty; list at least one public key",
            );
        }
        for (j, k) in key.authorized_keys.iter().enumerate() {
            let path = format!("{kpath}.authorizedKeys[{j}]");
            if k.trim().is_empty() || k.contains('\n') || k.contains('\r') {
                errs.add(
                    path,
                    "must be one public key on one line, for example \"ssh-ed25519 AAAA... user@host\"",
                );
            } else if let Err(why) = authorized_key::check(k) {
                errs.add(path, why);
            }
        }
    }
}

fn secret_name(name: &str, path: &str, errs: &mut Errors) {
    if !is_dns_subdomain(name) {
        errs.add(
            path,
            format!("{name:?} is not a Secret name (lowercase letters, digits, '-' and '.', at most 253)"),
        );
    }
}

fn file_name(name: &str, path: &str, what: &str, errs: &mut Errors) {
    if name.is_empty() {
        errs.add(path, format!("is required; give the path of {what}"));
    } else if has_space_or_control(name) {
        errs.add(path, format!("{name:?} may not hold whitespace"));
    }
}

fn image_ref(image: &str, path: &str, errs: &mut Errors) {
    if image.is_empty() {
        errs.add(
            path,
            "is required; name a container image, for example ghcr.io/org/image:tag",
        );
    } else if !is_image_reference(image) {
        errs.add(
            path,
            format!("{image:?} is not a container image reference; write [registry/]repository[:tag][@digest] with a lowercase repository, for example ghcr.io/org/image:tag"),
        );
    } else if let Err(why) = image_uri::check(image) {
        let example = if image.contains('/') {
            "ghcr.io/org/image:tag".to_string()
        } else {
            format!("docker.io/library/{image}")
        };
        errs.add(
            path,
            format!("{image:?} is refused by flintlock's image check ({why}); start with the registry host, for example {example} (flintlock does not assume docker.io)"),
        );
    }
}

/// The reference grammar of distribution (which containerd and flintlock parse images with), after the
/// registry part has been split off.
static IMAGE_REMAINDER: LazyLock<Regex> = LazyLock::new(|| {
    let path_component = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*";
    // Go's `\w` (distribution's grammar) is ASCII; Rust's is Unicode, which also made this one
    // pattern's automaton several MiB.
    let tag = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}";
    let digest = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}";
    let pattern = format!(
        r"^{pc}(?:/{pc})*(?::{tag})?(?:@{digest})?$",
        pc = path_component
    );
    #[allow(clippy::expect_used)] // a constant pattern, covered by tests
    Regex::new(&pattern).expect("image reference pattern compiles")
});

static REGISTRY: LazyLock<Regex> = LazyLock::new(|| {
    let dc = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])";
    let pattern = format!(r"^(?:{dc}(?:\.{dc})*|\[[0-9a-fA-F:.]+\])(?::[0-9]+)?$");
    #[allow(clippy::expect_used)] // a constant pattern, covered by tests
    Regex::new(&pattern).expect("registry pattern compiles")
});

/// Whether `s` parses as a container image reference (`[registry/]repo[:tag][@digest]`).
///
/// As in docker's normalisation, the first component is a registry only when it holds a `.` or a `:`
/// or is `localhost`; otherwise it is part of the (lowercase) repository path.
pub fn is_image_reference(s: &str) -> bool {
    if s.is_empty() || s.len() > 512 {
        return false;
    }
    let remainder = match s.split_once('/') {
        Some((first, rest))
            if first.contains('.') || first.contains(':') || first == "localhost" =>
        {
            if !REGISTRY.is_match(first) {
                return false;
            }
            rest
        }
        _ => s,
    };
    IMAGE_REMAINDER.is_match(remainder)
}

fn is_device_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    s.len() <= 15
        && bytes.next().is_some_and(|b| b.is_ascii_lowercase())
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// Parses `xx:xx:xx:xx:xx:xx`.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut out = [0u8; 6];
    let mut parts = s.split(':');
    for slot in &mut out {
        let part = parts.next()?;
        if part.len() != 2 {
            return None;
        }
        *slot = u8::from_str_radix(part, 16).ok()?;
    }
    parts.next().is_none().then_some(out)
}

fn has_space_or_control(s: &str) -> bool {
    s.chars().any(|c| c.is_whitespace() || c.is_control())
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}
