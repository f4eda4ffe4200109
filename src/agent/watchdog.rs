//! The node's watchdog: a device that resets the machine unless it is written to ("petted")
//! within its timeout. The agent pets it while the rule in [`super::isolation::pet_watchdog`]
//! allows; a node that hangs, or whose agent is frozen or killed, stops petting and is reset.
//! That is what makes podha's silence proof sound for a frozen node: its containers never thaw
//! into a cluster that moved their volumes.
//!
//! The device follows the Linux watchdog API (`/dev/watchdog`, e.g. `softdog` or a hardware
//! timer): opening arms it, any write pets it, and a write of `V` before closing disarms it
//! ("magic close"). The agent disarms it only when it stops on purpose (SIGTERM); a crashed
//! agent leaves it armed.
//!
//! What the agent takes of the file at `--watchdog` ([`Watchdog::open`]):
//! - **A character device** is asked, not trusted: its timeout is what the agent's pets, its
//!   [`check_timeout`] and the `fenced_within` it advertises rest on.
//!   - Before it is opened (which arms it), sysfs must show that its driver has no
//!     `nowayout`: such a device never disarms, and every stop of the agent (a rollout, an
//!     uninstall) would reset the node. When sysfs cannot tell, the device is refused too
//!     ([`refuse_nowayout`]): every driver of the kernel's watchdog core has the attribute.
//!   - It must have magic close (`WDIOC_GETSUPPORT`): without it any close disarms it, a
//!     crashed or killed agent's too, and the node would run on while podha counts it reset.
//!   - Its timeout is set to `--watchdog-timeout`, rounded up to whole seconds, when the
//!     device can set it, and read back (the driver may round it); a device that cannot set it
//!     must already have that timeout. The timeout read back is the one the agent goes by;
//!     one that [`check_timeout`] refuses is refused ([`settle`]).
//!
//!   A device refused once open is disarmed and closed: the agent stops without arming it.
//! - **A FIFO or a regular file** stands in for a device (the sim's BMC watchdog is a FIFO, as
//!   no test may open a real one): it has no ioctls, and its timeout is `--watchdog-timeout`,
//!   as declared.

use std::io::Write as _;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use podha_watchdog_device::{self as device, DeviceNumber, Support};
use tracing::{error, info, warn};

use super::{ArgsError, WatchdogError, WatchdogRefusal};

/// How long opening the device may take (a FIFO standing in for one opens once its reader is
/// there).
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);

/// Where sysfs is mounted (in the agent's container too).
const SYS: &str = "/sys";

pub struct Watchdog {
    path: PathBuf,
    device: std::fs::File,
    /// The timeout the agent goes by: a device's, read back from it; a stand-in's, declared.
    timeout: Duration,
    /// Whether the last pet failed (logged once, not every second).
    failing: bool,
}

/// The agent's timings a watchdog timeout must fit (see [`check_timeout`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub isolation_timeout: Duration,
    pub check_interval: Duration,
    pub survey_limit: Duration,
}

impl Bounds {
    pub fn check(&self, watchdog: Duration) -> Result<(), ArgsError> {
        self.check_span(watchdog, watchdog)
    }

    /// Checks a watchdog that resets the node between `earliest` and `latest` after its last
    /// pet: the earliest must outlast a survey, the latest fit the isolation timeout.
    pub fn check_span(&self, earliest: Duration, latest: Duration) -> Result<(), ArgsError> {
        check_timeout(
            earliest,
            self.isolation_timeout,
            self.check_interval,
            self.survey_limit,
        )?;
        check_timeout(
            latest,
            self.isolation_timeout,
            self.check_interval,
            self.survey_limit,
        )
    }
}

/// How many of its timeouts a device may let pass unpetted before the machine resets: some
/// boards reset only at an iTCO watchdog's second timeout (the kernel's `iTCO_wdt` reports
/// one), so the agent counts two for it.
pub fn timeouts_to_reset(identity: &str) -> u32 {
    if identity == "iTCO_wdt" { 2 } else { 1 }
}

/// What the file at `--watchdog` is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A character device, with its numbers: a watchdog device, asked for its timeout.
    Device(DeviceNumber),
    /// A FIFO or a regular file standing in for a device: its timeout is the declared one.
    StandIn,
}

