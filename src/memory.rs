//! [`MemoryStore`]: the embedded backend, with the same semantics as every
//! other. The demo and users' unit tests run on it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use time::OffsetDateTime;

use crate::backend::rules::{
    self, BeginEffectRule, CancelRule, ClaimRule, FinishEffectRule, ReopenRule, Work,
};
use crate::backend::{Backend, InspectBackend, new_lease, new_task, renewed};
use crate::clock::{Clock, SystemClock};
use crate::effect::{Effect, EffectOutcome, EffectStart};
use crate::error::{Error, InvalidInput, Result};
use crate::inspect::{
    CappedCounts, Count, Counts, Order, Page, QueueDepth, STATUSES, Story, TaskQuery, TaskSummary,
};
use crate::policy::Failure;
use crate::store::{
    Attempt, AttemptOutcome, Claim, ClaimNext, ClaimRequest, Fenced, Lease, ReopenRequest, Reopening, Retry,
    Submitted,
};
use crate::task::{AttemptId, NewTask, RequestKey, Response, Status, Task, TaskId};
use crate::throttle::{BucketState, KeySlots, RateBucket, Throttled};

/// An in-process [`TaskStore`](crate::TaskStore): thread-safe, not durable, with an injectable
/// [`Clock`] so tests expire leases, pass backoffs and deadlines without sleeping.
///
/// Every operation holds one mutex for a few map operations, so each one is
/// atomic, exactly as a single SQL statement would be.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
/// use std::time::Duration;
/// use taskfence::clock::ManualClock;
/// use taskfence::*;
///
/// let clock = ManualClock::default();
/// let store = MemoryStore::with_clock(clock.clone());
/// let task = store.submit(NewTask::new(RequestKey::new("u", "op", "k"), InputHash::of(["x"]))).await?.into_task();
/// let Claim::Acquired(lease) = store.claim(task.id, ClaimRequest::new("a", Duration::from_secs(30))).await? else { panic!() };
///
/// clock.advance(Duration::from_secs(31)); // worker "a" is paused past its lease
/// assert!(store.claim(task.id, ClaimRequest::new("b", Duration::from_secs(30))).await?.is_acquired());
/// let late = store.complete(lease, Response::from("stale")).await?;
/// assert_eq!(late.rejection(), Some(&Rejection::Superseded { current_version: 2 }));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    clock: Box<dyn Clock>,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    tasks: HashMap<TaskId, Task>,
    keys: HashMap<RequestKey, TaskId>,
    attempts: HashMap<TaskId, Vec<Attempt>>,
    reopenings: HashMap<TaskId, Vec<Reopening>>,
    /// Each task's effect journal, by effect name.
    effects: HashMap<TaskId, BTreeMap<String, Effect>>,
    /// The tasks naming each concurrency key, by submission order.
    keyed: HashMap<String, BTreeMap<u64, TaskId>>,
    /// The next submission's place in that order.
    submitted: u64,
    /// The rate buckets, with their schedules.
    buckets: BTreeMap<String, BucketState>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A store on the system clock.
    pub fn new() -> Self {
        Self::with_clock(SystemClock)
    }

    /// A store on the given clock (a [`ManualClock`](crate::clock::ManualClock) in tests).
    pub fn with_clock(clock: impl Clock + 'static) -> Self {
        Self {
            inner: Arc::new(Inner {
                clock: Box::new(clock),
                state: Mutex::default(),
            }),
        }
    }

    /// Runs `write` — a change to the application's own state — only if
    /// `lease` passes the fence (current version, task running, lease live
    /// on the store's clock), while the store holds its lock: no takeover,
    /// cancel or save can come between the check and the write (so `write`
    /// must not call the store: it would wait for itself). The embedded
    /// counterpart of PostgreSQL's `PgStore::on(&mut tx).fence` and
    /// DynamoDB's fence item.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
    /// # use std::time::Duration;
    /// # use taskfence::*;
    /// let store = MemoryStore::new();
    /// # let task = store.submit(NewTask::new(RequestKey::new("u", "op", "k"), InputHash::of(["x"]))).await?.into_task();
    /// # let Claim::Acquired(lease) = store.claim(task.id, ClaimRequest::new("w", Duration::from_secs(30))).await? else { unreachable!() };
    /// let mut index = std::collections::BTreeMap::new();
    /// let written = store.fenced_write(&lease, || index.insert("doc-1", "entry"))?;
    /// assert!(written.is_accepted());
    /// # Ok(()) }
    /// ```
    pub fn fenced_write<T>(&self, lease: &Lease, write: impl FnOnce() -> T) -> Result<Fenced<T>> {
        self.fenced(lease, |_, _| write())
    }

    /// Number of records held (tasks, attempts, reopenings and effects): what "nothing was written" is checked against.
    ///
    /// ```
    /// assert_eq!(taskfence::MemoryStore::new().record_count(), 0);
    /// ```
    pub fn record_count(&self) -> u64 {
        let state = self.lock();
        let attempts: usize = state.attempts.values().map(Vec::len).sum();
        let reopenings: usize = state.reopenings.values().map(Vec::len).sum();
        let effects: usize = state.effects.values().map(BTreeMap::len).sum();
        (state.tasks.len() + attempts + reopenings + effects) as u64
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied operation:
        // every operation validates first and mutates last.
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> OffsetDateTime {
        self.inner.clock.now()
    }

    /// A release of `lease` as [`rules::release`] decides it: due again at
    /// once (`due` and `claim_next` find it), the claim refunded when the
    /// work never began.
    fn release_as(&self, lease: Lease, work: Work) -> Result<Fenced<()>> {
        let mut state = self.lock();
        let now = self.now();
        let id = lease.task_id();
        let task = state.tasks.get(&id).ok_or(Error::NotFound(id))?;
        let recorded = state.recorded_attempt(id, lease.version());
        let decided = rules::release(task, lease.version(), now, work)
            .and_then(|released| rules::granted(task, lease.attempt_id(), recorded).map(|()| released));
        match decided {
            Err(rejection) => {
                tracing::debug!(%rejection, "fenced write rejected");
                Ok(Fenced::Rejected(rejection))
            }
            Ok(released) => {
                state.finish_attempt(id, lease.version(), work.outcome(), now, None);
                *state.task_mut(id) = released;
                Ok(Fenced::Accepted(()))
            }
        }
    }

    /// Runs a fenced write: checks the lease against the task with
    /// [`rules::fence`] (and its attempt, [`rules::check_lease`]), then applies `write`.
    fn fenced<T>(
        &self,
        lease: &Lease,
        write: impl FnOnce(&mut State, OffsetDateTime) -> T,
    ) -> Result<Fenced<T>> {
        self.checked(rules::fence, lease, write)
    }

    /// Runs a write of `lease` that `check` allows (the fence, or a
    /// completion's acceptance rule), then applies `write`.
    fn checked<T>(
        &self,
        check: rules::LeaseCheck,
        lease: &Lease,
        write: impl FnOnce(&mut State, OffsetDateTime) -> T,
    ) -> Result<Fenced<T>> {
        let mut state = self.lock();
        let now = self.now();
        let task = state
            .tasks
            .get(&lease.task_id())
            .ok_or(Error::NotFound(lease.task_id()))?;
        let recorded = state.recorded_attempt(lease.task_id(), lease.version());
        if let Err(rejection) = rules::check_lease(check, task, lease, recorded, now) {
            tracing::debug!(%rejection, "fenced write rejected");
            return Ok(Fenced::Rejected(rejection));
        }
        Ok(Fenced::Accepted(write(&mut state, now)))
    }
}

