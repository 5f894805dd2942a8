//! [`Intercepted`]: a store that passes every call through to another store,
//! except the calls an [`Intercept`] chooses to handle itself, and lets it
//! observe every call.
//!
//! Why: wrapping a store is how an application adds behaviour around the
//! contract without a backend of its own — writing its reply rows in the
//! completion's transaction, moving a consumer position with it, counting
//! calls — and how a test injects a fault (stall a renewal, lose a reply,
//! accept what the real store would refuse). Implement only the methods you
//! change; every other one forwards, so a method added to [`TaskStore`] later
//! forwards too instead of breaking (or silently skipping) every wrapper.
//!
//! Two kinds of hook:
//!
//! - **One per operation** ([`Intercept::complete`], [`Intercept::claim`]…),
//!   each forwarding to the wrapped store by default: override one to change
//!   what that operation does.
//! - **[`Intercept::around`]**, called around every operation with a
//!   description of the call ([`Call`]) and, once it finishes, its answer
//!   described the same way for every operation ([`Outcome`]): the place for
//!   what applies to all of them alike (metrics, spans, an audit log).
//!   `taskfence::metrics` is built on it.
//!
//! The wrapped store keeps its type (`Intercepted<PgStore, _>` still reaches
//! its `PgStore`), and [`Inspect`] is forwarded too when the wrapped store
//! answers it.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use std::time::Duration;
//! use taskfence::intercept::{Intercept, Intercepted};
//! use taskfence::*;
//!
//! /// Counts completions; everything else passes through untouched.
//! #[derive(Default)]
//! struct CountCompletions(AtomicU64);
//!
//! #[async_trait::async_trait]
//! impl Intercept for CountCompletions {
//!     async fn complete(&self, inner: &dyn TaskStore, lease: Lease, response: Response) -> Result<Fenced<Task>> {
//!         self.0.fetch_add(1, Ordering::Relaxed);
//!         inner.complete(lease, response).await
//!     }
//! }
//!
//! let store = Intercepted::new(Arc::new(MemoryStore::new()), CountCompletions::default());
//! let task = store
//!     .submit(NewTask::new(RequestKey::new("u", "op", "k"), InputHash::of(["x"])))
//!     .await?
//!     .into_task();
//! let Claim::Acquired(lease) = store.claim(task.id, ClaimRequest::new("w", Duration::from_secs(30))).await? else {
//!     unreachable!()
//! };
//! store.complete(lease, Response::from("hi")).await?;
//! assert_eq!(store.interceptor().0.load(Ordering::Relaxed), 1);
//! # Ok(()) }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::backend::{claim_one_by_one, complete_one_by_one, entry, renew_one_by_one};
use crate::effect::{Effect, EffectOutcome, EffectStart};
use crate::error::Result;
use crate::inspect::{CappedCounts, Counts, Inspect, Page, Story, TaskQuery};
use crate::policy::Failure;
use crate::store::{
    Attempt, Claim, ClaimNext, ClaimRequest, Fenced, Lease, ReopenRequest, Retry, Submitted, TaskStore,
};
use crate::task::{NewTask, RequestKey, Response, Task, TaskId};

/// A call's future, as [`Intercept::around`] receives it.
pub type Pending<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// The calls an [`Intercepted`] store may handle itself, and the hook around
/// every call. Every method has a default: the operations forward to
/// `inner`, the wrapped store; [`around`](Self::around) just runs the call.
///
/// ```
/// use taskfence::intercept::Intercept;
///
/// /// Forwards everything: a wrapper that changes nothing.
/// struct PassThrough;
/// impl Intercept for PassThrough {}
/// ```
#[async_trait]
pub trait Intercept: Send + Sync {
    /// Runs around every operation, once its hook (below) was chosen: `call`
    /// says which operation and what it names, `run` performs it. The answer
    /// (or error) it returns is the caller's. The default runs the call.
    ///
    /// ```
    /// use taskfence::intercept::{Call, Intercept, Outcome, Pending};
    ///
    /// /// Logs every call's outcome.
    /// struct Log;
    /// #[async_trait::async_trait]
    /// impl Intercept for Log {
    ///     async fn around<'a, T: Outcome + Send + 'a>(&'a self, call: Call, run: Pending<'a, T>) -> taskfence::Result<T> {
    ///         let answer = run.await;
    ///         if let Ok(answer) = &answer {
    ///             println!("{} -> {}", call.operation, answer.summary().0);
    ///         }
    ///         answer
    ///     }
    /// }
    /// ```
    async fn around<'a, T: Outcome + Send + 'a>(&'a self, call: Call, run: Pending<'a, T>) -> Result<T> {
        let _ = call;
        run.await
    }