/// What the file at `path` is (without opening it).
fn kind(path: &Path) -> Result<Kind, WatchdogError> {
    let meta = std::fs::metadata(path).map_err(|source| WatchdogError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let file_type = meta.file_type();
    if file_type.is_char_device() {
        Ok(Kind::Device(DeviceNumber::from_rdev(meta.rdev())))
    } else if file_type.is_fifo() || file_type.is_file() {
        Ok(Kind::StandIn)
    } else {
        Err(WatchdogError::NotAWatchdogFile {
            path: path.to_path_buf(),
        })
    }
}

/// Opens the file at `path` for writing: a device is armed from then on.
async fn open_file(path: &Path) -> Result<std::fs::File, WatchdogError> {
    let owned = path.to_path_buf();
    let open =
        tokio::task::spawn_blocking(move || std::fs::OpenOptions::new().write(true).open(&owned));
    tokio::time::timeout(OPEN_TIMEOUT, open)
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
        })
}

/// `--watchdog-timeout` in the whole seconds the watchdog API counts, rounded up (9.5s asks
/// for 10s): what the device took is checked against the agent's bounds all the same.
pub fn whole_seconds(requested: Duration) -> u32 {
    let secs = requested
        .as_secs()
        .saturating_add(u64::from(requested.subsec_nanos() > 0));
    u32::try_from(secs).unwrap_or(u32::MAX)
}

/// Whether the agent may open a watchdog device whose driver's `nowayout` sysfs says this:
/// only when it says the device can be disarmed.
pub fn refuse_nowayout(nowayout: Result<bool, device::Error>) -> Result<(), WatchdogRefusal> {
    match nowayout {
        Ok(false) => Ok(()),
        Ok(true) => Err(WatchdogRefusal::Nowayout),
        Err(source) => Err(WatchdogRefusal::NowayoutUnknown { source }),
    }
}

fn refuse_without_magic_close(support: &Support) -> Result<(), WatchdogRefusal> {
    if support.has(device::WDIOF_MAGICCLOSE) {
        Ok(())
    } else {
        Err(WatchdogRefusal::NoMagicClose {
            identity: support.identity.clone(),
        })
    }
}

/// The timeout the agent goes by for an open watchdog device (whose driver has no
/// `nowayout`, see [`refuse_nowayout`]) that says it supports `support`, was asked for
/// `requested` (if it can set its timeout) and then said its timeout is `read_back` seconds:
/// the latest the device resets the machine after its last pet ([`timeouts_to_reset`] of
/// those), unless the device has no magic close, could not set its timeout and has another,
/// or resets sooner or later than the agent's `bounds` allow.
pub fn settle(
    requested: Duration,
    support: &Support,
    read_back: u32,
    bounds: &Bounds,
) -> Result<Duration, WatchdogRefusal> {
    refuse_without_magic_close(support)?;
    let asked = whole_seconds(requested);
    let earliest = Duration::from_secs(read_back.into());
    if !support.has(device::WDIOF_SETTIMEOUT) && read_back != asked {
        return Err(WatchdogRefusal::FixedTimeout {
            device: earliest,
            requested,
            asked,
        });
    }
    let actual = earliest * timeouts_to_reset(&support.identity);
    bounds
        .check_span(earliest, actual)
        .map_err(|source| WatchdogRefusal::DoesNotFit {
            actual,
            requested,
            asked,
            source,
        })?;
    Ok(actual)
}

/// Whether the agent sets the timeout of a device that supports `support`, was `running`
/// before the agent opened it and has a timeout of `current` seconds, when it asks for
/// `asked`: setting it pets the device (see [`take_timeout`]).
fn sets_timeout(support: &Support, running: bool, current: u32, asked: u32) -> bool {
    support.has(device::WDIOF_SETTIMEOUT) && !running && current != asked
}

/// Asks the open watchdog device `file` what [`settle`] needs, setting its timeout on the way
/// where that is safe; returns the timeout and the device's name for itself.
///
/// Setting the timeout (`WDIOC_SETTIMEOUT`) also pets the device. So it is set only when it
/// differs from the one asked for, and never on a device that was `running` before this open:
/// that is a crashed worker's, whose countdown must go on (a restarted worker pets it only as
/// [`super::isolation::pet_watchdog`] says, never by starting).
fn take_timeout(
    file: &std::fs::File,
    requested: Duration,
    bounds: &Bounds,
    running: bool,
) -> Result<(Duration, Support), WatchdogRefusal> {
    let support = device::support(file).map_err(WatchdogRefusal::Support)?;
    // Refused before anything is set on it.
    refuse_without_magic_close(&support)?;
    let asked = whole_seconds(requested);
    let current =
        device::timeout(file).map_err(|source| WatchdogRefusal::ReadTimeout { source })?;
    if sets_timeout(&support, running, current, asked) {
        device::set_timeout(file, asked)
            .map_err(|source| WatchdogRefusal::SetTimeout { asked, source })?;
    }
    let read_back =
        device::timeout(file).map_err(|source| WatchdogRefusal::ReadTimeout { source })?;
    let timeout = settle(requested, &support, read_back, bounds)?;
    Ok((timeout, support))
}

