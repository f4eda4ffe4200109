//! The real nodes' images: `podha-pause` (the sandbox image, [`PAUSE_IMAGE`]) and `podha-csi`
//! (the test CSI driver and its writer, under the name its manifests run). `make node-images`
//! builds both with Docker from `e2e/images/Dockerfile` and saves them (`docker save`) as
//! `podha-pause.tar` and `podha-csi.tar` in one directory. A new cluster checks that each tar
//! holds the image it expects, copies them into [`cluster_images_dir`], and every real node
//! imports them at boot (`ctr -n k8s.io images import`), as `kind load` does for kind's nodes.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::{PAUSE_IMAGE, csi};
use crate::cluster::{Error, Result};

/// The tars every real node imports at boot: the cluster's copy of the node images.
pub fn cluster_images_dir(cluster_dir: &Path) -> PathBuf {
    cluster_dir.join("images")
}

/// `$PODHA_NODE_IMAGES_DIR`, else where `make node-images` saves the images, found from the
/// podha-sim executable (`target/<profile>/podha-sim` → `target/images`).
pub fn default_dir(sim_exe: &Path) -> PathBuf {
    if let Some(dir) = std::env::var_os("PODHA_NODE_IMAGES_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    sim_exe
        .ancestors()
        .find(|a| a.file_name().is_some_and(|n| n == "target"))
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("target"))
        .join("images")
}

