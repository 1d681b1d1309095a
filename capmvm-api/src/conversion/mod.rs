//! Conversion between `v1alpha1` (the Go provider's API) and `v1alpha2` (ours, the storage version),
//! for MicrovmCluster, MicrovmMachine and MicrovmMachineTemplate. Pure functions: the operator's
//! conversion webhook calls [`convert_object`] for each object of a `ConversionReview`.
//!
//! Each field either version has maps to the other where both can hold it, with the Go provider's
//! meaning: a host's failure domain is its endpoint, `status.ready` is `initialization.provisioned`,
//! the failure-domain map is the sorted list, an empty string is an unset field. What one version
//! cannot hold survives a round trip through it in an annotation, as CAPI's own conversions do:
//!
//! - reading a `v1alpha2` object at `v1alpha1` keeps its spec and status, when `v1alpha1` loses some
//!   of them (a host's own failure domain, a gateway, `status.host`, observed generations...), in
//!   [`V1ALPHA2_FIELDS_ANNOTATION`]; converting back restores them. A spec edited at `v1alpha1`
//!   meanwhile wins: it is converted, and only the fields `v1alpha1` cannot express (failure domains
//!   by endpoint, gateways and nameservers by interface) are taken from the annotation;
//! - a `v1alpha1` object whose spec or status `v1alpha2` cannot hold whole (an unknown provider name,
//!   condition severities, `failureReason`...) keeps them in [`V1ALPHA1_FIELDS_ANNOTATION`], used
//!   when it is read at `v1alpha1` again while that part is unchanged (a status our controllers have
//!   rewritten since is converted instead).
//!
//! So `v1alpha1 -> v1alpha2 -> v1alpha1` and `v1alpha2 -> v1alpha1 -> v1alpha2` give back the object
//! they started from (property tests in `tests/conversion.rs`). An annotation that does not parse is
//! ignored: the object converts as if it had none, rather than becoming unreadable.

mod cluster;
mod machine;
mod template;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::cluster::Initialization;
pub use crate::keys::{V1ALPHA1_FIELDS_ANNOTATION, V1ALPHA2_FIELDS_ANNOTATION};
use crate::{GROUP, v1alpha1};

pub use cluster::{cluster_to_v1alpha1, cluster_to_v1alpha2};
pub use machine::{machine_to_v1alpha1, machine_to_v1alpha2};
pub use template::{template_to_v1alpha1, template_to_v1alpha2};

/// The kinds served at both versions.
pub const CONVERTIBLE_KINDS: [&str; 3] =
    ["MicrovmCluster", "MicrovmMachine", "MicrovmMachineTemplate"];

/// Why an object could not be converted. Each names the object and what to fix.
#[derive(Debug, thiserror::Error)]
pub enum ConversionError {
    /// A field every Kubernetes object has is missing or not a string.
    #[error("the object has no {0} string; send whole Kubernetes objects")]
    MissingField(&'static str),
    /// An apiVersion this provider does not serve.
    #[error(
        "apiVersion {0:?} is not served here: convert between {GROUP}/v1alpha1 and {GROUP}/v1alpha2"
    )]
    UnsupportedVersion(String),
    /// A kind without a `v1alpha1` version.
    #[error(
        "kind {0:?} has no v1alpha1 version: only MicrovmCluster, MicrovmMachine and MicrovmMachineTemplate are converted"
    )]
    UnsupportedKind(String),
    /// The object does not fit its version's schema.
    #[error("{object} at {version}: {path}: {message}; correct that field")]
    Invalid {
        /// `Kind namespace/name`.
        object: String,
        /// The apiVersion it was sent at.
        version: String,
        /// The field, as a JSON path (`spec.networkInterfaces[0].type`).
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// The converted object could not be serialized (a bug, never input).
    #[error("{object}: serializing the converted object: {message}")]
    Output {
        /// `Kind namespace/name`.
        object: String,
        /// What failed.
        message: String,
    },
    /// The fields one version cannot hold could not be written into their annotation.
    #[error("{object}: writing annotation {annotation}: {message}")]
    Annotation {
        /// `Kind namespace/name`.
        object: String,
        /// The annotation.
        annotation: &'static str,
        /// What failed.
        message: String,
    },
}

