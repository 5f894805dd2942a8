//! [`Inspect`]: what an operator asks a store at 3 a.m. — which tasks are in
//! which state, what happened to this one, what is stuck.
//!
//! Reading only, and kept apart from [`TaskStore`] so the hot path's trait
//! stays small; every backend of this crate implements both, and the
//! [inspection suite](crate::testing::inspection_suite) checks they answer alike.
//! The `taskfence` command-line tool is built on it.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
//! use taskfence::inspect::{Inspect, TaskQuery};
//! use taskfence::*;
//!
//! let store = MemoryStore::new();
//! for k in ["a", "b", "c"] {
//!     store.submit(NewTask::new(RequestKey::new("u", "op", k), InputHash::of([k]))).await?;
//! }
//! // Newest first, two per page, following the cursor.
//! let first = store.list(&TaskQuery::new().status(Status::Pending).limit(2)).await?;
//! assert_eq!(first.tasks.len(), 2);
//! let rest = store.list(&TaskQuery::new().status(Status::Pending).limit(2).after(first.next.unwrap())).await?;
//! assert_eq!((rest.tasks.len(), rest.next), (1, None));
//! assert_eq!(store.counts(None).await?.pending, 3);
//! # Ok(()) }
//! ```

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use time::OffsetDateTime;

use crate::effect::Effect;
use crate::error::InvalidInput;
use crate::error::Result;
use crate::limits;
use crate::store::{Attempt, Reopening, TaskStore};
use crate::task::{RequestKey, Status, Task, TaskId};
use crate::throttle::{BucketState, KeySlots};

mod capped;
mod depth;
mod summary;

pub(crate) use capped::STATUSES;
pub use capped::{CappedCounts, Count};
pub use depth::QueueDepth;
pub use summary::TaskSummary;

/// Read-only queries over a store's tasks, for operators and their tools.
///
/// Pages follow task ids, which are UUID v7: id order is submission order
/// (to the millisecond of the submitter's clock), and a [`Cursor`] continues
/// a listing exactly where it stopped, however many tasks arrive meanwhile
/// (keyset pagination; no offsets, so page *n* costs what page 1 costs).
///
/// ```
/// # async fn f(store: &dyn taskfence::inspect::Inspect) -> taskfence::Result<()> {
/// use taskfence::inspect::TaskQuery;
/// let failed = store.list(&TaskQuery::new().status(taskfence::Status::Failed).scope("tenant-7")).await?;
/// for task in &failed.tasks {
///     println!("{} {}/{} {:?}", task.id, task.key.operation, task.key.key, task.last_error);
/// }
/// # Ok(()) }
/// ```
#[async_trait]
pub trait Inspect: TaskStore {
    /// One page of tasks matching `query`, in its order, as summaries
    /// (no payloads, no responses: a page costs the same whatever they carry).
    async fn list(&self, query: &TaskQuery) -> Result<Page>;

    /// How many tasks are in each status, in one scope or in all: exact, so
    /// it reads every matching index entry and its cost grows with the
    /// table. Dashboards and anything an untrusted caller can trigger use
    /// [`counts_up_to`](Self::counts_up_to).
    async fn counts(&self, scope: Option<&str>) -> Result<Counts>;

    /// How many tasks are in each status, in one scope or in all, each
    /// counted up to `cap` (1 to [`limits::MAX_COUNT_CAP`]): a status with
    /// `cap` tasks or more is [`Count::AtLeast`]. The cost is bounded by the
    /// cap, not the table. DynamoDB counting one scope reads at most `cap`
    /// entries of each status and says [`Count::AtLeast`] what it matched
    /// when it stopped there.
    async fn counts_up_to(&self, scope: Option<&str>, cap: u64) -> Result<CappedCounts>;

    /// The task with everything that happened to it: its attempts, its
    /// reopenings and its handoffs (published or not), oldest first.
    /// `None` for an unknown id.
    async fn story(&self, id: TaskId) -> Result<Option<Story>>;

    /// Up to `limit` stranded tasks, oldest submitted first: pending, never
    /// claimed, and handed off longer than `older_than` ago — submitted and
    /// last reopened before then (see [`rules::stranded`](crate::backend::rules::stranded)),
    /// and on a store with an outbox (PostgreSQL) no handoff published since.
    /// Their queue message was most likely lost (a dead-letter queue, expired
    /// retention, a purged queue): publish their ids again.
    ///
    /// Every task that needs a worker and has none is found by one of two
    /// paths: never claimed, by this one (and [`claim_next`](TaskStore::claim_next));
    /// claimed before — released, backing off, its lease expired, reopened —
    /// by [`due`](TaskStore::due) (and `claim_next`). A task reopened before
    /// its first claim is on both. `older_than` must be positive; `limit` at
    /// most [`limits::MAX_PAGE`].
    async fn stranded(&self, older_than: Duration, limit: usize) -> Result<Vec<TaskSummary>>;

