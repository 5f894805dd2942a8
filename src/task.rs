//! The task record and the values that identify it: ids, status, the saved
//! response, the input hash and the submission ([`NewTask`]).

use std::fmt;
use std::time::Duration;

use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use crate::error::InvalidInput;
use crate::limits;
use crate::policy::{AcceptanceRule, RetryPolicy};
use crate::throttle::{ConcurrencyKey, TaskLimits};
use crate::trace_context::TraceContext;

pub use crate::id::{AttemptId, TaskId};
pub use crate::response::Response;

/// Where a task is in its life.
///
/// `Pending` and `Running` are live; the other three are terminal and never change again.
///
/// ```
/// use taskfence::Status;
/// assert!(Status::Completed.is_terminal());
/// assert_eq!("running".parse::<Status>(), Ok(Status::Running));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// Waiting to be claimed, possibly not before a backoff instant.
    Pending,
    /// Claimed by an assignment whose lease may or may not have expired.
    Running,
    /// The response is saved. Terminal.
    Completed,
    /// Failed permanently, or the retry budget ran out. Terminal.
    Failed,
    /// Cancelled by the application. Terminal.
    Cancelled,
}

impl Status {
    /// `true` for `Completed`, `Failed` and `Cancelled`.
    pub const fn is_terminal(self) -> bool {
        matches!(self, Status::Completed | Status::Failed | Status::Cancelled)
    }

    /// The lowercase name used in storage and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Running => "running",
            Status::Completed => "completed",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Status {
    type Err = UnknownStatus;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "pending" => Status::Pending,
            "running" => Status::Running,
            "completed" => Status::Completed,
            "failed" => Status::Failed,
            "cancelled" => Status::Cancelled,
            _ => return Err(UnknownStatus(s.to_owned())),
        })
    }
}

/// A status name that is not one of [`Status`]'s.
///
/// ```
/// assert!("done".parse::<taskfence::Status>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown task status {0:?}")]
pub struct UnknownStatus(pub String);

/// A SHA-256 digest of the inputs that define the work, bound to the request
/// key at first use so a reused key with other inputs is caught.
///
/// Each part is length-prefixed before hashing, so the boundaries between
/// parts count: `("ab", "c")` and `("a", "bc")` differ.
///
/// ```
/// use taskfence::InputHash;
/// let a = InputHash::of(["conversation-7", "message-42"]);
/// assert_eq!(a, InputHash::of(["conversation-7", "message-42"]));
/// assert_ne!(InputHash::of(["ab", "c"]), InputHash::of(["a", "bc"]));
/// assert_eq!(a.to_string().len(), 64);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct InputHash([u8; 32]);

impl InputHash {
    /// Hashes the given parts, each prefixed by its length as a 64-bit big-endian integer.
    pub fn of<I, P>(parts: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: AsRef<[u8]>,
    {
        let mut hasher = Sha256::new();
        for part in parts {
            let part = part.as_ref();
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        Self(hasher.finalize().into())
    }

    /// Wraps a digest read back from storage.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The 32 digest bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for InputHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for InputHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "InputHash({self})")
    }
}

/// Identifies one press of Send: the caller's scope, the kind of work and the
/// client's idempotency key. Unique per store.
///
/// ```
/// use taskfence::RequestKey;
/// let key = RequestKey::new("user-1", "chat.reply", "req-9f2c");
/// assert_eq!(key.scope, "user-1");
/// ```
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RequestKey {
    /// Who the work belongs to: the authenticated caller, workspace or tenant.
    pub scope: String,
    /// What kind of work, e.g. `"chat.reply"`.
    pub operation: String,
    /// The client's idempotency key for this request.
    pub key: String,
}

impl RequestKey {
    /// Builds a request key from its three parts.
    pub fn new(scope: impl Into<String>, operation: impl Into<String>, key: impl Into<String>) -> Self {
        Self {
            scope: scope.into(),
            operation: operation.into(),
            key: key.into(),
        }
    }

    /// Checks each part against [`limits`]: not blank, not too long, no control characters.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        limits::check_text("scope", &self.scope, limits::MAX_SCOPE_LEN)?;
        limits::check_text("operation", &self.operation, limits::MAX_OPERATION_LEN)?;
        limits::check_text("key", &self.key, limits::MAX_KEY_LEN)
    }
}

