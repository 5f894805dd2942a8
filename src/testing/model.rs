//! A small reference model of the contract, and a runner that applies the
//! same random interleaving of operations to a real store and to the model,
//! comparing them after every step.
//!
//! The model is written independently of [`rules`](crate::backend::rules): it restates
//! the README's guarantees in the plainest form, so a bug shared by the rules
//! and a backend still shows up as a disagreement.
//!
//! [`model_suite!`](crate::testing::model_suite) draws the interleavings
//! ([`ops`]) and replays the kept counterexamples ([`regressions`]) for a
//! backend; [`run`] applies one interleaving.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use taskfence::testing::{model::{run, Op}, MemoryFixture};
//! let ops = [Op::Submit { key: 0, input: 0 }, Op::Claim { worker: 0, task: 0 }, Op::Complete { worker: 0 }];
//! run(&MemoryFixture::new(), &ops).await;
//! # }
//! ```

use std::future::Future;
use std::time::Duration;

use proptest::prelude::*;

use super::Fixture;
use crate::error::Error;
use crate::policy::{Failure, FailureKind, RetryPolicy};
use crate::store::{Claim, ClaimRequest, Fenced, Lease, Rejection, Retry};
use crate::task::{InputHash, NewTask, RequestKey, Response, Status, TaskId};

/// How many simulated workers the model has.
pub const WORKERS: usize = 3;
/// The lease every claim asks for.
pub const LEASE: Duration = Duration::from_secs(10);
/// Attempts each task may get.
pub const MAX_ATTEMPTS: u32 = 3;
/// Retention of every dedup record.
pub const RETENTION: Duration = Duration::from_secs(120);
/// The limit of every `claim_next`: above any number of tasks an
/// interleaving submits, so which tasks it takes never depends on their order.
pub const NEXT_LIMIT: usize = 1000;

/// The policy of every task: no jitter, so the model can predict each delay.
pub fn policy() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(MAX_ATTEMPTS)
        .initial_backoff(Duration::from_secs(2))
        .multiplier(2.0)
        .max_backoff(Duration::from_secs(5))
        .jitter(0.0)
}

/// One step of an interleaving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Submit request key number `key` (of a few) with input number `input`.
    Submit {
        /// Which key.
        key: u8,
        /// Which inputs.
        input: u8,
    },
    /// Worker claims task number `task` (modulo the tasks submitted so far).
    Claim {
        /// Which worker.
        worker: u8,
        /// Which task.
        task: u8,
    },
    /// Worker asks the store for every task that needs a worker
    /// (`claim_next`), keeping the first lease it gets.
    ClaimNext {
        /// Which worker.
        worker: u8,
    },
    /// Worker renews the lease it holds.
    Renew {
        /// Which worker.
        worker: u8,
    },
    /// Worker completes with its own answer.
    Complete {
        /// Which worker.
        worker: u8,
    },
    /// Worker reports a failure.
    Fail {
        /// Which worker.
        worker: u8,
        /// Permanent instead of retryable.
        permanent: bool,
    },
    /// Worker gives the task back after its work began (the attempt counts).
    Release {
        /// Which worker.
        worker: u8,
    },
    /// Worker gives the task back before its work began (the claim is refunded).
    ReleaseUnstarted {
        /// Which worker.
        worker: u8,
    },
    /// Worker records a provider operation id.
    RecordOperation {
        /// Which worker.
        worker: u8,
    },
    /// Cancel task number `task`.
    Cancel {
        /// Which task.
        task: u8,
    },
    /// The store's clock moves forward by this many seconds.
    Advance {
        /// Seconds.
        secs: u8,
    },
    /// Purge expired dedup records.
    Purge,
    /// An operator reopens task number `task` with a fresh budget.
    Reopen {
        /// Which task.
        task: u8,
    },
}

#[derive(Debug, Clone)]
struct ModelTask {
    id: TaskId,
    key: u8,
    status: Status,
    version: u64,
    lease_until: Option<u64>,
    not_before: Option<u64>,
    response: Option<Response>,
    created: u64,
    /// The version when the current budget began (0 until a reopening),
    /// plus one per claim given back unstarted since.
    budget_base: u64,
    /// When the retention window last started (submission, or a reopening).
    retained_from: u64,
    purged: bool,
}

impl ModelTask {
    /// Attempts made in the current budget.
    fn spent(&self) -> u64 {
        self.version - self.budget_base
    }
}

