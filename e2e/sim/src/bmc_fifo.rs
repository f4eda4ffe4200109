//! The two FIFOs a BMC stand-in is driven through, read on the host, outside the node they
//! power (a frozen node does not freeze its BMC): the sim's BMCs (`cluster::bmc`) and the kind
//! kit's (`kind_bmc`) read them alike.
//!
//! - `watchdog` stands in for the node's `/dev/watchdog`, with the Linux watchdog's rules: the
//!   first write arms it, any write pets it, a `V` before the writer closes disarms it;
//!   unpetted for its timeout, the node is to be powered off. The node's podha agent pets it
//!   (`--watchdog … --watchdog-stand-in`).
//! - `power` takes `off`: the agent's fence (`--fence write:<dir>/power=off`), what a site's
//!   fence command does through IPMI or Redfish.
//!
//! What a BMC powered off, and why, goes to a fence log ([`append_fence`]).

use std::fs::File;
use std::io::{ErrorKind, Read as _, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tracing::warn;

use crate::cluster::{Error, Result};

/// The watchdog's state, fed what its FIFO delivers.
#[derive(Debug, Default)]
struct Watchdog {
    /// Last pet while armed.
    petted: Option<Instant>,
    /// The last write held a `V`: a close now disarms.
    magic: bool,
}

impl Watchdog {
    fn wrote(&mut self, bytes: &[u8], now: Instant) {
        self.petted = Some(now);
        self.magic = bytes.contains(&b'V');
    }

    /// The writer closed the device.
    fn closed(&mut self) {
        if self.magic {
            self.petted = None;
            self.magic = false;
        }
    }

    /// How long it has not been petted while armed.
    fn unpetted_for(&self, now: Instant) -> Option<Duration> {
        self.petted.map(|at| now.saturating_duration_since(at))
    }
}

/// A BMC's watchdog and power control, read through their FIFOs in one directory.
pub struct Controls {
    watchdog_fifo: File,
    power_fifo: File,
    watchdog: Watchdog,
    /// Without it the node has no watchdog: what its FIFO gets is ignored.
    timeout: Option<Duration>,
    /// Powered off, and the watchdog's writer (the agent of the boot that ended) not yet seen
    /// gone: what the FIFOs still deliver was written before the power-off, and is dropped.
    off: bool,
}

impl Controls {
    /// Makes both FIFOs in `dir` (there already: kept), before the node boots: its agent opens
    /// the watchdog.
    pub fn create(dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        mkfifo(&dir.join("watchdog"))?;
        mkfifo(&dir.join("power"))
    }

    /// Opens both FIFOs in `dir` for reading, without waiting for a writer.
    pub fn open(dir: &Path, timeout: Option<Duration>) -> Result<Self> {
        Ok(Self {
            watchdog_fifo: open_fifo(&dir.join("watchdog"))?,
            power_fifo: open_fifo(&dir.join("power"))?,
            watchdog: Watchdog::default(),
            timeout,
            off: false,
        })
    }

    /// One look at both FIFOs at `now`: why node `node` is to be powered off, if it is.
    pub fn look(&mut self, node: &str, now: Instant) -> Result<Option<String>> {
        let pets = read_fifo(&mut self.watchdog_fifo)?;
        let power = read_fifo(&mut self.power_fifo)?;
        if self.off {
            self.off = !matches!(pets, Got::Closed);
            return Ok(None);
        }
        match pets {
            Got::Bytes(bytes) => self.watchdog.wrote(&bytes, now),
            Got::Closed => self.watchdog.closed(),
            Got::Nothing => {}
        }
        if let Got::Bytes(bytes) = power {
            let said = String::from_utf8_lossy(&bytes).trim().to_string();
            if said == "off" {
                return Ok(Some("powered off by its podha agent".to_string()));
            }
            warn!(node, said, "the BMC's power control takes only \"off\"");
        }
        if let Some(silent) = self.watchdog.unpetted_for(now)
            && let Some(timeout) = self.timeout
            && silent > timeout
        {
            return Ok(Some(format!(
                "watchdog: not petted for {}",
                humantime::format_duration(Duration::from_millis(silent.as_millis() as u64))
            )));
        }
        Ok(None)
    }

    /// The node is off: its watchdog stays disarmed until its next boot's agent writes to it.
    /// What the FIFOs hold from before (a pet, an `off` written as the node was killed) is
    /// dropped until the last boot's agent is seen gone.
    pub fn powered_off(&mut self) {
        self.watchdog = Watchdog::default();
        self.off = true;
    }
}

/// Appends a fence of node `node` to the fence log `log`: one line, `<unix ms> <node> <reason>`.
pub fn append_fence(log: &Path, node: &str, reason: &str) -> Result<()> {
    let at_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let line = format!("{at_ms} {node} {}\n", reason.replace('\n', " "));
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .and_then(|mut f| f.write_all(line.as_bytes()))
        .map_err(|e| Error::io(format!("append to {}", log.display()), e))
}

fn mkfifo(path: &Path) -> Result<()> {
    match nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600)) {
        Ok(()) | Err(nix::errno::Errno::EEXIST) => Ok(()),
        Err(e) => Err(Error::Other(format!("mkfifo {}: {e}", path.display()))),
    }
}

fn open_fifo(path: &Path) -> Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| Error::io(format!("open {}", path.display()), e))
}

