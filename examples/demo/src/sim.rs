//! The chat reply pipeline under fire: an API that submits reply tasks, an
//! at-least-once [queue](crate::queue), workers that claim, call a simulated
//! LLM and complete, and the faults of the [plan] injected on
//! purpose. One event loop drives it all in simulated time, so a run on the
//! virtual timebase is a pure function of its [`Config`].
//!
//! The simulation decides nothing about correctness: every "may I work on
//! this", "is it done" and "is this the answer" goes to the [`TaskStore`].

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use taskfence::policy::{FailureKind, OnAmbiguous};
use taskfence::{
    Claim, ClaimRequest, Error, Failure, Fenced, InputHash, Lease, NewTask, Rejection, RequestKey, Response,
    Retry, RetryPolicy, Status, Submitted, TaskId, TaskStore,
};

use crate::plan::{self, AttemptFault, SHOWCASE, TaskPlan};
use crate::queue::{Delivery, Queue, Wakeup};
use crate::report::{self, Summary, Timeline};
use crate::timebase::Timebase;

/// The lease a worker asks for.
pub const LEASE: Duration = Duration::from_secs(30);
/// The queue's visibility timeout: a little longer than the lease, so a
/// redelivered message finds the previous lease expired.
pub const VISIBILITY: Duration = Duration::from_secs(40);
/// How often a worker renews its lease during a long provider call: at half
/// its life, so one late renewal still finds it live.
pub const RENEW_EVERY: Duration = Duration::from_secs(15);
/// How long a crashed worker takes to come back.
pub const RESTART: Duration = Duration::from_secs(10);
/// The retry budget of every reply task.
pub const MAX_ATTEMPTS: u32 = 3;

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Reply tasks to create (Sends and Regenerates).
    pub tasks: usize,
    /// Workers taking messages from the queue.
    pub workers: usize,
    /// Seed of every random choice.
    pub seed: u64,
    /// Probability of each injected fault, `0.0..=1.0`.
    pub faults: f64,
    /// Which run on a durable store this is (`--sqlite`): run `n > 0` keys
    /// its tasks under `run-n/user-…`, beside the earlier runs' tasks. 0 (the
    /// default): `user-…`, for a store that starts empty.
    pub run: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            tasks: 200,
            workers: 4,
            seed: 42,
            faults: 0.1,
            run: 0,
        }
    }
}

impl Config {
    /// Checks the ranges the flags allow.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=1_000_000).contains(&self.tasks) {
            return Err(format!("--tasks must be in 1..=1000000, got {}", self.tasks));
        }
        if !(1..=1_000).contains(&self.workers) {
            return Err(format!("--workers must be in 1..=1000, got {}", self.workers));
        }
        if !(self.faults.is_finite() && (0.0..=1.0).contains(&self.faults)) {
            return Err(format!("--faults must be in 0.0..=1.0, got {}", self.faults));
        }
        Ok(())
    }
}

/// The retry budget stored with every task: a few attempts, exponential
/// backoff. Jitter is off because the store draws it from the random attempt
/// id, and the demo replays exactly from its seed.
pub fn policy(tb: &Timebase) -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(MAX_ATTEMPTS)
        .initial_backoff(tb.store_duration(Duration::from_secs(2)))
        .max_backoff(tb.store_duration(Duration::from_secs(30)))
        .multiplier(2.0)
        .jitter(0.0)
        .on_ambiguous(OnAmbiguous::Retry)
}

/// One task of the run: its plan, its id in the store, and every response
/// the store *accepted* for it (the invariant says at most one).
#[derive(Debug, Clone)]
pub struct TaskRecord {
    /// What was planned.
    pub plan: TaskPlan,
    /// The task's id (`None` if its submission failed, which is a violation).
    pub id: Option<TaskId>,
    /// Responses for which `complete` answered `Accepted`.
    pub accepted: Vec<Response>,
}

/// One call to the simulated provider, always made under an acquired claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderCall {
    /// The task (index into [`Outcome::tasks`]).
    pub task: usize,
    /// The assignment version the caller held.
    pub version: u64,
    /// Whether the provider answered (or failed).
    pub answered: bool,
}

