//! Validation reports every bad field with its path and a fix; valid specs pass.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code

use capmvm_api::validation::{
    ValidationErrors, validate_cluster_spec, validate_machine_spec, validate_pool_spec,
    validate_template,
};
use capmvm_api::*;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

fn valid_machine() -> MicrovmMachineSpec {
    MicrovmMachineSpec {
        provider: None,
        vcpu: 2,
        memory_mb: 2048,
        root_volume: Volume {
            id: "root".into(),
            image: Some("ghcr.io/liquidmetal-dev/capmvm-kubernetes:1.23.5".into()),
            ..Default::default()
        },
        volumes: vec![],
        kernel: Kernel {
            image: "ghcr.io/liquidmetal-dev/kernel-bin:5.10.77".into(),
            filename: "boot/vmlinux".into(),
        },
        kernel_cmdline: Default::default(),
        initrd: None,
        network_interfaces: vec![NetworkInterface {
            guest_device_name: "eth1".into(),
            guest_mac: None,
            iface_type: IfaceType::Tap,
            address: None,
            gateway: None,
            nameservers: vec![],
        }],
        labels: Default::default(),
        ssh_public_keys: vec![],
        host_selector: None,
        provider_id: None,
    }
}

fn host(name: &str, endpoint: &str, fd: Option<&str>) -> MicrovmHost {
    MicrovmHost {
        failure_domain: fd.map(Into::into),
        ..MicrovmHost::new(Some(name), endpoint)
    }
}

fn valid_cluster() -> MicrovmClusterSpec {
    MicrovmClusterSpec {
        placement: Placement {
            static_pool: Some(StaticPoolPlacement {
                hosts: vec![
                    host("a", "10.0.0.1:9090", None),
                    host("b", "[fd00::2]:9090", Some("r1")),
                ],
                basic_auth_secret: Some("tokens".into()),
            }),
        },
        ..Default::default()
    }
}

/// Asserts that validation failed with an error at `path` that mentions `needle`.
#[track_caller]
fn assert_error_at(result: Result<(), ValidationErrors>, path: &str, needle: &str) {
    let errors = result.expect_err("the mutation makes the spec invalid");
    assert!(
        errors
            .errors()
            .iter()
            .any(|e| e.path == path && e.message.contains(needle)),
        "expected {path}: ..{needle}.. in: {errors}"
    );
}

/// Applies `mutate` to a valid machine spec and asserts an error at `path` mentions `needle`.
#[track_caller]
fn machine_error(mutate: impl FnOnce(&mut MicrovmMachineSpec), path: &str, needle: &str) {
    let mut spec = valid_machine();
    mutate(&mut spec);
    assert_error_at(validate_machine_spec(&spec), path, needle);
}

/// [`machine_error`] for a spec with one more volume.
#[track_caller]
fn volume_error(volume: Volume, path: &str, needle: &str) {
    machine_error(|s| s.volumes.push(volume), path, needle);
}

/// A template of `spec`, as the template controller validates it.
fn template(spec: MicrovmMachineSpec) -> MicrovmMachineTemplate {
    MicrovmMachineTemplate::new(
        "t",
        MicrovmMachineTemplateSpec {
            template: MicrovmMachineTemplateResource {
                metadata: None,
                spec,
            },
        },
    )
}

/// One user's authorized keys.
fn authorized_keys(list: &[&str]) -> Vec<SshPublicKey> {
    vec![SshPublicKey {
        user: "ops".into(),
        authorized_keys: list.iter().map(|k| k.to_string()).collect(),
    }]
}

#[test]
fn a_valid_machine_passes() {
    assert_eq!(validate_machine_spec(&valid_machine()), Ok(()));
}

