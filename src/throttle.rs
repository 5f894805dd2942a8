//! Limits that hold across every worker: concurrency keys and rate buckets.
//!
//! Both are decided by the store at claim time, in the same atomic step as
//! the claim, so they hold across every process that shares the store:
//!
//! - A [`ConcurrencyKey`] (`conversation-7` with limit 1, `tenant-acme` with
//!   limit 8) caps how many tasks naming it run at once. A slot *is* a
//!   task's lease: it is held while the lease is live, so a crashed worker's
//!   slot comes back when its lease expires, and only the store's record of
//!   the current assignment counts, so a superseded worker can never free a
//!   slot it no longer holds.
//! - A [`RateBucket`] (`openai-key-1`: 500 per minute, burst 50) is a token
//!   bucket kept in the store: every claim of a task naming it takes a
//!   token, and a provider's `429 Retry-After` drains it for everyone
//!   ([`TaskStore::drain_bucket`](crate::TaskStore::drain_bucket)).
//!
//! A claim refused for a limit writes nothing and costs no attempt: it is
//! answered [`Claim::Throttled`](crate::Claim::Throttled), and
//! [`claim_next`](crate::TaskStore::claim_next) skips such tasks instead
//! of claiming and releasing them.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
//! use std::time::Duration;
//! use taskfence::throttle::ConcurrencyKey;
//! use taskfence::*;
//!
//! let store = MemoryStore::new();
//! let in_order = ConcurrencyKey::new("conversation-7", 1);
//! for msg in ["hello", "and another thing"] {
//!     let key = RequestKey::new("user-1", "chat.reply", msg);
//!     store.submit(NewTask::new(key, InputHash::of([msg])).concurrency(in_order.clone())).await?;
//! }
//! let taken = store.claim_next(ClaimNext::new("w", Duration::from_secs(30), 10)).await?;
//! assert_eq!(taken.len(), 1, "one message of the conversation at a time");
//! assert_eq!(taken[0].task().key.key, "hello", "the older one first");
//! # Ok(()) }
//! ```

use std::fmt;
use std::time::Duration;

use time::OffsetDateTime;

use crate::error::InvalidInput;
use crate::limits::{self, check_range, check_text};
use crate::task::TaskId;

/// Longest concurrency key or bucket name, in bytes.
pub const MAX_NAME_LEN: usize = 255;
/// Highest concurrency limit of a key.
pub const MAX_CONCURRENCY: u32 = 10_000;
/// Highest rate of a bucket, in tokens per period.
pub const MAX_RATE: u32 = 1_000_000;
/// Largest burst of a bucket.
pub const MAX_BURST: u32 = 100_000;
/// Longest period of a bucket.
pub const MAX_PERIOD: Duration = Duration::from_secs(24 * 3600);
/// Longest drain of a bucket (a provider's `Retry-After`).
pub const MAX_DRAIN: Duration = Duration::from_secs(24 * 3600);

/// A name under which tasks share a concurrency limit: at most
/// [`limit`](Self::limit) tasks naming it run at once, across every process.
///
/// The limit travels with each task: a claim is decided against the
/// claiming task's own limit, so tasks that name one key should name one
/// limit. With limit 1 the key's tasks also run **in submission order**: a
/// task does not start while an older task of its key is unfinished
/// (pending, backing off after a retryable failure, or running). A task
/// that fails and retries keeps its place: the next one waits for the retry
/// and starts once the older task completes, fails for good or is
/// cancelled. With a higher limit the oldest due task of the key is offered
/// first, and a backing-off task holds no slot.
///
/// Keys are store-wide, across scopes and operations: `tenant-acme` limits
/// every operation that names it. They are chosen by the service, never
/// taken from a caller's input unchecked.
///
/// ```
/// use taskfence::throttle::ConcurrencyKey;
/// let key = ConcurrencyKey::new("tenant-acme", 8);
/// assert_eq!((key.name(), key.limit()), ("tenant-acme", 8));
/// assert!(ConcurrencyKey::new("tenant-acme", 0).validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ConcurrencyKey {
    name: String,
    limit: u32,
}

impl ConcurrencyKey {
    /// A key and its limit; checked on submission ([`validate`](Self::validate)).
    pub fn new(name: impl Into<String>, limit: u32) -> Self {
        Self {
            name: name.into(),
            limit,
        }
    }

    /// The key.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many of its tasks may run at once.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Whether the key runs its tasks one at a time, in submission order.
    ///
    /// ```
    /// assert!(taskfence::throttle::ConcurrencyKey::new("conversation-7", 1).in_order());
    /// ```
    pub fn in_order(&self) -> bool {
        self.limit == 1
    }

