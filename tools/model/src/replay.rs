//! Trace replay: a history a real store recorded
//! (`taskfence::testing::trace`), checked step by step against the model's
//! transition relation. Each step's task, as the store left it, must be
//! the one `taskfence::backend::rules` makes of the task as the step found
//! it, at some instant of the store's clock consistent with the steps
//! before; and each answer must be the one the rules give. The first step
//! that is not a step of the model is reported, with why.
//!
//! The store's clock is not in the trace: it is bounded below by what the
//! steps show (a lease granted until `t` for `d` was granted at `t - d`; a
//! task finished at `t`; the fixture's advances), and a step whose instant
//! no write pins may happen at any instant from that bound on.

use std::collections::HashMap;
use std::time::Duration;

use taskfence::backend::rules::{self, BeginEffectRule, CancelRule, ClaimRule, FinishEffectRule, ReopenRule};
use taskfence::backend::{Plan, new_lease};
use taskfence::effect::{Effect, EffectStart};
use taskfence::store::Fenced;
use taskfence::testing::trace::{Seen, SeenEffect, Step};
use taskfence::{Rejection, Status, Task, TaskId};
use time::OffsetDateTime;

/// How far an instant the store wrote may fall below the clock's bound
/// (a database rounds instants to the microsecond).
const ROUNDING: Duration = Duration::from_millis(1);

/// Checks `steps`, in order; the number of steps on success, else the
/// first disallowed step and why.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use taskfence::testing::trace::Recording;
/// use taskfence::testing::{Fixture, MemoryFixture, new_task};
/// let fixture = Recording::new(MemoryFixture::new());
/// fixture.store().submit(new_task("a")).await.unwrap();
/// assert_eq!(model_check::replay::replay(&fixture.steps()), Ok(1));
/// # }
/// ```
///
/// # Errors
///
/// The first step that is not a step of the model, with its number and why.
pub fn replay(steps: &[Step]) -> Result<usize, String> {
    let mut replay = Replay::default();
    for (i, step) in steps.iter().enumerate() {
        replay
            .step(step)
            .map_err(|why| format!("step {i} ({}) is not a step of the model: {why}", describe(step)))?;
    }
    Ok(steps.len())
}

/// Parses a trace written as JSON lines, one step a line.
///
/// ```
/// assert_eq!(model_check::replay::parse("\n").map(|steps| steps.len()), Ok(0));
/// ```
///
/// # Errors
///
/// The first line that is not a step.
pub fn parse(jsonl: &str) -> Result<Vec<Step>, String> {
    jsonl
        .lines()
        .filter(|line| !line.trim().is_empty())
        .enumerate()
        .map(|(i, line)| serde_json::from_str(line).map_err(|e| format!("line {}: {e}", i + 1)))
        .collect()
}

/// Writes `steps` as JSON lines.
///
/// ```
/// let step = taskfence::testing::trace::Step::new("advance");
/// let text = model_check::replay::to_jsonl(&[step.clone()]);
/// assert_eq!(model_check::replay::parse(&text), Ok(vec![step]));
/// ```
///
/// # Panics
///
/// Never for a step the recorder made (every field serializes).
pub fn to_jsonl(steps: &[Step]) -> String {
    let mut out = String::new();
    for step in steps {
        out += &serde_json::to_string(step).expect("a step serializes");
        out.push('\n');
    }
    out
}

fn describe(step: &Step) -> String {
    let mut s = step.op.clone();
    if let Some(id) = step.task_id {
        s += &format!(" of task {id}");
    }
    if let Some(v) = step.version {
        s += &format!(" by assignment {v}");
    }
    s += &format!(", answered {}", step.outcome);
    if let Some(reason) = &step.reason {
        s += &format!(" ({reason})");
    }
    s
}