/// The model: tasks by submission order, times in whole seconds since the start.
#[derive(Debug, Default)]
struct Model {
    now: u64,
    tasks: Vec<ModelTask>,
    held: [Option<Lease>; WORKERS],
}

fn request_key(key: u8) -> RequestKey {
    RequestKey::new("model", "chat.reply", format!("key-{key}"))
}

fn delay_after(attempt: u64) -> u64 {
    // 2 s doubling, capped at 5 s: restated, not computed by the policy code.
    [2, 4, 5].get(attempt as usize - 1).copied().unwrap_or(5)
}

/// A rejection as the model predicts it (the saved task inside `AlreadyCompleted` is checked separately).
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    AlreadyCompleted,
    Superseded(u64),
    NotRunning(Status),
    NotTerminal(Status),
    LeaseExpired,
    KeyReused(TaskId),
}

impl From<&Rejection> for Refusal {
    fn from(r: &Rejection) -> Self {
        match r {
            Rejection::AlreadyCompleted(_) => Refusal::AlreadyCompleted,
            Rejection::Superseded { current_version } => Refusal::Superseded(*current_version),
            Rejection::NotRunning(status) => Refusal::NotRunning(*status),
            Rejection::LeaseExpired => Refusal::LeaseExpired,
            Rejection::NotTerminal(status) => Refusal::NotTerminal(*status),
            Rejection::KeyReused { current } => Refusal::KeyReused(*current),
        }
    }
}

impl Model {
    /// Guarantee 5, restated: done first, then version, then status, then the lease.
    fn fence(&self, t: &ModelTask, version: u64) -> Option<Refusal> {
        if t.status == Status::Completed {
            Some(Refusal::AlreadyCompleted)
        } else if t.version != version {
            Some(Refusal::Superseded(t.version))
        } else if t.status != Status::Running {
            Some(Refusal::NotRunning(t.status))
        } else if t.lease_until.is_none_or(|u| u <= self.now) {
            Some(Refusal::LeaseExpired)
        } else {
            None
        }
    }

    fn index_of(&self, id: TaskId) -> usize {
        self.tasks.iter().position(|t| t.id == id).expect("known task")
    }
}

/// Applies `ops` to the fixture's store and to the model, panicking at the
/// first disagreement or broken invariant.
pub async fn run(fixture: &dyn Fixture, ops: &[Op]) {
    let mut runner = Runner {
        fixture,
        store: fixture.store(),
        m: Model::default(),
    };
    for (step, op) in ops.iter().copied().enumerate() {
        let ctx = format!("step {step}: {op:?}");
        runner.step(op, &ctx).await;
        check_state(&*runner.store, &runner.m, &ctx).await;
    }
}

/// The store under test and the model beside it: one method per operation,
/// each applying the operation to both and checking that they agree.
struct Runner<'f> {
    fixture: &'f dyn Fixture,
    store: std::sync::Arc<dyn crate::TaskStore>,
    m: Model,
}

