//! Bind mounts with the system's mount(8)/umount(8) (util-linux), so the crate needs no unsafe
//! code. Needs root (CAP_SYS_ADMIN), as every CSI node plugin does.

use std::io;
use std::path::Path;
use std::process::Command;

fn run(command: &mut Command) -> io::Result<()> {
    let output = command.output()?;
    if output.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{:?}: {}",
            command,
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

/// Bind-mounts `source` onto `target` (created if missing); read-only when asked. Does nothing
/// when `target` is already a mount point (the CSI calls are idempotent).
pub fn bind(source: &Path, target: &Path, read_only: bool) -> io::Result<()> {
    std::fs::create_dir_all(target)?;
    if is_mount_point(target)? {
        return Ok(());
    }
    run(Command::new("mount").arg("--bind").arg(source).arg(target))?;
    if read_only {
        run(Command::new("mount")
            .args(["-o", "remount,bind,ro"])
            .arg(target))?;
    }
    Ok(())
}

/// Unmounts `target` if it is a mount point; a missing path is already unmounted.
pub fn unmount(target: &Path) -> io::Result<()> {
    if target.exists() && is_mount_point(target)? {
        run(Command::new("umount").arg(target))?;
    }
    Ok(())
}

/// Whether `path` is a mount point, from /proc/self/mountinfo (field 5, octal escapes).
pub fn is_mount_point(path: &Path) -> io::Result<bool> {
    let path = match std::fs::canonicalize(path) {
        Ok(path) => path,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let wanted = path.to_string_lossy();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .any(|point| unescape(point) == wanted))
}

fn unescape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut chars = field.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let code: String = chars.by_ref().take(3).collect();
            match u8::from_str_radix(&code, 8) {
                Ok(byte) => out.push(byte as char),
                Err(_) => {
                    out.push('\\');
                    out.push_str(&code);
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape(r"/var/lib/a\040b"), "/var/lib/a b");
        assert_eq!(unescape("/plain"), "/plain");
    }
}
