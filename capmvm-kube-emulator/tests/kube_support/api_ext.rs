//! The calls the suites make again and again through a kube-rs `Api`, each with the test's usual
//! `unwrap` folded in: a merge patch, a finalizer release, the list's resourceVersion, a watch stream,
//! waiting for an object to go.

use std::fmt::Debug;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::serde::Serialize;
use k8s_openapi::serde::de::DeserializeOwned;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::{Value, json};

/// A stream of watch events, boxed so tests can hold it across awaits.
pub type Events<K> = BoxStream<'static, kube::Result<WatchEvent<K>>>;

#[allow(async_fn_in_trait)]
pub trait ApiExt<K> {
    /// Creates the object this JSON describes, with default parameters; the created object.
    async fn create_json(&self, object: Value) -> K;
    /// A JSON merge patch of the object with default parameters; the patched object.
    async fn merge(&self, name: &str, patch: Value) -> K;
    /// The same patch, returning what the server answered (for patches expected to fail).
    async fn try_merge(&self, name: &str, patch: Value) -> kube::Result<K>;
    /// Empties the object's finalizers, releasing a deletion they held.
    async fn release_finalizers(&self, name: &str) -> K;
    /// The collection's resourceVersion, from a list with default parameters.
    async fn list_rv(&self) -> String;
    /// A watch from `rv` with these parameters.
    async fn events(&self, params: &WatchParams, rv: &str) -> Events<K>;
    /// Waits (see `eventually`) until the object is gone.
    async fn eventually_gone(&self, what: &str, name: &str);
}

impl<K> ApiExt<K> for Api<K>
where
    K: Clone + DeserializeOwned + Serialize + Debug + Send + 'static,
{
    async fn create_json(&self, object: Value) -> K {
        self.create(
            &PostParams::default(),
            &serde_json::from_value(object).unwrap(),
        )
        .await
        .unwrap()
    }

    async fn merge(&self, name: &str, patch: Value) -> K {
        self.try_merge(name, patch).await.unwrap()
    }

    async fn try_merge(&self, name: &str, patch: Value) -> kube::Result<K> {
        self.patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
    }

    async fn release_finalizers(&self, name: &str) -> K {
        self.merge(name, json!({"metadata": {"finalizers": null}}))
            .await
    }

    async fn list_rv(&self) -> String {
        self.list(&ListParams::default())
            .await
            .unwrap()
            .metadata
            .resource_version
            .unwrap()
    }

    async fn events(&self, params: &WatchParams, rv: &str) -> Events<K> {
        self.watch(params, rv).await.unwrap().boxed()
    }

    async fn eventually_gone(&self, what: &str, name: &str) {
        super::eventually(what, || {
            let api = self.clone();
            let name = name.to_string();
            async move { api.get_opt(&name).await.unwrap().is_none() }
        })
        .await;
    }
}

/// The next item of a watch stream, failing the test if none comes within five seconds.
pub async fn next_event<S, T, E>(events: &mut S) -> T
where
    S: Stream<Item = Result<T, E>> + Unpin,
    E: Debug,
{
    tokio::time::timeout(Duration::from_secs(5), events.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
}