impl Runner<'_> {
    async fn step(&mut self, op: Op, ctx: &str) {
        match op {
            Op::Submit { key, input } => self.submit(key, input, ctx).await,
            Op::Claim { worker, task } => self.claim(worker, task, ctx).await,
            Op::ClaimNext { worker } => self.claim_next(worker, ctx).await,
            Op::Renew { worker }
            | Op::Complete { worker }
            | Op::Fail { worker, .. }
            | Op::Release { worker }
            | Op::ReleaseUnstarted { worker }
            | Op::RecordOperation { worker } => self.fenced(op, worker, ctx).await,
            Op::Cancel { task } => self.cancel(task, ctx).await,
            Op::Advance { secs } => self.advance(secs).await,
            Op::Purge => self.purge(ctx).await,
            Op::Reopen { task } => self.reopen(task, ctx).await,
        }
    }

    async fn submit(&mut self, key: u8, input: u8, ctx: &str) {
        let m = &mut self.m;
        let new = NewTask::new(request_key(key), InputHash::of([vec![input]]))
            .policy(policy())
            .retention(RETENTION);
        let existing = m.tasks.iter().find(|t| t.key == key && !t.purged).cloned();
        let got = self.store.submit(new).await;
        match (existing, got) {
            (Some(t), Ok(s)) => {
                assert!(!s.is_created(), "{ctx}: a repeated key must not create");
                assert_eq!(s.task().id, t.id, "{ctx}");
                let bound = s.task().input_hash;
                assert_eq!(
                    bound,
                    InputHash::of([vec![input]]),
                    "{ctx}: existing only for the same inputs"
                );
            }
            (Some(t), Err(Error::KeyConflict { existing })) => assert_eq!(existing, t.id, "{ctx}"),
            (None, Ok(s)) => {
                assert!(s.is_created(), "{ctx}: a new key creates");
                m.tasks.push(ModelTask {
                    id: s.task().id,
                    key,
                    status: Status::Pending,
                    version: 0,
                    lease_until: None,
                    not_before: None,
                    response: None,
                    created: m.now,
                    budget_base: 0,
                    retained_from: m.now,
                    purged: false,
                });
            }
            (expected, got) => panic!("{ctx}: model had {expected:?}, store said {got:?}"),
        }
    }

    async fn claim(&mut self, worker: u8, task: u8, ctx: &str) {
        let m = &mut self.m;
        if m.tasks.is_empty() {
            return;
        }
        let i = task as usize % m.tasks.len();
        let now = m.now;
        let t = &mut m.tasks[i];
        let got = self
            .store
            .claim(t.id, ClaimRequest::new(format!("worker-{worker}"), LEASE))
            .await
            .unwrap_or_else(|e| panic!("{ctx}: {e}"));
        let live_lease = t.status == Status::Running && t.lease_until.is_some_and(|u| u > now);
        let backing_off = t.status == Status::Pending && t.not_before.is_some_and(|nb| nb > now);
        match got {
            Claim::NotFound => assert!(t.purged, "{ctx}: only purged tasks vanish"),
            Claim::Throttled(why) => panic!("{ctx}: the model's tasks name no limit, yet {why}"),
            Claim::Completed(done) => {
                assert_eq!(t.status, Status::Completed, "{ctx}");
                assert_eq!(done.response, t.response, "{ctx}: the saved response");
            }
            Claim::Cancelled(_) => assert_eq!(t.status, Status::Cancelled, "{ctx}"),
            Claim::Busy { .. } => assert!(live_lease, "{ctx}: busy only under a live lease"),
            Claim::Backoff { .. } => assert!(backing_off, "{ctx}: backoff only before not_before"),
            Claim::Failed(_) => {
                let exhausted = !t.status.is_terminal()
                    && !live_lease
                    && !backing_off
                    && t.spent() >= u64::from(MAX_ATTEMPTS);
                assert!(
                    t.status == Status::Failed || exhausted,
                    "{ctx}: failed only when terminal or spent"
                );
                t.status = Status::Failed;
                t.lease_until = None;
                t.not_before = None;
            }
            Claim::Acquired(lease) => {
                assert!(
                    !t.status.is_terminal()
                        && !live_lease
                        && !backing_off
                        && t.spent() < u64::from(MAX_ATTEMPTS),
                    "{ctx}: acquired a task that was {:?} v{}",
                    t.status,
                    t.version
                );
                t.version += 1;
                assert_eq!(lease.version(), t.version, "{ctx}: the version increments by one");
                t.status = Status::Running;
                t.lease_until = Some(now + LEASE.as_secs());
                t.not_before = None;
                m.held[worker as usize % WORKERS] = Some(lease);
            }
        }
    }

    /// `claim_next` with a limit above the number of tasks: every task that
    /// needs a worker (pending past its backoff, or its lease expired) is
    /// taken, or failed when its budget is spent; no other task changes.
    async fn claim_next(&mut self, worker: u8, ctx: &str) {
        let request = crate::store::ClaimNext::new(format!("worker-{worker}"), LEASE, NEXT_LIMIT);
        let leases = self
            .store
            .claim_next(request)
            .await
            .unwrap_or_else(|e| panic!("{ctx}: {e}"));
        let m = &mut self.m;
        let now = m.now;
        let mut expected = Vec::new();
        for t in m.tasks.iter_mut().filter(|t| !t.purged) {
            let needs_worker = match t.status {
                Status::Pending => t.not_before.is_none_or(|nb| nb <= now),
                Status::Running => t.lease_until.is_some_and(|u| u <= now),
                _ => false,
            };
            if !needs_worker {
                continue;
            }
            if t.spent() >= u64::from(MAX_ATTEMPTS) {
                (t.status, t.lease_until, t.not_before) = (Status::Failed, None, None);
                continue;
            }
            t.version += 1;
            (t.status, t.lease_until, t.not_before) = (Status::Running, Some(now + LEASE.as_secs()), None);
            expected.push((t.id, t.version));
        }
        let mut got: Vec<(TaskId, u64)> = leases.iter().map(|l| (l.task_id(), l.version())).collect();
        got.sort();
        expected.sort();
        assert_eq!(
            got, expected,
            "{ctx}: claim_next hands out exactly the tasks that need a worker"
        );
        if let Some(first) = leases.into_iter().next() {
            m.held[worker as usize % WORKERS] = Some(first);
        }
    }

    /// A fenced write with the lease `worker` holds: the store's verdict
    /// (accepted, or which rejection) must be the model's.
    async fn fenced(&mut self, op: Op, worker: u8, ctx: &str) {
        let slot = worker as usize % WORKERS;
        let Some(lease) = self.m.held[slot].clone() else {
            return;
        };
        let i = self.m.index_of(lease.task_id());
        if self.m.tasks[i].purged {
            return;
        }
        let expected = self.m.fence(&self.m.tasks[i], lease.version());
        let rejection = match op {
            Op::Renew { .. } => self.renew(slot, i, lease, ctx).await,
            Op::RecordOperation { .. } => self
                .store
                .record_operation(&lease, "op")
                .await
                .expect(ctx)
                .rejection()
                .cloned(),
            Op::Complete { .. } => self.complete(slot, i, lease, ctx).await,
            Op::Release { .. } => self.release(slot, i, lease, false, ctx).await,
            Op::ReleaseUnstarted { .. } => self.release(slot, i, lease, true, ctx).await,
            Op::Fail { permanent, .. } => self.fail(slot, i, lease, permanent, ctx).await,
            _ => unreachable!("not a fenced operation: {op:?}"),
        };
        assert_eq!(
            rejection.as_ref().map(Refusal::from),
            expected,
            "{ctx}: the store's verdict differs from the model's"
        );
    }

    async fn renew(&mut self, slot: usize, i: usize, mut lease: Lease, ctx: &str) -> Option<Rejection> {
        let got = self.store.renew(&mut lease, LEASE).await.expect(ctx);
        if got.is_accepted() {
            self.m.tasks[i].lease_until = Some(self.m.now + LEASE.as_secs());
            self.m.held[slot] = Some(lease);
        }
        got.rejection().cloned()
    }

    async fn complete(&mut self, slot: usize, i: usize, lease: Lease, ctx: &str) -> Option<Rejection> {
        let answer = Response::from(format!("answer of worker {slot} at v{}", lease.version()));
        let got = self.store.complete(lease, answer.clone()).await.expect(ctx);
        self.m.held[slot] = None;
        let t = &mut self.m.tasks[i];
        if got.is_accepted() {
            assert_eq!(t.response, None, "{ctx}: a second response would be saved");
            (t.status, t.response, t.lease_until) = (Status::Completed, Some(answer), None);
        }
        if let Fenced::Rejected(Rejection::AlreadyCompleted(done)) = &got {
            assert_eq!(done.response, t.response, "{ctx}: the first response");
        }
        got.rejection().cloned()
    }

    async fn release(
        &mut self,
        slot: usize,
        i: usize,
        lease: Lease,
        unstarted: bool,
        ctx: &str,
    ) -> Option<Rejection> {
        let got = if unstarted {
            self.store.release_unstarted(lease).await
        } else {
            self.store.release(lease).await
        }
        .expect(ctx);
        self.m.held[slot] = None;
        if got.is_accepted() {
            let t = &mut self.m.tasks[i];
            (t.status, t.lease_until, t.not_before) = (Status::Pending, None, Some(self.m.now));
            if unstarted {
                // Refunded: the version stays, the budget no longer counts the claim.
                t.budget_base += 1;
            }
        }
        got.rejection().cloned()
    }

    async fn fail(
        &mut self,
        slot: usize,
        i: usize,
        lease: Lease,
        permanent: bool,
        ctx: &str,
    ) -> Option<Rejection> {
        let kind = if permanent {
            FailureKind::Permanent
        } else {
            FailureKind::Retryable
        };
        let got = self
            .store
            .fail(lease, Failure::new(kind, "model failure"))
            .await
            .expect(ctx);
        self.m.held[slot] = None;
        let now = self.m.now;
        let t = &mut self.m.tasks[i];
        match &got {
            Fenced::Accepted(Retry::Scheduled { .. }) => {
                assert!(
                    !permanent && t.spent() < u64::from(MAX_ATTEMPTS),
                    "{ctx}: retry beyond the budget"
                );
                t.status = Status::Pending;
                t.lease_until = None;
                t.not_before = Some(now + delay_after(t.spent()));
            }
            Fenced::Accepted(Retry::Exhausted(_)) => {
                assert!(
                    permanent || t.spent() >= u64::from(MAX_ATTEMPTS),
                    "{ctx}: stopped within budget"
                );
                (t.status, t.lease_until) = (Status::Failed, None);
            }
            Fenced::Rejected(_) => {}
        }
        got.rejection().cloned()
    }

    async fn cancel(&mut self, task: u8, ctx: &str) {
        if self.m.tasks.is_empty() {
            return;
        }
        let i = task as usize % self.m.tasks.len();
        let t = &mut self.m.tasks[i];
        let got = self.store.cancel(t.id, "model cancel").await;
        if t.purged {
            assert!(matches!(got, Err(Error::NotFound(_))), "{ctx}: {got:?}");
            return;
        }
        let got = got.expect(ctx);
        match t.status {
            Status::Pending | Status::Running | Status::Cancelled => {
                assert!(got.is_accepted(), "{ctx}: {got:?}");
                (t.status, t.lease_until, t.not_before) = (Status::Cancelled, None, None);
            }
            Status::Completed => {
                assert!(matches!(got, Fenced::Rejected(Rejection::AlreadyCompleted(_))));
            }
            Status::Failed => {
                assert_eq!(got.rejection(), Some(&Rejection::NotRunning(Status::Failed)));
            }
        }
    }

    /// An operator's reopening: only failed and cancelled tasks reopen, with a
    /// fresh budget from the current version, due at once.
    async fn reopen(&mut self, task: u8, ctx: &str) {
        if self.m.tasks.is_empty() {
            return;
        }
        let i = task as usize % self.m.tasks.len();
        let now = self.m.now;
        let t = &mut self.m.tasks[i];
        let got = self
            .store
            .reopen(t.id, crate::store::ReopenRequest::new("model", "retry"))
            .await;
        if t.purged {
            assert!(matches!(got, Err(Error::NotFound(_))), "{ctx}: {got:?}");
            return;
        }
        let got = got.expect(ctx);
        match t.status {
            Status::Failed | Status::Cancelled => {
                assert!(got.is_accepted(), "{ctx}: {got:?}");
                t.status = Status::Pending;
                (t.lease_until, t.not_before) = (None, Some(now));
                (t.budget_base, t.retained_from) = (t.version, now);
            }
            Status::Completed => {
                assert!(
                    matches!(got, Fenced::Rejected(Rejection::AlreadyCompleted(_))),
                    "{ctx}: {got:?}"
                );
            }
            live => assert_eq!(got.rejection(), Some(&Rejection::NotTerminal(live)), "{ctx}"),
        }
    }

    async fn advance(&mut self, secs: u8) {
        self.fixture.advance(Duration::from_secs(u64::from(secs))).await;
        self.m.now += u64::from(secs);
    }

    async fn purge(&mut self, ctx: &str) {
        let purged = self.store.purge_expired(1000).await.expect(ctx);
        let now = self.m.now;
        let mut expected = 0;
        for t in self.m.tasks.iter_mut().filter(|t| !t.purged) {
            if t.status.is_terminal() && t.retained_from + RETENTION.as_secs() <= now {
                t.purged = true;
                expected += 1;
            }
        }
        assert_eq!(
            purged, expected,
            "{ctx}: purge removes exactly the expired terminal records"
        );
    }
}

