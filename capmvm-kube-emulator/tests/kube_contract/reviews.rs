//! Access reviews: what `kubectl auth can-i` and `whoami` ask.

use super::*;

async fn self_reviews_answer_what_a_client_may_do(server: Server) {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
        SelfSubjectRulesReview, SelfSubjectRulesReviewSpec,
    };
    let client = server.client();
    // The emulator has no authorization and the real server's test client is an administrator
    // (system:masters): both allow everything, and say so.
    let reviews: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some("create".into()),
                group: Some("infrastructure.cluster.x-k8s.io".into()),
                resource: Some("microvmmachines".into()),
                namespace: Some("default".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = reviews
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    assert!(answer.status.as_ref().unwrap().allowed, "{answer:?}");
    assert_eq!(
        answer.spec.resource_attributes.unwrap().resource.as_deref(),
        Some("microvmmachines")
    );
    // Neither kind of attributes: 422 naming the field.
    let e = status_of(
        reviews
            .create(&PostParams::default(), &SelfSubjectAccessReview::default())
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        e.details.unwrap().causes[0].field,
        "spec.resourceAttributes"
    );
    let rules: Api<SelfSubjectRulesReview> = Api::all(client.clone());
    let listed = rules
        .create(
            &PostParams::default(),
            &SelfSubjectRulesReview {
                spec: SelfSubjectRulesReviewSpec {
                    namespace: Some("default".into()),
                },
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .status
        .unwrap();
    assert!(!listed.incomplete);
    assert!(listed.resource_rules.iter().any(|r| r.verbs == ["*"]
        && r.api_groups.as_deref() == Some(&["*".to_string()][..])
        && r.resources.as_deref() == Some(&["*".to_string()][..])));
    // kubectl asks the same questions.
    let Some(kubectl) = server.kubectl("self_reviews_answer_what_a_client_may_do") else {
        return;
    };
    let can = kubectl
        .run(&[
            "auth",
            "can-i",
            "create",
            "microvmmachines.infrastructure.cluster.x-k8s.io",
            "-n",
            "default",
        ])
        .await
        .unwrap();
    assert_eq!(can.trim(), "yes");
    let list = kubectl
        .run(&["auth", "can-i", "--list", "-n", "default"])
        .await
        .unwrap();
    assert!(list.lines().any(|l| l.starts_with("*.*")), "{list}");
}

crate::on_both_servers!(self_reviews_answer_what_a_client_may_do,);
