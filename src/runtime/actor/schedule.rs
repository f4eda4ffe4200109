//! The action schedule, one entry per action key: dispatch sends an intent to the writer as a
//! write, unless the same action is in flight or waiting for its retry, or this replica does
//! not lead; the answer of a write comes back to the same entry (a success clears it, a failure
//! sets its retry); `results.rs` records what the success did.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

use super::super::actuator::RetryPolicy;
use super::super::writer::{ActResult, count_dropped, intent_kind};
use super::Actor;
use crate::backoff::{
    ACTION_RETRY_MAX, Exponential, POLL_INTERVAL, POLLS_AT_INTERVAL, action_retry,
};
use crate::incident::MovedPod;
use crate::planner::Intent;

/// An action sent to the writer and not answered yet.
pub(super) struct Sent {
    /// The pod a delete moves, as it was when sent.
    pub moved: Option<MovedPod>,
    pub policy: String,
    pub sent_at: Instant,
}

/// One action's place in the schedule.
#[derive(Default)]
struct Entry {
    sent: Option<Sent>,
    /// After a failure: when the action may be sent again, and the delays of the next ones.
    retry: Option<(Instant, Exponential)>,
    /// How many answers said the effect has not shown yet, since the action last succeeded
    /// (or since a pause longer than [`POLLS_FORGOTTEN_AFTER`]), and when the last did.
    polls: u32,
    last_poll: Option<Instant>,
}

/// A gap between two polls after which the count starts over: a new wait (the next incident
/// of the node), not the same one going on at the longest delay.
const POLLS_FORGOTTEN_AFTER: Duration = ACTION_RETRY_MAX.saturating_mul(2);

/// Actions in flight or waiting for a retry, one per intent key: an action is sent once at a
/// time, and a failed one not before its backoff allows (kube-runtime's scheduler does the same
/// per object).
#[derive(Default)]
pub(super) struct Schedule {
    entries: BTreeMap<String, Entry>,
}

impl Schedule {
    /// Whether the action may be sent now: not in flight, and no retry due later.
    pub fn is_due(&self, key: &str, now: Instant) -> bool {
        self.entries
            .get(key)
            .is_none_or(|e| e.sent.is_none() && e.retry.as_ref().is_none_or(|(due, _)| now >= *due))
    }

    pub fn in_flight(&self, key: &str) -> bool {
        self.entries.get(key).is_some_and(|e| e.sent.is_some())
    }

    pub fn send(&mut self, key: String, sent: Sent) {
        self.entries.entry(key).or_default().sent = Some(sent);
    }

    /// The answer to an action in flight came: `None` if none was (a late answer). A success
    /// forgets the action; a failure returns the delay before it may be sent again: the next of
    /// its backoff, or the longest at once for a failure no retry can fix (RBAC, an invalid
    /// request), which is tried again only in case someone fixed its cause.
    pub fn answer(
        &mut self,
        key: &str,
        answer: Answer,
        now: Instant,
    ) -> Option<(Sent, Option<Duration>)> {
        let entry = self.entries.get_mut(key)?;
        let sent = entry.sent.take()?;
        let policy = match answer {
            Answer::Done => {
                self.entries.remove(key);
                return Some((sent, None));
            }
            Answer::Failed(policy) => policy,
        };
        if policy == RetryPolicy::Poll {
            let forgotten = entry
                .last_poll
                .is_some_and(|last| now.saturating_duration_since(last) > POLLS_FORGOTTEN_AFTER);
            entry.polls = if forgotten {
                1
            } else {
                entry.polls.saturating_add(1)
            };
            entry.last_poll = Some(now);
        }
        let polls = entry.polls;
        let (due, delays) = entry.retry.get_or_insert_with(|| (now, action_retry()));
        let delay = match policy {
            // The builder sets no limit on the number of delays: there is always a next one.
            RetryPolicy::Retry => delays.next().unwrap_or(ACTION_RETRY_MAX),
            RetryPolicy::GiveUp => {
                delays.next();
                ACTION_RETRY_MAX
            }
            // Answered: the backoff of failures does not advance.
            RetryPolicy::Poll if polls <= POLLS_AT_INTERVAL => POLL_INTERVAL,
            RetryPolicy::Poll => ACTION_RETRY_MAX,
        };
        *due = now + delay;
        Some((sent, Some(delay)))
    }
}