/// A submission that reused a request key with different inputs.
#[derive(Debug, Clone)]
#[allow(
    dead_code,
    reason = "read by tests/demo.rs, which checks it against the store"
)]
pub struct ConflictRecord {
    /// The reused key.
    pub key: RequestKey,
    /// The different inputs it was sent with.
    pub input_hash: InputHash,
    /// The task the key belongs to (index into [`Outcome::tasks`]).
    pub original: usize,
    /// The task the store's `KeyConflict` named, if it rejected the submission.
    pub rejected_naming: Option<TaskId>,
}

/// Everything a run produced.
#[derive(Debug)]
pub struct Outcome {
    /// The counts and the invariant verdict.
    pub summary: Summary,
    /// The scripted conversation's story.
    pub timeline: Timeline,
    /// Every task, by index.
    #[allow(
        dead_code,
        reason = "read by tests/demo.rs, which checks it against the store"
    )]
    pub tasks: Vec<TaskRecord>,
    /// Every provider call.
    #[allow(
        dead_code,
        reason = "read by tests/demo.rs, which checks it against the store"
    )]
    pub provider_calls: Vec<ProviderCall>,
    /// Every conflicting submission.
    #[allow(
        dead_code,
        reason = "read by tests/demo.rs, which checks it against the store"
    )]
    pub conflicts: Vec<ConflictRecord>,
    /// Simulated time the run took.
    pub simulated: Duration,
}

/// Runs the demo on `store`, with time from `tb` (the store must read the
/// same clock). `progress` is told how many tasks have reached a final state.
pub async fn run(
    config: &Config,
    store: Arc<dyn TaskStore>,
    tb: Timebase,
    progress: &mut dyn FnMut(u64),
) -> Result<Outcome, Error> {
    let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
    let plans = plan::workload(config, &mut rng);
    let mut sim = Sim {
        store,
        policy: policy(&tb),
        tb,
        rng,
        ids: vec![None; plans.len()],
        accepted: vec![Vec::new(); plans.len()],
        delivered: vec![false; plans.len()],
        finished: vec![false; plans.len()],
        plans,
        index_of: HashMap::new(),
        events: BinaryHeap::new(),
        seq: 0,
        queue: Queue::default(),
        workers: vec![Worker::Idle; config.workers],
        calls: Vec::new(),
        conflicts: Vec::new(),
        summary: Summary::default(),
        timeline: Timeline::default(),
        anomalies: Vec::new(),
        progress,
        done: 0,
    };
    sim.run().await?;
    let simulated = sim.tb.now();
    let tasks: Vec<TaskRecord> = sim
        .plans
        .into_iter()
        .zip(sim.ids)
        .zip(sim.accepted)
        .map(|((plan, id), accepted)| TaskRecord { plan, id, accepted })
        .collect();
    let mut summary = sim.summary;
    summary.conversations = tasks.last().map_or(0, |t| t.plan.conversation as u64);
    report::verify(&*sim.store, &tasks, &sim.calls, &mut summary, sim.anomalies).await?;
    let mut timeline = sim.timeline;
    report::conversation_view(&*sim.store, &tasks, SHOWCASE, &mut timeline, simulated).await?;
    Ok(Outcome {
        summary,
        timeline,
        tasks,
        provider_calls: sim.calls,
        conflicts: sim.conflicts,
        simulated,
    })
}

#[derive(Debug)]
enum Event {
    /// The user presses Send or Regenerate (task index).
    Press(usize),
    /// The browser resends a submission whose reply it never got.
    Resend(usize),
    /// A queue message may become visible.
    Wake(Wakeup),
    /// A worker's provider call returns (worker, job).
    ProviderReturned(usize, u64),
    /// A worker's heartbeat: renew the lease of the job if still on it (worker, job).
    Renew(usize, u64),
    /// A paused worker runs again.
    Resume(usize),
    /// A crashed worker is back.
    Restart(usize),
}