/// Converts one object (as JSON, the way a `ConversionReview` carries it) to `desired_api_version`.
///
/// Only `metadata.annotations` may change besides `apiVersion`, `spec` and `status`: the rest of the
/// metadata is returned as it came, as the API server requires.
pub fn convert_object(object: Value, desired_api_version: &str) -> Result<Value, ConversionError> {
    let api_version = object
        .get("apiVersion")
        .and_then(Value::as_str)
        .ok_or(ConversionError::MissingField("apiVersion"))?
        .to_string();
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .ok_or(ConversionError::MissingField("kind"))?
        .to_string();
    let from = version_of(&api_version)?;
    let to = version_of(desired_api_version)?;
    if !CONVERTIBLE_KINDS.contains(&kind.as_str()) {
        return Err(ConversionError::UnsupportedKind(kind));
    }
    if from == to {
        return Ok(object);
    }
    let name = describe(&object);
    let converted = match (kind.as_str(), to) {
        ("MicrovmCluster", Version::V1alpha2) => to_json(
            &cluster_to_v1alpha2(&parse::<v1alpha1::MicrovmCluster>(&object)?)?,
            &name,
        ),
        ("MicrovmCluster", Version::V1alpha1) => to_json(
            &cluster_to_v1alpha1(&parse::<crate::MicrovmCluster>(&object)?)?,
            &name,
        ),
        ("MicrovmMachine", Version::V1alpha2) => to_json(
            &machine_to_v1alpha2(&parse::<v1alpha1::MicrovmMachine>(&object)?)?,
            &name,
        ),
        ("MicrovmMachine", Version::V1alpha1) => to_json(
            &machine_to_v1alpha1(&parse::<crate::MicrovmMachine>(&object)?)?,
            &name,
        ),
        ("MicrovmMachineTemplate", Version::V1alpha2) => to_json(
            &template_to_v1alpha2(&parse::<v1alpha1::MicrovmMachineTemplate>(&object)?)?,
            &name,
        ),
        ("MicrovmMachineTemplate", Version::V1alpha1) => to_json(
            &template_to_v1alpha1(&parse::<crate::MicrovmMachineTemplate>(&object)?)?,
            &name,
        ),
        _ => return Err(ConversionError::UnsupportedKind(kind)),
    };
    Ok(with_original_metadata(&object, converted?))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Version {
    V1alpha1,
    V1alpha2,
}

fn version_of(api_version: &str) -> Result<Version, ConversionError> {
    match api_version.split_once('/') {
        Some((group, "v1alpha1")) if group == GROUP => Ok(Version::V1alpha1),
        Some((group, "v1alpha2")) if group == GROUP => Ok(Version::V1alpha2),
        _ => Err(ConversionError::UnsupportedVersion(api_version.to_string())),
    }
}

/// `Kind namespace/name` of a JSON object, for messages.
fn describe(object: &Value) -> String {
    let text = |path: &str| object.pointer(path).and_then(Value::as_str).unwrap_or("");
    let name = match text("/metadata/namespace") {
        "" => text("/metadata/name").to_string(),
        ns => format!("{ns}/{}", text("/metadata/name")),
    };
    format!("{} {name}", text("/kind"))
}

fn parse<T: DeserializeOwned>(object: &Value) -> Result<T, ConversionError> {
    serde_path_to_error::deserialize(object).map_err(|e| ConversionError::Invalid {
        object: describe(object),
        version: object
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        path: e.path().to_string(),
        message: e.into_inner().to_string(),
    })
}

fn to_json<T: Serialize>(object: &T, name: &str) -> Result<Value, ConversionError> {
    serde_json::to_value(object).map_err(|e| ConversionError::Output {
        object: name.to_string(),
        message: e.to_string(),
    })
}

/// The converted object with the original's metadata, but for the annotations the conversion set.
fn with_original_metadata(original: &Value, mut converted: Value) -> Value {
    let annotations = converted
        .pointer("/metadata/annotations")
        .cloned()
        .filter(|a| a.as_object().is_some_and(|m| !m.is_empty()));
    let mut metadata = original.get("metadata").cloned().unwrap_or(Value::Null);
    if let Some(meta) = metadata.as_object_mut() {
        match annotations {
            Some(a) => {
                meta.insert("annotations".to_string(), a);
            }
            None => {
                meta.remove("annotations");
            }
        }
    }
    if let Some(obj) = converted.as_object_mut() {
        obj.insert("metadata".to_string(), metadata);
    }
    converted
}

/// What one version held of an object that the other cannot: its spec and status as they were.
#[derive(Serialize, Deserialize)]
#[serde(bound(
    serialize = "Spec: Serialize, Status: Serialize",
    deserialize = "Spec: DeserializeOwned, Status: DeserializeOwned"
))]
struct Kept<Spec, Status> {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    spec: Option<Spec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    status: Option<Status>,
}