impl State {
    fn task_mut(&mut self, id: TaskId) -> &mut Task {
        self.tasks
            .get_mut(&id)
            .expect("checked by the caller under the same lock")
    }

    /// The id of the attempt that holds (or held) `version` of the task: what
    /// [`rules::granted`] compares a lease's attempt id with. (A claim here
    /// cannot be undone once it answered, so it is always the lease's own;
    /// the check is the one every backend shares.)
    fn recorded_attempt(&self, id: TaskId, version: u64) -> Option<AttemptId> {
        self.attempts
            .get(&id)
            .and_then(|a| a.iter().find(|a| u64::from(a.number) == version))
            .map(|a| a.id)
    }

    /// The attempt that holds (or held) `version` of the task.
    fn attempt_mut(&mut self, id: TaskId, version: u64) -> Option<&mut Attempt> {
        self.attempts
            .get_mut(&id)
            .and_then(|a| a.iter_mut().find(|a| u64::from(a.number) == version))
    }

    /// Ends the attempt that holds `version` of the task.
    fn finish_attempt(
        &mut self,
        id: TaskId,
        version: u64,
        outcome: AttemptOutcome,
        now: OffsetDateTime,
        error: Option<&str>,
    ) {
        if let Some(attempt) = self.attempt_mut(id, version)
            && attempt.finished_at.is_none()
        {
            attempt.finished_at = Some(now);
            attempt.outcome = outcome;
            attempt.error = error.map(str::to_owned);
        }
    }

