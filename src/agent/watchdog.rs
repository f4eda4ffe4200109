//! The node's watchdog: a device that resets the machine unless it is written to ("petted")
//! within its timeout. The agent pets it while the rule in [`super::isolation::pet_watchdog`]
//! allows; a node that hangs, or whose agent is frozen or killed, stops petting and is reset.
//! That is what makes podha's silence proof sound for a frozen node: its containers never thaw
//! into a cluster that moved their volumes.
//!
//! The device follows the Linux watchdog API (`/dev/watchdog`, e.g. `softdog` or a hardware
//! timer): opening arms it, any write pets it, and a write of `V` before closing disarms it
//! ("magic close"; a device built with `nowayout` ignores that and resets anyway). The agent
//! disarms it only when it stops on purpose (SIGTERM); a crashed agent leaves it armed. The
//! timeout is the device's (`softdog`'s `soft_margin`, the BIOS's, the sim's); the agent is
//! told it (`--watchdog-timeout`) and checks it against its isolation timeout.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::{error, info};

use super::{ArgsError, WatchdogError};

/// How long opening the device may take (a FIFO standing in for one opens once its reader is
/// there).
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Watchdog {
    path: PathBuf,
    device: std::fs::File,
    /// The device's timeout, as the agent was told it.
    timeout: Duration,
    /// Whether the last pet failed (logged once, not every second).
    failing: bool,
}

impl Watchdog {
    /// Opens (and so arms) the watchdog device at `path`, whose timeout is `timeout`.
    pub async fn open(path: &Path, timeout: Duration) -> Result<Self, WatchdogError> {
        let owned = path.to_path_buf();
        let open = tokio::task::spawn_blocking(move || {
            std::fs::OpenOptions::new().write(true).open(&owned)
        });
        let device = tokio::time::timeout(OPEN_TIMEOUT, open)
            .await
            .map_err(|_| WatchdogError::OpenTimedOut {
                path: path.to_path_buf(),
                after: OPEN_TIMEOUT,
            })?
            .map_err(|source| WatchdogError::OpenTask {
                path: path.to_path_buf(),
                source,
            })?
            .map_err(|source| WatchdogError::Open {
                path: path.to_path_buf(),
                source,
            })?;
        info!(watchdog = %path.display(), "watchdog armed");
        Ok(Self {
            path: path.to_path_buf(),
            device,
            timeout,
            failing: false,
        })
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.device.write_all(bytes)?;
        self.device.flush()
    }

    /// Pets the watchdog: it will not fire for another timeout.
    pub fn pet(&mut self) {
        match self.write(b"\n") {
            Ok(()) => self.failing = false,
            Err(e) if !self.failing => {
                error!(watchdog = %self.path.display(), error = %e, "cannot pet the watchdog: it will reset the node");
                self.failing = true;
            }
            Err(_) => {}
        }
    }

    /// Disarms the watchdog and closes it (the agent stops on purpose).
    pub fn disarm(mut self) {
        match self.write(b"V") {
            Ok(()) => info!(watchdog = %self.path.display(), "watchdog disarmed"),
            Err(e) => {
                error!(watchdog = %self.path.display(), error = %e, "cannot disarm the watchdog")
            }
        }
    }
}

/// Checks a watchdog timeout against the agent's other timings: short enough that a node that
/// stopped petting is reset before podha's silence proof (half the isolation timeout, so that
/// the survey that keeps it petted while podha hears nobody starts where a leader's silence is
/// told apart from one node's), long enough that a survey never starves it.
pub fn check_timeout(
    watchdog: Duration,
    isolation_timeout: Duration,
    check_interval: Duration,
    survey_limit: Duration,
) -> Result<(), ArgsError> {
    let shortest = check_interval + survey_limit;
    if watchdog <= shortest {
        return Err(ArgsError::WatchdogTooShort { watchdog, shortest });
    }
    if watchdog > isolation_timeout / 2 {
        return Err(ArgsError::WatchdogTooLong {
            watchdog,
            isolation_timeout,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watchdog_timeout_must_fit_between_a_survey_and_half_the_isolation_timeout() {
        let s = Duration::from_secs;
        // The default survey takes up to 6 s (5 s of batches, the last one's 1 s).
        assert!(check_timeout(s(10), s(30), s(1), s(6)).is_ok());
        assert!(check_timeout(s(15), s(30), s(1), s(6)).is_ok());
        let err = check_timeout(s(16), s(30), s(1), s(6))
            .unwrap_err()
            .to_string();
        assert!(err.contains("half the isolation timeout 30s"), "{err}");
        let err = check_timeout(s(7), s(30), s(1), s(6))
            .unwrap_err()
            .to_string();
        assert!(err.contains("longer than the check interval"), "{err}");
    }

    #[tokio::test]
    async fn pets_are_writes_and_a_disarm_is_a_v() {
        let dir = std::env::temp_dir().join(format!("podha-watchdog-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let device = dir.join("watchdog");
        std::fs::write(&device, "").expect("device");
        let mut dog = Watchdog::open(&device, Duration::from_secs(10))
            .await
            .expect("open");
        dog.pet();
        dog.pet();
        dog.disarm();
        assert_eq!(std::fs::read_to_string(&device).expect("read"), "\n\nV");
        let err = Watchdog::open(&dir.join("missing"), Duration::from_secs(10))
            .await
            .err()
            .expect("no such device")
            .to_string();
        assert!(err.contains("cannot open the watchdog"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
