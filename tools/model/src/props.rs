//! The properties, each in the words of docs/RELIABILITY.md, judged by
//! restating the guarantee, never by calling the rules again.

use taskfence::effect::EffectKey;
use taskfence::policy::AcceptanceRule;
use taskfence::{Status, Task};

use crate::checker::Model;
use crate::step::{Obs, WorldModel};
use crate::world::{Action, EFFECT, Work, Worker, World, number, response, task_id, tick_of};

/// Whether the guarantee says assignment `version` may save the task as it
/// was just before the save, at `now`.
fn allowed_to_save(before: &Task, version: u64, now: time::OffsetDateTime) -> bool {
    let live = before.status == Status::Running && before.lease_until.is_some_and(|until| until > now);
    match before.acceptance {
        AcceptanceRule::CurrentAssignment => version == before.version && live,
        AcceptanceRule::FirstValidAnswer => {
            before.response.is_none()
                && !before.status.is_terminal()
                && version > before.budget_base
                && version <= before.version
        }
    }
}

fn state_invariants(model: &WorldModel, w: &World) -> Result<(), String> {
    for (n, ghost) in w.ghost.iter().enumerate() {
        let task = w.task(n as u8);
        // At most one saved response per task.
        if ghost.saves > 1 {
            return Err(format!("task {n}: {} responses saved", ghost.saves));
        }
        // A completion is reported only once it is durable.
        if let Some(version) = ghost.reported
            && !ghost.purged
            && task.is_none_or(|t| t.status != Status::Completed || t.response != Some(response(version)))
        {
            return Err(format!(
                "task {n}: assignment {version} heard \"saved\" but the store holds {:?}",
                task.map(|t| (
                    t.status,
                    t.response.as_ref().and_then(|r| r.as_str().map(str::to_owned))
                ))
            ));
        }
        // An effect possibly made twice is recorded as ambiguous.
        if ghost.calls > 0 && !ghost.purged {
            let (ambiguous, recorded) = w.effect(n as u8).map_or((0, false), |e| (e.ambiguous, true));
            if !recorded {
                return Err(format!(
                    "task {n}: the provider was called and no effect is recorded"
                ));
            }
            if u32::from(ghost.calls) > 1 + ambiguous + u32::from(ghost.failed_calls) {
                return Err(format!(
                    "task {n}: the provider was called {} times, {} recorded failed, and the effect counts {ambiguous} ambiguous",
                    ghost.calls, ghost.failed_calls
                ));
            }
        }
    }
    for task in &w.tasks {
        let n = number(task.id);
        // Attempts never exceed the budget.
        if task.attempts_in_budget() > task.policy.max_attempts {
            return Err(format!(
                "task {n}: {} attempts in a budget of {}",
                task.attempts_in_budget(),
                task.policy.max_attempts
            ));
        }
        // The store counts exactly the claims whose work began or whose lease
        // was lost while held: a claim given back unstarted costs nothing,
        // and nothing else is refunded.
        let counted = w.ghost.get(usize::from(n)).map_or(0, |g| g.counted);
        if task.attempts_in_budget() != u32::from(counted) {
            return Err(format!(
                "task {n}: the store counts {} attempts in the budget, but {counted} claims began work or lost their lease",
                task.attempts_in_budget()
            ));
        }
        if (task.status == Status::Completed) != task.response.is_some() {
            return Err(format!(
                "task {n}: {} with response {:?}",
                task.status, task.response
            ));
        }
    }
    let _ = model;
    Ok(())
}