/// After every step: the store's view of every task equals the model's, and the invariants hold.
async fn check_state(store: &dyn crate::TaskStore, m: &Model, ctx: &str) {
    for t in &m.tasks {
        let got = store.get(t.id).await.expect(ctx);
        let Some(got) = got else {
            assert!(t.purged, "{ctx}: task {} lost", t.id);
            continue;
        };
        assert!(!t.purged, "{ctx}: purged task still present");
        assert_eq!(got.status, t.status, "{ctx}: status of {}", t.id);
        assert_eq!(got.version, t.version, "{ctx}: version of {}", t.id);
        assert_eq!(got.response, t.response, "{ctx}: response of {}", t.id);
        assert_eq!(got.budget_base, t.budget_base, "{ctx}: budget base of {}", t.id);
        assert!(
            got.attempts_in_budget() <= MAX_ATTEMPTS,
            "{ctx}: attempts over budget"
        );
        assert_eq!(
            got.lease_until.is_some(),
            t.lease_until.is_some(),
            "{ctx}: lease of {}",
            t.id
        );
        assert_eq!(
            got.not_before.is_some(),
            t.not_before.is_some(),
            "{ctx}: backoff of {}",
            t.id
        );
        if let (Some(nb), Some(expected)) = (got.not_before, t.not_before) {
            let offset = (nb - got.created_at).whole_seconds() as u64;
            let model_offset = expected - t.created;
            assert!(
                offset.abs_diff(model_offset) <= 1,
                "{ctx}: not_before of {} off by more than 1 s",
                t.id
            );
        }
    }
}

