//! Compiles the server's own `proto/` (a symlink to the repository's `proto/`) with protox (pure
//! Rust, no protoc on the machine): messages and clients only.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/chargeguard/v1/payments.proto", "proto/chargeguard/v1/reports.proto"];
    for proto in &protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let file_descriptors = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure().build_client(true).build_server(false).compile_fds(file_descriptors)?;
    Ok(())
}