/// How an action in flight ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Answer {
    Done,
    Failed(RetryPolicy),
}

impl Actor {
    /// Dispatch: reports a hold, or sends the action once (and again only when its retry is
    /// due); a follower only counts what it would have done.
    pub(super) async fn dispatch(&mut self, intent: Intent, now: Instant) {
        if let Intent::Hold {
            policy,
            node,
            reason,
        } = &intent
        {
            self.report_hold(policy, node.as_deref(), reason).await;
            return;
        }
        let key = intent.key();
        if !self.schedule.is_due(&key, now) {
            return;
        }
        if !self.leading {
            let scope = intent.node().unwrap_or("");
            if self.reported.first(scope, format!("dropped/{key}")) {
                count_dropped(&self.metrics, &intent);
            }
            return;
        }
        let policy = match intent.policy() {
            Some(policy) => policy.to_string(),
            // An untaint is counted for the policy podha's marker on the node names.
            None => intent
                .node()
                .map(|n| self.marker_policy(n))
                .unwrap_or_default(),
        };
        let sent_at = Instant::now();
        if let Intent::PowerOff { node, .. } = &intent {
            // Before it goes out: a `ForceOff` whose answer is lost still counts as podha's.
            self.ledger.record_force_off_sending(node, sent_at);
        }
        let sent = Sent {
            moved: self.moved_pod(&intent),
            policy,
            sent_at,
        };
        self.schedule.send(key, sent);
        let node = match &intent {
            Intent::TaintNode { node, .. }
            | Intent::RemoveTaint { node }
            | Intent::RequestFence { node, .. }
            | Intent::WithdrawFenceRequest { node } => self.state.view.nodes.get(node).cloned(),
            _ => None,
        };
        self.out.writes.act(intent, node).await;
    }

    /// The pod a delete (or a mark before it) moves, as the view shows it now.
    fn moved_pod(&self, intent: &Intent) -> Option<MovedPod> {
        let (Intent::ForceDeletePod { node, uid, .. } | Intent::MarkPodNotReady { node, uid, .. }) =
            intent
        else {
            return None;
        };
        let view = &self.state.view;
        view.pods_on(node)
            .iter()
            .find(|p| p.metadata.uid.as_deref() == Some(uid))
            .map(|p| MovedPod::from_pod(p, view))
    }

