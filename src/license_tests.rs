//! The licence the project says it has is the one it ships: the LICENSE file at the root is
//! the Apache License 2.0, the licence Cargo.toml declares for every crate and the image's
//! label names.

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{ROOT}/{path}")).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_license_file_is_the_license_cargo_and_the_image_declare() {
    let license = read("LICENSE");
    let head: Vec<&str> = license.lines().take(2).map(str::trim).collect();
    assert_eq!(
        head,
        ["Apache License", "Version 2.0, January 2004"],
        "LICENSE must be the Apache License 2.0"
    );
    assert!(
        license.contains("END OF TERMS AND CONDITIONS"),
        "LICENSE is cut short"
    );
    let manifest = read("Cargo.toml");
    let package = manifest
        .split("[workspace.package]")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .expect("Cargo.toml has [workspace.package]");
    assert!(
        package
            .lines()
            .any(|l| l.trim() == "license = \"Apache-2.0\""),
        "Cargo.toml's [workspace.package] license: {package}"
    );
    assert!(
        read("Dockerfile").contains("org.opencontainers.image.licenses=\"Apache-2.0\""),
        "the image's licence label"
    );
}
