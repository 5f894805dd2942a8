//! [`Outcome`]: an operation's answer described the same way for every
//! operation, and its description of each answer type.

use crate::effect::{Effect, EffectStart};
use crate::error::Result;
use crate::inspect::{CappedCounts, Counts, Page, QueueDepth, Story, TaskSummary};
use crate::store::{Attempt, Claim, Fenced, Lease, Retry, Submitted};
use crate::task::{Task, TaskId};
use crate::throttle::{BucketState, KeySlots};

#[cfg(doc)]
use super::Intercept;

/// An operation's answer, described the same way for every operation: what
/// [`Intercept::around`] reads to observe any call without knowing its type.
///
/// The outcome labels are short fixed words (`created`, `acquired`,
/// `accepted`, `rejected`, `found`, `ok`…) and the reasons the
/// [`Rejection::label`](crate::Rejection::label) of a refusal or a fixed
/// word, so they make bounded metric labels.
///
/// ```
/// use taskfence::intercept::Outcome;
/// let answer: Option<taskfence::Task> = None;
/// assert_eq!(answer.summary(), ("absent", None));
/// ```
pub trait Outcome {
    /// The call's outcome and its reason, if any: for a batch answered item
    /// by item, `ok` (its items are in [`items`](Self::items)).
    fn summary(&self) -> (&'static str, Option<&'static str>);

    /// Each item's outcome and reason, for a batch answered item by item;
    /// nothing for any other answer.
    fn items(&self, each: &mut dyn FnMut(&'static str, Option<&'static str>)) {
        let _ = each;
    }

    /// The task the answer carries, if it carries one.
    fn task(&self) -> Option<&Task> {
        None
    }

    /// How many tasks the answer lists or removed (`due`, `stranded`,
    /// `purge_expired`), if it is such a count.
    fn count(&self) -> Option<u64> {
        None
    }

    /// Each task the answer shows failed terminally (a failure report that
    /// ended the budget, a claim that found it spent).
    fn failed(&self, each: &mut dyn FnMut(&Task)) {
        let _ = each;
    }
}

fn fenced_summary<T>(fenced: &Fenced<T>) -> (&'static str, Option<&'static str>) {
    match fenced {
        Fenced::Accepted(_) => ("accepted", None),
        Fenced::Rejected(r) => ("rejected", Some(r.label())),
    }
}

impl Outcome for Submitted {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        (if self.is_created() { "created" } else { "existing" }, None)
    }
    fn task(&self) -> Option<&Task> {
        Some(Submitted::task(self))
    }
}

impl Outcome for Option<Task> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        (if self.is_some() { "found" } else { "absent" }, None)
    }
    fn task(&self) -> Option<&Task> {
        self.as_ref()
    }
}

impl Outcome for Claim {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        (self.label(), None)
    }
    fn task(&self) -> Option<&Task> {
        match self {
            Claim::Acquired(lease) => Some(lease.task()),
            Claim::Completed(task) | Claim::Failed(task) | Claim::Cancelled(task) => Some(task),
            Claim::Busy { .. } | Claim::Backoff { .. } | Claim::NotFound | Claim::Throttled(_) => None,
        }
    }
    fn failed(&self, each: &mut dyn FnMut(&Task)) {
        if let Claim::Failed(task) = self {
            each(task);
        }
    }
}

impl Outcome for Fenced<()> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        fenced_summary(self)
    }
}

impl Outcome for Fenced<Task> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        fenced_summary(self)
    }
    fn task(&self) -> Option<&Task> {
        match self {
            Fenced::Accepted(task) => Some(task),
            Fenced::Rejected(_) => None,
        }
    }
}

impl Outcome for Fenced<Retry> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        match self {
            Fenced::Accepted(Retry::Scheduled { .. }) => ("accepted", Some("scheduled")),
            Fenced::Accepted(Retry::Exhausted(_)) => ("accepted", Some("exhausted")),
            Fenced::Rejected(r) => ("rejected", Some(r.label())),
        }
    }
    fn failed(&self, each: &mut dyn FnMut(&Task)) {
        if let Fenced::Accepted(Retry::Exhausted(task)) = self {
            each(task);
        }
    }
}

impl Outcome for Fenced<EffectStart> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        match self {
            Fenced::Accepted(EffectStart::Call { ambiguous: None, .. }) => ("accepted", Some("call")),
            Fenced::Accepted(EffectStart::Call {
                ambiguous: Some(_), ..
            }) => ("accepted", Some("call_ambiguous")),
            Fenced::Accepted(EffectStart::Done(_)) => ("accepted", Some("done")),
            Fenced::Accepted(EffectStart::Stop(_)) => ("accepted", Some("stop")),
            Fenced::Rejected(r) => ("rejected", Some(r.label())),
        }
    }
}

impl Outcome for Fenced<Effect> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        fenced_summary(self)
    }
}

impl Outcome for Vec<Effect> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
}

impl Outcome for Vec<Attempt> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
}

impl Outcome for Vec<TaskId> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
    fn count(&self) -> Option<u64> {
        Some(self.len() as u64)
    }
}

impl Outcome for u64 {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
    fn count(&self) -> Option<u64> {
        Some(*self)
    }
}

impl Outcome for Vec<Claim> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
    fn items(&self, each: &mut dyn FnMut(&'static str, Option<&'static str>)) {
        self.iter().for_each(|claim| each(claim.label(), None));
    }
    fn failed(&self, each: &mut dyn FnMut(&Task)) {
        self.iter().for_each(|claim| claim.failed(each));
    }
}

impl Outcome for Vec<Result<Fenced<Task>>> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
    fn items(&self, each: &mut dyn FnMut(&'static str, Option<&'static str>)) {
        for item in self {
            match item {
                Ok(fenced) => {
                    let (outcome, reason) = fenced_summary(fenced);
                    each(outcome, reason);
                }
                Err(e) => each("error", Some(e.label())),
            }
        }
    }
}

impl Outcome for Vec<Lease> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
    fn items(&self, each: &mut dyn FnMut(&'static str, Option<&'static str>)) {
        self.iter().for_each(|_| each("acquired", None));
    }
}

impl Outcome for Vec<Fenced<()>> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
    fn items(&self, each: &mut dyn FnMut(&'static str, Option<&'static str>)) {
        for fenced in self {
            let (outcome, reason) = fenced_summary(fenced);
            each(outcome, reason);
        }
    }
}

impl Outcome for Page {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
}

impl Outcome for Counts {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
}

impl Outcome for CappedCounts {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
}

impl Outcome for Option<Story> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        (if self.is_some() { "found" } else { "absent" }, None)
    }
    fn task(&self) -> Option<&Task> {
        self.as_ref().map(|story| &story.task)
    }
}

impl Outcome for Vec<TaskSummary> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
    fn count(&self) -> Option<u64> {
        Some(self.len() as u64)
    }
}

impl Outcome for Vec<Task> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
    fn count(&self) -> Option<u64> {
        Some(self.len() as u64)
    }
}

impl Outcome for () {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
}

impl Outcome for Option<BucketState> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        (if self.is_some() { "found" } else { "absent" }, None)
    }
}

impl Outcome for Vec<BucketState> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
    fn count(&self) -> Option<u64> {
        Some(self.len() as u64)
    }
}

impl Outcome for Vec<QueueDepth> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
    fn count(&self) -> Option<u64> {
        Some(self.len() as u64)
    }
}

impl Outcome for KeySlots {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
}
