//! Every example object of our kinds deserializes, validates and round-trips through serde unchanged.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code

use std::path::PathBuf;

use capmvm_api::{MicrovmCluster, MicrovmMachine, MicrovmMachineTemplate, validation};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

fn example_documents() -> Vec<(PathBuf, Value)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut docs = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for doc in serde_saphyr::from_multiple::<Value>(&text).unwrap() {
            if !doc.is_null() {
                docs.push((file.clone(), doc));
            }
        }
    }
    docs
}

/// Deserializes `doc` as `T` and checks that serializing it gives back exactly `doc`.
fn round_trip<T: DeserializeOwned + Serialize>(file: &std::path::Path, doc: &Value) -> T {
    let obj: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{}: does not deserialize: {e}", file.display()));
    let back = serde_json::to_value(&obj).unwrap();
    assert_eq!(
        &back,
        doc,
        "{}: changed in a serde round trip",
        file.display()
    );
    obj
}

#[test]
fn examples_deserialize_validate_and_round_trip() {
    let mut seen = std::collections::BTreeSet::new();
    for (file, doc) in example_documents() {
        if doc["apiVersion"] != "infrastructure.cluster.x-k8s.io/v1alpha2" {
            continue;
        }
        let kind = doc["kind"].as_str().unwrap().to_string();
        let result = match kind.as_str() {
            "MicrovmCluster" => {
                validation::validate_cluster(&round_trip::<MicrovmCluster>(&file, &doc))
            }
            "MicrovmMachine" => {
                validation::validate_machine(&round_trip::<MicrovmMachine>(&file, &doc))
            }
            "MicrovmMachineTemplate" => {
                validation::validate_template(&round_trip::<MicrovmMachineTemplate>(&file, &doc))
            }
            other => panic!("{}: unknown kind {other}", file.display()),
        };
        if let Err(errors) = result {
            panic!("{}: {kind} is invalid: {errors}", file.display());
        }
        seen.insert(kind);
    }
    assert_eq!(seen.len(), 3, "every kind has an example, saw {seen:?}");
}
