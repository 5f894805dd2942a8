//! A store's history, recorded step by step so it can be checked against
//! the protocol's model afterwards (`tools/model`'s trace replay).
//!
//! [`Recorder`] is an [`Intercept`]: wrap any store with it and every
//! operation that may write is logged as a [`Step`], with its inputs, the
//! store's answer and the tasks it touched read back before and after (an
//! effect step also reads back the effect journal's record: [`SeenEffect`]).
//! Operations pass through it one at a time, so each step's "before" is the
//! state the operation found: the recorded history is a sequence, whatever
//! the callers' concurrency. [`Recording`] wraps a conformance [`Fixture`]
//! the same way and logs its clock's advances.
//!
//! A call cut short (its future dropped, say by an aborted worker) is
//! logged with the outcome `unknown`: the write may or may not have
//! happened, and the next read of the task tells which.
//!
//! A history can also be passed on as it happens
//! ([`Recorder::with_sink`]): several processes' recorders, each writing
//! its own file, are how a multi-process run (`tools/chaos`) is recorded.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use taskfence::testing::trace::Recording;
//! use taskfence::testing::{Fixture, MemoryFixture, new_task};
//! let fixture = Recording::new(MemoryFixture::new());
//! fixture.store().submit(new_task("a")).await.unwrap();
//! let steps = fixture.steps();
//! assert_eq!((steps[0].op.as_str(), steps[0].outcome.as_str()), ("submit", "created"));
//! # }
//! ```

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use crate::effect::{Effect, EffectOutcome, EffectStart};
use crate::error::Result;
use crate::intercept::{Intercept, Intercepted, Outcome};
use crate::policy::Failure;
use crate::store::{
    Claim, ClaimNext, ClaimRequest, Fenced, Lease, ReopenRequest, Retry, Submitted, TaskStore,
};
use crate::task::{AttemptId, InputHash, NewTask, RequestKey, Response, Task, TaskId};
use crate::testing::Fixture;

/// One task as a step found it and left it (`None`: not in the store).
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Seen {
    /// The task's id.
    pub id: TaskId,
    /// The task read just before the operation.
    pub before: Option<Task>,
    /// The task read just after it (`None` also when the call was cut short).
    pub after: Option<Task>,
}

/// The effect journal's record a `begin_effect` or `finish_effect` step
/// named, read back just before and just after the operation (`None`: no
/// record), and what the step asked for.
///
/// ```
/// use taskfence::effect::EffectOutcome;
/// use taskfence::testing::trace::SeenEffect;
/// let seen = SeenEffect::new("notify-user").with_outcome(EffectOutcome::done("m-1"));
/// assert_eq!(seen.name, "notify-user");
/// assert!(seen.before.is_none() && seen.after.is_none());
/// ```
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct SeenEffect {
    /// The effect's name.
    pub name: String,
    /// The outcome a `finish_effect` reported (`None` for a `begin_effect`).
    pub outcome: Option<EffectOutcome>,
    /// The record read just before the operation.
    pub before: Option<Effect>,
    /// The record read just after it (`None` also when the call was cut short).
    pub after: Option<Effect>,
}

impl SeenEffect {
    /// The effect `name`, nothing read yet.
    ///
    /// ```
    /// let seen = taskfence::testing::trace::SeenEffect::new("charge-card");
    /// assert!(seen.outcome.is_none());
    /// ```
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            outcome: None,
            before: None,
            after: None,
        }
    }

    /// The same, with the outcome a `finish_effect` reported.
    ///
    /// ```
    /// use taskfence::effect::EffectOutcome;
    /// let seen = taskfence::testing::trace::SeenEffect::new("charge-card")
    ///     .with_outcome(EffectOutcome::failed("402: declined"));
    /// assert!(seen.outcome.is_some());
    /// ```
    #[must_use]
    pub fn with_outcome(mut self, outcome: EffectOutcome) -> Self {
        self.outcome = Some(outcome);
        self
    }
}