/// One random step: weights favour claims, completions and clock moves.
///
/// ```
/// use proptest::strategy::{Strategy, ValueTree};
/// let mut runner = proptest::test_runner::TestRunner::default();
/// let _step = taskfence::testing::model::op().new_tree(&mut runner).unwrap().current();
/// ```
pub fn op() -> impl Strategy<Value = Op> {
    let worker = 0u8..WORKERS as u8;
    prop_oneof![
        2 => (0u8..4, 0u8..2).prop_map(|(key, input)| Op::Submit { key, input }),
        4 => (worker.clone(), any::<u8>()).prop_map(|(worker, task)| Op::Claim { worker, task }),
        2 => worker.clone().prop_map(|worker| Op::ClaimNext { worker }),
        2 => worker.clone().prop_map(|worker| Op::Renew { worker }),
        3 => worker.clone().prop_map(|worker| Op::Complete { worker }),
        2 => (worker.clone(), prop::bool::weighted(0.2)).prop_map(|(worker, permanent)| Op::Fail { worker, permanent }),
        1 => worker.clone().prop_map(|worker| Op::Release { worker }),
        1 => worker.clone().prop_map(|worker| Op::ReleaseUnstarted { worker }),
        1 => worker.prop_map(|worker| Op::RecordOperation { worker }),
        1 => any::<u8>().prop_map(|task| Op::Cancel { task }),
        3 => (1u8..15).prop_map(|secs| Op::Advance { secs }),
        1 => Just(Op::Purge),
        1 => any::<u8>().prop_map(|task| Op::Reopen { task }),
    ]
}

