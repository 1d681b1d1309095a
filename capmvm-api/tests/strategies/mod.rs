//! Proptest strategies for both versions of every converted kind: every field either version
//! has, weird values included (empty strings `v1alpha1` treats as unset, unknown providers and
//! states, condition severities).

use std::collections::BTreeMap;

use capmvm_api::{
    self as api, ApiEndpoint, FailureDomain, Initialization, MachineAddress, MachineAddressType,
    MicrovmCluster, MicrovmClusterSpec, MicrovmClusterStatus, MicrovmHost, MicrovmMachine,
    MicrovmMachineSpec, MicrovmMachineStatus, MicrovmMachineTemplate, MicrovmMachineTemplateSpec,
    MicrovmMachineTemplateStatus, NodeInfo, v1alpha1,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    Condition, LabelSelector, LabelSelectorRequirement, ObjectMeta, Time,
};
use k8s_openapi::jiff::Timestamp;
use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;

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

pub(crate) fn v1_machine() -> impl Strategy<Value = v1alpha1::MicrovmMachine> {
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

pub(crate) fn v1_cluster() -> impl Strategy<Value = v1alpha1::MicrovmCluster> {
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

pub(crate) fn v1_template() -> impl Strategy<Value = v1alpha1::MicrovmMachineTemplate> {
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
        (some_word(), option::of(host_selector())),
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
                (provider_id, host_selector),
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
                host_selector,
                provider_id,
            },
        )
}

/// A selector of labels and set-based requirements, as `hostSelector` holds.
fn host_selector() -> impl Strategy<Value = LabelSelector> {
    let requirement = (
        word(),
        prop_oneof![Just("In"), Just("NotIn"), Just("Exists")],
        vec(word(), 0..3),
    )
        .prop_map(|(key, operator, values)| LabelSelectorRequirement {
            key,
            operator: operator.to_string(),
            values: (!values.is_empty()).then_some(values),
        });
    (
        map().prop_map(|m| (!m.is_empty()).then_some(m)),
        option::of(vec(requirement, 1..3)),
    )
        .prop_map(|(match_labels, match_expressions)| LabelSelector {
            match_labels,
            match_expressions,
        })
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

pub(crate) fn v2_machine() -> impl Strategy<Value = MicrovmMachine> {
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

pub(crate) fn v2_cluster() -> impl Strategy<Value = MicrovmCluster> {
    let hosts = vec(
        (
            some_word(),
            word(),
            any::<bool>(),
            some_word(),
            map(),
            option::of(prop_oneof![
                Just(api::HostMaintenance::Cordon),
                Just(api::HostMaintenance::Evacuate)
            ]),
        )
            .prop_map(
                |(name, endpoint, controlplane_allowed, failure_domain, labels, maintenance)| {
                    MicrovmHost {
                        name,
                        endpoint,
                        controlplane_allowed,
                        failure_domain,
                        labels,
                        maintenance,
                    }
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
        vec(host_status(), 0..3),
    )
        .prop_map(|(initialization, failure_domains, conditions, hosts)| {
            MicrovmClusterStatus {
                initialization,
                failure_domains,
                hosts,
                conditions,
            }
        });
    (metadata(), spec, option::of(status)).prop_map(|(metadata, spec, status)| MicrovmCluster {
        metadata,
        spec,
        status,
    })
}

fn host_status() -> impl Strategy<Value = api::HostStatus> {
    (
        word(),
        word(),
        prop_oneof![
            Just(api::HostState::Ready),
            Just(api::HostState::Cordoned),
            Just(api::HostState::Unreachable),
        ],
        option::of(text()),
        0i32..50,
    )
        .prop_map(
            |(name, endpoint, state, reason, microvms)| api::HostStatus {
                name,
                endpoint,
                state,
                reason,
                microvms,
            },
        )
}

pub(crate) fn v2_template() -> impl Strategy<Value = MicrovmMachineTemplate> {
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
