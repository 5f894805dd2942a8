//! The retention sweep a service runs beside its workers: finished tasks
//! whose retention has passed are removed ([`TaskStore::purge_expired`]) on
//! a schedule, so each idempotency key expires when its retention says and
//! the store stops growing.

use std::time::Duration;

use super::Stop;
use crate::error::Result;
use crate::store::TaskStore;

/// Sweeps `store` at once and then every `every` until `stop` is requested
/// (a statement in progress finishes first); each sweep is a
/// [`purge_expired_all`] of `batch` tasks per statement. It logs what it
/// removed; a failed sweep is logged and tried again at the next one.
/// Several processes sweeping at once only share the work. An `every` of
/// zero sweeps nothing: another process or a scheduled job (`taskfence
/// purge`) does it.
///
/// ```no_run
/// # async fn f(store: std::sync::Arc<taskfence::MemoryStore>) {
/// use std::time::Duration;
/// let stop = taskfence::runtime::Stop::new();
/// let sweep = tokio::spawn({
///     let stop = stop.clone();
///     async move { taskfence::runtime::purge_every(&*store, Duration::from_secs(600), 1000, stop).await }
/// });
/// // … on shutdown:
/// stop.drain();
/// sweep.await.unwrap();
/// # }
/// ```
pub async fn purge_every<S: TaskStore + ?Sized>(store: &S, every: Duration, batch: usize, stop: Stop) {
    if every.is_zero() {
        tracing::info!("retention sweep off (purge interval 0)");
        return;
    }
    loop {
        match purge_expired_all(store, batch, &stop).await {
            Ok(0) => tracing::debug!("retention sweep: nothing expired"),
            Ok(purged) => tracing::info!(purged, "retention sweep: purged expired tasks"),
            Err(error) => tracing::warn!(%error, "retention sweep failed; trying again next interval"),
        }
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = stop.requested() => return,
        }
    }
}

/// [`purge_every`] in a task of its own, owning `store`: the sweep as one
/// more task a service runs beside its consumers and stops with the same
/// [`Stop`]; await the handle with theirs.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::time::Duration;
/// let stop = taskfence::runtime::Stop::new();
/// let sweep = taskfence::runtime::spawn_purge(taskfence::MemoryStore::new(), Duration::from_secs(600), 1000, stop.clone());
/// stop.drain();
/// sweep.await.expect("the sweep ends at the stop");
/// # }
/// ```
pub fn spawn_purge<S: TaskStore + 'static>(
    store: S,
    every: Duration,
    batch: usize,
    stop: Stop,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move { purge_every(&store, every, batch, stop).await })
}

/// One sweep: [`TaskStore::purge_expired`]`(batch)` statement after
/// statement until one removes fewer than `batch` (nothing more has expired)
/// or `stop` is requested. The tasks removed.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
/// let store = taskfence::MemoryStore::new();
/// let stop = taskfence::runtime::Stop::new();
/// assert_eq!(taskfence::runtime::purge_expired_all(&store, 1000, &stop).await?, 0);
/// # Ok(()) }
/// ```
pub async fn purge_expired_all<S: TaskStore + ?Sized>(store: &S, batch: usize, stop: &Stop) -> Result<u64> {
    let mut total = 0;
    loop {
        let purged = store.purge_expired(batch).await?;
        total += purged;
        if purged < batch as u64 || stop.is_requested() {
            return Ok(total);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use time::OffsetDateTime;

    use super::{purge_every, purge_expired_all};
    use crate::clock::ManualClock;
    use crate::runtime::Stop;
    use crate::store::{Claim, ClaimRequest, TaskStore};
    use crate::task::{InputHash, NewTask, RequestKey, Response};
    use crate::{MemoryStore, Submitted};

    /// A store with `n` completed tasks of a one-minute retention, and its clock.
    async fn finished(n: usize) -> (MemoryStore, ManualClock) {
        let clock = ManualClock::new(OffsetDateTime::now_utc());
        let store = MemoryStore::with_clock(clock.clone());
        for i in 0..n {
            let key = RequestKey::new("u", "op", format!("k{i}"));
            let new = NewTask::new(key, InputHash::of(["x"])).retention(Duration::from_secs(60));
            let Submitted::Created(task) = store.submit(new).await.unwrap() else {
                panic!("a new key")
            };
            let request = ClaimRequest::new("w", Duration::from_secs(30));
            let Claim::Acquired(lease) = store.claim(task.id, request).await.unwrap() else {
                panic!("a pending task")
            };
            assert!(
                store
                    .complete(lease, Response::from("ok"))
                    .await
                    .unwrap()
                    .is_accepted()
            );
        }
        (store, clock)
    }

    #[tokio::test]
    async fn a_sweep_repeats_its_batch_until_nothing_expired_is_left() {
        let (store, clock) = finished(3).await;
        let stop = Stop::new();
        assert_eq!(
            purge_expired_all(&store, 1, &stop).await.unwrap(),
            0,
            "retention not over"
        );
        clock.advance(Duration::from_secs(3600));
        assert_eq!(purge_expired_all(&store, 1, &stop).await.unwrap(), 3);
        assert_eq!(store.record_count(), 0);
    }

    #[tokio::test]
    async fn a_stop_ends_the_sweep_after_its_statement_and_ends_the_schedule() {
        let (store, clock) = finished(3).await;
        clock.advance(Duration::from_secs(3600));
        let stop = Stop::new();
        stop.drain();
        assert_eq!(
            purge_expired_all(&store, 1, &stop).await.unwrap(),
            1,
            "one statement, then the stop"
        );
        // Already stopped: one sweep, then it returns instead of waiting an hour.
        purge_every(&store, Duration::from_secs(3600), 1, stop).await;
        let left = purge_expired_all(&store, 10, &Stop::new()).await.unwrap();
        assert_eq!(left, 1, "the schedule's one sweep removed one");
    }
}