#[test]
fn machine_field_errors_name_the_field_and_the_fix() {
    machine_error(|s| s.vcpu = 0, "spec.vcpu", "1 to 64");
    machine_error(|s| s.vcpu = 65, "spec.vcpu", "1 to 64");
    machine_error(|s| s.memory_mb = 512, "spec.memoryMb", "1024 to 32768");
    machine_error(|s| s.memory_mb = 40000, "spec.memoryMb", "1024 to 32768");
    machine_error(
        |s| s.root_volume.image = None,
        "spec.rootVolume.image",
        "is required",
    );
    machine_error(
        |s| s.root_volume.image = Some("Not/An Image".into()),
        "spec.rootVolume.image",
        "not a container image",
    );
    machine_error(
        |s| s.root_volume.id = String::new(),
        "spec.rootVolume.id",
        "is required",
    );
    machine_error(
        |s| s.root_volume.virtiofs_path = Some("/x".into()),
        "spec.rootVolume.virtiofsPath",
        "not allowed",
    );
    machine_error(
        |s| s.kernel.filename = String::new(),
        "spec.kernel.filename",
        "is required",
    );
    machine_error(
        |s| s.kernel.image = "UPPER/case".into(),
        "spec.kernel.image",
        "not a container image",
    );
    machine_error(
        |s| {
            s.initrd = Some(Initrd {
                image: "bad image".into(),
                filename: None,
            })
        },
        "spec.initrd.image",
        "not a container image",
    );
    machine_error(
        |s| {
            s.kernel_cmdline
                .insert("console".into(), "ttyS0 quiet".into());
        },
        "spec.kernelCmdline.console",
        "whitespace",
    );
    machine_error(
        |s| s.network_interfaces.clear(),
        "spec.networkInterfaces",
        "at least one",
    );
    machine_error(
        |s| s.network_interfaces[0].guest_mac = Some("zz".into()),
        "spec.networkInterfaces[0].guestMac",
        "\"zz\" is not a MAC address",
    );
    machine_error(
        |s| s.network_interfaces[0].guest_mac = Some("01:00:00:00:00:01".into()),
        "spec.networkInterfaces[0].guestMac",
        "multicast",
    );
    machine_error(
        |s| s.network_interfaces[0].guest_device_name = "Eth1".into(),
        "spec.networkInterfaces[0].guestDeviceName",
        "not a device name",
    );
    machine_error(
        |s| s.network_interfaces[0].guest_device_name = "eth0".into(),
        "spec.networkInterfaces[0].guestDeviceName",
        "metadata interface",
    );
    machine_error(
        |s| s.network_interfaces[0].iface_type = IfaceType::Macvtap,
        "spec.networkInterfaces[0].type",
        "cloudhypervisor",
    );
    machine_error(
        |s| s.network_interfaces[0].address = Some("10.0.0.5".into()),
        "spec.networkInterfaces[0].address",
        "CIDR",
    );
    machine_error(
        |s| s.network_interfaces[0].gateway = Some("10.0.0.1".into()),
        "spec.networkInterfaces[0].gateway",
        "needs address",
    );
    machine_error(
        |s| {
            s.network_interfaces[0].address = Some("10.0.0.5/24".into());
            s.network_interfaces[0].gateway = Some("fd00::1".into());
        },
        "spec.networkInterfaces[0].gateway",
        "same IP family",
    );
    machine_error(
        |s| {
            s.network_interfaces[0].address = Some("10.0.0.5/24".into());
            s.network_interfaces[0].nameservers = vec!["dns.example".into()];
        },
        "spec.networkInterfaces[0].nameservers[0]",
        "not an IP",
    );
    machine_error(
        |s| s.network_interfaces.push(s.network_interfaces[0].clone()),
        "spec.networkInterfaces[1].guestDeviceName",
        "already",
    );
    volume_error(
        Volume {
            id: "root".into(),
            image: Some("a/b".into()),
            ..Default::default()
        },
        "spec.volumes[0].id",
        "unique",
    );
    volume_error(
        Volume {
            id: "v".into(),
            ..Default::default()
        },
        "spec.volumes[0]",
        "no source",
    );
    volume_error(
        Volume {
            id: "v".into(),
            virtiofs_path: Some("/srv".into()),
            ..Default::default()
        },
        "spec.volumes[0].virtiofsPath",
        "cloudhypervisor",
    );
    machine_error(
        |s| {
            s.provider = Some(VmmProvider::Cloudhypervisor);
            for id in ["v1", "v2"] {
                s.volumes.push(Volume {
                    id: id.into(),
                    virtiofs_path: Some("/srv".into()),
                    ..Default::default()
                });
            }
        },
        "spec.volumes[1].virtiofsPath",
        "second virtiofs",
    );
    machine_error(
        |s| {
            s.ssh_public_keys = vec![SshPublicKey {
                user: "ops".into(),
                authorized_keys: vec![],
            }]
        },
        "spec.sshPublicKeys[0].authorizedKeys",
        "at least one",
    );
    machine_error(
        |s| s.provider_id = Some("aws:///i-1".into()),
        "spec.providerID",
        "microvm://",
    );
}

