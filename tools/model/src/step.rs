//! The transitions of the world: each action applied to the store the way
//! `MemoryStore` applies it (one atomic step, decided by [`Rules`]), and to
//! the worker, queue, client or operator that takes it.

use taskfence::backend::rules::{self, BeginEffectRule, CancelRule, ClaimRule, FinishEffectRule, ReopenRule};
use taskfence::backend::{new_lease, new_task, renewed};
use taskfence::effect::{EffectKey, EffectOutcome, EffectStart, EffectState};
use taskfence::policy::{Failure, FailureKind};
use taskfence::{Claim, Lease, NewTask, Rejection, Status, Task, TaskId};

use crate::seam::{Rules, SubmitRule};
use crate::world::{
    Action, Config, EFFECT, Work, Worker, World, attempt_id, input, number, request_key, response, task_id,
    ticks,
};

/// What a step did, for the step invariants.
#[derive(Debug)]
pub(crate) enum Obs {
    /// A claim of the task as it was (`before`), leaving it as `after`.
    Claimed {
        before: Task,
        after: Task,
        granted: bool,
    },
    /// A completion the store accepted, by assignment `version`.
    Saved { before: Task, version: u64 },
    /// A fenced write (renew, fail, release, begin or finish effect) the store accepted.
    Fenced {
        op: &'static str,
        before: Task,
        version: u64,
    },
    /// A failure the store accepted, leaving the task as `after`.
    Failed { before: Task, after: Task },
    /// A submission of a key that was (`existed`) or was not in the store.
    Submitted {
        existed: bool,
        created: bool,
        unchanged: bool,
    },
    /// The effect key a worker was handed for task `n`.
    EffectKey { n: u8, key: EffectKey },
    /// Something a correct store never answers.
    Unexpected(String),
}

/// The model: a configuration and the rules its store decides by.
pub(crate) struct WorldModel {
    pub(crate) config: Config,
    pub(crate) rules: Rules,
}

impl WorldModel {
    fn live(&self, w: &World) -> bool {
        w.tick <= self.config.horizon
    }

    pub(crate) fn enumerate(&self, w: &World, out: &mut Vec<Action>) {
        let c = &self.config;
        let faults = self.live(w);
        if w.tick < c.horizon + c.slack {
            out.push(Action::Tick);
        }
        if faults && usize::from(w.submitted) < c.script.len() {
            out.push(Action::Submit(w.submitted));
        }
        for (i, worker) in w.workers.iter().enumerate() {
            let wi = i as u8;
            match worker {
                Worker::Idle => {
                    for n in 0..w.created {
                        if w.has_message(n) {
                            out.push(Action::Receive { w: wi, n });
                        }
                    }
                    out.push(Action::ClaimNext { w: wi });
                }
                Worker::Holding { lease, work } => {
                    if faults && *work != Work::Claimed {
                        out.push(Action::Renew { w: wi });
                        out.push(Action::Release { w: wi });
                    }
                    match work {
                        Work::Claimed => {
                            out.push(Action::Begin { w: wi });
                            if faults && w.unstarted > 0 {
                                out.push(Action::ReleaseUnstarted { w: wi });
                            }
                        }
                        Work::Started => {
                            if c.effects {
                                out.push(Action::BeginEffect { w: wi });
                            } else {
                                out.push(Action::Finish { w: wi });
                            }
                            if faults {
                                for kind in [
                                    FailureKind::Retryable,
                                    FailureKind::Permanent,
                                    FailureKind::Ambiguous,
                                ] {
                                    out.push(Action::Fail { w: wi, kind });
                                }
                            }
                        }
                        Work::Intended => {
                            out.push(Action::CallProvider { w: wi, ok: true });
                            // One certain failure of the provider per task: enough to
                            // show it is not counted ambiguous, and the world stays finite.
                            let n = number(lease.task_id()) as usize;
                            if faults && w.ghost[n].failed_calls == 0 {
                                out.push(Action::CallProvider { w: wi, ok: false });
                            }
                        }
                        Work::Called { .. } => out.push(Action::FinishEffect { w: wi }),
                        Work::Settled => out.push(Action::Finish { w: wi }),
                        Work::MustStop => out.push(Action::GiveUp { w: wi }),
                    }
                }
                Worker::Committing { .. } => {}
                Worker::Unsure { .. } => out.push(Action::Recomplete { w: wi }),
            }
        }
        for p in 0..c.processes.len() as u8 {
            let mut busy = false;
            let mut committing = false;
            for (i, worker) in w.workers.iter().enumerate() {
                if c.process_of(i) == p as usize {
                    busy |= *worker != Worker::Idle;
                    committing |= matches!(worker, Worker::Committing { .. });
                }
            }
            if committing {
                out.push(Action::Flush { p, lost: false });
                if faults && c.lost_acks {
                    out.push(Action::Flush { p, lost: true });
                }
            }
            if busy && faults {
                out.push(Action::Stop { p });
                out.push(Action::Crash { p });
            }
        }
        if faults {
            for task in &w.tasks {
                let n = number(task.id);
                // The operator may try either on any task: the rules decide.
                if w.cancels > 0 {
                    out.push(Action::Cancel { n });
                }
                if w.reopens > 0 {
                    out.push(Action::Reopen { n });
                }
                if c.lossy_queue && w.has_message(n) {
                    out.push(Action::Drop { n });
                }
            }
            out.push(Action::Purge);
        }
        out.push(Action::Redispatch);
    }

