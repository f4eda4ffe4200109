//! The Linux watchdog device API (`include/uapi/linux/watchdog.h`) on a device file that is
//! already open: what the device supports ([`support`]), its timeout ([`set_timeout`],
//! [`timeout`]), a keepalive ([`keepalive`]); and, from sysfs, whether its driver never stops
//! it once started ([`nowayout`]).
//!
//! Opening a watchdog device arms it, so this crate opens none: its caller opens the file (and
//! so decides when the timer starts) and passes it in as anything [`AsFd`]. Closing it is the
//! caller's too: a device with [`WDIOF_MAGICCLOSE`] is disarmed by a `V` written just before
//! the close, one without it by any close, one whose driver has `nowayout` never.
//!
//! The four ioctl calls are this crate's only `unsafe` code, each with why it is sound.
#![deny(clippy::undocumented_unsafe_blocks)]

use std::ffi::c_int;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;

/// The device's timeout can be set (`WDIOC_SETTIMEOUT`).
pub const WDIOF_SETTIMEOUT: u32 = 0x0080;
/// The device disarms on close only after a `V` ("magic close"); without it, any close
/// disarms it, a crashed opener's too.
pub const WDIOF_MAGICCLOSE: u32 = 0x0100;
/// The device takes `WDIOC_KEEPALIVE`.
pub const WDIOF_KEEPALIVEPING: u32 = 0x8000;

/// `struct watchdog_info`, laid out as the kernel's.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct WatchdogInfo {
    options: u32,
    firmware_version: u32,
    identity: [u8; 32],
}

/// The ioctl type of the watchdog API.
const WATCHDOG_IOCTL_BASE: u8 = b'W';

// The kernel takes the request as an `unsigned int`; nix's macros compute it as the C
// macros do (`_IOR`, `_IOWR`) for the target's architecture.
/// `_IOR('W', 0, struct watchdog_info)`.
pub const WDIOC_GETSUPPORT: u32 =
    nix::request_code_read!(WATCHDOG_IOCTL_BASE, 0, size_of::<WatchdogInfo>()) as u32;
/// `_IOR('W', 5, int)`.
pub const WDIOC_KEEPALIVE: u32 =
    nix::request_code_read!(WATCHDOG_IOCTL_BASE, 5, size_of::<c_int>()) as u32;
/// `_IOWR('W', 6, int)`: the timeout asked for in, the one the driver took out.
pub const WDIOC_SETTIMEOUT: u32 =
    nix::request_code_readwrite!(WATCHDOG_IOCTL_BASE, 6, size_of::<c_int>()) as u32;
/// `_IOR('W', 7, int)`.
pub const WDIOC_GETTIMEOUT: u32 =
    nix::request_code_read!(WATCHDOG_IOCTL_BASE, 7, size_of::<c_int>()) as u32;

/// The raw calls (`unsafe fn(fd, *mut T) -> nix::Result<c_int>`), by nix's macros.
mod sys {
    use super::{
        WDIOC_GETSUPPORT, WDIOC_GETTIMEOUT, WDIOC_KEEPALIVE, WDIOC_SETTIMEOUT, WatchdogInfo, c_int,
    };

    nix::ioctl_read_bad!(get_support, WDIOC_GETSUPPORT, WatchdogInfo);
    nix::ioctl_read_bad!(keepalive, WDIOC_KEEPALIVE, c_int);
    nix::ioctl_readwrite_bad!(set_timeout, WDIOC_SETTIMEOUT, c_int);
    nix::ioctl_read_bad!(get_timeout, WDIOC_GETTIMEOUT, c_int);
}

