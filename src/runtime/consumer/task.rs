//! One task's run: held ready until a work slot is free, the work function
//! under the held lease, then the durable outcome and the source told.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::{OwnedSemaphorePermit, watch};
use tokio::task::JoinError;
use tracing::Instrument;

use super::shared::{Shared, give_back};
use crate::backend::rules::Work;
use crate::policy::Failure;
use crate::runtime::commit::Expected;
use crate::runtime::disposition::{rejected, terminal_ack};
use crate::runtime::failure::{fit, panic_failure};
use crate::runtime::held::HeldLeases;
use crate::runtime::source::Source;
use crate::runtime::stop::{Phase, reached};
use crate::runtime::{AckReason, Disposition, LeaveReason, RetryReason, WorkContext};
use crate::store::{Fenced, Lease, Retry};
use crate::task::{Response, TaskId};

/// How one task's work ended.
enum Ended {
    /// The work function returned, or panicked.
    Returned(std::result::Result<std::result::Result<Response, Failure>, JoinError>),
    /// The lease was lost while it ran.
    Lost,
    /// The consumer is stopping at once.
    Stopping,
}

/// One task: held ready until a work slot is free, its work under the held
/// lease (the slot of the concurrency limit held while the work function
/// runs), then the durable outcome, then the source is told.
pub(super) async fn run_task<S, F, Fut>(
    shared: Arc<Shared<S, F>>,
    lease: Lease,
    receipt: S::Receipt,
    permit: OwnedSemaphorePermit,
) where
    S: Source,
    S::Receipt: Clone,
    F: Fn(WorkContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = std::result::Result<Response, Failure>> + Send + 'static,
{
    let held_slot = permit;
    let id = lease.task_id();
    let lost = shared.held.insert(lease.clone(), receipt);
    // Whatever ends this run, a panic in a source's code included, the lease
    // is no longer renewed from here on: at worst it expires.
    let _let_go = LetGo(&shared.held, id);
    // Ready: wait for a work slot; a stop gives back what has not started.
    let mut phase = shared.stop.watch();
    let slot = tokio::select! {
        slot = Arc::clone(&shared.working).acquire_owned() => slot.expect("the semaphore is never closed"),
        () = reached(&mut phase, Phase::Draining) => {
            let Some(receipt) = shared.held.remove(id) else { return };
            return give_back(&shared, lease, receipt, Work::NotStarted).await;
        }
    };
    // Started: the next round of renewals lengthens the ready lease to the
    // full one.
    shared.held.start(id);
    let mut expected = shared.committer.expect();
    // The work and its outcome in the task's `process` span (see `crate::trace`).
    let span = crate::trace::process_span(&lease);
    let ctx = WorkContext {
        store: Arc::clone(&shared.store),
        lease: lease.clone(),
        lost: lost.clone(),
    };
    // The work function is called inside the spawned task, so a panic in
    // the call itself (before it returns its future) is caught there too.
    let work_fn = Arc::clone(&shared.work);
    let mut work = tokio::spawn(async move { work_fn(ctx).await }.instrument(span.clone()));
    // A run dropped with its consumer takes its work function with it.
    let _work_ends_with_the_run = AbortOnDrop(work.abort_handle());
    let ended = tokio::select! {
        returned = &mut work => Ended::Returned(returned),
        () = lost_signal(lost) => {
            if tokio::time::timeout(shared.config.lost_grace, &mut work).await.is_err() {
                tracing::warn!(task_id = %id, "work ignored the lease-lost signal; dropped after the grace");
            }
            Ended::Lost
        }
        () = reached(&mut phase, Phase::Now) => Ended::Stopping,
    };
    work.abort();
    // Only a returned response goes to the committer.
    if !matches!(ended, Ended::Returned(Ok(Ok(_)))) {
        expected.done();
    }
    // The work is over: its slots go to the next tasks while the outcome is
    // saved (the lease stays held, and renewed, until then).
    drop((slot, held_slot));
    let disposition = outcome(&shared, lease, ended, expected, &span)
        .instrument(span.clone())
        .await;
    let Some(disposition) = disposition else { return };
    let Some(receipt) = shared.held.remove(id) else {
        return;
    };
    shared.settle(receipt, disposition).await;
}

/// What became of a task's work: the store told (the response saved, the
/// failure reported) and `span` marked; `None` when the run gave the task
/// back (a stop) and the source is told nothing more.
async fn outcome<S, F, Fut>(
    shared: &Arc<Shared<S, F>>,
    lease: Lease,
    ended: Ended,
    expected: Expected,
    span: &tracing::Span,
) -> Option<Disposition>
where
    S: Source,
    S::Receipt: Clone,
    F: Fn(WorkContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = std::result::Result<Response, Failure>> + Send + 'static,
{
    let id = lease.task_id();
    Some(match ended {
        Ended::Stopping => {
            crate::trace::record_error(span, "stopped");
            let receipt = shared.held.remove(id)?;
            give_back(shared, lease, receipt, Work::Started).await;
            return None;
        }
        Ended::Lost => {
            crate::trace::record_error(span, "lease_lost");
            shared.tally.lost.fetch_add(1, Ordering::Relaxed);
            match shared.held.lost(id).flatten() {
                Some(rejection) => terminal_ack(&rejection)
                    .unwrap_or(Disposition::Leave(LeaveReason::LeaseLost(Some(rejection)))),
                None => Disposition::Leave(LeaveReason::LeaseLost(None)),
            }
        }
        Ended::Returned(Ok(Ok(response))) => match shared.committer.complete(lease, response, expected).await
        {
            Ok(Fenced::Accepted(_)) => {
                crate::trace::record_ok(span);
                Disposition::Ack(AckReason::Completed)
            }
            Ok(Fenced::Rejected(rejection)) => {
                crate::trace::record_error(span, "refused");
                rejected(rejection)
            }
            Err(error) => {
                crate::trace::record_error(span, "store_error");
                tracing::warn!(task_id = %id, %error, "saving the response failed; the next delivery decides");
                Disposition::Leave(LeaveReason::StoreFailed)
            }
        },
        Ended::Returned(Ok(Err(failure))) => {
            crate::trace::record_error(span, failure.kind.as_str());
            report(shared, lease, failure).await
        }
        Ended::Returned(Err(join)) => {
            crate::trace::record_error(span, "panic");
            let failure = if join.is_panic() {
                panic_failure(join.into_panic())
            } else {
                Failure::retryable("the work function was cancelled")
            };
            tracing::error!(task_id = %id, message = %failure.message, "work function panicked");
            report(shared, lease, failure).await
        }
    })
}

/// Stops holding a task's lease when dropped (a no-op when the run already did).
struct LetGo<'h, R: Clone>(&'h HeldLeases<R>, TaskId);

impl<R: Clone> Drop for LetGo<'_, R> {
    fn drop(&mut self) {
        self.0.remove(self.1);
    }
}

/// Aborts a spawned task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Resolves once the lease is lost.
async fn lost_signal(mut lost: watch::Receiver<bool>) {
    if lost.wait_for(|lost| *lost).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Reports a failure to the task's policy.
async fn report<S: Source, F>(shared: &Shared<S, F>, lease: Lease, mut failure: Failure) -> Disposition {
    shared.tally.failed.fetch_add(1, Ordering::Relaxed);
    if failure.validate().is_err() {
        failure.message = fit(&failure.message);
    }
    let id = lease.task_id();
    crate::runtime::failure::drain_bucket(&*shared.store, &lease, &failure).await;
    match shared.store.fail(lease, failure).await {
        Ok(Fenced::Accepted(Retry::Scheduled {
            not_before,
            attempts_left,
        })) => shared.retry_at(not_before, RetryReason::Scheduled { attempts_left }),
        Ok(Fenced::Accepted(Retry::Exhausted(_))) => Disposition::Ack(AckReason::Failed),
        Ok(Fenced::Rejected(rejection)) => rejected(rejection),
        Err(error) => {
            tracing::warn!(task_id = %id, %error, "reporting the failure failed; the next delivery decides");
            Disposition::Leave(LeaveReason::StoreFailed)
        }
    }
}
