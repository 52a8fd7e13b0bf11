//! Compiles `proto/vmplane/v1/*.proto` with the system `protoc` (or `$PROTOC`), which
//! `scripts/install-deps.sh` installs.
use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    let proto_root = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?).join("../proto");
    let files = [
        proto_root.join("vmplane/v1/admin.proto"),
        proto_root.join("vmplane/v1/vmplane.proto"),
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("vmplane_descriptor.bin"))
        .compile_protos(&files, &[proto_root])?;
    Ok(())
}
