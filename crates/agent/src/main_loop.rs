//! The agent's main loop: every check interval, whether podha hears this node; if not for long
//! enough, what the peers say, the verdict ([`super::isolation::decide`]) and the watchdog's
//! pet ([`super::isolation::pet_watchdog`]). Also what the agent knows of being heard when it
//! starts, from the hearing file.

use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior};
use tracing::{info, warn};

use super::WatchdogError;
use super::arming;
use super::hearing_file::{HearingFile, LastHeard};
use super::isolation::{self, Confirmation, Silence, Verdict, decide, pet_watchdog, survey_after};
use super::leader_key::LeaderKey;
use super::peer_list::lock;
use super::peers::Peers;
use super::server::{Hearing, SharedHearing};
use super::watchdog::Watchdog;
use super::{AgentArgs, FenceCause, Fencer};

/// What the agent knows of podha hearing its node when it starts: what the hearing file says
/// an earlier agent knew in this boot (nothing, or a record of another boot: never heard since
/// the node booted; unknown: heard, not for `timeout` already), and whether podha held it.
pub(super) fn resume(file: &HearingFile, node: &str, timeout: Duration) -> Hearing {
    let now = std::time::SystemTime::now();
    let record = file.read(now);
    let last_heard = record.last;
    let heard_ago = last_heard.ago(now, timeout);
    match (last_heard, heard_ago) {
        (LastHeard::Never, _) => {
            info!(
                node,
                "podha has not heard this node since it booted (no record of this boot in the hearing file)"
            );
        }
        (LastHeard::At(_), Some(ago)) => {
            info!(
                node,
                ?ago,
                "going on from the last agent: podha last heard this node that long ago"
            );
        }
        _ => {}
    }
    if record.held {
        info!(
            node,
            "going on from the last agent: podha holds this node, and its watchdog is disarmed"
        );
    }
    if let Some(term) = record.renewals_in {
        info!(
            node,
            term,
            "going on from the last agent: podha's leader of that term counts this node's silence from its Lease renewals"
        );
    }
    let hearing = match (last_heard, heard_ago) {
        (LastHeard::Unknown, Some(ago)) => {
            Hearing::resumed_unsure(Instant::now(), ago, record.held)
        }
        _ => Hearing::resumed(Instant::now(), heard_ago, record.held),
    };
    hearing.resumed_counting_renewals(record.renewals_in)
}

/// Every `check_interval`: heard? If not for `isolation_timeout`, ask the peers and decide.
/// With a watchdog, the peers are asked earlier (see [`survey_after`]) and the watchdog is
/// petted as [`pet_watchdog`] says. A node podha never heard since it booted asks nobody and
/// stays, and so does one whose Lease renewals keep podha from counting its silence (see
/// [`isolation::Renewing`]; the term from `leader`). When podha last heard the node goes
/// to the hearing file. Returns only when a stand-in for the watchdog took no pet
/// ([`Watchdog::pet`]).
pub(super) async fn check_loop(
    args: &AgentArgs,
    hearing: SharedHearing,
    leader: &LeaderKey,
    peers: &Peers,
    fencer: &Fencer,
    mut watchdog: Option<&mut Watchdog>,
    hearing_file: &mut HearingFile,
) -> WatchdogError {
    let timeout = args.isolation_timeout;
    let watchdog_timeout = watchdog.as_deref().map(Watchdog::timeout);
    let survey_from = survey_after(timeout, watchdog_timeout);
    let window = isolation::renewal_window(timeout, watchdog_timeout);
    let mut ticker = tokio::time::interval(args.check_interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut said = Said::Nothing;
    let mut confirmation = Confirmation::default();
    let mut watchdog_record = WatchdogRecord::default();
    loop {
        ticker.tick().await;
        if let Err(e) = arming::follow(watchdog.as_deref_mut(), &hearing, hearing_file).await {
            return e;
        }
        let (silence, renewing) = {
            let (h, now) = (lock(&hearing), Instant::now());
            (h.silence(now), h.renewing(leader.term(), now, window))
        };
        let mut let_run = match pet(watchdog.as_deref_mut(), silence, timeout, None, renewing) {
            Ok(let_run) => watchdog_record.petted(let_run),
            Err(e) => return e,
        };
        // Beside the survey, the leader Lease is read if its watch is failing: a term it
        // missed may be one whose leader never heard the node (see `super::leader_key`).
        let survey = match silence {
            Silence::For(not_heard_for) if not_heard_for >= survey_from && renewing.is_none() => {
                let (survey, ()) = tokio::join!(
                    peers.survey(not_heard_for.min(timeout)),
                    leader.refresh_if_stale(args.survey_timeout)
                );
                Some(survey)
            }
            _ => None,
        };
        // The survey took a while: heard meanwhile?
        let (silence, renewing) = match &survey {
            Some(survey) => {
                let (h, now) = (lock(&hearing), Instant::now());
                let (silence, renewing) = (h.silence(now), h.renewing(leader.term(), now, window));
                drop(h);
                let petted = pet(
                    watchdog.as_deref_mut(),
                    silence,
                    timeout,
                    Some(survey),
                    renewing,
                );
                match petted {
                    Ok(now) => let_run = watchdog_record.petted(now),
                    Err(e) => return e,
                }
                (silence, renewing)
            }
            None => (silence, renewing),
        };
        watchdog_record.follow(let_run, fencer, &args.node).await;
        let verdict = decide(silence, timeout, survey.as_ref(), renewing);
        let fence = confirmation.fence_now(&verdict, Instant::now());
        match verdict {
            Verdict::Heard => {
                fencer.heard().await;
                said = Said::Nothing;
            }
            Verdict::Fence(why) if fence => {
                fencer.fence(FenceCause::Isolation, &why).await;
            }
            Verdict::Fence(why) => {
                info!(node = %args.node, why, "fencing unless heard within {:?}", isolation::CONFIRM);
            }
            Verdict::Stay(why) => said.stay(&args.node, silence, renewing.is_some(), &why),
        }
    }
}

/// Whether the check loop has recorded its watchdog let run out as a fence (see
/// `super::fence_record`): once when it stops petting it, taken back when it pets it again.
/// Both are logged, the second with how long the watchdog went unpetted since its last pet:
/// how close a node that stayed up came to its reset.
#[derive(Default)]
struct WatchdogRecord {
    /// When the watchdog was last petted.
    last_pet: Option<Instant>,
    let_run: bool,
}

impl WatchdogRecord {
    /// Notes a pet, unless the watchdog was let run (`let_run`, handed back).
    fn petted(&mut self, let_run: bool) -> bool {
        if !let_run {
            self.last_pet = Some(Instant::now());
        }
        let_run
    }

    async fn follow(&mut self, let_run: bool, fencer: &Fencer, node: &str) {
        let now = Instant::now();
        match (let_run, self.let_run) {
            (true, false) => {
                warn!(
                    node,
                    "not petting the watchdog: podha may count this node's silence"
                );
                fencer.letting_watchdog_run().await;
            }
            (false, true) => {
                let unpetted = now.saturating_duration_since(self.last_pet.unwrap_or(now));
                info!(
                    node,
                    unpetted_ms = u64::try_from(unpetted.as_millis()).unwrap_or(u64::MAX),
                    "petting the watchdog again, {unpetted:?} after its last pet"
                );
                fencer.petting_again().await;
            }
            _ => {}
        }
        self.let_run = let_run;
    }
}

/// Which `Stay` the check loop last said: each is said once per episode, not every second.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Said {
    Nothing,
    NeverHeard,
    Held,
    Unheard,
    /// Unheard, and the agent's Lease renewals keep podha from counting its silence.
    UnheardRenewing,
}