/// What the checker knows between steps.
#[derive(Default)]
struct Replay {
    /// Each task as the last step left it (`None`: gone).
    known: HashMap<TaskId, Option<Task>>,
    /// The store's clock is at least this.
    clock: Option<OffsetDateTime>,
    /// Steps cut short, by task, with the clock's bound when they were:
    /// their write may have happened, then or later (a statement still
    /// running on the server after its caller gave up on it), so the
    /// instant it shows may fall below steps that came after.
    unsure: HashMap<TaskId, (Step, Option<OffsetDateTime>)>,
    /// Each effect record as the last effect step left it.
    effects: HashMap<(TaskId, String), Option<Effect>>,
}

/// The fields a rule decides or reads.
fn core(t: &Task) -> String {
    format!(
        "{} v{} base{} lease_until={:?} not_before={:?} saved={} input={}",
        t.status,
        t.version,
        t.budget_base,
        t.lease_until,
        t.not_before,
        t.response.is_some(),
        t.input_hash
    )
}

fn show(t: Option<&Task>) -> String {
    t.map_or("absent".to_owned(), core)
}

fn same(a: Option<&Task>, b: Option<&Task>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.id == b.id && core(a) == core(b) && a.response == b.response,
        (None, None) => true,
        _ => false,
    }
}

fn unchanged(before: Option<&Task>, after: Option<&Task>) -> Result<(), String> {
    if same(before, after) {
        Ok(())
    } else {
        Err(format!(
            "the model writes nothing here, but the task went from {} to {}",
            show(before),
            show(after)
        ))
    }
}

fn expect_outcome(step: &Step, outcome: &str, reason: Option<&str>) -> Result<(), String> {
    let reason_ok = reason.is_none_or(|r| step.reason.as_deref() == Some(r));
    if step.outcome == outcome && reason_ok {
        Ok(())
    } else {
        Err(format!(
            "the store answered {}{}, the model answers {outcome}{}",
            step.outcome,
            step.reason
                .as_ref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default(),
            reason.map(|r| format!(" ({r})")).unwrap_or_default()
        ))
    }
}

fn rejected(step: &Step, rejection: &Rejection, before: &Task, after: Option<&Task>) -> Result<(), String> {
    if step.outcome == "accepted" {
        return Err(format!(
            "the store accepted it, but the model refuses it ({rejection}; the task was {})",
            core(before)
        ));
    }
    expect_outcome(step, "rejected", Some(rejection.label()))?;
    unchanged(Some(before), after)
}

impl Replay {
    fn step(&mut self, step: &Step) -> Result<(), String> {
        if step.op == "advance" {
            if let (Some(clock), Some(by)) = (self.clock.as_mut(), step.duration) {
                *clock += by;
            }
            return Ok(());
        }
        for seen in &step.tasks {
            self.observe(seen)?;
        }
        let effect = step.task_id.zip(step.effect.as_ref());
        if let Some((id, seen)) = effect {
            self.observe_effect(id, seen)?;
        }
        if cut_short(step) {
            for seen in &step.tasks {
                self.unsure.insert(seen.id, (step.clone(), self.clock));
            }
            if let Some((id, seen)) = effect {
                // Its write may have happened: the next step finds out.
                self.effects.remove(&(id, seen.name.clone()));
            }
            return Ok(());
        }
        match step.op.as_str() {
            "submit" => self.submit(step)?,
            "claim_next" | "purge_expired" => {
                // One statement writes every row, each at its own reading of
                // the clock, in no order the trace shows: each row's instant
                // is bounded by the steps before, not by the other rows.
                let start = self.clock;
                let mut latest = start;
                for seen in &step.tasks {
                    self.clock = start;
                    self.judge_many(step, seen)?;
                    latest = latest.max(self.clock);
                }
                self.clock = latest;
            }
            _ => {
                for seen in &step.tasks {
                    self.judge(step, seen.before.as_ref(), seen.after.as_ref())?;
                }
            }
        }
        for seen in &step.tasks {
            self.known.insert(seen.id, seen.after.clone());
        }
        if let Some((id, seen)) = effect {
            self.effects.insert((id, seen.name.clone()), seen.after.clone());
        }
        Ok(())
    }

