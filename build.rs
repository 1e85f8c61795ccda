//! Compiles `proto/` with protox (pure Rust, no protoc on the machine) and writes the encoded
//! descriptor set for server reflection.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/chargeguard/v1/payments.proto", "proto/chargeguard/v1/reports.proto"];
    for proto in &protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    // `sqlx::migrate!` embeds migrations/ at compile time but cannot tell cargo to watch it:
    // without this, a new migration file alone would not rebuild the binary that applies them.
    println!("cargo:rerun-if-changed=migrations");
    let file_descriptors = protox::compile(protos, ["proto"])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptor_bytes = prost::Message::encode_to_vec(&file_descriptors);
    std::fs::write(out_dir.join("chargeguard_descriptor.bin"), descriptor_bytes)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(file_descriptors)?;
    Ok(())
}