/// One operation of a recorded history: what was asked, what the store
/// answered, and the tasks it touched, read back before and after.
///
/// ```
/// let step = taskfence::testing::trace::Step::new("advance");
/// assert_eq!(step.outcome, "unknown");
/// ```
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Step {
    /// The operation: a [`TaskStore`] method's name, or `advance` (the store's clock moved).
    pub op: String,
    /// The task the call names, by id or by lease.
    pub task_id: Option<TaskId>,
    /// The lease's assignment version, for a fenced write.
    pub version: Option<u64>,
    /// The lease's attempt id (its failure's jitter is drawn from it).
    pub attempt_id: Option<AttemptId>,
    /// The lease asked for (a claim), the extension (a renewal), or the advance.
    pub duration: Option<Duration>,
    /// A submission's input hash.
    pub input_hash: Option<InputHash>,
    /// A failure report's failure.
    pub failure: Option<Failure>,
    /// The store's answer, as [`Outcome::summary`] labels it; `error` for an
    /// error, `unknown` when the call was cut short.
    pub outcome: String,
    /// The answer's reason label, or the error's.
    pub reason: Option<String>,
    /// Tasks the answer leased (`claim_next`).
    pub leased: Vec<TaskId>,
    /// The tasks the step touched.
    pub tasks: Vec<Seen>,
    /// The effect record a `begin_effect` or `finish_effect` wrote or read
    /// (`None` for every other operation, and in traces recorded before
    /// effects were).
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub effect: Option<SeenEffect>,
}

impl Step {
    /// A step of `op` naming nothing yet, its outcome unknown.
    pub fn new(op: &str) -> Self {
        Self {
            op: op.to_owned(),
            task_id: None,
            version: None,
            attempt_id: None,
            duration: None,
            input_hash: None,
            failure: None,
            outcome: "unknown".to_owned(),
            reason: None,
            leased: Vec::new(),
            tasks: Vec::new(),
            effect: None,
        }
    }

    fn lease(mut self, lease: &Lease) -> Self {
        self.task_id = Some(lease.task_id());
        self.version = Some(lease.version());
        self.attempt_id = Some(lease.attempt_id());
        self
    }
}

/// Which tasks a step reads back.
enum Touches {
    One(TaskId),
    /// Every task the recorder has seen (a `claim_next` or a purge may touch any).
    All,
}

/// Logs every writing operation of the store it wraps as a [`Step`], one
/// operation at a time (see the [module](self)).
///
/// ```
/// use std::sync::Arc;
/// use taskfence::intercept::Intercepted;
/// use taskfence::testing::trace::Recorder;
/// let recorder = Recorder::default();
/// let store = Intercepted::new(Arc::new(taskfence::MemoryStore::new()), recorder.clone());
/// assert!(recorder.steps().is_empty());
/// ```
#[derive(Clone, Default)]
pub struct Recorder {
    log: Arc<Mutex<Vec<Step>>>,
    known: Arc<Mutex<BTreeSet<TaskId>>>,
    turn: Arc<tokio::sync::Mutex<()>>,
    sink: Option<Sink>,
    patience: Duration,
}

/// Where a [`Recorder`] also passes its steps ([`Recorder::with_sink`]).
type Sink = Arc<dyn Fn(&Step) + Send + Sync>;

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("steps", &self.log.lock().map_or(0, |log| log.len()))
            .field("sink", &self.sink.is_some())
            .field("patience", &self.patience)
            .finish_non_exhaustive()
    }
}

/// Pushes its step when dropped: with the answer when the call finished,
/// as `unknown` when it was cut short.
struct Entry {
    step: Option<Step>,
    log: Arc<Mutex<Vec<Step>>>,
    sink: Option<Sink>,
}

impl Drop for Entry {
    fn drop(&mut self) {
        if let Some(step) = self.step.take() {
            if let Some(sink) = &self.sink {
                sink(&step);
            }
            self.log.lock().expect("trace log").push(step);
        }
    }
}

impl Recorder {
    /// The steps recorded so far, in order.
    ///
    /// ```
    /// assert!(taskfence::testing::trace::Recorder::default().steps().is_empty());
    /// ```
    pub fn steps(&self) -> Vec<Step> {
        self.log.lock().expect("trace log").clone()
    }

    /// Logs a step that touches no task (the store's clock advancing).
    ///
    /// ```
    /// let recorder = taskfence::testing::trace::Recorder::default();
    /// recorder.note(taskfence::testing::trace::Step::new("advance"));
    /// assert_eq!(recorder.steps().len(), 1);
    /// ```
    pub fn note(&self, step: Step) {
        if let Some(sink) = &self.sink {
            sink(&step);
        }
        self.log.lock().expect("trace log").push(step);
    }

