//! The agent's key: what signs its words (see `crate::contract::words`).
//!
//! Made at the agent's first start and kept in `--key-file` (readable by the agent alone),
//! where the chart keeps it across reboots: the node's key changes only when the file goes, so
//! its peers, which learn keys when they next read the peer list (every 30 s), keep verifying
//! its answers through its restarts and reboots. A file that cannot be read or parsed makes a
//! new key, which the agent publishes on its Node with its advert; until its peers read it,
//! its answers to them count as none, and theirs to it.

use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use tracing::{info, warn};

use crate::contract::{Identity, KeyError};

/// The key kept at `path`, or a new one, kept there for the next agent.
pub fn load_or_create(path: &Path) -> Result<Identity, KeyError> {
    if let Some(kept) = load(path) {
        info!(file = %path.display(), key = %kept.public(), "signing with the node's key");
        return Ok(kept);
    }
    let identity = Identity::generate()?;
    let saved = keep(path, &identity);
    match saved {
        Ok(()) => info!(file = %path.display(), key = %identity.public(), "signing with a new key"),
        Err(e) => warn!(file = %path.display(), error = %e, key = %identity.public(),
            "signing with a new key that cannot be kept: the next agent makes another, which its peers learn only when they next read the peer list"),
    }
    Ok(identity)
}

/// Kept readable by its owner alone: a fence (a reset) right after the first start must not
/// lose the key the Node already advertises (see `boot::write_durably`).
fn keep(path: &Path, identity: &Identity) -> std::io::Result<()> {
    let record = format!("{}\n", STANDARD.encode(identity.pkcs8()));
    super::boot::write_durably(path, &record, 0o600)
}

fn load(path: &Path) -> Option<Identity> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            warn!(file = %path.display(), error = %e, "cannot read the kept key; making a new one");
            return None;
        }
    };
    let parsed = STANDARD
        .decode(text.trim())
        .ok()
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
    fn an_agent_keeps_its_key_until_the_file_goes() {
        let dir = std::env::temp_dir().join(format!("podha-agent-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("key");
        let first = load_or_create(&path).expect("key").public();
        let mode = std::fs::metadata(&path).expect("kept").permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "readable by the agent alone");
        assert_eq!(
            load_or_create(&path).expect("key").public(),
            first,
            "restarted, or rebooted: the same key"
        );
        std::fs::remove_file(&path).expect("remove");
        let rotated = load_or_create(&path).expect("key").public();
        assert_ne!(rotated, first, "the file removed: a new key");
        std::fs::write(&path, "not a key\n").expect("write");
        let fresh = load_or_create(&path).expect("a garbled file makes a new key");
        assert_eq!(load_or_create(&path).expect("key").public(), fresh.public());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