    /// [`TaskStore::submit`]; forwards to `inner` unless overridden.
    async fn submit(&self, inner: &dyn TaskStore, task: NewTask) -> Result<Submitted> {
        inner.submit(task).await
    }
    /// [`TaskStore::get`]; forwards to `inner` unless overridden.
    async fn get(&self, inner: &dyn TaskStore, id: TaskId) -> Result<Option<Task>> {
        inner.get(id).await
    }
    /// [`TaskStore::find`]; forwards to `inner` unless overridden.
    async fn find(&self, inner: &dyn TaskStore, key: &RequestKey) -> Result<Option<Task>> {
        inner.find(key).await
    }
    /// [`TaskStore::claim`]; forwards to `inner` unless overridden.
    async fn claim(&self, inner: &dyn TaskStore, id: TaskId, request: ClaimRequest) -> Result<Claim> {
        inner.claim(id, request).await
    }
    /// [`TaskStore::renew`]; forwards to `inner` unless overridden.
    async fn renew(
        &self,
        inner: &dyn TaskStore,
        lease: &mut Lease,
        extend_by: Duration,
    ) -> Result<Fenced<()>> {
        inner.renew(lease, extend_by).await
    }
    /// [`TaskStore::complete`]; forwards to `inner` unless overridden.
    async fn complete(
        &self,
        inner: &dyn TaskStore,
        lease: Lease,
        response: Response,
    ) -> Result<Fenced<Task>> {
        inner.complete(lease, response).await
    }
    /// [`TaskStore::fail`]; forwards to `inner` unless overridden.
    async fn fail(&self, inner: &dyn TaskStore, lease: Lease, failure: Failure) -> Result<Fenced<Retry>> {
        inner.fail(lease, failure).await
    }
    /// [`TaskStore::release`]; forwards to `inner` unless overridden.
    async fn release(&self, inner: &dyn TaskStore, lease: Lease) -> Result<Fenced<()>> {
        inner.release(lease).await
    }
    /// [`TaskStore::cancel`]; forwards to `inner` unless overridden.
    async fn cancel(&self, inner: &dyn TaskStore, id: TaskId, reason: &str) -> Result<Fenced<Task>> {
        inner.cancel(id, reason).await
    }
    /// [`TaskStore::record_operation`]; forwards to `inner` unless overridden.
    async fn record_operation(
        &self,
        inner: &dyn TaskStore,
        lease: &Lease,
        operation_id: &str,
    ) -> Result<Fenced<()>> {
        inner.record_operation(lease, operation_id).await
    }
    /// [`TaskStore::attempts`]; forwards to `inner` unless overridden.
    async fn attempts(&self, inner: &dyn TaskStore, id: TaskId) -> Result<Vec<Attempt>> {
        inner.attempts(id).await
    }
    /// [`TaskStore::begin_effect`]; forwards to `inner` unless overridden.
    async fn begin_effect(
        &self,
        inner: &dyn TaskStore,
        lease: &Lease,
        name: &str,
    ) -> Result<Fenced<EffectStart>> {
        inner.begin_effect(lease, name).await
    }
    /// [`TaskStore::finish_effect`]; forwards to `inner` unless overridden.
    async fn finish_effect(
        &self,
        inner: &dyn TaskStore,
        lease: &Lease,
        name: &str,
        outcome: EffectOutcome,
    ) -> Result<Fenced<Effect>> {
        inner.finish_effect(lease, name, outcome).await
    }
    /// [`TaskStore::effects`]; forwards to `inner` unless overridden.
    async fn effects(&self, inner: &dyn TaskStore, id: TaskId) -> Result<Vec<Effect>> {
        inner.effects(id).await
    }
    /// [`TaskStore::reopen`]; forwards to `inner` unless overridden.
    async fn reopen(
        &self,
        inner: &dyn TaskStore,
        id: TaskId,
        request: ReopenRequest,
    ) -> Result<Fenced<Task>> {
        inner.reopen(id, request).await
    }
    /// [`TaskStore::due`]; forwards to `inner` unless overridden.
    async fn due(&self, inner: &dyn TaskStore, limit: usize) -> Result<Vec<TaskId>> {
        inner.due(limit).await
    }
    /// [`TaskStore::purge_expired`]; forwards to `inner` unless overridden.
    async fn purge_expired(&self, inner: &dyn TaskStore, limit: usize) -> Result<u64> {
        inner.purge_expired(limit).await
    }
    /// By default one [`claim`](Self::claim) per task, so a wrapper that
    /// changes `claim` changes batches too; override it to keep the wrapped
    /// store's native batch (`inner.claim_many`).
    async fn claim_many(
        &self,
        inner: &dyn TaskStore,
        ids: &[TaskId],
        request: ClaimRequest,
    ) -> Result<Vec<Claim>> {
        entry::claim_many(ids, &request)?;
        claim_one_by_one(ids, request, |id, request| self.claim(inner, id, request)).await
    }
    /// By default one [`complete`](Self::complete) per lease, so a wrapper
    /// that writes its own rows on completion does so for batches too;
    /// override it to keep the wrapped store's native batch.
    async fn complete_many(
        &self,
        inner: &dyn TaskStore,
        completions: Vec<(Lease, Response)>,
    ) -> Result<Vec<Result<Fenced<Task>>>> {
        entry::complete_many(&completions)?;
        complete_one_by_one(completions, |lease, response| {
            self.complete(inner, lease, response)
        })
        .await
    }
    /// [`TaskStore::claim_next`]; forwards to `inner` unless overridden.
    async fn claim_next(&self, inner: &dyn TaskStore, request: ClaimNext) -> Result<Vec<Lease>> {
        inner.claim_next(request).await
    }
    /// By default one [`renew`](Self::renew) per lease, so a wrapper that
    /// changes `renew` changes batches too; override it to keep the wrapped
    /// store's native batch.
    async fn renew_many(
        &self,
        inner: &dyn TaskStore,
        leases: &mut [Lease],
        extend_by: Duration,
    ) -> Result<Vec<Fenced<()>>> {
        entry::renew_many(leases, extend_by)?;
        renew_one_by_one(leases, extend_by, |lease, extend_by| {
            self.renew(inner, lease, extend_by)
        })
        .await
    }
    /// [`Inspect::list`]; forwards to `inner` unless overridden.
    async fn list(&self, inner: &dyn Inspect, query: &TaskQuery) -> Result<Page> {
        inner.list(query).await
    }
    /// [`Inspect::counts`]; forwards to `inner` unless overridden.
    async fn counts(&self, inner: &dyn Inspect, scope: Option<&str>) -> Result<Counts> {
        inner.counts(scope).await
    }
    /// [`Inspect::counts_up_to`]; forwards to `inner` unless overridden.
    async fn counts_up_to(&self, inner: &dyn Inspect, scope: Option<&str>, cap: u64) -> Result<CappedCounts> {
        inner.counts_up_to(scope, cap).await
    }
    /// [`Inspect::story`]; forwards to `inner` unless overridden.
    async fn story(&self, inner: &dyn Inspect, id: TaskId) -> Result<Option<Story>> {
        inner.story(id).await
    }
    /// [`Inspect::stranded`]; forwards to `inner` unless overridden.
    async fn stranded(&self, inner: &dyn Inspect, older_than: Duration, limit: usize) -> Result<Vec<Task>> {
        inner.stranded(older_than, limit).await
    }
}