    /// Passes every step to `sink` as well, in the order they are logged:
    /// a history too long to keep, or one that must survive its process
    /// being killed, is written out as it happens. An operation's step is
    /// passed twice: when it starts, with the outcome `unknown` and the tasks
    /// read before it (if the process dies during the call, that is what is
    /// left: the write may or may not have happened), and once it is logged.
    /// The two passes of one operation are never separated by another step
    /// of this recorder.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::sync::{Arc, Mutex};
    /// use taskfence::TaskStore;
    /// use taskfence::intercept::Intercepted;
    /// use taskfence::testing::new_task;
    /// use taskfence::testing::trace::Recorder;
    /// let seen = Arc::new(Mutex::new(Vec::new()));
    /// let lines = seen.clone();
    /// let recorder = Recorder::default().with_sink(move |step| lines.lock().unwrap().push(step.outcome.clone()));
    /// let store = Intercepted::new(Arc::new(taskfence::MemoryStore::new()), recorder);
    /// store.submit(new_task("a")).await.unwrap();
    /// assert_eq!(*seen.lock().unwrap(), ["unknown", "created"]);
    /// # }
    /// ```
    #[must_use]
    pub fn with_sink(mut self, sink: impl Fn(&Step) + Send + Sync + 'static) -> Self {
        self.sink = Some(Arc::new(sink));
        self
    }

    /// Reads a task or an effect record again, for up to `patience`, when
    /// the store fails to answer (a connection killed, a server restarting):
    /// a read that still fails is logged as "not in the store". Without it
    /// (the default) a failed read is logged that way at once.
    ///
    /// ```
    /// let recorder = taskfence::testing::trace::Recorder::default()
    ///     .with_read_patience(std::time::Duration::from_secs(30));
    /// assert!(recorder.steps().is_empty());
    /// ```
    #[must_use]
    pub fn with_read_patience(mut self, patience: Duration) -> Self {
        self.patience = patience;
        self
    }

    /// `read` until it answers or the patience runs out.
    async fn patiently<T, F, Fut>(&self, read: F) -> Option<T>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let give_up = tokio::time::Instant::now() + self.patience;
        loop {
            match read().await {
                Ok(found) => return Some(found),
                Err(_) if tokio::time::Instant::now() < give_up => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(_) => return None,
            }
        }
    }

    fn started(&self, step: &Step) {
        if let Some(sink) = &self.sink {
            sink(step);
        }
    }

    fn learn(&self, id: TaskId) {
        self.known.lock().expect("known tasks").insert(id);
    }

    async fn read(&self, inner: &dyn TaskStore, ids: &[TaskId]) -> Vec<Option<Task>> {
        let mut tasks = Vec::with_capacity(ids.len());
        for id in ids {
            tasks.push(self.patiently(|| inner.get(*id)).await.flatten());
        }
        tasks
    }

    async fn read_effect(&self, inner: &dyn TaskStore, id: TaskId, name: &str) -> Option<Effect> {
        let effects = self.patiently(|| inner.effects(id)).await?;
        effects.into_iter().find(|e| e.name == name)
    }

    async fn find(&self, inner: &dyn TaskStore, key: &RequestKey) -> Option<Task> {
        self.patiently(|| inner.find(key)).await.flatten()
    }

    async fn record<T, F>(&self, inner: &dyn TaskStore, step: Step, touches: Touches, run: F) -> Result<T>
    where
        T: Outcome + Send,
        F: Future<Output = Result<T>> + Send,
    {
        self.record_with(inner, step, touches, run, |_, _| ()).await
    }

    /// [`record`](Self::record), and `note` adds what the answer says to the step.
    async fn record_with<T, F>(
        &self,
        inner: &dyn TaskStore,
        step: Step,
        touches: Touches,
        run: F,
        note: impl FnOnce(&T, &mut Step) + Send,
    ) -> Result<T>
    where
        T: Outcome + Send,
        F: Future<Output = Result<T>> + Send,
    {
        let _turn = self.turn.lock().await;
        let ids: Vec<TaskId> = match touches {
            Touches::One(id) => vec![id],
            Touches::All => self.known.lock().expect("known tasks").iter().copied().collect(),
        };
        let before = self.read(inner, &ids).await;
        let mut step = step;
        if let (Some(seen), Some(id)) = (step.effect.as_mut(), ids.first()) {
            seen.before = self.read_effect(inner, *id, &seen.name).await;
        }
        step.tasks = ids
            .iter()
            .zip(before)
            .map(|(id, before)| Seen {
                id: *id,
                before,
                after: None,
            })
            .collect();
        self.started(&step);
        let mut entry = Entry {
            step: Some(step),
            log: Arc::clone(&self.log),
            sink: self.sink.clone(),
        };
        let answer = run.await;
        let after = self.read(inner, &ids).await;
        let step = entry.step.as_mut().expect("not yet logged");
        for (seen, after) in step.tasks.iter_mut().zip(after) {
            seen.after = after;
        }
        if let (Some(seen), Some(id)) = (step.effect.as_mut(), ids.first()) {
            seen.after = self.read_effect(inner, *id, &seen.name).await;
        }
        let (outcome, reason) = match &answer {
            Ok(answer) => {
                note(answer, step);
                answer.summary()
            }
            Err(e) => ("error", Some(e.label())),
        };
        step.outcome = outcome.to_owned();
        step.reason = reason.map(str::to_owned);
        drop(entry);
        answer
    }
}