    /// The effect record as a step found it must be as the last effect step
    /// on it left it (a record no step wrote is not one of the model's).
    fn observe_effect(&self, id: TaskId, seen: &SeenEffect) -> Result<(), String> {
        match self.effects.get(&(id, seen.name.clone())) {
            Some(known) if known != &seen.before => Err(format!(
                "effect {} of task {id} changed with no step recorded: was {}, found {}",
                seen.name,
                show_effect(known.as_ref()),
                show_effect(seen.before.as_ref())
            )),
            _ => Ok(()),
        }
    }

    /// The task as a step found it must be as the last step left it (or as
    /// a step cut short may have left it).
    fn observe(&mut self, seen: &Seen) -> Result<(), String> {
        let Some(known) = self.known.get(&seen.id).cloned() else {
            return Ok(());
        };
        if same(known.as_ref(), seen.before.as_ref()) {
            // A step cut short stays unsure: its write may still land.
            return Ok(());
        }
        if let Some((cut, floor)) = self.unsure.get(&seen.id).cloned() {
            // The cut-short step's write happened: it must be one the model
            // allows, at an instant from the bound it was cut at; that
            // instant does not bound the steps after it (they may have
            // started before its write did).
            let clock = self.clock;
            for outcome in ["accepted", "acquired", "failed"] {
                let mut answered = cut.clone();
                answered.outcome = outcome.to_owned();
                self.clock = floor;
                let fits = self
                    .judge(&answered, known.as_ref(), seen.before.as_ref())
                    .is_ok();
                self.clock = clock;
                if fits {
                    self.unsure.remove(&seen.id);
                    return Ok(());
                }
            }
            return Err(format!(
                "task {} became {} after a {} whose answer was lost, which the model never makes of {}",
                seen.id,
                show(seen.before.as_ref()),
                cut.op,
                show(known.as_ref())
            ));
        }
        Err(format!(
            "task {} changed with no step recorded: was {}, found {}",
            seen.id,
            show(known.as_ref()),
            show(seen.before.as_ref())
        ))
    }

    /// The instants the step may have happened at: the one its write pins,
    /// or the clock's bound and every instant after it where a rule's
    /// decision about this task changes.
    fn instants(
        &self,
        step: &Step,
        before: Option<&Task>,
        after: Option<&Task>,
    ) -> Result<Vec<OffsetDateTime>, String> {
        let floor = self
            .clock
            .or(before.map(|t| t.created_at))
            .or(after.map(|t| t.created_at));
        if let Some(pinned) = pinned(step, before, after).or_else(|| effect_pinned(step)) {
            if let Some(floor) = floor
                && pinned + ROUNDING < floor
            {
                return Err(format!(
                    "the store wrote at {pinned}, before an instant it had already shown ({floor}): its clock went back"
                ));
            }
            return Ok(vec![pinned]);
        }
        let Some(floor) = floor else {
            // Neither before nor after holds the task, and no instant was
            // shown yet: the step reads no instant (an unknown id).
            return Ok(vec![OffsetDateTime::UNIX_EPOCH]);
        };
        let mut at = vec![floor];
        if let Some(t) = before {
            for edge in [t.lease_until, t.not_before, t.deadline_at(), Some(t.expires_at)]
                .into_iter()
                .flatten()
            {
                if edge > floor {
                    at.push(edge);
                }
            }
        }
        at.sort();
        Ok(at)
    }

    /// Judges a step on one task at each instant it may have happened at; the
    /// first that fits moves the clock's bound.
    fn judge(&mut self, step: &Step, before: Option<&Task>, after: Option<&Task>) -> Result<(), String> {
        let instants = self.instants(step, before, after)?;
        let mut why = String::from("no instant of the store's clock is known");
        for now in instants {
            match decide(step, before, after, now) {
                Ok(()) => {
                    self.clock = Some(self.clock.map_or(now, |c| c.max(now)));
                    return Ok(());
                }
                Err(e) => why = e,
            }
        }
        Err(why)
    }