    pub(crate) fn apply(&self, w: &World, action: &Action) -> Option<(World, Vec<Obs>)> {
        let mut next = w.clone();
        let mut obs = Vec::new();
        let changed = self.step(&mut next, *action, &mut obs);
        (changed && next != *w).then_some((next, obs))
    }

    /// Applies `action` to `w`; `false` when it is not enabled.
    fn step(&self, w: &mut World, action: Action, obs: &mut Vec<Obs>) -> bool {
        let c = &self.config;
        let now = w.now();
        match action {
            Action::Tick => {
                w.tick += 1;
                true
            }
            Action::Submit(i) => {
                w.submitted += 1;
                let (key, inp) = c.script[i as usize];
                let key = request_key(key);
                let hash = input(inp);
                let existing = w.tasks.iter().position(|t| t.key == key);
                let before = w.tasks.clone();
                let rule = self.rules.submit(existing.map(|i| &w.tasks[i]), &hash);
                let created = match rule {
                    SubmitRule::Existing | SubmitRule::Conflict => false,
                    SubmitRule::Create | SubmitRule::Replace => {
                        if let Some(i) = existing {
                            w.tasks.remove(i);
                        }
                        let n = w.created;
                        w.created += 1;
                        let new = NewTask::new(key, hash)
                            .policy(c.policy())
                            .acceptance(c.acceptance)
                            .retention(ticks(c.retention));
                        w.tasks
                            .push(new_task(task_id(n), new, now, now + ticks(c.retention)));
                        w.queue |= 1 << n;
                        true
                    }
                };
                obs.push(Obs::Submitted {
                    existed: existing.is_some(),
                    created,
                    unchanged: w.tasks == before,
                });
                true
            }
            Action::Receive { w: i, n } => {
                if !w.has_message(n) {
                    return false;
                }
                let claim = self.claim(w, n, i, obs);
                match claim {
                    Claim::Acquired(lease) => {
                        w.workers[i as usize] = Worker::Holding {
                            lease,
                            work: Self::claimed(w),
                        }
                    }
                    Claim::Completed(_) | Claim::Failed(_) | Claim::Cancelled(_) | Claim::NotFound => {
                        w.queue &= !(1 << n);
                    }
                    _ => {}
                }
                true
            }
            Action::ClaimNext { w: i } => {
                let mut due: Vec<_> = w
                    .tasks
                    .iter()
                    .filter_map(|t| self.rules.due_since(t, now).map(|since| (since, t.id)))
                    .collect();
                due.sort_unstable();
                let Some(&(_, id)) = due.first() else {
                    return false;
                };
                if let Claim::Acquired(lease) = self.claim(w, number(id), i, obs) {
                    w.workers[i as usize] = Worker::Holding {
                        lease,
                        work: Self::claimed(w),
                    };
                }
                true
            }
            Action::Renew { w: i } => {
                let Worker::Holding { lease, work } = w.workers[i as usize].clone() else {
                    return false;
                };
                let mut lease = lease;
                match self.fenced(w, &lease, "renew", obs) {
                    Some(task) => {
                        let until = now + ticks(c.lease);
                        task.lease_until = Some(until);
                        renewed(&mut lease, until);
                        w.workers[i as usize] = Worker::Holding { lease, work };
                    }
                    None => w.workers[i as usize] = Worker::Idle,
                }
                true
            }
            Action::BeginEffect { w: i } => {
                let Worker::Holding {
                    lease,
                    work: Work::Started,
                } = w.workers[i as usize].clone()
                else {
                    return false;
                };
                if self.fenced(w, &lease, "begin_effect", obs).is_none() {
                    w.workers[i as usize] = Worker::Idle;
                    return true;
                }
                let n = number(lease.task_id());
                let start = match self.rules.begin_effect(w.effect(n), &lease, EFFECT, now) {
                    BeginEffectRule::Write { effect, start } => {
                        w.effects.retain(|e| number(e.task_id) != n);
                        w.effects.push(effect);
                        start
                    }
                    BeginEffectRule::Answer(start) => start,
                };
                let work = match start {
                    EffectStart::Call { key, .. } => {
                        obs.push(Obs::EffectKey { n, key });
                        Work::Intended
                    }
                    EffectStart::Done(_) => Work::Settled,
                    EffectStart::Stop(_) => Work::MustStop,
                    other => {
                        obs.push(Obs::Unexpected(format!("begin_effect answered {other:?}")));
                        Work::Started
                    }
                };
                w.workers[i as usize] = Worker::Holding { lease, work };
                true
            }
            Action::CallProvider { w: i, ok } => {
                let Worker::Holding {
                    lease,
                    work: Work::Intended,
                } = w.workers[i as usize].clone()
                else {
                    return false;
                };
                w.ghost[number(lease.task_id()) as usize].calls += 1;
                w.workers[i as usize] = Worker::Holding {
                    lease,
                    work: Work::Called { ok },
                };
                true
            }
            Action::FinishEffect { w: i } => {
                let Worker::Holding {
                    lease,
                    work: Work::Called { ok },
                } = w.workers[i as usize].clone()
                else {
                    return false;
                };
                if self.fenced(w, &lease, "finish_effect", obs).is_none() {
                    w.workers[i as usize] = Worker::Idle;
                    return true;
                }
                let n = number(lease.task_id());
                let outcome = if ok {
                    EffectOutcome::done("ref")
                } else {
                    EffectOutcome::failed("provider refused")
                };
                let settled = match self
                    .rules
                    .finish_effect(w.effect(n), &lease, EFFECT, &outcome, now)
                {
                    Ok(FinishEffectRule::Write(effect)) => {
                        if effect.state == EffectState::Failed {
                            w.ghost[n as usize].failed_calls += 1;
                        }
                        w.effects.retain(|e| number(e.task_id) != n);
                        w.effects.push(effect.clone());
                        effect
                    }
                    Ok(FinishEffectRule::Answer(effect)) => effect,
                    Err(e) => {
                        obs.push(Obs::Unexpected(format!(
                            "finish_effect refused its own intent: {e}"
                        )));
                        return true;
                    }
                };
                let work = if settled.state == EffectState::Done {
                    Work::Settled
                } else {
                    Work::Started
                };
                w.workers[i as usize] = Worker::Holding { lease, work };
                true
            }
            Action::Finish { w: i } => {
                let Worker::Holding { lease, work } = w.workers[i as usize].clone() else {
                    return false;
                };
                if c.effects && work != Work::Settled {
                    return false;
                }
                w.workers[i as usize] = Worker::Committing { lease };
                true
            }
            Action::Flush { p, lost } => {
                let mut any = false;
                for i in 0..w.workers.len() {
                    if c.process_of(i) != p as usize {
                        continue;
                    }
                    let Worker::Committing { lease } = w.workers[i].clone() else {
                        continue;
                    };
                    any = true;
                    let answer = self.complete(w, &lease, obs);
                    w.workers[i] = if lost {
                        Worker::Unsure { lease }
                    } else {
                        self.heard(w, &lease, answer);
                        Worker::Idle
                    };
                }
                any
            }
            Action::Recomplete { w: i } => {
                let Worker::Unsure { lease } = w.workers[i as usize].clone() else {
                    return false;
                };
                let answer = self.complete(w, &lease, obs);
                self.heard(w, &lease, answer);
                w.workers[i as usize] = Worker::Idle;
                true
            }
            Action::Fail { w: i, kind } => {
                let Worker::Holding { lease, work } = w.workers[i as usize].clone() else {
                    return false;
                };
                if !matches!(work, Work::Started | Work::Settled) {
                    return false;
                }
                let failure = Failure::new(kind, kind.as_str());
                self.fail(w, i, &lease, &failure, obs);
                true
            }
            Action::GiveUp { w: i } => {
                let Worker::Holding {
                    lease,
                    work: Work::MustStop,
                } = w.workers[i as usize].clone()
                else {
                    return false;
                };
                let n = number(lease.task_id());
                let failure = match w.effect(n) {
                    Some(effect) => effect.ambiguous_failure(),
                    None => Failure::ambiguous("the effect's record is gone"),
                };
                self.fail(w, i, &lease, &failure, obs);
                true
            }
            Action::Begin { w: i } => {
                let Worker::Holding {
                    lease,
                    work: Work::Claimed,
                } = w.workers[i as usize].clone()
                else {
                    return false;
                };
                w.workers[i as usize] = Worker::Holding {
                    lease,
                    work: Work::Started,
                };
                true
            }
            Action::Release { w: i } => {
                let Worker::Holding { lease, work } = w.workers[i as usize].clone() else {
                    return false;
                };
                if work == Work::Claimed {
                    return false;
                }
                self.release(w, &lease, rules::Work::Started, obs);
                w.workers[i as usize] = Worker::Idle;
                true
            }
            Action::ReleaseUnstarted { w: i } => {
                let Worker::Holding {
                    lease,
                    work: Work::Claimed,
                } = w.workers[i as usize].clone()
                else {
                    return false;
                };
                if w.unstarted == 0 {
                    return false;
                }
                w.unstarted -= 1;
                self.release(w, &lease, rules::Work::NotStarted, obs);
                w.workers[i as usize] = Worker::Idle;
                true
            }
            Action::Stop { p } => {
                let mut any = false;
                if self.step(w, Action::Flush { p, lost: false }, obs) {
                    any = true;
                }
                for i in 0..w.workers.len() {
                    if c.process_of(i) != p as usize {
                        continue;
                    }
                    if let Worker::Holding { lease, work } = w.workers[i].clone() {
                        // A claim not begun is given back unstarted while
                        // the world's bound on those lasts, as begun after.
                        let work = if work == Work::Claimed && w.unstarted > 0 {
                            w.unstarted -= 1;
                            rules::Work::NotStarted
                        } else {
                            rules::Work::Started
                        };
                        self.release(w, &lease, work, obs);
                    }
                    any |= w.workers[i] != Worker::Idle;
                    w.workers[i] = Worker::Idle;
                }
                any
            }
            Action::Crash { p } => {
                let mut any = false;
                for i in 0..w.workers.len() {
                    if c.process_of(i) == p as usize {
                        any |= w.workers[i] != Worker::Idle;
                        w.workers[i] = Worker::Idle;
                    }
                }
                any
            }
            Action::Cancel { n } => {
                let Some(task) = w.task(n) else { return false };
                if w.cancels == 0 {
                    return false;
                }
                match self.rules.cancel(task) {
                    CancelRule::Cancel => {
                        w.cancels -= 1;
                        make_terminal(
                            w.task_mut(n).expect("present"),
                            Status::Cancelled,
                            now,
                            "cancelled",
                        );
                        w.queue &= !(1 << n);
                        true
                    }
                    CancelRule::Answer(_) => false,
                }
            }
            Action::Reopen { n } => {
                let Some(task) = w.task(n) else { return false };
                if w.reopens == 0 {
                    return false;
                }
                match self.rules.reopen(task) {
                    ReopenRule::Reopen => {
                        w.reopens -= 1;
                        self.rules.reopened(w.task_mut(n).expect("present"), now);
                        w.ghost[n as usize].counted = 0;
                        w.queue |= 1 << n;
                        true
                    }
                    ReopenRule::Answer(_) => false,
                }
            }
            Action::Purge => {
                let expired: Vec<TaskId> = w
                    .tasks
                    .iter()
                    .filter(|t| t.status.is_terminal() && t.expires_at <= now)
                    .map(|t| t.id)
                    .collect();
                for id in &expired {
                    let n = number(*id);
                    w.tasks.retain(|t| t.id != *id);
                    w.effects.retain(|e| e.task_id != *id);
                    w.queue &= !(1 << n);
                    w.ghost[n as usize].purged = true;
                }
                !expired.is_empty()
            }
            Action::Drop { n } => {
                let had = w.has_message(n);
                w.queue &= !(1 << n);
                had
            }
            Action::Redispatch => {
                for task in &w.tasks {
                    if self.rules.due_since(task, now).is_some() {
                        w.queue |= 1 << number(task.id);
                    }
                }
                true
            }
        }
    }

