//! The workload: who presses Send or Regenerate when, and which faults each
//! reply task meets. Drawn up front from the seed, so a run is a pure function
//! of its [`Config`] on the virtual timebase.
//!
//! Conversation 1 is scripted: with faults on, it meets every fault kind at
//! known instants, and its timeline is the one the demo prints. The other
//! conversations draw their faults at random with the configured rate.

use std::time::Duration;

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use taskfence::policy::FailureKind;
use taskfence::{InputHash, RequestKey};

use crate::sim::Config;

/// The conversation whose timeline is printed.
pub const SHOWCASE: usize = 1;

/// The operation name every reply task is submitted under.
pub const OPERATION: &str = "chat.reply";

/// A fault that strikes one attempt (one claim) of a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptFault {
    /// The provider fails: `Retryable` (a 503) or `Ambiguous` (a timeout: it may have answered).
    ProviderError(FailureKind),
    /// The worker process dies after the provider answered, before saving.
    Crash,
    /// The worker stalls (GC pause, partition) after the provider answered, for this long.
    Pause(Duration),
    /// The store saves the answer but its reply to the worker is lost.
    LostStoreAck,
    /// The answer is saved but the queue never gets the delete.
    LostDelete,
}

/// One reply task to create: one press of Send or Regenerate.
#[derive(Debug, Clone)]
pub struct TaskPlan {
    /// Short name for output: `T1`, `T2`, …
    pub label: String,
    /// 1-based conversation number.
    pub conversation: usize,
    /// 1-based user message number within the conversation.
    pub message: usize,
    /// `Some(i)`: this is a Regenerate of the message that task `i` answered.
    pub regenerate_of: Option<usize>,
    /// When the user presses the button.
    pub at: Duration,
    /// The browser's request id for this press.
    pub key: RequestKey,
    /// The network drops the API's reply and the browser resends this much later.
    pub resend_after: Option<Duration>,
    /// Before this press, a client bug resends task `i`'s request key with this message's inputs.
    pub conflict_with: Option<usize>,
    /// The dispatcher publishes a second copy, visible this much later.
    pub extra_copy_after: Option<Duration>,
    /// Faults by attempt number.
    pub faults: Vec<(u32, AttemptFault)>,
    /// The provider fails every attempt (the task's budget runs out).
    pub poisoned: bool,
    /// A fixed provider latency (the scripted conversation), instead of a random one.
    pub latency: Option<Duration>,
}

impl TaskPlan {
    /// The inputs that define the work: the conversation and the user message
    /// (a real app adds the document version, model settings…).
    pub fn input_hash(&self) -> InputHash {
        input_hash(self.conversation, self.message)
    }

    /// The fault planned for attempt `attempt`, if any.
    pub fn fault(&self, attempt: u32) -> Option<AttemptFault> {
        let planned = self.faults.iter().find(|(n, _)| *n == attempt).map(|(_, f)| *f);
        match planned {
            Some(f @ AttemptFault::ProviderError(_)) => Some(f),
            _ if self.poisoned => Some(AttemptFault::ProviderError(FailureKind::Retryable)),
            other => other,
        }
    }
}

/// The input hash of user message `message` in `conversation`.
pub fn input_hash(conversation: usize, message: usize) -> InputHash {
    InputHash::of([
        format!("conversation-{conversation}"),
        format!("message-{message}"),
    ])
}

/// The request key of one press, scoped to the user (of the run, on a store
/// that keeps earlier runs' tasks).
fn key(run: u32, conversation: usize, name: String) -> RequestKey {
    let scope = match run {
        0 => format!("user-{conversation}"),
        n => format!("run-{n}/user-{conversation}"),
    };
    RequestKey::new(scope, OPERATION, name)
}

const fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// The scripted conversation. With faults on it shows, in order: a resent
/// Send, an extra copy arriving while the lease is live, a worker paused past
/// its lease and rejected after a takeover; a reused key rejected, a crash
/// after the provider answered, a lost queue delete; a Regenerate that is new
/// work, a long answer kept alive by lease renewals and a lost store reply; a
/// task whose budget runs out.
fn showcase(faults: bool, run: u32) -> Vec<TaskPlan> {
    let latency = Some(secs(4));
    let plain = |label: &str, message, at, name: &str| TaskPlan {
        label: label.to_owned(),
        conversation: SHOWCASE,
        message,
        regenerate_of: None,
        at,
        key: key(run, SHOWCASE, name.to_owned()),
        resend_after: None,
        conflict_with: None,
        extra_copy_after: None,
        faults: Vec::new(),
        poisoned: false,
        latency,
    };
    let mut t1 = plain("T1", 1, secs(0), "send-1");
    let mut t2 = plain("T2", 2, secs(60), "send-2");
    let mut t3 = plain("T3", 2, secs(120), "regenerate-2");
    t3.regenerate_of = Some(1);
    // A long answer: the worker renews its lease while it waits.
    t3.latency = Some(secs(40));
    let mut t4 = plain("T4", 3, secs(180), "send-3");
    if faults {
        t1.resend_after = Some(secs(1));
        t1.extra_copy_after = Some(secs(5));
        t1.faults = vec![(1, AttemptFault::Pause(secs(28)))];
        t2.conflict_with = Some(0);
        t2.faults = vec![(1, AttemptFault::Crash), (2, AttemptFault::LostDelete)];
        t3.faults = vec![(1, AttemptFault::LostStoreAck)];
        t4.poisoned = true;
        t4.extra_copy_after = Some(secs(40));
        t4.faults = vec![(2, AttemptFault::ProviderError(FailureKind::Ambiguous))];
    }
    vec![t1, t2, t3, t4]
}

/// Every task of the run: the scripted conversation, then random
/// conversations until there are `tasks` tasks. Arrivals are spread so that
/// the workers are mostly free and the scripted story keeps its timing.
pub fn workload(config: &Config, rng: &mut ChaCha8Rng) -> Vec<TaskPlan> {
    let Config {
        tasks,
        workers,
        faults: fault_rate,
        run,
        ..
    } = *config;
    let mut plans = showcase(fault_rate > 0.0, run);
    plans.truncate(tasks);
    let remaining = tasks - plans.len();
    // A task holds a worker ~10 s on average (calls, long answers, pauses,
    // retries): one arrival per 30 s per worker keeps them under half busy.
    let span_ms = (remaining as u64 * 30_000 / workers.max(1) as u64).max(1);
    let chance = |rng: &mut ChaCha8Rng, p: f64| rng.random_bool(p.clamp(0.0, 1.0));
    let mut conversation = SHOWCASE;
    while plans.len() < tasks {
        conversation += 1;
        let start = secs(1) + Duration::from_millis(rng.random_range(0..span_ms));
        let presses = rng.random_range(1..=4usize);
        let mut messages = 0;
        let mut first = None;
        for press in 0..presses {
            if plans.len() == tasks {
                break;
            }
            let index = plans.len();
            let first_index = *first.get_or_insert(index);
            let at = start + secs(30) * press as u32;
            let regenerate = messages > 0 && chance(rng, fault_rate);
            let (message, regenerate_of, name) = if regenerate {
                // Regenerate the latest message: find the task that answered it.
                let of = (first_index..index)
                    .rev()
                    .find(|&i| plans[i].message == messages && plans[i].regenerate_of.is_none())
                    .expect("the latest message has a task");
                (messages, Some(of), format!("regenerate-{messages}-{press}"))
            } else {
                messages += 1;
                (messages, None, format!("send-{messages}"))
            };
            let conflict_with = if regenerate_of.is_none() && message > 1 && chance(rng, fault_rate / 2.0) {
                (first_index..index).find(|&i| plans[i].message == message - 1)
            } else {
                None
            };
            let resend_after =
                chance(rng, fault_rate).then(|| Duration::from_millis(rng.random_range(200..3_000)));
            let extra_copy_after = chance(rng, fault_rate).then(|| secs(rng.random_range(1..60)));
            let poisoned = chance(rng, fault_rate / 4.0);
            let mut faults = Vec::new();
            if chance(rng, (fault_rate * 3.0).min(1.0)) {
                let fault = match rng.random_range(0..6) {
                    0 => AttemptFault::Crash,
                    1 => AttemptFault::Pause(secs(rng.random_range(30..60))),
                    2 => AttemptFault::ProviderError(FailureKind::Retryable),
                    3 => AttemptFault::ProviderError(FailureKind::Ambiguous),
                    4 => AttemptFault::LostStoreAck,
                    _ => AttemptFault::LostDelete,
                };
                faults.push((1, fault));
            }
            plans.push(TaskPlan {
                label: format!("T{}", index + 1),
                conversation,
                message,
                regenerate_of,
                at,
                key: key(run, conversation, name),
                resend_after,
                conflict_with,
                extra_copy_after,
                faults,
                poisoned,
                latency: None,
            });
        }
    }
    plans
}