    /// One task of a `claim_next` or a purge: a changed one was claimed,
    /// failed for a spent budget, or purged; the others are unchanged.
    fn judge_many(&mut self, step: &Step, seen: &Seen) -> Result<(), String> {
        let (before, after) = (seen.before.as_ref(), seen.after.as_ref());
        let leased = step.leased.contains(&seen.id);
        if !leased && same(before, after) {
            return Ok(());
        }
        let Some(b) = before else {
            return unchanged(before, after);
        };
        let instants = self.instants(step, before, after)?;
        let mut why = String::new();
        for now in instants {
            let verdict = if step.op == "purge_expired" {
                if after.is_none() && b.status.is_terminal() && b.expires_at <= now {
                    Ok(())
                } else {
                    Err(format!(
                        "task {} purged, or changed, though the model purges only terminal tasks past their retention: it was {}, expiring at {}",
                        b.id,
                        core(b),
                        b.expires_at
                    ))
                }
            } else if rules::due_since(b, now).is_none() {
                Err(format!(
                    "task {} handed out though it needed no worker: it was {}",
                    b.id,
                    core(b)
                ))
            } else {
                let mut claim = step.clone();
                claim.op = "claim".to_owned();
                claim.outcome = if leased { "acquired" } else { "failed" }.to_owned();
                decide(&claim, before, after, now)
            };
            match verdict {
                Ok(()) => {
                    self.clock = Some(self.clock.map_or(now, |c| c.max(now)));
                    return Ok(());
                }
                Err(e) => why = e,
            }
        }
        Err(why)
    }

    fn submit(&mut self, step: &Step) -> Result<(), String> {
        let old = step.tasks.iter().find(|s| s.before.is_some());
        let new = step.tasks.iter().find(|s| s.before.is_none());
        match step.outcome.as_str() {
            "created" => {
                if let Some(old) = old {
                    return Err(format!(
                        "a new task was written for a key that names task {} ({})",
                        old.id,
                        show(old.before.as_ref())
                    ));
                }
                let Some(task) = new.and_then(|s| s.after.as_ref()) else {
                    return Err("the store answered created, and no task is found under the key".into());
                };
                if task.status != Status::Pending
                    || task.version != 0
                    || Some(task.input_hash) != step.input_hash
                {
                    return Err(format!(
                        "a new task must be pending, unclaimed, with the submitted inputs: found {}",
                        core(task)
                    ));
                }
                self.clock = Some(self.clock.map_or(task.created_at, |c| c.max(task.created_at)));
                Ok(())
            }
            "existing" => {
                let Some(old) = old else {
                    return Err("the store answered existing, and no task was under the key".into());
                };
                let before = old.before.as_ref().expect("found before");
                if Some(before.input_hash) != step.input_hash {
                    return Err(format!(
                        "the store answered existing to other inputs: the model refuses a reused key with other inputs (task {})",
                        before.id
                    ));
                }
                unchanged(old.before.as_ref(), old.after.as_ref())?;
                if new.is_some() {
                    return Err("the store answered existing, and wrote a new task".into());
                }
                Ok(())
            }
            _ => {
                if let Some(new) = new {
                    return Err(format!(
                        "the store answered {}, and wrote task {}",
                        step.outcome, new.id
                    ));
                }
                match old {
                    Some(old) => unchanged(old.before.as_ref(), old.after.as_ref()),
                    None => Ok(()),
                }
            }
        }
    }
}

/// The instant a step's write shows it happened at, if it shows one.
fn pinned(step: &Step, before: Option<&Task>, after: Option<&Task>) -> Option<OffsetDateTime> {
    let (b, a) = (before?, after?);
    if same(before, after) {
        return None;
    }
    if a.status.is_terminal() && !b.status.is_terminal() {
        return a.finished_at;
    }
    match step.op.as_str() {
        "claim" | "claim_next" if a.version == b.version + 1 => Some(a.lease_until? - step.duration?),
        "renew" => Some(a.lease_until? - step.duration?),
        "release" | "release_unstarted" => a.not_before,
        "reopen" => Some(a.budget_started_at),
        "fail" => {
            let failure = step.failure.as_ref()?;
            match rules::plan(b, step.attempt_id?, failure) {
                Plan::RetryAfter(delay) => Some(a.not_before? - delay),
                Plan::Stop(_) => None,
            }
        }
        _ => None,
    }
}

