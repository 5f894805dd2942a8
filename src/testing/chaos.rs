//! A chaos run of the effect journal: workers are killed between the
//! provider call and the completion, and the run counts what the provider
//! did.
//!
//! Each round claims up to `workers` tasks ([`claim_next`](TaskStore::claim_next))
//! and runs each in its own tokio task: begin the effect, call the
//! provider with the effect key, record the outcome, complete. A draw per
//! attempt kills some of those tasks for real (the runtime aborts them at
//! their next await) right **after the provider call** (before the outcome
//! is recorded) or right **after the outcome** (before the completion).
//! When a round claims nothing, the store's clock is moved past the lease,
//! so the killed attempts' tasks are taken over in the next.
//!
//! Two providers: one that honours idempotency keys (a repeated key is
//! answered with the first delivery and applies nothing), and one that
//! does not (every call applies). The report lets a test assert the
//! contract: with the first, every task's effect applied exactly once;
//! with the second, every repeated application is one that the journal
//! reported as ambiguous ([`Effect::ambiguous`](crate::effect::Effect::ambiguous)).
//!
//! ```
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)] async fn main() {
//! use taskfence::testing::chaos::{run, Chaos, Provider};
//! use taskfence::testing::MemoryFixture;
//! let report = run(&MemoryFixture::new(), Chaos { tasks: 20, ..Chaos::new(Provider::Idempotent) }).await;
//! assert_eq!(report.completed, 20);
//! assert_eq!(report.duplicate_effects, 0);
//! # }
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::backend::jitter_unit;
use crate::effect::{EffectOutcome, EffectStart};
use crate::policy::RetryPolicy;
use crate::store::{ClaimNext, Fenced, Lease, TaskStore};
use crate::task::{Response, Status, TaskId};
use crate::testing::Fixture;
use crate::testing::kit::{LEASE, OPERATION, new_task};

/// The effect every task of the run causes.
pub const EFFECT: &str = "notify-user";

/// How the provider treats the idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Provider {
    /// A repeated key gets the first delivery's answer and applies nothing.
    Idempotent,
    /// Every call applies (keys ignored).
    IgnoresKeys,
}

/// The run's settings.
///
/// ```
/// use taskfence::testing::chaos::{Chaos, Provider};
/// let chaos = Chaos { tasks: 500, ..Chaos::new(Provider::IgnoresKeys) };
/// assert!(chaos.kill_after_call + chaos.kill_after_outcome < 1.0);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Chaos {
    /// The provider.
    pub provider: Provider,
    /// Tasks submitted (each with one effect).
    pub tasks: usize,
    /// Tasks worked on at once (the largest round).
    pub workers: usize,
    /// Share of attempts killed right after the provider call.
    pub kill_after_call: f64,
    /// Share of attempts killed right after recording the outcome.
    pub kill_after_outcome: f64,
}

impl Chaos {
    /// 100 tasks, 8 at once, 25 % of attempts killed after the call and
    /// 15 % after the outcome.
    pub fn new(provider: Provider) -> Self {
        Self {
            provider,
            tasks: 100,
            workers: 8,
            kill_after_call: 0.25,
            kill_after_outcome: 0.15,
        }
    }
}

/// What the run saw.
///
/// ```
/// # fn f(r: taskfence::testing::chaos::Report) {
/// println!("{} kills, {} duplicate effects, {} reported ambiguous", r.kills_after_call + r.kills_after_outcome, r.duplicate_effects, r.ambiguous_reported);
/// # }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// Tasks completed (all of them, when the run ends).
    pub completed: usize,
    /// Attempts made (claims granted).
    pub attempts: usize,
    /// Attempts killed after the provider call, before the outcome was recorded.
    pub kills_after_call: usize,
    /// Attempts killed after the outcome, before the completion.
    pub kills_after_outcome: usize,
    /// Calls to the provider.
    pub provider_calls: usize,
    /// Effects the provider applied beyond the first per task.
    pub duplicate_effects: usize,
    /// The sum of [`Effect::ambiguous`](crate::effect::Effect::ambiguous)
    /// over the tasks: calls repeated after an intent with no outcome.
    pub ambiguous_reported: usize,
    /// Tasks whose duplicate effects outnumber their ambiguous reports (a
    /// silent duplicate): must be empty.
    pub silent_duplicates: Vec<TaskId>,
    /// Tasks whose effect the provider never applied: must be empty.
    pub never_applied: Vec<TaskId>,
}

