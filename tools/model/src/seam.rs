//! Where the model decides: [`Rules::Real`] calls `taskfence::backend::rules`
//! unmodified; every other variant plants one bug around the real call, so
//! the checker can show it catches that bug.

use taskfence::backend::rules::{self, BeginEffectRule, CancelRule, ClaimRule, FinishEffectRule, ReopenRule};
use taskfence::effect::{Effect, EffectOutcome, EffectStart, EffectState};
use taskfence::error::InvalidInput;
use taskfence::policy::{Failure, StopReason};
use taskfence::{Lease, Rejection, Status, Task};
use time::OffsetDateTime;

/// The decisions the model's store makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rules {
    /// The code every backend runs.
    Real,
    /// The fence (and the completion's acceptance) decided on the worker's
    /// copy of the task, read before the lock, instead of the row as it is.
    FenceBeforeLock,
    /// The fence never compares the lease's version with the task's.
    VersionNotCompared,
    /// Claims never look at the budget: attempts counted only when an
    /// attempt fails or completes.
    BudgetAtCompletion,
    /// A release skips the fence: a stale lease gives the task back.
    StaleRelease,
    /// A claim given back unstarted skips the fence: a stale or expired
    /// lease gives the task back and refunds the current claim.
    StaleUnstartedRefund,
    /// A release after the work began refunds the claim as if it had not.
    RefundAfterWorkBegan,
    /// The first-valid-answer rule forgets the budget base: a lease from
    /// before a reopening may still save.
    AcceptBeforeReopen,
    /// An earlier assignment's intent with no outcome is taken for this
    /// one's: the call is made again and not counted ambiguous.
    AmbiguityUncounted,
    /// A reused key with other inputs replaces the task instead of being refused.
    KeyConflictReplaces,
    /// Redispatch misses running tasks whose lease expired.
    DueMissesExpiredLeases,
    /// A cancellation cancels whatever the task's status, a completed one too.
    CancelAnything,
    /// (The worker's side) any "already completed" answer is taken for
    /// one's own save, whoever saved.
    AnyCompletionIsOurs,
}

/// What a submission of a key with an input must do, given the task
/// already under that key.
#[derive(Debug)]
pub(crate) enum SubmitRule {
    Create,
    Existing,
    Conflict,
    /// (Planted) write a new task in the old one's place.
    Replace,
}

impl Rules {
    pub(crate) fn claim(self, task: &Task, now: OffsetDateTime) -> ClaimRule {
        match self {
            Rules::BudgetAtCompletion => {
                let mut uncounted = task.clone();
                uncounted.budget_base = uncounted.version;
                rules::claim(&uncounted, now)
            }
            _ => rules::claim(task, now),
        }
    }

    pub(crate) fn fence(self, task: &Task, lease: &Lease, now: OffsetDateTime) -> Result<(), Rejection> {
        match self {
            Rules::FenceBeforeLock => rules::fence(lease.task(), lease.version(), now),
            Rules::VersionNotCompared => rules::fence(task, task.version, now),
            _ => rules::fence(task, lease.version(), now),
        }
    }

    /// The task as a release of `lease` leaves it, or the refusal.
    pub(crate) fn release(
        self,
        task: &Task,
        lease: &Lease,
        now: OffsetDateTime,
        work: rules::Work,
    ) -> Result<Task, Rejection> {
        match self {
            Rules::Real => rules::release(task, lease.version(), now, work),
            Rules::StaleRelease if work == rules::Work::Started && task.status == Status::Running => {
                rules::release(task, task.version, now, work)
            }
            Rules::StaleUnstartedRefund
                if work == rules::Work::NotStarted && task.status == Status::Running =>
            {
                rules::release(task, task.version, now, work)
            }
            Rules::RefundAfterWorkBegan => {
                self.fence(task, lease, now)?;
                rules::release(task, task.version, now, rules::Work::NotStarted)
            }
            // The variant's own fence, then the real release.
            _ => {
                self.fence(task, lease, now)?;
                rules::release(task, task.version, now, work)
            }
        }
    }

