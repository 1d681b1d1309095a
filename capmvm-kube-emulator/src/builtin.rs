//! The built-in kinds: their discovery data, schemas (for pruning, validation and OpenAPI), table columns
//! and the behaviour of their registry strategies (Secret `stringData`, Namespace phase, Events v1 view).

use std::sync::Arc;

use base64::Engine as _;
use serde_json::{Map, Value, json};

use super::error::{ApiError, FieldError};
use super::jsonpath::JsonPath;
use super::meta::NameRule;
use super::node::{node_columns, node_schema};
use super::registry::{Builtin, CellSource, Column, Conversion, ResourceDef, storage_key};
use super::schema::Schema;

pub(crate) fn path_column(
    name: &str,
    ty: &str,
    path: &str,
    description: &str,
    priority: i64,
) -> Column {
    Column {
        name: name.into(),
        ty: ty.into(),
        format: String::new(),
        description: description.into(),
        priority,
        // The paths below are constants known to parse.
        source: CellSource::Path(JsonPath::parse(path).unwrap_or_else(|_| JsonPath::nothing())),
    }
}

/// The `Age` column of resources without printer columns.
pub(crate) fn age_column() -> Column {
    path_column(
        "Age",
        "date",
        ".metadata.creationTimestamp",
        "CreationTimestamp is a timestamp representing the server time when this object was created.",
        0,
    )
}

fn object_reference() -> Value {
    json!({
        "type": "object",
        "description": "ObjectReference contains enough information to let you inspect or modify the referred object.",
        "properties": {
            "apiVersion": {"type": "string", "description": "API version of the referent."},
            "fieldPath": {"type": "string", "description": "If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement."},
            "kind": {"type": "string", "description": "Kind of the referent."},
            "name": {"type": "string", "description": "Name of the referent."},
            "namespace": {"type": "string", "description": "Namespace of the referent."},
            "resourceVersion": {"type": "string", "description": "Specific resourceVersion to which this reference is made, if any."},
            "uid": {"type": "string", "description": "UID of the referent."}
        }
    })
}