/// What one read of a FIFO gave.
enum Got {
    Bytes(Vec<u8>),
    /// No writer has it open.
    Closed,
    Nothing,
}

fn read_fifo(file: &mut File) -> Result<Got> {
    let mut buf = [0u8; 512];
    match file.read(&mut buf) {
        Ok(0) => Ok(Got::Closed),
        Ok(n) => Ok(Got::Bytes(buf[..n].to_vec())),
        Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(Got::Nothing),
        Err(e) => Err(Error::io("read a BMC FIFO", e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_fence_is_one_line_naming_its_node() {
        let dir = std::env::temp_dir().join(format!("podha-fence-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let log = dir.join("fences.log");
        append_fence(
            &log,
            "podha-chaos-worker2",
            "powered off: watchdog: not petted for 6s",
        )
        .expect("record");
        append_fence(
            &log,
            "podha-chaos-worker",
            "off already: powered off by its podha agent",
        )
        .expect("record");
        let text = std::fs::read_to_string(&log).expect("log");
        let nodes: Vec<&str> = text
            .lines()
            .map(|l| l.split(' ').nth(1).expect("node"))
            .collect();
        assert_eq!(nodes, ["podha-chaos-worker2", "podha-chaos-worker"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_fifo_reads_as_closed_until_a_writer_opens_it_and_after_it_closes() {
        let dir = std::env::temp_dir().join(format!("podha-bmc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("watchdog");
        mkfifo(&path).expect("mkfifo");
        mkfifo(&path).expect("a second mkfifo finds it there");
        let mut reader = open_fifo(&path).expect("open without a writer");
        assert!(matches!(read_fifo(&mut reader), Ok(Got::Closed)));
        let mut writer = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("writer");
        assert!(matches!(read_fifo(&mut reader), Ok(Got::Nothing)));
        std::io::Write::write_all(&mut writer, b"\nV").expect("write");
        match read_fifo(&mut reader) {
            Ok(Got::Bytes(b)) => assert_eq!(b, b"\nV"),
            _ => panic!("the bytes written"),
        }
        drop(writer);
        assert!(matches!(read_fifo(&mut reader), Ok(Got::Closed)));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_watchdog_arms_on_the_first_write_and_only_a_v_disarms_it() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut w = Watchdog::default();
        assert_eq!(w.unpetted_for(t0), None, "not armed before a write");
        w.closed();
        w.wrote(b"\n", t0);
        assert_eq!(w.unpetted_for(t0 + s(3)), Some(s(3)));
        w.closed();
        assert_eq!(
            w.unpetted_for(t0 + s(4)),
            Some(s(4)),
            "a crash keeps it armed"
        );
        w.wrote(b"V", t0 + s(5));
        w.closed();
        assert_eq!(w.unpetted_for(t0 + s(9)), None, "magic close");
        w.wrote(b"V", t0 + s(10));
        w.wrote(b"\n", t0 + s(11));
        w.closed();
        assert_eq!(
            w.unpetted_for(t0 + s(12)),
            Some(s(1)),
            "a pet after the V takes the magic back"
        );
    }

    #[test]
    fn controls_power_off_on_off_or_an_unpetted_watchdog_and_disarm_once_off() {
        let dir = std::env::temp_dir().join(format!("podha-bmc-controls-{}", std::process::id()));
        Controls::create(&dir).expect("create");
        let mut controls = Controls::open(&dir, Some(Duration::from_secs(2))).expect("open");
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let open = |name: &str| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join(name))
                .expect("writer")
        };
        let mut pets = open("watchdog");
        std::io::Write::write_all(&mut pets, b"\n").expect("pet");
        assert_eq!(controls.look("n", t0).expect("look"), None);
        assert_eq!(controls.look("n", t0 + s(2)).expect("look"), None);
        let why = controls.look("n", t0 + s(3)).expect("look");
        assert!(
            why.as_deref().is_some_and(|w| w.starts_with("watchdog")),
            "{why:?}"
        );
        controls.powered_off();
        // A pet written as the node was killed is dropped: it does not arm the watchdog again.
        std::io::Write::write_all(&mut pets, b"\n").expect("pet");
        assert_eq!(controls.look("n", t0 + s(4)).expect("look"), None);
        drop(pets);
        for at in [5, 30] {
            assert_eq!(
                controls.look("n", t0 + s(at)).expect("look"),
                None,
                "off, it waits for the next boot's first pet"
            );
        }
        let mut next_boot = open("watchdog");
        std::io::Write::write_all(&mut next_boot, b"\n").expect("pet");
        assert_eq!(controls.look("n", t0 + s(31)).expect("look"), None);
        assert!(
            controls.look("n", t0 + s(34)).expect("look").is_some(),
            "the next boot's pet arms it"
        );
        controls.powered_off();
        drop(next_boot);
        assert_eq!(controls.look("n", t0 + s(35)).expect("look"), None);
        let mut power = open("power");
        std::io::Write::write_all(&mut power, b"on\n").expect("write");
        assert_eq!(controls.look("n", t0 + s(31)).expect("look"), None);
        std::io::Write::write_all(&mut power, b"off\n").expect("write");
        assert_eq!(
            controls.look("n", t0 + s(32)).expect("look").as_deref(),
            Some("powered off by its podha agent")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
