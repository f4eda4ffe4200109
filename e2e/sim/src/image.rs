//! Container images without a registry or a Docker engine: an OCI image layout written as a tar
//! file (`oci-layout`, `index.json`, `blobs/sha256/...`: one uncompressed layer, the image
//! config and the manifest), which `ctr -n k8s.io images import` loads into a node's containerd.
//!
//! The layer holds the given files (usually static binaries) and the empty directories a
//! runtime mounts over (`/dev`, `/proc`, `/sys`, `/etc`, `/tmp`). Every entry has uid 0 and
//! mtime 0, so the same inputs give the same digests.
//!
//! The sim's own images (`podha-pause`, `podha-csi`, the writers) are written here; podha's
//! image is built by Docker from the repository's Dockerfile (`make image`,
//! `e2e/tools/docker-image.sh`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::json;
use sha2::{Digest, Sha256};

/// Where [`build`] failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid image spec: {0}")]
    Spec(String),
}

impl Error {
    fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// A short stable name per variant.
    pub fn label(&self) -> &'static str {
        match self {
            Error::Io { .. } => "io",
            Error::Spec(_) => "spec",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A file of the host copied into the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageFile {
    pub source: PathBuf,
    /// Absolute path inside the image.
    pub path: String,
}

impl std::str::FromStr for ImageFile {
    type Err = Error;

    /// `HOST_PATH[:/PATH/IN/IMAGE]`; without the second part the file lands in `/` under its
    /// own name.
    fn from_str(s: &str) -> Result<Self> {
        let (source, path) = match s.split_once(':') {
            Some((source, path)) => (PathBuf::from(source), path.to_string()),
            None => {
                let source = PathBuf::from(s);
                let name = source
                    .file_name()
                    .ok_or_else(|| Error::Spec(format!("{s:?} names no file")))?
                    .to_string_lossy()
                    .into_owned();
                (source, format!("/{name}"))
            }
        };
        if !path.starts_with('/') || path.split('/').any(|part| part == "..") || path == "/" {
            return Err(Error::Spec(format!(
                "path in image {path:?} must be absolute, name a file and not contain `..`"
            )));
        }
        Ok(ImageFile { source, path })
    }
}

/// What goes into an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSpec {
    /// Full reference containerd records, e.g. `podha.io/sim/pause:1`.
    pub name: String,
    pub files: Vec<ImageFile>,
    pub entrypoint: Vec<String>,
}

/// What [`build`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltImage {
    pub name: String,
    /// `sha256:<hex>` of the manifest (containerd's image digest).
    pub manifest_digest: String,
}

struct Blob {
    digest_hex: String,
    bytes: Vec<u8>,
}

impl Blob {
    fn new(bytes: Vec<u8>) -> Self {
        let digest_hex = hex(&Sha256::digest(&bytes));
        Blob { digest_hex, bytes }
    }

    fn descriptor(&self, media_type: &str) -> serde_json::Value {
        json!({
            "mediaType": media_type,
            "digest": format!("sha256:{}", self.digest_hex),
            "size": self.bytes.len(),
        })
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn header(kind: tar::EntryType, size: u64, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h
}

fn append_file(out: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8], mode: u32) -> Result<()> {
    let mut h = header(tar::EntryType::Regular, data.len() as u64, mode);
    out.append_data(&mut h, path, data)
        .map_err(|e| Error::io(format!("write {path} into a tar"), e))
}

fn append_dir(out: &mut tar::Builder<Vec<u8>>, path: &str) -> Result<()> {
    let mut h = header(tar::EntryType::Directory, 0, 0o755);
    out.append_data(&mut h, format!("{path}/"), std::io::empty())
        .map_err(|e| Error::io(format!("write {path}/ into a tar"), e))
}

/// The layer: the runtime's mount points, the parents of every file, then the files.
fn layer(spec: &ImageSpec) -> Result<Vec<u8>> {
    use std::os::unix::fs::PermissionsExt;
    let mut dirs: BTreeSet<String> = ["dev", "proc", "sys", "etc", "tmp"]
        .map(String::from)
        .into();
    for f in &spec.files {
        let rel = f.path.trim_start_matches('/');
        let mut parent = Path::new(rel).parent();
        while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
            dirs.insert(p.to_string_lossy().into_owned());
            parent = p.parent();
        }
    }
    let mut out = tar::Builder::new(Vec::new());
    for d in &dirs {
        append_dir(&mut out, d)?;
    }
    for f in &spec.files {
        let data = std::fs::read(&f.source)
            .map_err(|e| Error::io(format!("read {}", f.source.display()), e))?;
        let mode = std::fs::metadata(&f.source)
            .map_err(|e| Error::io(format!("stat {}", f.source.display()), e))?
            .permissions()
            .mode()
            & 0o7777;
        append_file(&mut out, f.path.trim_start_matches('/'), &data, mode)?;
    }
    out.into_inner()
        .map_err(|e| Error::io("finish the image layer", e))
}

