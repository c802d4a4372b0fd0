//! Generates the wire types (prost messages, and tonic's server side of Envoy's `ExternalProcessor`)
//! from the project's .proto files in `protos/` at the repository top level.
//!
//! The files are parsed by `protox`, in Rust, so building needs no `protoc`. `google/protobuf/*.proto`
//! come with protox. `src/pb` includes the result under its module paths.

use std::io;
use std::path::{Path, PathBuf};

fn main() -> io::Result<()> {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    // Two levels up from native/core: maturin and cargo both build from inside the repository.
    let protos = manifest_dir.join("../../protos");
    let protos = protos
        .canonicalize()
        .map_err(|e| io::Error::other(format!("the .proto files: {}: {e}", protos.display())))?;
    println!("cargo:rerun-if-changed={}", protos.display());

    let mut files = Vec::new();
    find_protos(&protos, &mut files)?;
    files.sort();
    if files.is_empty() {
        return Err(io::Error::other(format!("no .proto files under {}", protos.display())));
    }
    let descriptors = protox::compile(&files, [&protos]).map_err(|e| io::Error::other(e.to_string()))?;

    let mut config = prost_build::Config::new();
    // Maps as BTreeMap: encoding is deterministic, and tests can compare bytes.
    config.btree_map(["."]);
    // `google.protobuf.Struct` generated here rather than taken from prost-types, so `pb` can add
    // its own constructors to it.
    config.compile_well_known_types();
    config.include_file("wire.rs");
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(false)
        .build_transport(false)
        .compile_well_known_types(true)
        .compile_fds_with_config(descriptors, config)
}

/// Every `.proto` file under `dir`, recursively.
fn find_protos(dir: &Path, out: &mut Vec<PathBuf>) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            find_protos(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
    Ok(())
}
