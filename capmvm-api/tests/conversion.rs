//! Conversion between v1alpha1 (the Go provider's API) and v1alpha2: lossless both ways (property
//! tests over every field either version has, weird values included), the Go provider's meaning kept
//! (table tests), and errors that name the field.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code

mod strategies;

use std::collections::BTreeMap;
use std::fmt::Debug;

use capmvm_api::conversion::{
    ConversionError, V1ALPHA1_FIELDS_ANNOTATION, V1ALPHA2_FIELDS_ANNOTATION, cluster_to_v1alpha1,
    cluster_to_v1alpha2, convert_object, machine_to_v1alpha1, machine_to_v1alpha2,
    template_to_v1alpha1, template_to_v1alpha2,
};
use capmvm_api::{
    self as api, FailureDomain, Initialization, MicrovmHost, MicrovmMachine, MicrovmMachineSpec,
    MicrovmMachineStatus, v1alpha1,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use proptest::prelude::*;
use serde_json::json;
use strategies::{v1_cluster, v1_machine, v1_template, v2_cluster, v2_machine, v2_template};

fn annotation(meta: &ObjectMeta, key: &str) -> Option<String> {
    meta.annotations.as_ref().and_then(|a| a.get(key)).cloned()
}

/// Clears a provider name flintlock does not know (v1alpha2 has no form for it).
fn flintlock_providers_only(spec: &mut v1alpha1::MicrovmMachineSpec) {
    if !["", "firecracker", "cloudhypervisor"].contains(&spec.provider.as_str()) {
        spec.provider.clear();
    }
}

/// Drops the gateways, nameservers and host selector, which v1alpha1 cannot hold.
fn without_gateways(spec: &mut MicrovmMachineSpec) {
    for nic in &mut spec.network_interfaces {
        nic.gateway = None;
        nic.nameservers.clear();
    }
    spec.host_selector = None;
}

/// The initialization v1alpha1's `ready` can say: none, or provisioned.
fn expressible_initialization(init: Option<&Initialization>) -> Option<Initialization> {
    init.map(|_| Initialization {
        provisioned: Some(true),
    })
}

/// Converts `start` with `there` and the result with `back`: `start` must come back whole, and the
/// object in between must not carry annotation `absent`, when one is named.
fn round_trip<A, B>(
    start: &A,
    there: impl Fn(&A) -> Result<B, ConversionError>,
    back: impl Fn(&B) -> Result<A, ConversionError>,
    absent: Option<&str>,
) -> Result<(), TestCaseError>
where
    A: PartialEq + Debug,
    B: Resource,
{
    let converted = there(start).unwrap();
    if let Some(key) = absent {
        prop_assert_eq!(annotation(converted.meta(), key), None);
    }
    prop_assert_eq!(&back(&converted).unwrap(), start);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn machines_round_trip_from_v1alpha1(old in v1_machine()) {
        round_trip(&old, machine_to_v1alpha2, machine_to_v1alpha1, Some(V1ALPHA2_FIELDS_ANNOTATION))?;
    }

    #[test]
    fn machines_round_trip_from_v1alpha2(new in v2_machine()) {
        round_trip(&new, machine_to_v1alpha1, machine_to_v1alpha2, Some(V1ALPHA1_FIELDS_ANNOTATION))?;
    }

    #[test]
    fn clusters_round_trip_from_v1alpha1(old in v1_cluster()) {
        round_trip(&old, cluster_to_v1alpha2, cluster_to_v1alpha1, None)?;
    }

    #[test]
    fn clusters_round_trip_from_v1alpha2(new in v2_cluster()) {
        round_trip(&new, cluster_to_v1alpha1, cluster_to_v1alpha2, None)?;
    }

    #[test]
    fn templates_round_trip_from_v1alpha1(old in v1_template()) {
        round_trip(&old, template_to_v1alpha2, template_to_v1alpha1, None)?;
    }

    #[test]
    fn templates_round_trip_from_v1alpha2(new in v2_template()) {
        round_trip(&new, template_to_v1alpha1, template_to_v1alpha2, None)?;
    }

    /// What the webhook does: JSON in, JSON out, and back, for each kind. The JSON is the same
    /// document it started as, metadata included.
    #[test]
    fn json_round_trips_through_the_webhooks_function(
        machine in v1_machine(),
        cluster in v2_cluster(),
        template in v1_template(),
    ) {
        let v1 = format!("{}/v1alpha1", api::GROUP);
        let v2 = format!("{}/v1alpha2", api::GROUP);
        for (start, there, back) in [
            (serde_json::to_value(&machine).unwrap(), &v2, &v1),
            (serde_json::to_value(&cluster).unwrap(), &v1, &v2),
            (serde_json::to_value(&template).unwrap(), &v2, &v1),
        ] {
            let converted = convert_object(start.clone(), there).unwrap();
            prop_assert_eq!(converted["apiVersion"].as_str(), Some(there.as_str()));
            prop_assert_eq!(&converted["metadata"]["name"], &start["metadata"]["name"]);
            let returned = convert_object(converted, back).unwrap();
            prop_assert_eq!(returned, start);
        }
    }

    /// A v1alpha1 machine as the Go provider writes it (a provider flintlock knows, states it
    /// writes, no failure fields, conditions without severity once True) needs no annotation: the
    /// v1alpha2 object alone holds all of it.
    #[test]
    fn go_provider_machines_convert_without_an_annotation(old in v1_machine()) {
        let mut old = old;
        flintlock_providers_only(&mut old.spec);
        if let Some(s) = old.status.as_mut() {
            s.failure_reason = None;
            s.failure_message = None;
            if s.vm_state.as_deref().is_some_and(|v| !["pending", "running", "failed", "unknown"].contains(&v)) {
                s.vm_state = Some("running".into());
            }
            for c in &mut s.conditions {
                c.severity.clear();
            }
        }
        round_trip(&old, machine_to_v1alpha2, machine_to_v1alpha1, Some(V1ALPHA1_FIELDS_ANNOTATION))?;
    }

    /// A v1alpha2 machine that uses only what v1alpha1 can hold reads at v1alpha1 without the
    /// annotation: the v1alpha1 object alone holds all of it.
    #[test]
    fn expressible_machines_convert_without_an_annotation(new in v2_machine()) {
        let mut new = new;
        without_gateways(&mut new.spec);
        if let Some(s) = new.status.as_mut() {
            s.host = None;
            s.failure_domain = None;
            s.initialization = expressible_initialization(s.initialization.as_ref());
            for c in &mut s.conditions {
                c.observed_generation = None;
            }
        }
        round_trip(&new, machine_to_v1alpha1, machine_to_v1alpha2, Some(V1ALPHA2_FIELDS_ANNOTATION))?;
    }

    /// Clusters both ways: a Go provider's (no severities) needs no annotation at v1alpha2, a
    /// v1alpha2 one using only what v1alpha1 says (a named host's domain is its endpoint, failure
    /// domains listed by name once) none at v1alpha1.
    #[test]
    fn expressible_clusters_convert_without_an_annotation(old in v1_cluster(), new in v2_cluster()) {
        let mut old = old;
        if let Some(s) = old.status.as_mut() {
            for c in &mut s.conditions {
                c.severity.clear();
            }
        }
        round_trip(&old, cluster_to_v1alpha2, cluster_to_v1alpha1, Some(V1ALPHA1_FIELDS_ANNOTATION))?;

        let mut new = new;
        // An endpoint with neither field is not valid v1alpha2 (minProperties: 1).
        if new.spec.control_plane_endpoint.as_ref().is_some_and(|e| e.host.is_none() && e.port.is_none()) {
            new.spec.control_plane_endpoint = None;
        }
        if let Some(pool) = new.spec.placement.static_pool.as_mut() {
            for h in &mut pool.hosts {
                h.failure_domain = h.name.is_some().then(|| h.endpoint.clone());
                // Host labels and maintenance are v1alpha2's alone.
                h.labels.clear();
                h.maintenance = None;
            }
        }
        if let Some(s) = new.status.as_mut() {
            s.hosts.clear();
            s.initialization = expressible_initialization(s.initialization.as_ref());
            let domains: BTreeMap<String, FailureDomain> = s
                .failure_domains
                .drain(..)
                .map(|mut f| {
                    f.control_plane = Some(f.control_plane.unwrap_or(false));
                    (f.name.clone(), f)
                })
                .collect();
            s.failure_domains = domains.into_values().collect();
            for c in &mut s.conditions {
                c.observed_generation = None;
            }
        }
        round_trip(&new, cluster_to_v1alpha1, cluster_to_v1alpha2, Some(V1ALPHA2_FIELDS_ANNOTATION))?;
    }

    /// Templates: every v1alpha1 one holds at v1alpha2 alone; a v1alpha2 one without status (the
    /// template controller's capacity has no v1alpha1 field) at v1alpha1 alone.
    #[test]
    fn expressible_templates_convert_without_an_annotation(old in v1_template(), new in v2_template()) {
        let mut old = old;
        flintlock_providers_only(&mut old.spec.template.spec);
        let up = template_to_v1alpha2(&old).unwrap();
        prop_assert_eq!(annotation(&up.metadata, V1ALPHA1_FIELDS_ANNOTATION), None);
        let mut new = new;
        new.status = None;
        without_gateways(&mut new.spec.template.spec);
        if new.spec.template.metadata.as_ref().is_some_and(|m| m.labels.is_empty() && m.annotations.is_empty()) {
            new.spec.template.metadata = None;
        }
        round_trip(&new, template_to_v1alpha1, template_to_v1alpha2, Some(V1ALPHA2_FIELDS_ANNOTATION))?;
    }
}

/// A v1alpha2 machine whose spec uses a field v1alpha1 lacks (a gateway), edited at v1alpha1 (vCPUs,
/// as an old script would): the edit wins and the gateway survives.
#[test]
fn an_edit_at_v1alpha1_keeps_what_only_v1alpha2_can_say() {
    let mut new = machine_v2();
    new.spec.network_interfaces[0].address = Some("10.0.0.12/24".into());
    new.spec.network_interfaces[0].gateway = Some("10.0.0.1".into());
    new.spec.network_interfaces[0].nameservers = vec!["10.0.0.2".into()];
    let mut old = machine_to_v1alpha1(&new).unwrap();
    assert!(annotation(&old.metadata, V1ALPHA2_FIELDS_ANNOTATION).is_some());
    old.spec.vcpu = 4;
    let back = machine_to_v1alpha2(&old).unwrap();
    assert_eq!(back.spec.vcpu, 4);
    assert_eq!(
        back.spec.network_interfaces[0].gateway.as_deref(),
        Some("10.0.0.1")
    );
    assert_eq!(back.spec.network_interfaces[0].nameservers, ["10.0.0.2"]);

    // A new address at v1alpha1 drops the gateway written for the old one.
    old.spec.network_interfaces[0].address = "10.0.1.12/24".into();
    let back = machine_to_v1alpha2(&old).unwrap();
    assert_eq!(back.spec.network_interfaces[0].gateway, None);
    assert_eq!(
        annotation(&back.metadata, V1ALPHA2_FIELDS_ANNOTATION),
        None,
        "the kept fields are consumed"
    );
}

/// Host selection is v1alpha2's alone: a script that edits a machine at v1alpha1 (its vCPUs) keeps
/// the machine's hostSelector, and one that edits a cluster (adds a host) keeps the other hosts'
/// labels and maintenance.
#[test]
fn an_edit_at_v1alpha1_keeps_host_selection() {
    let mut new = machine_v2();
    new.spec.host_selector =
        Some(serde_json::from_value(json!({"matchLabels": {"disk": "nvme"}})).unwrap());
    let mut old = machine_to_v1alpha1(&new).unwrap();
    old.spec.vcpu = 4;
    let back = machine_to_v1alpha2(&old).unwrap();
    assert_eq!(back.spec.vcpu, 4);
    assert_eq!(back.spec.host_selector, new.spec.host_selector);

    let cluster: capmvm_api::MicrovmCluster = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha2",
        "kind": "MicrovmCluster",
        "metadata": {"name": "demo", "namespace": "default"},
        "spec": {"placement": {"staticPool": {"hosts": [
            {"name": "a", "endpoint": "10.0.0.5:9090", "labels": {"disk": "nvme"}, "maintenance": "Cordon"},
        ]}}},
    }))
    .unwrap();
    let mut old = cluster_to_v1alpha1(&cluster).unwrap();
    let pool = old.spec.placement.static_pool.as_mut().unwrap();
    pool.hosts.push(v1alpha1::MicrovmHost {
        name: "b".into(),
        endpoint: "10.0.0.6:9090".into(),
        controlplane_allowed: true,
    });
    let back = cluster_to_v1alpha2(&old).unwrap();
    let hosts = &back.spec.placement.static_pool.as_ref().unwrap().hosts;
    assert_eq!(hosts.len(), 2);
    assert_eq!(hosts[0].labels["disk"], "nvme");
    assert_eq!(
        hosts[0].maintenance,
        Some(capmvm_api::HostMaintenance::Cordon)
    );
    assert!(hosts[1].labels.is_empty());
    assert_eq!(hosts[1].maintenance, None);
}