impl Watchdog {
    /// Opens (and so arms) the watchdog at `path`, asking a device for `requested` (the
    /// module's rules): the agent then goes by the device's timeout, which fits `bounds`. A
    /// FIFO or a regular file is taken only as a declared `stand_in` for a device.
    pub async fn open(
        path: &Path,
        requested: Duration,
        bounds: Bounds,
        stand_in: bool,
    ) -> Result<Self, WatchdogError> {
        Self::open_in(Path::new(SYS), path, requested, bounds, stand_in).await
    }

    /// [`Watchdog::open`], with sysfs mounted at `sys`.
    async fn open_in(
        sys: &Path,
        path: &Path,
        requested: Duration,
        bounds: Bounds,
        stand_in: bool,
    ) -> Result<Self, WatchdogError> {
        let refused = |source| WatchdogError::Refused {
            path: path.to_path_buf(),
            source,
        };
        let number = match kind(path)? {
            Kind::StandIn if stand_in => {
                let file = open_file(path).await?;
                warn!(watchdog = %path.display(), timeout = ?requested, "watchdog armed: a stand-in (--watchdog-stand-in), not a device: its timeout is the one declared (--watchdog-timeout)");
                return Ok(Self::new(path, file, requested));
            }
            Kind::StandIn => {
                return Err(WatchdogError::StandInNotDeclared {
                    path: path.to_path_buf(),
                });
            }
            Kind::Device(number) => number,
        };
        // Before opening: a device that might never disarm is never armed.
        refuse_nowayout(device::nowayout(sys, number)).map_err(refused)?;
        // Unknown counts as running: nothing is set on it, and it is not disarmed.
        let running = device::active(sys, number).unwrap_or(true);
        let file = open_file(path).await?;
        match take_timeout(&file, requested, &bounds, running) {
            Ok((timeout, support)) => {
                let asked = whole_seconds(requested);
                if timeout != Duration::from_secs(asked.into()) {
                    warn!(watchdog = %path.display(), asked = ?Duration::from_secs(asked.into()), ?timeout, "the watchdog resets the node after another time than asked: the agent goes by the device's");
                }
                info!(watchdog = %path.display(), device = support.identity, ?timeout, running, "watchdog armed: its timeout read back from the device");
                Ok(Self::new(path, file, timeout))
            }
            Err(refusal) => {
                let dog = Self::new(path, file, requested);
                if running {
                    // A crashed worker's countdown goes on: closed without disarming.
                    drop(dog);
                } else {
                    dog.disarm();
                }
                Err(refused(refusal))
            }
        }
    }

    fn new(path: &Path, device: std::fs::File, timeout: Duration) -> Self {
        Self {
            path: path.to_path_buf(),
            device,
            timeout,
            failing: false,
        }
    }

    /// The timeout the agent goes by: a device's, read back from it; a stand-in's, declared.
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
        // The default survey takes up to 6 s (5 s of asking, the last asks' 1 s).
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

    use device::{WDIOF_KEEPALIVEPING, WDIOF_MAGICCLOSE, WDIOF_SETTIMEOUT};

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    /// The defaults: the watchdog timeout must be more than 7 s, at most 15 s.
    const BOUNDS: Bounds = Bounds {
        isolation_timeout: Duration::from_secs(30),
        check_interval: Duration::from_secs(1),
        survey_limit: Duration::from_secs(6),
    };

    /// A directory of the test's own, empty; tests never touch a real watchdog (opening one
    /// arms it): /dev/null (a character device that is no watchdog), files and FIFOs here.
    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("podha-watchdog-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        dir
    }

    /// A sysfs (under `dir`) that says /dev/null's driver has `nowayout` `value`.
    fn sysfs_for_dev_null(dir: &Path, value: &str) -> PathBuf {
        let null = std::fs::metadata("/dev/null").expect("/dev/null");
        let attributes = device::sysfs_dir(dir, DeviceNumber::from_rdev(null.rdev()));
        std::fs::create_dir_all(&attributes).expect("sysfs");
        std::fs::write(attributes.join("nowayout"), value).expect("nowayout");
        dir.to_path_buf()
    }