impl Report {
    /// Panics unless the run kept the contract: every task completed and its
    /// effect applied; workers were killed at both points (so the run
    /// proved something); no duplicate effect with an idempotent provider;
    /// with one that ignores keys, every duplicate reported as ambiguous
    /// (none silent, and no ambiguity reported without a repeated call).
    ///
    /// ```
    /// # #[tokio::main(flavor = "multi_thread", worker_threads = 2)] async fn main() {
    /// use taskfence::testing::chaos::{run, Chaos, Provider};
    /// let chaos = Chaos { tasks: 30, ..Chaos::new(Provider::IgnoresKeys) };
    /// run(&taskfence::testing::MemoryFixture::new(), chaos).await.assert_contract(&chaos);
    /// # }
    /// ```
    pub fn assert_contract(&self, chaos: &Chaos) {
        let provider = chaos.provider;
        assert_eq!(
            self.completed, chaos.tasks,
            "{provider:?}: every task completed: {self:?}"
        );
        assert!(
            self.kills_after_call > 0 && self.kills_after_outcome > 0,
            "{provider:?}: the run killed workers at both points: {self:?}"
        );
        assert!(
            self.never_applied.is_empty(),
            "{provider:?}: every effect applied: {self:?}"
        );
        assert!(
            self.silent_duplicates.is_empty(),
            "{provider:?}: no silent duplicate: {self:?}"
        );
        match provider {
            Provider::Idempotent => assert_eq!(self.duplicate_effects, 0, "no duplicate effect: {self:?}"),
            Provider::IgnoresKeys => assert_eq!(
                self.duplicate_effects, self.ambiguous_reported,
                "each call repeated after a kill applied again and was reported: {self:?}"
            ),
        }
    }
}

/// The provider's books (and the kills, counted where they happen).
#[derive(Default)]
struct Books {
    applied: HashMap<TaskId, usize>,
    deliveries: HashMap<String, String>,
    calls: usize,
    kills_after_call: usize,
    kills_after_outcome: usize,
}

impl Books {
    /// One call of the provider with `key`: the delivery id it answers.
    fn call(&mut self, provider: Provider, task: TaskId, key: &str) -> String {
        self.calls += 1;
        if let (Provider::Idempotent, Some(first)) = (provider, self.deliveries.get(key)) {
            return first.clone();
        }
        *self.applied.entry(task).or_default() += 1;
        let delivery = format!("delivery-{}", self.calls);
        self.deliveries
            .entry(key.to_owned())
            .or_insert_with(|| delivery.clone());
        delivery
    }
}

/// Where an attempt is killed, drawn per attempt.
#[derive(Clone, Copy)]
enum Fate {
    Live,
    KilledAfterCall,
    KilledAfterOutcome,
}

/// How an attempt that was not killed ended.
enum Ended {
    Completed,
    Refused,
}

