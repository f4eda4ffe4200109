//! Bind mounts with the mount(2) and umount2(2) system calls (through `nix`), so the plugin runs
//! from an image that holds nothing but its static binary. Needs root (CAP_SYS_ADMIN), as every
//! CSI node plugin does.

use std::io;
use std::path::Path;

use nix::mount::{MntFlags, MsFlags, mount, umount2};

fn sys(what: &str, path: &Path, result: nix::Result<()>) -> io::Result<()> {
    result.map_err(|e| io::Error::other(format!("{what} {}: {e}", path.display())))
}

/// Bind-mounts `source` onto `target` (created if missing); read-only when asked. Does nothing
/// when `target` is already a mount point (the CSI calls are idempotent).
pub fn bind(source: &Path, target: &Path, read_only: bool) -> io::Result<()> {
    std::fs::create_dir_all(target)?;
    if is_mount_point(target)? {
        return Ok(());
    }
    let none: Option<&str> = None;
    sys(
        "bind-mount onto",
        target,
        mount(Some(source), target, none, MsFlags::MS_BIND, none),
    )?;
    if read_only {
        // A bind mount takes the read-only flag only on a remount.
        let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
        sys(
            "remount read-only",
            target,
            mount(none, target, none, flags, none),
        )?;
    }
    Ok(())
}

/// Unmounts `target` if it is a mount point; a missing path is already unmounted.
pub fn unmount(target: &Path) -> io::Result<()> {
    if target.exists() && is_mount_point(target)? {
        sys("unmount", target, umount2(target, MntFlags::empty()))?;
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