/// Whether the rules, at `now`, take the task from `before` to `after` with
/// the step's answer.
fn decide(
    step: &Step,
    before: Option<&Task>,
    after: Option<&Task>,
    now: OffsetDateTime,
) -> Result<(), String> {
    if step.outcome == "error" {
        // Refused input, an unknown id, a lost connection: nothing written.
        if let Some(seen) = &step.effect {
            effect_unchanged(seen)?;
        }
        return unchanged(before, after);
    }
    let Some(b) = before else {
        if step.outcome == "accepted" || step.outcome == "acquired" {
            return Err("the store accepted a write to a task it does not hold".into());
        }
        return unchanged(before, after);
    };
    let version = step.version.unwrap_or_default();
    match step.op.as_str() {
        "claim" => match rules::claim(b, now) {
            ClaimRule::Take => {
                if step.outcome != "acquired" {
                    return expect_outcome(step, "acquired", None);
                }
                let mut taken = b.clone();
                rules::taken(&mut taken, now + step.duration.unwrap_or_default());
                if same(Some(&taken), after) {
                    Ok(())
                } else {
                    Err(format!(
                        "the model's claim leaves {}, the store left {}",
                        core(&taken),
                        show(after)
                    ))
                }
            }
            ClaimRule::Exhaust(reason) => {
                if step.outcome == "acquired" {
                    return Err(format!(
                        "the store granted assignment {}, but the model ends the task ({}): {} attempts in a budget of {}",
                        b.version + 1,
                        reason.as_str(),
                        b.attempts_in_budget(),
                        b.policy.max_attempts
                    ));
                }
                expect_outcome(step, "failed", None)?;
                match after {
                    Some(a) if a.status == Status::Failed && a.version == b.version => Ok(()),
                    _ => Err(format!(
                        "the model fails the task, the store left {}",
                        show(after)
                    )),
                }
            }
            ClaimRule::Answer(claim) => {
                if step.outcome == "acquired" {
                    return Err(format!(
                        "the store granted assignment {}, but the model answers {} (the task was {})",
                        b.version + 1,
                        claim.label(),
                        core(b)
                    ));
                }
                expect_outcome(step, claim.label(), None)?;
                unchanged(before, after)
            }
        },
        "renew" => match rules::fence(b, version, now) {
            Err(r) => rejected(step, &r, b, after),
            Ok(()) => {
                expect_outcome(step, "accepted", None)?;
                let mut renewed = b.clone();
                renewed.lease_until = Some(now + step.duration.unwrap_or_default());
                if same(Some(&renewed), after) {
                    Ok(())
                } else {
                    Err(format!(
                        "the model's renewal leaves {}, the store left {}",
                        core(&renewed),
                        show(after)
                    ))
                }
            }
        },
        "complete" => match rules::accept(b, version, now) {
            Err(r) => rejected(step, &r, b, after),
            Ok(()) => {
                expect_outcome(step, "accepted", None)?;
                match after {
                    Some(a)
                        if a.status == Status::Completed
                            && a.response.is_some()
                            && a.version == b.version =>
                    {
                        Ok(())
                    }
                    _ => Err(format!(
                        "the model completes the task, the store left {}",
                        show(after)
                    )),
                }
            }
        },
        "fail" => match rules::fence(b, version, now) {
            Err(r) => rejected(step, &r, b, after),
            Ok(()) => {
                expect_outcome(step, "accepted", None)?;
                let (Some(failure), Some(attempt)) = (&step.failure, step.attempt_id) else {
                    return Err("a failure report without its failure or attempt".into());
                };
                match (rules::after_failure(b, attempt, failure, now), after) {
                    (Ok(not_before), Some(a))
                        if a.status == Status::Pending
                            && a.not_before == Some(not_before)
                            && a.version == b.version =>
                    {
                        Ok(())
                    }
                    (Err(_), Some(a)) if a.status == Status::Failed && a.version == b.version => Ok(()),
                    (decision, _) => Err(format!(
                        "the model's failure decides {decision:?}, the store left {}",
                        show(after)
                    )),
                }
            }
        },
        "release" | "release_unstarted" => {
            let work = if step.op == "release" {
                rules::Work::Started
            } else {
                rules::Work::NotStarted
            };
            match rules::release(b, version, now, work) {
                Err(r) => rejected(step, &r, b, after),
                Ok(released) => {
                    expect_outcome(step, "accepted", None)?;
                    if same(Some(&released), after) {
                        Ok(())
                    } else {
                        Err(format!(
                            "the model's release leaves {}, the store left {}",
                            core(&released),
                            show(after)
                        ))
                    }
                }
            }
        }
        "record_operation" => match rules::fence(b, version, now) {
            Err(r) => rejected(step, &r, b, after),
            Ok(()) => {
                expect_outcome(step, "accepted", None)?;
                unchanged(before, after)
            }
        },
        "begin_effect" | "finish_effect" => match rules::fence(b, version, now) {
            Err(r) => {
                rejected(step, &r, b, after)?;
                step.effect.as_ref().map_or(Ok(()), effect_unchanged)
            }
            Ok(()) => {
                unchanged(before, after)?;
                decide_effect(step, b, now)
            }
        },
        "cancel" => match rules::cancel(b) {
            CancelRule::Cancel => {
                expect_outcome(step, "accepted", None)?;
                match after {
                    Some(a) if a.status == Status::Cancelled && a.version == b.version => Ok(()),
                    _ => Err(format!(
                        "the model cancels the task, the store left {}",
                        show(after)
                    )),
                }
            }
            CancelRule::Answer(Fenced::Accepted(_)) => {
                expect_outcome(step, "accepted", None)?;
                unchanged(before, after)
            }
            CancelRule::Answer(Fenced::Rejected(r)) => rejected(step, &r, b, after),
        },
        "reopen" => match rules::reopen(b) {
            ReopenRule::Reopen => {
                expect_outcome(step, "accepted", None)?;
                match after {
                    Some(a)
                        if a.status == Status::Pending
                            && a.version == b.version
                            && a.budget_base == b.version
                            && a.response.is_none() =>
                    {
                        Ok(())
                    }
                    _ => Err(format!(
                        "the model reopens the task with a fresh budget, the store left {}",
                        show(after)
                    )),
                }
            }
            ReopenRule::Answer(r) => rejected(step, &r, b, after),
        },
        other => Err(format!("an operation the model does not know: {other}")),
    }
}

