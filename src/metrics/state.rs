//! The state sampler: what the store holds, as gauges. The counters of
//! [`Observed`](super::Observed) say what happened; an operator also asks
//! how much is waiting, how old the oldest waiting task is, and how many lost
//! their queue message. [`StateSampler::sample`] reads that through
//! [`Inspect`] — counts by status (in the whole store and in each scope
//! named), the oldest pending task, the stranded tasks — and sets
//! [`TASKS`], [`OLDEST_PENDING_AGE_SECONDS`] and [`STRANDED_TASKS`].
//!
//! Run one sampler per deployment (every replica would read the same
//! figures); the dashboard and alert rules take the `max` across replicas,
//! so more than one does no harm but wasted reads.

use std::time::Duration;

use time::OffsetDateTime;

use super::{OLDEST_PENDING_AGE_SECONDS, STRANDED_TASKS, TASKS};
use crate::error::Result;
use crate::inspect::{Counts, Inspect, Order, TaskQuery};
use crate::limits;
use crate::task::Status;

/// Every status, as the `status` label reads.
const STATUSES: [Status; 5] = [
    Status::Pending,
    Status::Running,
    Status::Completed,
    Status::Failed,
    Status::Cancelled,
];

/// The `scope` label of the counts over every scope.
pub const ALL_SCOPES: &str = "*";

/// Reads the store's state through [`Inspect`] and sets the three state
/// gauges ([`TASKS`], [`OLDEST_PENDING_AGE_SECONDS`], [`STRANDED_TASKS`]).
/// Run one sampler per deployment (every replica would read the same
/// figures); the dashboard and alert rules take the `max` across replicas.
///
/// The `scope` label is bounded by what you name: counts over every scope
/// carry `scope="*"`, and each scope given to [`scopes`](Self::scopes) its
/// own (a few tenants or queues worth watching; never one per user).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
/// use std::time::Duration;
/// use taskfence::metrics::StateSampler;
///
/// let store = taskfence::MemoryStore::new();
/// let sampler = StateSampler::new().stranded_after(Duration::from_secs(600)).scopes(["tenant-7"]);
/// let state = sampler.sample(&store).await?; // sets the gauges
/// assert_eq!(state.stranded, 0);
/// // In a service: loop { sampler.sample(&store).await; interval.tick().await; }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct StateSampler {
    stranded_after: Duration,
    scopes: Vec<String>,
}

impl Default for StateSampler {
    fn default() -> Self {
        Self::new()
    }
}

/// What one [`StateSampler::sample`] read.
///
/// ```
/// # fn f(state: taskfence::metrics::State) {
/// println!("{} pending, {} stranded", state.counts.get(taskfence::Status::Pending), state.stranded);
/// # }
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct State {
    /// Tasks by status in the whole store.
    pub counts: Counts,
    /// Tasks by status in each scope named, in the order named.
    pub scopes: Vec<(String, Counts)>,
    /// How long ago the oldest pending task was submitted; `None` when none is pending.
    pub oldest_pending_age: Option<Duration>,
    /// Stranded tasks, at most [`limits::MAX_PAGE`] (a backlog that large is
    /// an incident whatever its exact size).
    pub stranded: usize,
}

impl StateSampler {
    /// A sampler counting stranded tasks older than 15 minutes, no scopes of its own.
    ///
    /// ```
    /// let _sampler = taskfence::metrics::StateSampler::new();
    /// ```
    pub fn new() -> Self {
        Self {
            stranded_after: Duration::from_secs(15 * 60),
            scopes: Vec::new(),
        }
    }

    /// How long a never-claimed task waits before it counts as stranded
    /// (see [`Inspect::stranded`]); keep it above your queue's normal delay.
    ///
    /// ```
    /// let _sampler = taskfence::metrics::StateSampler::new().stranded_after(std::time::Duration::from_secs(300));
    /// ```
    pub fn stranded_after(mut self, older_than: Duration) -> Self {
        self.stranded_after = older_than;
        self
    }

    /// Scopes whose counts get their own `scope` label.
    ///
    /// ```
    /// let _sampler = taskfence::metrics::StateSampler::new().scopes(["tenant-a", "tenant-b"]);
    /// ```
    pub fn scopes<I, S>(mut self, scopes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.scopes = scopes.into_iter().map(Into::into).collect();
        self
    }

    /// Reads the state and sets the gauges. Each figure comes from an
    /// indexed query: `counts` per status (and per scope named), the first
    /// pending task oldest first (`list`, limit 1), and one page of
    /// `stranded`. The age is measured on this process's clock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
    /// let state = taskfence::metrics::StateSampler::new().sample(&taskfence::MemoryStore::new()).await?;
    /// assert_eq!(state.oldest_pending_age, None);
    /// # Ok(()) }
    /// ```
    pub async fn sample(&self, store: &dyn Inspect) -> Result<State> {
        let counts = store.counts(None).await?;
        let mut scopes = Vec::with_capacity(self.scopes.len());
        for scope in &self.scopes {
            scopes.push((scope.clone(), store.counts(Some(scope)).await?));
        }
        let oldest = store
            .list(
                &TaskQuery::new()
                    .status(Status::Pending)
                    .order(Order::OldestFirst)
                    .limit(1),
            )
            .await?;
        let oldest_pending_age = oldest.tasks.first().map(|task| {
            let age = OffsetDateTime::now_utc() - task.created_at;
            Duration::try_from(age).unwrap_or_default()
        });
        let stranded = store.stranded(self.stranded_after, limits::MAX_PAGE).await?.len();

        for status in STATUSES {
            ::metrics::gauge!(TASKS, "status" => status.as_str(), "scope" => ALL_SCOPES)
                .set(counts.get(status) as f64);
            for (scope, counts) in &scopes {
                ::metrics::gauge!(TASKS, "status" => status.as_str(), "scope" => scope.clone())
                    .set(counts.get(status) as f64);
            }
        }
        ::metrics::gauge!(OLDEST_PENDING_AGE_SECONDS)
            .set(oldest_pending_age.map_or(0.0, |a| a.as_secs_f64()));
        ::metrics::gauge!(STRANDED_TASKS).set(stranded as f64);
        Ok(State {
            counts,
            scopes,
            oldest_pending_age,
            stranded,
        })
    }
}