    /// The load of concurrency key `key` at `now`, for [`rules::admit`].
    fn key_load(&self, key: &str, now: OffsetDateTime) -> rules::KeyLoad {
        rules::KeyLoad::of(
            self.keyed
                .get(key)
                .into_iter()
                .flat_map(BTreeMap::values)
                .map(|id| &self.tasks[id]),
            now,
        )
    }

    /// The task's limits at `now` ([`rules::within_limits`]): the name of
    /// its bucket and the bucket's new schedule, to store with the claim,
    /// or why not.
    fn admit(&self, task: &Task, now: OffsetDateTime) -> Result<Option<(String, OffsetDateTime)>, Throttled> {
        let load = match &task.limits.concurrency {
            Some(key) => self.key_load(key.name(), now),
            None => rules::KeyLoad::default(),
        };
        let bucket = task.limits.bucket.as_ref();
        let schedule =
            rules::within_limits(task, &load, bucket.and_then(|name| self.buckets.get(name)), now)?;
        Ok(bucket.cloned().zip(schedule))
    }

    /// [`rules::claim`] of task `id` at `now`, applied, within the task's limits.
    fn claim(&mut self, id: TaskId, request: ClaimRequest, now: OffsetDateTime) -> Claim {
        let Some(task) = self.tasks.get(&id) else {
            return Claim::NotFound;
        };
        let previous = task.version;
        match rules::claim(task, now) {
            ClaimRule::Answer(claim) => claim,
            ClaimRule::Exhaust(reason) => {
                self.finish_attempt(id, previous, AttemptOutcome::Expired, now, None);
                Claim::Failed(self.make_terminal(id, Status::Failed, now, Some(reason.as_str().to_owned())))
            }
            ClaimRule::Take => {
                match self.admit(task, now) {
                    Err(why) => return Claim::Throttled(why),
                    Ok(Some((bucket, schedule))) => {
                        if let Some(state) = self.buckets.get_mut(&bucket) {
                            state.schedule = Some(schedule);
                        }
                    }
                    Ok(None) => {}
                }
                self.finish_attempt(id, previous, AttemptOutcome::Expired, now, None);
                let expires_at = now + request.lease_duration;
                let task = self.task_mut(id);
                rules::taken(task, expires_at);
                let task = task.clone();
                let attempt_id = AttemptId::new();
                self.attempts.entry(id).or_default().push(Attempt {
                    id: attempt_id,
                    task_id: id,
                    number: task.attempts(),
                    worker: request.worker.clone(),
                    started_at: now,
                    finished_at: None,
                    outcome: AttemptOutcome::Running,
                    operation_id: None,
                    error: None,
                });
                Claim::Acquired(new_lease(task, attempt_id, request.worker, expires_at))
            }
        }
    }

    fn make_terminal(
        &mut self,
        id: TaskId,
        status: Status,
        now: OffsetDateTime,
        error: Option<String>,
    ) -> Task {
        let task = self.task_mut(id);
        rules::terminal(task, status, now, error);
        task.clone()
    }
}

#[async_trait]
impl Backend for MemoryStore {
    async fn submit(&self, new: NewTask) -> Result<Submitted> {
        let mut state = self.lock();
        if let Some(&existing) = state.keys.get(&new.key) {
            let task = &state.tasks[&existing];
            if task.input_hash != new.input_hash {
                return Err(Error::KeyConflict { existing });
            }
            return Ok(Submitted::Existing(task.clone()));
        }
        if let Some(bucket) = new
            .limits
            .bucket
            .as_ref()
            .filter(|b| !state.buckets.contains_key(*b))
        {
            return Err(InvalidInput::UnknownBucket {
                bucket: bucket.clone(),
            }
            .into());
        }
        let now = self.now();
        let key = new.key.clone();
        let expires_at = now + new.retention;
        let task = new_task(TaskId::new(), new, now, expires_at);
        tracing::Span::current().record("task_id", tracing::field::display(task.id));
        state.keys.insert(key, task.id);
        if let Some(concurrency) = &task.limits.concurrency {
            let order = state.submitted;
            state
                .keyed
                .entry(concurrency.name().to_owned())
                .or_default()
                .insert(order, task.id);
        }
        state.submitted += 1;
        state.tasks.insert(task.id, task.clone());
        Ok(Submitted::Created(task))
    }