impl Said {
    fn stay(&mut self, node: &str, silence: Silence, renewing: bool, why: &str) {
        let now = match silence {
            Silence::NeverHeard => Self::NeverHeard,
            Silence::Held => Self::Held,
            Silence::For(_) if renewing => Self::UnheardRenewing,
            Silence::For(_) => Self::Unheard,
        };
        if *self == now {
            return;
        }
        match now {
            Self::NeverHeard | Self::Held => info!(node, why, "staying up"),
            _ => warn!(node, why, "not heard; staying up"),
        }
        *self = now;
    }
}

/// Pets the watchdog, if there is one, when [`pet_watchdog`] allows it (given the survey, if
/// one was made, and whether the agent's renewals keep podha from counting its silence).
/// Returns whether a watchdog is let run out (there is one, and it was not petted).
fn pet(
    watchdog: Option<&mut Watchdog>,
    silence: Silence,
    timeout: Duration,
    survey: Option<&isolation::Survey>,
    renewing: Option<isolation::Renewing>,
) -> Result<bool, WatchdogError> {
    match watchdog {
        Some(w) if pet_watchdog(silence, timeout, w.timeout(), survey, renewing) => {
            w.pet().map(|()| false)
        }
        Some(_) => Ok(true),
        None => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_restarted_agent_counts_as_heard_in_this_boot_unless_its_file_has_no_record() {
        let dir = std::env::temp_dir().join(format!("podha-resume-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("heard");
        let t = Duration::from_secs(30);
        let file = HearingFile::new(&path, Some("b1"));
        // No record: a node podha has not heard since it booted. Nothing to count.
        let silence = |h: Hearing| h.silence(Instant::now());
        assert_eq!(silence(resume(&file, "n1", t)), Silence::NeverHeard);
        // Garbled: heard in this boot, when unknown: not heard for the whole timeout already.
        std::fs::write(&path, "garbled").expect("write");
        assert_eq!(silence(resume(&file, "n1", t)), Silence::For(t));
        // A record: from there.
        let ten_ago = std::time::SystemTime::now() - Duration::from_secs(10);
        HearingFile::new(&path, Some("b1")).record(ten_ago, false, None);
        let Silence::For(ago) = silence(resume(&file, "n1", t)) else {
            panic!("heard in this boot")
        };
        assert!(
            ago >= Duration::from_secs(10) && ago < Duration::from_secs(11),
            "{ago:?}"
        );
        // Told that podha's leader of term 7 counts from the renewals: it goes on from there.
        HearingFile::new(&path, Some("b1")).record(ten_ago, false, Some(7));
        assert_eq!(resume(&file, "n1", t).renewals_in(), Some(7));
        HearingFile::new(&path, Some("b1")).record(ten_ago, false, None);
        assert_eq!(resume(&file, "n1", t).renewals_in(), None);
        // Held (the watchdog disarmed): from there, held.
        HearingFile::new(&path, Some("b1")).record(ten_ago, true, None);
        assert_eq!(silence(resume(&file, "n1", t)), Silence::Held);
        // A record of an earlier boot (the file outlived the reboot): never heard since.
        HearingFile::new(&path, Some("b0")).record(ten_ago, true, None);
        assert_eq!(silence(resume(&file, "n1", t)), Silence::NeverHeard);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
