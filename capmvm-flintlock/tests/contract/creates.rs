//! CreateMicroVM: what is accepted and how it comes back, what is refused and with which code and
//! text, and what nothing refused leaves behind.

use std::collections::BTreeMap;

use base64::Engine as _;
use capmvm_flintlock::hollow::is_ulid;
use capmvm_flintlock::proto::services::CreateMicroVmRequest;
use capmvm_flintlock::proto::services::micro_vm_client::MicroVmClient;
use capmvm_flintlock::{ErrorKind, IfaceType, MicrovmState, StaticAddress, Volume};
use tonic::Code;

use crate::servers::{Backend, Options};
use crate::support::{b64, valid_spec};

crate::on_both_servers!(
    a_create_is_pending_at_version_1_with_flintlocks_defaults_and_additions,
    a_create_without_network_interfaces_is_refused,
    validation_failures_name_each_field_in_flintlocks_words,
    a_create_without_a_name_is_refused_and_an_empty_namespace_is_default,
    unknown_providers_and_missing_capabilities_are_refused,
    a_create_without_a_spec_is_invalid_argument,
    the_same_name_twice_makes_two_microvms,
    refused_creates_store_nothing,
);

async fn a_create_is_pending_at_version_1_with_flintlocks_defaults_and_additions(backend: Backend) {
    let server = backend.start(Options::default()).await;
    let client = server.client();

    let mut spec = valid_spec("m1");
    spec.vcpu = 0;
    spec.memory_mb = 0;
    spec.labels = BTreeMap::from([("cluster-name".to_owned(), "c1".to_owned())]);
    spec.provider = Some("firecracker".to_owned());
    spec.uid = Some("client-chosen-uid-is-ignored".to_owned());
    spec.additional_volumes = vec![Volume {
        id: "data".to_owned(),
        mount_point: Some("/data".to_owned()),
        ..Volume::default()
    }];
    let created = client.create(spec).await.unwrap();

    assert_eq!(created.version, 1);
    assert_eq!(created.status.state, MicrovmState::Pending);
    assert_eq!(created.status.retry, 0);
    assert!(is_ulid(created.uid()), "uid {:?}", created.uid());
    let spec = &created.spec;
    assert_eq!(
        (spec.namespace.as_str(), spec.vcpu, spec.memory_mb),
        ("ns1", 2, 1024),
        "vCPU 0 and memory 0 take flintlock's defaults"
    );
    assert!(spec.labels.is_empty(), "labels are dropped");
    assert_eq!(spec.provider, None, "provider is not echoed");
    let data = &spec.additional_volumes[0];
    assert_eq!(data.mount_point, None, "mount_point is not echoed");
    assert_eq!(
        (data.partition_id.as_deref(), data.size_in_mb),
        (Some(""), Some(0))
    );

    // Firecracker: flintlock's metadata interface first, then ours (guest_mac present, empty).
    let eth0 = &spec.interfaces[0];
    assert_eq!(
        (eth0.device_id.as_str(), eth0.iface_type),
        ("eth0", IfaceType::Tap)
    );
    assert_eq!(eth0.guest_mac.as_deref(), Some("AA:FF:00:00:00:01"));
    assert_eq!(
        eth0.address,
        Some(StaticAddress {
            address: "169.254.0.1/16".to_owned(),
            gateway: None,
            nameservers: vec![]
        })
    );
    assert_eq!(spec.interfaces.len(), 2);
    assert_eq!(spec.interfaces[1].device_id, "eth1");
    assert_eq!(spec.interfaces[1].guest_mac.as_deref(), Some(""));

    // instance_id added to meta-data, the rest kept.
    let meta = base64::engine::general_purpose::STANDARD
        .decode(&spec.metadata["meta-data"])
        .unwrap();
    let meta = String::from_utf8(meta).unwrap();
    assert!(
        meta.contains(&format!("instance_id: {}", created.uid())),
        "{meta}"
    );
    assert!(meta.contains("local_hostname: m1"), "{meta}");
    assert_eq!(
        spec.metadata["user-data"],
        b64("#cloud-config\nbootstrap: s3cret-join-token\n")
    );
    server.stop().await;
}