/// The tag part of a reference (`podha.io/sim/pause:1` → `1`, `latest` without one).
fn tag_of(name: &str) -> &str {
    let last = name.rsplit('/').next().unwrap_or(name);
    last.split_once(':').map_or("latest", |(_, tag)| tag)
}

/// The image's runtime configuration (the `config` of the OCI image config): the entrypoint
/// and a search path; it runs as root, with no default arguments.
fn image_config(spec: &ImageSpec) -> serde_json::Value {
    json!({
        "Entrypoint": spec.entrypoint,
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        "WorkingDir": "/",
    })
}

/// Writes the OCI image layout of `spec` as a tar file at `out`.
pub fn build(spec: &ImageSpec, out: &Path) -> Result<BuiltImage> {
    if spec.name.is_empty() || spec.entrypoint.is_empty() {
        return Err(Error::Spec(
            "an image needs a name and an entrypoint".into(),
        ));
    }
    let layer = Blob::new(layer(spec)?);
    let image_config = image_config(spec);
    let config = Blob::new(
        serde_json::to_vec(&json!({
            "architecture": "amd64",
            "os": "linux",
            "config": image_config,
            "rootfs": {
                "type": "layers",
                // Uncompressed layer: its diff ID is its digest.
                "diff_ids": [format!("sha256:{}", layer.digest_hex)],
            },
            "history": [{ "created_by": "podha-sim image build" }],
        }))
        .map_err(|e| Error::Spec(format!("image config: {e}")))?,
    );
    let manifest = Blob::new(
        serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config.descriptor("application/vnd.oci.image.config.v1+json"),
            "layers": [layer.descriptor("application/vnd.oci.image.layer.v1.tar")],
        }))
        .map_err(|e| Error::Spec(format!("image manifest: {e}")))?,
    );
    let mut manifest_desc = manifest.descriptor("application/vnd.oci.image.manifest.v1+json");
    manifest_desc["annotations"] = json!({
        // containerd's importer names the image after this one when present.
        "io.containerd.image.name": spec.name,
        "org.opencontainers.image.ref.name": tag_of(&spec.name),
    });
    manifest_desc["platform"] = json!({ "architecture": "amd64", "os": "linux" });
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [manifest_desc],
    }))
    .map_err(|e| Error::Spec(format!("image index: {e}")))?;

    let mut tar = tar::Builder::new(Vec::new());
    append_file(
        &mut tar,
        "oci-layout",
        br#"{"imageLayoutVersion":"1.0.0"}"#,
        0o644,
    )?;
    append_file(&mut tar, "index.json", &index, 0o644)?;
    for dir in ["blobs", "blobs/sha256"] {
        append_dir(&mut tar, dir)?;
    }
    for blob in [&layer, &config, &manifest] {
        let path = format!("blobs/sha256/{}", blob.digest_hex);
        append_file(&mut tar, &path, &blob.bytes, 0o644)?;
    }
    let bytes = tar
        .into_inner()
        .map_err(|e| Error::io("finish the image tar", e))?;
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| Error::io(format!("create {}", parent.display()), e))?;
    }
    std::fs::write(out, bytes).map_err(|e| Error::io(format!("write {}", out.display()), e))?;
    Ok(BuiltImage {
        name: spec.name.clone(),
        manifest_digest: format!("sha256:{}", manifest.digest_hex),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(tar_bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
        let mut archive = tar::Archive::new(tar_bytes);
        archive
            .entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let path = e.path().unwrap().to_string_lossy().into_owned();
                let mut data = Vec::new();
                std::io::Read::read_to_end(&mut e, &mut data).unwrap();
                (path, data)
            })
            .collect()
    }

    #[test]
    fn file_spec_defaults_to_the_root_and_refuses_relative_paths() {
        let f: ImageFile = "/tmp/bin/pause".parse().unwrap();
        assert_eq!(f.path, "/pause");
        let f: ImageFile = "/tmp/bin/pause:/usr/bin/p".parse().unwrap();
        assert_eq!(
            (f.source, f.path.as_str()),
            ("/tmp/bin/pause".into(), "/usr/bin/p")
        );
        assert!("/tmp/x:rel".parse::<ImageFile>().is_err());
        assert!("/tmp/x:/a/../b".parse::<ImageFile>().is_err());
    }

    #[test]
    fn layout_is_complete_consistent_and_reproducible() {
        let dir = std::env::temp_dir().join(format!("podha-image-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bin = dir.join("hello");
        std::fs::write(&bin, b"#!/bin/true\n").unwrap();
        let spec = ImageSpec {
            name: "podha.io/test/hello:2".into(),
            files: vec![format!("{}:/usr/bin/hello", bin.display()).parse().unwrap()],
            entrypoint: vec!["/usr/bin/hello".into()],
        };
        let (a, b) = (dir.join("a.tar"), dir.join("b.tar"));
        let built = build(&spec, &a).unwrap();
        assert_eq!(build(&spec, &b).unwrap(), built);
        let bytes = std::fs::read(&a).unwrap();
        assert_eq!(bytes, std::fs::read(&b).unwrap());

        let files = entries(&bytes);
        let get = |p: &str| -> &Vec<u8> {
            &files
                .iter()
                .find(|(n, _)| n == p)
                .unwrap_or_else(|| panic!("{p} missing"))
                .1
        };
        let index: serde_json::Value = serde_json::from_slice(get("index.json")).unwrap();
        let m = &index["manifests"][0];
        assert_eq!(
            m["annotations"]["io.containerd.image.name"],
            "podha.io/test/hello:2"
        );
        assert_eq!(m["annotations"]["org.opencontainers.image.ref.name"], "2");
        assert_eq!(m["digest"], built.manifest_digest);
        // Every blob is stored under its own digest.
        for (name, data) in files
            .iter()
            .filter(|(n, _)| n.starts_with("blobs/sha256/") && !n.ends_with('/'))
        {
            assert_eq!(
                name.trim_start_matches("blobs/sha256/"),
                hex(&Sha256::digest(data))
            );
        }
        let manifest_hex = built.manifest_digest.trim_start_matches("sha256:");
        let manifest: serde_json::Value =
            serde_json::from_slice(get(&format!("blobs/sha256/{manifest_hex}"))).unwrap();
        let layer_digest = manifest["layers"][0]["digest"].as_str().unwrap();
        let layer = get(&format!(
            "blobs/sha256/{}",
            layer_digest.trim_start_matches("sha256:")
        ));
        let layer_files = entries(layer);
        let hello = layer_files
            .iter()
            .find(|(n, _)| n == "usr/bin/hello")
            .unwrap();
        assert_eq!(hello.1, b"#!/bin/true\n");
        assert!(layer_files.iter().any(|(n, _)| n == "proc/"));
        let config_hex = manifest["config"]["digest"]
            .as_str()
            .unwrap()
            .trim_start_matches("sha256:");
        let config: serde_json::Value =
            serde_json::from_slice(get(&format!("blobs/sha256/{config_hex}"))).unwrap();
        assert_eq!(config["rootfs"]["diff_ids"][0], layer_digest);
        assert_eq!(config["config"]["Entrypoint"][0], "/usr/bin/hello");
        assert!(config["config"].get("User").is_none());
        assert!(config["config"].get("Cmd").is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