pub(crate) fn type_meta(schema: Value) -> Value {
    let mut s = schema;
    if let Some(props) = s.get_mut("properties").and_then(Value::as_object_mut) {
        props.insert("apiVersion".into(), json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."}));
        props.insert("kind".into(), json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents."}));
        props.insert(
            "metadata".into(),
            json!({"type": "object", "description": "Standard object's metadata."}),
        );
    }
    s
}

fn namespace_schema() -> Value {
    type_meta(json!({
        "type": "object",
        "description": "Namespace provides a scope for Names. Use of multiple namespaces is optional.",
        "properties": {
            "spec": {"type": "object", "description": "Spec defines the behavior of the Namespace.", "properties": {
                "finalizers": {"type": "array", "items": {"type": "string"}, "description": "Finalizers is an opaque list of values that must be empty to permanently remove object from storage."}
            }},
            "status": {"type": "object", "description": "Status describes the current status of a Namespace.", "properties": {
                "phase": {"type": "string", "description": "Phase is the current lifecycle phase of the namespace."},
                "conditions": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            }}
        }
    }))
}

fn secret_schema() -> Value {
    type_meta(json!({
        "type": "object",
        "description": "Secret holds secret data of a certain type. The total bytes of the values in the Data field must be less than MaxSecretSize bytes.",
        "properties": {
            "data": {"type": "object", "additionalProperties": {"type": "string", "format": "byte"}, "description": "Data contains the secret data. Each key must consist of alphanumeric characters, '-', '_' or '.'. The serialized form of the secret data is a base64 encoded string."},
            "stringData": {"type": "object", "additionalProperties": {"type": "string"}, "description": "stringData allows specifying non-binary secret data in string form. It is provided as a write-only input field for convenience."},
            "type": {"type": "string", "description": "Used to facilitate programmatic handling of secret data."},
            "immutable": {"type": "boolean", "description": "Immutable, if set to true, ensures that data stored in the Secret cannot be updated (only object metadata can be modified)."}
        }
    }))
}

fn configmap_schema() -> Value {
    type_meta(json!({
        "type": "object",
        "description": "ConfigMap holds configuration data for pods to consume.",
        "properties": {
            "data": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Data contains the configuration data."},
            "binaryData": {"type": "object", "additionalProperties": {"type": "string", "format": "byte"}, "description": "BinaryData contains the binary data."},
            "immutable": {"type": "boolean", "description": "Immutable, if set to true, ensures that data stored in the ConfigMap cannot be updated."}
        }
    }))
}

fn event_schema() -> Value {
    type_meta(json!({
        "type": "object",
        "description": "Event is a report of an event somewhere in the cluster.",
        "properties": {
            "action": {"type": "string", "description": "What action was taken/failed regarding to the Regarding object."},
            "count": {"type": "integer", "format": "int32", "description": "The number of times this event has occurred."},
            "eventTime": {"type": "string", "format": "date-time", "description": "Time when this Event was first observed."},
            "firstTimestamp": {"type": "string", "format": "date-time", "description": "The time at which the event was first recorded."},
            "involvedObject": object_reference(),
            "lastTimestamp": {"type": "string", "format": "date-time", "description": "The time at which the most recent occurrence of this event was recorded."},
            "message": {"type": "string", "description": "A human-readable description of the status of this operation."},
            "reason": {"type": "string", "description": "This should be a short, machine understandable string that gives the reason for the transition into the object's current status."},
            "related": object_reference(),
            "reportingComponent": {"type": "string", "description": "Name of the controller that emitted this Event."},
            "reportingInstance": {"type": "string", "description": "ID of the controller instance."},
            "series": {"type": "object", "properties": {
                "count": {"type": "integer", "format": "int32"},
                "lastObservedTime": {"type": "string", "format": "date-time"}
            }},
            "source": {"type": "object", "properties": {"component": {"type": "string"}, "host": {"type": "string"}}},
            "type": {"type": "string", "description": "Type of this event (Normal, Warning), new types could be added in the future"}
        },
        "required": ["involvedObject"]
    }))
}

fn event_v1_schema() -> Value {
    type_meta(json!({
        "type": "object",
        "description": "Event is a report of an event somewhere in the cluster. It generally denotes some state change in the system.",
        "properties": {
            "action": {"type": "string", "description": "action is what action was taken/failed regarding to the regarding object."},
            "deprecatedCount": {"type": "integer", "format": "int32"},
            "deprecatedFirstTimestamp": {"type": "string", "format": "date-time"},
            "deprecatedLastTimestamp": {"type": "string", "format": "date-time"},
            "deprecatedSource": {"type": "object", "properties": {"component": {"type": "string"}, "host": {"type": "string"}}},
            "eventTime": {"type": "string", "format": "date-time", "description": "eventTime is the time when this Event was first observed."},
            "note": {"type": "string", "maxLength": 1024, "description": "note is a human-readable description of the status of this operation."},
            "reason": {"type": "string", "description": "reason is why the action was taken."},
            "regarding": object_reference(),
            "related": object_reference(),
            "reportingController": {"type": "string", "description": "reportingController is the name of the controller that emitted this Event."},
            "reportingInstance": {"type": "string", "description": "reportingInstance is the ID of the controller instance."},
            "series": {"type": "object", "properties": {
                "count": {"type": "integer", "format": "int32"},
                "lastObservedTime": {"type": "string", "format": "date-time"}
            }, "required": ["count", "lastObservedTime"]},
            "type": {"type": "string", "enum": ["Normal", "Warning"], "description": "type is the type of this event (Normal, Warning)."}
        },
        "required": ["eventTime", "reportingController", "reportingInstance", "action", "reason", "type"]
    }))
}

fn lease_schema() -> Value {
    type_meta(json!({
        "type": "object",
        "description": "Lease defines a lease concept.",
        "properties": {
            "spec": {"type": "object", "description": "spec contains the specification of the Lease.", "properties": {
                "acquireTime": {"type": "string", "format": "date-time", "description": "acquireTime is a time when the current lease was acquired."},
                "holderIdentity": {"type": "string", "description": "holderIdentity contains the identity of the holder of a current lease."},
                "leaseDurationSeconds": {"type": "integer", "format": "int32", "description": "leaseDurationSeconds is a duration that candidates for a lease need to wait to force acquire it."},
                "leaseTransitions": {"type": "integer", "format": "int32", "description": "leaseTransitions is the number of transitions of a lease between holders."},
                "preferredHolder": {"type": "string", "description": "PreferredHolder signals to a lease holder that the lease has a more optimal holder and should be given up."},
                "renewTime": {"type": "string", "format": "date-time", "description": "renewTime is a time when the current holder of a lease has last updated the lease."},
                "strategy": {"type": "string", "description": "Strategy indicates the strategy for picking the leader for coordinated leader election."}
            }}
        }
    }))
}

fn crd_schema() -> Value {
    let column = json!({"type": "object", "properties": {
        "name": {"type": "string"}, "type": {"type": "string"}, "format": {"type": "string"},
        "description": {"type": "string"}, "priority": {"type": "integer", "format": "int32"},
        "jsonPath": {"type": "string"}
    }, "required": ["name", "type", "jsonPath"]});
    type_meta(json!({
        "type": "object",
        "description": "CustomResourceDefinition represents a resource that should be exposed on the API server.  Its name MUST be in the format <.spec.name>.<.spec.group>.",
        "properties": {
            "spec": {"type": "object", "description": "spec describes how the user wants the resources to appear", "properties": {
                "group": {"type": "string", "description": "group is the API group of the defined custom resource."},
                "names": {"type": "object", "properties": {
                    "plural": {"type": "string"}, "singular": {"type": "string"}, "kind": {"type": "string"},
                    "listKind": {"type": "string"},
                    "shortNames": {"type": "array", "items": {"type": "string"}},
                    "categories": {"type": "array", "items": {"type": "string"}}
                }, "required": ["plural", "kind"]},
                "scope": {"type": "string", "description": "scope indicates whether the defined custom resource is cluster- or namespace-scoped."},
                "preserveUnknownFields": {"type": "boolean"},
                "conversion": {"type": "object", "properties": {
                    "strategy": {"type": "string"},
                    "webhook": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                }},
                "versions": {"type": "array", "items": {"type": "object", "properties": {
                    "name": {"type": "string"}, "served": {"type": "boolean"}, "storage": {"type": "boolean"},
                    "deprecated": {"type": "boolean"}, "deprecationWarning": {"type": "string"},
                    "schema": {"type": "object", "properties": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                    }},
                    "subresources": {"type": "object", "properties": {
                        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "scale": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                    }},
                    "additionalPrinterColumns": {"type": "array", "items": column},
                    "selectableFields": {"type": "array", "items": {"type": "object", "properties": {"jsonPath": {"type": "string"}}}}
                }, "required": ["name", "served", "storage"]}}
            }, "required": ["group", "names", "scope", "versions"]},
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
        },
        "required": ["spec"]
    }))
}

/// The `ObjectMeta` schema published in the OpenAPI documents (for `kubectl explain`).
pub(crate) fn object_meta_schema() -> Value {
    json!({
        "type": "object",
        "description": "ObjectMeta is metadata that all persisted resources must have, which includes all objects users must create.",
        "properties": {
            "annotations": {"type": "object", "additionalProperties": {"type": "string", "default": ""}, "description": "Annotations is an unstructured key value map stored with a resource that may be set by external tools to store and retrieve arbitrary metadata."},
            "creationTimestamp": {"type": "string", "format": "date-time", "description": "CreationTimestamp is a timestamp representing the server time when this object was created."},
            "deletionGracePeriodSeconds": {"type": "integer", "format": "int64", "description": "Number of seconds allowed for this object to gracefully terminate before it will be removed from the system."},
            "deletionTimestamp": {"type": "string", "format": "date-time", "description": "DeletionTimestamp is RFC 3339 date and time at which this resource will be deleted."},
            "finalizers": {"type": "array", "items": {"type": "string", "default": ""}, "description": "Must be empty before the object is deleted from the registry.", "x-kubernetes-list-type": "set", "x-kubernetes-patch-strategy": "merge"},
            "generateName": {"type": "string", "description": "GenerateName is an optional prefix, used by the server, to generate a unique name ONLY IF the Name field has not been provided."},
            "generation": {"type": "integer", "format": "int64", "description": "A sequence number representing a specific generation of the desired state."},
            "labels": {"type": "object", "additionalProperties": {"type": "string", "default": ""}, "description": "Map of string keys and values that can be used to organize and categorize (scope and select) objects."},
            "managedFields": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}, "description": "ManagedFields maps workflow-id and version to the set of fields that are managed by that workflow."},
            "name": {"type": "string", "description": "Name must be unique within a namespace."},
            "namespace": {"type": "string", "description": "Namespace defines the space within which each name must be unique."},
            "ownerReferences": {"type": "array", "items": {"type": "object", "properties": {
                "apiVersion": {"type": "string", "default": ""},
                "blockOwnerDeletion": {"type": "boolean"},
                "controller": {"type": "boolean"},
                "kind": {"type": "string", "default": ""},
                "name": {"type": "string", "default": ""},
                "uid": {"type": "string", "default": ""}
            }, "required": ["apiVersion", "kind", "name", "uid"]}, "description": "List of objects depended by this object.", "x-kubernetes-list-map-keys": ["uid"], "x-kubernetes-list-type": "map", "x-kubernetes-patch-merge-key": "uid", "x-kubernetes-patch-strategy": "merge"},
            "resourceVersion": {"type": "string", "description": "An opaque value that represents the internal version of this object."},
            "selfLink": {"type": "string", "description": "Deprecated: selfLink is a legacy read-only field that is no longer populated by the system."},
            "uid": {"type": "string", "description": "UID is the unique in time and space value for this object."}
        }
    })
}

