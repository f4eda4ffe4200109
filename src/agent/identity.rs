//! The agent's key: what signs its words (see `crate::contract::words`), one per boot of its
//! node.
//!
//! Kept beside the hearing file (`<file>.key`, readable by the agent alone), as a record naming
//! its boot (see [`super::boot`]): an agent restarted in the same boot signs with the same key,
//! so its peers, which learn keys only when they next read the peer list, keep verifying its
//! answers. A new boot, a record that cannot be placed, read or parsed, all make a new key,
//! which the agent publishes on its Node with its advert.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use tracing::{info, warn};

use super::boot::{RecordBoot, boot_line};
use crate::contract::{Identity, KeyError};

/// The key kept at `path` for boot `boot`, or a new one, kept there for the next agent.
pub fn load_or_create(path: &Path, boot: Option<&str>) -> Result<Identity, KeyError> {
    if let Some(kept) = load(path, boot) {
        info!(file = %path.display(), key = %kept.public(), "signing with this boot's key");
        return Ok(kept);
    }
    let identity = Identity::generate()?;
    let saved = keep(path, boot, &identity);
    match saved {
        Ok(()) => info!(file = %path.display(), key = %identity.public(), "signing with a new key"),
        Err(e) => warn!(file = %path.display(), error = %e, key = %identity.public(),
            "signing with a new key that cannot be kept: the next agent of this boot makes another, which its peers learn only when they next read the peer list"),
    }
    Ok(identity)
}

/// Written whole to `<path>.new`, readable by its owner alone from its creation, then renamed
/// over the old record.
fn keep(path: &Path, boot: Option<&str>, identity: &Identity) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    let record = format!(
        "{}\n{}\n",
        boot_line(boot),
        STANDARD.encode(identity.pkcs8())
    );
    file.write_all(record.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

fn load(path: &Path, boot: Option<&str>) -> Option<Identity> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            warn!(file = %path.display(), error = %e, "cannot read the kept key; making a new one");
            return None;
        }
    };
    let mut lines = text.lines();
    if RecordBoot::of(lines.next(), boot) != RecordBoot::This {
        return None;
    }
    let parsed = lines
        .next()
        .and_then(|line| STANDARD.decode(line.trim()).ok())
        .map(|pkcs8| Identity::from_pkcs8(&pkcs8));
    match parsed {
        Some(Ok(identity)) => Some(identity),
        _ => {
            warn!(file = %path.display(), "the kept key is garbled; making a new one");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn an_agent_keeps_its_key_for_the_boot_and_no_longer() {
        let dir = std::env::temp_dir().join(format!("podha-agent-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("heard.key");
        let first = load_or_create(&path, Some("b1")).expect("key").public();
        let mode = std::fs::metadata(&path).expect("kept").permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "readable by the agent alone");
        assert_eq!(
            load_or_create(&path, Some("b1")).expect("key").public(),
            first,
            "restarted in the same boot: the same key"
        );
        let rebooted = load_or_create(&path, Some("b2")).expect("key").public();
        assert_ne!(rebooted, first, "a new boot: a new key");
        assert_ne!(
            load_or_create(&path, None).expect("key").public(),
            rebooted,
            "a boot it cannot tell: a new key"
        );
        std::fs::write(&path, "boot=b3\nnot a key\n").expect("write");
        let fresh = load_or_create(&path, Some("b3")).expect("a garbled record makes a new key");
        assert_eq!(
            load_or_create(&path, Some("b3")).expect("key").public(),
            fresh.public()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