/// Runs the chaos on the fixture's store; panics on a store error or if
/// the run does not finish within `tasks × 20` rounds.
pub async fn run(f: &dyn Fixture, chaos: Chaos) -> Report {
    let store = f.store();
    let mut ids = Vec::with_capacity(chaos.tasks);
    for i in 0..chaos.tasks {
        let task = new_task(&format!("chaos-{:?}-{i}", chaos.provider))
            .policy(RetryPolicy::default().max_attempts(1000));
        ids.push(store.submit(task).await.expect("submit").task().id);
    }
    let books = Arc::new(Mutex::new(Books::default()));
    let mut report = Report::default();
    let mut rounds = 0;
    while report.completed < chaos.tasks {
        rounds += 1;
        assert!(
            rounds <= chaos.tasks * 20,
            "the chaos run did not finish: {report:?}"
        );
        let request = ClaimNext::new("chaos", LEASE, chaos.workers).operation(OPERATION);
        let leases = store.claim_next(request).await.expect("claim_next");
        if leases.is_empty() {
            // Only killed attempts hold leases now: let them expire.
            f.advance(LEASE + Duration::from_secs(1)).await;
            continue;
        }
        let mut round = Vec::with_capacity(leases.len());
        for lease in leases {
            report.attempts += 1;
            let draw = jitter_unit(lease.attempt_id());
            let fate = if draw < chaos.kill_after_call {
                Fate::KilledAfterCall
            } else if draw < chaos.kill_after_call + chaos.kill_after_outcome {
                Fate::KilledAfterOutcome
            } else {
                Fate::Live
            };
            let (store, books) = (store.clone(), books.clone());
            let (me_tx, me_rx) = tokio::sync::oneshot::channel::<tokio::task::AbortHandle>();
            let handle = tokio::spawn(async move {
                let me = me_rx.await.expect("own abort handle");
                attempt(&*store, lease, chaos.provider, &books, fate, &me).await
            });
            let _ = me_tx.send(handle.abort_handle());
            round.push(handle);
        }
        for handle in round {
            match handle.await {
                Ok(Ended::Completed) => report.completed += 1,
                Ok(Ended::Refused) => {}
                Err(killed) if killed.is_cancelled() => {}
                Err(panicked) => std::panic::resume_unwind(panicked.into_panic()),
            }
        }
    }
    let applied = {
        let books = books.lock().expect("books");
        report.provider_calls = books.calls;
        report.kills_after_call = books.kills_after_call;
        report.kills_after_outcome = books.kills_after_outcome;
        books.applied.clone()
    };
    report.completed = 0;
    for id in ids {
        let task = store.get(id).await.expect("get").expect("the task exists");
        report.completed += usize::from(task.status == Status::Completed);
        let applied = applied.get(&id).copied().unwrap_or(0);
        let effects = store.effects(id).await.expect("effects");
        let ambiguous: usize = effects.iter().map(|e| e.ambiguous as usize).sum();
        report.ambiguous_reported += ambiguous;
        report.duplicate_effects += applied.saturating_sub(1);
        if applied == 0 {
            report.never_applied.push(id);
        }
        if applied.saturating_sub(1) > ambiguous {
            report.silent_duplicates.push(id);
        }
    }
    report
}

/// One attempt: begin the effect, call, record, complete — killed by its
/// own abort handle where its fate says (the runtime drops it at the next
/// await, as a crash would: no further store call).
async fn attempt(
    store: &dyn TaskStore,
    lease: Lease,
    provider: Provider,
    books: &Mutex<Books>,
    fate: Fate,
    me: &tokio::task::AbortHandle,
) -> Ended {
    let kill = |count: fn(&mut Books) -> &mut usize| {
        *count(&mut books.lock().expect("books")) += 1;
        me.abort();
    };
    let start = store.begin_effect(&lease, EFFECT).await.expect("begin_effect");
    let Fenced::Accepted(start) = start else {
        return Ended::Refused;
    };
    match start {
        EffectStart::Call { key, .. } => {
            let delivery = books
                .lock()
                .expect("books")
                .call(provider, lease.task_id(), key.as_str());
            if let Fate::KilledAfterCall = fate {
                kill(|b| &mut b.kills_after_call);
                tokio::task::yield_now().await;
            }
            let recorded = store
                .finish_effect(&lease, EFFECT, EffectOutcome::done(delivery))
                .await
                .expect("finish_effect");
            if !recorded.is_accepted() {
                return Ended::Refused;
            }
            if let Fate::KilledAfterOutcome = fate {
                kill(|b| &mut b.kills_after_outcome);
                tokio::task::yield_now().await;
            }
        }
        EffectStart::Done(_) => {}
        EffectStart::Stop(effect) => panic!("the run's policy retries ambiguous effects: {effect:?}"),
    }
    match store
        .complete(lease, Response::from("sent"))
        .await
        .expect("complete")
    {
        Fenced::Accepted(_) => Ended::Completed,
        Fenced::Rejected(_) => Ended::Refused,
    }
}