    async fn get(&self, id: TaskId) -> Result<Option<Task>> {
        Ok(self.lock().tasks.get(&id).cloned())
    }

    async fn find(&self, key: &RequestKey) -> Result<Option<Task>> {
        let state = self.lock();
        Ok(state.keys.get(key).map(|id| state.tasks[id].clone()))
    }

    async fn claim(&self, id: TaskId, request: ClaimRequest) -> Result<Claim> {
        let mut state = self.lock();
        let claim = state.claim(id, request, self.now());
        if let Claim::Acquired(lease) = &claim {
            let span = tracing::Span::current();
            span.record("version", lease.version());
            span.record("attempt_id", tracing::field::display(lease.attempt_id()));
        }
        Ok(claim)
    }

    async fn claim_next(&self, request: ClaimNext) -> Result<Vec<Lease>> {
        let mut state = self.lock();
        let now = self.now();
        let due: Vec<(&Task, OffsetDateTime)> = state
            .tasks
            .values()
            .filter(|task| rules::wanted(&request, task))
            .filter_map(|task| rules::due_since(task, now).map(|since| (task, since)))
            .collect();
        let offered: Vec<TaskId> = rules::fair_order(&due).into_iter().map(|i| due[i].0.id).collect();
        let claim = request.request();
        // A task refused for a limit is skipped and takes no place in the
        // batch: the fetch goes on to the next key's task.
        Ok(offered
            .into_iter()
            .map(|id| state.claim(id, claim.clone(), now))
            .filter(|claim| !matches!(claim, Claim::Throttled(_)))
            .take(request.limit)
            .filter_map(|claim| match claim {
                Claim::Acquired(lease) => Some(lease),
                _ => None,
            })
            .collect())
    }

    async fn renew(&self, lease: &mut Lease, extend_by: Duration) -> Result<Fenced<()>> {
        let outcome = self.fenced(lease, |state, now| {
            let until = now + extend_by;
            state.task_mut(lease.task_id()).lease_until = Some(until);
            until
        })?;
        Ok(match outcome {
            Fenced::Accepted(until) => {
                renewed(lease, until);
                Fenced::Accepted(())
            }
            Fenced::Rejected(r) => Fenced::Rejected(r),
        })
    }

    async fn complete(&self, lease: Lease, response: Response) -> Result<Fenced<Task>> {
        self.checked(rules::accept, &lease, |state, now| {
            let id = lease.task_id();
            let current = state.task_mut(id).version;
            if current != lease.version() {
                // First valid answer from an earlier attempt: the current one is overtaken.
                state.finish_attempt(id, current, AttemptOutcome::Overtaken, now, None);
            }
            // Also when the attempt was closed as expired at a takeover: its answer is the one saved.
            if let Some(attempt) = state.attempt_mut(id, lease.version()) {
                (attempt.finished_at, attempt.outcome) = (Some(now), AttemptOutcome::Completed);
            }
            state.task_mut(id).response = Some(response);
            state.make_terminal(id, Status::Completed, now, None)
        })
    }

    async fn fail(&self, lease: Lease, failure: Failure) -> Result<Fenced<Retry>> {
        self.fenced(&lease, |state, now| {
            let id = lease.task_id();
            state.finish_attempt(
                id,
                lease.version(),
                AttemptOutcome::Failed(failure.kind),
                now,
                Some(&failure.message),
            );
            let task = state.task_mut(id);
            match rules::after_failure(task, lease.attempt_id(), &failure, now) {
                Ok(not_before) => {
                    rules::retrying(task, not_before, failure.message);
                    Retry::Scheduled {
                        not_before,
                        attempts_left: task.attempts_left(),
                    }
                }
                Err(reason) => Retry::Exhausted(Box::new(state.make_terminal(
                    id,
                    Status::Failed,
                    now,
                    Some(reason.message(&failure.message)),
                ))),
            }
        })
    }

    async fn release(&self, lease: Lease) -> Result<Fenced<()>> {
        self.release_as(lease, Work::Started)
    }

    async fn release_unstarted(&self, lease: Lease) -> Result<Fenced<()>> {
        self.release_as(lease, Work::NotStarted)
    }

    async fn cancel(&self, id: TaskId, reason: &str) -> Result<Fenced<Task>> {
        let mut state = self.lock();
        let now = self.now();
        let task = state.tasks.get(&id).ok_or(Error::NotFound(id))?;
        Ok(match rules::cancel(task) {
            CancelRule::Answer(answer) => answer,
            CancelRule::Cancel => {
                let version = task.version;
                state.finish_attempt(id, version, AttemptOutcome::Cancelled, now, None);
                Fenced::Accepted(state.make_terminal(id, Status::Cancelled, now, Some(reason.to_owned())))
            }
        })
    }

