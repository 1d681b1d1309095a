//! Watched objects decoded without `metadata.managedFields`.
//!
//! Every real API server sends each object's field-ownership entries with every list and watch
//! event: one entry per writer, each a tree of every field it set (a CAPI Machine's status entry
//! names each condition's fields). The operator reads none of it, yet decoding it into
//! `ObjectMeta` builds a JSON value of hundreds of nodes per event, only for the cache to drop it.
//! [`Lean`] decodes an object as its own type would, with that one key skipped in the parser
//! (serde's `IgnoredAny`: scanned, nothing allocated).

use std::borrow::Cow;
use std::fmt;

use kube::Resource;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};

/// The keys leading to what is skipped: `metadata.managedFields`.
const SKIPPED: &[&str] = &["metadata", "managedFields"];

/// A `K` decoded without `metadata.managedFields` (left `None`).
#[derive(Clone, Debug)]
pub(super) struct Lean<K>(pub K);

impl<'de, K: de::Deserialize<'de>> de::Deserialize<'de> for Lean<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        K::deserialize(Skipping {
            inner: deserializer,
            path: SKIPPED,
        })
        .map(Lean)
    }
}

impl<K: Resource> Resource for Lean<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }

    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }

    /// `K`'s: a lean `PartialObjectMeta` (the Secrets' watch) is still asked of the server as
    /// metadata only. Without it, every Secret in scope came whole, data included.
    fn metadata_api() -> bool {
        K::metadata_api()
    }

    fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        self.0.meta()
    }

    fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        self.0.meta_mut()
    }
}

/// A deserializer that passes everything through to `inner` but, in a map, skips the value under
/// `path[0]` (when it is the last key of the path) or goes on down it.
struct Skipping<'p, D> {
    inner: D,
    path: &'p [&'p str],
}

/// The same, as a seed for a map's value.
struct SkippingSeed<'p, S> {
    seed: S,
    path: &'p [&'p str],
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for SkippingSeed<'_, S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Value, D::Error> {
        self.seed.deserialize(Skipping {
            inner: deserializer,
            path: self.path,
        })
    }
}

/// Wraps the visitor of a map so that its entries are filtered.
struct SkippingVisitor<'p, V> {
    visitor: V,
    path: &'p [&'p str],
}

impl<'de, V: Visitor<'de>> Visitor<'de> for SkippingVisitor<'_, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.visitor.expecting(f)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_map(SkippingMap {
            map,
            path: self.path,
            down: false,
        })
    }

    // Anything but a map is not filtered (a `null` metadata, a struct sent as an array).
    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_seq(seq)
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.visitor.visit_unit()
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.visitor.visit_none()
    }
}

/// A map's entries with the skipped key left out.
struct SkippingMap<'p, A> {
    map: A,
    path: &'p [&'p str],
    /// The key just read is `path[0]` and the path goes on below it.
    down: bool,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for SkippingMap<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        loop {
            let Some(key) = self.map.next_key::<Key<'de>>()? else {
                return Ok(None);
            };
            let name: &str = match &key {
                Key::Borrowed(s) => s,
                Key::Owned(s) => s,
            };
            if name == self.path[0] {
                if self.path.len() == 1 {
                    self.map.next_value::<IgnoredAny>()?;
                    continue;
                }
                self.down = true;
            }
            return match key {
                Key::Borrowed(s) => seed
                    .deserialize(de::value::BorrowedStrDeserializer::new(s))
                    .map(Some),
                Key::Owned(s) => seed
                    .deserialize(de::value::StringDeserializer::new(s))
                    .map(Some),
            };
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        if std::mem::take(&mut self.down) {
            self.map.next_value_seed(SkippingSeed {
                seed,
                path: &self.path[1..],
            })
        } else {
            self.map.next_value_seed(seed)
        }
    }
}

/// A map key as the parser has it: borrowed from the input when it can be.
enum Key<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl<'de> de::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string key")
            }

            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key::Borrowed(s))
            }

            fn visit_str<E: de::Error>(self, s: &str) -> Result<Key<'de>, E> {
                Ok(Key::Owned(s.to_string()))
            }

            fn visit_string<E: de::Error>(self, s: String) -> Result<Key<'de>, E> {
                Ok(Key::Owned(s))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// Passes a `deserialize_*` call through to the inner deserializer unchanged.