/// A submission: the request key, the input hash it is bound to, the payload a
/// worker needs, the retry policy and how long the dedup record is kept.
///
/// ```
/// use std::time::Duration;
/// use taskfence::{InputHash, NewTask, RequestKey, RetryPolicy};
///
/// let task = NewTask::new(
///     RequestKey::new("user-1", "chat.reply", "req-9f2c"),
///     InputHash::of(["conversation-7", "message-42"]),
/// )
/// .payload(b"{\"message\":42}".to_vec())
/// .policy(RetryPolicy::default().max_attempts(3))
/// .retention(Duration::from_secs(24 * 3600));
/// assert!(task.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NewTask {
    /// Scope, operation and idempotency key.
    pub key: RequestKey,
    /// Digest of the inputs that define the work.
    pub input_hash: InputHash,
    /// What the worker needs to do the work (opaque to the store).
    pub payload: Vec<u8>,
    /// Retry budget and backoff, stored with the task.
    pub policy: RetryPolicy,
    /// How long the dedup record is kept, counted from submission.
    pub retention: Duration,
    /// Which attempts may save the response; stored with the task for its whole life.
    pub acceptance: AcceptanceRule,
    /// Whether the task goes out through the outbox: `PgStore` writes a
    /// handoff row with it (and with each reopening) for a dispatcher to
    /// publish to a broker. `false` for a task the store's own consumers
    /// take ([`claim_next`](crate::TaskStore::claim_next)): one row to write.
    /// Stores without an outbox ignore it.
    pub handoff: bool,
    /// The submitter's W3C trace context, stored with the task so the
    /// worker's span joins the request's trace (see [`crate::trace`]). With
    /// the feature `opentelemetry`, `None` means "the current span's".
    pub trace_context: Option<TraceContext>,
    /// The concurrency key and rate bucket the task's claims are subject to
    /// (see [`crate::throttle`]); none by default.
    pub limits: TaskLimits,
}

impl NewTask {
    /// Default retention of the dedup record: 7 days.
    pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

    /// A submission with an empty payload, the default policy and retention.
    pub fn new(key: RequestKey, input_hash: InputHash) -> Self {
        Self {
            key,
            input_hash,
            payload: Vec::new(),
            policy: RetryPolicy::default(),
            retention: Self::DEFAULT_RETENTION,
            acceptance: AcceptanceRule::default(),
            handoff: true,
            trace_context: None,
            limits: TaskLimits::default(),
        }
    }

    /// Counts the task against a concurrency key: at most the key's limit
    /// of its tasks run at once, across every worker; with limit 1 they run
    /// one at a time in submission order (see [`ConcurrencyKey`]).
    ///
    /// ```
    /// use taskfence::throttle::ConcurrencyKey;
    /// use taskfence::{InputHash, NewTask, RequestKey};
    /// let new = NewTask::new(RequestKey::new("u", "chat.reply", "m-1"), InputHash::of(["m-1"]))
    ///     .concurrency(ConcurrencyKey::new("conversation-7", 1));
    /// assert_eq!(new.limits.concurrency.unwrap().name(), "conversation-7");
    /// ```
    pub fn concurrency(mut self, key: ConcurrencyKey) -> Self {
        self.limits.concurrency = Some(key);
        self
    }

    /// Runs the task in order with the other tasks naming `key`: one at a
    /// time, in submission order, across every worker (a concurrency key of
    /// limit 1, see [`ConcurrencyKey`]: a task that fails and will retry
    /// keeps its place, and the next one waits through its backoff).
    ///
    /// ```
    /// use taskfence::{InputHash, NewTask, RequestKey};
    /// let new = NewTask::new(RequestKey::new("u", "chat.reply", "m-2"), InputHash::of(["m-2"]))
    ///     .in_order("alice/conversation-7");
    /// let key = new.limits.concurrency.unwrap();
    /// assert_eq!((key.name(), key.limit()), ("alice/conversation-7", 1));
    /// ```
    pub fn in_order(self, key: impl Into<String>) -> Self {
        self.concurrency(ConcurrencyKey::new(key, 1))
    }

    /// Takes a token from the named rate bucket on every claim (see
    /// [`RateBucket`](crate::throttle::RateBucket)); the bucket must be
    /// defined in the store before the task is submitted.
    ///
    /// ```
    /// use taskfence::{InputHash, NewTask, RequestKey};
    /// let new = NewTask::new(RequestKey::new("u", "chat.reply", "m-1"), InputHash::of(["m-1"]))
    ///     .rate_bucket("openai-key-1");
    /// assert_eq!(new.limits.bucket.as_deref(), Some("openai-key-1"));
    /// ```
    pub fn rate_bucket(mut self, bucket: impl Into<String>) -> Self {
        self.limits.bucket = Some(bucket.into());
        self
    }

