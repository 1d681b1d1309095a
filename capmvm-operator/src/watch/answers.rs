//! The watches' client: it tells `/readyz` each time the API server answers a list or watch of a
//! collection with success, so a cache of a quiet collection is known to be served even when no event
//! comes (a healthy watch is renewed once per watch timeout).

use crate::server::Readiness;

/// `client`, telling `readiness` each time the API server answers a list or watch of a collection
/// with success. A healthy watch of a quiet collection delivers no event for a long time; its
/// renewal (once per watch timeout) is what shows it is still served.
pub fn reporting_answers(client: kube::Client, readiness: Readiness) -> kube::Client {
    let namespace = client.default_namespace().to_string();
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let inner = client.clone();
        let readiness = readiness.clone();
        let route = (request.method() == http::Method::GET)
            .then(|| collection_route(request.uri().path()))
            .flatten();
        async move {
            let response = inner.send(request).await?;
            if let Some(route) = route
                && response.status().is_success()
            {
                readiness.collection_answered(&route);
            }
            Ok::<_, kube::Error>(response)
        }
    });
    kube::Client::new(service, namespace)
}

/// `group/plural` of a collection path (`/api/v1/secrets`,
/// `/apis/cluster.x-k8s.io/v1beta2/namespaces/ns/machines`), the core group empty; `None` for a
/// path to one object or anything else.
fn collection_route(path: &str) -> Option<String> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.as_slice() {
        ["api", _, plural] | ["api", _, "namespaces", _, plural] => Some(format!("/{plural}")),
        ["apis", group, _, plural] | ["apis", group, _, "namespaces", _, plural] => {
            Some(format!("{group}/{plural}"))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collections_are_told_from_single_objects() {
        for (path, route) in [
            ("/api/v1/secrets", Some("/secrets")),
            ("/api/v1/namespaces/ns/secrets", Some("/secrets")),
            (
                "/apis/cluster.x-k8s.io/v1beta2/machines",
                Some("cluster.x-k8s.io/machines"),
            ),
            (
                "/apis/infrastructure.cluster.x-k8s.io/v1alpha2/namespaces/ns/microvmmachines",
                Some("infrastructure.cluster.x-k8s.io/microvmmachines"),
            ),
            (
                "/apis/cluster.x-k8s.io/v1beta2/namespaces/ns/machines/m-1",
                None,
            ),
            ("/api/v1/namespaces/ns/secrets/s", None),
            ("/apis", None),
        ] {
            assert_eq!(collection_route(path).as_deref(), route, "{path}");
        }
    }
}
