//! Writes: merge patches computed from the difference (nothing sent when nothing changed), carrying the
//! resourceVersion the decision was based on; finalizers by JSON patch with `test` ops.

use std::fmt::Debug;

use json_patch::{AddOperation, PatchOperation, RemoveOperation, TestOperation};
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

/// Field manager of every write (shows in managedFields).
pub const FIELD_MANAGER: &str = "capmvm-operator";

/// Whether a write failed because the object changed since it was read: a 409 Conflict (a merge
/// patch carrying a stale resourceVersion), or a 422 from a JSON patch whose `test` of the
/// resourceVersion failed. The API server answers the latter with its generic "rejected our
/// request" message and the patch library's "testing value ... failed: test failed" as the cause.
/// Expected with other writers (CAPI adopting an object, another replica): decide again from the
/// fresh object.
pub fn is_conflict(e: &kube::Error) -> bool {
    let kube::Error::Api(s) = e else {
        return false;
    };
    let test_failed = |text: &str| text.contains("test failed");
    s.code == 409
        || (s.code == 422
            && (test_failed(&s.message)
                || s.details
                    .iter()
                    .flat_map(|d| &d.causes)
                    .any(|c| test_failed(&c.message))))
}

/// The RFC 7386 merge patch that turns `old` into `new`, or `None` if they are equal. Objects are
/// diffed key by key; anything else (arrays included) is replaced whole.
pub fn merge_diff(old: &Value, new: &Value) -> Option<Value> {
    if old == new {
        return None;
    }
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut patch = Map::new();
            for (k, nv) in n {
                match o.get(k) {
                    Some(ov) => {
                        if let Some(p) = merge_diff(ov, nv) {
                            patch.insert(k.clone(), p);
                        }
                    }
                    None => {
                        patch.insert(k.clone(), nv.clone());
                    }
                }
            }
            for k in o.keys() {
                if !n.contains_key(k) {
                    patch.insert(k.clone(), Value::Null);
                }
            }
            Some(Value::Object(patch))
        }
        _ => Some(new.clone()),
    }
}

/// Writes `desired` as the object's status if it differs, conditional on `obj`'s resourceVersion.
/// Returns the updated object, or `None` if nothing needed writing.
pub async fn status<K, S>(
    api: &Api<K>,
    obj: &K,
    current: Option<&S>,
    desired: &S,
) -> Result<Option<K>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    S: Serialize,
{
    let old = current
        .map(serde_json::to_value)
        .transpose()
        .map_err(kube::Error::SerdeError)?;
    let new = serde_json::to_value(desired).map_err(kube::Error::SerdeError)?;
    let Some(diff) = merge_diff(old.as_ref().unwrap_or(&Value::Null), &new) else {
        return Ok(None);
    };
    let body = json!({
        "metadata": {"resourceVersion": obj.resource_version()},
        "status": diff,
    });
    api.patch_status(&obj.name_any(), &params(), &Patch::Merge(&body))
        .await
        .map(Some)
}

/// Sets `spec.providerID`, conditional on `obj`'s resourceVersion.
pub async fn provider_id<K>(api: &Api<K>, obj: &K, provider_id: &str) -> Result<K, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let body = json!({
        "metadata": {"resourceVersion": obj.resource_version()},
        "spec": {"providerID": provider_id},
    });
    api.patch(&obj.name_any(), &params(), &Patch::Merge(&body))
        .await
}

/// Adds `finalizer` and/or the `annotations` in one JSON patch that fails (422) unless the
/// object is still at the resourceVersion `obj` was read at: a decision made from a stale read never
/// takes effect.
pub async fn add_metadata<K>(
    api: &Api<K>,
    obj: &K,
    finalizer: Option<&str>,
    annotations: &[(&str, &str)],
) -> Result<K, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let mut ops = vec![PatchOperation::Test(TestOperation {
        path: jsonptr("/metadata/resourceVersion"),
        value: json!(obj.resource_version()),
    })];
    if let Some(finalizer) = finalizer {
        ops.push(if obj.finalizers().is_empty() {
            PatchOperation::Add(AddOperation {
                path: jsonptr("/metadata/finalizers"),
                value: json!([finalizer]),
            })
        } else {
            PatchOperation::Add(AddOperation {
                path: jsonptr("/metadata/finalizers/-"),
                value: json!(finalizer),
            })
        });
    }
    if !annotations.is_empty() {
        if obj.meta().annotations.is_none() {
            let all: serde_json::Map<String, serde_json::Value> = annotations
                .iter()
                .map(|(k, v)| ((*k).to_string(), json!(v)))
                .collect();
            ops.push(PatchOperation::Add(AddOperation {
                path: jsonptr("/metadata/annotations"),
                value: serde_json::Value::Object(all),
            }));
        } else {
            for (key, value) in annotations {
                // JSON pointer escaping: `~` is `~0`, `/` is `~1`.
                let escaped = key.replace('~', "~0").replace('/', "~1");
                ops.push(PatchOperation::Add(AddOperation {
                    path: jsonptr(&format!("/metadata/annotations/{escaped}")),
                    value: json!(value),
                }));
            }
        }
    }
    api.patch(
        &obj.name_any(),
        &params(),
        &Patch::<()>::Json(json_patch::Patch(ops)),
    )
    .await
}

