//! The operator from its container image, against the API emulator (with our CRDs and the CAPI
//! stand-in) and hollow hosts on loopback. Run by `.ci/image`, which builds the image and passes a
//! command that runs the image's binary (`buildah run --network host ...`) in
//! `CAPMVM_OPERATOR_COMMAND`; ignored by a plain `cargo test`, which has no image.
//!
//! The hosts are named `localhost:<port>` rather than by address, so the image must resolve a host
//! name (`/etc/hosts` through the resolver the binary links) to reach them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use capmvm_api::capi::Cluster;
use capmvm_api::{MicrovmMachine, ProviderId};
use capmvm_sim::world::{World, WorldOptions, wait_for};
use kube::Api;
use kube::api::DeleteParams;

const NS: &str = "default";
const WAIT: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_millis(250);

fn is_ready(m: &MicrovmMachine) -> bool {
    m.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the container image: run by .ci/image with CAPMVM_OPERATOR_COMMAND"]
async fn the_operator_from_the_image_creates_and_deletes_a_cluster() {
    let command = std::env::var("CAPMVM_OPERATOR_COMMAND")
        .expect("CAPMVM_OPERATOR_COMMAND names the command that runs the operator from the image");
    let mut options = WorldOptions::new(
        3,
        Duration::from_millis(500),
        PathBuf::from(env!("CARGO_BIN_EXE_capmvm-sim")),
    );
    options.operator_command = (PathBuf::from(command), Vec::new());
    options.operator_flags = vec![
        "--host-poll-interval=2s".into(),
        "--host-poll-interval-busy=200ms".into(),
    ];
    let mut w = World::start(options).await.unwrap();
    w.start_operator(&[]).unwrap();
    let log = w.operator_log();

    w.apply_demo_cluster(
        &[
            ("CONTROL_PLANE_MACHINE_COUNT", "1".to_string()),
            ("WORKER_MACHINE_COUNT", "2".to_string()),
        ],
        |objects| {
            for o in objects.iter_mut() {
                if o.types.as_ref().is_some_and(|t| t.kind == "MicrovmCluster") {
                    let hosts = &mut o.data["spec"]["placement"]["staticPool"]["hosts"];
                    for h in hosts.as_array_mut().into_iter().flatten() {
                        let endpoint = h["endpoint"].as_str().unwrap().to_string();
                        h["endpoint"] = endpoint.replace("127.0.0.1:", "localhost:").into();
                    }
                }
            }
        },
    )
    .await
    .unwrap();

    let machines = wait_for(
        &format!("3 ready machines (operator log: {})", log.display()),
        WAIT,
        POLL,
        || async {
            let ms = w.microvm_machines(NS).await?;
            Ok((ms.len() == 3 && ms.iter().all(is_ready)).then_some(ms))
        },
    )
    .await
    .unwrap();
    for m in &machines {
        let id: ProviderId = m.spec.provider_id.as_deref().unwrap().parse().unwrap();
        assert_eq!(
            id.host.host(),
            "localhost",
            "placed on a host reached by name"
        );
    }
    assert_eq!(w.all_vms().len(), 3, "one microVM per machine");

    Api::<Cluster>::namespaced(w.client.clone(), NS)
        .delete("demo", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(
        &format!(
            "the cluster, its machines and microVMs to be gone (operator log: {})",
            log.display()
        ),
        WAIT,
        POLL,
        || async {
            let cluster = Api::<Cluster>::namespaced(w.client.clone(), NS)
                .get_opt("demo")
                .await?;
            let machines = w.microvm_machines(NS).await?;
            Ok((cluster.is_none() && machines.is_empty() && w.all_vms().is_empty()).then_some(()))
        },
    )
    .await
    .unwrap();
    w.shutdown().await;
}
