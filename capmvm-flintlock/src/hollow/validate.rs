//! Flintlock's create-time validation (go-playground validator rules of `core/models` and
//! `pkg/validation`), reproduced with its texts: one line per failing field,
//! `Key: '<namespace>' Error:Field validation for '<field>' failed on the '<tag>' tag`, in the
//! order the Go validator walks the struct, first failing tag per field.

use std::net::IpAddr;

use crate::proto::types as pb;

/// A spec after flintlock's conversion and defaulting, as the validator sees it.
pub(crate) fn validate(spec: &pb::MicroVmSpec) -> Vec<String> {
    let mut failures = Vec::new();
    let mut fail = |namespace: &str, tag: &str| {
        let field = namespace.rsplit('.').next().unwrap_or(namespace);
        failures.push(format!("Key: 'MicroVM.Spec.{namespace}' Error:Field validation for '{field}' failed on the '{tag}' tag"));
    };

    // Kernel: `validate:"omitempty"`, so a zero kernel is not checked at all.
    if let Some(kernel) = spec
        .kernel
        .as_ref()
        .filter(|kernel| !kernel_is_zero(kernel))
    {
        if kernel.image.is_empty() {
            fail("Kernel.Image", "required");
        } else if !image_reference_ok(&kernel.image) {
            fail("Kernel.Image", "imageURI");
        }
        if kernel.filename.as_deref().unwrap_or_default().is_empty() {
            fail("Kernel.Filename", "required");
        }
    }
    if spec
        .initrd
        .as_ref()
        .is_some_and(|initrd| !image_reference_ok(&initrd.image))
    {
        fail("Initrd.Image", "imageURI");
    }
    range(&mut fail, "VCPU", spec.vcpu, 1, 64);
    range(&mut fail, "MemoryInMb", spec.memory_in_mb, 1024, 32768);
    if spec.interfaces.is_empty() {
        fail("NetworkInterfaces", "required");
    }
    for (i, iface) in spec.interfaces.iter().enumerate() {
        let at = |field: &str| format!("NetworkInterfaces[{i}].{field}");
        let name = &iface.device_id;
        if name.is_empty() {
            fail(&at("GuestDeviceName"), "required");
        } else if name.contains(['/', '@']) {
            fail(&at("GuestDeviceName"), "excludesall");
        } else if !guest_device_name_ok(name) {
            fail(&at("GuestDeviceName"), "guestDeviceName");
        }
        if iface
            .guest_mac
            .as_deref()
            .is_some_and(|mac| !mac.is_empty() && !mac_ok(mac))
        {
            fail(&at("GuestMAC"), "mac");
        }
        if let Some(address) = &iface.address {
            if !cidr_ok(&address.address) {
                fail(&at("StaticAddress.Address"), "cidr");
            }
            if address
                .gateway
                .as_deref()
                .is_some_and(|gateway| !gateway.is_empty() && !cidr_ok(gateway))
            {
                fail(&at("StaticAddress.Gateway"), "cidr");
            }
            for (j, nameserver) in address.nameservers.iter().enumerate() {
                if nameserver.parse::<IpAddr>().is_err() {
                    fail(&at(&format!("StaticAddress.Nameservers[{j}]")), "ip");
                }
            }
        }
    }
    let root_source = spec
        .root_volume
        .as_ref()
        .and_then(|root| root.source.as_ref());
    if root_source.is_some_and(|source| source.virtiofs_source.is_some()) {
        fail("RootVolume", "novirtiofs");
    }
    let sources = spec
        .additional_volumes
        .iter()
        .map(|volume| volume.source.clone().unwrap_or_default());
    let virtiofs = sources
        .clone()
        .filter(|source| source.virtiofs_source.is_some())
        .count();
    if virtiofs > 1 {
        fail("AdditionalVolumes", "onlyOneVirtioFS");
    } else if sources
        .clone()
        .any(|source| source.container_source.is_some() && source.virtiofs_source.is_some())
    {
        fail("AdditionalVolumes", "multipleVolSources");
    }
    // Struct level, after the fields; reported under the lower-case name flintlock passes.
    if spec.initrd.is_none() && spec.root_volume.as_ref().is_none_or(volume_is_zero) {
        fail("root_volume", "volumeOrInitrdRequired");
    }
    failures
}

