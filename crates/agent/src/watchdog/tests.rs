use super::*;

/// Checks a watchdog timeout against the agent's other timings.
fn check_timeout(
    watchdog: Duration,
    isolation_timeout: Duration,
    check_interval: Duration,
    survey_limit: Duration,
) -> Result<(), ArgsError> {
    Bounds {
        isolation_timeout,
        check_interval,
        survey_limit,
    }
    .check(watchdog)
}

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
    let dir = std::env::temp_dir().join(format!("podha-watchdog-{}-{name}", std::process::id()));
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
    assert!(err.contains("there is no watchdog"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_character_device_that_is_no_watchdog_is_refused() {
    let dir = temp_dir("not-a-watchdog");
    let null = Path::new("/dev/null");
    // No sysfs attribute: refused before it is opened.
    let err = Watchdog::open_in(&dir, null, s(10), BOUNDS, false, false)
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
    let err = Watchdog::open_in(&sys, null, s(10), BOUNDS, false, false)
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("its driver has nowayout"), "{err}");
    // A sysfs that vouches for it: opened, and refused on its first answer.
    let sys = sysfs_for_dev_null(&dir.join("vouched"), "0");
    let err = Watchdog::open_in(&sys, null, s(10), BOUNDS, false, false)
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
    dog.pet().expect("pet");
    dog.pet().expect("pet");
    dog.disarm();
    assert!(!dog.is_armed());
    assert_eq!(std::fs::read_to_string(&device).expect("read"), "\n\nV");
    // Disarmed: nothing is written, a pet included, until it is armed again (opened anew,
    // from the start of the file).
    dog.pet().expect("nothing to pet");
    dog.disarm();
    assert_eq!(std::fs::read_to_string(&device).expect("read"), "\n\nV");
    std::fs::write(&device, "").expect("emptied");
    dog.arm().await.expect("armed again");
    assert!(dog.is_armed());
    assert_eq!(dog.timeout(), declared);
    assert_eq!(
        std::fs::read_to_string(&device).expect("read"),
        "\n",
        "armed with a pet: a stand-in is armed by its first write"
    );
    dog.pet().expect("pet");
    assert!(dog.disarm());
    assert_eq!(std::fs::read_to_string(&device).expect("read"), "\n\nV");
    let err = Watchdog::open(&dir.join("missing"), s(10), BOUNDS, true)
        .await
        .err()
        .expect("no such device")
        .to_string();
    assert!(err.contains("there is no watchdog"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every way opening the watchdog can fail, as `--watchdog` a stand-in or not.
async fn every_open_error(path: &Path) -> Vec<(&'static str, WatchdogError)> {
    let path = || path.to_path_buf();
    let task = tokio::spawn(std::future::pending::<()>());
    task.abort();
    let cancelled = task.await.expect_err("aborted");
    vec![
        ("missing", WatchdogError::Missing { path: path() }),
        (
            "refused",
            WatchdogError::Refused {
                path: path(),
                source: WatchdogRefusal::Nowayout,
            },
        ),
        (
            "refused, armed by a crashed agent",
            WatchdogError::RefusedRunning {
                path: path(),
                source: WatchdogRefusal::Nowayout,
            },
        ),
        (
            "not opened: EACCES",
            WatchdogError::Open {
                path: path(),
                source: std::io::ErrorKind::PermissionDenied.into(),
            },
        ),
        (
            "not opened: EBUSY",
            WatchdogError::Open {
                path: path(),
                source: std::io::ErrorKind::ResourceBusy.into(),
            },
        ),
        (
            "not looked at",
            WatchdogError::Inspect {
                path: path(),
                source: std::io::ErrorKind::NotADirectory.into(),
            },
        ),
        (
            "a directory",
            WatchdogError::NotAWatchdogFile { path: path() },
        ),
        (
            "a file not declared a stand-in",
            WatchdogError::StandInNotDeclared { path: path() },
        ),
        (
            "an open that hangs",
            WatchdogError::OpenTimedOut {
                path: path(),
                after: OPEN_TIMEOUT,
            },
        ),
        (
            "armed again with another timeout",
            WatchdogError::TimeoutChanged {
                path: path(),
                was: s(10),
                now: s(11),
            },
        ),
        (
            "an open whose task failed",
            WatchdogError::OpenTask {
                path: path(),
                source: cancelled,
            },
        ),
    ]
}

/// A node without a usable watchdog device runs on, not agent-protected; a mistake in the
/// options, or a stand-in that fails, stops the agent.
#[tokio::test]
async fn only_a_missing_refused_or_unopenable_device_lets_the_agent_run_without_a_watchdog() {
    let runs_without = [
        "missing",
        "refused",
        "not opened: EACCES",
        "not opened: EBUSY",
    ];
    for (what, error) in every_open_error(Path::new("/dev/watchdog")).await {
        let text = error.to_string();
        match run_without(error, false) {
            Ok(Unwatched::Unusable(kept)) => {
                assert!(runs_without.contains(&what), "{what}: runs without");
                assert_eq!(kept.to_string(), text, "{what}: the reason kept whole");
            }
            Ok(other) => panic!("{what}: {other}?"),
            Err(stops) => {
                assert!(!runs_without.contains(&what), "{what}: stops");
                assert_eq!(stops.to_string(), text, "{what}");
            }
        }
    }
    for (what, error) in every_open_error(Path::new("/run/bmc/watchdog")).await {
        assert!(
            run_without(error, true).is_err(),
            "a stand-in {what}: stops"
        );
    }
}

/// `--watchdog /dev/watchdog` on a node without one: nothing is opened, and the agent runs on
/// saying so.
#[tokio::test]
async fn a_watchdog_path_that_is_not_there_is_a_node_without_a_watchdog() {
    let dir = temp_dir("absent");
    let absent = dir.join("watchdog");
    let error = Watchdog::open(&absent, s(10), BOUNDS, false)
        .await
        .err()
        .expect("nothing there");
    let unwatched = run_without(error, false).expect("runs without");
    assert_eq!(
        unwatched.to_string(),
        format!(
            "there is no watchdog {} on this node (no such file)",
            absent.display()
        )
    );
    assert_eq!(
        advertised(&Err(unwatched)),
        format!(
            "none: there is no watchdog {} on this node (no such file)",
            absent.display()
        )
    );
    assert_eq!(
        advertised(&Err(Unwatched::NotConfigured)),
        "none: not configured"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A stand-in declared: what the agent advertises is its declared timeout.
#[tokio::test]
async fn an_armed_watchdog_is_advertised_by_its_timeout() {
    let dir = temp_dir("advertised");
    let device = dir.join("watchdog");
    std::fs::write(&device, "").expect("device");
    let dog = Watchdog::open(&device, s(10), BOUNDS, true)
        .await
        .expect("open");
    let mut armed = Ok(dog);
    assert_eq!(advertised(&armed), "10s");
    if let Ok(dog) = armed.as_mut() {
        dog.disarm();
    }
    assert_eq!(
        advertised(&armed),
        "10s",
        "disarmed, what it goes by when armed"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