#[async_trait]
impl Intercept for Recorder {
    async fn submit(&self, inner: &dyn TaskStore, task: NewTask) -> Result<Submitted> {
        let _turn = self.turn.lock().await;
        let mut step = Step::new("submit");
        step.input_hash = Some(task.input_hash);
        let key = task.key.clone();
        let before = self.find(inner, &key).await;
        self.started(&step);
        let mut entry = Entry {
            step: Some(step),
            log: Arc::clone(&self.log),
            sink: self.sink.clone(),
        };
        let answer = inner.submit(task).await;
        let after = self.find(inner, &key).await;
        let step = entry.step.as_mut().expect("not yet logged");
        let id = match (&answer, &after, &before) {
            (Ok(submitted), _, _) => Some(submitted.task().id),
            (Err(_), Some(task), _) | (Err(_), None, Some(task)) => Some(task.id),
            (Err(_), None, None) => None,
        };
        if let Some(id) = id {
            self.learn(id);
            step.task_id = Some(id);
        }
        // The task the key named before, and the one it names after (the
        // same one, unless the submission wrote a new task).
        let mut seen = Vec::new();
        if let Some(old) = &before {
            seen.push(Seen {
                id: old.id,
                before: Some(old.clone()),
                after: after.clone().filter(|t| t.id == old.id),
            });
        }
        if let Some(new) = after.filter(|t| before.as_ref().is_none_or(|old| old.id != t.id)) {
            seen.push(Seen {
                id: new.id,
                before: None,
                after: Some(new),
            });
        }
        step.tasks = seen;
        let (outcome, reason) = match &answer {
            Ok(answer) => answer.summary(),
            Err(e) => ("error", Some(e.label())),
        };
        step.outcome = outcome.to_owned();
        step.reason = reason.map(str::to_owned);
        drop(entry);
        answer
    }

    async fn claim(&self, inner: &dyn TaskStore, id: TaskId, request: ClaimRequest) -> Result<Claim> {
        self.learn(id);
        let mut step = Step::new("claim");
        step.task_id = Some(id);
        step.duration = Some(request.lease_duration);
        self.record(inner, step, Touches::One(id), inner.claim(id, request))
            .await
    }

    async fn renew(
        &self,
        inner: &dyn TaskStore,
        lease: &mut Lease,
        extend_by: Duration,
    ) -> Result<Fenced<()>> {
        let mut step = Step::new("renew").lease(lease);
        step.duration = Some(extend_by);
        let id = lease.task_id();
        self.record(inner, step, Touches::One(id), inner.renew(lease, extend_by))
            .await
    }

    async fn complete(
        &self,
        inner: &dyn TaskStore,
        lease: Lease,
        response: Response,
    ) -> Result<Fenced<Task>> {
        let step = Step::new("complete").lease(&lease);
        let id = lease.task_id();
        self.record(inner, step, Touches::One(id), inner.complete(lease, response))
            .await
    }

    async fn fail(&self, inner: &dyn TaskStore, lease: Lease, failure: Failure) -> Result<Fenced<Retry>> {
        let mut step = Step::new("fail").lease(&lease);
        step.failure = Some(failure.clone());
        let id = lease.task_id();
        self.record(inner, step, Touches::One(id), inner.fail(lease, failure))
            .await
    }

    async fn release(&self, inner: &dyn TaskStore, lease: Lease) -> Result<Fenced<()>> {
        let step = Step::new("release").lease(&lease);
        let id = lease.task_id();
        self.record(inner, step, Touches::One(id), inner.release(lease))
            .await
    }

    async fn release_unstarted(&self, inner: &dyn TaskStore, lease: Lease) -> Result<Fenced<()>> {
        let step = Step::new("release_unstarted").lease(&lease);
        let id = lease.task_id();
        self.record(inner, step, Touches::One(id), inner.release_unstarted(lease))
            .await
    }