    /// Stores `cx` with the task: the trace its worker's `process` span joins.
    /// (With the feature `opentelemetry` the current span's context is
    /// stored without this.)
    ///
    /// ```
    /// use taskfence::{InputHash, NewTask, RequestKey, trace::TraceContext};
    /// let cx = TraceContext::new("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "")?;
    /// let new = NewTask::new(RequestKey::new("u", "op", "k"), InputHash::of(["x"])).trace_context(cx.clone());
    /// assert_eq!(new.trace_context, Some(cx));
    /// # Ok::<(), taskfence::error::InvalidInput>(())
    /// ```
    pub fn trace_context(mut self, cx: TraceContext) -> Self {
        self.trace_context = Some(cx);
        self
    }

    /// Sets the payload.
    pub fn payload(mut self, payload: impl Into<Vec<u8>>) -> Self {
        self.payload = payload.into();
        self
    }

    /// Sets the retry policy.
    pub fn policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Sets the retention window of the dedup record.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// No handoff row: the task is for the store's own consumers
    /// ([`claim_next`](crate::TaskStore::claim_next)), not for a broker, so
    /// submitting it writes the task row alone. Tasks with and without a
    /// handoff share one store; a consumer can take both.
    ///
    /// ```
    /// use taskfence::{InputHash, NewTask, RequestKey};
    /// let new = NewTask::new(RequestKey::new("u", "op", "k"), InputHash::of(["x"])).without_handoff();
    /// assert!(!new.handoff);
    /// ```
    pub fn without_handoff(mut self) -> Self {
        self.handoff = false;
        self
    }

    /// Sets the acceptance rule. A repeated submission of the same key returns
    /// the existing task with the rule it was created with.
    pub fn acceptance(mut self, rule: AcceptanceRule) -> Self {
        self.acceptance = rule;
        self
    }

    /// Checks every field against [`limits`]. Stores call this before writing anything.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        self.key.validate()?;
        limits::check_len("payload", self.payload.len(), limits::MAX_PAYLOAD_LEN)?;
        limits::check_duration("retention", self.retention, limits::MAX_RETENTION)?;
        self.limits.validate()?;
        self.policy.validate()
    }
}

/// The task record as the store holds it.
///
/// Fields are public so third-party backends can build it; treat it as a
/// snapshot: the store is the source of truth.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), taskfence::Error> {
/// use taskfence::{InputHash, MemoryStore, NewTask, RequestKey, Status, TaskStore};
/// let store = MemoryStore::new();
/// let task = store
///     .submit(NewTask::new(RequestKey::new("u", "op", "k"), InputHash::of(["x"])))
///     .await?
///     .into_task();
/// assert_eq!(task.status, Status::Pending);
/// assert_eq!(task.attempts(), 0);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Task {
    /// Stable identity.
    pub id: TaskId,
    /// Scope, operation and idempotency key it was submitted under.
    pub key: RequestKey,
    /// Digest of the inputs the key is bound to.
    pub input_hash: InputHash,
    /// Opaque work description.
    pub payload: Vec<u8>,
    /// Where the task is in its life.
    pub status: Status,
    /// The fencing token: incremented atomically by every claim, so this is
    /// also the number of claims made (those given back unstarted included:
    /// the budget does not count them, see [`budget_base`](Self::budget_base)).
    pub version: u64,
    /// Retry budget and backoff.
    pub policy: RetryPolicy,
    /// The assignment version at which the current retry budget began: 0, or
    /// the version when an operator last [reopened](crate::TaskStore::reopen)
    /// the task; plus one for each claim since given back before its work
    /// began ([`release_unstarted`](crate::TaskStore::release_unstarted)).
    /// `version - budget_base` attempts count against the policy; the
    /// version itself never goes back, so an old lease can never save.
    pub budget_base: u64,
    /// When the current retry budget began: `created_at`, or the instant of
    /// the last [reopening](crate::TaskStore::reopen). The policy's deadline counts from here.
    #[cfg_attr(feature = "serde", serde(with = "time::serde::rfc3339"))]
    pub budget_started_at: OffsetDateTime,
    /// Which attempts may save the response (chosen at submission, never changed).
    pub acceptance: AcceptanceRule,
    /// Lease expiry of the current assignment (set while `Running`).
    #[cfg_attr(feature = "serde", serde(with = "time::serde::rfc3339::option"))]
    pub lease_until: Option<OffsetDateTime>,
    /// Earliest instant of the next claim (only while `Pending`): the end of
    /// a retry's backoff, or the instant a release or a reopening made the
    /// task due again. `None` for a task never claimed: due since `created_at`.
    #[cfg_attr(feature = "serde", serde(with = "time::serde::rfc3339::option"))]
    pub not_before: Option<OffsetDateTime>,
    /// The saved response, once `Completed`.
    pub response: Option<Response>,
    /// The last failure message (or cancellation reason).
    pub last_error: Option<String>,
    /// When the task was submitted (store clock).
    #[cfg_attr(feature = "serde", serde(with = "time::serde::rfc3339"))]
    pub created_at: OffsetDateTime,
    /// When it became terminal, if it has.
    #[cfg_attr(feature = "serde", serde(with = "time::serde::rfc3339::option"))]
    pub finished_at: Option<OffsetDateTime>,
    /// After this instant the dedup record may be purged and a replay is new work.
    #[cfg_attr(feature = "serde", serde(with = "time::serde::rfc3339"))]
    pub expires_at: OffsetDateTime,
    /// The concurrency key and rate bucket its claims are subject to (see [`crate::throttle`]).
    #[cfg_attr(feature = "serde", serde(default))]
    pub limits: TaskLimits,
    /// The submitter's trace context, if it was in one (see [`crate::trace`]).
    #[cfg_attr(feature = "serde", serde(default))]
    pub trace_context: Option<TraceContext>,
}

