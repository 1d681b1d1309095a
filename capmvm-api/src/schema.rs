//! Small helpers for serde defaults and skips that also shape the generated schema.

/// Serde default for fields that default to `true` (the schema gets `default: true`).
pub(crate) fn default_true() -> bool {
    true
}

/// Skip serializing `false` booleans, so objects stay as short as users wrote them.
#[allow(clippy::trivially_copy_pass_by_ref)] // serde passes a reference
pub(crate) fn is_false(b: &bool) -> bool {
    !*b
}