/// The Go provider's Machines were placed in failure domains named by host endpoints; a named host
/// keeps its endpoint as failure domain at v1alpha2 (where a name would otherwise name it), so the
/// Machines' failure domains stay valid. An edit at v1alpha1 keeps a v1alpha2 host's own domain.
#[test]
fn a_named_hosts_failure_domain_stays_its_endpoint() {
    let old: v1alpha1::MicrovmCluster = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "MicrovmCluster",
        "metadata": {"name": "demo", "namespace": "default"},
        "spec": {
            "controlPlaneEndpoint": {"host": "", "port": 0},
            "placement": {"staticPool": {"hosts": [
                {"name": "rack-1", "endpoint": "10.0.0.5:9090", "controlplaneAllowed": true},
                {"endpoint": "10.0.0.6:9090", "controlplaneAllowed": false},
            ]}},
        },
        "status": {"ready": true, "failureDomains": {
            "10.0.0.5:9090": {"controlPlane": true},
            "10.0.0.6:9090": {},
        }},
    }))
    .unwrap();
    let new = cluster_to_v1alpha2(&old).unwrap();
    let hosts = &new.spec.placement.static_pool.as_ref().unwrap().hosts;
    assert_eq!(hosts[0].failure_domain_name(), "10.0.0.5:9090");
    assert_eq!(hosts[0].name.as_deref(), Some("rack-1"));
    assert_eq!(hosts[1].failure_domain_name(), "10.0.0.6:9090");
    assert_eq!(hosts[1].failure_domain, None);
    assert_eq!(new.spec.control_plane_endpoint, None);
    let status = new.status.as_ref().unwrap();
    assert_eq!(
        status.initialization,
        Some(Initialization {
            provisioned: Some(true)
        })
    );
    assert_eq!(
        status
            .failure_domains
            .iter()
            .map(|f| (f.name.as_str(), f.control_plane))
            .collect::<Vec<_>>(),
        [
            ("10.0.0.5:9090", Some(true)),
            ("10.0.0.6:9090", Some(false))
        ]
    );
    assert_eq!(
        annotation(&new.metadata, V1ALPHA1_FIELDS_ANNOTATION),
        None,
        "nothing of a Go provider's cluster is lost"
    );

    // A v1alpha2 host in a shared failure domain, read and edited at v1alpha1 (one more host).
    let mut shared = new.clone();
    for h in &mut shared.spec.placement.static_pool.as_mut().unwrap().hosts {
        h.failure_domain = Some("rack-a".into());
    }
    let mut at_v1 = cluster_to_v1alpha1(&shared).unwrap();
    at_v1
        .spec
        .placement
        .static_pool
        .as_mut()
        .unwrap()
        .hosts
        .push(v1alpha1::MicrovmHost {
            name: "rack-2".into(),
            endpoint: "10.0.0.7:9090".into(),
            controlplane_allowed: true,
        });
    let back = cluster_to_v1alpha2(&at_v1).unwrap();
    let domains: Vec<&str> = back
        .spec
        .placement
        .static_pool
        .as_ref()
        .unwrap()
        .hosts
        .iter()
        .map(MicrovmHost::failure_domain_name)
        .collect();
    assert_eq!(domains, ["rack-a", "rack-a", "10.0.0.7:9090"]);
}

