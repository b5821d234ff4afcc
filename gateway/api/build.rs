fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/gateway.proto");
    // One set of types for both sides: the gateway's server, the controller's client, and
    // serde so that state files (`kubetun gateway apply -f`) can be YAML.
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .type_attribute(".", "#[derive(serde::Serialize, serde::Deserialize)]")
        .message_attribute(".", "#[serde(default, rename_all = \"camelCase\")]")
        .compile_protos(&["proto/gateway.proto"], &["proto"])?;
    Ok(())
}