#[test]
fn every_error_is_reported_at_once() {
    let mut spec = valid_machine();
    spec.vcpu = 0;
    spec.memory_mb = 1;
    spec.network_interfaces[0].guest_mac = Some("zz".into());
    let errors = validate_machine_spec(&spec).unwrap_err();
    assert_eq!(errors.errors().len(), 3, "{errors}");
    let text = errors.to_string();
    assert!(text.contains("spec.vcpu: 0 is out of range"), "{text}");
    assert!(
        text.contains("spec.networkInterfaces[0].guestMac: \"zz\" is not a MAC address"),
        "{text}"
    );
}

#[test]
fn cloud_hypervisor_allows_macvtap_virtiofs_and_eth0() {
    let mut spec = valid_machine();
    spec.provider = Some(VmmProvider::Cloudhypervisor);
    spec.network_interfaces[0].iface_type = IfaceType::Macvtap;
    spec.network_interfaces[0].guest_device_name = "eth0".into();
    spec.volumes.push(Volume {
        id: "v".into(),
        virtiofs_path: Some("/srv".into()),
        ..Default::default()
    });
    assert_eq!(validate_machine_spec(&spec), Ok(()));
}

#[test]
fn image_references_follow_the_distribution_grammar() {
    use capmvm_api::validation::is_image_reference;
    for ok in [
        "ubuntu",
        "ghcr.io/liquidmetal-dev/kernel-bin:5.10.77",
        "localhost:5000/a/b_c.d-e:v1",
        "[fd00::1]:5000/img@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    ] {
        assert!(is_image_reference(ok), "{ok}");
    }
    // Tags are ASCII, as in Go's `\w`: containerd refuses a non-ASCII tag.
    for bad in [
        "",
        "UPPER",
        "a b",
        "a/:tag",
        "a:ta g",
        "-a",
        "ghcr.io/org/image:tä",
        "a:日本",
    ] {
        assert!(!is_image_reference(bad), "{bad}");
    }
}

#[test]
fn template_paths_start_at_the_template_spec() {
    let mut spec = valid_machine();
    spec.vcpu = 100;
    let errors = validate_template(&template(spec)).unwrap_err();
    assert_eq!(errors.errors()[0].path, "spec.template.spec.vcpu");
}

/// Applies `mutate` to a valid cluster spec and asserts an error at `path` mentions `needle`.
#[track_caller]
fn cluster_error(mutate: impl FnOnce(&mut MicrovmClusterSpec), path: &str, needle: &str) {
    let mut spec = valid_cluster();
    mutate(&mut spec);
    assert_error_at(validate_cluster_spec(&spec), path, needle);
}

fn hosts(s: &mut MicrovmClusterSpec) -> &mut Vec<MicrovmHost> {
    &mut s.placement.static_pool.as_mut().unwrap().hosts
}

