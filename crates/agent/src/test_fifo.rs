//! A stand-in's BMC for tests: a FIFO the watchdog stand-in writes to.

/// A FIFO made at `path`, and its reader, open without waiting for a writer: a BMC that a
/// watchdog stand-in writes to, gone once the reader is dropped.
pub fn fifo_with_reader(path: &std::path::Path) -> std::fs::File {
    use std::os::unix::fs::OpenOptionsExt as _;
    let _ = std::fs::remove_file(path);
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo");
    assert!(made.success(), "mkfifo {}", path.display());
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(path)
        .expect("the FIFO's reader")
}
