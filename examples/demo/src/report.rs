//! What a run shows: the scripted conversation's [`Timeline`], the
//! [`Summary`] counts, and the invariant check, computed from the store's own
//! records ([`TaskStore::get`], [`TaskStore::attempts`]) rather than from the
//! simulation's bookkeeping.

use std::fmt::Write as _;
use std::time::Duration;

use taskfence::store::AttemptOutcome;
use taskfence::{Error, Rejection, Status, TaskStore};

use crate::sim::{MAX_ATTEMPTS, ProviderCall, TaskRecord};

/// One line of the timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Simulated time.
    pub at: Duration,
    /// Who acted: `client`, `queue`, `worker-2`, `provider`, `chat`.
    pub actor: String,
    /// What happened.
    pub text: String,
}

/// The story of one conversation, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Timeline {
    /// The lines.
    pub entries: Vec<Entry>,
}

impl Timeline {
    /// Adds a line.
    pub fn push(&mut self, at: Duration, actor: &str, text: String) {
        self.entries.push(Entry {
            at,
            actor: actor.to_owned(),
            text,
        });
    }
}

/// The counts of a run. On the virtual timebase the same seed gives an equal
/// `Summary`; nothing in it depends on random ids or the wall clock.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Conversations simulated.
    pub conversations: u64,
    /// Calls to `submit`: Sends, Regenerates, resends and reused keys.
    pub submissions: u64,
    /// Submissions that created a task.
    pub tasks_created: u64,
    /// Of those, Regenerates (a new key with the same inputs).
    pub regenerates: u64,
    /// Resends of the same key and inputs answered with the existing task.
    pub resends_deduplicated: u64,
    /// Reused keys with other inputs rejected with `KeyConflict`.
    pub conflicts_rejected: u64,
    /// Messages received by workers.
    pub deliveries: u64,
    /// Deliveries of a message already received before (not deleted in time).
    pub redeliveries: u64,
    /// Deliveries of an extra copy of a task's message.
    pub extra_copies_delivered: u64,
    /// Claims that acquired the task (attempts).
    pub attempts: u64,
    /// Claims answered `Completed`: the saved reply, no provider call.
    pub claims_completed: u64,
    /// Claims answered `Busy`.
    pub claims_busy: u64,
    /// Claims answered `Backoff`.
    pub claims_backoff: u64,
    /// Claims answered `Failed`.
    pub claims_failed: u64,
    /// Calls to the simulated provider.
    pub provider_calls: u64,
    /// Provider calls that failed (503 or timeout).
    pub provider_errors: u64,
    /// `complete` calls the store accepted.
    pub saved_replies: u64,
    /// Completions rejected as `Superseded`.
    pub stale_superseded: u64,
    /// Completions rejected as `AlreadyCompleted`.
    pub stale_already_completed: u64,
    /// Completions rejected as `LeaseExpired`.
    pub stale_lease_expired: u64,
    /// Completions rejected as `NotRunning`.
    pub stale_not_running: u64,
    /// Failure reports rejected (a stale worker's `fail`).
    pub stale_failures_rejected: u64,
    /// Lease renewals accepted (heartbeats during long answers).
    pub renewals: u64,
    /// Lease renewals rejected (the worker gave the attempt up).
    pub renewals_rejected: u64,
    /// Workers that crashed after the provider answered.
    pub crashes: u64,
    /// Workers paused past their lease.
    pub pauses: u64,
    /// Accepted completions whose reply to the worker was lost.
    pub lost_store_acks: u64,
    /// Queue deletes that were lost.
    pub lost_deletes: u64,
    /// Tasks the store holds as completed at the end.
    pub completed_tasks: u64,
    /// Tasks the store holds as failed (budget exhausted) at the end.
    pub exhausted_tasks: u64,
    /// Tasks in neither state at the end (a violation: every task must end).
    pub unfinished_tasks: u64,
    /// Invariant violations found (empty: the check passed).
    pub violations: Vec<String>,
}

impl Summary {
    /// Counts a rejected completion by its reason.
    pub fn count_stale_completion(&mut self, rejection: &Rejection) {
        match rejection {
            Rejection::Superseded { .. } => self.stale_superseded += 1,
            Rejection::AlreadyCompleted(_) => self.stale_already_completed += 1,
            Rejection::LeaseExpired => self.stale_lease_expired += 1,
            // A completion is only ever refused for the reasons above; any other counts as not running.
            _ => self.stale_not_running += 1,
        }
    }

    /// Completions rejected for any reason.
    pub fn stale_completions(&self) -> u64 {
        self.stale_superseded
            + self.stale_already_completed
            + self.stale_lease_expired
            + self.stale_not_running
    }

    /// Deliveries beyond the first of each task.
    pub fn duplicate_deliveries(&self) -> u64 {
        self.redeliveries + self.extra_copies_delivered
    }