/// Why a call on the device, or a look at its sysfs attributes, failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// ENOTTY: the file's driver does not know the request. Every watchdog answers
    /// `WDIOC_GETSUPPORT`, so there it means the file is not a watchdog device.
    #[error(
        "{request}: the file is not a watchdog device (ENOTTY: its driver does not know the \
         request)"
    )]
    NotAWatchdog { request: &'static str },
    #[error("{request}: {errno}")]
    Ioctl { request: &'static str, errno: Errno },
    #[error("{request}: the device answered {value}, which is no timeout in seconds")]
    BadTimeout { request: &'static str, value: c_int },
    #[error("{request}: {secs}s is more than the watchdog API carries")]
    TooLong { request: &'static str, secs: u32 },
    #[error("cannot read {}: {source}", .path.display())]
    Sysfs {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} says {text:?}, neither {no:?} nor {yes:?}", .path.display())]
    SysfsValue {
        path: PathBuf,
        text: String,
        no: &'static str,
        yes: &'static str,
    },
}

fn called(request: &'static str, result: nix::Result<c_int>) -> Result<(), Error> {
    match result {
        Ok(_) => Ok(()),
        Err(Errno::ENOTTY) => Err(Error::NotAWatchdog { request }),
        Err(errno) => Err(Error::Ioctl { request, errno }),
    }
}

fn seconds(request: &'static str, value: c_int) -> Result<u32, Error> {
    u32::try_from(value)
        .ok()
        .filter(|&secs| secs > 0)
        .ok_or(Error::BadTimeout { request, value })
}

/// What a watchdog device says it supports (`WDIOC_GETSUPPORT`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Support {
    /// The `WDIOF_*` bits of the options the driver supports.
    pub options: u32,
    pub firmware_version: u32,
    /// The driver's name for the device (`Software Watchdog`, `iTCO_wdt`).
    pub identity: String,
}

impl Support {
    /// Whether the device supports every `WDIOF_*` bit of `option`.
    pub fn has(&self, option: u32) -> bool {
        self.options & option == option
    }
}

impl From<WatchdogInfo> for Support {
    fn from(info: WatchdogInfo) -> Self {
        let name = info.identity.split(|&b| b == 0).next().unwrap_or_default();
        Self {
            options: info.options,
            firmware_version: info.firmware_version,
            identity: String::from_utf8_lossy(name).into_owned(),
        }
    }
}

/// What the watchdog device open as `device` supports.
pub fn support(device: impl AsFd) -> Result<Support, Error> {
    let mut info = WatchdogInfo::default();
    // SAFETY: the descriptor stays open for the call (`device` lends it), and the pointer is to
    // a `struct watchdog_info` of ours (`repr(C)`, the kernel's 40 bytes) that the kernel fills
    // and nothing else touches meanwhile.
    let result = unsafe { sys::get_support(device.as_fd().as_raw_fd(), &mut info) };
    called("WDIOC_GETSUPPORT", result)?;
    Ok(info.into())
}

/// Sets the timeout of the watchdog device open as `device` to `secs` seconds; returns the
/// timeout the driver took, which it may have rounded (read it back with [`timeout`] too).
/// Only for a device with [`WDIOF_SETTIMEOUT`].
pub fn set_timeout(device: impl AsFd, secs: u32) -> Result<u32, Error> {
    const REQUEST: &str = "WDIOC_SETTIMEOUT";
    let mut value = c_int::try_from(secs).map_err(|_| Error::TooLong {
        request: REQUEST,
        secs,
    })?;
    // SAFETY: the descriptor stays open for the call (`device` lends it); the pointer is to an
    // `int` of ours that the kernel reads and then overwrites with the timeout it took.
    let result = unsafe { sys::set_timeout(device.as_fd().as_raw_fd(), &mut value) };
    called(REQUEST, result)?;
    seconds(REQUEST, value)
}

/// The timeout, in seconds, of the watchdog device open as `device`.
pub fn timeout(device: impl AsFd) -> Result<u32, Error> {
    const REQUEST: &str = "WDIOC_GETTIMEOUT";
    let mut value: c_int = 0;
    // SAFETY: the descriptor stays open for the call (`device` lends it); the pointer is to an
    // `int` of ours that the kernel fills.
    let result = unsafe { sys::get_timeout(device.as_fd().as_raw_fd(), &mut value) };
    called(REQUEST, result)?;
    seconds(REQUEST, value)
}

/// Pets the watchdog device open as `device`: it will not fire for another timeout. Only for a
/// device with [`WDIOF_KEEPALIVEPING`]; any write to the device pets it too.
pub fn keepalive(device: impl AsFd) -> Result<(), Error> {
    let mut unused: c_int = 0;
    // SAFETY: the descriptor stays open for the call (`device` lends it); the kernel ignores
    // the argument, which points to an `int` of ours all the same, as the request declares.
    let result = unsafe { sys::keepalive(device.as_fd().as_raw_fd(), &mut unused) };
    called("WDIOC_KEEPALIVE", result)
}

/// A device's major and minor numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceNumber {
    pub major: u32,
    pub minor: u32,
}

impl DeviceNumber {
    /// The numbers of a device file's `st_rdev` (`std::os::unix::fs::MetadataExt::rdev`),
    /// split as glibc's `major()` and `minor()` split it.
    pub fn from_rdev(rdev: u64) -> Self {
        let major = ((rdev & 0x0000_0000_000f_ff00) >> 8) | ((rdev & 0xffff_f000_0000_0000) >> 32);
        let minor = (rdev & 0x0000_0000_0000_00ff) | ((rdev & 0x0000_0fff_fff0_0000) >> 12);
        // Both masks leave at most 32 bits.
        Self {
            major: major as u32,
            minor: minor as u32,
        }
    }
}

impl std::fmt::Display for DeviceNumber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

/// `/dev/watchdog`: the misc device (`WATCHDOG_MINOR`) through which the kernel also serves its
/// first watchdog, `watchdog0`.
pub const MISC_WATCHDOG: DeviceNumber = DeviceNumber {
    major: 10,
    minor: 130,
};

/// Where sysfs (mounted at `sys`, `/sys` on a machine) keeps the watchdog core's attributes of
/// the device numbered `device`: `class/watchdog/watchdog0` for `/dev/watchdog` (a misc device,
/// whose own directory has none of them), else `dev/char/<major>:<minor>`, the link to the
/// device's directory (`/dev/watchdogN`'s is `watchdogN`'s).
pub fn sysfs_dir(sys: &Path, device: DeviceNumber) -> PathBuf {
    if device == MISC_WATCHDOG {
        sys.join("class/watchdog/watchdog0")
    } else {
        sys.join("dev/char").join(device.to_string())
    }
}

/// Whether the watchdog numbered `device` was built or loaded with `nowayout`: once started, it
/// never stops, whatever is written to it and however it is closed. Read from its sysfs
/// attribute (`sys`: where sysfs is mounted), which the kernel's watchdog core has with
/// `CONFIG_WATCHDOG_SYSFS` (Linux 4.3 and later); an error when there is none (the kernel is
/// built without it, the file is not a watchdog, the driver predates the watchdog core, sysfs
/// is not mounted). Reading it does not open the device.
pub fn nowayout(sys: &Path, device: DeviceNumber) -> Result<bool, Error> {
    sysfs_flag(sys, device, "nowayout", ("0", "1"))
}

/// Whether the watchdog numbered `device` is running (its sysfs `state`: `active` or
/// `inactive`, beside `nowayout`): opened by a process that has not disarmed it, a crashed one
/// included. Reading it does not open the device.
pub fn active(sys: &Path, device: DeviceNumber) -> Result<bool, Error> {
    sysfs_flag(sys, device, "state", ("inactive", "active"))
}

/// The sysfs attribute `name` of the watchdog numbered `device`, which says `no` or `yes`.
fn sysfs_flag(
    sys: &Path,
    device: DeviceNumber,
    name: &str,
    (no, yes): (&'static str, &'static str),
) -> Result<bool, Error> {
    let path = sysfs_dir(sys, device).join(name);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(source) => return Err(Error::Sysfs { path, source }),
    };
    match text.trim() {
        t if t == no => Ok(false),
        t if t == yes => Ok(true),
        other => Err(Error::SysfsValue {
            text: other.to_string(),
            path,
            no,
            yes,
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt as _;

    use super::*;

    /// glibc's `makedev()`.
    fn makedev(major: u64, minor: u64) -> u64 {
        ((major & 0xfff) << 8) | ((major & !0xfff) << 32) | (minor & 0xff) | ((minor & !0xff) << 12)
    }

    /// A directory of this test's own under the system's temp dir, empty.
    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "podha-watchdog-device-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    #[test]
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    fn the_request_numbers_are_the_kernels() {
        assert_eq!(WDIOC_GETSUPPORT, 0x8028_5700);
        assert_eq!(WDIOC_KEEPALIVE, 0x8004_5705);
        assert_eq!(WDIOC_SETTIMEOUT, 0xc004_5706);
        assert_eq!(WDIOC_GETTIMEOUT, 0x8004_5707);
    }

    #[test]
    fn struct_watchdog_info_is_laid_out_as_the_kernels() {
        assert_eq!(size_of::<WatchdogInfo>(), 40);
        assert_eq!(align_of::<WatchdogInfo>(), 4);
        assert_eq!(std::mem::offset_of!(WatchdogInfo, firmware_version), 4);
        assert_eq!(std::mem::offset_of!(WatchdogInfo, identity), 8);
    }

    #[test]
    fn the_identity_ends_at_its_first_nul_or_its_32nd_byte() {
        let mut info = WatchdogInfo {
            options: WDIOF_SETTIMEOUT | WDIOF_MAGICCLOSE | WDIOF_KEEPALIVEPING,
            firmware_version: 0,
            identity: [0; 32],
        };
        info.identity[..17].copy_from_slice(b"Software Watchdog");
        let support = Support::from(info);
        assert_eq!(support.identity, "Software Watchdog");
        assert!(support.has(WDIOF_MAGICCLOSE));
        assert!(support.has(WDIOF_SETTIMEOUT | WDIOF_KEEPALIVEPING));
        info.identity = [b'x'; 32];
        info.options = WDIOF_KEEPALIVEPING;
        let support = Support::from(info);
        assert_eq!(support.identity, "x".repeat(32));
        assert!(!support.has(WDIOF_MAGICCLOSE));
        assert!(!support.has(WDIOF_MAGICCLOSE | WDIOF_KEEPALIVEPING));
    }

    /// /dev/null is a character device that is no watchdog: every request fails with ENOTTY,
    /// which says so. (Nothing here may open a real watchdog: that would arm it.)
    #[test]
    fn every_call_on_dev_null_says_it_is_not_a_watchdog() {
        let null = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .expect("/dev/null");
        let errors = [
            ("WDIOC_GETSUPPORT", support(&null).err()),
            ("WDIOC_SETTIMEOUT", set_timeout(&null, 10).err()),
            ("WDIOC_GETTIMEOUT", timeout(&null).err()),
            ("WDIOC_KEEPALIVE", keepalive(&null).err()),
        ];
        for (request, error) in errors {
            let error = error.unwrap_or_else(|| panic!("{request} on /dev/null succeeded"));
            assert!(
                matches!(error, Error::NotAWatchdog { request: r } if r == request),
                "{error:?}"
            );
            let message = error.to_string();
            assert!(message.starts_with(request), "{message}");
            assert!(
                message.contains("not a watchdog device (ENOTTY"),
                "{message}"
            );
        }
    }

    #[test]
    fn a_timeout_beyond_an_int_is_refused_before_any_call() {
        let null = std::fs::File::open("/dev/null").expect("/dev/null");
        let error = set_timeout(&null, u32::MAX).unwrap_err();
        assert!(matches!(error, Error::TooLong { .. }), "{error:?}");
    }

    #[test]
    fn device_numbers_are_split_as_glibc_splits_them() {
        assert_eq!(DeviceNumber::from_rdev(makedev(10, 130)), MISC_WATCHDOG);
        let large = DeviceNumber::from_rdev(makedev(0xfffff, 0xfffff));
        assert_eq!((large.major, large.minor), (0xfffff, 0xfffff));
        let null = std::fs::metadata("/dev/null").expect("/dev/null");
        let null = DeviceNumber::from_rdev(null.rdev());
        assert_eq!((null.major, null.minor), (1, 3));
        assert_eq!(null.to_string(), "1:3");
    }

    #[test]
    fn dev_watchdog_is_watchdog0_in_sysfs_and_any_other_device_its_numbers() {
        let sys = Path::new("/sys");
        assert_eq!(
            sysfs_dir(sys, MISC_WATCHDOG),
            Path::new("/sys/class/watchdog/watchdog0")
        );
        let watchdog1 = DeviceNumber {
            major: 248,
            minor: 1,
        };
        assert_eq!(sysfs_dir(sys, watchdog1), Path::new("/sys/dev/char/248:1"));
    }

    #[test]
    fn nowayout_and_state_are_read_from_sysfs_and_anything_else_is_an_error() {
        let sys = temp_dir("nowayout");
        let device = DeviceNumber {
            major: 248,
            minor: 0,
        };
        let error = nowayout(&sys, device).unwrap_err().to_string();
        assert!(error.contains("dev/char/248:0/nowayout"), "{error}");
        let dir = sysfs_dir(&sys, device);
        std::fs::create_dir_all(&dir).expect("dir");
        for (text, expected) in [("0\n", Some(false)), ("1\n", Some(true)), ("yes\n", None)] {
            std::fs::write(dir.join("nowayout"), text).expect("write");
            match (nowayout(&sys, device), expected) {
                (Ok(got), Some(expected)) => assert_eq!(got, expected, "{text:?}"),
                (Err(error), None) => {
                    assert!(
                        error.to_string().contains(r#"neither "0" nor "1""#),
                        "{error}"
                    )
                }
                (got, _) => panic!("{text:?}: {got:?}"),
            }
        }
        for (text, expected) in [
            ("active\n", Some(true)),
            ("inactive\n", Some(false)),
            ("1\n", None),
        ] {
            std::fs::write(dir.join("state"), text).expect("write");
            match (active(&sys, device), expected) {
                (Ok(got), Some(expected)) => assert_eq!(got, expected, "{text:?}"),
                (Err(error), None) => assert!(
                    error
                        .to_string()
                        .contains(r#"neither "inactive" nor "active""#),
                    "{error}"
                ),
                (got, _) => panic!("{text:?}: {got:?}"),
            }
        }
        // /dev/null has no watchdog attributes: it is no watchdog.
        let null = std::fs::metadata("/dev/null").expect("/dev/null");
        let error = nowayout(Path::new("/sys"), DeviceNumber::from_rdev(null.rdev()));
        assert!(matches!(error, Err(Error::Sysfs { .. })), "{error:?}");
        let _ = std::fs::remove_dir_all(&sys);
    }
}