#[allow(clippy::too_many_arguments)]
fn def(
    builtin: Builtin,
    group: &str,
    version: &str,
    plural: &str,
    kind: &str,
    namespaced: bool,
    short_names: &[&str],
    schema: Value,
    columns: Vec<Column>,
    extra_selectors: &[(&str, &str)],
) -> ResourceDef {
    let compiled = Schema::compile(&schema, "schema").ok().map(Arc::new);
    let mut field_selectors = vec![("metadata.name".to_string(), "metadata.name".to_string())];
    if namespaced {
        field_selectors.push((
            "metadata.namespace".to_string(),
            "metadata.namespace".to_string(),
        ));
    }
    field_selectors.extend(
        extra_selectors
            .iter()
            .map(|(a, b)| ((*a).to_string(), (*b).to_string())),
    );
    let counter = format!("{}/{plural}", ResourceDef::group_for_counters(group));
    let (storage, conversion) = if builtin == Builtin::EventV1 {
        (storage_key("", "events"), Conversion::EventsV1)
    } else {
        (storage_key(group, plural), Conversion::None)
    };
    ResourceDef {
        group: group.into(),
        version: version.into(),
        plural: plural.into(),
        singular: kind.to_ascii_lowercase(),
        kind: kind.into(),
        list_kind: format!("{kind}List"),
        namespaced,
        short_names: short_names.iter().map(|s| (*s).to_string()).collect(),
        categories: if builtin == Builtin::Crd {
            vec!["api-extensions".into()]
        } else {
            Vec::new()
        },
        storage,
        conversion,
        builtin: Some(builtin),
        status_subresource: matches!(builtin, Builtin::Namespace | Builtin::Crd | Builtin::Node),
        scale: None,
        schema: compiled,
        raw_schema: Some(schema),
        columns,
        field_selectors,
        name_rule: if builtin == Builtin::Namespace {
            NameRule::Dns1123Label
        } else {
            NameRule::Dns1123Subdomain
        },
        has_generation: builtin == Builtin::Crd,
        allow_unconditional_update: builtin != Builtin::Crd,
        allow_create_on_update: matches!(
            builtin,
            Builtin::Event | Builtin::EventV1 | Builtin::Lease
        ),
        counter_name: Arc::from(counter.clone()),
        counter_name_status: Arc::from(format!("{counter}/status")),
        deprecation_warning: None,
    }
}