    /// `true` when the invariant check found nothing wrong.
    pub fn invariant_holds(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Checks the run against the store's records and fills the end-state counts
/// of `summary`. For every task:
/// - completed ⇔ exactly one `complete` was accepted, the store's saved
///   response is that one, and exactly one attempt ended `completed`;
/// - failed ⇒ nothing accepted, nothing saved; any other status is unfinished;
/// - its attempts are numbered 1..=version and within the budget;
/// - every provider call was made under a distinct claimed version.
pub async fn verify(
    store: &dyn TaskStore,
    tasks: &[TaskRecord],
    calls: &[ProviderCall],
    summary: &mut Summary,
    anomalies: Vec<String>,
) -> Result<(), Error> {
    let mut violations = anomalies;
    let mut called: Vec<Vec<u64>> = vec![Vec::new(); tasks.len()];
    for call in calls {
        called[call.task].push(call.version);
    }
    for (record, versions) in tasks.iter().zip(&mut called) {
        let label = &record.plan.label;
        let Some(id) = record.id else {
            violations.push(format!("{label}: never created"));
            continue;
        };
        let Some(task) = store.get(id).await? else {
            violations.push(format!("{label}: missing from the store"));
            continue;
        };
        let attempts = store.attempts(id).await?;
        match task.status {
            Status::Completed => {
                summary.completed_tasks += 1;
                let completed_attempts = attempts
                    .iter()
                    .filter(|a| a.outcome == AttemptOutcome::Completed)
                    .count();
                if record.accepted.len() != 1 {
                    violations.push(format!(
                        "{label}: completed, with {} accepted completions",
                        record.accepted.len()
                    ));
                } else if task.response.as_ref() != record.accepted.first() {
                    violations.push(format!("{label}: the saved response is not the accepted one"));
                }
                if completed_attempts != 1 {
                    violations.push(format!("{label}: {completed_attempts} attempts ended completed"));
                }
            }
            Status::Failed => {
                summary.exhausted_tasks += 1;
                if !record.accepted.is_empty() || task.response.is_some() {
                    violations.push(format!("{label}: failed, yet a response was accepted or saved"));
                }
            }
            other => {
                summary.unfinished_tasks += 1;
                violations.push(format!("{label}: still {other} at the end of the run"));
            }
        }
        let numbers: Vec<u64> = attempts.iter().map(|a| u64::from(a.number)).collect();
        if numbers != (1..=task.version).collect::<Vec<_>>() {
            violations.push(format!(
                "{label}: attempts {numbers:?} do not match version {}",
                task.version
            ));
        }
        if task.attempts() > task.policy.max_attempts {
            violations.push(format!(
                "{label}: {} attempts, budget {}",
                task.attempts(),
                task.policy.max_attempts
            ));
        }
        versions.sort_unstable();
        if versions.windows(2).any(|w| w[0] == w[1]) || versions.iter().any(|v| !numbers.contains(v)) {
            violations.push(format!(
                "{label}: provider called at versions {versions:?}, claimed {numbers:?}"
            ));
        }
    }
    if summary.provider_calls < summary.saved_replies {
        violations.push(format!(
            "{} saved replies from only {} provider calls",
            summary.saved_replies, summary.provider_calls
        ));
    }
    if summary.saved_replies != summary.completed_tasks {
        violations.push(format!(
            "{} saved replies for {} completed tasks",
            summary.saved_replies, summary.completed_tasks
        ));
    }
    summary.violations = violations;
    Ok(())
}

/// Appends what the user finally sees in `conversation`, read from the store.
pub async fn conversation_view(
    store: &dyn TaskStore,
    tasks: &[TaskRecord],
    conversation: usize,
    timeline: &mut Timeline,
    at: Duration,
) -> Result<(), Error> {
    for record in tasks.iter().filter(|t| t.plan.conversation == conversation) {
        let Some(id) = record.id else { continue };
        let Some(task) = store.get(id).await? else {
            continue;
        };
        let plan = &record.plan;
        let what = if plan.regenerate_of.is_some() {
            format!("message {} (regenerated)", plan.message)
        } else {
            format!("message {}", plan.message)
        };
        let shows = match task.status {
            Status::Completed => format!("one reply, {}'s, saved by v{}", plan.label, task.version),
            Status::Failed => format!(
                "no reply: {} failed after {} attempts; the user can retry",
                plan.label,
                task.attempts()
            ),
            other => format!("{} is still {other}", plan.label),
        };
        timeline.push(at, "chat", format!("{what} shows {shows}"));
    }
    Ok(())
}

/// How the run was made, for the header.
#[derive(Debug, Clone)]
pub struct RunInfo {
    /// The backend, in words.
    pub backend: String,
    /// Seed, sizes and fault rate.
    pub config: crate::sim::Config,
    /// Wall time the run took.
    pub elapsed: Duration,
}

/// Renders the timeline, the summary table and, last, the invariant line.
pub fn render(outcome: &crate::sim::Outcome, info: &RunInfo) -> String {
    let mut out = String::new();
    let s = &outcome.summary;
    let c = &info.config;
    let _ = writeln!(
        out,
        "Timeline of conversation {} (times are simulated; vN = assignment version)",
        crate::plan::SHOWCASE
    );
    for e in &outcome.timeline.entries {
        let _ = writeln!(
            out,
            "  {:>9}  {:<9}  {}",
            format!("t+{:.1}s", e.at.as_secs_f64()),
            e.actor,
            e.text
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Summary: {} reply tasks in {} conversation{}, {} workers, seed {}, fault rate {:.2}, on {}",
        c.tasks,
        s.conversations,
        if s.conversations == 1 { "" } else { "s" },
        c.workers,
        c.seed,
        c.faults,
        info.backend
    );
    let _ = writeln!(
        out,
        "  (simulated {}, wall time {:.2} s)",
        minutes(outcome.simulated),
        info.elapsed.as_secs_f64()
    );
    let mut row = |what: &str, n: u64, note: String| {
        let _ = writeln!(out, "  {what:<34}{n:>8}   {note}");
    };
    row(
        "submissions",
        s.submissions,
        "Send and Regenerate presses, resends, reused keys".into(),
    );
    row(
        "  → tasks created",
        s.tasks_created,
        format!("{} of them Regenerates: a new key is new work", s.regenerates),
    );
    row(
        "  → resends deduplicated",
        s.resends_deduplicated,
        "same key, same inputs: the existing task, nothing written".into(),
    );
    row(
        "  → reused keys rejected",
        s.conflicts_rejected,
        "same key, other inputs: KeyConflict, nothing written".into(),
    );
    row("deliveries", s.deliveries, "at-least-once queue".into());
    row(
        "  → duplicate deliveries",
        s.duplicate_deliveries(),
        format!(
            "{} extra copies, {} redeliveries",
            s.extra_copies_delivered, s.redeliveries
        ),
    );
    row(
        "  → claimed (attempts)",
        s.attempts,
        format!("budget {MAX_ATTEMPTS} attempts per task"),
    );
    row(
        "  → already completed",
        s.claims_completed,
        "saved reply returned, no provider call".into(),
    );
    row(
        "  → busy / backoff / failed",
        s.claims_busy + s.claims_backoff + s.claims_failed,
        format!(
            "{} busy, {} backoff, {} failed: message hidden or deleted",
            s.claims_busy, s.claims_backoff, s.claims_failed
        ),
    );
    row(
        "provider calls",
        s.provider_calls,
        format!("{} failed (503 or timeout)", s.provider_errors),
    );
    row(
        "lease renewals",
        s.renewals,
        format!("heartbeats during long answers; {} rejected", s.renewals_rejected),
    );
    row(
        "saved replies",
        s.saved_replies,
        "complete() accepted by the store".into(),
    );
    let mut stale = format!(
        "{} superseded, {} already completed, {} lease expired",
        s.stale_superseded, s.stale_already_completed, s.stale_lease_expired
    );
    if s.stale_not_running > 0 {
        let _ = write!(stale, ", {} not running", s.stale_not_running);
    }
    if s.stale_failures_rejected > 0 {
        let _ = write!(stale, " (+{} stale fail reports)", s.stale_failures_rejected);
    }
    row("stale completions rejected", s.stale_completions(), stale);
    row(
        "worker crashes after the answer",
        s.crashes,
        "answer lost, task taken over after the lease".into(),
    );
    row(
        "worker pauses past the lease",
        s.pauses,
        "came back late and were fenced off".into(),
    );
    row(
        "lost acknowledgements",
        s.lost_store_acks + s.lost_deletes,
        format!(
            "{} store replies (re-read the task), {} queue deletes (redelivered)",
            s.lost_store_acks, s.lost_deletes
        ),
    );
    row(
        "tasks completed",
        s.completed_tasks,
        "status completed in the store".into(),
    );
    row(
        "tasks exhausted",
        s.exhausted_tasks,
        "budget spent: terminal failed, visible to all".into(),
    );
    if s.unfinished_tasks > 0 {
        row(
            "tasks unfinished",
            s.unfinished_tasks,
            "neither completed nor failed".into(),
        );
    }
    for v in &s.violations {
        let _ = writeln!(out, "  VIOLATION: {v}");
    }
    let _ = writeln!(
        out,
        "  checked against the store: every task finished within its budget, one provider call per claim"
    );
    if s.invariant_holds() {
        let _ = write!(
            out,
            "invariant: one saved reply per completed task: OK ({} completed tasks, {} saved replies)",
            s.completed_tasks, s.saved_replies
        );
    } else {
        let _ = write!(
            out,
            "invariant: one saved reply per completed task: VIOLATED ({} problems, listed above)",
            s.violations.len()
        );
    }
    out
}

fn minutes(d: Duration) -> String {
    let secs = d.as_secs();
    format!("{}m {:02}s", secs / 60, secs % 60)
}
