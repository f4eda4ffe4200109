//! The boot the agent runs in, and which boot a record the agent keeps for its successors
//! (the hearing file, the saved peer list) was written in.
//!
//! Those records live where a pod replacement keeps them (the chart: a directory under the
//! node's /run). Each names the boot it was written in (`boot=<ID>`, the kernel's boot ID), and
//! only a record of this boot counts: a reboot is a fence, and what an agent knew before it is
//! no longer true. A record that names no boot (written before records named one, or by an
//! agent that could not read its boot ID), or read by an agent that cannot read its own, cannot
//! be placed: each record says what that means for it, always the side that fences.

use std::path::Path;

use tracing::warn;

/// How a record names its boot: its first line, `boot=<ID>` (empty when the writer had none).
pub const BOOT_LINE: &str = "boot=";

/// The boot ID the agent runs in, read from `file` (what the kubelet reports as
/// `nodeInfo.bootID`); `None` if it cannot be read.
pub fn boot_id(file: &Path) -> Option<String> {
    match std::fs::read_to_string(file) {
        Ok(id) if !id.trim().is_empty() => Some(id.trim().to_string()),
        Ok(_) => {
            warn!(file = %file.display(), "the boot ID file is empty: every fence request will be carried out, and what an earlier agent recorded counts as of an unknown boot");
            None
        }
        Err(e) => {
            warn!(file = %file.display(), error = %e, "no boot ID: every fence request will be carried out, and what an earlier agent recorded counts as of an unknown boot");
            None
        }
    }
}

/// The line that names the boot a record is written in.
pub fn boot_line(boot: Option<&str>) -> String {
    format!("{BOOT_LINE}{}", boot.unwrap_or_default())
}

/// Writes a record of boot `boot` (its boot line, then `body`) to `path`: whole to
/// `<path>.new`, then renamed over the old one, so a crash mid-write leaves the old record.
pub fn write_record(path: &Path, boot: Option<&str>, body: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    std::fs::write(&tmp, format!("{}\n{body}", boot_line(boot)))?;
    std::fs::rename(&tmp, path)
}

/// Which boot a record was written in, from its boot line, as the agent of boot `mine` sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordBoot {
    /// This boot.
    This,
    /// Another boot: what it says is no longer true.
    Other,
    /// No boot line, an empty one, or the agent does not know its own boot.
    CannotTell,
}

impl RecordBoot {
    /// Where the record names its boot: `line`, its first line.
    pub fn of(line: Option<&str>, mine: Option<&str>) -> Self {
        let recorded = line
            .and_then(|l| l.trim().strip_prefix(BOOT_LINE))
            .filter(|id| !id.is_empty());
        match (recorded, mine) {
            (Some(recorded), Some(mine)) if recorded == mine => Self::This,
            (Some(_), Some(_)) => Self::Other,
            _ => Self::CannotTell,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_boot_id_is_the_files_trimmed_and_none_when_unreadable_or_empty() {
        let dir = std::env::temp_dir().join(format!("podha-boot-id-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("boot_id");
        std::fs::write(&file, "0d1e-42\n").expect("write");
        assert_eq!(boot_id(&file).as_deref(), Some("0d1e-42"));
        std::fs::write(&file, " \n").expect("write");
        assert_eq!(boot_id(&file), None);
        assert_eq!(boot_id(&dir.join("missing")), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_record_is_of_this_boot_only_if_it_names_the_boot_the_agent_runs_in() {
        let of = RecordBoot::of;
        assert_eq!(
            of(Some(&boot_line(Some("b1"))), Some("b1")),
            RecordBoot::This
        );
        assert_eq!(of(Some("boot=b0\n"), Some("b1")), RecordBoot::Other);
        assert_eq!(
            of(Some(&boot_line(None)), Some("b1")),
            RecordBoot::CannotTell
        );
        assert_eq!(
            of(Some("1800000000000"), Some("b1")),
            RecordBoot::CannotTell
        );
        assert_eq!(of(None, Some("b1")), RecordBoot::CannotTell);
        assert_eq!(of(Some("boot=b1"), None), RecordBoot::CannotTell);
    }
}
