//! Compiles the workspace's `proto/switchyard/v1/switchyard.proto` with the pure-Rust `protox`
//! compiler (no system `protoc` needed) and writes the descriptor set that the
//! server hands to gRPC reflection.

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The proto lives at the workspace root, beside the crates.
    let root = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let proto = root.join("switchyard/v1/switchyard.proto");
    println!("cargo:rerun-if-changed={}", proto.display());
    let fds = protox::compile([&proto], [&root])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("switchyard_descriptor.bin"), fds.encode_to_vec())?;
    // Small starting buffers for every stream (src/api/codec.rs).
    // Media bytes as `Bytes`: a request's images are shared, not copied,
    // by every attempt that sends them.
    // `Delta` (every streamed token) is hand-written, its text held inline
    // (src/proto_delta.rs); `Started` and `ServedBy` share the request's
    // names (src/proto_names.rs).
    tonic_prost_build::configure()
        .codec_path("crate::api::codec::SmallBufferCodec")
        .extern_path(".switchyard.v1.Delta", "crate::proto_delta::Delta")
        .extern_path(".switchyard.v1.Started", "crate::proto_names::Started")
        .extern_path(".switchyard.v1.ServedBy", "crate::proto_names::ServedBy")
        .bytes(".switchyard.v1.ImagePart.data")
        .bytes(".switchyard.v1.DocumentPart.data")
        .compile_fds(fds)?;
    Ok(())
}