    /// The answer of a write: on success, what it did goes into the incident and the reports;
    /// a failure waits for its retry.
    pub(super) fn on_result(&mut self, result: ActResult, now: Instant) {
        let key = result.intent.key();
        let answer = match &result.result {
            Ok(_) => Answer::Done,
            Err(error) => Answer::Failed(error.retry()),
        };
        let Some((sent, retry_in)) = self.schedule.answer(&key, answer, now) else {
            return;
        };
        if let Some(kind) = intent_kind(&result.intent) {
            self.metrics
                .actions
                .observe_action_latency(kind, now - sent.sent_at);
        }
        match result.result {
            Ok(outcome) => self.record_outcome(&result.intent, outcome, sent, now),
            Err(error) => {
                if !error.not_off_yet() {
                    warn!(%key, %error, ?retry_in, "action failed");
                }
                self.record_power_failure(&result.intent, &error, sent.sent_at);
                self.report_power_failure(&result.intent, &error, now);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent() -> Sent {
        Sent {
            moved: None,
            policy: "p".into(),
            sent_at: Instant::now(),
        }
    }

    #[test]
    fn an_action_is_sent_once_at_a_time() {
        let now = Instant::now();
        let mut schedule = Schedule::default();
        assert!(schedule.is_due("taint/n1", now));
        schedule.send("taint/n1".into(), sent());
        assert!(schedule.in_flight("taint/n1"));
        assert!(!schedule.is_due("taint/n1", now));
        assert!(
            schedule.is_due("taint/n2", now),
            "other keys are independent"
        );
        let (_, retry) = schedule
            .answer("taint/n1", Answer::Done, now)
            .expect("in flight");
        assert_eq!(retry, None);
        assert!(schedule.is_due("taint/n1", now));
        assert!(
            schedule.answer("taint/n1", Answer::Done, now).is_none(),
            "a late answer finds nothing in flight"
        );
    }

    #[test]
    fn a_failed_action_waits_doubling_delays_up_to_the_maximum_and_success_resets_them() {
        let mut now = Instant::now();
        let mut schedule = Schedule::default();
        let mut delays = Vec::new();
        for _ in 0..10 {
            assert!(schedule.is_due("delete/u", now));
            schedule.send("delete/u".into(), sent());
            let (_, retry) = schedule
                .answer("delete/u", Answer::Failed(RetryPolicy::Retry), now)
                .expect("in flight");
            let delay = retry.expect("a failure is retried");
            assert!(!schedule.is_due("delete/u", now + delay - Duration::from_millis(1)));
            delays.push(delay.as_millis());
            now += delay;
        }
        assert_eq!(
            delays,
            [
                500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000, 30000
            ]
        );
        schedule.send("delete/u".into(), sent());
        schedule
            .answer("delete/u", Answer::Done, now)
            .expect("in flight");
        schedule.send("delete/u".into(), sent());
        let (_, retry) = schedule
            .answer("delete/u", Answer::Failed(RetryPolicy::Retry), now)
            .expect("in flight");
        assert_eq!(
            retry,
            Some(Duration::from_millis(500)),
            "a success starts over"
        );
    }

    #[test]
    fn a_read_whose_effect_has_not_shown_is_sent_again_every_second_without_backing_off() {
        let mut now = Instant::now();
        let mut schedule = Schedule::default();
        let mut answer = |policy, at| {
            schedule.send("confirm-power-off/n1".into(), sent());
            let (_, retry) = schedule
                .answer("confirm-power-off/n1", Answer::Failed(policy), at)
                .expect("in flight");
            let due_early = schedule.is_due("confirm-power-off/n1", at + POLL_INTERVAL / 2);
            (retry, due_early)
        };
        for _ in 0..POLLS_AT_INTERVAL {
            assert_eq!(answer(RetryPolicy::Poll, now), (Some(POLL_INTERVAL), false));
            now += POLL_INTERVAL;
        }
        // An effect that has not shown for so long is asked after the longest delay.
        assert_eq!(answer(RetryPolicy::Poll, now).0, Some(ACTION_RETRY_MAX));
        // A failure meanwhile starts the backoff from its first delay, and the polls go on
        // from where they were: a BMC that times out now and then is no reason to read it
        // every second for good.
        assert_eq!(
            answer(RetryPolicy::Retry, now).0,
            Some(Duration::from_millis(500))
        );
        assert_eq!(answer(RetryPolicy::Poll, now).0, Some(ACTION_RETRY_MAX));
        // A new wait, long after: polled every second again.
        let later = now + POLLS_FORGOTTEN_AFTER + POLL_INTERVAL;
        assert_eq!(answer(RetryPolicy::Poll, later).0, Some(POLL_INTERVAL));
    }

    #[test]
    fn a_failure_no_retry_can_fix_waits_the_longest_delay_at_once() {
        let now = Instant::now();
        let mut schedule = Schedule::default();
        schedule.send("untaint/n1".into(), sent());
        let refused = Answer::Failed(RetryPolicy::GiveUp);
        let (_, retry) = schedule
            .answer("untaint/n1", refused, now)
            .expect("in flight");
        assert_eq!(retry, Some(ACTION_RETRY_MAX));
        let just_before = now + ACTION_RETRY_MAX - Duration::from_millis(1);
        assert!(!schedule.is_due("untaint/n1", just_before));
        assert!(schedule.is_due("untaint/n1", now + ACTION_RETRY_MAX));
        // It took its step of the backoff: a later transient failure goes on from there.
        schedule.send("untaint/n1".into(), sent());
        let transient = Answer::Failed(RetryPolicy::Retry);
        let (_, retry) = schedule
            .answer("untaint/n1", transient, now)
            .expect("in flight");
        assert_eq!(retry, Some(Duration::from_secs(1)));
    }
}
