//! Names and hashes: the template hash that tells outdated instances, and unique instance names.

use std::collections::BTreeSet;

use capmvm_api::MicrovmMachineSpec;

use crate::microvm::{FNV1A64_OFFSET, fnv1a64_extend};

/// FNV-1a, 64 bit ([`crate::microvm::fnv1a64_extend`]) over `parts`, each followed by a 0xff
/// byte, so ("ab", "c") and ("a", "bc") differ.
pub(crate) fn fnv1a64(parts: &[&[u8]]) -> u64 {
    parts.iter().fold(FNV1A64_OFFSET, |hash, part| {
        fnv1a64_extend(fnv1a64_extend(hash, part), &[0xff])
    })
}

/// The hash of a pool template: the whole spec (not only the image), without providerID. Bootstrap
/// data is not part of it, so a rotated join token rolls nothing.
pub fn template_hash(spec: &MicrovmMachineSpec) -> String {
    let mut spec = spec.clone();
    spec.provider_id = None;
    // Serializing a struct of plain fields and BTreeMaps cannot fail, and its bytes are stable.
    let bytes = serde_json::to_vec(&spec).unwrap_or_default();
    format!("{:016x}", fnv1a64(&[&bytes]))
}

/// Longest pool-name prefix kept in an instance name: the name becomes the guest's hostname, a DNS
/// label of at most 63 characters, with `-` and a 5-character suffix.
const MAX_PREFIX: usize = 57;

/// `count` new instance names `<pool>-<suffix>`, none in `taken`.
///
/// The suffixes derive from the pool's uid and resourceVersion, the template hash and a slot number,
/// so a decision made again from the same observation (a stale cache after a crash) asks for the
/// same names, and the API server's AlreadyExists stops a second instance instead of the pool
/// growing twice; once the pool's status records what exists, new names are fresh ones, and the
/// name of a gone instance (perhaps still a Node's) is not given again.
pub fn new_instance_names(
    pool_name: &str,
    pool_uid: &str,
    pool_version: &str,
    template_hash: &str,
    taken: &BTreeSet<String>,
    count: usize,
) -> Vec<String> {
    let prefix: String = pool_name.chars().take(MAX_PREFIX).collect();
    let prefix = prefix.trim_end_matches(['-', '.']);
    let mut names = Vec::with_capacity(count);
    let mut slot: u64 = 0;
    while names.len() < count {
        let hash = fnv1a64(&[
            pool_uid.as_bytes(),
            pool_version.as_bytes(),
            template_hash.as_bytes(),
            &slot.to_be_bytes(),
        ]);
        let name = format!("{prefix}-{}", base36_suffix(hash));
        if !taken.contains(&name) && !names.contains(&name) {
            names.push(name);
        }
        slot += 1;
    }
    names
}

/// Five characters of `[a-z0-9]`, as Kubernetes' generated names (about 60 million values).
fn base36_suffix(mut hash: u64) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = String::with_capacity(5);
    for _ in 0..5 {
        out.push(char::from(DIGITS[(hash % 36) as usize]));
        hash /= 36;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable_unique_and_avoid_taken_ones() {
        let taken = BTreeSet::new();
        let first = new_instance_names("workers", "uid-1", "7", "h1", &taken, 3);
        assert_eq!(
            first,
            new_instance_names("workers", "uid-1", "7", "h1", &taken, 3)
        );
        assert!(
            first
                .iter()
                .all(|n| n.starts_with("workers-") && n.len() == 13)
        );
        let taken: BTreeSet<String> = first[..1].iter().cloned().collect();
        let next = new_instance_names("workers", "uid-1", "7", "h1", &taken, 2);
        assert_eq!(next, first[1..3]);
        let long = new_instance_names(&"p".repeat(80), "u", "7", "h", &BTreeSet::new(), 1);
        assert_eq!(long[0].len(), 63);
    }
}