#[test]
fn cluster_field_errors_name_the_field_and_the_fix() {
    assert_eq!(validate_cluster_spec(&valid_cluster()), Ok(()));
    cluster_error(
        |s| s.placement.static_pool = None,
        "spec.placement.staticPool",
        "is required",
    );
    cluster_error(
        |s| hosts(s).clear(),
        "spec.placement.staticPool.hosts",
        "at least one",
    );
    cluster_error(
        |s| hosts(s)[0].endpoint = "fd00::1:9090".into(),
        "spec.placement.staticPool.hosts[0].endpoint",
        "brackets",
    );
    cluster_error(
        |s| hosts(s)[0].endpoint = "10.0.0.1".into(),
        "spec.placement.staticPool.hosts[0].endpoint",
        "no port",
    );
    cluster_error(
        |s| hosts(s).push(host("c", "10.0.0.1:9090", None)),
        "spec.placement.staticPool.hosts[2].endpoint",
        "already the endpoint of hosts[0]",
    );
    cluster_error(
        |s| hosts(s).push(host("a", "10.0.0.3:9090", None)),
        "spec.placement.staticPool.hosts[2].name",
        "already the name of hosts[0]",
    );
    cluster_error(
        |s| hosts(s).push(host("r1", "10.0.0.3:9090", None)),
        "spec.placement.staticPool.hosts[2]",
        "set failureDomain: \"r1\"",
    );
    cluster_error(
        |s| s.placement.static_pool.as_mut().unwrap().basic_auth_secret = Some("Bad_Name".into()),
        "spec.placement.staticPool.basicAuthSecret",
        "not a Secret name",
    );
    cluster_error(
        |s| {
            s.control_plane_endpoint = Some(ApiEndpoint {
                host: None,
                port: None,
            })
        },
        "spec.controlPlaneEndpoint",
        "is empty",
    );
    cluster_error(
        |s| {
            s.control_plane_endpoint = Some(ApiEndpoint {
                host: Some("vip".into()),
                port: Some(70000),
            })
        },
        "spec.controlPlaneEndpoint.port",
        "1 to 65535",
    );
    cluster_error(
        |s| {
            s.microvm_proxy = Some(Proxy {
                endpoint: "proxy.example".into(),
            })
        },
        "spec.microvmProxy.endpoint",
        "no port",
    );
}

#[test]
fn more_than_100_failure_domains_are_refused_but_groups_lift_the_cap() {
    let mut spec = valid_cluster();
    *hosts(&mut spec) = (0..150)
        .map(|i| {
            host(
                &format!("h{i}"),
                &format!("10.0.{}.{}:9090", i / 200, i % 200 + 1),
                None,
            )
        })
        .collect();
    let errors = validate_cluster_spec(&spec).unwrap_err();
    assert!(
        errors.to_string().contains("form 150 failure domains"),
        "{errors}"
    );
    for (i, h) in hosts(&mut spec).iter_mut().enumerate() {
        h.failure_domain = Some(format!("rack-{}", i % 10));
    }
    assert_eq!(validate_cluster_spec(&spec), Ok(()));
}

#[test]
fn proxy_accepts_an_http_prefix() {
    let mut spec = valid_cluster();
    spec.microvm_proxy = Some(Proxy {
        endpoint: "http://proxy.example:3128".into(),
    });
    assert_eq!(validate_cluster_spec(&spec), Ok(()));
}

#[test]
fn a_template_may_not_carry_a_provider_id() {
    let mut spec = valid_machine();
    spec.provider_id = Some("microvm://10.0.0.1:9090/01KE75BHT9H6D7V5YG0KYGRXX2".into());
    let errors = validate_template(&template(spec)).unwrap_err();
    assert!(
        errors
            .errors()
            .iter()
            .any(|e| e.path == "spec.template.spec.providerID"
                && e.message.contains("remove it from the template")),
        "{errors}"
    );
}

