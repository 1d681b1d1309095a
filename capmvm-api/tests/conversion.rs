//! Conversion between v1alpha1 (the Go provider's API) and v1alpha2: lossless both ways (property
//! tests over every field either version has, weird values included), the Go provider's meaning kept
//! (table tests), and errors that name the field.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code

use std::collections::BTreeMap;
use std::fmt::Debug;

use capmvm_api::conversion::{
    ConversionError, V1ALPHA1_FIELDS_ANNOTATION, V1ALPHA2_FIELDS_ANNOTATION, cluster_to_v1alpha1,
    cluster_to_v1alpha2, convert_object, machine_to_v1alpha1, machine_to_v1alpha2,
    template_to_v1alpha1, template_to_v1alpha2,
};
use capmvm_api::{
    self as api, ApiEndpoint, FailureDomain, Initialization, MachineAddress, MachineAddressType,
    MicrovmCluster, MicrovmClusterSpec, MicrovmClusterStatus, MicrovmHost, MicrovmMachine,
    MicrovmMachineSpec, MicrovmMachineStatus, MicrovmMachineTemplate, MicrovmMachineTemplateSpec,
    MicrovmMachineTemplateStatus, NodeInfo, v1alpha1,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;
use serde_json::json;

// --- strategies shared by both versions ---

fn word() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9-]{0,7}"
}

/// A string `v1alpha1` may hold: empty means unset there.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), word()]
}

fn map() -> impl Strategy<Value = BTreeMap<String, String>> {
    btree_map(word(), text(), 0..3)
}

fn time() -> impl Strategy<Value = Time> {
    (0i64..4_000_000_000).prop_map(|s| Time(Timestamp::from_second(s).unwrap()))
}

/// Metadata with the things a stored object has; annotations never empty-but-present (the API
/// server leaves an empty map out).
fn metadata() -> impl Strategy<Value = ObjectMeta> {
    (
        word(),
        word(),
        option::of("[0-9a-f]{8}"),
        option::of(btree_map(word(), text(), 1..3)),
        option::of(btree_map("[a-z]{1,5}\\.example/[a-z]{1,5}", text(), 1..3)),
        option::of(1i64..20),
        vec(word(), 0..2),
    )
        .prop_map(
            |(name, namespace, uid, labels, annotations, generation, finalizers)| ObjectMeta {
                name: Some(name),
                namespace: Some(namespace),
                uid,
                labels,
                annotations,
                generation,
                finalizers: (!finalizers.is_empty()).then_some(finalizers),
                ..Default::default()
            },
        )
}

fn addresses() -> impl Strategy<Value = Vec<MachineAddress>> {
    vec(
        (
            prop_oneof![
                Just(MachineAddressType::Hostname),
                Just(MachineAddressType::InternalIp),
                Just(MachineAddressType::ExternalDns),
            ],
            word(),
        )
            .prop_map(|(address_type, address)| MachineAddress {
                address_type,
                address,
            }),
        0..3,
    )
}

fn condition_type() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("Ready".to_string()),
        Just("MicrovmReady".to_string()),
        "[A-Z][a-zA-Z]{0,8}",
    ]
}

fn condition_status() -> impl Strategy<Value = String> {
    prop_oneof![Just("True"), Just("False"), Just("Unknown")].prop_map(str::to_string)
}

// --- v1alpha1 ---

fn v1_keys() -> impl Strategy<Value = Vec<v1alpha1::SshPublicKey>> {
    vec(
        (text(), vec(word(), 0..2)).prop_map(|(user, authorized_keys)| v1alpha1::SshPublicKey {
            user,
            authorized_keys,
        }),
        0..2,
    )
}

fn v1_conditions() -> impl Strategy<Value = Vec<v1alpha1::Condition>> {
    vec(
        (
            condition_type(),
            condition_status(),
            prop_oneof![
                Just(String::new()),
                Just("Info".into()),
                Just("Error".into())
            ],
            time(),
            text(),
            text(),
        )
            .prop_map(|(type_, status, severity, t, reason, message)| {
                v1alpha1::Condition {
                    type_,
                    status,
                    severity,
                    last_transition_time: t,
                    reason,
                    message,
                }
            }),
        0..3,
    )
}

fn v1_volume() -> impl Strategy<Value = v1alpha1::Volume> {
    (word(), text(), any::<bool>(), text(), text()).prop_map(
        |(id, image, read_only, mount_point, virtiofs_path)| v1alpha1::Volume {
            id,
            image,
            read_only,
            mount_point,
            virtiofs_path,
        },
    )
}

