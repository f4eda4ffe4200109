//! The node's watchdog: a device that resets the machine unless it is written to ("petted")
//! within its timeout. The agent pets it while the rule in [`super::isolation::pet_watchdog`]
//! allows; a node that hangs, or whose agent is frozen or killed, stops petting and is reset.
//! That is what makes podha's silence proof sound for a frozen node: its containers never thaw
//! into a cluster that moved their volumes.
//!
//! The device follows the Linux watchdog API (`/dev/watchdog`, e.g. `softdog` or a hardware
//! timer): opening arms it, any write pets it, and a write of `V` before closing disarms it
//! ("magic close"). The agent disarms it when it stops on purpose (SIGTERM), and while podha
//! cannot be counting its node's silence (see `super::arming`), arming it again
//! ([`Watchdog::arm`]) when podha may; a crashed agent leaves it as it was.
//!
//! What the agent takes of the file at `--watchdog` ([`Watchdog::open`]):
//! - **A character device** is asked, not trusted: its timeout is what the agent's pets, its
//!   [`Bounds::check`] and the `fenced_within` it advertises rest on.
//!   - Before it is opened (which arms it), sysfs must show that its driver has no
//!     `nowayout`: such a device never disarms, and every stop of the agent (a rollout, an
//!     uninstall) would reset the node. When sysfs cannot tell, the device is refused too
//!     ([`refuse_nowayout`]): every driver of the kernel's watchdog core has the attribute.
//!   - It must have magic close (`WDIOC_GETSUPPORT`): without it any close disarms it, a
//!     crashed or killed agent's too, and the node would run on while podha counts it reset.
//!   - Its timeout is set to `--watchdog-timeout`, rounded up to whole seconds, when the
//!     device can set it, and read back (the driver may round it); a device that cannot set it
//!     must already have that timeout. The timeout read back is the one the agent goes by;
//!     one that [`Bounds::check`] refuses is refused ([`settle`]).
//!
//!   A device refused once open is disarmed and closed, unless it was running before (a
//!   crashed worker's countdown goes on).
//! - **A FIFO or a regular file** stands in for a device (the sim's BMC watchdog is a FIFO, as
//!   no test may open a real one): it has no ioctls, and its timeout is `--watchdog-timeout`,
//!   as declared.
//!
//! A node with no usable watchdog says so and is not agent-protected ([`run_without`]): when
//! `--watchdog` names nothing on this node, or a device the agent refuses or cannot open, the
//! agent runs without one ([`Unwatched`]) and advertises no `fenced_within`, so podha's
//! `Agent` proof counts no silence of it (a frozen node without a watchdog never fences itself,
//! and would thaw into a cluster that moved its volumes). A stand-in, or a file that can be no
//! watchdog, stops the agent instead: that is a mistake in its options, not a node without one.

use std::io::Write as _;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use podha_watchdog_device::{self as device, DeviceNumber, Support};
use tracing::{error, info, warn};

use super::{ArgsError, WatchdogError, WatchdogRefusal};
use crate::contract::{no_watchdog_value, watchdog_value};

/// How long opening the device may take (a FIFO standing in for one opens once its reader is
/// there).
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);

/// Where sysfs is mounted (in the agent's container too).
const SYS: &str = "/sys";

pub struct Watchdog {
    path: PathBuf,
    /// The open device; `None` once disarmed ([`Watchdog::disarm`]), until armed again
    /// ([`Watchdog::arm`]).
    device: Option<std::fs::File>,
    /// The timeout the agent goes by: a device's, read back from it; a stand-in's, declared.
    timeout: Duration,
    /// Whether the last pet failed (logged once, not every second).
    failing: bool,
    /// A declared stand-in (a FIFO or a file), not a device.
    stand_in: bool,
    /// How it was opened: how [`Watchdog::arm`] opens it again.
    opened_as: OpenedAs,
}

/// What a watchdog was opened with, to open it again alike.
#[derive(Clone, Debug)]
struct OpenedAs {
    sys: PathBuf,
    requested: Duration,
    bounds: Bounds,
}