/// An event due at `at`; events due at the same instant run in the order
/// they were scheduled, which keeps a run reproducible.
#[derive(Debug)]
struct Scheduled {
    at: Duration,
    seq: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Scheduled {}

impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

#[derive(Debug, Clone)]
enum Worker {
    Idle,
    Calling(Job),
    Paused(Job),
    Down,
}

#[derive(Debug, Clone)]
struct Job {
    /// Tells this attempt's timers from a later job's on the same worker.
    id: u64,
    delivery: Delivery,
    lease: Lease,
    /// What the provider will have returned: the answer, or the failure kind.
    answer: Result<String, FailureKind>,
}

struct Sim<'p> {
    store: Arc<dyn TaskStore>,
    policy: RetryPolicy,
    tb: Timebase,
    rng: ChaCha8Rng,
    plans: Vec<TaskPlan>,
    ids: Vec<Option<TaskId>>,
    index_of: HashMap<TaskId, usize>,
    accepted: Vec<Vec<Response>>,
    delivered: Vec<bool>,
    finished: Vec<bool>,
    events: BinaryHeap<Reverse<Scheduled>>,
    seq: u64,
    queue: Queue,
    workers: Vec<Worker>,
    calls: Vec<ProviderCall>,
    conflicts: Vec<ConflictRecord>,
    summary: Summary,
    timeline: Timeline,
    anomalies: Vec<String>,
    progress: &'p mut dyn FnMut(u64),
    done: u64,
}

fn worker_name(w: usize) -> String {
    format!("worker-{}", w + 1)
}

/// A short form of a simulated instant for the timeline.
struct At(Duration);

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t+{:.1}s", self.0.as_secs_f64())
    }
}

