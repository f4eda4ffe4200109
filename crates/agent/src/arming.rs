//! When the node's watchdog is armed: only while podha may count this node's silence, that is
//! while it has heard the node in this boot and does not hold it
//! ([`Hearing::counts_silence`]). A node podha has not heard since it booted, and one it holds
//! (paused, under maintenance, selected by no policy that asks for the `Agent` proof, its agent
//! cut off from its peers: see `judge::holds` in podha), runs with its watchdog disarmed: a
//! crashed, killed or crash-looping agent there resets nothing, as podha would prove nothing
//! from its silence.
//!
//! - **Start.** The agent opens the watchdog (which arms it) to set and read back the timeout
//!   it advertises, and disarms it at once unless the hearing file says podha may be counting
//!   the silence (see `super::main_loop::resume`).
//! - **Armed again** when podha lets go of the hold (or hears a node it never heard before):
//!   the hearing file first loses its word of the hold, then the watchdog is opened again with
//!   the same checks and must go by the timeout advertised. Until then the agent takes the node
//!   as held ([`Hearing::watchdog_armed`]): its answers say `held`, so podha arms its own proof
//!   only after the watchdog is, and its Lease says nothing of being heard.
//! - **Disarmed** once the hold is taken (after the Lease was written without its word of being
//!   heard: see `super::advert`), then the hearing file says held, so that a restarted agent
//!   goes on held and disarmed: it does not fence a paused node cut off from everything.
//!
//! The order is what makes a restart safe either way: the file says held only while the
//! watchdog is disarmed and podha holds the node, and it stops saying so before the watchdog is
//! armed again, which is before any answer tells podha it may count the silence. An agent
//! restarted between two steps goes on armed (the fence side), never held while podha counts.

use std::time::SystemTime;

use tokio::time::Instant;
use tracing::info;

use super::WatchdogError;
use super::counters;
use super::hearing_file::HearingFile;
use super::peer_list::lock;
use super::server::SharedHearing;
use super::watchdog::Watchdog;

/// What to do with the watchdog, given whether podha may count the node's silence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Arm,
    Disarm,
    Keep,
}

/// The step for a watchdog that is `armed`, when podha `counts` the node's silence.
pub const fn step(armed: bool, counts: bool) -> Step {
    match (armed, counts) {
        (false, true) => Step::Arm,
        (true, false) => Step::Disarm,
        _ => Step::Keep,
    }
}

/// Arms or disarms `watchdog` (if the agent has one) as `hearing` asks, and records when
/// podha last heard the node, and whether it holds it with the watchdog disarmed, in `file`
/// (the module's order). An error only when the watchdog cannot be armed again.
pub async fn follow(
    watchdog: Option<&mut Watchdog>,
    hearing: &SharedHearing,
    file: &mut HearingFile,
) -> Result<(), WatchdogError> {
    let (counts, heard_at, renewals_in) = {
        let h = lock(hearing);
        let heard_at = h
            .heard_ago(Instant::now())
            .and_then(|ago| SystemTime::now().checked_sub(ago));
        (h.counts_silence(), heard_at, h.renewals_in())
    };
    let armed = match watchdog {
        Some(watchdog) => {
            match step(watchdog.is_armed(), counts) {
                // Only once the file says this boot's hearing, not held: a file that cannot be
                // written (said once) keeps the watchdog disarmed and the node held, as a
                // restarted agent would go on from an older record, or none.
                Step::Arm => {
                    if heard_at.is_some_and(|at| file.record(at, false, renewals_in)) {
                        watchdog.arm().await?;
                        info!("watchdog armed: podha hears this node and may count its silence");
                    }
                }
                Step::Disarm => disarm(watchdog, hearing),
                Step::Keep => {}
            }
            lock(hearing).watchdog_armed(watchdog.is_armed());
            counters::watchdog_armed(watchdog.is_armed());
            watchdog.is_armed()
        }
        None => {
            counters::watchdog_armed(false);
            false
        }
    };
    let held = lock(hearing).held() && !armed;
    if let Some(at) = heard_at {
        file.record(at, held, renewals_in);
    }
    Ok(())
}