    /// Every rate bucket defined in the store, by name, with its schedule
    /// (how full it is: [`BucketState::available`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
    /// use taskfence::inspect::Inspect;
    /// use taskfence::throttle::RateBucket;
    /// use taskfence::*;
    /// let store = MemoryStore::new();
    /// store.define_bucket(RateBucket::per_second("search-api", 5).burst(5)).await?;
    /// let buckets = store.buckets().await?;
    /// assert_eq!(buckets[0].available(time::OffsetDateTime::now_utc()), 5);
    /// # Ok(()) }
    /// ```
    async fn buckets(&self) -> Result<Vec<BucketState>>;

    /// Who holds the slots of concurrency key `key`: its tasks with a live
    /// lease, and how many of its tasks wait. A key no task names has no
    /// slots in use and none waiting.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
    /// use taskfence::inspect::Inspect;
    /// use taskfence::*;
    /// let slots = MemoryStore::new().concurrency("tenant-acme").await?;
    /// assert!(slots.running.is_empty());
    /// # Ok(()) }
    /// ```
    async fn concurrency(&self, key: &str) -> Result<KeySlots>;

    /// Each operation's queue ([`QueueDepth`]): its tasks due for a worker
    /// (and since when the oldest is), those backing off, those running —
    /// on the store's clock. Read from the pending and running tasks alone,
    /// so its cost grows with the backlog, never with the finished tasks kept
    /// for their retention window: cheap enough to poll for an autoscaler or
    /// a gauge. PostgreSQL and SQLite answer from one statement (one
    /// snapshot); DynamoDB pages through its status index, so a task that
    /// changes status meanwhile may be counted in both or neither.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
    /// use taskfence::inspect::Inspect;
    /// use taskfence::*;
    /// let store = MemoryStore::new();
    /// for key in ["a", "b"] {
    ///     store.submit(NewTask::new(RequestKey::new("u", "resize", key), InputHash::of([key]))).await?;
    /// }
    /// let queue = &store.depth().await?[0];
    /// assert_eq!((queue.operation.as_str(), queue.due), ("resize", 2));
    /// # Ok(()) }
    /// ```
    async fn depth(&self) -> Result<Vec<QueueDepth>>;
}

/// Which way a listing runs.
///
/// ```
/// assert_eq!(taskfence::inspect::Order::default(), taskfence::inspect::Order::NewestFirst);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Order {
    /// Most recently submitted first.
    #[default]
    NewestFirst,
    /// Earliest submitted first.
    OldestFirst,
}

/// Which tasks [`Inspect::list`] returns: filters (all optional, combined
/// with *and*), the order, the page size and where to continue.
///
/// ```
/// use std::time::Duration;
/// use taskfence::inspect::{Order, TaskQuery};
/// use taskfence::Status;
/// let hour_ago = time::OffsetDateTime::now_utc() - Duration::from_secs(3600);
/// let query = TaskQuery::new()
///     .status(Status::Running)
///     .scope("tenant-7")
///     .operation("chat.reply")
///     .created_before(hour_ago)
///     .order(Order::OldestFirst)
///     .limit(100);
/// assert!(query.validate().is_ok());
/// assert!(TaskQuery::new().limit(0).validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TaskQuery {
    /// Only tasks in this status.
    pub status: Option<Status>,
    /// Only tasks of this scope.
    pub scope: Option<String>,
    /// Only tasks of this operation.
    pub operation: Option<String>,
    /// Only tasks submitted at or after this instant (store clock).
    pub created_after: Option<OffsetDateTime>,
    /// Only tasks submitted before this instant (store clock).
    pub created_before: Option<OffsetDateTime>,
    /// Newest or oldest first.
    pub order: Order,
    /// Page size, 1 to [`limits::MAX_PAGE`] (default 50).
    pub limit: usize,
    /// Continue after this task (the previous page's [`Page::next`]).
    pub after: Option<Cursor>,
}

impl Default for TaskQuery {
    fn default() -> Self {
        Self {
            status: None,
            scope: None,
            operation: None,
            created_after: None,
            created_before: None,
            order: Order::NewestFirst,
            limit: 50,
            after: None,
        }
    }
}