impl Sim<'_> {
    async fn run(&mut self) -> Result<(), Error> {
        for i in 0..self.plans.len() {
            self.push(self.plans[i].at, Event::Press(i));
        }
        // Every message is eventually deleted (every task ends: completed or out
        // of budget), so the loop drains. The bound only turns a bug into a report.
        let max_events = 200 * self.plans.len() as u64 + 10_000;
        let mut handled = 0u64;
        while let Some(Reverse(Scheduled { at, event, .. })) = self.events.pop() {
            self.tb.advance_to(at).await;
            self.handle(event).await?;
            self.dispatch().await?;
            handled += 1;
            if handled > max_events {
                self.anomalies
                    .push(format!("the run did not drain after {max_events} events"));
                break;
            }
        }
        let undeleted = self.queue.undeleted();
        if undeleted > 0 {
            self.anomalies
                .push(format!("{undeleted} queue messages were never deleted"));
        }
        Ok(())
    }

    fn now(&self) -> Duration {
        self.tb.now()
    }

    fn push(&mut self, at: Duration, event: Event) {
        self.seq += 1;
        let seq = self.seq;
        self.events.push(Reverse(Scheduled { at, seq, event }));
    }

    fn after(&mut self, delay: Duration, event: Event) {
        let at = self.now() + delay;
        self.push(at, event);
    }

    fn shown(&self, task: usize) -> bool {
        self.plans[task].conversation == SHOWCASE
    }

    fn log(&mut self, task: usize, actor: &str, text: impl Into<String>) {
        if self.shown(task) {
            let at = self.now();
            self.timeline.push(at, actor, text.into());
        }
    }

    fn label(&self, task: usize) -> &str {
        &self.plans[task].label
    }

    fn finish(&mut self, task: usize) {
        if !std::mem::replace(&mut self.finished[task], true) {
            self.done += 1;
            (self.progress)(self.done);
        }
    }

    fn new_task(&self, task: usize) -> NewTask {
        let plan = &self.plans[task];
        NewTask::new(plan.key.clone(), plan.input_hash())
            .payload(format!(
                "conversation {} message {}",
                plan.conversation, plan.message
            ))
            .policy(self.policy)
    }

    async fn handle(&mut self, event: Event) -> Result<(), Error> {
        match event {
            Event::Press(task) => self.press(task).await,
            Event::Resend(task) => self.resend(task).await,
            Event::Wake(wakeup) => {
                self.queue.wake(wakeup);
                Ok(())
            }
            Event::ProviderReturned(w, job) => self.provider_returned(w, job).await,
            Event::Renew(w, job) => self.renew(w, job).await,
            Event::Resume(w) => self.resume(w).await,
            Event::Restart(w) => {
                self.workers[w] = Worker::Idle;
                Ok(())
            }
        }
    }

    // ---- the API side -------------------------------------------------------

    async fn press(&mut self, task: usize) -> Result<(), Error> {
        if let Some(original) = self.plans[task].conflict_with {
            self.conflicting_submit(task, original).await?;
        }
        self.summary.submissions += 1;
        let plan = &self.plans[task];
        let what = match plan.regenerate_of {
            Some(_) => format!(
                "Regenerate on message {} (new key {})",
                plan.message, plan.key.key
            ),
            None => format!("Send message {} (key {})", plan.message, plan.key.key),
        };
        let regenerate_of = plan.regenerate_of;
        let resend_after = plan.resend_after;
        let extra_copy_after = plan.extra_copy_after;
        match self.store.submit(self.new_task(task)).await? {
            Submitted::Created(created) => {
                self.summary.tasks_created += 1;
                self.ids[task] = Some(created.id);
                self.index_of.insert(created.id, task);
                let label = self.label(task).to_owned();
                match regenerate_of {
                    Some(of) => {
                        self.summary.regenerates += 1;
                        let previous = self.label(of).to_owned();
                        self.log(
                            task,
                            "client",
                            format!("{what} → new task {label}; same inputs as {previous}, but new work"),
                        );
                    }
                    None => self.log(task, "client", format!("{what} → task {label} created")),
                }
                let wakeup = self.queue.publish(task, false);
                self.push(self.now(), Event::Wake(wakeup));
                if let Some(after) = extra_copy_after {
                    let wakeup = self.queue.publish(task, true);
                    self.after(after, Event::Wake(wakeup));
                    let at = At(self.now() + after);
                    self.log(
                        task,
                        "queue",
                        format!("the handoff is published twice: an extra copy of {label} arrives at {at}"),
                    );
                }
            }
            Submitted::Existing(existing) => {
                self.anomalies.push(format!(
                    "{}: a fresh request key returned existing task {}",
                    self.label(task),
                    existing.id
                ));
            }
        }
        if let Some(after) = resend_after {
            self.after(after, Event::Resend(task));
        }
        Ok(())
    }

    async fn resend(&mut self, task: usize) -> Result<(), Error> {
        self.summary.submissions += 1;
        let label = self.label(task).to_owned();
        match self.store.submit(self.new_task(task)).await? {
            Submitted::Existing(existing) if Some(existing.id) == self.ids[task] => {
                self.summary.resends_deduplicated += 1;
                self.log(
                    task,
                    "client",
                    format!(
                        "network retry of Send {} (same key, same inputs) → existing {label} ({}, v{}), \
                         nothing written",
                        self.plans[task].message, existing.status, existing.version
                    ),
                );
            }
            other => self.anomalies.push(format!(
                "{label}: a resend with the same key and inputs was not deduplicated: {other:?}"
            )),
        }
        Ok(())
    }

    async fn conflicting_submit(&mut self, task: usize, original: usize) -> Result<(), Error> {
        self.summary.submissions += 1;
        let key = self.plans[original].key.clone();
        let input_hash = self.plans[task].input_hash();
        let submission = NewTask::new(key.clone(), input_hash).policy(self.policy);
        let result = self.store.submit(submission).await;
        let (label, original_label) = (self.label(task).to_owned(), self.label(original).to_owned());
        let message = self.plans[task].message;
        let rejected_naming = match result {
            Err(Error::KeyConflict { existing }) => {
                self.summary.conflicts_rejected += 1;
                let named = self
                    .index_of
                    .get(&existing)
                    .map_or("an unknown task", |&i| self.label(i));
                let text = format!(
                    "reuses {original_label}'s key {} for message {message} → KeyConflict (other inputs) naming \
                     {named}; nothing written",
                    key.key
                );
                self.log(task, "client", text);
                Some(existing)
            }
            Err(other) => return Err(other),
            Ok(submitted) => {
                self.anomalies.push(format!(
                    "{label}: reusing {original_label}'s key with other inputs was accepted: {submitted:?}"
                ));
                None
            }
        };
        self.conflicts.push(ConflictRecord {
            key,
            input_hash,
            original,
            rejected_naming,
        });
        Ok(())
    }

    // ---- the worker side ----------------------------------------------------

    async fn dispatch(&mut self) -> Result<(), Error> {
        while self.queue.has_ready() {
            let idle: Vec<usize> = (0..self.workers.len())
                .filter(|&w| matches!(self.workers[w], Worker::Idle))
                .collect();
            if idle.is_empty() {
                break;
            }
            let Some((delivery, wakeup)) = self.queue.receive() else {
                break;
            };
            let w = idle[self.rng.random_range(0..idle.len())];
            self.after(VISIBILITY, Event::Wake(wakeup));
            self.deliver(w, delivery).await?;
        }
        Ok(())
    }

    async fn deliver(&mut self, w: usize, delivery: Delivery) -> Result<(), Error> {
        let task = delivery.task;
        let (name, label) = (worker_name(w), self.label(task).to_owned());
        self.summary.deliveries += 1;
        let copy = if delivery.copy { "the extra copy, " } else { "" };
        let kind = if delivery.receives > 1 {
            self.summary.redeliveries += 1;
            if delivery.after_wait {
                format!(" ({copy}back after the wait it was hidden for)")
            } else {
                format!(" ({copy}redelivered: the visibility timeout ran out)")
            }
        } else if delivery.copy {
            self.summary.extra_copies_delivered += 1;
            " (the extra copy)".to_owned()
        } else if self.delivered[task] {
            " (its other message)".to_owned()
        } else {
            String::new()
        };
        self.delivered[task] = true;
        self.log(task, "queue", format!("delivers {label} to {name}{kind}"));
        let id = self.ids[task].expect("only created tasks are published");
        let request = ClaimRequest::new(name.clone(), self.tb.store_duration(LEASE));
        match self.store.claim(id, request).await? {
            Claim::Acquired(lease) => self.start_attempt(w, delivery, lease),
            Claim::Completed(_) => {
                self.summary.claims_completed += 1;
                self.queue.delete(delivery.receipt);
                self.log(
                    task,
                    &name,
                    format!("claim {label} → Completed: the saved reply comes back, no provider call; deletes the message"),
                );
            }
            Claim::Busy { until } => {
                self.summary.claims_busy += 1;
                let until = self.tb.simulated_at(until).max(self.now());
                self.hide_until(delivery, until);
                self.log(
                    task,
                    &name,
                    format!("claim {label} → Busy: another worker's lease runs until {}; message hidden until then", At(until)),
                );
            }
            Claim::Backoff { not_before } => {
                self.summary.claims_backoff += 1;
                let at = self.tb.simulated_at(not_before).max(self.now());
                self.hide_until(delivery, at);
                self.log(
                    task,
                    &name,
                    format!(
                        "claim {label} → Backoff until {}; message hidden until then",
                        At(at)
                    ),
                );
            }
            Claim::Failed(failed) => {
                self.summary.claims_failed += 1;
                self.queue.delete(delivery.receipt);
                self.finish(task);
                let why = failed.last_error.unwrap_or_default();
                self.log(
                    task,
                    &name,
                    format!("claim {label} → Failed ({why}); no provider call, deletes it"),
                );
            }
            Claim::Cancelled(_) | Claim::NotFound => {
                self.queue.delete(delivery.receipt);
                self.anomalies
                    .push(format!("{label}: claim found the task cancelled or missing"));
            }
            Claim::Throttled(why) => {
                self.queue.delete(delivery.receipt);
                self.anomalies
                    .push(format!("{label}: the demo's tasks name no limit, yet {why}"));
            }
        }
        Ok(())
    }

    fn hide_until(&mut self, delivery: Delivery, at: Duration) {
        if let Some(wakeup) = self.queue.change_visibility(delivery.receipt) {
            self.push(at, Event::Wake(wakeup));
        }
    }

    fn start_attempt(&mut self, w: usize, delivery: Delivery, lease: Lease) {
        let task = delivery.task;
        self.summary.attempts += 1;
        self.summary.provider_calls += 1;
        let version = lease.version();
        let plan = &self.plans[task];
        let answer = match plan.fault(lease.attempt()) {
            Some(AttemptFault::ProviderError(kind)) => Err(kind),
            _ => Ok(format!(
                "Answer to message {} of conversation {} (draft of attempt {version})",
                plan.message, plan.conversation
            )),
        };
        // Most answers take seconds; one in twenty is long and outlives the
        // lease, so the worker keeps it alive with renewals.
        let latency = plan.latency.unwrap_or_else(|| {
            let range = if self.rng.random_bool(0.05) {
                30_000..60_000
            } else {
                2_000..8_000
            };
            Duration::from_millis(self.rng.random_range(range))
        });
        self.calls.push(ProviderCall {
            task,
            version,
            answered: answer.is_ok(),
        });
        let text = format!(
            "claim {} → Acquired: assignment v{version} (attempt {} of {MAX_ATTEMPTS}), lease until {}; calls the provider",
            self.label(task),
            lease.attempt(),
            At(self.tb.simulated_at(lease.expires_at())),
        );
        self.log(task, &worker_name(w), text);
        self.seq += 1;
        let id = self.seq;
        self.workers[w] = Worker::Calling(Job {
            id,
            delivery,
            lease,
            answer,
        });
        self.after(latency, Event::ProviderReturned(w, id));
        if latency > RENEW_EVERY {
            self.after(RENEW_EVERY, Event::Renew(w, id));
        }
    }

    async fn provider_returned(&mut self, w: usize, id: u64) -> Result<(), Error> {
        if !matches!(&self.workers[w], Worker::Calling(job) if job.id == id) {
            return Ok(()); // the worker gave this attempt up when a renewal was refused
        }
        let Worker::Calling(job) = std::mem::replace(&mut self.workers[w], Worker::Idle) else {
            unreachable!("checked above");
        };
        let task = job.delivery.task;
        let (name, label, version) = (worker_name(w), self.label(task).to_owned(), job.lease.version());
        let text = match &job.answer {
            Ok(_) => format!("answers {label} v{version} for {name}"),
            Err(FailureKind::Ambiguous) => {
                format!("times out on {label} v{version}: it may have answered or not")
            }
            Err(_) => format!("fails {label} v{version}: 503 model overloaded"),
        };
        self.log(task, "provider", text);
        let answer = match job.answer.clone() {
            Err(kind) => return self.report_failure(w, job, kind).await,
            Ok(answer) => answer,
        };
        match self.plans[task].fault(job.lease.attempt()) {
            Some(AttemptFault::Crash) => {
                self.summary.crashes += 1;
                self.workers[w] = Worker::Down;
                self.after(RESTART, Event::Restart(w));
                self.log(
                    task,
                    &name,
                    "crashes before saving: the answer is lost; the message stays in flight",
                );
            }
            Some(AttemptFault::Pause(pause)) => {
                self.summary.pauses += 1;
                let expires = At(self.tb.simulated_at(job.lease.expires_at()));
                self.workers[w] = Worker::Paused(job);
                self.after(pause, Event::Resume(w));
                self.log(
                    task,
                    &name,
                    format!(
                        "stalls for {:.0}s (GC pause) holding the answer; its lease ends at {expires}",
                        pause.as_secs_f64()
                    ),
                );
            }
            fault => self.complete(w, job, answer, fault).await?,
        }
        Ok(())
    }

    /// The heartbeat of a long call: renew the lease and keep the message
    /// hidden. A paused or crashed worker sends none, which is how its lease
    /// runs out. A refused renewal means the task moved on: give up the attempt.
    async fn renew(&mut self, w: usize, id: u64) -> Result<(), Error> {
        let Worker::Calling(job) = &mut self.workers[w] else {
            return Ok(());
        };
        if job.id != id {
            return Ok(());
        }
        let (task, receipt, version) = (job.delivery.task, job.delivery.receipt, job.lease.version());
        let renewed = self
            .store
            .renew(&mut job.lease, self.tb.store_duration(LEASE))
            .await?;
        let expires = self.tb.simulated_at(job.lease.expires_at());
        let label = self.label(task).to_owned();
        match renewed {
            Fenced::Accepted(()) => {
                self.summary.renewals += 1;
                if let Some(wakeup) = self.queue.extend_visibility(receipt) {
                    self.after(VISIBILITY, Event::Wake(wakeup));
                }
                self.after(RENEW_EVERY, Event::Renew(w, id));
                let text = format!(
                    "renews {label} v{version} during a long answer → lease until {}",
                    At(expires)
                );
                self.log(task, &worker_name(w), text);
            }
            Fenced::Rejected(rejection) => {
                self.summary.renewals_rejected += 1;
                self.workers[w] = Worker::Idle;
                let text = format!(
                    "renew {label} v{version} → Rejected: {}; gives the attempt up",
                    describe(&rejection)
                );
                self.log(task, &worker_name(w), text);
            }
        }
        Ok(())
    }

    async fn resume(&mut self, w: usize) -> Result<(), Error> {
        let Worker::Paused(job) = std::mem::replace(&mut self.workers[w], Worker::Idle) else {
            unreachable!("only a paused worker resumes");
        };
        let task = job.delivery.task;
        let text = format!("wakes up and tries to save its v{} answer", job.lease.version());
        self.log(task, &worker_name(w), text);
        let answer = job.answer.clone().expect("a worker pauses only after an answer");
        self.complete(w, job, answer, None).await
    }

    async fn complete(
        &mut self,
        w: usize,
        job: Job,
        answer: String,
        fault: Option<AttemptFault>,
    ) -> Result<(), Error> {
        let task = job.delivery.task;
        let (name, label, version) = (worker_name(w), self.label(task).to_owned(), job.lease.version());
        let response = Response::from(answer);
        match self.store.complete(job.lease, response.clone()).await? {
            Fenced::Accepted(_) => {
                self.summary.saved_replies += 1;
                self.accepted[task].push(response.clone());
                self.finish(task);
                if fault == Some(AttemptFault::LostStoreAck) {
                    self.summary.lost_store_acks += 1;
                    self.log(
                        task,
                        &name,
                        format!("complete {label} v{version}: saved, but the store's reply is lost on the way back"),
                    );
                    let id = self.ids[task].expect("created");
                    let reread = self.store.get(id).await?;
                    let saved = reread.as_ref().is_some_and(|t| {
                        t.status == Status::Completed && t.response.as_ref() == Some(&response)
                    });
                    if !saved {
                        self.anomalies.push(format!(
                            "{label}: after an accepted complete the task is {reread:?}"
                        ));
                    }
                    self.log(
                        task,
                        &name,
                        format!("re-reads {label}: completed with its own answer → no second call; deletes the message"),
                    );
                } else {
                    self.log(
                        task,
                        &name,
                        format!("complete {label} v{version} → Accepted: the reply is saved, the conversation shows it"),
                    );
                }
                if fault == Some(AttemptFault::LostDelete) {
                    self.summary.lost_deletes += 1;
                    self.log(
                        task,
                        &name,
                        "deletes the message, but the delete is lost: the queue will deliver it again",
                    );
                } else {
                    self.queue.delete(job.delivery.receipt);
                }
            }
            Fenced::Rejected(rejection) => {
                self.summary.count_stale_completion(&rejection);
                let text = format!(
                    "late complete {label} v{version} → Rejected: {}; its answer is discarded",
                    describe(&rejection)
                );
                self.log(task, &name, text);
                if matches!(rejection, Rejection::AlreadyCompleted(_)) {
                    // Done: acknowledge (a no-op if the message has moved on to another receive).
                    self.queue.delete(job.delivery.receipt);
                }
            }
        }
        Ok(())
    }

    async fn report_failure(&mut self, w: usize, job: Job, kind: FailureKind) -> Result<(), Error> {
        let task = job.delivery.task;
        let (name, label, version) = (worker_name(w), self.label(task).to_owned(), job.lease.version());
        self.summary.provider_errors += 1;
        let failure = match kind {
            FailureKind::Ambiguous => Failure::ambiguous("provider timed out after the request was sent"),
            _ => Failure::retryable("provider returned 503"),
        };
        let what = if kind == FailureKind::Ambiguous {
            format!("fail {label} v{version} (ambiguous; chat policy: retry)")
        } else {
            format!("fail {label} v{version} (retryable)")
        };
        match self.store.fail(job.lease, failure).await? {
            Fenced::Accepted(Retry::Scheduled {
                not_before,
                attempts_left,
            }) => {
                let at = self.tb.simulated_at(not_before).max(self.now());
                self.hide_until(job.delivery, at);
                let text = format!(
                    "{what} → retry at {}, {attempts_left} left; message hidden till then",
                    At(at)
                );
                self.log(task, &name, text);
            }
            Fenced::Accepted(Retry::Exhausted(failed)) => {
                self.queue.delete(job.delivery.receipt);
                self.finish(task);
                let text = format!(
                    "{what} → Exhausted: {} attempts spent, the task is failed; deletes the message",
                    failed.attempts()
                );
                self.log(task, &name, text);
            }
            Fenced::Rejected(rejection) => {
                self.summary.stale_failures_rejected += 1;
                let text = format!("{what} → Rejected: {}", describe(&rejection));
                self.log(task, &name, text);
            }
        }
        Ok(())
    }
}

/// A rejection in words, naming the saved response's task state rather than dumping it.
pub fn describe(rejection: &Rejection) -> String {
    match rejection {
        Rejection::AlreadyCompleted(task) => format!("AlreadyCompleted (saved by v{})", task.version),
        Rejection::Superseded { current_version } => {
            format!("Superseded {{ current_version: {current_version} }}")
        }
        Rejection::LeaseExpired => "LeaseExpired".to_owned(),
        Rejection::NotRunning(status) => format!("NotRunning({status})"),
        other => other.to_string(),
    }
}