/// One call as [`Intercept::around`] sees it: the operation and what it
/// names (never payloads or responses).
///
/// ```
/// use taskfence::intercept::Call;
/// let call = Call::new("claim").task(taskfence::TaskId::new());
/// assert_eq!(call.operation, "claim");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Call {
    /// The [`TaskStore`] or [`Inspect`] method's name: `submit`, `claim`,
    /// `claim_many`, `list`…
    pub operation: &'static str,
    /// The task the call names, by id or by lease.
    pub task_id: Option<TaskId>,
    /// The assignment version of a fenced write's lease.
    pub version: Option<u64>,
    /// The attempt number of a fenced write's lease.
    pub attempt: Option<u32>,
    /// The request key the call names: a submission's, a lookup's, a lease's task's.
    pub key: Option<RequestKey>,
    /// The scope a count or a listing is restricted to.
    pub scope: Option<String>,
    /// How many tasks a batch asks for.
    pub batch: Option<usize>,
}

impl Call {
    /// A call of `operation` naming nothing yet.
    ///
    /// ```
    /// let call = taskfence::intercept::Call::new("due");
    /// assert!(call.task_id.is_none());
    /// ```
    pub fn new(operation: &'static str) -> Self {
        Self {
            operation,
            task_id: None,
            version: None,
            attempt: None,
            key: None,
            scope: None,
            batch: None,
        }
    }