    pub(crate) fn accept(self, task: &Task, lease: &Lease, now: OffsetDateTime) -> Result<(), Rejection> {
        match self {
            Rules::FenceBeforeLock => rules::accept(lease.task(), lease.version(), now),
            Rules::VersionNotCompared => rules::accept(task, task.version, now),
            Rules::AcceptBeforeReopen => {
                let mut forgetful = task.clone();
                forgetful.budget_base = 0;
                rules::accept(&forgetful, lease.version(), now)
            }
            _ => rules::accept(task, lease.version(), now),
        }
    }

    pub(crate) fn after_failure(
        self,
        task: &Task,
        lease: &Lease,
        failure: &Failure,
        now: OffsetDateTime,
    ) -> Result<OffsetDateTime, StopReason> {
        rules::after_failure(task, lease.attempt_id(), failure, now)
    }

    pub(crate) fn cancel(self, task: &Task) -> CancelRule {
        match self {
            Rules::CancelAnything if task.status != Status::Cancelled => CancelRule::Cancel,
            _ => rules::cancel(task),
        }
    }

    /// Whether a worker whose completion was answered "already completed"
    /// with `saved` learns its own save stood.
    pub(crate) fn ours(self, saved: Option<&taskfence::Response>, mine: &taskfence::Response) -> bool {
        self == Rules::AnyCompletionIsOurs || saved == Some(mine)
    }

    pub(crate) fn reopen(self, task: &Task) -> ReopenRule {
        rules::reopen(task)
    }

    pub(crate) fn reopened(self, task: &mut Task, now: OffsetDateTime) {
        let policy = task.policy;
        rules::reopened(task, now, policy);
    }

    pub(crate) fn begin_effect(
        self,
        recorded: Option<&Effect>,
        lease: &Lease,
        name: &str,
        now: OffsetDateTime,
    ) -> BeginEffectRule {
        match (self, recorded) {
            (Rules::AmbiguityUncounted, Some(earlier)) if earlier.state == EffectState::Intended => {
                BeginEffectRule::Answer(EffectStart::Call {
                    key: earlier.key.clone(),
                    ambiguous: None,
                })
            }
            _ => rules::begin_effect(recorded, lease, name, now),
        }
    }

    pub(crate) fn finish_effect(
        self,
        recorded: Option<&Effect>,
        lease: &Lease,
        name: &str,
        outcome: &EffectOutcome,
        now: OffsetDateTime,
    ) -> Result<FinishEffectRule, InvalidInput> {
        match (self, recorded) {
            // The planted bug above let this assignment call on an earlier
            // intent; it settles that intent as its own.
            (Rules::AmbiguityUncounted, Some(earlier)) if earlier.state == EffectState::Intended => {
                let mut settled = earlier.clone();
                outcome.apply(&mut settled, now);
                Ok(FinishEffectRule::Write(settled))
            }
            _ => rules::finish_effect(recorded, lease, name, outcome, now),
        }
    }

    pub(crate) fn due_since(self, task: &Task, now: OffsetDateTime) -> Option<OffsetDateTime> {
        match self {
            Rules::DueMissesExpiredLeases if task.status == Status::Running => None,
            _ => rules::due_since(task, now),
        }
    }

    /// The dedup decision of a submission. (No shared rule exists for it:
    /// every backend compares the stored input hash in its own write.)
    pub(crate) fn submit(self, existing: Option<&Task>, input: &taskfence::InputHash) -> SubmitRule {
        match existing {
            None => SubmitRule::Create,
            Some(task) if task.input_hash == *input => SubmitRule::Existing,
            Some(_) if self == Rules::KeyConflictReplaces => SubmitRule::Replace,
            Some(_) => SubmitRule::Conflict,
        }
    }
}