/// The event printer's columns; `v1` reads the `events.k8s.io/v1` field names.
fn event_columns(v1: bool) -> Vec<Column> {
    let f = |core: &'static str, renamed: &'static str| if v1 { renamed } else { core };
    let mut last_seen = path_column(
        "Last Seen",
        "string",
        ".lastTimestamp",
        "Time when this Event was last seen",
        0,
    );
    last_seen.source = CellSource::EventLastSeen;
    let mut object = path_column(
        "Object",
        "string",
        ".involvedObject",
        "The object that this event is about",
        0,
    );
    object.source = CellSource::EventObject;
    vec![
        last_seen,
        path_column(
            "Type",
            "string",
            ".type",
            "Type of this event (Normal, Warning), new types could be added in the future.",
            0,
        ),
        path_column(
            "Reason",
            "string",
            ".reason",
            "Why the action was taken.",
            0,
        ),
        object,
        path_column(
            "Subobject",
            "string",
            f(".involvedObject.fieldPath", ".regarding.fieldPath"),
            "The subobject that this event is about",
            1,
        ),
        path_column(
            "Source",
            "string",
            f(".source.component", ".deprecatedSource.component"),
            "The component reporting this event",
            1,
        ),
        path_column(
            "Message",
            "string",
            f(".message", ".note"),
            "A human-readable description of the status of this operation.",
            0,
        ),
        path_column(
            "First Seen",
            "string",
            f(".firstTimestamp", ".deprecatedFirstTimestamp"),
            "Time when this Event was first seen",
            1,
        ),
        path_column(
            "Count",
            "string",
            f(".count", ".deprecatedCount"),
            "Number of times this event has occurred",
            1,
        ),
        path_column("Name", "string", ".metadata.name", "Name of the event", 1),
    ]
}