    /// Where a new claim's work stands: not begun while a claim may still be
    /// given back unstarted; begun at once after (the step between would
    /// only add interleavings of nothing).
    fn claimed(w: &World) -> Work {
        if w.unstarted > 0 {
            Work::Claimed
        } else {
            Work::Started
        }
    }

    /// A claim of task `n` by worker `i`, as `MemoryStore` applies it.
    fn claim(&self, w: &mut World, n: u8, i: u8, obs: &mut Vec<Obs>) -> Claim {
        let now = w.now();
        let lease_ticks = self.config.lease;
        let Some(task) = w.task_mut(n) else {
            return Claim::NotFound;
        };
        let before = task.clone();
        let (claim, granted) = match self.rules.claim(task, now) {
            ClaimRule::Answer(claim) => (claim, false),
            ClaimRule::Exhaust(reason) => {
                make_terminal(task, Status::Failed, now, reason.as_str());
                (Claim::Failed(task.clone()), false)
            }
            ClaimRule::Take => {
                let until = now + ticks(lease_ticks);
                task.version += 1;
                task.status = Status::Running;
                task.lease_until = Some(until);
                task.not_before = None;
                let lease = new_lease(task.clone(), attempt_id(n, task.version), format!("w{i}"), until);
                (Claim::Acquired(lease), true)
            }
        };
        obs.push(Obs::Claimed {
            before,
            after: task.clone(),
            granted,
        });
        if granted {
            w.ghost[n as usize].counted += 1;
        }
        claim
    }