    async fn cancel(&self, inner: &dyn TaskStore, id: TaskId, reason: &str) -> Result<Fenced<Task>> {
        self.learn(id);
        let mut step = Step::new("cancel");
        step.task_id = Some(id);
        self.record(inner, step, Touches::One(id), inner.cancel(id, reason))
            .await
    }

    async fn record_operation(
        &self,
        inner: &dyn TaskStore,
        lease: &Lease,
        operation_id: &str,
    ) -> Result<Fenced<()>> {
        let step = Step::new("record_operation").lease(lease);
        let id = lease.task_id();
        self.record(
            inner,
            step,
            Touches::One(id),
            inner.record_operation(lease, operation_id),
        )
        .await
    }

    async fn begin_effect(
        &self,
        inner: &dyn TaskStore,
        lease: &Lease,
        name: &str,
    ) -> Result<Fenced<EffectStart>> {
        let mut step = Step::new("begin_effect").lease(lease);
        step.effect = Some(SeenEffect::new(name));
        let id = lease.task_id();
        self.record(inner, step, Touches::One(id), inner.begin_effect(lease, name))
            .await
    }

    async fn finish_effect(
        &self,
        inner: &dyn TaskStore,
        lease: &Lease,
        name: &str,
        outcome: EffectOutcome,
    ) -> Result<Fenced<Effect>> {
        let mut step = Step::new("finish_effect").lease(lease);
        step.effect = Some(SeenEffect::new(name).with_outcome(outcome.clone()));
        let id = lease.task_id();
        self.record(
            inner,
            step,
            Touches::One(id),
            inner.finish_effect(lease, name, outcome),
        )
        .await
    }

    async fn reopen(
        &self,
        inner: &dyn TaskStore,
        id: TaskId,
        request: ReopenRequest,
    ) -> Result<Fenced<Task>> {
        self.learn(id);
        let mut step = Step::new("reopen");
        step.task_id = Some(id);
        self.record(inner, step, Touches::One(id), inner.reopen(id, request))
            .await
    }

    async fn purge_expired(&self, inner: &dyn TaskStore, limit: usize) -> Result<u64> {
        let step = Step::new("purge_expired");
        self.record(inner, step, Touches::All, inner.purge_expired(limit))
            .await
    }

    async fn claim_next(&self, inner: &dyn TaskStore, request: ClaimNext) -> Result<Vec<Lease>> {
        let mut step = Step::new("claim_next");
        step.duration = Some(request.lease_duration);
        // Every task the recorder has seen submitted is read back: the
        // answer names the leased ones; a spent budget fails others.
        self.record_with(
            inner,
            step,
            Touches::All,
            inner.claim_next(request),
            |leases: &Vec<Lease>, step| step.leased = leases.iter().map(Lease::task_id).collect(),
        )
        .await
    }
}

/// A [`Fixture`] whose store records its history ([`Recorder`]), and whose
/// clock's advances are logged as `advance` steps.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use taskfence::testing::{Fixture, MemoryFixture, trace::Recording};
/// let fixture = Recording::new(MemoryFixture::new());
/// fixture.advance(std::time::Duration::from_secs(1)).await;
/// assert_eq!(fixture.steps()[0].op, "advance");
/// # }
/// ```
#[derive(Debug)]
pub struct Recording<F> {
    fixture: F,
    recorder: Recorder,
}

impl<F: Fixture> Recording<F> {
    /// Records the history of `fixture`'s store.
    pub fn new(fixture: F) -> Self {
        Self {
            fixture,
            recorder: Recorder::default(),
        }
    }

    /// The history so far.
    pub fn steps(&self) -> Vec<Step> {
        self.recorder.steps()
    }

    /// The wrapped fixture.
    pub fn fixture(&self) -> &F {
        &self.fixture
    }
}

#[async_trait]
impl<F: Fixture> Fixture for Recording<F> {
    fn store(&self) -> Arc<dyn TaskStore> {
        Arc::new(Intercepted::new(self.fixture.store(), self.recorder.clone()))
    }

    async fn advance(&self, by: Duration) {
        let _turn = self.recorder.turn.lock().await;
        self.fixture.advance(by).await;
        let mut step = Step::new("advance");
        step.duration = Some(by);
        step.outcome = "ok".to_owned();
        self.recorder.note(step);
    }

    async fn record_count(&self) -> u64 {
        self.fixture.record_count().await
    }
}