#[test]
fn endpoints_are_canonical_and_unique_whatever_their_case() {
    cluster_error(
        |s| hosts(s)[1].endpoint = "[FD00:0::2]:9090".into(),
        "spec.placement.staticPool.hosts[1].endpoint",
        "write \"[fd00::2]:9090\"",
    );
    cluster_error(
        |s| hosts(s)[1].endpoint = "10.0.0.2:09090".into(),
        "spec.placement.staticPool.hosts[1].endpoint",
        "write \"10.0.0.2:9090\"",
    );
    cluster_error(
        |s| {
            hosts(s)[0].endpoint = "Host-A:9090".into();
            hosts(s)[1].endpoint = "host-a:9090".into();
        },
        "spec.placement.staticPool.hosts[1].endpoint",
        "already the endpoint of hosts[0]",
    );
}

#[test]
fn two_hosts_cannot_be_the_same_own_failure_domain() {
    // One host is named after the other's endpoint: both would be failure domain "10.0.0.1:9090".
    cluster_error(
        |s| {
            hosts(s)[1] = host("10.0.0.1:9090", "10.0.0.9:9090", None);
            hosts(s)[0].name = None;
        },
        "spec.placement.staticPool.hosts[1]",
        "which hosts[0] is too",
    );
}

/// Public keys as `ssh-keygen` writes them (the ed25519 one is the examples').
const ED25519_KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHmW0bV5Ckb2wA1X8nN2xY2q8C0Qe4yN6q3yF0z1xk7P ops@example.com";
const RSA_KEY: &str = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQCotaImMVQOUnwkGWq2yKP9qR8PqiQgde/lKgs/LACY/i06olqQLdgVhwr6kIkk9EEj14S5ftQqI/VVPFLrgcQ+gBJW3bc0c9lqlgfzYUeZz/f9OyXUFYZad9I6S3+pgu/KkkT0lrCMLLTGsde99gwGx2rucfsuQE5fbfAdULtXlvuLi6UNLd8F4RDweiY10uOUdS+mmVwpO3VZy7WLoiI30RnwWNMyIrM5rlVVo90ui645aPfwLtLZvcG+pOBzjSardVQxwroCYeypX6mbVWgwi83Elb0Hs4WT/QQq7Md4G27zN8VtNcbldRFpu94jqSk8fiEqODjgynv0MC2GkOPD ops@example.com";
const ECDSA_KEY: &str = "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBPbdwD0qJ6T1t152Lgi7+Q9hNk1IcFi7hIqr5DPXUxuxgtPo47r32+GRPNfMSLCH6SfvqZKwvl5bNbB5AsTG0K4=";

/// flintlock parses images with containerd's `reference.Parse`: a reference without a registry host
/// (`ubuntu:22.04`) is refused by the host, so it is refused here, on every image field.
#[test]
fn image_references_flintlock_refuses_are_refused_before_any_host_call() {
    let hint = "docker.io/library/ubuntu:22.04";
    machine_error(
        |s| s.kernel.image = "ubuntu:22.04".into(),
        "spec.kernel.image",
        hint,
    );
    machine_error(
        |s| {
            s.initrd = Some(Initrd {
                image: "ubuntu:22.04".into(),
                filename: Some("initrd".into()),
            })
        },
        "spec.initrd.image",
        hint,
    );
    machine_error(
        |s| s.root_volume.image = Some("ubuntu:22.04".into()),
        "spec.rootVolume.image",
        "refused by flintlock",
    );
    volume_error(
        Volume {
            id: "data".into(),
            image: Some("ubuntu:latest".into()),
            ..Default::default()
        },
        "spec.volumes[0].image",
        "docker.io/library/ubuntu:latest",
    );
    machine_error(
        |s| s.kernel.image = "img@sha256:0123456789abcdef0123456789abcdef".into(),
        "spec.kernel.image",
        "registry host",
    );
    // What the Go provider's templates and our examples name stays valid.
    for image in [
        "ghcr.io/weaveworks-liquidmetal/flintlock-kernel:5.10.77",
        "ghcr.io/weaveworks-liquidmetal/capmvm-k8s-os:1.23.5",
        "ghcr.io/liquidmetal-dev/kernel-bin:5.10.77",
        "docker.io/library/ubuntu:22.04",
        "localhost:5000/kernel:1",
        "registry/kernel",
    ] {
        let mut spec = valid_machine();
        spec.kernel.image = image.into();
        spec.root_volume.image = Some(image.into());
        assert_eq!(validate_machine_spec(&spec), Ok(()), "{image}");
    }
}