fn range(fail: &mut impl FnMut(&str, &str), field: &str, value: i32, min: i32, max: i32) {
    if value == 0 {
        fail(field, "required");
    } else if value < min {
        fail(field, "gte");
    } else if value > max {
        fail(field, "lte");
    }
}

fn kernel_is_zero(kernel: &pb::Kernel) -> bool {
    kernel.image.is_empty()
        && kernel.filename.as_deref().unwrap_or_default().is_empty()
        && kernel.cmdline.is_empty()
        && !kernel.add_network_config
}

fn volume_is_zero(volume: &pb::Volume) -> bool {
    let source = volume.source.clone().unwrap_or_default();
    volume.id.is_empty()
        && !volume.is_read_only
        && source.container_source.is_none()
        && source.virtiofs_source.is_none()
        && volume
            .partition_id
            .as_deref()
            .unwrap_or_default()
            .is_empty()
        && volume.size_in_mb.unwrap_or_default() == 0
        && volume.mount_point.as_deref().unwrap_or_default().is_empty()
}

/// `^[a-z][a-z0-9_]*$`
fn guest_device_name_ok(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// containerd's `reference.Parse` (which flintlock uses): the text, prefixed with `dummy://`, must
/// parse as a URL with a host. So `docker.io/library/ubuntu:22.04` and `localhost:5000/x` pass;
/// `ubuntu:22.04` does not (`22.04` is not a port) and neither does an empty text.
pub(crate) fn image_reference_ok(reference: &str) -> bool {
    if reference.is_empty()
        || reference.contains("://")
        || reference.chars().any(|c| c.is_control())
    {
        return false;
    }
    let authority_end = reference.find(['/', '?', '#']).unwrap_or(reference.len());
    let authority = &reference[..authority_end];
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((inner, port)) => (inner, port),
            None => return false,
        }
    } else {
        match host.rfind(':') {
            Some(colon) => (&host[..colon], &host[colon..]),
            None => (host, ""),
        }
    };
    let port_ok =
        port.is_empty() || (port.starts_with(':') && port[1..].bytes().all(|b| b.is_ascii_digit()));
    let host_chars_ok = name.chars().all(|c| {
        c.is_ascii_alphanumeric()
            || "-._~!$&'()*+,;=:[]<>\"".contains(c)
            || (host.starts_with('[') && c == '%')
    });
    !host.is_empty() && port_ok && host_chars_ok
}

/// Go's `net.ParseMAC`: 6, 8 or 20 octets as `xx:xx..`, `xx-xx..` or `xxxx.xxxx..`.
pub(crate) fn mac_ok(mac: &str) -> bool {
    let hex = |group: &str, len: usize| {
        group.len() == len && group.bytes().all(|b| b.is_ascii_hexdigit())
    };
    let octets = if mac.contains(['.']) {
        let groups: Vec<&str> = mac.split('.').collect();
        if !groups.iter().all(|g| hex(g, 4)) {
            return false;
        }
        groups.len() * 2
    } else {
        let separator = if mac.contains(':') { ':' } else { '-' };
        let groups: Vec<&str> = mac.split(separator).collect();
        if !groups.iter().all(|g| hex(g, 2)) {
            return false;
        }
        groups.len()
    };
    matches!(octets, 6 | 8 | 20)
}