/// Disarms `watchdog` unless podha let go of the node since the look that asked for it. The
/// agent takes the node as held before the `V` (its answers say so from then on), under the
/// same lock as that second look: an answer that says not held, which lets podha count the
/// silence, never comes from an agent about to disarm. A device that did not take the `V`
/// stays armed and petted (said by it), and the node is no longer held for it.
fn disarm(watchdog: &mut Watchdog, hearing: &SharedHearing) {
    {
        let mut h = lock(hearing);
        if h.counts_silence() {
            return;
        }
        h.watchdog_armed(false);
    }
    if watchdog.disarm() {
        info!(
            "watchdog disarmed: podha holds this node, or has not heard it since it booted, and \
             counts none of its silence"
        );
    } else {
        lock(hearing).watchdog_armed(true);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;
    use crate::hearing_file::LastHeard;
    use crate::server::Hearing;
    use crate::watchdog::Bounds;

    #[test]
    fn armed_exactly_while_podha_counts_the_silence() {
        assert_eq!(step(false, true), Step::Arm);
        assert_eq!(step(true, false), Step::Disarm);
        assert_eq!(step(true, true), Step::Keep);
        assert_eq!(step(false, false), Step::Keep);
    }

    const BOUNDS: Bounds = Bounds {
        isolation_timeout: Duration::from_secs(30),
        check_interval: Duration::from_secs(1),
        survey_limit: Duration::from_secs(6),
    };

    /// A new directory `dir` and a stand-in there (a regular file, `watchdog`), opened.
    async fn stand_in(dir: &std::path::Path) -> Watchdog {
        std::fs::create_dir_all(dir).expect("dir");
        let device = dir.join("watchdog");
        std::fs::write(&device, "").expect("device");
        Watchdog::open(&device, Duration::from_secs(10), BOUNDS, true)
            .await
            .expect("open")
    }

    /// What the agent knows: podha heard it a second ago, and holds it or not (`held`).
    fn heard(held: bool) -> SharedHearing {
        Arc::new(Mutex::new(Hearing::resumed(
            Instant::now(),
            Some(Duration::from_secs(1)),
            held,
        )))
    }

    /// A stand-in (a regular file), the hearing and its file through a hold and its release:
    /// what is written to the watchdog, what the file says, what the answers would say.
    #[tokio::test]
    async fn a_hold_disarms_then_records_and_a_release_unrecords_then_arms() {
        let dir = std::env::temp_dir().join(format!("podha-arming-{}", std::process::id()));
        let mut dog = stand_in(&dir).await;
        let (device, record) = (dir.join("watchdog"), dir.join("heard"));
        let mut file = HearingFile::new(&record, Some("b1"));
        let read = || HearingFile::new(&record, Some("b1")).read(SystemTime::now());
        let written = || std::fs::read_to_string(&device).expect("watchdog");
        // Never heard since the node booted: disarmed at once, nothing recorded.
        let hearing: SharedHearing =
            Arc::new(Mutex::new(Hearing::resumed(Instant::now(), None, false)));
        follow(Some(&mut dog), &hearing, &mut file)
            .await
            .expect("follow");
        assert!(!dog.is_armed());
        assert_eq!(written(), "V");
        assert!(lock(&hearing).holding(), "unarmed: answers say held");
        assert_eq!(read().last, LastHeard::Never);
        // Heard: armed (opened anew), no longer held for it.
        lock(&hearing).probed(Instant::now(), Some(Duration::ZERO));
        lock(&hearing).hold(Some(false));
        assert!(lock(&hearing).holding(), "not before it is armed");
        follow(Some(&mut dog), &hearing, &mut file)
            .await
            .expect("follow");
        assert!(dog.is_armed());
        assert!(!lock(&hearing).holding());
        assert!(!read().held);
        // Held: a hold asked for keeps it armed until the Lease took it; then disarmed, and
        // only then recorded.
        lock(&hearing).hold(Some(true));
        follow(Some(&mut dog), &hearing, &mut file)
            .await
            .expect("follow");
        assert!(dog.is_armed(), "a hold pending is no hold yet");
        assert!(!read().held);
        lock(&hearing).hold_written(true);
        follow(Some(&mut dog), &hearing, &mut file)
            .await
            .expect("follow");
        assert!(!dog.is_armed());
        assert!(read().held, "recorded held once disarmed");
        assert!(written().ends_with('V'));
        // Let go of: held until armed again, the record first.
        lock(&hearing).hold(Some(false));
        assert!(lock(&hearing).holding(), "still unarmed");
        follow(Some(&mut dog), &hearing, &mut file)
            .await
            .expect("follow");
        assert!(dog.is_armed());
        assert!(!read().held);
        assert!(!lock(&hearing).holding());
        dog.disarm();
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Whether the hearing file in `dir` says held, as a restarted agent would read it.
    fn says_held(dir: &std::path::Path) -> bool {
        HearingFile::new(&dir.join("heard"), Some("b1"))
            .read(SystemTime::now())
            .held
    }

    /// A hearing held and taken, a file saying so, a stand-in (a regular file) disarmed.
    async fn held(dir: &std::path::Path) -> (Watchdog, SharedHearing, HearingFile) {
        let mut dog = stand_in(dir).await;
        let hearing = heard(true);
        let mut file = HearingFile::new(&dir.join("heard"), Some("b1"));
        follow(Some(&mut dog), &hearing, &mut file)
            .await
            .expect("follow");
        assert!(!dog.is_armed() && says_held(dir));
        (dog, hearing, file)
    }

    /// Arming again fails (the device gone): the file lost its word of the hold before, the
    /// node is still held, and the agent stops (its next one goes on armed, the fence side).
    #[tokio::test]
    async fn the_file_lets_go_of_the_hold_before_the_watchdog_is_armed() {
        let dir = std::env::temp_dir().join(format!("podha-arming-gone-{}", std::process::id()));
        let (mut dog, hearing, mut file) = held(&dir).await;
        std::fs::remove_file(dir.join("watchdog")).expect("device gone");
        lock(&hearing).hold(Some(false));
        let err = follow(Some(&mut dog), &hearing, &mut file)
            .await
            .expect_err("no device to arm");
        assert!(matches!(err, WatchdogError::Missing { .. }), "{err}");
        assert!(!says_held(&dir), "let go of first");
        assert!(!dog.is_armed());
        assert!(lock(&hearing).holding(), "held while unarmed");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A release since the look that asked for a disarm keeps the watchdog armed, and the node
    /// is not taken as held for it.
    #[tokio::test]
    async fn a_release_since_the_look_keeps_the_watchdog_armed() {
        let dir = std::env::temp_dir().join(format!("podha-arming-race-{}", std::process::id()));
        let mut dog = stand_in(&dir).await;
        let hearing = heard(false);
        disarm(&mut dog, &hearing);
        assert!(dog.is_armed(), "podha counts the silence again");
        assert!(!lock(&hearing).holding());
        lock(&hearing).hold(Some(true));
        lock(&hearing).hold_written(true);
        disarm(&mut dog, &hearing);
        assert!(!dog.is_armed() && lock(&hearing).holding());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The file cannot be written while it says held: the watchdog is not armed again, and the
    /// node stays held (a restarted agent would go on held while podha counts). Nor while it
    /// cannot be written at all: a restarted agent would go on as never heard.
    #[tokio::test]
    async fn a_hearing_not_recorded_keeps_the_watchdog_disarmed() {
        let dir = std::env::temp_dir().join(format!("podha-arming-stuck-{}", std::process::id()));
        let (mut dog, hearing, mut file) = held(&dir).await;
        // Where each record is written before it is renamed over the file: a directory.
        std::fs::create_dir(dir.join("heard.new")).expect("in the way");
        lock(&hearing).hold(Some(false));
        follow(Some(&mut dog), &hearing, &mut file)
            .await
            .expect("follow");
        assert!(says_held(&dir));
        assert!(!dog.is_armed(), "not armed while the file says held");
        assert!(lock(&hearing).holding());
        // No record at all, and none can be written.
        std::fs::remove_file(dir.join("heard")).expect("no record");
        follow(Some(&mut dog), &hearing, &mut file)
            .await
            .expect("follow");
        assert!(!dog.is_armed(), "not armed without a record of this boot");
        assert!(lock(&hearing).holding());
        std::fs::remove_dir(dir.join("heard.new")).expect("out of the way");
        follow(Some(&mut dog), &hearing, &mut file)
            .await
            .expect("follow");
        assert!(!says_held(&dir) && dog.is_armed() && !lock(&hearing).holding());
        dog.disarm();
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A watchdog that does not take the `V` (a stand-in whose BMC is gone) is still armed:
    /// not taken for disarmed, the file does not say held.
    #[tokio::test]
    async fn a_disarm_that_did_not_take_keeps_the_watchdog_armed() {
        let dir = std::env::temp_dir().join(format!("podha-arming-v-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let fifo = dir.join("watchdog");
        let bmc = crate::test_fifo::fifo_with_reader(&fifo);
        let mut dog = Watchdog::open(&fifo, Duration::from_secs(10), BOUNDS, true)
            .await
            .expect("open");
        let hearing = heard(false);
        let mut file = HearingFile::new(&dir.join("heard"), Some("b1"));
        lock(&hearing).hold(Some(true));
        lock(&hearing).hold_written(true);
        drop(bmc);
        follow(Some(&mut dog), &hearing, &mut file)
            .await
            .expect("follow");
        assert!(dog.is_armed(), "the V went nowhere");
        assert!(!says_held(&dir));
        assert!(lock(&hearing).held(), "the hold is taken all the same");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Without a watchdog a hold is recorded as it is taken, and nothing is held for arming.
    #[tokio::test]
    async fn without_a_watchdog_the_hold_alone_is_recorded() {
        let dir = std::env::temp_dir().join(format!("podha-arming-none-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let record = dir.join("heard");
        let mut file = HearingFile::new(&record, Some("b1"));
        let read = || HearingFile::new(&record, Some("b1")).read(SystemTime::now());
        let hearing = heard(false);
        follow(None, &hearing, &mut file).await.expect("follow");
        assert!(!lock(&hearing).holding());
        assert!(!read().held);
        lock(&hearing).hold(Some(true));
        lock(&hearing).hold_written(true);
        follow(None, &hearing, &mut file).await.expect("follow");
        assert!(read().held);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
