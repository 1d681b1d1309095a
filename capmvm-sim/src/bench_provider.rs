//! Which infrastructure provider `capmvm-sim bench` measures: ours, or the Go provider
//! (`cluster-api-provider-microvm` v0.10.1, the program itself: [`crate::real::go_provider`]) on
//! the same real stack, the same hollow hosts and the same template, its infrastructure kinds
//! written at `v1alpha1` as its users write them.

use capmvm_api::conversion::{V1ALPHA2_FIELDS_ANNOTATION, convert_object};
use capmvm_api::{GROUP, v1alpha1};
use kube::ResourceExt as _;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::{Value, json};

/// The provider a bench run measures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchProvider {
    /// Ours: `capmvm-operator`.
    #[default]
    Capmvm,
    /// The Go provider v0.10.1 (needs `--control-plane real` and `hack/upstream.sh build
    /// go-provider`).
    Go,
}

impl BenchProvider {
    /// How the report names it.
    pub fn describe(self) -> &'static str {
        match self {
            BenchProvider::Capmvm => "capmvm",
            BenchProvider::Go => "the Go provider (cluster-api-provider-microvm v0.10.1)",
        }
    }

    /// The version its users write MicrovmMachines at, as a dynamic resource.
    pub fn machines(self) -> ApiResource {
        let version = match self {
            BenchProvider::Capmvm => capmvm_api::VERSION,
            BenchProvider::Go => v1alpha1::VERSION,
        };
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(GROUP, version, "MicrovmMachine"),
            "microvmmachines",
        )
    }

    /// Whether `m` (read at [`BenchProvider::machines`]) is ready as this provider reports it:
    /// the Go provider's `status.ready`, our `Ready` condition.
    pub fn is_ready(self, m: &DynamicObject) -> bool {
        match self {
            BenchProvider::Go => m.data.pointer("/status/ready") == Some(&json!(true)),
            BenchProvider::Capmvm => m
                .data
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True"),
        }
    }

    /// Rewrites a rendered template's infrastructure objects as this provider's users write
    /// them: for the Go provider at `v1alpha1`, with nothing of ours in them.
    pub fn rewrite(self, objects: &mut [DynamicObject]) -> anyhow::Result<()> {
        if self == BenchProvider::Capmvm {
            return Ok(());
        }
        as_go_provider_users_write(objects)
    }
}

/// The infrastructure kinds (`Microvm*`) of a rendered template at `v1alpha1`, as the Go
/// provider's users had them: our v1alpha2-only fields' annotation removed.
pub fn as_go_provider_users_write(objects: &mut [DynamicObject]) -> anyhow::Result<()> {
    let old = format!("{GROUP}/{}", v1alpha1::VERSION);
    for o in objects.iter_mut() {
        if !o
            .types
            .as_ref()
            .is_some_and(|t| t.kind.starts_with("Microvm"))
        {
            continue;
        }
        let value = serde_json::to_value(&*o)?;
        let mut converted: DynamicObject = serde_json::from_value(convert_object(value, &old)?)?;
        converted
            .annotations_mut()
            .remove(V1ALPHA2_FIELDS_ANNOTATION);
        *o = converted;
    }
    Ok(())
}
