// Compiles the CSI spec's csi.proto and the kubelet's plugin registration API (data files, see
// proto/README.md) without a system protoc.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/csi.proto");
    println!("cargo:rerun-if-changed=proto/pluginregistration.proto");
    let descriptors = protox::compile(
        ["proto/csi.proto", "proto/pluginregistration.proto"],
        ["proto"],
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