async fn a_create_without_network_interfaces_is_refused(backend: Backend) {
    let server = backend.start(Options::default()).await;
    let mut spec = valid_spec("m1");
    spec.interfaces.clear();
    let err = server.client().create(spec).await.unwrap_err();
    assert_eq!(
        (err.kind(), err.code()),
        (ErrorKind::InvalidArgument, Some(Code::Unknown))
    );
    assert_eq!(
        err.message(),
        "creating microvm: an error occurred when attempting to validate microvm spec: validation failures found: \
         Key: 'MicroVM.Spec.NetworkInterfaces' Error:Field validation for 'NetworkInterfaces' failed on the 'required' tag"
    );
    server.stop().await;
}

async fn validation_failures_name_each_field_in_flintlocks_words(backend: Backend) {
    let server = backend.start(Options::default()).await;
    let client = server.client();
    let prefix = "creating microvm: an error occurred when attempting to validate microvm spec: validation failures found: ";
    let line = |key: &str, tag: &str| {
        let field = key.rsplit('.').next().unwrap();
        format!(
            "Key: 'MicroVM.Spec.{key}' Error:Field validation for '{field}' failed on the '{tag}' tag"
        )
    };

    let mut too_big = valid_spec("big");
    too_big.vcpu = 65;
    too_big.memory_mb = 40000;
    let mut too_small = valid_spec("small");
    too_small.memory_mb = 512;
    let mut bad_image = valid_spec("image");
    bad_image.kernel.image = "ubuntu:22.04".to_owned();
    let mut no_filename = valid_spec("filename");
    no_filename.kernel.filename = None;
    let mut bad_iface = valid_spec("iface");
    bad_iface.interfaces[0].device_id = "eth/1".to_owned();
    bad_iface.interfaces[0].guest_mac = Some("not-a-mac".to_owned());
    bad_iface.interfaces[0].address = Some(StaticAddress {
        address: "10.0.0.5".to_owned(),
        gateway: Some("nope".to_owned()),
        nameservers: vec!["8.8.8.8".to_owned(), "dns".to_owned()],
    });
    let mut no_root = valid_spec("root");
    no_root.root_volume = None;

    let cases = [
        (
            too_big,
            vec![line("VCPU", "lte"), line("MemoryInMb", "lte")],
        ),
        (too_small, vec![line("MemoryInMb", "gte")]),
        (bad_image, vec![line("Kernel.Image", "imageURI")]),
        (no_filename, vec![line("Kernel.Filename", "required")]),
        (
            bad_iface,
            vec![
                line("NetworkInterfaces[0].GuestDeviceName", "excludesall"),
                line("NetworkInterfaces[0].GuestMAC", "mac"),
                line("NetworkInterfaces[0].StaticAddress.Address", "cidr"),
                line("NetworkInterfaces[0].StaticAddress.Gateway", "cidr"),
                line("NetworkInterfaces[0].StaticAddress.Nameservers[1]", "ip"),
            ],
        ),
        // Neither a root volume nor an initrd: flintlock's own struct-level rule, named by the
        // proto field.
        (no_root, vec![line("root_volume", "volumeOrInitrdRequired")]),
    ];
    for (spec, lines) in cases {
        let name = spec.id.clone();
        let err = client.create(spec).await.unwrap_err();
        assert_eq!(
            (err.kind(), err.code()),
            (ErrorKind::InvalidArgument, Some(Code::Unknown)),
            "{name}"
        );
        assert_eq!(
            err.message(),
            format!("{prefix}{}", lines.join("\n")),
            "{name}"
        );
    }
    server.stop().await;
}

