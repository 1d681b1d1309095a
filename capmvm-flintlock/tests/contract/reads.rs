//! GetMicroVM, ListMicroVMs and ListMicroVMsStream; metadata round-tripped.

use std::collections::BTreeMap;

use base64::Engine as _;
use capmvm_flintlock::proto::services::ListMicroVMsRequest;
use capmvm_flintlock::proto::services::micro_vm_client::MicroVmClient;
use capmvm_flintlock::{ErrorKind, MicrovmSpec};
use futures::StreamExt as _;
use tonic::Code;

use crate::servers::{Backend, Options};
use crate::support::{b64, valid_spec};

crate::on_both_servers!(
    get_answers_the_record_and_an_unknown_uid_is_not_found,
    list_filters_by_namespace_and_name_and_an_empty_namespace_is_all,
    the_list_stream_needs_a_namespace_and_ignores_the_name,
    metadata_round_trips_with_instance_id_added,
    a_slash_in_a_name_or_namespace_breaks_every_read_of_that_microvm,
);

fn in_namespace(name: &str, namespace: &str) -> MicrovmSpec {
    let mut spec = valid_spec(name);
    spec.namespace = namespace.to_owned();
    spec
}

async fn get_answers_the_record_and_an_unknown_uid_is_not_found(backend: Backend) {
    let server = backend.start(Options::default()).await;
    let client = server.client();
    let created = client.create(valid_spec("m1")).await.unwrap();
    let got = client.get(created.uid()).await.unwrap();
    assert_eq!(got.spec, created.spec, "get answers the stored spec");

    let uid = "01KZZZZZZZZZZZZZZZZZZZZZZZ";
    let err = client.get(uid).await.unwrap_err();
    assert_eq!(
        (err.kind(), err.code()),
        (ErrorKind::NotFound, Some(Code::Unknown))
    );
    assert_eq!(
        err.message(),
        format!(
            "getting microvm: error attempting to locate microvm with uid: {uid}: microvm spec //{uid} not found"
        )
    );
    let err = client.get("").await.unwrap_err();
    assert_eq!(
        (err.kind(), err.code(), err.message()),
        (
            ErrorKind::InvalidArgument,
            Some(Code::InvalidArgument),
            "invalid request"
        )
    );
    server.stop().await;
}

async fn list_filters_by_namespace_and_name_and_an_empty_namespace_is_all(backend: Backend) {
    let server = backend.start(Options::default()).await;
    let client = server.client();
    let a1 = client.create(valid_spec("a")).await.unwrap();
    let b = client.create(valid_spec("b")).await.unwrap();
    let other = client.create(in_namespace("a", "ns2")).await.unwrap();

    let uids = |vms: Vec<capmvm_flintlock::Microvm>| {
        let mut uids: Vec<String> = vms.iter().map(|vm| vm.uid().to_owned()).collect();
        uids.sort();
        uids
    };
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    assert_eq!(
        uids(client.list("", None).await.unwrap()),
        sorted(vec![a1.uid().into(), b.uid().into(), other.uid().into()])
    );
    assert_eq!(
        uids(client.list("ns1", None).await.unwrap()),
        sorted(vec![a1.uid().into(), b.uid().into()])
    );
    assert_eq!(
        uids(client.list("ns1", Some("a")).await.unwrap()),
        vec![a1.uid().to_owned()]
    );
    assert_eq!(
        uids(client.list("", Some("a")).await.unwrap()),
        sorted(vec![a1.uid().into(), other.uid().into()]),
        "a name without a namespace matches in every namespace"
    );
    assert_eq!(
        uids(client.list("ns1", Some("")).await.unwrap()),
        sorted(vec![a1.uid().into(), b.uid().into()]),
        "an empty name is no filter"
    );
    assert!(client.list("ns1", Some("zzz")).await.unwrap().is_empty());
    assert!(client.list("nowhere", None).await.unwrap().is_empty());
    server.stop().await;
}

