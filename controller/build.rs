fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = "../gateway/proto";
    println!("cargo:rerun-if-changed={proto_dir}/gateway.proto");
    // The gateway's own .proto: the client, plus the server for the in-process test gateway;
    // serde lets state files be YAML.
    tonic_prost_build::configure()
        .build_server(true)
        .type_attribute(".", "#[derive(serde::Serialize, serde::Deserialize)]")
        .message_attribute(".", "#[serde(default, rename_all = \"camelCase\")]")
        .compile_protos(
            &[format!("{proto_dir}/gateway.proto")],
            &[proto_dir.to_string()],
        )?;
    Ok(())
}