impl<Spec, Status> Default for Kept<Spec, Status> {
    fn default() -> Self {
        Self {
            spec: None,
            status: None,
        }
    }
}

/// Takes (removes) the kept fields in annotation `key`; an annotation that does not parse counts
/// as none.
fn take_kept<Spec: DeserializeOwned, Status: DeserializeOwned>(
    meta: &mut ObjectMeta,
    key: &str,
) -> Kept<Spec, Status> {
    let Some(annotations) = meta.annotations.as_mut() else {
        return Kept::default();
    };
    let Some(text) = annotations.remove(key) else {
        return Kept::default();
    };
    if annotations.is_empty() {
        meta.annotations = None;
    }
    serde_json::from_str(&text).unwrap_or_default()
}

/// Removes annotation `key`: an object never carries the fields of the version it is at.
fn remove_annotation(meta: &mut ObjectMeta, key: &str) {
    if let Some(annotations) = meta.annotations.as_mut()
        && annotations.remove(key).is_some()
        && annotations.is_empty()
    {
        meta.annotations = None;
    }
}

/// Writes the kept fields into annotation `key`, if there are any.
fn put_kept<Spec: Serialize, Status: Serialize>(
    meta: &mut ObjectMeta,
    key: &'static str,
    kept: &Kept<Spec, Status>,
) -> Result<(), ConversionError> {
    if kept.spec.is_none() && kept.status.is_none() {
        return Ok(());
    }
    let text = serde_json::to_string(kept).map_err(|e| ConversionError::Annotation {
        object: format!(
            "{}/{}",
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        ),
        annotation: key,
        message: e.to_string(),
    })?;
    meta.annotations
        .get_or_insert_default()
        .insert(key.to_string(), text);
    Ok(())
}

/// Converts one part of an object (spec or status) from `from` to the other version.
///
/// `kept` is that part as the other version last held it (from the annotation): if converting it
/// back still gives `from`, nothing changed since, and it is the answer. Otherwise `to` converts
/// `from`, with `kept` as a hint for what only the other version can say. Returns the converted part
/// and, when converting it back would not give `from`, `from` itself to keep.
fn convert_part<F, T>(
    from: &F,
    kept: Option<T>,
    to: impl Fn(&F, Option<&T>) -> T,
    back: impl Fn(&T) -> F,
) -> (T, Option<F>)
where
    F: Clone + PartialEq,
{
    let value = match kept {
        Some(k) if back(&k) == *from => k,
        k => to(from, k.as_ref()),
    };
    let lost = (back(&value) != *from).then(|| from.clone());
    (value, lost)
}

