//! [`ConsumerConfig`]: how a [`Consumer`](super::Consumer) fetches, works,
//! renews, commits and stops.

use std::time::Duration;

#[cfg(doc)]
use super::Consumer;
use crate::error::InvalidInput;
use crate::limits;
#[cfg(doc)]
use crate::runtime::{Disposition, StoreQueue, WorkContext};
use crate::store::ClaimRequest;

/// How a [`Consumer`] fetches, works, renews, commits and stops.
///
/// ```
/// use std::time::Duration;
/// use taskfence::runtime::ConsumerConfig;
/// let config = ConsumerConfig::new("worker-1", Duration::from_secs(30)).concurrency(32);
/// assert_eq!((config.prefetch, config.fetch), (32, 64), "as many again held ready, fetched at once");
/// assert!(config.validate().is_ok());
/// assert!(ConsumerConfig::new("worker-1", Duration::from_secs(30)).concurrency(0).validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerConfig {
    /// Recorded with every attempt.
    pub worker_id: String,
    /// Lease length asked for at claim and at every renewal (store clock).
    pub lease_duration: Duration,
    /// How many work functions run at once. Default 16.
    pub concurrency: usize,
    /// How many tasks beyond those running the consumer holds ready (leased,
    /// renewed, started as soon as a work function returns), so the next
    /// fetch overlaps the work and the commits. Defaults to `concurrency`;
    /// 0 fetches only for free slots. On a stop, tasks not started yet are
    /// released at once.
    pub prefetch: usize,
    /// The most deliveries one fetch asks for. Defaults to
    /// `concurrency + prefetch`.
    pub fetch: usize,
    /// How often the held leases are renewed, all in one request. Defaults
    /// to a third of the lease.
    pub renew_every: Duration,
    /// The most completions saved by one batched write. Default 64.
    pub commit_batch: usize,
    /// How long a batch of completions waits for more while other work
    /// functions still run (a batch never waits when none do). Default 2 ms.
    pub commit_window: Duration,
    /// The first wait after a fetch found nothing; each empty fetch doubles
    /// it up to [`idle_max`](Self::idle_max). A submission through
    /// [`StoreQueue::submitter`] ends the wait at once. Default 50 ms.
    pub idle_min: Duration,
    /// The longest wait between empty fetches. Default 1 s.
    pub idle_max: Duration,
    /// On a stop, how long running work (and a fetch under way) may take
    /// to finish before its lease is released, counted from the stop
    /// request. Default 30 s.
    pub grace: Duration,
    /// After the grace (or on a second stop request), how long releasing
    /// the remaining leases and saving the last completions may take before
    /// the consumer returns regardless: a slow store or broker never holds
    /// the process past `grace + release_deadline`. Default 5 s.
    pub release_deadline: Duration,
    /// After a lease is lost, how long its work function may take to notice
    /// [`WorkContext::lease_lost`] before it is dropped. Default 5 s.
    pub lost_grace: Duration,
    /// The shortest [`Disposition::RetryAfter`] delay a broker source is
    /// told. Default 1 s.
    pub min_retry_delay: Duration,
}

impl ConsumerConfig {
    /// A consumer `worker_id` holding leases of `lease_duration`, with the defaults.
    pub fn new(worker_id: impl Into<String>, lease_duration: Duration) -> Self {
        Self {
            worker_id: worker_id.into(),
            lease_duration,
            concurrency: 16,
            prefetch: 16,
            fetch: 32,
            renew_every: lease_duration / 3,
            commit_batch: 64,
            commit_window: Duration::from_millis(2),
            idle_min: Duration::from_millis(50),
            idle_max: Duration::from_secs(1),
            grace: Duration::from_secs(30),
            release_deadline: Duration::from_secs(5),
            lost_grace: Duration::from_secs(5),
            min_retry_delay: Duration::from_secs(1),
        }
    }

    /// Sets `concurrency`, and `prefetch` to the same (`fetch` to twice it).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self.prefetch = n;
        self.fetch = n.saturating_mul(2);
        self
    }

    /// Sets `prefetch` (and `fetch` to `concurrency + prefetch`).
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = n;
        self.fetch = self.concurrency.saturating_add(n);
        self
    }

    /// Sets `fetch`.
    pub fn fetch(mut self, n: usize) -> Self {
        self.fetch = n;
        self
    }

    /// Sets `renew_every`.
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = every;
        self
    }

    /// Sets `commit_batch` and `commit_window`.
    pub fn commit(mut self, batch: usize, window: Duration) -> Self {
        self.commit_batch = batch;
        self.commit_window = window;
        self
    }

    /// Sets `idle_min` and `idle_max`.
    pub fn idle(mut self, min: Duration, max: Duration) -> Self {
        self.idle_min = min;
        self.idle_max = max;
        self
    }

    /// Sets `grace` and `release_deadline`.
    pub fn stop_after(mut self, grace: Duration, release_deadline: Duration) -> Self {
        self.grace = grace;
        self.release_deadline = release_deadline;
        self
    }

    /// Sets `lost_grace`.
    pub fn lost_grace(mut self, grace: Duration) -> Self {
        self.lost_grace = grace;
        self
    }

    /// Sets `min_retry_delay`.
    pub fn min_retry_delay(mut self, delay: Duration) -> Self {
        self.min_retry_delay = delay;
        self
    }

    /// Checks the worker id and lease as a claim would, the counts against
    /// [`limits::MAX_BATCH`], and that renewals come before the lease runs out.
    pub fn validate(&self) -> std::result::Result<(), InvalidInput> {
        ClaimRequest::new(self.worker_id.clone(), self.lease_duration).validate()?;
        if self.prefetch > limits::MAX_BATCH {
            return Err(InvalidInput::OutOfRange {
                field: "prefetch",
                value: self.prefetch.to_string(),
                min: "0".into(),
                max: limits::MAX_BATCH.to_string(),
            });
        }
        for (field, n) in [
            ("concurrency", self.concurrency),
            ("fetch", self.fetch),
            ("commit_batch", self.commit_batch),
        ] {
            if n == 0 || n > limits::MAX_BATCH {
                return Err(InvalidInput::OutOfRange {
                    field,
                    value: n.to_string(),
                    min: "1".into(),
                    max: limits::MAX_BATCH.to_string(),
                });
            }
        }
        limits::check_duration("renew_every", self.renew_every, self.lease_duration)?;
        if self.renew_every >= self.lease_duration {
            return Err(InvalidInput::Inconsistent(
                "renew_every must be shorter than the lease",
            ));
        }
        limits::check_duration("idle_min", self.idle_min, self.idle_max)?;
        Ok(())
    }

    pub(super) fn claim(&self) -> ClaimRequest {
        ClaimRequest::new(self.worker_id.clone(), self.lease_duration)
    }
}