    async fn record_operation(&self, lease: &Lease, operation_id: &str) -> Result<Fenced<()>> {
        self.fenced(lease, |state, _now| {
            if let Some(attempt) = state
                .attempts
                .get_mut(&lease.task_id())
                .and_then(|a| a.iter_mut().find(|a| a.id == lease.attempt_id()))
            {
                attempt.operation_id = Some(operation_id.to_owned());
            }
        })
    }

    async fn attempts(&self, id: TaskId) -> Result<Vec<Attempt>> {
        Ok(self.lock().attempts.get(&id).cloned().unwrap_or_default())
    }

    async fn begin_effect(&self, lease: &Lease, name: &str) -> Result<Fenced<EffectStart>> {
        self.fenced(lease, |state, now| {
            let journal = state.effects.entry(lease.task_id()).or_default();
            match rules::begin_effect(journal.get(name), lease, name, now) {
                BeginEffectRule::Write { effect, start } => {
                    journal.insert(name.to_owned(), effect);
                    start
                }
                BeginEffectRule::Answer(start) => start,
            }
        })
    }

    async fn finish_effect(
        &self,
        lease: &Lease,
        name: &str,
        outcome: EffectOutcome,
    ) -> Result<Fenced<Effect>> {
        let settled = self.fenced(lease, |state, now| {
            let journal = state.effects.entry(lease.task_id()).or_default();
            match rules::finish_effect(journal.get(name), lease, name, &outcome, now)? {
                FinishEffectRule::Write(effect) => {
                    journal.insert(name.to_owned(), effect.clone());
                    Ok(effect)
                }
                FinishEffectRule::Answer(effect) => Ok(effect),
            }
        })?;
        match settled {
            Fenced::Accepted(effect) => effect.map(Fenced::Accepted),
            Fenced::Rejected(rejection) => Ok(Fenced::Rejected(rejection)),
        }
    }

    async fn effects(&self, id: TaskId) -> Result<Vec<Effect>> {
        Ok(self
            .lock()
            .effects
            .get(&id)
            .map(|journal| journal.values().cloned().collect())
            .unwrap_or_default())
    }

    async fn reopen(&self, id: TaskId, request: ReopenRequest) -> Result<Fenced<Task>> {
        let mut state = self.lock();
        let now = self.now();
        let task = state.tasks.get(&id).ok_or(Error::NotFound(id))?;
        if let ReopenRule::Answer(rejection) = rules::reopen(task) {
            return Ok(Fenced::Rejected(rejection));
        }
        let (from, version, policy) = (task.status, task.version, request.policy_for(&task.policy));
        let reopenings = state.reopenings.entry(id).or_default();
        reopenings.push(Reopening {
            task_id: id,
            number: reopenings.len() as u32 + 1,
            at: now,
            by: request.by,
            reason: request.reason,
            from,
            version,
        });
        let task = state.task_mut(id);
        rules::reopened(task, now, policy);
        Ok(Fenced::Accepted(task.clone()))
    }