/// Which way a conversion goes, as the two annotations see it.
#[derive(Clone, Copy)]
struct Direction {
    /// Holds the fields only the source version has: stale on the source object (an object never
    /// carries the fields of the version it is at), written afresh with what the target loses.
    source_fields: &'static str,
    /// Holds the fields only the target version has: read as the hint for what it cannot say.
    target_fields: &'static str,
}

impl Direction {
    /// `v1alpha1` to `v1alpha2`.
    const UP: Self = Self {
        source_fields: V1ALPHA1_FIELDS_ANNOTATION,
        target_fields: V1ALPHA2_FIELDS_ANNOTATION,
    };
    /// `v1alpha2` to `v1alpha1`.
    const DOWN: Self = Self {
        source_fields: V1ALPHA2_FIELDS_ANNOTATION,
        target_fields: V1ALPHA1_FIELDS_ANNOTATION,
    };
}

/// Converts one object of any kind: its metadata (but for the annotations), its spec through
/// `spec_to` and `spec_back` (see [`convert_part`]), and its status through `status`, which gets the
/// status the target version last held and returns the converted status and what the target loses
/// of it. Every kind converts the same way; only how its spec and status map differs.
fn convert_parts<FromSpec, ToSpec, KeptStatus, Status, LostStatus>(
    metadata: &ObjectMeta,
    direction: Direction,
    spec: &FromSpec,
    spec_to: impl Fn(&FromSpec, Option<&ToSpec>) -> ToSpec,
    spec_back: impl Fn(&ToSpec) -> FromSpec,
    status: impl FnOnce(Option<KeptStatus>) -> (Status, Option<LostStatus>),
) -> Result<(ObjectMeta, ToSpec, Status), ConversionError>
where
    FromSpec: Clone + PartialEq + Serialize,
    ToSpec: DeserializeOwned,
    KeptStatus: DeserializeOwned,
    LostStatus: Serialize,
{
    let mut metadata = metadata.clone();
    remove_annotation(&mut metadata, direction.source_fields);
    let kept: Kept<ToSpec, KeptStatus> = take_kept(&mut metadata, direction.target_fields);
    let (spec, lost_spec) = convert_part(spec, kept.spec, spec_to, spec_back);
    let (status, lost_status) = status(kept.status);
    put_kept(
        &mut metadata,
        direction.source_fields,
        &Kept {
            spec: lost_spec,
            status: lost_status,
        },
    )?;
    Ok((metadata, spec, status))
}

/// A kind whose spec and status both versions hold (MicrovmCluster, MicrovmMachine), taken apart
/// and put together by [`convert_object_with_status`].
trait SpecAndStatus: Sized {
    type Spec;
    type Status;
    /// The annotation that holds what only this version can say.
    const FIELDS: &'static str;
    fn parts(&self) -> (&ObjectMeta, &Self::Spec, &Option<Self::Status>);
    fn from_parts(metadata: ObjectMeta, spec: Self::Spec, status: Option<Self::Status>) -> Self;
}

macro_rules! spec_and_status {
    ($($kind:ty => $spec:ty, $status:ty, $fields:expr;)*) => {$(
        impl SpecAndStatus for $kind {
            type Spec = $spec;
            type Status = $status;
            const FIELDS: &'static str = $fields;
            fn parts(&self) -> (&ObjectMeta, &$spec, &Option<$status>) {
                (&self.metadata, &self.spec, &self.status)
            }
            fn from_parts(metadata: ObjectMeta, spec: $spec, status: Option<$status>) -> Self {
                Self { metadata, spec, status }
            }
        }
    )*};
}