    #[test]
    fn a_device_is_asked_for_the_timeout_rounded_up_to_whole_seconds() {
        assert_eq!(whole_seconds(s(10)), 10);
        assert_eq!(whole_seconds(Duration::from_millis(9_500)), 10);
        assert_eq!(whole_seconds(Duration::from_millis(10_001)), 11);
        assert_eq!(whole_seconds(Duration::from_nanos(1)), 1);
        assert_eq!(whole_seconds(Duration::MAX), u32::MAX);
    }

    #[test]
    fn what_a_device_says_settles_its_timeout_or_refuses_it() {
        let settable = WDIOF_SETTIMEOUT | WDIOF_MAGICCLOSE | WDIOF_KEEPALIVEPING;
        let fixed = WDIOF_MAGICCLOSE | WDIOF_KEEPALIVEPING;
        let ms = Duration::from_millis;
        // (what, the device's options, --watchdog-timeout, its timeout read back, the outcome:
        // the timeout the agent goes by, or words of the refusal)
        let table = [
            ("set as asked", settable, s(10), 10, Ok(s(10))),
            ("asked rounded up", settable, ms(9_500), 10, Ok(s(10))),
            ("the driver rounded up", settable, s(10), 12, Ok(s(12))),
            (
                "the driver rounded up past half the isolation timeout",
                settable,
                s(15),
                16,
                Err(
                    "it resets the node 16s after its last pet at the latest (--watchdog-timeout \
                     15s asked for 15s), which the agent cannot keep: the watchdog timeout 16s",
                ),
            ),
            (
                "the driver rounded down below a survey",
                settable,
                s(8),
                7,
                Err("longer than the check interval plus the longest peer survey (7s)"),
            ),
            (
                "no magic close",
                WDIOF_SETTIMEOUT | WDIOF_KEEPALIVEPING,
                s(10),
                10,
                Err("it has no magic close (\"dog\"): any close disarms it"),
            ),
            ("fixed at what was asked", fixed, s(10), 10, Ok(s(10))),
            (
                "fixed at what was asked, rounded up",
                fixed,
                ms(9_200),
                10,
                Ok(s(10)),
            ),
            (
                "fixed at softdog's default",
                fixed,
                s(10),
                60,
                Err("its timeout cannot be set and is 1m, not 10s (--watchdog-timeout 10s"),
            ),
            (
                "fixed below what was asked",
                fixed,
                s(10),
                9,
                Err("its timeout cannot be set and is 9s, not 10s"),
            ),
        ];
        for (what, options, requested, read_back, expected) in table {
            let support = support(options, "dog");
            let got = settle(requested, &support, read_back, &BOUNDS).map_err(|e| e.to_string());
            match (&got, expected) {
                (Ok(got), Ok(expected)) => assert_eq!(*got, expected, "{what}"),
                (Err(got), Err(words)) => assert!(got.contains(words), "{what}: {got}"),
                _ => panic!("{what}: {got:?}, expected {expected:?}"),
            }
        }
    }

    fn support(options: u32, identity: &str) -> Support {
        Support {
            options,
            firmware_version: 0,
            identity: identity.into(),
        }
    }

    /// Some boards reset only at an iTCO watchdog's second timeout: the agent goes by that,
    /// and the first must still outlast a survey.
    #[test]
    fn an_itco_watchdog_counts_two_timeouts_before_its_reset() {
        let itco = support(WDIOF_SETTIMEOUT | WDIOF_MAGICCLOSE, "iTCO_wdt");
        let bounds = Bounds {
            isolation_timeout: s(40),
            ..BOUNDS
        };
        assert_eq!(
            settle(s(8), &itco, 8, &bounds).map_err(|e| e.to_string()),
            Ok(s(16))
        );
        let err = settle(s(11), &itco, 11, &bounds).unwrap_err().to_string();
        assert!(
            err.contains("resets the node 22s after its last pet"),
            "{err}"
        );
        let err = settle(s(6), &itco, 6, &bounds).unwrap_err().to_string();
        assert!(err.contains("longer than the check interval"), "{err}");
        assert_eq!(
            settle(
                s(11),
                &support(WDIOF_SETTIMEOUT | WDIOF_MAGICCLOSE, "softdog"),
                11,
                &bounds
            )
            .map_err(|e| e.to_string()),
            Ok(s(11)),
            "one timeout for other watchdogs"
        );
    }

