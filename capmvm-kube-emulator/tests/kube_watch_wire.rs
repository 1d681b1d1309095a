#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A watch on the wire: what is already queued for a watcher goes out in one chunk.

mod kube_support;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};
use kube_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The chunks of an HTTP/1.1 chunked body (the bytes after the headers).
fn chunks(mut body: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("chunk size line");
        let size =
            usize::from_str_radix(std::str::from_utf8(&body[..line_end]).unwrap().trim(), 16)
                .expect("hex chunk size");
        body = &body[line_end + 2..];
        if size == 0 {
            return out;
        }
        out.push(body[..size].to_vec());
        body = &body[size + 2..];
    }
}

#[tokio::test]
async fn events_already_queued_for_a_watcher_go_out_in_one_chunk_in_order() {
    let (emu, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    for i in 0..20 {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("cm-{i:02}")),
                ..Default::default()
            },
            ..Default::default()
        };
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
    // From revision 0 the watch starts with every object: all of it is queued before the first write.
    let mut conn = tokio::net::TcpStream::connect(emu.addr()).await.unwrap();
    let req = format!(
        "GET /api/v1/namespaces/default/configmaps?watch=true&resourceVersion=0&timeoutSeconds=1 HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        emu.addr()
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer).await.unwrap();
    let head_end = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&answer[..head_end]).to_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("transfer-encoding: chunked"), "{head}");

    let chunks = chunks(&answer[head_end + 4..]);
    assert_eq!(chunks.len(), 1, "one chunk for the 20 queued events");
    let names: Vec<String> = chunks[0]
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| {
            let event: serde_json::Value =
                serde_json::from_slice(l).expect("one JSON event a line");
            assert_eq!(event["type"], "ADDED");
            event["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let want: Vec<String> = (0..20).map(|i| format!("cm-{i:02}")).collect();
    assert_eq!(names, want, "every event, whole and in order");
}