/// Removes `finalizer`, failing if it moved since `obj` was read. `None` if it was not there.
pub async fn remove_finalizer<K>(
    api: &Api<K>,
    obj: &K,
    finalizer: &str,
) -> Result<Option<K>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let Some(index) = obj.finalizers().iter().position(|f| f == finalizer) else {
        return Ok(None);
    };
    let path = format!("/metadata/finalizers/{index}");
    let ops = vec![
        PatchOperation::Test(TestOperation {
            path: jsonptr(&path),
            value: json!(finalizer),
        }),
        PatchOperation::Remove(RemoveOperation {
            path: jsonptr(&path),
        }),
    ];
    api.patch(
        &obj.name_any(),
        &params(),
        &Patch::<()>::Json(json_patch::Patch(ops)),
    )
    .await
    .map(Some)
}

/// Adds (`add`) or removes `finalizer` on the object whose metadata is `meta`, by a metadata-only JSON
/// patch conditional on its resourceVersion (used for Secrets: their content is never fetched for
/// this). Nothing is sent when there is nothing to change.
pub async fn metadata_finalizer<K>(
    api: &Api<K>,
    meta: &kube::core::PartialObjectMeta<K>,
    finalizer: &str,
    add: bool,
) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let present = meta.finalizers().iter().position(|f| f == finalizer);
    let mut ops = vec![PatchOperation::Test(TestOperation {
        path: jsonptr("/metadata/resourceVersion"),
        value: json!(meta.resource_version()),
    })];
    match (add, present) {
        (true, None) if meta.finalizers().is_empty() => {
            ops.push(PatchOperation::Add(AddOperation {
                path: jsonptr("/metadata/finalizers"),
                value: json!([finalizer]),
            }))
        }
        (true, None) => ops.push(PatchOperation::Add(AddOperation {
            path: jsonptr("/metadata/finalizers/-"),
            value: json!(finalizer),
        })),
        (false, Some(index)) => ops.push(PatchOperation::Remove(RemoveOperation {
            path: jsonptr(&format!("/metadata/finalizers/{index}")),
        })),
        _ => return Ok(()),
    }
    api.patch_metadata(
        &meta.name_any(),
        &params(),
        &Patch::<()>::Json(json_patch::Patch(ops)),
    )
    .await
    .map(|_| ())
}

/// Plain (not server-side apply) patch parameters that still name the field manager.
fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    }
}

fn jsonptr(path: &str) -> json_patch::jsonptr::PointerBuf {
    // The paths above are constant and well formed.
    json_patch::jsonptr::PointerBuf::parse(path).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure(message, "")
                .with_code(code)
                .boxed(),
        )
    }

    /// The 422 the API server gives a JSON patch whose `test` failed: a generic message, the patch
    /// library's words as the cause (as kube-apiserver's `NewGenericServerResponse` builds it).
    fn failed_test() -> kube::Error {
        let status: kube::core::Status = serde_json::from_value(json!({
            "status": "Failure",
            "code": 422,
            "reason": "Invalid",
            "message": "the server rejected our request due to an error in our request",
            "details": {"causes": [{
                "reason": "UnexpectedServerResponse",
                "message": "testing value /metadata/resourceVersion failed: test failed",
            }]},
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        kube::Error::Api(status.boxed())
    }

    /// A write that lost to another writer is told from one that is wrong: only the former is
    /// retried at once from the fresh object, without a warning.
    #[test]
    fn a_lost_compare_and_swap_is_a_conflict_a_refused_write_is_not() {
        assert!(is_conflict(&api_error(409, "the object has been modified")));
        assert!(is_conflict(&failed_test()));
        assert!(!is_conflict(&api_error(
            422,
            "MicrovmMachine.infrastructure.cluster.x-k8s.io \"m\" is invalid: spec.vcpu: Invalid value"
        )));
        assert!(!is_conflict(&api_error(404, "not found")));
    }

    #[test]
    fn merge_diff_sends_only_what_changed() {
        let old = json!({"host": "a", "vmState": "pending", "conditions": [{"type": "Ready"}], "gone": 1});
        let new = json!({"host": "a", "vmState": "running", "conditions": [{"type": "Ready", "status": "True"}]});
        assert_eq!(
            merge_diff(&old, &new),
            Some(
                json!({"vmState": "running", "conditions": [{"type": "Ready", "status": "True"}], "gone": null})
            )
        );
        assert_eq!(merge_diff(&old, &old), None);
        assert_eq!(
            merge_diff(&Value::Null, &json!({"a": 1})),
            Some(json!({"a": 1}))
        );
    }

    #[test]
    fn applying_the_diff_gives_the_new_value() {
        let old = json!({"a": {"b": 1, "c": [1, 2]}, "d": "x"});
        let new = json!({"a": {"b": 2, "c": [3]}, "e": true});
        let mut patched = old.clone();
        json_patch::merge(&mut patched, &merge_diff(&old, &new).unwrap());
        assert_eq!(patched, new);
    }
}