fn v1_file() -> impl Strategy<Value = v1alpha1::ContainerFileSource> {
    (word(), text()).prop_map(|(image, filename)| v1alpha1::ContainerFileSource { image, filename })
}

fn v1_machine_spec() -> impl Strategy<Value = v1alpha1::MicrovmMachineSpec> {
    let nics = vec(
        (
            word(),
            text(),
            prop_oneof![
                Just(v1alpha1::IfaceType::Tap),
                Just(v1alpha1::IfaceType::Macvtap)
            ],
            text(),
        )
            .prop_map(|(guest_device_name, guest_mac, iface_type, address)| {
                v1alpha1::NetworkInterface {
                    guest_device_name,
                    guest_mac,
                    iface_type,
                    address,
                }
            }),
        1..3,
    );
    (
        prop_oneof![
            Just(String::new()),
            Just("firecracker".to_string()),
            Just("cloudhypervisor".to_string()),
            "[A-Za-z]{1,8}",
        ],
        (any::<i64>(), any::<i64>()),
        v1_volume(),
        vec(v1_volume(), 0..2),
        v1_file(),
        map(),
        option::of(v1_file()),
        nics,
        map(),
        v1_keys(),
        option::of(word()),
    )
        .prop_map(
            |(
                provider,
                (vcpu, memory_mb),
                root_volume,
                volumes,
                kernel,
                kernel_cmdline,
                initrd,
                network_interfaces,
                labels,
                ssh_public_keys,
                provider_id,
            )| v1alpha1::MicrovmMachineSpec {
                provider,
                vcpu,
                memory_mb,
                root_volume,
                volumes,
                kernel,
                kernel_cmdline,
                initrd,
                network_interfaces,
                labels,
                ssh_public_keys,
                provider_id,
            },
        )
}

fn v1_machine_status() -> impl Strategy<Value = v1alpha1::MicrovmMachineStatus> {
    (
        any::<bool>(),
        option::of(prop_oneof![
            Just("pending".to_string()),
            Just("running".to_string()),
            Just("failed".to_string()),
            Just("deleted".to_string()),
            Just("unknown".to_string()),
            "[A-Za-z]{1,8}",
        ]),
        addresses(),
        option::of(word()),
        option::of(word()),
        v1_conditions(),
    )
        .prop_map(
            |(ready, vm_state, addresses, failure_reason, failure_message, conditions)| {
                v1alpha1::MicrovmMachineStatus {
                    ready,
                    vm_state,
                    addresses,
                    failure_reason,
                    failure_message,
                    conditions,
                }
            },
        )
}

fn v1_machine() -> impl Strategy<Value = v1alpha1::MicrovmMachine> {
    (
        metadata(),
        v1_machine_spec(),
        option::of(v1_machine_status()),
    )
        .prop_map(|(metadata, spec, status)| v1alpha1::MicrovmMachine {
            metadata,
            spec,
            status,
        })
}

fn v1_cluster() -> impl Strategy<Value = v1alpha1::MicrovmCluster> {
    let hosts = vec(
        (text(), word(), any::<bool>()).prop_map(|(name, endpoint, controlplane_allowed)| {
            v1alpha1::MicrovmHost {
                name,
                endpoint,
                controlplane_allowed,
            }
        }),
        1..4,
    );
    let spec = (
        (text(), -1i32..70000),
        v1_keys(),
        option::of((hosts, text()).prop_map(|(hosts, basic_auth_secret)| {
            v1alpha1::StaticPoolPlacement {
                hosts,
                basic_auth_secret,
            }
        })),
        option::of(word().prop_map(|endpoint| v1alpha1::Proxy { endpoint })),
        text(),
    )
        .prop_map(
            |((host, port), ssh_public_keys, static_pool, microvm_proxy, tls_secret_ref)| {
                v1alpha1::MicrovmClusterSpec {
                    control_plane_endpoint: v1alpha1::ApiEndpoint { host, port },
                    ssh_public_keys,
                    placement: v1alpha1::Placement { static_pool },
                    microvm_proxy,
                    tls_secret_ref,
                }
            },
        );
    let status = (
        any::<bool>(),
        v1_conditions(),
        btree_map(
            word(),
            (any::<bool>(), map()).prop_map(|(control_plane, attributes)| {
                v1alpha1::FailureDomainSpec {
                    control_plane,
                    attributes,
                }
            }),
            0..3,
        ),
    )
        .prop_map(
            |(ready, conditions, failure_domains)| v1alpha1::MicrovmClusterStatus {
                ready,
                conditions,
                failure_domains,
            },
        );
    (metadata(), spec, option::of(status)).prop_map(|(metadata, spec, status)| {
        v1alpha1::MicrovmCluster {
            metadata,
            spec,
            status,
        }
    })
}