#[test]
fn authorized_keys_must_be_openssh_public_keys() {
    for (bad, needle) in [
        ("not-a-key", "<type> <base64> [comment]"),
        ("ssh-foo AAAAC3NzaC1lZDI1NTE5 ops", "key type \"ssh-foo\""),
        ("ssh-ed25519 not*base64 ops", "not base64"),
        // A real ecdsa blob labelled ed25519.
        (
            &ECDSA_KEY.replacen("ecdsa-sha2-nistp256", "ssh-ed25519", 1),
            "not a ssh-ed25519 key",
        ),
        ("ssh-ed25519 AAAA ops", "not a ssh-ed25519 key"),
    ] {
        machine_error(
            |s| s.ssh_public_keys = authorized_keys(&[ED25519_KEY, bad]),
            "spec.sshPublicKeys[0].authorizedKeys[1]",
            needle,
        );
        cluster_error(
            |s| s.ssh_public_keys = authorized_keys(&[ED25519_KEY, bad]),
            "spec.sshPublicKeys[0].authorizedKeys[1]",
            needle,
        );
    }
    let mut spec = valid_machine();
    spec.ssh_public_keys = authorized_keys(&[
        ED25519_KEY,
        RSA_KEY,
        ECDSA_KEY,
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHmW0bV5Ckb2wA1X8nN2xY2q8C0Qe4yN6q3yF0z1xk7P",
    ]);
    assert_eq!(validate_machine_spec(&spec), Ok(()));
}

/// What sshd accepts in `authorized_keys` is accepted: a key with options before it (`command=`,
/// `from=`, flags; quoted values may hold spaces, commas and escaped quotes). What it refuses is
/// refused, naming the option or the quoting.
#[test]
fn authorized_keys_may_carry_the_options_sshd_accepts() {
    let blob = ED25519_KEY.trim_start_matches("ssh-ed25519 ");
    let accepted = [
        format!("command=\"/usr/bin/backup --all\" ssh-ed25519 {blob}"),
        format!("from=\"10.0.0.0/8,192.168.1.*\" ssh-ed25519 {blob}"),
        format!("no-pty,no-port-forwarding,command=\"echo \\\"hi there\\\"\" ssh-ed25519 {blob}"),
        format!("restrict,pty {ECDSA_KEY}"),
        format!("NO-PTY,Environment=\"A=b c\",expiry-time=\"20301231\" {RSA_KEY}"),
        format!("cert-authority,principals=\"ops,admin\" ssh-ed25519 {blob}"),
    ];
    for key in &accepted {
        let mut spec = valid_machine();
        spec.ssh_public_keys = authorized_keys(&[key]);
        assert_eq!(validate_machine_spec(&spec), Ok(()), "{key}");
        let mut cluster = valid_cluster();
        cluster.ssh_public_keys = authorized_keys(&[key]);
        assert_eq!(validate_cluster_spec(&cluster), Ok(()), "{key}");
    }
    for (bad, needle) in [
        (
            format!("bogus-option ssh-ed25519 {blob}"),
            "option \"bogus-option\" is not one sshd accepts",
        ),
        (
            format!("command=\"unterminated ssh-ed25519 {blob}"),
            "unterminated quote",
        ),
        (
            format!("command=unquoted ssh-ed25519 {blob}"),
            "option \"command\" needs a quoted value",
        ),
        (
            format!("no-pty=\"x\" ssh-ed25519 {blob}"),
            "option \"no-pty\" takes no value",
        ),
        ("no-pty ssh-ed25519 not*base64".to_string(), "not base64"),
        ("no-pty".to_string(), "[options] <type> <base64> [comment]"),
    ] {
        machine_error(
            |s| s.ssh_public_keys = authorized_keys(&[ED25519_KEY, &bad]),
            "spec.sshPublicKeys[0].authorizedKeys[1]",
            needle,
        );
    }
}

