//! Reading CAPI's objects leniently, straight from the parser.
//!
//! A modelled field whose value has another shape than its type's reads as absent (the module above
//! says why). The first version read each field into a `serde_json::Value` and converted that: a
//! tree built and dropped for every field of every watch event, a Machine's ten conditions with
//! their messages included. On the real stack that was 3.6 % of the operator's CPU at 1 000
//! machines. Here each type says which JSON shapes it accepts ([`Shape`]); any other value is
//! consumed whole (serde's `IgnoredAny`: scanned, nothing built) and reads as `None`.

use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, de};

/// A field type of the views: read from a value of any shape, and left out of what a view
/// serializes while it is absent (an empty `Option` or list; a name or a nested view is always
/// written).
pub(super) trait Lenient: Default + Sized {
    /// Reads one value whole, whatever its shape: `None` when the shape is not this type's.
    fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Self>, D::Error>;

    /// Whether the value is absent.
    fn absent(&self) -> bool {
        false
    }
}

/// Reads a field leniently: a value of another shape reads as `T::default()`.
pub(super) fn lenient<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Lenient,
{
    Ok(T::read(deserializer)?.unwrap_or_default())
}

/// Which JSON shapes a type is read from; every other shape reads as `None`.
pub(super) trait Shape: Sized {
    /// A string.
    fn from_str(_: &str) -> Option<Self> {
        None
    }

    /// `true` or `false`.
    fn from_bool(_: bool) -> Option<Self> {
        None
    }

    /// An integer that fits an `i64`.
    fn from_i64(_: i64) -> Option<Self> {
        None
    }

    /// An object.
    fn from_map<'de, A: MapAccess<'de>>(map: A) -> Result<Option<Self>, A::Error> {
        skip_map(map).map(|()| None)
    }

    /// A list.
    fn from_seq<'de, A: SeqAccess<'de>>(seq: A) -> Result<Option<Self>, A::Error> {
        skip_seq(seq).map(|()| None)
    }
}

/// Reads a [`Shape`] type: the body of its [`Lenient::read`].
pub(super) fn read_shape<'de, D: Deserializer<'de>, T: Shape>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    deserializer.deserialize_any(ShapeVisitor(PhantomData))
}

/// A view (a struct whose every field is lenient) read from an object. Its fields cannot fail on a
/// shape, so an error here is the parser's own (malformed JSON).
pub(super) fn view_from_map<'de, A, T>(map: A) -> Result<Option<T>, A::Error>
where
    A: MapAccess<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(MapAccessDeserializer::new(map)).map(Some)
}

fn skip_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

fn skip_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

struct ShapeVisitor<T>(PhantomData<T>);

impl<'de, T: Shape> Visitor<'de> for ShapeVisitor<T> {
    type Value = Option<T>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Option<T>, E> {
        Ok(T::from_bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Option<T>, E> {
        Ok(T::from_i64(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Option<T>, E> {
        Ok(i64::try_from(v).ok().and_then(T::from_i64))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Option<T>, E> {
        Ok(None)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Option<T>, E> {
        Ok(T::from_str(v))
    }

    fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<Option<T>, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Option<T>, E> {
        Ok(None)
    }

    fn visit_none<E: de::Error>(self) -> Result<Option<T>, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Option<T>, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Option<T>, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Option<T>, A::Error> {
        T::from_map(map)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Option<T>, A::Error> {
        T::from_seq(seq)
    }
}

impl Shape for String {
    fn from_str(v: &str) -> Option<Self> {
        Some(v.to_string())
    }
}

impl Shape for bool {
    fn from_bool(v: bool) -> Option<Self> {
        Some(v)
    }
}

impl Shape for i32 {
    fn from_i64(v: i64) -> Option<Self> {
        i32::try_from(v).ok()
    }
}

impl Shape for crate::cluster::ApiEndpoint {
    // Not a view (its fields are strict, as the MicrovmCluster's own): read through a JSON value,
    // as every field was before; it is on Clusters only, which change rarely.
    fn from_map<'de, A: MapAccess<'de>>(map: A) -> Result<Option<Self>, A::Error> {
        let value = serde_json::Value::deserialize(MapAccessDeserializer::new(map))?;
        Ok(serde_json::from_value(value).ok())
    }
}

/// [`Lenient`] for [`Shape`] types.
macro_rules! lenient_shapes {
    ($($ty:ty),* $(,)?) => {
        $(
            impl Lenient for $ty {
                fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Self>, D::Error> {
                    read_shape(deserializer)
                }
            }
        )*
    };
}

lenient_shapes!(String, bool, i32, crate::cluster::ApiEndpoint);

impl<T: Lenient> Lenient for Option<T> {
    fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Self>, D::Error> {
        // Absent, null or of another shape: `None`.
        T::read(deserializer).map(Some)
    }

    fn absent(&self) -> bool {
        self.is_none()
    }
}

impl<T: Lenient> Lenient for Vec<T> {
    fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Self>, D::Error> {
        read_shape(deserializer)
    }

    fn absent(&self) -> bool {
        self.is_empty()
    }
}

impl<T: Lenient> Shape for Vec<T> {
    /// Read whole only when every item has its type's shape (else `None`, the items consumed all
    /// the same).
    fn from_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<Option<Self>, A::Error> {
        let mut items = Vec::new();
        let mut whole = true;
        while let Some(item) = seq.next_element_seed(Item::<T>(PhantomData))? {
            match item {
                Some(item) if whole => items.push(item),
                _ => whole = false,
            }
        }
        Ok(whole.then_some(items))
    }
}

/// One item of a list, read leniently.
struct Item<T>(PhantomData<T>);

impl<'de, T: Lenient> DeserializeSeed<'de> for Item<T> {
    type Value = Option<T>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Option<T>, D::Error> {
        T::read(deserializer)
    }
}