/// A step whose write may or may not have happened: cut short, or answered
/// with an error that says the store's answer was lost (a connection
/// killed, a server restarting), not that it refused. The next read of
/// its task settles which.
fn cut_short(step: &Step) -> bool {
    step.outcome == "unknown"
        || (step.outcome == "error"
            && matches!(step.reason.as_deref(), Some("storage" | "read_timeout" | "busy")))
}

/// The instant an effect step's write shows it happened at: a new intent's
/// `intended_at`, a settled record's `settled_at`.
fn effect_pinned(step: &Step) -> Option<OffsetDateTime> {
    let seen = step.effect.as_ref()?;
    let after = seen.after.as_ref()?;
    if seen.before.as_ref() == Some(after) {
        return None;
    }
    match step.op.as_str() {
        "begin_effect" => Some(after.intended_at),
        "finish_effect" => after.settled_at,
        _ => None,
    }
}

/// The label the store's answer to a `begin_effect` carries.
fn start_label(start: &EffectStart) -> &'static str {
    match start {
        EffectStart::Call { ambiguous: None, .. } => "call",
        EffectStart::Call {
            ambiguous: Some(_), ..
        } => "call_ambiguous",
        EffectStart::Done(_) => "done",
        EffectStart::Stop(_) => "stop",
        _ => "unknown",
    }
}