    /// Checks the name (not blank, at most [`MAX_NAME_LEN`] bytes, no control
    /// characters) and the limit (1 to [`MAX_CONCURRENCY`]).
    ///
    /// ```
    /// use taskfence::throttle::ConcurrencyKey;
    /// assert!(ConcurrencyKey::new("k", 1).validate().is_ok());
    /// assert!(ConcurrencyKey::new(" ", 1).validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<(), InvalidInput> {
        check_text("concurrency_key", &self.name, MAX_NAME_LEN)?;
        check_range("concurrency_limit", self.limit, 1, MAX_CONCURRENCY)
    }
}

/// A named token bucket kept in the store: [`rate`](Self::rate) tokens per
/// [`period`](Self::period), at most [`burst`](Self::burst) at once. Every
/// claim of a task naming the bucket takes one token; without one the claim
/// is refused with the instant the next token is due, writes nothing and
/// costs no attempt.
///
/// Tokens come at an even pace, one every `period / rate`, and unused ones
/// accumulate up to the burst (the generic cell rate algorithm: the store
/// keeps one instant per bucket, so every backend decides it the same way
/// with integer arithmetic). A token taken by a claim is not given back when
/// the claim is released unstarted: the limit errs on the side of the
/// provider.
///
/// Define a bucket with
/// [`TaskStore::define_bucket`](crate::TaskStore::define_bucket) before
/// submitting tasks that name it.
///
/// ```
/// use std::time::Duration;
/// use taskfence::throttle::RateBucket;
/// let bucket = RateBucket::per_minute("openai-key-1", 500).burst(50);
/// assert_eq!(bucket.interval(), Duration::from_millis(120));
/// assert!(bucket.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RateBucket {
    name: String,
    rate: u32,
    period: Duration,
    burst: u32,
}

impl RateBucket {
    /// `rate` tokens per `period`, with a burst of 1 (an even pace).
    pub fn new(name: impl Into<String>, rate: u32, period: Duration) -> Self {
        Self {
            name: name.into(),
            rate,
            period,
            burst: 1,
        }
    }

    /// `rate` tokens per second.
    pub fn per_second(name: impl Into<String>, rate: u32) -> Self {
        Self::new(name, rate, Duration::from_secs(1))
    }

    /// `rate` tokens per minute.
    pub fn per_minute(name: impl Into<String>, rate: u32) -> Self {
        Self::new(name, rate, Duration::from_secs(60))
    }

    /// At most `burst` tokens taken at once after a quiet time.
    pub fn burst(mut self, burst: u32) -> Self {
        self.burst = burst;
        self
    }

    /// The bucket's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Tokens per [`period`](Self::period).
    pub fn rate(&self) -> u32 {
        self.rate
    }

    /// The period of the rate.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// Most tokens taken at once.
    pub fn burst_size(&self) -> u32 {
        self.burst
    }

    /// The time between two tokens at the steady rate: `period / rate`
    /// (at least a microsecond).
    pub fn interval(&self) -> Duration {
        let nanos = self.period.as_nanos() / u128::from(self.rate.max(1));
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX).max(1_000))
    }

    /// How far ahead of the present the bucket's schedule may run: the
    /// burst less one token's interval.
    pub fn tolerance(&self) -> Duration {
        self.interval() * self.burst.saturating_sub(1)
    }

    /// Checks the name (as a [`ConcurrencyKey`]'s), the rate (1 to
    /// [`MAX_RATE`]), the period (positive, at most [`MAX_PERIOD`]), the
    /// burst (1 to [`MAX_BURST`], and at most the rate: a burst larger than
    /// a whole period's tokens is a different rate).
    ///
    /// ```
    /// use taskfence::throttle::RateBucket;
    /// assert!(RateBucket::per_minute("k", 0).validate().is_err());
    /// assert!(RateBucket::per_minute("k", 10).burst(11).validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<(), InvalidInput> {
        check_text("bucket", &self.name, MAX_NAME_LEN)?;
        check_range("rate", self.rate, 1, MAX_RATE)?;
        limits::check_duration("period", self.period, MAX_PERIOD)?;
        check_range("burst", self.burst, 1, MAX_BURST.min(self.rate))
    }
}

/// The limits a task is subject to: none by default.
///
/// ```
/// use taskfence::throttle::{ConcurrencyKey, TaskLimits};
/// let limits = TaskLimits::default();
/// assert!(limits.is_none());
/// let limits = TaskLimits { concurrency: Some(ConcurrencyKey::new("k", 2)), bucket: None };
/// assert!(!limits.is_none());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TaskLimits {
    /// The concurrency key the task counts against, with its limit.
    pub concurrency: Option<ConcurrencyKey>,
    /// The name of the rate bucket each claim takes a token from.
    pub bucket: Option<String>,
}

impl TaskLimits {
    /// `true` when the task names no limit.
    pub fn is_none(&self) -> bool {
        self.concurrency.is_none() && self.bucket.is_none()
    }