    /// Names the task.
    ///
    /// ```
    /// let call = taskfence::intercept::Call::new("get").task(taskfence::TaskId::new());
    /// assert!(call.task_id.is_some());
    /// ```
    pub fn task(mut self, id: TaskId) -> Self {
        self.task_id = Some(id);
        self
    }

    /// Names the lease: its task, version, attempt and key.
    ///
    /// ```
    /// # fn f(lease: &taskfence::Lease) {
    /// let call = taskfence::intercept::Call::new("renew").lease(lease);
    /// assert_eq!((call.task_id, call.version), (Some(lease.task_id()), Some(lease.version())));
    /// # }
    /// ```
    pub fn lease(mut self, lease: &Lease) -> Self {
        self.task_id = Some(lease.task_id());
        self.version = Some(lease.version());
        self.attempt = Some(lease.attempt());
        self.key = Some(lease.task().key.clone());
        self
    }

    /// Names the request key.
    ///
    /// ```
    /// let key = taskfence::RequestKey::new("u", "op", "k");
    /// let call = taskfence::intercept::Call::new("find").key(&key);
    /// assert_eq!(call.key, Some(key));
    /// ```
    pub fn key(mut self, key: &RequestKey) -> Self {
        self.key = Some(key.clone());
        self
    }

    /// Names the scope.
    ///
    /// ```
    /// let call = taskfence::intercept::Call::new("counts").scope(Some("tenant-7"));
    /// assert_eq!(call.scope.as_deref(), Some("tenant-7"));
    /// ```
    pub fn scope(mut self, scope: Option<&str>) -> Self {
        self.scope = scope.map(str::to_owned);
        self
    }

    /// Names the batch's size.
    ///
    /// ```
    /// let call = taskfence::intercept::Call::new("claim_many").batch(10);
    /// assert_eq!(call.batch, Some(10));
    /// ```
    pub fn batch(mut self, n: usize) -> Self {
        self.batch = Some(n);
        self
    }
}

/// An operation's answer, described the same way for every operation: what
/// [`Intercept::around`] reads to observe any call without knowing its type.
///
/// The outcome labels are short fixed words (`created`, `acquired`,
/// `accepted`, `rejected`, `found`, `ok`…) and the reasons the
/// [`Rejection::label`](crate::Rejection::label) of a refusal or a fixed
/// word, so they make bounded metric labels.
///
/// ```
/// use taskfence::intercept::Outcome;
/// let answer: Option<taskfence::Task> = None;
/// assert_eq!(answer.summary(), ("absent", None));
/// ```
pub trait Outcome {
    /// The call's outcome and its reason, if any: for a batch answered item
    /// by item, `ok` (its items are in [`items`](Self::items)).
    fn summary(&self) -> (&'static str, Option<&'static str>);

    /// Each item's outcome and reason, for a batch answered item by item;
    /// nothing for any other answer.
    fn items(&self, each: &mut dyn FnMut(&'static str, Option<&'static str>)) {
        let _ = each;
    }

    /// The task the answer carries, if it carries one.
    fn task(&self) -> Option<&Task> {
        None
    }

    /// How many tasks the answer lists or removed (`due`, `stranded`,
    /// `purge_expired`), if it is such a count.
    fn count(&self) -> Option<u64> {
        None
    }

    /// Each task the answer shows failed terminally (a failure report that
    /// ended the budget, a claim that found it spent).
    fn failed(&self, each: &mut dyn FnMut(&Task)) {
        let _ = each;
    }
}