impl TaskQuery {
    /// Every task, newest first, 50 per page.
    pub fn new() -> Self {
        Self::default()
    }
    /// Only tasks in `status`.
    pub fn status(mut self, status: Status) -> Self {
        self.status = Some(status);
        self
    }
    /// Only tasks of `scope`.
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = Some(scope.into());
        self
    }
    /// Only tasks of `operation`.
    pub fn operation(mut self, operation: impl Into<String>) -> Self {
        self.operation = Some(operation.into());
        self
    }
    /// Only tasks submitted at or after `at`.
    pub fn created_after(mut self, at: OffsetDateTime) -> Self {
        self.created_after = Some(at);
        self
    }
    /// Only tasks submitted before `at`.
    pub fn created_before(mut self, at: OffsetDateTime) -> Self {
        self.created_before = Some(at);
        self
    }
    /// Sets the order.
    pub fn order(mut self, order: Order) -> Self {
        self.order = order;
        self
    }
    /// Sets the page size.
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }
    /// Continues after `cursor`.
    pub fn after(mut self, cursor: Cursor) -> Self {
        self.after = Some(cursor);
        self
    }

    /// Checks the page size and the filters' text against [`limits`].
    pub fn validate(&self) -> std::result::Result<(), InvalidInput> {
        limits::check_page(self.limit)?;
        if let Some(scope) = &self.scope {
            limits::check_text("scope", scope, limits::MAX_SCOPE_LEN)?;
        }
        if let Some(operation) = &self.operation {
            limits::check_text("operation", operation, limits::MAX_OPERATION_LEN)?;
        }
        Ok(())
    }

    /// Whether `task` passes the filters (the cursor and order aside): the
    /// meaning of each filter, for backends that filter in memory.
    pub fn matches(&self, task: &Task) -> bool {
        self.passes(task.status, &task.key, task.created_at)
    }

    /// [`matches`](Self::matches) for a listing's row.
    ///
    /// ```
    /// # fn f(row: &taskfence::inspect::TaskSummary) {
    /// assert!(taskfence::inspect::TaskQuery::new().matches_summary(row));
    /// # }
    /// ```
    pub fn matches_summary(&self, task: &TaskSummary) -> bool {
        self.passes(task.status, &task.key, task.created_at)
    }

    fn passes(&self, status: Status, key: &RequestKey, created_at: OffsetDateTime) -> bool {
        self.status.is_none_or(|s| status == s)
            && self.scope.as_ref().is_none_or(|s| key.scope == *s)
            && self.operation.as_ref().is_none_or(|o| key.operation == *o)
            && self.created_after.is_none_or(|at| created_at >= at)
            && self.created_before.is_none_or(|at| created_at < at)
    }

    /// Whether `id` lies beyond the cursor in this query's order.
    pub fn is_after_cursor(&self, id: TaskId) -> bool {
        match (self.after, self.order) {
            (None, _) => true,
            (Some(Cursor(c)), Order::NewestFirst) => id < c,
            (Some(Cursor(c)), Order::OldestFirst) => id > c,
        }
    }
}

/// Where a listing stopped: the last task of a page. Opaque to callers; it
/// prints and parses as text so a tool can hand it back (`--after`).
///
/// ```
/// use taskfence::inspect::Cursor;
/// let cursor = Cursor::from(taskfence::TaskId::new());
/// let text = cursor.to_string();
/// assert_eq!(text.parse::<Cursor>().unwrap(), cursor);
/// assert!("not-a-cursor".parse::<Cursor>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cursor(TaskId);

impl Cursor {
    /// The task the page ended with.
    pub fn task_id(self) -> TaskId {
        self.0
    }
}

impl From<TaskId> for Cursor {
    fn from(id: TaskId) -> Self {
        Self(id)
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for Cursor {
    type Err = <TaskId as FromStr>::Err;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        s.parse().map(Self)
    }
}

/// One page of [`Inspect::list`].
///
/// ```
/// # async fn f(store: &dyn taskfence::inspect::Inspect) -> taskfence::Result<()> {
/// use taskfence::inspect::TaskQuery;
/// let mut query = TaskQuery::new().limit(500);
/// loop {
///     let page = store.list(&query).await?;
///     for task in &page.tasks { /* … */ }
///     match page.next {
///         Some(next) => query = query.after(next),
///         None => break,
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Page {
    /// The tasks, in the query's order, without payloads or responses.
    pub tasks: Vec<TaskSummary>,
    /// Where the next page starts; `Some` exactly when more tasks match.
    pub next: Option<Cursor>,
}

impl Page {
    /// A page of `tasks`, continuing at `next` (a backend's answer).
    ///
    /// ```
    /// let page = taskfence::inspect::Page::new(Vec::new(), None);
    /// assert!(page.tasks.is_empty());
    /// ```
    pub fn new(tasks: Vec<TaskSummary>, next: Option<Cursor>) -> Self {
        Self { tasks, next }
    }