async fn a_create_without_a_name_is_refused_and_an_empty_namespace_is_default(backend: Backend) {
    let server = backend.start(Options::default()).await;
    let client = server.client();
    let err = client.create(valid_spec("")).await.unwrap_err();
    assert_eq!(
        (err.kind(), err.code()),
        (ErrorKind::InvalidArgument, Some(Code::Unknown))
    );
    assert_eq!(
        err.message(),
        "converting request: creating vmid from spec: name is required"
    );

    let mut spec = valid_spec("m1");
    spec.namespace = String::new();
    let created = client.create(spec).await.unwrap();
    assert_eq!(created.spec.namespace, "default");
    assert_eq!(client.list("default", Some("m1")).await.unwrap().len(), 1);
    server.stop().await;
}

async fn unknown_providers_and_missing_capabilities_are_refused(backend: Backend) {
    let server = backend.start(Options::default()).await;
    let client = server.client();

    let mut qemu = valid_spec("p");
    qemu.provider = Some("qemu".to_owned());
    let err = client.create(qemu).await.unwrap_err();
    assert_eq!(
        (err.kind(), err.message()),
        (
            ErrorKind::InvalidArgument,
            "creating microvm: microvm provider qemu isn't available"
        )
    );

    let mut macvtap = valid_spec("mv");
    macvtap.interfaces[0].iface_type = IfaceType::Macvtap;
    let err = client.create(macvtap).await.unwrap_err();
    assert_eq!(
        (err.kind(), err.message()),
        (
            ErrorKind::InvalidArgument,
            "creating microvm: macvtap network interfaces not supported by the microvm provider"
        )
    );

    // Cloud Hypervisor takes macvtap and gets no metadata interface.
    let mut ch = valid_spec("ch");
    ch.provider = Some("cloudhypervisor".to_owned());
    ch.interfaces[0].iface_type = IfaceType::Macvtap;
    let created = client.create(ch).await.unwrap();
    let names: Vec<&str> = created
        .spec
        .interfaces
        .iter()
        .map(|i| i.device_id.as_str())
        .collect();
    assert_eq!(names, ["eth1"]);
    server.stop().await;
}

async fn a_create_without_a_spec_is_invalid_argument(backend: Backend) {
    let server = backend.start(Options::default()).await;
    let mut raw = MicroVmClient::connect(format!("http://{}", server.endpoint()))
        .await
        .unwrap();
    let status = raw
        .create_micro_vm(CreateMicroVmRequest::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(
        status.message(),
        "invalid create microvm request: MicroVMSpec required"
    );
    server.stop().await;
}

async fn the_same_name_twice_makes_two_microvms(backend: Backend) {
    let server = backend.start(Options::default()).await;
    let client = server.client();
    let first = client.create(valid_spec("twin")).await.unwrap();
    let second = client.create(valid_spec("twin")).await.unwrap();
    assert_ne!(first.uid(), second.uid());
    let mut listed: Vec<String> = client
        .list("ns1", Some("twin"))
        .await
        .unwrap()
        .iter()
        .map(|vm| vm.uid().to_owned())
        .collect();
    listed.sort();
    let mut expected = vec![first.uid().to_owned(), second.uid().to_owned()];
    expected.sort();
    assert_eq!(listed, expected);
    server.stop().await;
}

async fn refused_creates_store_nothing(backend: Backend) {
    let server = backend.start(Options::default()).await;
    let client = server.client();
    let mut refused = valid_spec("big");
    refused.vcpu = 100;
    client.create(refused).await.unwrap_err();
    let mut unnamed = valid_spec("");
    unnamed.namespace = "ns1".to_owned();
    client.create(unnamed).await.unwrap_err();
    let mut no_iface = valid_spec("bare");
    no_iface.interfaces.clear();
    client.create(no_iface).await.unwrap_err();
    assert!(client.list("", None).await.unwrap().is_empty());
    server.stop().await;
}