fn valid_pool() -> MicrovmMachinePoolSpec {
    MicrovmMachinePoolSpec {
        template: valid_machine(),
        strategy: PoolStrategy::default(),
        provider_id_list: vec![],
        provider_id: None,
    }
}

fn pool_errors(mutate: impl FnOnce(&mut MicrovmMachinePoolSpec)) -> Vec<(String, String)> {
    let mut spec = valid_pool();
    mutate(&mut spec);
    match validate_pool_spec(&spec) {
        Ok(()) => vec![],
        Err(e) => e.0.into_iter().map(|f| (f.path, f.message)).collect(),
    }
}

#[test]
fn pool_template_errors_are_prefixed_and_strategy_is_checked() {
    assert_eq!(pool_errors(|_| {}), vec![]);

    let errs = pool_errors(|s| {
        s.template.vcpu = 0;
        s.template.provider_id = Some("microvm://h:9090/x".into());
    });
    let paths: Vec<&str> = errs.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(paths, ["spec.template.vcpu", "spec.template.providerID"]);

    let rolling = |surge: Option<IntOrString>, unavailable: Option<IntOrString>| {
        pool_errors(move |s| {
            s.strategy.rolling_update = Some(RollingUpdate {
                max_surge: surge,
                max_unavailable: unavailable,
                delete_policy: None,
            });
        })
    };
    let errs = rolling(Some(IntOrString::Int(0)), Some(IntOrString::Int(0)));
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].0, "spec.strategy.rollingUpdate");
    assert!(errs[0].1.contains("set maxSurge to 1 or more"), "{errs:?}");

    let errs = rolling(
        Some(IntOrString::String("many".into())),
        Some(IntOrString::Int(-2)),
    );
    assert_eq!(errs[0].0, "spec.strategy.rollingUpdate.maxSurge");
    assert!(errs[0].1.contains("\"25%\""), "{errs:?}");
    assert_eq!(errs[1].0, "spec.strategy.rollingUpdate.maxUnavailable");
    assert!(errs[1].1.contains("negative"), "{errs:?}");

    assert_eq!(
        rolling(
            Some(IntOrString::String("0%".into())),
            Some(IntOrString::String("20%".into()))
        ),
        vec![]
    );
}

/// Host labels and `hostSelector` follow Kubernetes' label syntax; each mistake names its field.
#[test]
fn host_labels_and_selectors_are_checked() {
    let selector = |json: serde_json::Value| Some(serde_json::from_value(json).unwrap());
    machine_error(
        |m| {
            m.host_selector = selector(
                serde_json::json!({"matchExpressions": [{"key": "disk", "operator": "In"}]}),
            )
        },
        "spec.hostSelector.matchExpressions[0].values",
        "must not be empty for operator In",
    );
    machine_error(
        |m| {
            m.host_selector = selector(
                serde_json::json!({"matchExpressions": [{"key": "disk", "operator": "Like", "values": ["x"]}]}),
            )
        },
        "spec.hostSelector.matchExpressions[0].operator",
        "use In, NotIn, Exists or DoesNotExist",
    );
    machine_error(
        |m| m.host_selector = selector(serde_json::json!({"matchLabels": {"disk": "not ok"}})),
        "spec.hostSelector.matchLabels[disk]",
        "label value",
    );
    let mut ok = valid_machine();
    ok.host_selector = selector(serde_json::json!({
        "matchLabels": {"topology.example.com/rack": "r1"},
        "matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}],
    }));
    assert!(validate_machine_spec(&ok).is_ok());

    let mut cluster = valid_cluster();
    let hosts = &mut cluster.placement.static_pool.as_mut().unwrap().hosts;
    hosts[0].labels.insert("Disk Type".into(), "nvme".into());
    assert_error_at(
        validate_cluster_spec(&cluster),
        "spec.placement.staticPool.hosts[0].labels[Disk Type]",
        "label key",
    );
}