/// Go's `net.ParseCIDR`: an address (no zone), `/`, a decimal prefix length within the family.
pub(crate) fn cidr_ok(cidr: &str) -> bool {
    let Some((address, prefix)) = cidr.split_once('/') else {
        return false;
    };
    let Ok(address) = address.parse::<IpAddr>() else {
        return false;
    };
    let bits = if address.is_ipv4() { 32 } else { 128 };
    !prefix.is_empty()
        && prefix.bytes().all(|b| b.is_ascii_digit())
        && prefix.parse::<u32>().is_ok_and(|n| n <= bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_references_follow_containerd() {
        for ok in [
            "docker.io/library/ubuntu:22.04",
            "ghcr.io/liquidmetal-dev/flintlock-kernel:5.10.77",
            "localhost:5000/kernel",
            "registry.local/x@sha256:abcd",
            "ubuntu",
        ] {
            assert!(image_reference_ok(ok), "{ok} should pass");
        }
        for bad in [
            "",
            "ubuntu:22.04",
            "https://ghcr.io/x",
            "host:port/x",
            "a b/c",
            "{x}/y",
        ] {
            assert!(!image_reference_ok(bad), "{bad} should fail");
        }
    }

    #[test]
    fn macs_cidrs_and_names() {
        assert!(
            mac_ok("AA:FF:00:00:00:01") && mac_ok("aa-ff-00-00-00-01") && mac_ok("aaff.0000.0001")
        );
        assert!(!mac_ok("AA:FF:00:00:00") && !mac_ok("zz:ff:00:00:00:01") && !mac_ok(""));
        assert!(cidr_ok("169.254.0.1/16") && cidr_ok("fd00::1/64") && cidr_ok("10.0.0.1/032"));
        assert!(
            !cidr_ok("10.0.0.1")
                && !cidr_ok("10.0.0.1/33")
                && !cidr_ok("10.0.0.1/-1")
                && !cidr_ok("x/8")
        );
        assert!(guest_device_name_ok("eth1") && guest_device_name_ok("net_0"));
        assert!(
            !guest_device_name_ok("Eth1")
                && !guest_device_name_ok("1eth")
                && !guest_device_name_ok("eth-1")
        );
    }

    fn valid() -> pb::MicroVmSpec {
        pb::MicroVmSpec {
            id: "vm".into(),
            namespace: "default".into(),
            vcpu: 2,
            memory_in_mb: 1024,
            kernel: Some(pb::Kernel {
                image: "ghcr.io/x/kernel:1".into(),
                filename: Some("vmlinux".into()),
                ..Default::default()
            }),
            root_volume: Some(pb::Volume {
                id: "root".into(),
                source: Some(pb::VolumeSource {
                    container_source: Some("ghcr.io/x/root:1".into()),
                    virtiofs_source: None,
                }),
                ..Default::default()
            }),
            interfaces: vec![pb::NetworkInterface {
                device_id: "eth1".into(),
                r#type: 1,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_valid_spec_passes() {
        assert_eq!(validate(&valid()), Vec::<String>::new());
    }

    #[test]
    fn failures_are_reported_in_flintlock_form_and_order() {
        let mut spec = valid();
        spec.vcpu = 65;
        spec.memory_in_mb = 512;
        spec.interfaces[0].device_id = "eth/1".into();
        spec.root_volume = None;
        assert_eq!(
            validate(&spec),
            vec![
                "Key: 'MicroVM.Spec.VCPU' Error:Field validation for 'VCPU' failed on the 'lte' tag",
                "Key: 'MicroVM.Spec.MemoryInMb' Error:Field validation for 'MemoryInMb' failed on the 'gte' tag",
                "Key: 'MicroVM.Spec.NetworkInterfaces[0].GuestDeviceName' Error:Field validation for 'GuestDeviceName' failed on the 'excludesall' tag",
                "Key: 'MicroVM.Spec.root_volume' Error:Field validation for 'root_volume' failed on the 'volumeOrInitrdRequired' tag",
            ]
        );
    }

    #[test]
    fn zero_kernel_is_not_checked_but_a_partial_one_is() {
        let mut spec = valid();
        spec.kernel = Some(pb::Kernel::default());
        assert!(validate(&spec).is_empty());
        spec.kernel = Some(pb::Kernel {
            image: "ubuntu:22.04".into(),
            ..Default::default()
        });
        let failures = validate(&spec);
        assert_eq!(failures.len(), 2, "{failures:?}");
        assert!(
            failures[0].contains("'Kernel.Image'") || failures[0].contains("Spec.Kernel.Image")
        );
        assert!(
            failures[0].ends_with("'imageURI' tag")
                && failures[1].contains("'Filename' failed on the 'required' tag")
        );
    }
}