    /// Builds a page from up to `limit + 1` matching tasks in order: the
    /// extra one, if present, only says that there is a next page.
    pub fn from_overfetch(mut tasks: Vec<TaskSummary>, limit: usize) -> Self {
        let next = (tasks.len() > limit).then(|| {
            tasks.truncate(limit);
            Cursor(tasks[limit - 1].id)
        });
        Self { tasks, next }
    }
}

/// Tasks per status.
///
/// ```
/// use taskfence::{inspect::Counts, Status};
/// let mut counts = Counts::default();
/// counts.add(Status::Failed, 2);
/// assert_eq!((counts.get(Status::Failed), counts.total()), (2, 2));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Counts {
    /// Waiting for a claim (new, released, backing off or reopened).
    pub pending: u64,
    /// Held by a worker (or its lease expired and nobody took over yet).
    pub running: u64,
    /// Saved a response.
    pub completed: u64,
    /// Failed terminally.
    pub failed: u64,
    /// Cancelled.
    pub cancelled: u64,
}

impl Counts {
    /// The count of one status.
    pub fn get(&self, status: Status) -> u64 {
        match status {
            Status::Pending => self.pending,
            Status::Running => self.running,
            Status::Completed => self.completed,
            Status::Failed => self.failed,
            Status::Cancelled => self.cancelled,
        }
    }

    /// Adds `n` tasks of `status`.
    pub fn add(&mut self, status: Status, n: u64) {
        *match status {
            Status::Pending => &mut self.pending,
            Status::Running => &mut self.running,
            Status::Completed => &mut self.completed,
            Status::Failed => &mut self.failed,
            Status::Cancelled => &mut self.cancelled,
        } += n;
    }

    /// All tasks.
    pub fn total(&self) -> u64 {
        self.pending + self.running + self.completed + self.failed + self.cancelled
    }
}

/// One handoff (outbox record) of a task: written with the task (or by a
/// redispatch), then published to the queue by the dispatcher.
///
/// ```
/// # fn f(h: taskfence::inspect::Handoff) {
/// let lost_candidate = h.published_at.is_some();
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Handoff {
    /// When it was written (store clock).
    #[cfg_attr(feature = "serde", serde(with = "time::serde::rfc3339"))]
    pub created_at: OffsetDateTime,
    /// When the dispatcher published it, if it has.
    #[cfg_attr(feature = "serde", serde(with = "time::serde::rfc3339::option"))]
    pub published_at: Option<OffsetDateTime>,
}

impl Handoff {
    /// A handoff written at `created_at`, published at `published_at` (a backend's record).
    ///
    /// ```
    /// let h = taskfence::inspect::Handoff::new(time::OffsetDateTime::now_utc(), None);
    /// assert!(h.published_at.is_none());
    /// ```
    pub fn new(created_at: OffsetDateTime, published_at: Option<OffsetDateTime>) -> Self {
        Self {
            created_at,
            published_at,
        }
    }
}

/// Everything a store knows about one task ([`Inspect::story`]).
///
/// ```
/// # fn f(story: taskfence::inspect::Story) {
/// for attempt in &story.attempts {
///     println!("#{} {} {:?}", attempt.number, attempt.worker, attempt.outcome);
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Story {
    /// The task as it stands.
    pub task: Task,
    /// Every attempt, oldest first.
    pub attempts: Vec<Attempt>,
    /// Every reopening by [`reopen`](TaskStore::reopen), oldest first.
    pub reopenings: Vec<Reopening>,
    /// Its handoffs, oldest first: empty on a store without an outbox
    /// ([`MemoryStore`](crate::MemoryStore)) and for a task submitted
    /// [`without_handoff`](crate::NewTask::without_handoff).
    pub handoffs: Vec<Handoff>,
    /// Its [effect journal](crate::effect), by effect name.
    pub effects: Vec<Effect>,
}

impl Story {
    /// The story of `task` (a backend's answer): its attempts, reopenings and
    /// handoffs, each oldest first, and no effects (add them with
    /// [`with_effects`](Self::with_effects)).
    ///
    /// ```
    /// # fn f(task: taskfence::Task) {
    /// let story = taskfence::inspect::Story::new(task, Vec::new(), Vec::new(), Vec::new());
    /// # }
    /// ```
    pub fn new(
        task: Task,
        attempts: Vec<Attempt>,
        reopenings: Vec<Reopening>,
        handoffs: Vec<Handoff>,
    ) -> Self {
        Self {
            task,
            attempts,
            reopenings,
            handoffs,
            effects: Vec::new(),
        }
    }

    /// The story with the task's effect journal, by name.
    ///
    /// ```
    /// # fn f(task: taskfence::Task) {
    /// let story = taskfence::inspect::Story::new(task, Vec::new(), Vec::new(), Vec::new()).with_effects(Vec::new());
    /// assert!(story.effects.is_empty());
    /// # }
    /// ```
    pub fn with_effects(mut self, effects: Vec<Effect>) -> Self {
        self.effects = effects;
        self
    }
}
