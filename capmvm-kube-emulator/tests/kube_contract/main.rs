#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The contract of the Kubernetes API emulator: one test per rule of `../shared/kube-emulator.md`, each
//! driving a server through a real kube-rs client and asserting what a client sees. Every test runs
//! twice, on the emulator (`emulator::`) and on the real kube-apiserver (`real::`, which needs the
//! binaries of `hack/upstream.sh build`): the real server is the oracle.

#[path = "../kube_support/mod.rs"]
mod kube_support;

mod cel;
mod deletion;
mod discovery;
mod lists;
mod objects;
mod reviews;
mod schemas;
mod tables;
mod watches;
mod writes;

use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::ResourceExt;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::core::DynamicObject;
use kube_support::servers::Server;
use kube_support::*;
use serde_json::{Value, json};

fn rv_of(o: &DynamicObject) -> u64 {
    o.metadata
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .unwrap()
}

/// JSON patch documents for kube's `Patch::Json`, from JSON values.
mod json_patch_ops {
    pub(crate) type Ops = json_patch::Patch;

    pub(crate) fn ops(v: serde_json::Value) -> Ops {
        serde_json::from_value(v).unwrap()
    }
}
