//! What every task's run of a consumer shares, and how a delivery is
//! settled with the source or a lease given back.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::config::ConsumerConfig;
use super::stopped::Tally;
use crate::backend::rules::Work;
use crate::clock::Clock;
use crate::runtime::commit::Committer;
use crate::runtime::disposition::retry_at;
use crate::runtime::held::HeldLeases;
use crate::runtime::source::Source;
use crate::runtime::stop::Stop;
use crate::runtime::{Disposition, RetryReason};
use crate::store::{Fenced, Lease, TaskStore};

/// What every run of a consumer shares.
pub(super) struct Shared<S: Source, F> {
    /// A slot per work function running (the concurrency limit).
    pub(super) working: Arc<Semaphore>,
    pub(super) store: Arc<dyn TaskStore>,
    pub(super) source: Arc<S>,
    pub(super) config: Arc<ConsumerConfig>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) held: Arc<HeldLeases<S::Receipt>>,
    pub(super) committer: Committer,
    pub(super) tally: Tally,
    pub(super) stop: Stop,
    pub(super) work: Arc<F>,
}

impl<S: Source, F> Shared<S, F> {
    pub(super) fn retry_at(&self, at: time::OffsetDateTime, reason: RetryReason) -> Disposition {
        retry_at(&*self.clock, self.config.min_retry_delay, at, reason)
    }

    /// Tells the source, within the release deadline.
    pub(super) async fn settle(&self, receipt: S::Receipt, disposition: Disposition) {
        self.tally.add(&disposition);
        match tokio::time::timeout(
            self.config.release_deadline,
            self.source.settle(receipt, disposition),
        )
        .await
        {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "settling a delivery failed"),
            Err(_) => tracing::warn!("settling a delivery timed out"),
        }
    }
}

/// Releases a lease this consumer will not work on (any more), and tells
/// the source: a task whose work never started is given back unstarted, so
/// its claim costs no attempt; one whose work began is released and counts.
pub(super) async fn give_back<S: Source, F>(
    shared: &Shared<S, F>,
    lease: Lease,
    receipt: S::Receipt,
    work: Work,
) {
    let released = match work {
        Work::Started => shared.store.release(lease).await,
        Work::NotStarted => shared.store.release_unstarted(lease).await,
    };
    match released {
        Ok(Fenced::Accepted(())) if work == Work::NotStarted => {
            shared.tally.unstarted.fetch_add(1, Ordering::Relaxed);
        }
        Ok(_) => {}
        Err(error) => tracing::warn!(%error, "releasing a lease failed; it expires on its own"),
    }
    let released = Disposition::RetryAfter {
        delay: Duration::ZERO,
        reason: RetryReason::Released,
    };
    shared.settle(receipt, released).await;
}
