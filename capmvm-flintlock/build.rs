//! Compiles flintlock's two .proto files into Rust (prost messages + tonic client and server).
//!
//! By default the protobuf compiler is `protox` (pure Rust, well-known types included), so a fresh
//! machine needs no `protoc`. Built with `--no-default-features`, the `protoc` binary named by `$PROTOC`
//! (or found on `PATH`) is used instead; it must ship the well-known types (`google/protobuf/*.proto`).

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "proto/services/microvm/v1alpha1/microvms.proto",
    "proto/types/microvm.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let root = manifest_dir.join("proto");
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let files: Vec<PathBuf> = PROTOS.iter().map(|p| manifest_dir.join(p)).collect();
    // BTreeMap keeps map fields (metadata, cmdline, status maps) in a stable order.
    let builder = tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .btree_map(".");
    compile(builder, &files, &root)
}

#[cfg(feature = "protox")]
fn compile(
    builder: tonic_prost_build::Builder,
    files: &[PathBuf],
    root: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let fds = protox::compile(files, [root])?;
    builder.compile_fds(fds)?;
    Ok(())
}

#[cfg(not(feature = "protox"))]
fn compile(
    builder: tonic_prost_build::Builder,
    files: &[PathBuf],
    root: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    builder.compile_protos(files, &[root.to_path_buf()])?;
    Ok(())
}
