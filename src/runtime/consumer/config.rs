//! [`ConsumerConfig`]: how a [`Consumer`](super::Consumer) fetches, works,
//! renews, commits and stops.

use std::time::Duration;

#[cfg(doc)]
use super::Consumer;
use crate::error::InvalidInput;
use crate::limits;
use crate::runtime::held::Renewals;
#[cfg(doc)]
use crate::runtime::{Disposition, StoreQueue, WorkContext};
use crate::store::ClaimRequest;

/// How a [`Consumer`] fetches, works, renews, commits and stops.
///
/// ```
/// use std::time::Duration;
/// use taskfence::runtime::ConsumerConfig;
/// let config = ConsumerConfig::new("worker-1", Duration::from_secs(30)).concurrency(32);
/// assert_eq!((config.prefetch, config.fetch), (8, 40), "a quarter again held ready, fetched at once");
/// assert_eq!(config.ready_lease, Duration::from_secs(10), "held ready on a third of the lease");
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
    /// How many tasks beyond those running the consumer holds ready (leased
    /// on [`ready_lease`](Self::ready_lease), renewed, started as soon as a
    /// work function returns), so the next fetch overlaps the work and the
    /// commits. Defaults to a quarter of `concurrency` (rounded up): every
    /// task held is one another process cannot take meanwhile. 0 fetches
    /// only for free slots. On a stop, tasks not started yet are given back
    /// at once, unstarted ([`TaskStore::release_unstarted`](crate::TaskStore::release_unstarted)):
    /// their claims cost no attempt.
    pub prefetch: usize,
    /// The lease a claimed task is held on until its work starts (store
    /// clock): a crash delays a task nobody started by this much only. The
    /// round of renewals after its work starts lengthens it to
    /// [`lease_duration`](Self::lease_duration), batched with the other
    /// renewals; while ready leases are shorter than the full one, a round
    /// comes every third of the ready lease (or `renew_every`, if shorter).
    /// Defaults to a third of the lease; set it to `lease_duration` to hold
    /// ready tasks on the full lease.
    pub ready_lease: Duration,
    /// The most deliveries one fetch asks for. Defaults to
    /// `concurrency + prefetch`.
    pub fetch: usize,
    /// How often running work's leases are renewed to the full lease, all in
    /// one request. Defaults to a third of the lease.
    pub renew_every: Duration,
    /// The most completions saved by one batched write. Default 64.
    pub commit_batch: usize,
    /// How long a batch of completions waits for more while other work
    /// functions still run (a batch never waits when none do). Default 2 ms.
    pub commit_window: Duration,
    /// The first wait after a fetch found nothing; each empty fetch doubles
    /// it up to [`idle_max`](Self::idle_max). A fetch that drained the store
    /// (it came back short, see
    /// [`Source::short_fetch_drains`](crate::runtime::Source::short_fetch_drains))
    /// is followed by this wait too. A submission through
    /// [`StoreQueue::submitter`] ends the wait at once. Default 5 ms: under a
    /// steady trickle, a task submitted by another process waits at most
    /// about this long for a look, at the price of a fetch (and its commit)
    /// this often while work trickles in; an idle queue's waits reach
    /// `idle_max` within about 2 s.
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
    /// the process past `grace + release_deadline`. A fetch still under way
    /// gets this long too, and what it took is given back: its claim may
    /// reach the store even if the consumer gave up on it. Default 5 s.
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
            prefetch: default_prefetch(16),
            fetch: 16 + default_prefetch(16),
            ready_lease: lease_duration / 3,
            renew_every: lease_duration / 3,
            commit_batch: 64,
            commit_window: Duration::from_millis(2),
            idle_min: Duration::from_millis(5),
            idle_max: Duration::from_secs(1),
            grace: Duration::from_secs(30),
            release_deadline: Duration::from_secs(5),
            lost_grace: Duration::from_secs(5),
            min_retry_delay: Duration::from_secs(1),
        }
    }

    /// Sets `concurrency`, and `prefetch` to a quarter of it, rounded up
    /// (`fetch` to their sum).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self.prefetch = default_prefetch(n);
        self.fetch = n.saturating_add(self.prefetch);
        self
    }

    /// Sets `prefetch` (and `fetch` to `concurrency + prefetch`).
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = n;
        self.fetch = self.concurrency.saturating_add(n);
        self
    }

    /// Sets `ready_lease`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use taskfence::runtime::ConsumerConfig;
    /// let config = ConsumerConfig::new("w", Duration::from_secs(60)).ready_lease(Duration::from_secs(5));
    /// assert!(config.validate().is_ok());
    /// assert!(config.ready_lease(Duration::from_secs(61)).validate().is_err(), "never longer than the lease");
    /// ```
    pub fn ready_lease(mut self, lease_duration: Duration) -> Self {
        self.ready_lease = lease_duration;
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

    /// Sets `idle_max` to `every`, the longest wait between two looks for
    /// work nothing woke the consumer for (a submission in another process,
    /// a retry past its backoff, an expired lease), and lowers `idle_min` to
    /// it if it was longer: what a service's `--poll-every` flag means.
    ///
    /// ```
    /// use std::time::Duration;
    /// use taskfence::runtime::ConsumerConfig;
    /// let config = ConsumerConfig::new("w", Duration::from_secs(30)).poll_every(Duration::from_millis(1));
    /// assert_eq!((config.idle_min, config.idle_max), (Duration::from_millis(1), Duration::from_millis(1)));
    /// ```
    pub fn poll_every(mut self, every: Duration) -> Self {
        self.idle_min = self.idle_min.min(every);
        self.idle_max = every;
        self
    }

    /// Sets `grace`: at a drain, how long the work in flight may take to
    /// finish before the rest is released (`release_deadline` unchanged).
    ///
    /// ```
    /// use std::time::Duration;
    /// use taskfence::runtime::ConsumerConfig;
    /// let config = ConsumerConfig::new("w", Duration::from_secs(30)).grace(Duration::from_secs(3));
    /// assert_eq!(config.grace, Duration::from_secs(3));
    /// ```
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// A worker id unique to this process and start: `{name}-{pid}-{random}`
    /// (12 hex digits), so two replicas, or a restarted one, never record
    /// their attempts under the same name.
    ///
    /// ```
    /// use taskfence::runtime::ConsumerConfig;
    /// let id = ConsumerConfig::unique_id("chat-worker");
    /// assert!(id.starts_with(&format!("chat-worker-{}-", std::process::id())));
    /// assert_ne!(id, ConsumerConfig::unique_id("chat-worker"));
    /// ```
    pub fn unique_id(name: &str) -> String {
        // A v7 id's last 12 hex digits are random.
        let random = uuid::Uuid::now_v7().simple().to_string();
        format!("{name}-{}-{}", std::process::id(), &random[20..])
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
        limits::check_duration("ready_lease", self.ready_lease, self.lease_duration)?;
        Ok(())
    }

    /// A claim of tasks to hold ready: on the ready lease.
    pub(super) fn claim(&self) -> ClaimRequest {
        ClaimRequest::new(self.worker_id.clone(), self.ready_lease)
    }

    pub(super) fn renewals(&self) -> Renewals {
        Renewals {
            lease_duration: self.lease_duration,
            renew_every: self.renew_every,
            ready_lease: self.ready_lease,
        }
    }
}

/// The default prefetch at `concurrency`: a quarter of it, rounded up.
fn default_prefetch(concurrency: usize) -> usize {
    concurrency.div_ceil(4)
}