/// The node images: (tar file name, the image it must hold).
fn expected() -> Result<[(&'static str, String); 2]> {
    Ok([
        ("podha-pause.tar", PAUSE_IMAGE.to_string()),
        ("podha-csi.tar", csi::csi_image()?),
    ])
}

/// Every node image is in `dir` and holds the image it is named for; else an error naming what
/// is missing or wrong and how to get it.
pub fn check(dir: &Path) -> Result<()> {
    let mut problems = Vec::new();
    for (file, image) in expected()? {
        let tar = dir.join(file);
        if !tar.is_file() {
            problems.push(format!("{} is missing", tar.display()));
            continue;
        }
        match repo_tags(&tar) {
            Ok(tags) if tags.contains(&image) => {}
            Ok(tags) => problems.push(format!(
                "{} holds {}, not {image}",
                tar.display(),
                if tags.is_empty() {
                    "no tagged image".to_string()
                } else {
                    tags.join(", ")
                }
            )),
            Err(e) => problems.push(e),
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(Error::Other(format!(
        "the real nodes' images: {}: run `make node-images` (or set PODHA_NODE_IMAGES_DIR; the \
         names it builds are the Makefile's PAUSE_IMAGE and CSI_IMAGE)",
        problems.join("; ")
    )))
}

/// Copies the node images from `dir` (checked by [`check`]) into the cluster's directory.
pub fn copy_into_cluster(dir: &Path, cluster_dir: &Path) -> Result<()> {
    let to = cluster_images_dir(cluster_dir);
    std::fs::create_dir_all(&to).map_err(|e| Error::io(format!("create {}", to.display()), e))?;
    for (file, _) in expected()? {
        std::fs::copy(dir.join(file), to.join(file))
            .map_err(|e| Error::io(format!("copy {} into {}", file, to.display()), e))?;
    }
    Ok(())
}

/// `tar` is a `docker save` archive holding `image`; else an error naming what it holds and
/// the make target that builds it.
pub fn check_holds(tar: &Path, image: &str, make_target: &str) -> Result<()> {
    let problem = match repo_tags(tar) {
        Ok(tags) if tags.iter().any(|t| t == image) => return Ok(()),
        Ok(tags) => format!("{} holds {}, not {image}", tar.display(), tags.join(", ")),
        Err(_) if !tar.is_file() => format!("{} is missing", tar.display()),
        Err(e) => e,
    };
    Err(Error::Other(format!("{problem}: run `make {make_target}`")))
}

/// The image names a `docker save` archive holds: the `RepoTags` of its `manifest.json` (Docker
/// writes it in both its own layout and the OCI layout of Docker 25 and later).
fn repo_tags(tar: &Path) -> Result<Vec<String>, String> {
    let what = |e: &dyn std::fmt::Display| format!("{}: {e}", tar.display());
    let file = std::fs::File::open(tar).map_err(|e| what(&e))?;
    let mut archive = tar::Archive::new(file);
    for entry in archive.entries().map_err(|e| what(&e))? {
        let mut entry = entry.map_err(|e| what(&e))?;
        if entry.path().map_err(|e| what(&e))?.as_os_str() != "manifest.json" {
            continue;
        }
        let mut json = String::new();
        entry.read_to_string(&mut json).map_err(|e| what(&e))?;
        let manifest: Vec<ManifestEntry> = serde_json::from_str(&json)
            .map_err(|e| what(&format!("manifest.json is not a Docker manifest: {e}")))?;
        return Ok(manifest
            .into_iter()
            .flat_map(|m| m.repo_tags.unwrap_or_default())
            .collect());
    }
    Err(what(&"no manifest.json: not an archive of `docker save`"))
}

#[derive(serde::Deserialize)]
struct ManifestEntry {
    #[serde(rename = "RepoTags")]
    repo_tags: Option<Vec<String>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_archive(path: &Path, files: &[(&str, &str)]) {
        let mut builder = tar::Builder::new(std::fs::File::create(path).unwrap());
        for (name, content) in files {
            let mut header = tar::Header::new_gnu();
            header.set_size(content.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            builder
                .append_data(&mut header, name, content.as_bytes())
                .unwrap();
        }
        builder.finish().unwrap();
    }

    fn saved(image: &str) -> String {
        format!(r#"[{{"Config":"c.json","RepoTags":["{image}"],"Layers":["l/layer.tar"]}}]"#)
    }

    #[test]
    fn a_docker_save_archive_names_its_images() {
        let dir = tempfile::tempdir().unwrap();
        let tar = dir.path().join("x.tar");
        write_archive(
            &tar,
            &[("l/layer.tar", "..."), ("manifest.json", &saved("a/b:1"))],
        );
        assert_eq!(repo_tags(&tar).unwrap(), ["a/b:1"]);
    }

    #[test]
    fn an_archive_without_a_manifest_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let tar = dir.path().join("x.tar");
        write_archive(&tar, &[("index.json", "{}")]);
        let err = repo_tags(&tar).unwrap_err();
        assert!(err.contains("not an archive of `docker save`"), "{err}");
    }

    #[test]
    fn check_names_missing_and_wrong_images_and_the_make_target() {
        let dir = tempfile::tempdir().unwrap();
        write_archive(
            &dir.path().join("podha-pause.tar"),
            &[("manifest.json", &saved("podha.io/sim/pause:0"))],
        );
        let err = check(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("podha-pause.tar holds podha.io/sim/pause:0, not podha.io/sim/pause:1"),
            "{err}"
        );
        assert!(err.contains("podha-csi.tar is missing"), "{err}");
        assert!(err.contains("run `make node-images`"), "{err}");
    }

    #[test]
    fn checked_images_are_copied_into_the_cluster() {
        let dir = tempfile::tempdir().unwrap();
        for (file, image) in expected().unwrap() {
            write_archive(&dir.path().join(file), &[("manifest.json", &saved(&image))]);
        }
        check(dir.path()).unwrap();
        let cluster = tempfile::tempdir().unwrap();
        copy_into_cluster(dir.path(), cluster.path()).unwrap();
        let copied = cluster_images_dir(cluster.path());
        assert!(copied.join("podha-pause.tar").is_file());
        assert_eq!(
            repo_tags(&copied.join("podha-csi.tar")).unwrap(),
            [csi::csi_image().unwrap()]
        );
    }
}