fn fenced_summary<T>(fenced: &Fenced<T>) -> (&'static str, Option<&'static str>) {
    match fenced {
        Fenced::Accepted(_) => ("accepted", None),
        Fenced::Rejected(r) => ("rejected", Some(r.label())),
    }
}

impl Outcome for Submitted {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        (if self.is_created() { "created" } else { "existing" }, None)
    }
    fn task(&self) -> Option<&Task> {
        Some(Submitted::task(self))
    }
}

impl Outcome for Option<Task> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        (if self.is_some() { "found" } else { "absent" }, None)
    }
    fn task(&self) -> Option<&Task> {
        self.as_ref()
    }
}

impl Outcome for Claim {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        (self.label(), None)
    }
    fn task(&self) -> Option<&Task> {
        match self {
            Claim::Acquired(lease) => Some(lease.task()),
            Claim::Completed(task) | Claim::Failed(task) | Claim::Cancelled(task) => Some(task),
            Claim::Busy { .. } | Claim::Backoff { .. } | Claim::NotFound => None,
        }
    }
    fn failed(&self, each: &mut dyn FnMut(&Task)) {
        if let Claim::Failed(task) = self {
            each(task);
        }
    }
}

impl Outcome for Fenced<()> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        fenced_summary(self)
    }
}

impl Outcome for Fenced<Task> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        fenced_summary(self)
    }
    fn task(&self) -> Option<&Task> {
        match self {
            Fenced::Accepted(task) => Some(task),
            Fenced::Rejected(_) => None,
        }
    }
}

impl Outcome for Fenced<Retry> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        match self {
            Fenced::Accepted(Retry::Scheduled { .. }) => ("accepted", Some("scheduled")),
            Fenced::Accepted(Retry::Exhausted(_)) => ("accepted", Some("exhausted")),
            Fenced::Rejected(r) => ("rejected", Some(r.label())),
        }
    }
    fn failed(&self, each: &mut dyn FnMut(&Task)) {
        if let Fenced::Accepted(Retry::Exhausted(task)) = self {
            each(task);
        }
    }
}

impl Outcome for Fenced<EffectStart> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        match self {
            Fenced::Accepted(EffectStart::Call { ambiguous: None, .. }) => ("accepted", Some("call")),
            Fenced::Accepted(EffectStart::Call {
                ambiguous: Some(_), ..
            }) => ("accepted", Some("call_ambiguous")),
            Fenced::Accepted(EffectStart::Done(_)) => ("accepted", Some("done")),
            Fenced::Accepted(EffectStart::Stop(_)) => ("accepted", Some("stop")),
            Fenced::Rejected(r) => ("rejected", Some(r.label())),
        }
    }
}

impl Outcome for Fenced<Effect> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        fenced_summary(self)
    }
}

impl Outcome for Vec<Effect> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
}

impl Outcome for Vec<Attempt> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
}

impl Outcome for Vec<TaskId> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
    fn count(&self) -> Option<u64> {
        Some(self.len() as u64)
    }
}

impl Outcome for u64 {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
    fn count(&self) -> Option<u64> {
        Some(*self)
    }
}

impl Outcome for Vec<Claim> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
    fn items(&self, each: &mut dyn FnMut(&'static str, Option<&'static str>)) {
        self.iter().for_each(|claim| each(claim.label(), None));
    }
    fn failed(&self, each: &mut dyn FnMut(&Task)) {
        self.iter().for_each(|claim| claim.failed(each));
    }
}

impl Outcome for Vec<Result<Fenced<Task>>> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
    fn items(&self, each: &mut dyn FnMut(&'static str, Option<&'static str>)) {
        for item in self {
            match item {
                Ok(fenced) => {
                    let (outcome, reason) = fenced_summary(fenced);
                    each(outcome, reason);
                }
                Err(e) => each("error", Some(e.label())),
            }
        }
    }
}

impl Outcome for Vec<Lease> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
    fn items(&self, each: &mut dyn FnMut(&'static str, Option<&'static str>)) {
        self.iter().for_each(|_| each("acquired", None));
    }
}