/// A whole interleaving of up to `max_len` steps.
///
/// ```
/// let _interleavings = taskfence::testing::model::ops(40);
/// ```
pub fn ops(max_len: usize) -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(), 1..=max_len)
}

/// Runs `ops` on a fresh fixture from `fixture` and on the model, on the
/// test binary's one [`runtime`](crate::testing::runtime): the body of
/// every case [`model_suite!`](crate::testing::model_suite) generates.
///
/// ```
/// use taskfence::testing::{MemoryFixture, model};
/// model::check(|| async { MemoryFixture::new() }, &model::regressions::claim_of_completed_task_answers_completed());
/// ```
pub fn check<F, Fut, X>(fixture: F, ops: &[Op])
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = X>,
    X: Fixture,
{
    crate::testing::runtime().block_on(async {
        let fixture = fixture().await;
        run(&fixture, ops).await;
    });
}

/// Shrunk counterexamples found while mutation-testing the rules, replayed
/// against every backend as named regression tests.
pub mod regressions {
    use super::Op::{self, *};

    /// Found with the budget check off by one: the third claim after two
    /// expired or failed attempts must answer `Failed`, not acquire a fourth.
    ///
    /// ```
    /// assert!(!taskfence::testing::model::regressions::claim_after_spent_budget_is_failed().is_empty());
    /// ```
    pub fn claim_after_spent_budget_is_failed() -> Vec<Op> {
        vec![
            Submit { key: 2, input: 0 },
            Claim { worker: 0, task: 0 },
            Advance { secs: 10 },
            Claim { worker: 2, task: 0 },
            Fail {
                worker: 2,
                permanent: false,
            },
            Advance { secs: 4 },
            Submit { key: 1, input: 0 },
            Claim { worker: 0, task: 216 },
            Submit { key: 0, input: 0 },
            Advance { secs: 10 },
            Claim { worker: 0, task: 189 },
        ]
    }

    /// Found with "done means done" broken: a claim of a completed task must not acquire.
    ///
    /// ```
    /// assert_eq!(taskfence::testing::model::regressions::claim_of_completed_task_answers_completed().len(), 5);
    /// ```
    pub fn claim_of_completed_task_answers_completed() -> Vec<Op> {
        vec![
            Submit { key: 0, input: 0 },
            Submit { key: 0, input: 0 },
            Claim { worker: 0, task: 0 },
            Complete { worker: 0 },
            Claim { worker: 0, task: 0 },
        ]
    }
}
