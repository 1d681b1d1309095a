//! Tables for kubectl: the printer columns.

use super::*;

async fn tables_carry_the_printer_columns(server: Server) {
    let client = server.client();
    create_crd(&client, &widget_crd()).await;
    let mut w = widget("w", 4);
    w["metadata"]["labels"] = json!({"example.com/owner": "team-a"});
    w["spec"]["color"] = json!("blue");
    widgets(&client, "default").create_json(w).await;
    widgets(&client, "default")
        .patch_status("w", &PatchParams::default(), &Patch::Merge(json!({"status": {"conditions": [{"type": "Paused", "status": "False"}, {"type": "Ready", "status": "True"}]}})))
        .await
        .unwrap();
    let accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
    let r = raw_with(
        &client,
        "GET",
        "/apis/test.example.com/v1/namespaces/default/widgets",
        None,
        Some(accept),
        b"",
    )
    .await;
    assert_eq!(r.status, 200);
    let t = r.body;
    assert_eq!(t["kind"], "Table");
    assert_eq!(t["apiVersion"], "meta.k8s.io/v1");
    let cols: Vec<&str> = t["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(cols, vec!["Name", "Size", "Color", "Ready", "Owner", "Age"]);
    assert_eq!(t["columnDefinitions"][2]["priority"], 1);
    let cells = &t["rows"][0]["cells"];
    assert_eq!(cells[0], "w");
    assert_eq!(cells[1], 4);
    assert_eq!(cells[2], "blue");
    assert_eq!(cells[3], "True");
    assert_eq!(cells[4], "team-a");
    assert!(
        cells[5].as_str().unwrap().ends_with('s'),
        "age like 0s: {}",
        cells[5]
    );
    assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    // One object as a Table, and a missing value is null.
    widgets(&client, "default")
        .create_json(widget("bare", 1))
        .await;
    let one = raw_with(
        &client,
        "GET",
        "/apis/test.example.com/v1/namespaces/default/widgets/bare",
        None,
        Some(accept),
        b"",
    )
    .await
    .body;
    assert_eq!(one["rows"].as_array().unwrap().len(), 1);
    assert!(one["rows"][0]["cells"][3].is_null());
    // PartialObjectMetadata, as kube-rs metadata calls ask.
    let meta: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    assert!(
        meta.list_metadata(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let dmeta = widgets(&client, "default").get_metadata("w").await.unwrap();
    assert_eq!(
        dmeta.metadata.labels.unwrap()["example.com/owner"],
        "team-a"
    );
}

crate::on_both_servers!(tables_carry_the_printer_columns,);