impl Outcome for Vec<Fenced<()>> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
    fn items(&self, each: &mut dyn FnMut(&'static str, Option<&'static str>)) {
        for fenced in self {
            let (outcome, reason) = fenced_summary(fenced);
            each(outcome, reason);
        }
    }
}

impl Outcome for Page {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
}

impl Outcome for Counts {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
}

impl Outcome for CappedCounts {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
}

impl Outcome for Option<Story> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        (if self.is_some() { "found" } else { "absent" }, None)
    }
    fn task(&self) -> Option<&Task> {
        self.as_ref().map(|story| &story.task)
    }
}

impl Outcome for Vec<Task> {
    fn summary(&self) -> (&'static str, Option<&'static str>) {
        ("ok", None)
    }
    fn count(&self) -> Option<u64> {
        Some(self.len() as u64)
    }
}

/// A store [`Intercepted`] can wrap: any store of a known type, and the
/// `dyn TaskStore` and `dyn Inspect` trait objects.
///
/// ```
/// fn wraps<S: taskfence::intercept::Inner + ?Sized>() {}
/// wraps::<taskfence::MemoryStore>();
/// wraps::<dyn taskfence::TaskStore>();
/// ```
pub trait Inner: Send + Sync {
    /// This store as a trait object.
    fn store(&self) -> &dyn TaskStore;
}

impl<T: TaskStore> Inner for T {
    fn store(&self) -> &dyn TaskStore {
        self
    }
}

impl Inner for dyn TaskStore {
    fn store(&self) -> &dyn TaskStore {
        self
    }
}

impl Inner for dyn Inspect {
    fn store(&self) -> &dyn TaskStore {
        self
    }
}

/// A wrapped store that also answers [`Inspect`].
///
/// ```
/// fn inspects<S: taskfence::intercept::InnerInspect + ?Sized>() {}
/// inspects::<taskfence::MemoryStore>();
/// inspects::<dyn taskfence::inspect::Inspect>();
/// ```
pub trait InnerInspect: Inner {
    /// This store as an [`Inspect`] trait object.
    fn inspector(&self) -> &dyn Inspect;
}

impl<T: Inspect> InnerInspect for T {
    fn inspector(&self) -> &dyn Inspect {
        self
    }
}

impl InnerInspect for dyn Inspect {
    fn inspector(&self) -> &dyn Inspect {
        self
    }
}

/// A store that forwards to `inner` through an [`Intercept`]. Cheap to
/// clone (an `Arc` and the interceptor); share it as `Arc<dyn TaskStore>`.
///
/// ```
/// use std::sync::Arc;
/// use taskfence::intercept::{Intercept, Intercepted};
/// use taskfence::{MemoryStore, TaskStore};
///
/// struct PassThrough;
/// impl Intercept for PassThrough {}
///
/// let store: Arc<dyn TaskStore> = Arc::new(Intercepted::new(Arc::new(MemoryStore::new()), PassThrough));
/// ```
pub struct Intercepted<S: ?Sized, I> {
    inner: Arc<S>,
    interceptor: I,
}

impl<S: ?Sized, I> Intercepted<S, I> {
    /// Wraps `inner`; `interceptor` sees every call first.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # struct PassThrough;
    /// # impl taskfence::intercept::Intercept for PassThrough {}
    /// let store = taskfence::intercept::Intercepted::new(Arc::new(taskfence::MemoryStore::new()), PassThrough);
    /// ```
    pub fn new(inner: Arc<S>, interceptor: I) -> Self {
        Self { inner, interceptor }
    }

    /// The wrapped store, with its own type: calls made on it directly are
    /// not intercepted.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # struct PassThrough;
    /// # impl taskfence::intercept::Intercept for PassThrough {}
    /// # let store = taskfence::intercept::Intercepted::new(Arc::new(taskfence::MemoryStore::new()), PassThrough);
    /// let inner: &Arc<taskfence::MemoryStore> = store.inner();
    /// assert_eq!(inner.record_count(), 0);
    /// ```
    pub fn inner(&self) -> &Arc<S> {
        &self.inner
    }