/// A Go provider machine that is not ready keeps its condition severities at v1alpha2 (in the
/// annotation) for v1alpha1 readers, until our controllers rewrite the status: then v1alpha1 shows
/// the new status, not the stale one.
#[test]
fn kept_status_is_used_only_while_the_status_is_unchanged() {
    let mut old = machine_v1();
    old.status = Some(v1alpha1::MicrovmMachineStatus {
        ready: false,
        vm_state: Some("pending".into()),
        conditions: vec![v1alpha1::Condition {
            type_: "MicrovmReady".into(),
            status: "False".into(),
            severity: "Info".into(),
            last_transition_time: Time(Timestamp::from_second(1_700_000_000).unwrap()),
            reason: "MicrovmPending".into(),
            message: String::new(),
        }],
        ..Default::default()
    });
    let mut new = machine_to_v1alpha2(&old).unwrap();
    assert!(annotation(&new.metadata, V1ALPHA1_FIELDS_ANNOTATION).is_some());
    assert_eq!(machine_to_v1alpha1(&new).unwrap(), old);

    // Our controller takes over and writes its own status.
    new.status = Some(MicrovmMachineStatus {
        initialization: Some(Initialization {
            provisioned: Some(true),
        }),
        vm_state: Some(api::VmState::Running),
        host: Some("10.0.0.5:9090".into()),
        ..Default::default()
    });
    let read = machine_to_v1alpha1(&new).unwrap();
    let status = read.status.unwrap();
    assert!(status.ready);
    assert_eq!(status.vm_state.as_deref(), Some("running"));
    assert!(status.conditions.is_empty(), "{:?}", status.conditions);
    assert_eq!(annotation(&read.metadata, V1ALPHA1_FIELDS_ANNOTATION), None);
    assert!(
        annotation(&read.metadata, V1ALPHA2_FIELDS_ANNOTATION).is_some(),
        "status.host is kept for the way back"
    );
}