/// The built-in resources served at start.
pub(crate) fn defs() -> Vec<ResourceDef> {
    let mut data = path_column("Data", "string", ".data", "Number of items in the data", 0);
    data.source = CellSource::DataCount;
    let mut cm_data = data.clone();
    cm_data.description = "Number of data in the configmap".into();
    let mut crd_created = path_column(
        "Created At",
        "date",
        ".metadata.creationTimestamp",
        "CreationTimestamp is a timestamp representing the server time when this object was created.",
        0,
    );
    crd_created.format = "date-time".into();
    crd_created.ty = "string".into();
    let event_selectors: &[(&str, &str)] = &[
        ("involvedObject.kind", "involvedObject.kind"),
        ("involvedObject.namespace", "involvedObject.namespace"),
        ("involvedObject.name", "involvedObject.name"),
        ("involvedObject.uid", "involvedObject.uid"),
        ("involvedObject.apiVersion", "involvedObject.apiVersion"),
        (
            "involvedObject.resourceVersion",
            "involvedObject.resourceVersion",
        ),
        ("involvedObject.fieldPath", "involvedObject.fieldPath"),
        ("reason", "reason"),
        ("reportingComponent", "reportingComponent"),
        ("source", "source.component"),
        ("type", "type"),
    ];
    let event_v1_selectors: &[(&str, &str)] = &[
        ("regarding.kind", "regarding.kind"),
        ("regarding.namespace", "regarding.namespace"),
        ("regarding.name", "regarding.name"),
        ("regarding.uid", "regarding.uid"),
        ("regarding.apiVersion", "regarding.apiVersion"),
        ("regarding.resourceVersion", "regarding.resourceVersion"),
        ("regarding.fieldPath", "regarding.fieldPath"),
        ("reason", "reason"),
        ("reportingController", "reportingController"),
        ("type", "type"),
    ];
    vec![
        def(
            Builtin::Namespace,
            "",
            "v1",
            "namespaces",
            "Namespace",
            false,
            &["ns"],
            namespace_schema(),
            vec![
                path_column(
                    "Status",
                    "string",
                    ".status.phase",
                    "The status of the namespace",
                    0,
                ),
                age_column(),
            ],
            &[("status.phase", "status.phase")],
        ),
        def(
            Builtin::Secret,
            "",
            "v1",
            "secrets",
            "Secret",
            true,
            &[],
            secret_schema(),
            vec![
                path_column("Type", "string", ".type", "The type of the secret", 0),
                data,
                age_column(),
            ],
            &[("type", "type")],
        ),
        def(
            Builtin::ConfigMap,
            "",
            "v1",
            "configmaps",
            "ConfigMap",
            true,
            &["cm"],
            configmap_schema(),
            vec![cm_data, age_column()],
            &[],
        ),
        def(
            Builtin::Event,
            "",
            "v1",
            "events",
            "Event",
            true,
            &["ev"],
            event_schema(),
            event_columns(false),
            event_selectors,
        ),
        def(
            Builtin::EventV1,
            "events.k8s.io",
            "v1",
            "events",
            "Event",
            true,
            &["ev"],
            event_v1_schema(),
            event_columns(true),
            event_v1_selectors,
        ),
        def(
            Builtin::Lease,
            "coordination.k8s.io",
            "v1",
            "leases",
            "Lease",
            true,
            &[],
            lease_schema(),
            vec![
                path_column(
                    "Holder",
                    "string",
                    ".spec.holderIdentity",
                    "The holder of the lease",
                    0,
                ),
                age_column(),
            ],
            &[],
        ),
        def(
            Builtin::Crd,
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            false,
            &["crd", "crds"],
            crd_schema(),
            vec![crd_created],
            &[],
        ),
        def(
            Builtin::Node,
            "",
            "v1",
            "nodes",
            "Node",
            false,
            &["no"],
            node_schema(),
            node_columns(),
            &[("spec.unschedulable", "spec.unschedulable")],
        ),
    ]
}

