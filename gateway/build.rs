fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/gateway.proto");
    tonic_prost_build::configure().compile_protos(&["proto/gateway.proto"], &["proto"])?;
    Ok(())
}