    async fn due(&self, limit: usize) -> Result<Vec<TaskId>> {
        let state = self.lock();
        let now = self.now();
        let mut due: Vec<(OffsetDateTime, TaskId)> = state
            .tasks
            .values()
            .filter_map(|t| {
                match t.status {
                    Status::Pending => t.not_before.filter(|at| *at <= now),
                    Status::Running => t.lease_until.filter(|at| *at <= now),
                    _ => None,
                }
                .map(|at| (at, t.id))
            })
            .collect();
        due.sort_unstable();
        Ok(due.into_iter().take(limit).map(|(_, id)| id).collect())
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64> {
        let mut state = self.lock();
        let now = self.now();
        let expired: Vec<(RequestKey, TaskId)> = state
            .tasks
            .values()
            .filter(|t| t.status.is_terminal() && t.expires_at <= now)
            .take(limit)
            .map(|t| (t.key.clone(), t.id))
            .collect();
        for (key, id) in &expired {
            if let Some(concurrency) = &state.tasks[id].limits.concurrency {
                let name = concurrency.name().to_owned();
                if let Some(tasks) = state.keyed.get_mut(&name) {
                    tasks.retain(|_, task| task != id);
                    if tasks.is_empty() {
                        state.keyed.remove(&name);
                    }
                }
            }
            state.keys.remove(key);
            state.tasks.remove(id);
            state.attempts.remove(id);
            state.reopenings.remove(id);
            state.effects.remove(id);
        }
        Ok(expired.len() as u64)
    }

    fn decides_limits(&self) -> bool {
        true
    }

    async fn define_bucket(&self, bucket: RateBucket) -> Result<()> {
        let mut state = self.lock();
        let name = bucket.name().to_owned();
        let schedule = state.buckets.get(&name).and_then(|held| held.schedule);
        state.buckets.insert(name, BucketState { bucket, schedule });
        Ok(())
    }

    async fn drain_bucket(&self, name: &str, retry_after: Duration) -> Result<Option<BucketState>> {
        let mut state = self.lock();
        let until = self.now() + retry_after;
        Ok(state.buckets.get_mut(name).map(|held| {
            held.schedule = Some(rules::drain(&held.bucket, held.schedule, until));
            held.clone()
        }))
    }
}

#[async_trait]
impl InspectBackend for MemoryStore {
    async fn list(&self, query: &TaskQuery) -> Result<Page> {
        let state = self.lock();
        let mut tasks: Vec<&Task> = state
            .tasks
            .values()
            .filter(|t| query.matches(t) && query.is_after_cursor(t.id))
            .collect();
        tasks.sort_unstable_by_key(|t| t.id);
        if query.order == Order::NewestFirst {
            tasks.reverse();
        }
        let tasks = tasks
            .into_iter()
            .take(query.limit + 1)
            .map(TaskSummary::from)
            .collect();
        Ok(Page::from_overfetch(tasks, query.limit))
    }

    async fn depth(&self) -> Result<Vec<QueueDepth>> {
        let now = self.now();
        let state = self.lock();
        let live = state.tasks.values().filter(|t| !t.status.is_terminal());
        let live: Vec<TaskSummary> = live.map(TaskSummary::from).collect();
        Ok(QueueDepth::tally(&live, now))
    }

    async fn counts(&self, scope: Option<&str>) -> Result<Counts> {
        let mut counts = Counts::default();
        for task in self.lock().tasks.values() {
            if scope.is_none_or(|s| task.key.scope == s) {
                counts.add(task.status, 1);
            }
        }
        Ok(counts)
    }

    async fn counts_up_to(&self, scope: Option<&str>, cap: u64) -> Result<CappedCounts> {
        let exact = InspectBackend::counts(self, scope).await?;
        let mut counts = CappedCounts::default();
        for status in STATUSES {
            counts.set(status, Count::up_to(exact.get(status).min(cap), cap));
        }
        Ok(counts)
    }

    async fn story(&self, id: TaskId) -> Result<Option<Story>> {
        let state = self.lock();
        Ok(state.tasks.get(&id).map(|task| Story {
            task: task.clone(),
            attempts: state.attempts.get(&id).cloned().unwrap_or_default(),
            reopenings: state.reopenings.get(&id).cloned().unwrap_or_default(),
            handoffs: Vec::new(),
            effects: state
                .effects
                .get(&id)
                .map(|journal| journal.values().cloned().collect())
                .unwrap_or_default(),
        }))
    }

    async fn stranded(&self, older_than: Duration, limit: usize) -> Result<Vec<TaskSummary>> {
        let state = self.lock();
        let cutoff = self.now() - older_than;
        let mut stranded: Vec<TaskSummary> = state
            .tasks
            .values()
            .map(TaskSummary::from)
            .filter(|t| rules::stranded(t, cutoff))
            .collect();
        stranded.sort_unstable_by_key(|t| (t.created_at, t.id));
        stranded.truncate(limit);
        Ok(stranded)
    }

    async fn buckets(&self) -> Result<Vec<BucketState>> {
        Ok(self.lock().buckets.values().cloned().collect())
    }

    async fn concurrency(&self, key: &str) -> Result<KeySlots> {
        let state = self.lock();
        let now = self.now();
        let mut slots = KeySlots {
            key: key.to_owned(),
            running: Vec::new(),
            waiting: 0,
        };
        for task in state
            .keyed
            .get(key)
            .into_iter()
            .flat_map(BTreeMap::values)
            .map(|id| &state.tasks[id])
        {
            if rules::holds_slot(task, now) {
                slots.running.push(task.id);
            } else if task.status == Status::Pending {
                slots.waiting += 1;
            }
        }
        Ok(slots)
    }
}