    /// The fence of a write by `lease`: the task to write when it passes
    /// (recorded for the step invariants), `None` when refused or gone.
    fn fenced<'w>(
        &self,
        w: &'w mut World,
        lease: &Lease,
        op: &'static str,
        obs: &mut Vec<Obs>,
    ) -> Option<&'w mut Task> {
        let now = w.now();
        let task = w.task_mut(number(lease.task_id()))?;
        self.rules.fence(task, lease, now).ok()?;
        obs.push(Obs::Fenced {
            op,
            before: task.clone(),
            version: lease.version(),
        });
        Some(task)
    }

    fn complete(&self, w: &mut World, lease: &Lease, obs: &mut Vec<Obs>) -> Option<Result<Task, Rejection>> {
        let now = w.now();
        let n = number(lease.task_id());
        let task = w.task_mut(n)?;
        if let Err(rejection) = self.rules.accept(task, lease, now) {
            return Some(Err(rejection));
        }
        obs.push(Obs::Saved {
            before: task.clone(),
            version: lease.version(),
        });
        task.response = Some(response(lease.version()));
        make_terminal(task, Status::Completed, now, "");
        let saved = task.clone();
        w.ghost[n as usize].saves += 1;
        Some(Ok(saved))
    }

    /// What the worker of `lease` does with the answer to its completion
    /// (`None`: the task is gone).
    fn heard(&self, w: &mut World, lease: &Lease, answer: Option<Result<Task, Rejection>>) {
        let n = number(lease.task_id());
        let mine = response(lease.version());
        let terminal = match answer {
            None => true,
            Some(Ok(_)) => {
                w.ghost[n as usize].reported = Some(lease.version());
                true
            }
            Some(Err(Rejection::AlreadyCompleted(task))) => {
                // A repeated completion: the first one stood if the saved response is ours.
                if self.rules.ours(task.response.as_ref(), &mine) {
                    w.ghost[n as usize].reported = Some(lease.version());
                }
                true
            }
            Some(Err(Rejection::NotRunning(status))) => status.is_terminal(),
            Some(Err(_)) => false,
        };
        if terminal {
            w.queue &= !(1 << n);
        }
    }

    fn fail(&self, w: &mut World, i: u8, lease: &Lease, failure: &Failure, obs: &mut Vec<Obs>) {
        let now = w.now();
        let n = number(lease.task_id());
        w.workers[i as usize] = Worker::Idle;
        let rules = self.rules;
        let Some(task) = self.fenced(w, lease, "fail", obs) else {
            return;
        };
        let before = task.clone();
        match rules.after_failure(task, lease, failure, now) {
            Ok(not_before) => {
                task.status = Status::Pending;
                task.lease_until = None;
                task.not_before = Some(not_before);
                task.last_error = Some(failure.message.clone());
            }
            Err(reason) => make_terminal(task, Status::Failed, now, reason.as_str()),
        }
        let after = task.clone();
        if after.status.is_terminal() {
            w.queue &= !(1 << n);
        }
        obs.push(Obs::Failed { before, after });
    }

    /// A release of `lease` (`work`: whether its work began), as
    /// `MemoryStore` applies it: one write decided by `rules::release`.
    fn release(&self, w: &mut World, lease: &Lease, work: rules::Work, obs: &mut Vec<Obs>) {
        let now = w.now();
        let n = number(lease.task_id());
        let Some(task) = w.task_mut(n) else {
            return;
        };
        let before = task.clone();
        let Ok(released) = self.rules.release(task, lease, now, work) else {
            return;
        };
        *task = released;
        obs.push(Obs::Fenced {
            op: match work {
                rules::Work::Started => "release",
                rules::Work::NotStarted => "release_unstarted",
            },
            before: before.clone(),
            version: lease.version(),
        });
        // The ghost's count: a claim given back unstarted by the holder of
        // the current, live lease is no attempt.
        let holder = before.status == Status::Running
            && before.version == lease.version()
            && before.lease_until.is_some_and(|until| until > now);
        if work == rules::Work::NotStarted && holder {
            w.ghost[n as usize].counted -= 1;
        }
    }
}

fn make_terminal(task: &mut Task, status: Status, now: time::OffsetDateTime, error: &str) {
    task.status = status;
    task.lease_until = None;
    task.not_before = None;
    task.finished_at = Some(now);
    if !error.is_empty() {
        task.last_error = Some(error.to_owned());
    }
}