fn step_invariants(
    model: &WorldModel,
    before: &World,
    action: &Action,
    obs: &[Obs],
    after: &World,
) -> Result<(), String> {
    let now = before.now();
    for o in obs {
        match o {
            Obs::Saved {
                before: task,
                version,
            } => {
                if !allowed_to_save(task, *version, now) {
                    return Err(format!(
                        "task {}: assignment {version} saved though the {} rule did not allow it (task at version {}, {}, budget base {})",
                        number(task.id),
                        task.acceptance.as_str(),
                        task.version,
                        task.status,
                        task.budget_base
                    ));
                }
            }
            Obs::Fenced {
                op,
                before: task,
                version,
            } => {
                let current = task.status == Status::Running
                    && task.version == *version
                    && task.lease_until.is_some_and(|until| until > now);
                if !current {
                    return Err(format!(
                        "task {}: {op} by assignment {version} accepted, but the task was {} at version {} with lease until {:?}",
                        number(task.id),
                        task.status,
                        task.version,
                        task.lease_until.map(tick_of)
                    ));
                }
            }
            Obs::Claimed {
                before: task,
                after: claimed,
                granted,
            } => {
                let spent = task.attempts_in_budget() >= task.policy.max_attempts;
                if *granted && spent {
                    return Err(format!(
                        "task {}: an attempt granted beyond the budget",
                        number(task.id)
                    ));
                }
                let needs_worker = match task.status {
                    Status::Pending => task.not_before.is_none_or(|nb| nb <= now),
                    Status::Running => task.lease_until.is_none_or(|until| until <= now),
                    _ => false,
                };
                if needs_worker && spent && claimed.status != Status::Failed {
                    return Err(format!(
                        "task {}: its budget is spent and the claim left it {}",
                        number(task.id),
                        claimed.status
                    ));
                }
            }
            Obs::Failed {
                before: task,
                after: failed,
            } => {
                if task.attempts_in_budget() >= task.policy.max_attempts && failed.status != Status::Failed {
                    return Err(format!(
                        "task {}: its last attempt failed and it is {}, not failed",
                        number(task.id),
                        failed.status
                    ));
                }
            }
            Obs::Submitted {
                existed,
                created,
                unchanged,
            } => {
                if *existed && (*created || !unchanged) {
                    return Err("a submission of a key already in the store wrote work".into());
                }
            }
            Obs::EffectKey { n, key } => {
                if *key != EffectKey::new(task_id(*n), EFFECT) {
                    return Err(format!("task {n}: the effect's key changed to {key}"));
                }
            }
            Obs::Unexpected(what) => return Err(what.clone()),
        }
    }
    // Terminal is final (but for an operator's reopening of a failed or
    // cancelled task); versions never go back.
    for old in &before.tasks {
        let Some(new) = after.tasks.iter().find(|t| t.id == old.id) else {
            continue;
        };
        if new.version < old.version {
            return Err(format!("task {}: version went back", number(old.id)));
        }
        let reopened = matches!(action, Action::Reopen { n } if *n == number(old.id));
        let unchanged = new.status == old.status && new.response == old.response;
        if old.status.is_terminal() && !unchanged && !(reopened && old.status != Status::Completed) {
            return Err(format!(
                "task {}: {} became {}",
                number(old.id),
                old.status,
                new.status
            ));
        }
    }
    let _ = model;
    Ok(())
}

impl Model for WorldModel {
    type State = World;
    type Action = Action;
    type Obs = Obs;

    fn init(&self) -> World {
        World::new(&self.config)
    }

    fn actions(&self, state: &World, out: &mut Vec<Action>) {
        self.enumerate(state, out);
    }

    fn next(&self, state: &World, action: &Action) -> Option<(World, Vec<Obs>)> {
        self.apply(state, action)
    }

    fn check_state(&self, state: &World) -> Result<(), String> {
        state_invariants(self, state)
    }

    fn check_step(&self, before: &World, action: &Action, obs: &[Obs], after: &World) -> Result<(), String> {
        step_invariants(self, before, action, obs, after)
    }

    fn fair(&self, action: &Action) -> bool {
        matches!(
            action,
            Action::Tick
                | Action::Receive { .. }
                | Action::ClaimNext { .. }
                | Action::Renew { .. }
                | Action::Begin { .. }
                | Action::BeginEffect { .. }
                | Action::CallProvider { ok: true, .. }
                | Action::FinishEffect { .. }
                | Action::Finish { .. }
                | Action::Flush { lost: false, .. }
                | Action::Recomplete { .. }
                | Action::GiveUp { .. }
                | Action::Redispatch
        )
    }

    fn goal(&self, state: &World) -> bool {
        state.tasks.iter().all(|t| t.status.is_terminal())
    }

    fn live_from(&self, state: &World) -> bool {
        state.tick <= self.config.horizon
    }

    fn describe(&self, w: &World) -> String {
        let mut s = format!("t={}", w.tick);
        for t in &w.tasks {
            s += &format!(
                " | task{} {} v{} base{}",
                number(t.id),
                t.status,
                t.version,
                t.budget_base
            );
            if let Some(until) = t.lease_until {
                s += &format!(" lease<{}", tick_of(until));
            }
            if let Some(nb) = t.not_before {
                s += &format!(" nb{}", tick_of(nb));
            }
            if let Some(r) = &t.response {
                s += &format!(" saved={}", r.as_str().unwrap_or("?"));
            }
            if let Some(e) = w.effect(number(t.id)) {
                s += &format!(" effect={}@v{} amb{}", e.state, e.version, e.ambiguous);
            }
            if w.has_message(number(t.id)) {
                s += " msg";
            }
        }
        for (i, worker) in w.workers.iter().enumerate() {
            match worker {
                Worker::Idle => {}
                Worker::Holding { lease, work } => {
                    s += &format!(
                        " | w{i} holds task{}@v{} {}",
                        number(lease.task_id()),
                        lease.version(),
                        match work {
                            Work::Claimed => "claimed",
                            Work::Started => "started",
                            Work::Intended => "intended",
                            Work::Called { ok: true } => "called",
                            Work::Called { ok: false } => "call-failed",
                            Work::Settled => "effect-done",
                            Work::MustStop => "must-stop",
                        }
                    );
                }
                Worker::Committing { lease } => {
                    s += &format!(
                        " | w{i} commits task{}@v{}",
                        number(lease.task_id()),
                        lease.version()
                    );
                }
                Worker::Unsure { lease } => {
                    s += &format!(
                        " | w{i} unsure task{}@v{}",
                        number(lease.task_id()),
                        lease.version()
                    );
                }
            }
        }
        for (n, g) in w.ghost.iter().enumerate() {
            if g.calls > 0 {
                s += &format!(" | calls{n}={}", g.calls);
            }
        }
        s
    }
}