fn v1_template() -> impl Strategy<Value = v1alpha1::MicrovmMachineTemplate> {
    (metadata(), map(), map(), v1_machine_spec()).prop_map(
        |(metadata, labels, annotations, spec)| v1alpha1::MicrovmMachineTemplate {
            metadata,
            spec: v1alpha1::MicrovmMachineTemplateSpec {
                template: v1alpha1::MicrovmMachineTemplateResource {
                    metadata: v1alpha1::TemplateObjectMeta {
                        labels,
                        annotations,
                    },
                    spec,
                },
            },
        },
    )
}

// --- v1alpha2 ---

fn some_word() -> impl Strategy<Value = Option<String>> {
    option::of(word())
}

fn v2_conditions() -> impl Strategy<Value = Vec<Condition>> {
    vec(
        (
            condition_type(),
            condition_status(),
            time(),
            text(),
            text(),
            option::of(0i64..9),
        )
            .prop_map(
                |(type_, status, last_transition_time, reason, message, observed_generation)| {
                    Condition {
                        type_,
                        status,
                        last_transition_time,
                        reason,
                        message,
                        observed_generation,
                    }
                },
            ),
        0..3,
    )
}

fn initialization() -> impl Strategy<Value = Option<Initialization>> {
    option::of(option::of(any::<bool>()).prop_map(|provisioned| Initialization { provisioned }))
}

fn v2_keys() -> impl Strategy<Value = Vec<api::SshPublicKey>> {
    vec(
        (text(), vec(word(), 0..2)).prop_map(|(user, authorized_keys)| api::SshPublicKey {
            user,
            authorized_keys,
        }),
        0..2,
    )
}

fn v2_volume() -> impl Strategy<Value = api::Volume> {
    (word(), some_word(), any::<bool>(), some_word(), some_word()).prop_map(
        |(id, image, read_only, mount_point, virtiofs_path)| api::Volume {
            id,
            image,
            read_only,
            mount_point,
            virtiofs_path,
        },
    )
}

fn v2_machine_spec() -> impl Strategy<Value = MicrovmMachineSpec> {
    let nics = vec(
        (
            word(),
            some_word(),
            prop_oneof![Just(api::IfaceType::Tap), Just(api::IfaceType::Macvtap)],
            some_word(),
            some_word(),
            vec(word(), 0..2),
        )
            .prop_map(
                |(guest_device_name, guest_mac, iface_type, address, gateway, nameservers)| {
                    api::NetworkInterface {
                        guest_device_name,
                        guest_mac,
                        iface_type,
                        address,
                        gateway,
                        nameservers,
                    }
                },
            ),
        1..3,
    );
    (
        option::of(prop_oneof![
            Just(api::VmmProvider::Firecracker),
            Just(api::VmmProvider::Cloudhypervisor)
        ]),
        (any::<i64>(), any::<i64>()),
        v2_volume(),
        vec(v2_volume(), 0..2),
        (word(), text()).prop_map(|(image, filename)| api::Kernel { image, filename }),
        map(),
        option::of(
            (word(), some_word()).prop_map(|(image, filename)| api::Initrd { image, filename }),
        ),
        nics,
        map(),
        v2_keys(),
        some_word(),
    )
        .prop_map(
            |(
                provider,
                (vcpu, memory_mb),
                root_volume,
                volumes,
                kernel,
                kernel_cmdline,
                initrd,
                network_interfaces,
                labels,
                ssh_public_keys,
                provider_id,
            )| MicrovmMachineSpec {
                provider,
                vcpu,
                memory_mb,
                root_volume,
                volumes,
                kernel,
                kernel_cmdline,
                initrd,
                network_interfaces,
                labels,
                ssh_public_keys,
                provider_id,
            },
        )
}