async fn the_list_stream_needs_a_namespace_and_ignores_the_name(backend: Backend) {
    let server = backend.start(Options::default()).await;
    let client = server.client();
    for name in ["a", "b", "c"] {
        client.create(valid_spec(name)).await.unwrap();
    }
    client.create(in_namespace("d", "ns2")).await.unwrap();

    let streamed: Vec<_> = client.list_stream("ns1").await.unwrap().collect().await;
    let mut names: Vec<String> = streamed
        .into_iter()
        .map(|item| item.unwrap().spec.id)
        .collect();
    names.sort();
    assert_eq!(names, ["a", "b", "c"]);

    // The name is not a filter of the stream.
    let mut raw = MicroVmClient::connect(format!("http://{}", server.endpoint()))
        .await
        .unwrap();
    let mut stream = raw
        .list_micro_v_ms_stream(ListMicroVMsRequest {
            namespace: "ns1".to_owned(),
            name: Some("a".to_owned()),
        })
        .await
        .unwrap()
        .into_inner();
    let mut count = 0;
    while let Some(message) = stream.next().await {
        message.unwrap();
        count += 1;
    }
    assert_eq!(count, 3);

    let err = match client.list_stream("").await {
        Ok(mut stream) => stream.next().await.unwrap().unwrap_err(),
        Err(err) => err,
    };
    assert_eq!(
        (err.kind(), err.code(), err.message()),
        (
            ErrorKind::InvalidArgument,
            Some(Code::InvalidArgument),
            "invalid request"
        )
    );
    server.stop().await;
}

async fn metadata_round_trips_with_instance_id_added(backend: Backend) {
    let server = backend.start(Options::default()).await;
    let client = server.client();
    let decode = |text: &str| {
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .unwrap(),
        )
        .unwrap()
    };

    // No meta-data: flintlock writes one holding the instance id alone.
    let mut bare = valid_spec("bare");
    bare.metadata = BTreeMap::from([("user-data".to_owned(), b64("#cloud-config\n"))]);
    let created = client.create(bare).await.unwrap();
    assert_eq!(
        decode(&created.spec.metadata["meta-data"]),
        format!("instance_id: {}\n", created.uid())
    );
    assert_eq!(created.spec.metadata["user-data"], b64("#cloud-config\n"));

    // Other keys (vendor-data, network-config, anything) come back byte for byte, as does meta-data's
    // content beside the instance id; labels do not come back.
    let mut full = valid_spec("full");
    full.labels = BTreeMap::from([("a".to_owned(), "b".to_owned())]);
    full.metadata.insert(
        "vendor-data".to_owned(),
        b64("#cloud-config\nruncmd: [ls]\n"),
    );
    full.metadata
        .insert("anything".to_owned(), "not even base64 %%".to_owned());
    let created = client.create(full.clone()).await.unwrap();
    let got = client.get(created.uid()).await.unwrap();
    for key in ["user-data", "vendor-data", "anything"] {
        assert_eq!(got.spec.metadata[key], full.metadata[key], "{key}");
    }
    assert_eq!(
        decode(&got.spec.metadata["meta-data"]),
        format!(
            "instance_id: {}\nlocal_hostname: m1\nplatform: liquid_metal\n",
            created.uid()
        )
    );
    assert!(got.spec.labels.is_empty());
    server.stop().await;
}

async fn a_slash_in_a_name_or_namespace_breaks_every_read_of_that_microvm(backend: Backend) {
    let server = backend.start(Options::default()).await;
    let client = server.client();
    let fine = client.create(valid_spec("fine")).await.unwrap();
    // Accepted...
    let slashed = client.create(in_namespace("a/b", "ns1")).await.unwrap();
    let uid = slashed.uid();
    let vmid = format!("ns1/a/b/{uid}");
    let unreadable = format!(
        "unmarshalling json content to microvm: parsing vmid from string: unexpected vmid format: {vmid}"
    );
    // ... but flintlock stores "<namespace>/<name>/<uid>" and cannot read it back.
    let err = client.get(uid).await.unwrap_err();
    assert_eq!(
        (err.kind(), err.code()),
        (ErrorKind::Other, Some(Code::Unknown))
    );
    assert_eq!(
        err.message(),
        format!(
            "getting microvm: error attempting to locate microvm with uid: {uid}: getting vm spec from store: {unreadable}"
        )
    );
    let err = client.delete(uid).await.unwrap_err();
    assert_eq!(
        err.message(),
        format!(
            "deleting microvm: checking to see if spec exists: getting vm spec from store: {unreadable}"
        )
    );
    // Every list that would include it fails, the list of all namespaces included.
    for namespace in ["ns1", ""] {
        let err = client.list(namespace, None).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Other);
        assert_eq!(
            err.message(),
            format!(
                "getting all microvms: error attempting to list microvms: map[namespace:{namespace}]: getting microvm spec: {unreadable}"
            )
        );
    }
    // Other namespaces and the other microVM by uid still answer.
    assert!(client.list("ns2", None).await.unwrap().is_empty());
    assert_eq!(client.get(fine.uid()).await.unwrap().spec.id, "fine");
    server.stop().await;
}