fn show_effect(e: Option<&Effect>) -> String {
    e.map_or("absent".to_owned(), |e| {
        format!(
            "{} v{} attempt{} ambiguous={} reference={:?} error={:?}",
            e.state, e.version, e.attempt, e.ambiguous, e.reference, e.error
        )
    })
}

fn effect_unchanged(seen: &SeenEffect) -> Result<(), String> {
    if seen.before == seen.after {
        Ok(())
    } else {
        Err(format!(
            "the model writes no effect record here, but effect {} went from {} to {}",
            seen.name,
            show_effect(seen.before.as_ref()),
            show_effect(seen.after.as_ref())
        ))
    }
}

fn close(a: OffsetDateTime, b: OffsetDateTime) -> bool {
    (a - b).unsigned_abs() <= ROUNDING
}

/// The record the store left must be the one the rules made: every field,
/// its instants up to the database's rounding.
fn same_effect(model: &Effect, store: Option<&Effect>) -> Result<(), String> {
    let fits = store.is_some_and(|e| {
        e.task_id == model.task_id
            && e.name == model.name
            && e.key == model.key
            && e.state == model.state
            && e.version == model.version
            && e.attempt == model.attempt
            && e.reference == model.reference
            && e.error == model.error
            && e.ambiguous == model.ambiguous
            && close(e.created_at, model.created_at)
            && close(e.intended_at, model.intended_at)
            && match (e.settled_at, model.settled_at) {
                (Some(a), Some(b)) => close(a, b),
                (a, b) => a == b,
            }
    });
    if fits {
        Ok(())
    } else {
        Err(format!(
            "the model records effect {} as {}, the store left {}",
            model.name,
            show_effect(Some(model)),
            show_effect(store)
        ))
    }
}

/// An effect step whose fence passed at `now` on `task`: the record it
/// left and its answer must be the ones `rules::begin_effect` /
/// `rules::finish_effect` make of the record it found.
fn decide_effect(step: &Step, task: &Task, now: OffsetDateTime) -> Result<(), String> {
    let Some(seen) = &step.effect else {
        // A trace recorded before effect records were: the fence and the
        // unchanged task are all it shows.
        return expect_outcome(step, "accepted", None);
    };
    let Some(attempt_id) = step.attempt_id else {
        return Err("an effect step without its attempt".into());
    };
    // The lease as the store sees it: the fence passed, so it is the
    // task's current assignment.
    let lease = new_lease(
        task.clone(),
        attempt_id,
        String::new(),
        task.lease_until.unwrap_or(now),
    );
    if step.op == "begin_effect" {
        match rules::begin_effect(seen.before.as_ref(), &lease, &seen.name, now) {
            BeginEffectRule::Write { effect, start } => {
                expect_outcome(step, "accepted", Some(start_label(&start)))?;
                same_effect(&effect, seen.after.as_ref())
            }
            BeginEffectRule::Answer(start) => {
                expect_outcome(step, "accepted", Some(start_label(&start)))?;
                effect_unchanged(seen)
            }
        }
    } else {
        let Some(outcome) = &seen.outcome else {
            return Err("a finish_effect step without its outcome".into());
        };
        match rules::finish_effect(seen.before.as_ref(), &lease, &seen.name, outcome, now) {
            Ok(FinishEffectRule::Write(settled)) => {
                if step.outcome == "accepted" {
                    same_effect(&settled, seen.after.as_ref())
                } else {
                    expect_outcome(step, "accepted", None)
                }
            }
            Ok(FinishEffectRule::Answer(_)) => {
                expect_outcome(step, "accepted", None)?;
                effect_unchanged(seen)
            }
            Err(refused) => {
                if step.outcome == "accepted" {
                    return Err(format!(
                        "the store accepted it, but the model refuses it ({refused}; the record was {})",
                        show_effect(seen.before.as_ref())
                    ));
                }
                expect_outcome(step, "error", Some("invalid_input"))?;
                effect_unchanged(seen)
            }
        }
    }
}
