//! [`OutboxBackend`]: the transactional outbox of a storage backend, the
//! operations the one dispatcher loop ([`Outbox`](crate::dispatch::Outbox))
//! runs on.
//!
//! Why a trait of its own: publishing the outbox is the same round on every
//! backend (take a page of handoffs, publish them in batches, mark each
//! published batch, stop at the first failure, report), and what differs is
//! only how handoffs are taken and marked. Each backend writes those steps;
//! the round, its batching, its input checks and its result are written
//! once, so every backend keeps the same promise: at least once, marked
//! published only after `publish` returned `Ok`.

use async_trait::async_trait;

use crate::error::Result;
use crate::task::TaskId;
use crate::wire::Stamp;

/// The transactional outbox of a storage backend, on validated input:
/// implement this (beside [`Backend`](super::Backend)) and the type is an
/// [`Outbox`](crate::dispatch::Outbox), whose `dispatch` runs the one
/// dispatcher loop on these operations. (An `Outbox` in a generic context
/// also offers these methods: call `dispatch` and `redispatch`, which check
/// the input first.) A backend without an outbox (such as
/// [`MemoryStore`](crate::MemoryStore)) does not implement it.
///
/// A dispatch round calls [`take_handoffs`](Self::take_handoffs) once, then
/// [`mark_published`](Self::mark_published) after each batch that `publish`
/// accepted (never for one it refused), then [`end_round`](Self::end_round).
/// A round dropped before its end (the dispatcher was cancelled or crashed)
/// must leave every handoff it did not mark unpublished; the marks may take
/// effect at once or only at `end_round` (PostgreSQL's commit), so a dropped
/// round may publish some marked handoffs again: at least once, and every
/// copy points to the same task.
///
/// ```
/// use taskfence::backend::OutboxBackend;
/// // Every outbox backend is an `Outbox` through the blanket implementation.
/// fn dispatcher_of<B: OutboxBackend>(backend: B) -> impl taskfence::Outbox {
///     backend
/// }
/// ```
#[async_trait]
pub trait OutboxBackend: Send + Sync {
    /// What a round holds from [`take_handoffs`](Self::take_handoffs) to
    /// [`end_round`](Self::end_round): PostgreSQL's transaction, whose row
    /// locks keep other dispatchers off the handoffs it took, and the marks
    /// it writes at the end; nothing on a store that marks at once.
    type Round: Send;

    /// How the backend finds one taken handoff again to mark it (a row id,
    /// an item key).
    type Handoff: Send + Sync;

    /// Takes up to `limit` unpublished handoffs (`limit` is
    /// `1..=`[`MAX_SCAN_LIMIT`](crate::limits::MAX_SCAN_LIMIT)), oldest
    /// first, each with the [`Stamp`] its message carries: the task id and
    /// the task's assignment version read with the handoff (0 for a task
    /// never claimed). A handoff whose task is gone is left out or stamped
    /// version 0; the claim its message leads to finds nothing.
    async fn take_handoffs(&self, limit: usize) -> Result<(Self::Round, Vec<(Stamp, Self::Handoff)>)>;

    /// Marks `handoffs` published: their messages are durably in the queue.
    /// Called with the handoffs of one accepted batch, as
    /// [`take_handoffs`](Self::take_handoffs) returned them, in order.
    async fn mark_published(
        &self,
        round: &mut Self::Round,
        handoffs: &[(Stamp, Self::Handoff)],
    ) -> Result<()>;

    /// Ends the round: the marks are durable once this returned `Ok`.
    async fn end_round(&self, round: Self::Round) -> Result<()>;

    /// What [`Outbox::redispatch`](crate::dispatch::Outbox::redispatch)
    /// does, on validated input (distinct ids, at least one, at most
    /// [`MAX_BATCH`](crate::limits::MAX_BATCH)): a fresh unpublished handoff
    /// for each task that is still pending and was not submitted
    /// [`without_handoff`](crate::NewTask::without_handoff), written in one
    /// atomic step with the check of its task; returns how many were written.
    async fn write_handoffs(&self, ids: &[TaskId]) -> Result<u64>;
}
