//! What matters about a watched object: a fingerprint of the metadata and parts whose change wakes
//! a controller, remembered per object, so status-only updates wake nobody.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

use kube::Resource;

use crate::memory::id_key;

/// Fingerprints of what matters about each object, to skip changes that do not.
///
/// Keyed by [`id_key`] of the object's uid (its name without one), not the uid itself: one entry
/// per watched object, and the uid's own allocation was most of each (about 2 MiB per kind at
/// 30 000 machines).
#[derive(Default)]
pub(super) struct Fingerprints(Mutex<HashMap<u128, u64>>);

impl Fingerprints {
    /// Whether `fingerprint` differs from the one last seen for `obj` (and remembers it).
    pub(super) fn changed<K: Resource>(&self, obj: &K, fingerprint: u64) -> bool {
        let meta = obj.meta();
        let key = id_key(
            meta.uid
                .as_deref()
                .or(meta.name.as_deref())
                .unwrap_or_default(),
        );
        let Ok(mut seen) = self.0.lock() else {
            return true;
        };
        if meta.deletion_timestamp.is_some() && meta.finalizers.as_ref().is_none_or(Vec::is_empty) {
            // Gone (or about to be): forget it.
            seen.remove(&key);
            return true;
        }
        seen.insert(key, fingerprint) != Some(fingerprint)
    }
}

/// A hash of the object's metadata that matters (labels, annotations, finalizers, owners, deletion;
/// not resourceVersion, generation or managedFields) and of `parts` (the fields a change of which
/// matters: its spec, say).
pub(super) fn fingerprint<K: Resource, P: serde::Serialize + ?Sized>(obj: &K, parts: &P) -> u64 {
    // No generation: the parts (the spec) say what changed, and generation would also move on
    // writes we make ourselves (providerID).
    let meta = obj.meta();
    let mut h = DefaultHasher::new();
    meta.deletion_timestamp
        .as_ref()
        .map(|t| t.0.as_second())
        .hash(&mut h);
    (&meta.labels, &meta.annotations, &meta.finalizers).hash(&mut h);
    for o in meta.owner_references.iter().flatten() {
        (&o.kind, &o.name, &o.uid).hash(&mut h);
    }
    // Serialised straight into the hasher: a JSON value of the whole object per watch event was
    // 5 % of the operator's CPU at 10 000 machines.
    let _ = serde_json::to_writer(HashWriter(&mut h), parts);
    h.finish()
}

/// Feeds written bytes to a hasher.
struct HashWriter<'a>(&'a mut DefaultHasher);

impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub(super) fn hash_of<T: Hash>(value: &T) -> u64 {
    let mut h = DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;

    use super::super::tests::config_map;
    use super::*;

    /// What wakes a controller: a change of the parts named or of the metadata that matters; not a
    /// new resourceVersion or anything outside the parts.
    #[test]
    fn a_fingerprint_moves_with_the_parts_named_and_the_metadata_that_matters() {
        let base = config_map("a");
        let of = |cm: &ConfigMap| fingerprint(cm, &cm.data);
        let mut bumped = base.clone();
        bumped.metadata.resource_version = Some("99".into());
        bumped.binary_data = Some(Default::default());
        assert_eq!(of(&base), of(&bumped), "resourceVersion and other fields");
        let mut data = base.clone();
        data.data = Some([("k".to_string(), "v".to_string())].into());
        assert_ne!(of(&base), of(&data), "the part named");
        let mut labelled = base.clone();
        labelled.metadata.labels = Some([("l".to_string(), "1".to_string())].into());
        assert_ne!(of(&base), of(&labelled), "labels");
        let mut finalized = base.clone();
        finalized.metadata.finalizers = Some(vec!["f".into()]);
        assert_ne!(of(&base), of(&finalized), "finalizers");
    }
}