impl Task {
    /// A task as `new` is stored: pending, never claimed, its retry budget
    /// starting at `created_at`, kept until `expires_at`. Every backend
    /// submits through this, so they agree on what a new task is.
    pub(crate) fn submitted(
        id: TaskId,
        new: NewTask,
        created_at: OffsetDateTime,
        expires_at: OffsetDateTime,
    ) -> Self {
        Self {
            id,
            key: new.key,
            input_hash: new.input_hash,
            payload: new.payload,
            status: Status::Pending,
            version: 0,
            policy: new.policy,
            budget_base: 0,
            budget_started_at: created_at,
            acceptance: new.acceptance,
            lease_until: None,
            not_before: None,
            response: None,
            last_error: None,
            created_at,
            finished_at: None,
            expires_at,
            trace_context: new.trace_context,
            limits: new.limits,
        }
    }

    /// This task as a completion with `response` at `finished_at` leaves it
    /// (the fields every backend's completion writes).
    #[cfg(feature = "postgres")]
    pub(crate) fn completed(mut self, response: Response, finished_at: OffsetDateTime) -> Self {
        self.status = Status::Completed;
        self.response = Some(response);
        self.lease_until = None;
        self.not_before = None;
        self.finished_at = Some(finished_at);
        self
    }

    /// Claims made so far (a takeover too, and claims given back unstarted,
    /// which the budget does not count: see
    /// [`attempts_in_budget`](Self::attempts_in_budget)). Equal to the
    /// assignment version.
    pub fn attempts(&self) -> u32 {
        budget::attempts(self.version)
    }

    /// Attempts made in the current retry budget: every claim since the
    /// budget began (all of them, unless an operator
    /// [reopened](crate::TaskStore::reopen) the task with a fresh budget),
    /// less those given back before their work began.
    pub fn attempts_in_budget(&self) -> u32 {
        budget::attempts_in_budget(self.version, self.budget_base)
    }

    /// Attempts still allowed by the policy's `max_attempts` in the current budget.
    pub fn attempts_left(&self) -> u32 {
        budget::attempts_left(&self.policy, self.version, self.budget_base)
    }

    /// The elapsed-time deadline, if the policy has one: `budget_started_at + deadline`
    /// (`created_at + deadline` until the task is reopened).
    pub fn deadline_at(&self) -> Option<OffsetDateTime> {
        budget::deadline_at(&self.policy, self.budget_started_at)
    }
}

/// The retry budget's arithmetic, shared by [`Task`] and
/// [`TaskSummary`](crate::inspect::TaskSummary), which carry the same fields.
pub(crate) mod budget {
    use time::OffsetDateTime;

    use crate::policy::RetryPolicy;

    /// Attempts made: the assignment version.
    pub(crate) fn attempts(version: u64) -> u32 {
        u32::try_from(version).unwrap_or(u32::MAX)
    }

    /// Attempts made since the budget began at `budget_base`.
    pub(crate) fn attempts_in_budget(version: u64, budget_base: u64) -> u32 {
        attempts(version.saturating_sub(budget_base))
    }

    /// Attempts the policy still allows in the current budget.
    pub(crate) fn attempts_left(policy: &RetryPolicy, version: u64, budget_base: u64) -> u32 {
        policy
            .max_attempts
            .saturating_sub(attempts_in_budget(version, budget_base))
    }

    /// The policy's deadline, counted from when the budget began.
    pub(crate) fn deadline_at(
        policy: &RetryPolicy,
        budget_started_at: OffsetDateTime,
    ) -> Option<OffsetDateTime> {
        policy.deadline.map(|d| budget_started_at + d)
    }
}