/// The agent's timings a watchdog timeout must fit (see [`Bounds::check`]).
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
    /// pet: the latest soon enough that the node is reset before podha's silence proof (half
    /// the isolation timeout, so that the survey that keeps it petted while podha hears
    /// nobody starts where a leader's silence is told apart from one node's), the earliest
    /// late enough that a survey never starves it.
    pub fn check_span(&self, earliest: Duration, latest: Duration) -> Result<(), ArgsError> {
        let shortest = self.check_interval + self.survey_limit;
        if earliest <= shortest {
            return Err(ArgsError::WatchdogTooShort {
                watchdog: earliest,
                shortest,
            });
        }
        if latest > self.isolation_timeout / 2 {
            return Err(ArgsError::WatchdogTooLong {
                watchdog: latest,
                isolation_timeout: self.isolation_timeout,
            });
        }
        Ok(())
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
    let meta = std::fs::metadata(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => WatchdogError::Missing {
            path: path.to_path_buf(),
        },
        _ => WatchdogError::Inspect {
            path: path.to_path_buf(),
            source,
        },
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

/// What becomes of a file whose open completes after nobody waits for it any more (it ran out
/// of time, or the agent stopped meanwhile).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Abandoned {
    /// Disarmed (`V`) and closed: a device that was not running, which this open armed.
    Disarm,
    /// Closed as it is: a device a crashed worker left running (its countdown goes on), or a
    /// stand-in, which opening does not arm.
    Close,
}

/// Opens the file at `path` for writing: a device is armed from then on. A file opened after
/// nobody waits for it is left as `abandoned` says, never armed by a worker that stopped.
async fn open_file(path: &Path, abandoned: Abandoned) -> Result<std::fs::File, WatchdogError> {
    let owned = path.to_path_buf();
    let (opened, taken) = tokio::sync::oneshot::channel();
    let task = tokio::task::spawn_blocking(move || {
        let file = std::fs::OpenOptions::new().write(true).open(&owned);
        if let Err(Ok(mut late)) = opened.send(file)
            && abandoned == Abandoned::Disarm
        {
            let _ = write(&mut late, b"V");
        }
    });
    let open = match tokio::time::timeout(OPEN_TIMEOUT, taken).await {
        Ok(Ok(open)) => open,
        Ok(Err(_)) => {
            return Err(match task.await {
                Err(source) => WatchdogError::OpenTask {
                    path: path.to_path_buf(),
                    source,
                },
                // Sent before the task ends: not reached.
                Ok(()) => WatchdogError::OpenTimedOut {
                    path: path.to_path_buf(),
                    after: OPEN_TIMEOUT,
                },
            });
        }
        Err(_) => {
            return Err(WatchdogError::OpenTimedOut {
                path: path.to_path_buf(),
                after: OPEN_TIMEOUT,
            });
        }
    };
    open.map_err(|source| WatchdogError::Open {
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
        Self::open_in(Path::new(SYS), path, requested, bounds, stand_in, false).await
    }

    /// [`Watchdog::open`], with sysfs mounted at `sys`; `again` when the agent opens a device
    /// it disarmed itself ([`Watchdog::arm`]), which an open nobody waits for any more
    /// disarms whatever sysfs says of it.
    async fn open_in(
        sys: &Path,
        path: &Path,
        requested: Duration,
        bounds: Bounds,
        stand_in: bool,
        again: bool,
    ) -> Result<Self, WatchdogError> {
        let refused = |source| WatchdogError::Refused {
            path: path.to_path_buf(),
            source,
        };
        let opened_as = OpenedAs {
            sys: sys.to_path_buf(),
            requested,
            bounds,
        };
        let number = match kind(path)? {
            Kind::StandIn if stand_in => {
                let file = open_file(path, Abandoned::Close).await?;
                warn!(watchdog = %path.display(), timeout = ?requested, "watchdog armed: a stand-in (--watchdog-stand-in), not a device: its timeout is the one declared (--watchdog-timeout)");
                let mut dog = Self::new(path, file, requested, opened_as);
                dog.stand_in = true;
                return Ok(dog);
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
        let abandoned = if running && !again {
            Abandoned::Close
        } else {
            Abandoned::Disarm
        };
        let file = open_file(path, abandoned).await?;
        match take_timeout(&file, requested, &bounds, running) {
            Ok((timeout, support)) => {
                let asked = whole_seconds(requested);
                if timeout != Duration::from_secs(asked.into()) {
                    warn!(watchdog = %path.display(), asked = ?Duration::from_secs(asked.into()), ?timeout, "the watchdog resets the node after another time than asked: the agent goes by the device's");
                }
                info!(watchdog = %path.display(), device = support.identity, ?timeout, running, "watchdog armed: its timeout read back from the device");
                Ok(Self::new(path, file, timeout, opened_as))
            }
            Err(refusal) => {
                let mut dog = Self::new(path, file, requested, opened_as);
                if running {
                    // A crashed worker's countdown goes on: closed without disarming. The
                    // agent stops (see `run_without`), and the next one tries again in time.
                    drop(dog);
                    Err(WatchdogError::RefusedRunning {
                        path: path.to_path_buf(),
                        source: refusal,
                    })
                } else {
                    dog.disarm();
                    Err(refused(refusal))
                }
            }
        }
    }

    fn new(path: &Path, device: std::fs::File, timeout: Duration, opened_as: OpenedAs) -> Self {
        Self {
            path: path.to_path_buf(),
            device: Some(device),
            timeout,
            failing: false,
            stand_in: false,
            opened_as,
        }
    }

    /// Whether it is armed: open, and not disarmed since.
    pub fn is_armed(&self) -> bool {
        self.device.is_some()
    }

    /// Arms a watchdog the agent disarmed ([`Watchdog::disarm`]): opens it again as it first
    /// did, with the same checks. It must reset the node after the timeout the agent went by
    /// (and advertised) before: a device that now reads back another is disarmed again, and
    /// that is an error (the agent stops, and the next one advertises what it finds).
    pub async fn arm(&mut self) -> Result<(), WatchdogError> {
        if self.is_armed() {
            return Ok(());
        }
        let OpenedAs {
            sys,
            requested,
            bounds,
        } = self.opened_as.clone();
        let mut again =
            Self::open_in(&sys, &self.path, requested, bounds, self.stand_in, true).await?;
        if again.timeout != self.timeout {
            again.disarm();
            return Err(WatchdogError::TimeoutChanged {
                path: self.path.clone(),
                was: self.timeout,
                now: again.timeout,
            });
        }
        self.device = again.device.take();
        self.failing = false;
        // A stand-in is armed by its first write, not by the open.
        self.pet()
    }

    /// The timeout the agent goes by: a device's, read back from it; a stand-in's, declared.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Pets the watchdog: it will not fire for another timeout. A device that fails to take a
    /// pet resets the node as if it had not been petted (said once). A stand-in that fails
    /// (its BMC gone: nothing would reset the node) is an error: the agent stops and takes
    /// its advert back, so that podha counts none of its silence. Disarmed, nothing to pet.
    pub fn pet(&mut self) -> Result<(), WatchdogError> {
        let Some(device) = self.device.as_mut() else {
            return Ok(());
        };
        match write(device, b"\n") {
            Ok(()) => self.failing = false,
            Err(source) if self.stand_in => {
                return Err(WatchdogError::StandInFailed {
                    path: self.path.clone(),
                    source,
                });
            }
            Err(e) if !self.failing => {
                error!(watchdog = %self.path.display(), error = %e, "cannot pet the watchdog: it will reset the node");
                self.failing = true;
            }
            Err(_) => {}
        }
        Ok(())
    }

    /// Disarms the watchdog and closes it (the agent stops on purpose, or podha cannot be
    /// counting this node's silence); [`Watchdog::arm`] arms it again. `false` when the
    /// device did not take the `V`: it is still armed, kept open, and petted as before (closed
    /// now, it would reset the node).
    pub fn disarm(&mut self) -> bool {
        let Some(device) = self.device.as_mut() else {
            return true;
        };
        match write(device, b"V") {
            Ok(()) => {
                self.device = None;
                info!(watchdog = %self.path.display(), "watchdog disarmed");
                true
            }
            Err(e) => {
                error!(watchdog = %self.path.display(), error = %e, "cannot disarm the watchdog: it stays armed");
                false
            }
        }
    }
}

fn write(device: &mut std::fs::File, bytes: &[u8]) -> std::io::Result<()> {
    device.write_all(bytes)?;
    device.flush()
}

/// Why the agent pets no watchdog: its node is not agent-protected (it advertises no
/// `fenced_within`, and podha's `Agent` proof needs an acknowledged fence request for it).
#[derive(Debug, thiserror::Error)]
pub enum Unwatched {
    /// No `--watchdog`.
    #[error("not configured")]
    NotConfigured,
    /// `--watchdog` names nothing on this node, or a device the agent refused or could not
    /// open (see [`run_without`]).
    #[error(transparent)]
    Unusable(WatchdogError),
    /// The node's kernel may not be its own: a device there may be the host's.
    #[error(transparent)]
    NotItsKernel(super::shared_kernel::KernelDoubt),
}

/// What the agent says of its watchdog on its Node (`podha.io/agent-watchdog`): the timeout
/// it goes by, or why it pets none.
pub fn advertised(watchdog: &Result<Watchdog, Unwatched>) -> String {
    match watchdog {
        Ok(watchdog) => watchdog_value(watchdog.timeout()),
        Err(why) => no_watchdog_value(&why.to_string()),
    }
}

/// Whether the file at `path` is one that stands in for a watchdog device (a FIFO or a regular
/// file), not a device.
pub fn is_stand_in_file(path: &Path) -> bool {
    matches!(kind(path), Ok(Kind::StandIn))
}

/// Whether the agent runs on without a watchdog after failing to open the one at `--watchdog`
/// (declared a `stand_in` or not) with `error`: `Ok` with the reason where the node has no
/// usable watchdog device, `Err` (the agent stops) where its options are wrong.
///
/// - Nothing at the path, a character device the agent refuses (nowayout, no magic close, a
///   timeout that does not fit: disarmed by [`Watchdog::open`]), or one it cannot open (`EACCES`, `EBUSY`: another program holds it): a node without a usable
///   watchdog, which a chart that sets `--watchdog /dev/watchdog` on every node meets on many.
///   Runs on, not agent-protected.
/// - A declared stand-in that fails (a test's BMC): that test's node would be taken for
///   protected by a watchdog nobody pets. Stops.
/// - A file that can be no watchdog (a FIFO or a regular file not declared a stand-in, a
///   directory, a socket), a path that cannot be looked at: a mistake in `--watchdog`, which a
///   node without a watchdog does not make; running on would hide it on every node.
///   Stops.
/// - An open that did not return in time, or whose task failed: it may still complete and arm
///   the device with nobody petting it; the supervisor's next worker tries again. Stops.
/// - A device refused that was running before (a crashed worker's countdown, closed armed):
///   running on would leave it to reset the node for sure; the next worker may take it (a
///   refusal that passes, an ioctl that failed once) and pet it in time. Stops.
pub fn run_without(error: WatchdogError, stand_in: bool) -> Result<Unwatched, WatchdogError> {
    if stand_in {
        return Err(error);
    }
    match error {
        WatchdogError::Missing { .. }
        | WatchdogError::Refused { .. }
        | WatchdogError::Open { .. } => Ok(Unwatched::Unusable(error)),
        WatchdogError::Inspect { .. }
        | WatchdogError::NotAWatchdogFile { .. }
        | WatchdogError::StandInNotDeclared { .. }
        | WatchdogError::OpenTimedOut { .. }
        | WatchdogError::TimeoutChanged { .. }
        | WatchdogError::OpenTask { .. }
        | WatchdogError::StandInFailed { .. }
        | WatchdogError::RefusedRunning { .. } => Err(error),
    }
}

#[cfg(test)]
mod tests;