    /// Checks the key and the bucket's name.
    ///
    /// ```
    /// use taskfence::throttle::TaskLimits;
    /// let bad = TaskLimits { concurrency: None, bucket: Some(String::new()) };
    /// assert!(bad.validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<(), InvalidInput> {
        if let Some(key) = &self.concurrency {
            key.validate()?;
        }
        if let Some(bucket) = &self.bucket {
            check_text("bucket", bucket, MAX_NAME_LEN)?;
        }
        Ok(())
    }
}

/// Why a claim was refused for a limit. Nothing was written and no attempt
/// was counted; claim again later.
///
/// ```
/// use taskfence::throttle::Throttled;
/// let why = Throttled::Concurrency { key: "tenant-acme".into(), limit: 8 };
/// assert_eq!(why.to_string(), "8 tasks of concurrency key tenant-acme are running");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Throttled {
    /// As many tasks of the key as its limit are running.
    Concurrency {
        /// The key.
        key: String,
        /// Its limit (the claiming task's).
        limit: u32,
    },
    /// The key runs in order and an older task of it is unfinished.
    InOrder {
        /// The key.
        key: String,
        /// The oldest unfinished task of the key: it goes first.
        behind: TaskId,
    },
    /// The bucket has no token before `next`.
    Rate {
        /// The bucket.
        bucket: String,
        /// When the next token is due (store clock).
        next: OffsetDateTime,
    },
}

impl fmt::Display for Throttled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Throttled::Concurrency { key, limit } => {
                write!(f, "{limit} tasks of concurrency key {key} are running")
            }
            Throttled::InOrder { key, behind } => {
                write!(
                    f,
                    "concurrency key {key} runs in order and task {behind} is first"
                )
            }
            Throttled::Rate { bucket, next } => write!(f, "bucket {bucket} has no token before {next}"),
        }
    }
}

/// A bucket's definition and the store's state of it, as
/// [`Inspect::buckets`](crate::inspect::Inspect::buckets) reports it.
///
/// ```
/// # fn f(state: taskfence::throttle::BucketState, now: time::OffsetDateTime) {
/// println!("{}: {} of {} tokens", state.bucket.name(), state.available(now), state.bucket.burst_size());
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketState {
    /// The definition.
    pub bucket: RateBucket,
    /// The instant the bucket's schedule has reached: a claim at `now` may
    /// take a token when `schedule - tolerance <= now`. `None` before the first token.
    pub schedule: Option<OffsetDateTime>,
}

impl BucketState {
    /// Tokens a claim could take at `now`, without waiting.
    ///
    /// ```
    /// use taskfence::throttle::{BucketState, RateBucket};
    /// let now = time::OffsetDateTime::UNIX_EPOCH;
    /// let fresh = BucketState { bucket: RateBucket::per_second("k", 10).burst(5), schedule: None };
    /// assert_eq!(fresh.available(now), 5);
    /// ```
    pub fn available(&self, now: OffsetDateTime) -> u32 {
        let interval = self.bucket.interval();
        let behind = match self.schedule {
            Some(schedule) if schedule > now => (schedule - now).unsigned_abs(),
            _ => Duration::ZERO,
        };
        let used = behind.as_nanos().div_ceil(interval.as_nanos());
        let burst = self.bucket.burst_size();
        burst.saturating_sub(u32::try_from(used).unwrap_or(burst))
    }
}

/// Who holds the slots of a concurrency key, as
/// [`Inspect::concurrency`](crate::inspect::Inspect::concurrency) reports it.
///
/// ```
/// # fn f(slots: taskfence::throttle::KeySlots) {
/// println!("{} running, {} waiting", slots.running.len(), slots.waiting);
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySlots {
    /// The key.
    pub key: String,
    /// The tasks of the key holding a live lease: the slots in use.
    pub running: Vec<TaskId>,
    /// Tasks of the key that are pending (due or backing off).
    pub waiting: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absurd_limits_are_typed_errors() {
        let too_long = "k".repeat(MAX_NAME_LEN + 1);
        assert!(matches!(
            ConcurrencyKey::new(&too_long, 1).validate(),
            Err(InvalidInput::TooLong {
                field: "concurrency_key",
                ..
            })
        ));
        assert!(ConcurrencyKey::new("k", MAX_CONCURRENCY + 1).validate().is_err());
        assert!(RateBucket::new("k", 1, Duration::ZERO).validate().is_err());
        assert!(RateBucket::new("k", 1, MAX_PERIOD * 2).validate().is_err());
        assert!(RateBucket::per_second("k", MAX_RATE + 1).validate().is_err());
        assert!(
            RateBucket::per_second("k", MAX_RATE)
                .burst(MAX_BURST + 1)
                .validate()
                .is_err()
        );
        assert!(RateBucket::per_second("k\0", 1).validate().is_err());
    }

    #[test]
    fn the_interval_is_the_period_over_the_rate() {
        assert_eq!(
            RateBucket::per_second("k", 4).interval(),
            Duration::from_millis(250)
        );
        assert_eq!(
            RateBucket::per_second("k", 4).burst(3).tolerance(),
            Duration::from_millis(500)
        );
    }
}
