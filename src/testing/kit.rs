//! The helpers every backend's tests need, the scenarios' own included: a
//! new task, a claim that must acquire, a failure that must be accepted, a
//! race with one winner, one runtime for synchronous test bodies.

use std::fmt::Debug;
use std::time::Duration;

use crate::policy::Failure;
use crate::store::{Claim, ClaimRequest, Fenced, Lease, Retry, TaskStore};
use crate::task::{InputHash, NewTask, RequestKey, Task, TaskId};

/// The lease the helpers claim with.
///
/// ```
/// assert_eq!(taskfence::testing::LEASE, std::time::Duration::from_secs(30));
/// ```
pub const LEASE: Duration = Duration::from_secs(30);

/// The scope of [`new_task`]'s keys.
///
/// ```
/// assert_eq!(taskfence::testing::new_task("k").key.scope, taskfence::testing::SCOPE);
/// ```
pub const SCOPE: &str = "scope-a";
/// The operation of [`new_task`]'s keys.
///
/// ```
/// assert_eq!(taskfence::testing::new_task("k").key.operation, taskfence::testing::OPERATION);
/// ```
pub const OPERATION: &str = "chat.reply";

/// The request key `key` under [`SCOPE`] / [`OPERATION`].
///
/// ```
/// assert_eq!(taskfence::testing::key("k").scope, "scope-a");
/// ```
pub fn key(key: &str) -> RequestKey {
    RequestKey::new(SCOPE, OPERATION, key)
}

/// A submission under [`key`]`(key)`, its inputs bound to the key (so two
/// keys never conflict) and a payload naming it.
///
/// ```
/// let new = taskfence::testing::new_task("send-1");
/// assert_eq!(new.key.key, "send-1");
/// ```
pub fn new_task(key: &str) -> NewTask {
    NewTask::new(self::key(key), InputHash::of(["conversation-1", key])).payload(format!("payload of {key}"))
}

/// A claim by `worker` for [`LEASE`].
///
/// ```
/// assert_eq!(taskfence::testing::request("w").lease, taskfence::testing::LEASE);
/// ```
pub fn request(worker: &str) -> ClaimRequest {
    ClaimRequest::new(worker, LEASE)
}

/// Claims `id` for `worker` (a [`LEASE`] long); panics unless it was acquired.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
/// use taskfence::TaskStore;
/// use taskfence::testing::{acquire, new_task};
/// let store = taskfence::MemoryStore::new();
/// let task = store.submit(new_task("k")).await?.into_task();
/// assert_eq!(acquire(&store, task.id, "w").await.version(), 1);
/// # Ok(()) }
/// ```
pub async fn acquire<S: TaskStore + ?Sized>(store: &S, id: TaskId, worker: &str) -> Lease {
    match store.claim(id, request(worker)).await {
        Ok(Claim::Acquired(lease)) => lease,
        other => panic!("{worker} expected to acquire {id}, got {other:?}"),
    }
}

/// Reports `failure` for `lease`; panics unless the store accepted it, and
/// returns what it decided (a retry, or the budget's end).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
/// use taskfence::{Failure, Retry, TaskStore};
/// use taskfence::testing::{acquire, fail_accepted, new_task};
/// let store = taskfence::MemoryStore::new();
/// let task = store.submit(new_task("k")).await?.into_task();
/// let lease = acquire(&store, task.id, "w").await;
/// assert!(matches!(fail_accepted(&store, lease, Failure::retryable("429")).await, Retry::Scheduled { .. }));
/// # Ok(()) }
/// ```
pub async fn fail_accepted<S: TaskStore + ?Sized>(store: &S, lease: Lease, failure: Failure) -> Retry {
    let task = lease.task_id();
    match store.fail(lease, failure).await {
        Ok(Fenced::Accepted(retry)) => retry,
        other => panic!("the failure of {task} was not accepted: {other:?}"),
    }
}

/// Whether one racer's answer won the race.
///
/// ```
/// use taskfence::testing::Won;
/// assert!(!taskfence::Claim::NotFound.won());
/// ```
pub trait Won {
    /// `true` for the answer only one racer may get.
    fn won(&self) -> bool;
}

impl Won for Claim {
    fn won(&self) -> bool {
        self.is_acquired()
    }
}

impl<T> Won for Fenced<T> {
    fn won(&self) -> bool {
        self.is_accepted()
    }
}

impl<T: Won, E> Won for Result<T, E> {
    fn won(&self) -> bool {
        self.as_ref().is_ok_and(Won::won)
    }
}

impl<T: Won, U> Won for (U, T) {
    fn won(&self) -> bool {
        self.1.won()
    }
}

/// Asserts that exactly one of a race's answers won (an acquired claim, an
/// accepted write) and returns its position; the panic names `what` and
/// shows every answer.
///
/// ```
/// # #[tokio::main(flavor = "multi_thread", worker_threads = 2)] async fn main() -> taskfence::Result<()> {
/// use std::sync::Arc;
/// use taskfence::TaskStore;
/// use taskfence::testing::{new_task, one_winner, race, request};
/// let store = Arc::new(taskfence::MemoryStore::new());
/// let task = store.submit(new_task("k")).await?.into_task();
/// let claims = race(8, |i| {
///     let store = store.clone();
///     async move { store.claim(task.id, request(&format!("w{i}"))).await.unwrap() }
/// })
/// .await;
/// let winner = one_winner(&claims, "claims of one task");
/// # Ok(()) }
/// ```
pub fn one_winner<T: Won + Debug>(answers: &[T], what: &str) -> usize {
    let winners: Vec<usize> = (0..answers.len()).filter(|&i| answers[i].won()).collect();
    assert_eq!(winners.len(), 1, "{what}: exactly one must win, got {answers:#?}");
    winners[0]
}

/// A lease the store never granted: `granted`'s attempt, worker and expiry
/// claiming `task` as its assignment (another version, another task). A
/// test hands it to a store to see it refused; a store never builds one.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
/// use taskfence::{Rejection, Response, TaskStore};
/// use taskfence::testing::{acquire, forged_lease, new_task};
/// let store = taskfence::MemoryStore::new();
/// let task = store.submit(new_task("k")).await?.into_task();
/// let granted = acquire(&store, task.id, "w").await;
/// let mut never_granted = granted.task().clone();
/// never_granted.version = 7;
/// let forged = forged_lease(never_granted, &granted);
/// let refused = store.complete(forged, Response::from("forged")).await?;
/// assert_eq!(refused.rejection(), Some(&Rejection::Superseded { current_version: 1 }));
/// # Ok(()) }
/// ```
pub fn forged_lease(task: Task, granted: &Lease) -> Lease {
    Lease::new(
        task,
        granted.attempt_id(),
        granted.worker().to_owned(),
        granted.expires_at(),
    )
}

/// One multi-thread runtime per test binary, for synchronous test bodies
/// that run many async cases (property tests): whatever a case leaves
/// behind (a pool, a connection) stays on one runtime.
///
/// ```
/// let four = taskfence::testing::runtime().block_on(async { 2 + 2 });
/// assert_eq!(four, 4);
/// ```
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
    })
}