    /// The interceptor (to read what it counted, or to arm a fault).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # struct PassThrough;
    /// # impl taskfence::intercept::Intercept for PassThrough {}
    /// # let store = taskfence::intercept::Intercepted::new(Arc::new(taskfence::MemoryStore::new()), PassThrough);
    /// let _: &PassThrough = store.interceptor();
    /// ```
    pub fn interceptor(&self) -> &I {
        &self.interceptor
    }
}

impl<S: ?Sized, I: Clone> Clone for Intercepted<S, I> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            interceptor: self.interceptor.clone(),
        }
    }
}

impl<S: ?Sized, I: std::fmt::Debug> std::fmt::Debug for Intercepted<S, I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Intercepted")
            .field("interceptor", &self.interceptor)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl<S: Inner + ?Sized, I: Intercept> TaskStore for Intercepted<S, I> {
    async fn submit(&self, task: NewTask) -> Result<Submitted> {
        let hooks = &self.interceptor;
        let call = Call::new("submit").key(&task.key);
        hooks
            .around(call, Box::pin(hooks.submit(self.inner.store(), task)))
            .await
    }
    async fn get(&self, id: TaskId) -> Result<Option<Task>> {
        let hooks = &self.interceptor;
        let run = hooks.get(self.inner.store(), id);
        hooks.around(Call::new("get").task(id), Box::pin(run)).await
    }
    async fn find(&self, key: &RequestKey) -> Result<Option<Task>> {
        let hooks = &self.interceptor;
        let run = hooks.find(self.inner.store(), key);
        hooks.around(Call::new("find").key(key), Box::pin(run)).await
    }
    async fn claim(&self, id: TaskId, request: ClaimRequest) -> Result<Claim> {
        let hooks = &self.interceptor;
        let run = hooks.claim(self.inner.store(), id, request);
        hooks.around(Call::new("claim").task(id), Box::pin(run)).await
    }
    async fn renew(&self, lease: &mut Lease, extend_by: Duration) -> Result<Fenced<()>> {
        let hooks = &self.interceptor;
        let call = Call::new("renew").lease(lease);
        hooks
            .around(call, Box::pin(hooks.renew(self.inner.store(), lease, extend_by)))
            .await
    }
    async fn complete(&self, lease: Lease, response: Response) -> Result<Fenced<Task>> {
        let hooks = &self.interceptor;
        let call = Call::new("complete").lease(&lease);
        hooks
            .around(
                call,
                Box::pin(hooks.complete(self.inner.store(), lease, response)),
            )
            .await
    }
    async fn fail(&self, lease: Lease, failure: Failure) -> Result<Fenced<Retry>> {
        let hooks = &self.interceptor;
        let call = Call::new("fail").lease(&lease);
        hooks
            .around(call, Box::pin(hooks.fail(self.inner.store(), lease, failure)))
            .await
    }
    async fn release(&self, lease: Lease) -> Result<Fenced<()>> {
        let hooks = &self.interceptor;
        let call = Call::new("release").lease(&lease);
        hooks
            .around(call, Box::pin(hooks.release(self.inner.store(), lease)))
            .await
    }
    async fn cancel(&self, id: TaskId, reason: &str) -> Result<Fenced<Task>> {
        let hooks = &self.interceptor;
        let run = hooks.cancel(self.inner.store(), id, reason);
        hooks.around(Call::new("cancel").task(id), Box::pin(run)).await
    }
    async fn record_operation(&self, lease: &Lease, operation_id: &str) -> Result<Fenced<()>> {
        let hooks = &self.interceptor;
        let run = hooks.record_operation(self.inner.store(), lease, operation_id);
        hooks
            .around(Call::new("record_operation").lease(lease), Box::pin(run))
            .await
    }
    async fn attempts(&self, id: TaskId) -> Result<Vec<Attempt>> {
        let hooks = &self.interceptor;
        let run = hooks.attempts(self.inner.store(), id);
        hooks.around(Call::new("attempts").task(id), Box::pin(run)).await
    }
    async fn begin_effect(&self, lease: &Lease, name: &str) -> Result<Fenced<EffectStart>> {
        let hooks = &self.interceptor;
        let run = hooks.begin_effect(self.inner.store(), lease, name);
        hooks
            .around(Call::new("begin_effect").lease(lease), Box::pin(run))
            .await
    }
    async fn finish_effect(
        &self,
        lease: &Lease,
        name: &str,
        outcome: EffectOutcome,
    ) -> Result<Fenced<Effect>> {
        let hooks = &self.interceptor;
        let run = hooks.finish_effect(self.inner.store(), lease, name, outcome);
        hooks
            .around(Call::new("finish_effect").lease(lease), Box::pin(run))
            .await
    }
    async fn effects(&self, id: TaskId) -> Result<Vec<Effect>> {
        let hooks = &self.interceptor;
        let run = hooks.effects(self.inner.store(), id);
        hooks.around(Call::new("effects").task(id), Box::pin(run)).await
    }
    async fn reopen(&self, id: TaskId, request: ReopenRequest) -> Result<Fenced<Task>> {
        let hooks = &self.interceptor;
        let run = hooks.reopen(self.inner.store(), id, request);
        hooks.around(Call::new("reopen").task(id), Box::pin(run)).await
    }
    async fn due(&self, limit: usize) -> Result<Vec<TaskId>> {
        let hooks = &self.interceptor;
        let run = hooks.due(self.inner.store(), limit);
        hooks.around(Call::new("due"), Box::pin(run)).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<u64> {
        let hooks = &self.interceptor;
        let run = hooks.purge_expired(self.inner.store(), limit);
        hooks.around(Call::new("purge_expired"), Box::pin(run)).await
    }
    async fn claim_many(&self, ids: &[TaskId], request: ClaimRequest) -> Result<Vec<Claim>> {
        let hooks = &self.interceptor;
        let run = hooks.claim_many(self.inner.store(), ids, request);
        hooks
            .around(Call::new("claim_many").batch(ids.len()), Box::pin(run))
            .await
    }
    async fn complete_many(&self, completions: Vec<(Lease, Response)>) -> Result<Vec<Result<Fenced<Task>>>> {
        let hooks = &self.interceptor;
        let n = completions.len();
        let run = hooks.complete_many(self.inner.store(), completions);
        hooks
            .around(Call::new("complete_many").batch(n), Box::pin(run))
            .await
    }
    async fn claim_next(&self, request: ClaimNext) -> Result<Vec<Lease>> {
        let hooks = &self.interceptor;
        let call = Call::new("claim_next").batch(request.limit);
        let run = hooks.claim_next(self.inner.store(), request);
        hooks.around(call, Box::pin(run)).await
    }
    async fn renew_many(&self, leases: &mut [Lease], extend_by: Duration) -> Result<Vec<Fenced<()>>> {
        let hooks = &self.interceptor;
        let call = Call::new("renew_many").batch(leases.len());
        let run = hooks.renew_many(self.inner.store(), leases, extend_by);
        hooks.around(call, Box::pin(run)).await
    }
}

#[async_trait]
impl<S: InnerInspect + ?Sized, I: Intercept> Inspect for Intercepted<S, I> {
    async fn list(&self, query: &TaskQuery) -> Result<Page> {
        let hooks = &self.interceptor;
        let run = hooks.list(self.inner.inspector(), query);
        let call = Call::new("list").scope(query.scope.as_deref());
        hooks.around(call, Box::pin(run)).await
    }
    async fn counts(&self, scope: Option<&str>) -> Result<Counts> {
        let hooks = &self.interceptor;
        let run = hooks.counts(self.inner.inspector(), scope);
        hooks
            .around(Call::new("counts").scope(scope), Box::pin(run))
            .await
    }
    async fn counts_up_to(&self, scope: Option<&str>, cap: u64) -> Result<CappedCounts> {
        let hooks = &self.interceptor;
        let run = hooks.counts_up_to(self.inner.inspector(), scope, cap);
        hooks
            .around(Call::new("counts_up_to").scope(scope), Box::pin(run))
            .await
    }
    async fn story(&self, id: TaskId) -> Result<Option<Story>> {
        let hooks = &self.interceptor;
        let run = hooks.story(self.inner.inspector(), id);
        hooks.around(Call::new("story").task(id), Box::pin(run)).await
    }
    async fn stranded(&self, older_than: Duration, limit: usize) -> Result<Vec<Task>> {
        let hooks = &self.interceptor;
        let run = hooks.stranded(self.inner.inspector(), older_than, limit);
        hooks.around(Call::new("stranded"), Box::pin(run)).await
    }
}