/// An object as the Go provider's JSON writes it (empty strings always there, `labels: null`)
/// converts to what v1alpha2 users write, and the annotation keys of the other version are dropped.
#[test]
fn a_go_provider_object_reads_as_a_v1alpha2_user_writes_it() {
    let stored = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "MicrovmMachine",
        "metadata": {
            "name": "demo-md-0-x7k2p",
            "namespace": "default",
            "uid": "2f1c",
            "resourceVersion": "812",
            "finalizers": ["microvmmachine.infrastructure.cluster.x-k8s.io"],
            "managedFields": [{"manager": "manager", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {
            "vcpu": 2, "memoryMb": 2048,
            "rootVolume": {"id": "root", "image": "ghcr.io/liquidmetal-dev/capmvm-k8s-os:1.23.5"},
            "kernel": {"image": "ghcr.io/liquidmetal-dev/firecracker-kernel:5.10.77", "filename": "boot/vmlinux"},
            "networkInterfaces": [{"guestDeviceName": "eth1", "guestMac": "", "type": "tap", "address": ""}],
            "labels": null,
            "providerID": "microvm://10.0.0.5:9090/01KE75BHT9H6D7V5YG0KYGRXX2",
        },
        "status": {"ready": true, "vmState": "running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-02T03:04:05Z"},
            {"type": "MicrovmReady", "status": "True", "lastTransitionTime": "2026-01-02T03:04:05Z"},
        ]},
    });
    let converted =
        convert_object(stored.clone(), "infrastructure.cluster.x-k8s.io/v1alpha2").unwrap();
    assert_eq!(
        converted["metadata"], stored["metadata"],
        "metadata untouched"
    );
    assert_eq!(
        converted["spec"],
        json!({
            "vcpu": 2, "memoryMb": 2048,
            "rootVolume": {"id": "root", "image": "ghcr.io/liquidmetal-dev/capmvm-k8s-os:1.23.5"},
            "kernel": {"image": "ghcr.io/liquidmetal-dev/firecracker-kernel:5.10.77", "filename": "boot/vmlinux"},
            "networkInterfaces": [{"guestDeviceName": "eth1", "type": "tap"}],
            "providerID": "microvm://10.0.0.5:9090/01KE75BHT9H6D7V5YG0KYGRXX2",
        })
    );
    assert_eq!(
        converted["status"]["initialization"],
        json!({"provisioned": true})
    );
    assert_eq!(converted["status"]["vmState"], "running");
    assert_eq!(converted["status"]["conditions"][0]["type"], "Ready");
    // And typed: what the engine reads.
    let machine: MicrovmMachine = serde_json::from_value(converted).unwrap();
    assert_eq!(
        machine.spec.network_interfaces[0].iface_type,
        api::IfaceType::Tap
    );
}