    /// Setting a timeout pets the device: only a device nobody had armed, whose timeout is
    /// another, is set; a crashed worker's countdown goes on.
    #[test]
    fn only_a_device_that_was_not_running_has_its_timeout_set() {
        let settable = support(WDIOF_SETTIMEOUT | WDIOF_MAGICCLOSE, "dog");
        let fixed = support(WDIOF_MAGICCLOSE, "dog");
        assert!(sets_timeout(&settable, false, 60, 10));
        assert!(!sets_timeout(&settable, false, 10, 10), "already so");
        assert!(
            !sets_timeout(&settable, true, 60, 10),
            "running: a crashed worker's"
        );
        assert!(!sets_timeout(&fixed, false, 60, 10));
    }

    #[test]
    fn a_device_that_may_never_disarm_is_refused_and_so_is_one_sysfs_cannot_vouch_for() {
        assert!(refuse_nowayout(Ok(false)).is_ok());
        let err = refuse_nowayout(Ok(true)).unwrap_err().to_string();
        assert!(err.contains("its driver has nowayout"), "{err}");
        assert!(err.contains("nowayout=0"), "{err}");
        let unknown = device::nowayout(Path::new("/nonexistent-sysfs"), device::MISC_WATCHDOG);
        let err = refuse_nowayout(unknown).unwrap_err().to_string();
        assert!(
            err.contains("cannot tell whether its driver has nowayout"),
            "{err}"
        );
        assert!(
            err.contains("/nonexistent-sysfs/class/watchdog/watchdog0/nowayout"),
            "{err}"
        );
    }

    #[test]
    fn a_character_device_is_asked_and_a_fifo_or_a_file_stands_in_for_one() {
        let dir = temp_dir("kind");
        let file = dir.join("file");
        std::fs::write(&file, "").expect("file");
        assert_eq!(kind(&file).expect("file"), Kind::StandIn);
        let fifo = dir.join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo");
        assert!(made.success());
        assert_eq!(kind(&fifo).expect("fifo"), Kind::StandIn);
        assert_eq!(
            kind(Path::new("/dev/null")).expect("/dev/null"),
            Kind::Device(DeviceNumber { major: 1, minor: 3 })
        );
        let err = kind(&dir).unwrap_err().to_string();
        assert!(err.contains("is neither a character device"), "{err}");
        let err = kind(&dir.join("missing")).unwrap_err().to_string();
        assert!(err.contains("cannot open the watchdog"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_character_device_that_is_no_watchdog_is_refused() {
        let dir = temp_dir("not-a-watchdog");
        let null = Path::new("/dev/null");
        // No sysfs attribute: refused before it is opened.
        let err = Watchdog::open_in(&dir, null, s(10), BOUNDS, false)
            .await
            .err()
            .expect("refused")
            .to_string();
        assert!(
            err.starts_with("refusing the watchdog /dev/null: cannot tell whether its driver"),
            "{err}"
        );
        // A sysfs that says it has nowayout: refused before it is opened.
        let sys = sysfs_for_dev_null(&dir.join("nowayout"), "1");
        let err = Watchdog::open_in(&sys, null, s(10), BOUNDS, false)
            .await
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("its driver has nowayout"), "{err}");
        // A sysfs that vouches for it: opened, and refused on its first answer.
        let sys = sysfs_for_dev_null(&dir.join("vouched"), "0");
        let err = Watchdog::open_in(&sys, null, s(10), BOUNDS, false)
            .await
            .err()
            .expect("refused")
            .to_string();
        assert!(
            err.contains("WDIOC_GETSUPPORT: the file is not a watchdog device (ENOTTY"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A regular file declared a stand-in for a device: pets and the disarm are what is written to it,
    /// and its timeout is the one declared, to the millisecond.
    #[tokio::test]
    async fn pets_are_writes_and_a_disarm_is_a_v() {
        let dir = temp_dir("pets");
        let device = dir.join("watchdog");
        std::fs::write(&device, "").expect("device");
        let declared = Duration::from_millis(9_500);
        let err = Watchdog::open(&device, declared, BOUNDS, false)
            .await
            .err()
            .expect("a file not declared a stand-in")
            .to_string();
        assert!(err.contains("--watchdog-stand-in"), "{err}");
        let mut dog = Watchdog::open(&device, declared, BOUNDS, true)
            .await
            .expect("open");
        assert_eq!(dog.timeout(), declared);
        dog.pet();
        dog.pet();
        dog.disarm();
        assert_eq!(std::fs::read_to_string(&device).expect("read"), "\n\nV");
        let err = Watchdog::open(&dir.join("missing"), s(10), BOUNDS, true)
            .await
            .err()
            .expect("no such device")
            .to_string();
        assert!(err.contains("cannot open the watchdog"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