macro_rules! pass_through {
    ($($method:ident)*) => {
        $(
            fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
                self.inner.$method(visitor)
            }
        )*
    };
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Skipping<'_, D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.inner.deserialize_any(SkippingVisitor {
            visitor,
            path: self.path,
        })
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.inner.deserialize_map(SkippingVisitor {
            visitor,
            path: self.path,
        })
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner.deserialize_struct(
            name,
            fields,
            SkippingVisitor {
                visitor,
                path: self.path,
            },
        )
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner.deserialize_newtype_struct(name, visitor)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner.deserialize_unit_struct(name, visitor)
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner.deserialize_tuple(len, visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner.deserialize_tuple_struct(name, len, visitor)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner.deserialize_enum(name, variants, visitor)
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }

    pass_through! {
        deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_i128 deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64
        deserialize_u128 deserialize_f32 deserialize_f64 deserialize_char deserialize_str
        deserialize_string deserialize_bytes deserialize_byte_buf deserialize_option
        deserialize_unit deserialize_seq deserialize_identifier deserialize_ignored_any
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use capmvm_api::capi::Machine;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::WatchEvent;

    use super::*;

    /// A lean kind asks the server for what its kind asks: metadata only for `PartialObjectMeta`
    /// (the Secrets' watch: no Secret's data comes through it), whole objects otherwise.
    #[tokio::test]
    async fn a_lean_partial_object_is_asked_for_as_metadata_only() {
        use k8s_openapi::api::core::v1::Secret;
        use kube::core::PartialObjectMeta;
        use std::sync::{Arc, Mutex};

        /// The Accept header of the one list `Api<K>` sends.
        async fn accept_of<K>() -> String
        where
            K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
        {
            let seen = Arc::new(Mutex::new(String::new()));
            let record = seen.clone();
            let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
                let accept = request
                    .headers()
                    .get(http::header::ACCEPT)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                *record.lock().unwrap() = accept;
                async {
                    http::Response::builder()
                        .status(500)
                        .body(kube::client::Body::empty())
                }
            });
            let api: kube::Api<K> = kube::Api::all(kube::Client::new(service, "default"));
            let _ = api.list(&kube::api::ListParams::default()).await;
            seen.lock().unwrap().clone()
        }
        assert!(
            accept_of::<Lean<PartialObjectMeta<Secret>>>()
                .await
                .contains("as=PartialObjectMetadataList"),
        );
        assert!(
            !accept_of::<Lean<ConfigMap>>()
                .await
                .contains("PartialObject")
        );
    }

    /// A watch event as a real server sends it: the object whole, managedFields included.
    fn event() -> serde_json::Value {
        serde_json::json!({
            "type": "MODIFIED",
            "object": {
                "apiVersion": "cluster.x-k8s.io/v1beta2",
                "kind": "Machine",
                "metadata": {
                    "name": "m", "namespace": "ns", "resourceVersion": "7",
                    "labels": {"cluster.x-k8s.io/control-plane": ""},
                    "managedFields": [{
                        "manager": "manager", "operation": "Update", "apiVersion": "cluster.x-k8s.io/v1beta2",
                        "fieldsType": "FieldsV1",
                        "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:x": {}}}},
                        "subresource": "status"
                    }],
                    "finalizers": ["machine.cluster.x-k8s.io"]
                },
                "spec": {"clusterName": "demo", "bootstrap": {"dataSecretName": "s"},
                         "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "MicrovmMachine", "name": "m"}},
                "status": {"phase": "Provisioning"}
            }
        })
    }

    /// Decoded lean, an object is what its own type decodes, less its managedFields; the event
    /// around it and every other field are untouched.
    #[test]
    fn a_lean_object_is_the_object_without_its_managed_fields() {
        let bytes = serde_json::to_vec(&event()).unwrap();
        let whole: WatchEvent<Machine> = serde_json::from_slice(&bytes).unwrap();
        let lean: WatchEvent<Lean<Machine>> = serde_json::from_slice(&bytes).unwrap();
        let (WatchEvent::Modified(mut whole), WatchEvent::Modified(Lean(lean))) = (whole, lean)
        else {
            panic!("not MODIFIED events");
        };
        assert_eq!(
            whole.metadata.managed_fields.as_ref().map(Vec::len),
            Some(1)
        );
        assert_eq!(lean.metadata.managed_fields, None);
        whole.metadata.managed_fields = None;
        assert_eq!(lean, whole);
    }

    /// Keys elsewhere named like the skipped one are kept: only `metadata.managedFields` goes,
    /// and escaped keys (which the parser cannot lend) are read as well.
    #[test]
    fn only_metadata_managed_fields_is_skipped() {
        let json = r#"{"apiVersion":"cluster.x-k8s.io/v1beta2","kind":"Machine",
            "metadata":{"name":"m","managedFields":[{"manager":"x"}],"labels":{"managedFields":"kept","a\u0062":"escaped"}},
            "spec":{"clusterName":"demo","infrastructureRef":{"apiGroup":"g","kind":"K","name":"n"}}}"#;
        let Lean(m): Lean<Machine> = serde_json::from_str(json).unwrap();
        assert_eq!(m.metadata.managed_fields, None);
        let labels = m.metadata.labels.unwrap();
        assert_eq!(labels["managedFields"], "kept");
        assert_eq!(labels["ab"], "escaped");
        assert_eq!(m.spec.cluster_name, "demo");
    }

    /// What is malformed stays an error, named as the object's own type names it.
    #[test]
    fn a_malformed_object_is_still_an_error() {
        let err = serde_json::from_str::<Lean<ConfigMap>>(r#"{"metadata":{"name":5}}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("invalid type: integer `5`"), "{err}");
    }
}