#[test]
fn errors_name_the_object_and_the_field() {
    let v2 = "infrastructure.cluster.x-k8s.io/v1alpha2";
    let bad = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "MicrovmMachine",
        "metadata": {"name": "m", "namespace": "ns"},
        "spec": {"vcpu": 2, "memoryMb": 2048, "rootVolume": {"id": "root"}, "kernel": {"image": "k"},
                 "networkInterfaces": [{"guestDeviceName": "eth1", "type": "bridge"}]},
    });
    let err = convert_object(bad, v2).unwrap_err().to_string();
    assert!(err.contains("MicrovmMachine ns/m"), "{err}");
    assert!(err.contains("spec.networkInterfaces[0].type"), "{err}");
    assert!(err.contains("bridge"), "{err}");

    let err = convert_object(json!({"kind": "MicrovmMachine"}), v2).unwrap_err();
    assert!(
        matches!(err, ConversionError::MissingField("apiVersion")),
        "{err}"
    );
    let err = convert_object(
        json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha2", "kind": "MicrovmMachinePool"}),
        "infrastructure.cluster.x-k8s.io/v1alpha1",
    )
    .unwrap_err();
    assert!(err.to_string().contains("MicrovmMachinePool"), "{err}");
    let err = convert_object(
        json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "MicrovmMachine"}),
        "infrastructure.cluster.x-k8s.io/v1beta1",
    )
    .unwrap_err();
    assert!(err.to_string().contains("v1beta1"), "{err}");

    // A conversion to the version an object is at changes nothing (the API server may ask).
    let same = json!({"apiVersion": v2, "kind": "MicrovmMachine", "anything": 1});
    assert_eq!(convert_object(same.clone(), v2).unwrap(), same);
}

/// A malformed annotation (edited by hand) is ignored: the object still converts.
#[test]
fn a_malformed_annotation_is_ignored() {
    let mut old = machine_v1();
    old.metadata.annotations = Some(BTreeMap::from([(
        V1ALPHA2_FIELDS_ANNOTATION.to_string(),
        "{not json".to_string(),
    )]));
    let new = machine_to_v1alpha2(&old).unwrap();
    assert_eq!(new.metadata.annotations, None);
    assert_eq!(new.spec.vcpu, old.spec.vcpu);
}

fn machine_v1() -> v1alpha1::MicrovmMachine {
    serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "MicrovmMachine",
        "metadata": {"name": "m", "namespace": "default"},
        "spec": {"vcpu": 2, "memoryMb": 2048, "rootVolume": {"id": "root", "image": "os"},
                 "kernel": {"image": "kernel", "filename": "boot/vmlinux"},
                 "networkInterfaces": [{"guestDeviceName": "eth1", "type": "tap"}]},
    }))
    .unwrap()
}

fn machine_v2() -> MicrovmMachine {
    machine_to_v1alpha2(&machine_v1()).unwrap()
}