spec_and_status! {
    v1alpha1::MicrovmCluster =>
        v1alpha1::MicrovmClusterSpec, v1alpha1::MicrovmClusterStatus, V1ALPHA1_FIELDS_ANNOTATION;
    crate::MicrovmCluster =>
        crate::MicrovmClusterSpec, crate::MicrovmClusterStatus, V1ALPHA2_FIELDS_ANNOTATION;
    v1alpha1::MicrovmMachine =>
        v1alpha1::MicrovmMachineSpec, v1alpha1::MicrovmMachineStatus, V1ALPHA1_FIELDS_ANNOTATION;
    crate::MicrovmMachine =>
        crate::MicrovmMachineSpec, crate::MicrovmMachineStatus, V1ALPHA2_FIELDS_ANNOTATION;
}

/// [`convert_parts`] for a kind whose status both versions hold: the status converts through
/// `status_to` and `status_back` as the spec does (see [`convert_status`]).
fn convert_object_with_status<Source: SpecAndStatus, Target: SpecAndStatus>(
    from: &Source,
    spec_to: impl Fn(&Source::Spec, Option<&Target::Spec>) -> Target::Spec,
    spec_back: impl Fn(&Target::Spec) -> Source::Spec,
    status_to: impl Fn(&Source::Status) -> Target::Status,
    status_back: impl Fn(&Target::Status) -> Source::Status,
) -> Result<Target, ConversionError>
where
    Source::Spec: Clone + PartialEq + Serialize,
    Source::Status: Clone + PartialEq + Serialize,
    Target::Spec: DeserializeOwned,
    Target::Status: DeserializeOwned,
{
    let direction = Direction {
        source_fields: Source::FIELDS,
        target_fields: Target::FIELDS,
    };
    let (metadata, spec, status) = from.parts();
    let (metadata, spec, status) =
        convert_parts(metadata, direction, spec, spec_to, spec_back, |kept| {
            convert_status(status, kept, status_to, status_back)
        })?;
    Ok(Target::from_parts(metadata, spec, status))
}

/// [`convert_part`] for a status, which an object at either version may not have yet.
fn convert_status<F, T>(
    from: &Option<F>,
    kept: Option<T>,
    to: impl Fn(&F) -> T,
    back: impl Fn(&T) -> F,
) -> (Option<T>, Option<F>)
where
    F: Clone + PartialEq,
{
    let (status, lost) = convert_part(
        from,
        kept.map(Some),
        |s, _| s.as_ref().map(&to),
        |s| s.as_ref().map(&back),
    );
    (status, lost.flatten())
}

/// `v1alpha1`'s `status.ready` is `v1alpha2`'s `status.initialization.provisioned`.
fn initialization_up(ready: bool) -> Option<Initialization> {
    ready.then_some(Initialization {
        provisioned: Some(true),
    })
}

/// See [`initialization_up`]; unset is not ready.
fn ready_down(initialization: Option<&Initialization>) -> bool {
    initialization.and_then(|i| i.provisioned).unwrap_or(false)
}

/// `Some` for a non-empty string: `v1alpha1` writes an unset string as empty.
fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

mod conditions {
    //! CAPI v1beta1 conditions (`v1alpha1`) and metav1 conditions (`v1alpha2`): the same facts but
    //! the severity (v1beta1 only) and the observed generation (metav1 only).

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    use crate::v1alpha1;

    pub(super) fn up(old: &[v1alpha1::Condition]) -> Vec<Condition> {
        old.iter()
            .map(|c| Condition {
                type_: c.type_.clone(),
                status: c.status.clone(),
                last_transition_time: c.last_transition_time.clone(),
                reason: c.reason.clone(),
                message: c.message.clone(),
                observed_generation: None,
            })
            .collect()
    }

    pub(super) fn down(new: &[Condition]) -> Vec<v1alpha1::Condition> {
        new.iter()
            .map(|c| v1alpha1::Condition {
                type_: c.type_.clone(),
                status: c.status.clone(),
                severity: String::new(),
                last_transition_time: c.last_transition_time.clone(),
                reason: c.reason.clone(),
                message: c.message.clone(),
            })
            .collect()
    }
}