fn v2_machine_status() -> impl Strategy<Value = MicrovmMachineStatus> {
    (
        initialization(),
        option::of(prop_oneof![
            Just(api::VmState::Pending),
            Just(api::VmState::Running),
            Just(api::VmState::Failed),
            Just(api::VmState::Deleting),
            Just(api::VmState::Unknown),
        ]),
        some_word(),
        some_word(),
        addresses(),
        v2_conditions(),
    )
        .prop_map(
            |(initialization, vm_state, host, failure_domain, addresses, conditions)| {
                MicrovmMachineStatus {
                    initialization,
                    vm_state,
                    host,
                    failure_domain,
                    addresses,
                    conditions,
                }
            },
        )
}

fn v2_machine() -> impl Strategy<Value = MicrovmMachine> {
    (
        metadata(),
        v2_machine_spec(),
        option::of(v2_machine_status()),
    )
        .prop_map(|(metadata, spec, status)| MicrovmMachine {
            metadata,
            spec,
            status,
        })
}

fn v2_cluster() -> impl Strategy<Value = MicrovmCluster> {
    let hosts = vec(
        (some_word(), word(), any::<bool>(), some_word()).prop_map(
            |(name, endpoint, controlplane_allowed, failure_domain)| MicrovmHost {
                name,
                endpoint,
                controlplane_allowed,
                failure_domain,
            },
        ),
        1..4,
    );
    let spec = (
        option::of(
            (some_word(), option::of(1i32..65536))
                .prop_map(|(host, port)| ApiEndpoint { host, port }),
        ),
        v2_keys(),
        option::of((hosts, some_word()).prop_map(|(hosts, basic_auth_secret)| {
            api::StaticPoolPlacement {
                hosts,
                basic_auth_secret,
            }
        })),
        option::of(word().prop_map(|endpoint| api::Proxy { endpoint })),
        some_word(),
    )
        .prop_map(
            |(
                control_plane_endpoint,
                ssh_public_keys,
                static_pool,
                microvm_proxy,
                tls_secret_ref,
            )| {
                MicrovmClusterSpec {
                    control_plane_endpoint,
                    ssh_public_keys,
                    placement: api::Placement { static_pool },
                    microvm_proxy,
                    tls_secret_ref,
                }
            },
        );
    let status = (
        initialization(),
        vec(
            (word(), option::of(any::<bool>()), map()).prop_map(
                |(name, control_plane, attributes)| FailureDomain {
                    name,
                    control_plane,
                    attributes,
                },
            ),
            0..3,
        ),
        v2_conditions(),
    )
        .prop_map(
            |(initialization, failure_domains, conditions)| MicrovmClusterStatus {
                initialization,
                failure_domains,
                conditions,
            },
        );
    (metadata(), spec, option::of(status)).prop_map(|(metadata, spec, status)| MicrovmCluster {
        metadata,
        spec,
        status,
    })
}

fn v2_template() -> impl Strategy<Value = MicrovmMachineTemplate> {
    let status = (
        btree_map(word(), word(), 0..2),
        option::of(
            (some_word(), some_word()).prop_map(|(architecture, operating_system)| NodeInfo {
                architecture,
                operating_system,
            }),
        ),
    )
        .prop_map(|(capacity, node_info)| MicrovmMachineTemplateStatus {
            capacity,
            node_info,
        });
    (
        metadata(),
        option::of(
            (map(), map()).prop_map(|(labels, annotations)| api::TemplateMeta {
                labels,
                annotations,
            }),
        ),
        v2_machine_spec(),
        option::of(status),
    )
        .prop_map(
            |(metadata, template_meta, spec, status)| MicrovmMachineTemplate {
                metadata,
                spec: MicrovmMachineTemplateSpec {
                    template: api::MicrovmMachineTemplateResource {
                        metadata: template_meta,
                        spec,
                    },
                },
                status,
            },
        )
}

fn annotation(meta: &ObjectMeta, key: &str) -> Option<String> {
    meta.annotations.as_ref().and_then(|a| a.get(key)).cloned()
}

/// Clears a provider name flintlock does not know (v1alpha2 has no form for it).
fn flintlock_providers_only(spec: &mut v1alpha1::MicrovmMachineSpec) {
    if !["", "firecracker", "cloudhypervisor"].contains(&spec.provider.as_str()) {
        spec.provider.clear();
    }
}

/// Drops the gateways and nameservers, which v1alpha1 cannot hold.
fn without_gateways(spec: &mut MicrovmMachineSpec) {
    for nic in &mut spec.network_interfaces {
        nic.gateway = None;
        nic.nameservers.clear();
    }
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
            }
        }
        if let Some(s) = new.status.as_mut() {
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