/// Field renames between `events.k8s.io/v1` (left) and core `v1` (right) Events.
const EVENT_FIELDS: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

/// Converts a stored core Event into its `events.k8s.io/v1` form.
pub(crate) fn event_to_v1(core: &Value) -> Value {
    let mut out = core.clone();
    if let Value::Object(m) = &mut out {
        for (v1, v0) in EVENT_FIELDS {
            if let Some(x) = m.remove(*v0) {
                m.insert((*v1).to_string(), x);
            }
        }
        m.insert(
            "apiVersion".into(),
            Value::String("events.k8s.io/v1".into()),
        );
    }
    out
}

/// Converts an `events.k8s.io/v1` Event into the stored core form.
pub(crate) fn event_from_v1(v1: Value) -> Value {
    let mut out = v1;
    if let Value::Object(m) = &mut out {
        for (v1f, v0) in EVENT_FIELDS {
            if let Some(x) = m.remove(*v1f) {
                m.insert((*v0).to_string(), x);
            }
        }
        m.insert("apiVersion".into(), Value::String("v1".into()));
    }
    out
}

/// What the built-in registry strategies do before validation, on create and on update.
pub(crate) fn prepare(
    builtin: Builtin,
    obj: &mut Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    match builtin {
        Builtin::Secret => {
            let Some(m) = obj.as_object_mut() else {
                return Ok(());
            };
            if let Some(Value::Object(string_data)) = m.remove("stringData") {
                let data = m.entry("data").or_insert_with(|| Value::Object(Map::new()));
                if !data.is_object() {
                    *data = Value::Object(Map::new());
                }
                if let Value::Object(d) = data {
                    for (k, v) in string_data {
                        let s = v.as_str().unwrap_or("");
                        d.insert(
                            k,
                            Value::String(base64::engine::general_purpose::STANDARD.encode(s)),
                        );
                    }
                }
            }
            if m.get("type")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                m.insert("type".into(), Value::String("Opaque".into()));
            }
            check_base64(m.get("data"), "data")?;
        }
        Builtin::ConfigMap => {
            if let Some(m) = obj.as_object() {
                check_base64(m.get("binaryData"), "binaryData")?;
            }
        }
        Builtin::Namespace => {
            let Some(m) = obj.as_object_mut() else {
                return Ok(());
            };
            match old {
                None => {
                    let spec = m.entry("spec").or_insert_with(|| json!({}));
                    if let Value::Object(spec) = spec
                        && !spec.contains_key("finalizers")
                    {
                        spec.insert("finalizers".into(), json!(["kubernetes"]));
                    }
                    m.insert("status".into(), json!({"phase": "Active"}));
                }
                Some(old) => {
                    // Finalizers of the spec change only through `finalize`; the phase only through the server.
                    if let Some(spec) = old.get("spec") {
                        m.insert("spec".into(), spec.clone());
                    }
                }
            }
        }
        Builtin::Node => super::node::prepare(obj)?,
        Builtin::Event | Builtin::EventV1 | Builtin::Lease | Builtin::Crd => {}
    }
    Ok(())
}

