//! Contract of in-process admission (`EmulatorHandle::admission`): hooks registered per kind default and
//! validate creates and updates of the main resource before the schema is applied, as a real server's
//! mutating and validating webhooks do; `/status` writes do not run them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kube_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use capmvm_kube_emulator::Operation;
use kube::api::{Patch, PatchParams, PostParams};
use kube_support::*;
use serde_json::json;

#[tokio::test]
async fn hooks_default_before_the_schema_and_refuse_with_the_webhook_name() {
    let (emulator, client) = start().await;
    create_crd(&client, &widget_crd()).await;
    let updates = Arc::new(AtomicUsize::new(0));
    let seen_updates = updates.clone();
    emulator.admission().register(
        "test.example.com",
        "Widget",
        "default.widget.test.example.com",
        move |obj, op| {
            if op == Operation::Update {
                seen_updates.fetch_add(1, Ordering::SeqCst);
            }
            // `size` is required by the schema: defaulting it makes the object valid.
            if obj["spec"].get("size").is_none() {
                obj["spec"]["size"] = json!(3);
            }
            obj["metadata"]["labels"]["example.com/defaulted"] = json!("true");
            // Not in the schema: pruned afterwards, as a webhook's patch is.
            obj["spec"]["unknownByTheSchema"] = json!(1);
            Ok(())
        },
    );
    emulator.admission().register(
        "test.example.com",
        "Widget",
        "validation.widget.test.example.com",
        |obj, _| match obj["spec"]["color"].as_str() {
            Some("green") => Err("spec.color: green widgets are not allowed here".into()),
            _ => Ok(()),
        },
    );
    assert_eq!(
        emulator.admission().hooks_for("test.example.com", "Widget"),
        [
            "default.widget.test.example.com",
            "validation.widget.test.example.com"
        ]
    );

    // A create without the required field is defaulted, then validated: accepted, with no warning.
    let r = raw(
        &client,
        "POST",
        "/apis/test.example.com/v1/namespaces/default/widgets?fieldValidation=Strict",
        Some("application/json"),
        &serde_json::to_vec(
            &json!({"apiVersion": "test.example.com/v1", "kind": "Widget",
            "metadata": {"name": "w1"}, "spec": {}}),
        )
        .unwrap(),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert!(r.warnings().is_empty(), "{:?}", r.warnings());
    assert_eq!(r.body["spec"]["size"], 3);
    assert_eq!(
        r.body["spec"]["color"], "red",
        "schema defaults still apply"
    );
    assert_eq!(
        r.body["metadata"]["labels"]["example.com/defaulted"],
        "true"
    );
    assert!(r.body["spec"].get("unknownByTheSchema").is_none());

    // A refusal: 422 naming the webhook, nothing stored.
    let api = widgets(&client, "default");
    let mut green = widget("w2", 2);
    green["spec"]["color"] = json!("green");
    let err = api
        .create(&PostParams::default(), &dynamic(green))
        .await
        .unwrap_err();
    let status = status_of(err);
    assert_eq!(status.code, 422);
    assert_eq!(
        status.message,
        "admission webhook \"validation.widget.test.example.com\" denied the request: spec.color: green widgets are not allowed here"
    );
    assert!(api.get_opt("w2").await.unwrap().is_none());

    // Updates run the hooks too: a patch that removes the defaulted field gets it back.
    let r = raw(
        &client,
        "PATCH",
        "/apis/test.example.com/v1/namespaces/default/widgets/w1",
        Some("application/json-patch+json"),
        br#"[{"op":"remove","path":"/spec/size"}]"#,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let w1 = api.get("w1").await.unwrap();
    assert_eq!(w1.data["spec"]["size"], 3);
    assert_eq!(updates.load(Ordering::SeqCst), 1);
    let refused = api
        .try_merge("w1", json!({"spec": {"color": "green"}}))
        .await
        .unwrap_err();
    assert_eq!(status_of(refused).code, 422);

    // `/status` writes are not admitted by the resource's hooks.
    api.patch_status(
        "w1",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Ready"}})),
    )
    .await
    .unwrap();
    assert_eq!(
        updates.load(Ordering::SeqCst),
        2,
        "the refused patch was admitted once"
    );
    emulator.shutdown().await;
}

#[tokio::test]
async fn hooks_of_other_kinds_do_not_run() {
    let (emulator, client) = start().await;
    create_crd(&client, &widget_crd()).await;
    emulator
        .admission()
        .register("test.example.com", "Gadget", "deny.gadget", |_, _| {
            Err("never".into())
        });
    emulator
        .admission()
        .register(
            "",
            "ConfigMap",
            "deny.configmap",
            |obj, _| match obj["data"]["forbidden"].as_str() {
                Some(_) => Err("data.forbidden: not allowed".into()),
                None => Ok(()),
            },
        );
    widgets(&client, "default")
        .create_json(widget("w", 1))
        .await;
    // Built-in kinds of the core group can be admitted too.
    let r = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        Some("application/json"),
        br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"data":{"forbidden":"x"}}"#,
    )
    .await;
    assert_status(&r, 422, "Invalid");
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("admission webhook \"deny.configmap\" denied the request"),
        "{}",
        r.text
    );
    emulator.shutdown().await;
}
