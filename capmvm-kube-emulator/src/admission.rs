//! In-process admission: defaulting and validation that an embedding component (a stand-in for a
//! controller manager) registers per kind, as a real cluster's mutating and validating webhooks do.
//! Never a network call. Hooks run on create and update of the main resource (not `/status`, as
//! webhooks registered for a resource without its subresources), after the request is decoded and
//! before schema defaulting, pruning and validation: what a hook adds that the schema does not know is
//! pruned, and what it leaves invalid is refused by the schema, as on a real server.

use std::sync::{Arc, RwLock};

use serde_json::Value;

use super::error::ApiError;
use super::registry::ResourceDef;

/// The operation a hook admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// POST (and a PUT that creates).
    Create,
    /// PUT or PATCH of the main resource.
    Update,
}

/// A hook: mutates the object in place (defaulting) and/or refuses it with a message (validation).
pub type AdmissionHook = dyn Fn(&mut Value, Operation) -> Result<(), String> + Send + Sync;

struct Registered {
    group: String,
    kind: String,
    name: String,
    hook: Arc<AdmissionHook>,
}

/// The hooks of one emulator; a cheap handle (clone it, register at any time).
#[derive(Clone, Default)]
pub struct Admission {
    hooks: Arc<RwLock<Vec<Registered>>>,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self
            .read()
            .iter()
            .map(|r| format!("{}.{}: {}", r.kind, r.group, r.name))
            .collect();
        f.debug_struct("Admission").field("hooks", &names).finish()
    }
}

impl Admission {
    /// Registers `hook` under `name` (a webhook's name, e.g. `default.machinedeployment.cluster.x-k8s.io`)
    /// for objects of `kind` in API group `group` (`""` for the core group), every version. Hooks of a
    /// kind run in registration order; a refusal stops the write with 422 Invalid and the message
    /// `admission webhook "<name>" denied the request: <message>`.
    pub fn register(
        &self,
        group: &str,
        kind: &str,
        name: &str,
        hook: impl Fn(&mut Value, Operation) -> Result<(), String> + Send + Sync + 'static,
    ) {
        let mut hooks = self
            .hooks
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        hooks.push(Registered {
            group: group.to_string(),
            kind: kind.to_string(),
            name: name.to_string(),
            hook: Arc::new(hook),
        });
    }

    /// Names of the hooks registered for `group`/`kind`, in the order they run.
    pub fn hooks_for(&self, group: &str, kind: &str) -> Vec<String> {
        self.read()
            .iter()
            .filter(|r| r.group == group && r.kind == kind)
            .map(|r| r.name.clone())
            .collect()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<Registered>> {
        self.hooks
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs the hooks of `def`'s kind on `obj`.
    pub(crate) fn admit(
        &self,
        def: &ResourceDef,
        obj: &mut Value,
        operation: Operation,
    ) -> Result<(), ApiError> {
        // Cloned out so a hook may register others without deadlocking.
        let hooks: Vec<(String, Arc<AdmissionHook>)> = self
            .read()
            .iter()
            .filter(|r| r.group == def.group && r.kind == def.kind)
            .map(|r| (r.name.clone(), r.hook.clone()))
            .collect();
        for (name, hook) in hooks {
            hook(obj, operation).map_err(|message| {
                ApiError::new(
                    422,
                    "Invalid",
                    format!("admission webhook {name:?} denied the request: {message}"),
                )
            })?;
        }
        Ok(())
    }
}