fn check_base64(v: Option<&Value>, field: &str) -> Result<(), ApiError> {
    if let Some(Value::Object(d)) = v {
        for (k, val) in d {
            let s = val.as_str().unwrap_or("");
            if base64::engine::general_purpose::STANDARD.decode(s).is_err() {
                return Err(ApiError::bad_request(format!(
                    "json: cannot unmarshal {field}[{k:?}]: illegal base64 data in the value of key {k:?}"
                )));
            }
        }
    }
    Ok(())
}

/// Update rules of the built-in strategies (immutable Secrets and ConfigMaps).
pub(crate) fn validate_update(builtin: Builtin, new: &Value, old: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if matches!(builtin, Builtin::Secret | Builtin::ConfigMap)
        && old.get("immutable").and_then(Value::as_bool) == Some(true)
    {
        if new.get("immutable").and_then(Value::as_bool) != Some(true) {
            errs.push(FieldError::forbidden(
                "immutable",
                "field is immutable when `immutable` is set",
            ));
        }
        for field in ["data", "binaryData"] {
            if new.get(field) != old.get(field) {
                errs.push(FieldError::forbidden(
                    field,
                    "field is immutable when `immutable` is set",
                ));
            }
        }
        if builtin == Builtin::Secret && new.get("type") != old.get("type") {
            errs.push(FieldError::invalid(
                "type",
                new.get("type").unwrap_or(&Value::Null),
                "field is immutable",
            ));
        }
    }
    if builtin == Builtin::Secret
        && old.get("type") != new.get("type")
        && !errs.iter().any(|e| e.field == "type")
    {
        errs.push(FieldError::invalid(
            "type",
            new.get("type").unwrap_or(&Value::Null),
            "field is immutable",
        ));
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_schema_compiles() {
        for d in defs() {
            assert!(d.schema.is_some(), "{}", d.plural);
        }
    }

    #[test]
    fn secret_string_data_becomes_data() {
        let mut s = json!({"stringData": {"a": "hello"}});
        prepare(Builtin::Secret, &mut s, None).unwrap();
        assert_eq!(s, json!({"data": {"a": "aGVsbG8="}, "type": "Opaque"}));
        let mut bad = json!({"data": {"a": "!!"}});
        assert_eq!(
            prepare(Builtin::Secret, &mut bad, None).unwrap_err().code,
            400
        );
    }

    #[test]
    fn events_round_trip() {
        let v1 = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "note": "n", "regarding": {"name": "x"}});
        let core = event_from_v1(v1.clone());
        assert_eq!(core["message"], "n");
        assert_eq!(core["involvedObject"]["name"], "x");
        assert_eq!(event_to_v1(&core), v1);
    }
}
