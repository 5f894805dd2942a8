//! The worker runtime's state machine on `MemoryStore`.
//!
//! Every test runs on tokio's paused clock: the renewal loop's sleeps advance
//! virtual time instantly, and the store reads the same virtual time through
//! `TokioClock`, so leases expire and renew exactly as they would in real
//! time, deterministically and without sleeping.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use taskfence::clock::Clock;
use taskfence::intercept::{Intercept, Intercepted};
use taskfence::runtime::{
    AckReason, Disposition, LeaseHooks, LeaveReason, RetryReason, WorkContext, Worker, WorkerConfig,
};
use taskfence::{
    Claim, ClaimRequest, Error, Failure, Fenced, InputHash, Lease, MemoryStore, NewTask, Rejection,
    RequestKey, Response, RetryPolicy, Status, Task, TaskId, TaskStore,
};
use time::OffsetDateTime;
use tokio::sync::oneshot;
use tokio::time::Instant;

const LEASE: Duration = Duration::from_secs(30);

/// The store's clock: tokio's (paused) clock, plus jumps the test makes to
/// simulate a worker paused past its lease.
#[derive(Debug, Clone)]
struct TokioClock {
    origin: Instant,
    start: OffsetDateTime,
    jumped: Arc<Mutex<Duration>>,
}

impl TokioClock {
    fn new() -> Self {
        Self {
            origin: Instant::now(),
            start: time::macros::datetime!(2026-01-01 0:00 UTC),
            jumped: Arc::default(),
        }
    }

    fn jump(&self, by: Duration) {
        *self.jumped.lock().unwrap() += by;
    }
}

impl Clock for TokioClock {
    fn now(&self) -> OffsetDateTime {
        self.start + (Instant::now() - self.origin) + *self.jumped.lock().unwrap()
    }
}

struct Fixture {
    clock: TokioClock,
    memory: MemoryStore,
    store: Arc<dyn TaskStore>,
}

impl Fixture {
    fn new() -> Self {
        let clock = TokioClock::new();
        let memory = MemoryStore::with_clock(clock.clone());
        Self {
            clock,
            store: Arc::new(memory.clone()),
            memory,
        }
    }

    fn worker(&self, name: &str) -> Worker {
        self.worker_with(WorkerConfig::new(name, LEASE))
    }

    fn worker_with(&self, config: WorkerConfig) -> Worker {
        Worker::new(Arc::clone(&self.store), config)
            .unwrap()
            .with_clock(self.clock.clone())
    }

    async fn submit(&self, policy: RetryPolicy) -> Task {
        let key = RequestKey::new("user-1", "chat.reply", TaskId::new().to_string());
        self.store
            .submit(NewTask::new(key, InputHash::of(["msg"])).policy(policy))
            .await
            .unwrap()
            .into_task()
    }

    async fn task(&self, id: TaskId) -> Task {
        self.store.get(id).await.unwrap().unwrap()
    }
}

fn policy() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(3)
        .jitter(0.0)
        .initial_backoff(Duration::from_secs(8))
}

/// Counts the hook calls and remembers every expiry reported.
#[derive(Default)]
struct Recorder {
    claimed: AtomicU32,
    expiries: Mutex<Vec<OffsetDateTime>>,
}

#[async_trait]
impl LeaseHooks for Recorder {
    async fn on_claimed(&self, lease: &Lease) {
        self.claimed.fetch_add(1, Ordering::SeqCst);
        self.expiries.lock().unwrap().push(lease.expires_at());
    }
    async fn on_renewed(&self, lease: &Lease) {
        self.expiries.lock().unwrap().push(lease.expires_at());
    }
}

async fn answer(_ctx: WorkContext) -> Result<Response, Failure> {
    Ok(Response::from("answer"))
}

#[tokio::test(start_paused = true)]
async fn a_fresh_task_is_worked_saved_and_acked() {
    let f = Fixture::new();
    let task = f.submit(policy()).await;
    let hooks = Recorder::default();
    let d = f.worker("a").handle(task.id, &hooks, answer).await.unwrap();
    assert_eq!(d, Disposition::Ack(AckReason::Completed));
    let task = f.task(task.id).await;
    assert_eq!(task.status, Status::Completed);
    assert_eq!(task.response, Some(Response::from("answer")));
    assert_eq!(hooks.claimed.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_completed_task_is_acked_without_calling_the_work() {
    let f = Fixture::new();
    let task = f.submit(policy()).await;
    f.worker("a").handle(task.id, &(), answer).await.unwrap();

    let called = AtomicBool::new(false);
    let d = f
        .worker("b")
        .handle(task.id, &(), |_ctx| async {
            called.store(true, Ordering::SeqCst);
            Ok(Response::from("second"))
        })
        .await
        .unwrap();
    assert_eq!(d, Disposition::Ack(AckReason::AlreadyCompleted));
    assert!(
        !called.load(Ordering::SeqCst),
        "a done task reached the work function"
    );
    assert_eq!(f.task(task.id).await.response, Some(Response::from("answer")));
    assert_eq!(
        f.store.attempts(task.id).await.unwrap().len(),
        1,
        "no attempt counted"
    );
}

#[tokio::test(start_paused = true)]
async fn an_unknown_task_is_acked_as_not_found() {
    let f = Fixture::new();
    let d = f.worker("a").handle(TaskId::new(), &(), answer).await.unwrap();
    assert_eq!(d, Disposition::Ack(AckReason::NotFound));
}

#[tokio::test(start_paused = true)]
async fn a_busy_task_is_retried_when_the_other_lease_runs_out() {
    let f = Fixture::new();
    let task = f.submit(policy()).await;
    let Claim::Acquired(_other) = f
        .store
        .claim(task.id, ClaimRequest::new("other", LEASE))
        .await
        .unwrap()
    else {
        panic!("fresh task")
    };
    tokio::time::advance(Duration::from_secs(12)).await;

    let d = f
        .worker("a")
        .handle(task.id, &(), |_ctx| async {
            panic!("busy task reached the work")
        })
        .await
        .unwrap();
    assert_eq!(
        d,
        Disposition::RetryAfter {
            delay: LEASE - Duration::from_secs(12),
            reason: RetryReason::Busy
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_retryable_failure_schedules_the_backoff_and_a_redelivery_waits_it_out() {
    let f = Fixture::new();
    let task = f.submit(policy()).await;
    let worker = f.worker("a");

    let d = worker
        .handle(task.id, &(), |_ctx| async { Err(Failure::retryable("503")) })
        .await
        .unwrap();
    assert_eq!(
        d,
        Disposition::RetryAfter {
            delay: Duration::from_secs(8),
            reason: RetryReason::Scheduled { attempts_left: 2 }
        }
    );

    tokio::time::advance(Duration::from_secs(3)).await;
    let early = worker
        .handle(task.id, &(), |_ctx| async { panic!("claimed during backoff") })
        .await
        .unwrap();
    assert_eq!(
        early,
        Disposition::RetryAfter {
            delay: Duration::from_secs(5),
            reason: RetryReason::Backoff
        }
    );

    tokio::time::advance(Duration::from_secs(5)).await;
    let d = worker.handle(task.id, &(), answer).await.unwrap();
    assert_eq!(d, Disposition::Ack(AckReason::Completed));
    assert_eq!(f.task(task.id).await.attempts(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_budget_is_kept_across_deliveries_and_exhaustion_acks() {
    let f = Fixture::new();
    let task = f.submit(policy().max_attempts(2)).await;
    let worker = f.worker("a");
    let calls = AtomicU32::new(0);
    let fail = |_ctx: WorkContext| async {
        calls.fetch_add(1, Ordering::SeqCst);
        Err(Failure::retryable("timeout"))
    };

    let first = worker.handle(task.id, &(), fail).await.unwrap();
    assert!(matches!(
        first,
        Disposition::RetryAfter {
            reason: RetryReason::Scheduled { attempts_left: 1 },
            ..
        }
    ));
    tokio::time::advance(Duration::from_secs(60)).await;
    assert_eq!(
        worker.handle(task.id, &(), fail).await.unwrap(),
        Disposition::Ack(AckReason::Failed)
    );
    // A third delivery of the same message: terminal, the work is not called.
    assert_eq!(
        worker.handle(task.id, &(), fail).await.unwrap(),
        Disposition::Ack(AckReason::Failed)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let task = f.task(task.id).await;
    assert_eq!(task.status, Status::Failed);
    assert_eq!(task.attempts(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_permanent_failure_acks_as_terminal() {
    let f = Fixture::new();
    let task = f.submit(policy()).await;
    let d = f
        .worker("a")
        .handle(task.id, &(), |_ctx| async {
            Err(Failure::permanent("400 bad request"))
        })
        .await
        .unwrap();
    assert_eq!(d, Disposition::Ack(AckReason::Failed));
    let task = f.task(task.id).await;
    assert_eq!(task.status, Status::Failed);
    assert_eq!(task.attempts(), 1, "a permanent failure is not retried");
}

/// A panic in the work, in its future or in the call that makes it, is a
/// retryable failure recorded on the attempt, and the task is free for the
/// next delivery: not left running under a lease nobody holds.
#[tokio::test(start_paused = true)]
async fn a_panicking_work_function_is_a_recorded_retryable_failure() {
    let f = Fixture::new();
    let in_future = f.submit(policy()).await;
    let in_call = f.submit(policy()).await;
    let worker = f.worker("a");

    let d = worker
        .handle(in_future.id, &(), |_ctx| async {
            if true {
                panic!("index out of bounds in the prompt builder");
            }
            Ok(Response::from("never"))
        })
        .await
        .unwrap();
    assert!(
        matches!(
            d,
            Disposition::RetryAfter {
                reason: RetryReason::Scheduled { attempts_left: 2 },
                ..
            }
        ),
        "{d:?}"
    );

    let d = worker
        .handle(
            in_call.id,
            &(),
            |_ctx| -> std::future::Ready<Result<Response, Failure>> {
                panic!("the prompt template is missing")
            },
        )
        .await
        .unwrap();
    assert!(
        matches!(
            d,
            Disposition::RetryAfter {
                reason: RetryReason::Scheduled { attempts_left: 2 },
                ..
            }
        ),
        "{d:?}"
    );

    for (task, said) in [(in_future, "prompt builder"), (in_call, "template is missing")] {
        let task = f.task(task.id).await;
        assert_eq!(task.status, Status::Pending, "given back for a retry");
        let attempts = f.store.attempts(task.id).await.unwrap();
        assert_eq!(attempts.len(), 1);
        assert!(
            attempts[0]
                .error
                .as_deref()
                .is_some_and(|e| e.contains("panicked") && e.contains(said)),
            "{attempts:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn renewals_keep_a_job_longer_than_the_lease_alive_and_fire_the_hook() {
    let f = Fixture::new();
    let task = f.submit(policy()).await;
    let hooks = Recorder::default();
    let d = f
        .worker("a")
        .handle(task.id, &hooks, |ctx| async move {
            tokio::time::sleep(LEASE * 3 + Duration::from_secs(5)).await;
            assert!(!ctx.is_lease_lost());
            Ok(Response::from("slow answer"))
        })
        .await
        .unwrap();
    // Without renewals the lease would have expired at 30 s and the save been refused.
    assert_eq!(d, Disposition::Ack(AckReason::Completed));
    assert_eq!(
        f.task(task.id).await.response,
        Some(Response::from("slow answer"))
    );

    let expiries = hooks.expiries.lock().unwrap().clone();
    assert!(
        expiries.len() >= 9,
        "claim + a renewal every 10 s for 95 s: {expiries:?}"
    );
    assert!(
        expiries.windows(2).all(|w| w[0] < w[1]),
        "each renewal moves the expiry on"
    );
    assert_eq!(f.task(task.id).await.attempts(), 1, "renewals are not attempts");
}

/// Starts `worker.handle` on work that signals when it runs, then waits for
/// `ctx.lease_lost()`; returns the disposition and whether the work saw the signal.
async fn lose_lease_mid_work(
    f: &Fixture,
    task: TaskId,
    meanwhile: impl AsyncFnOnce(),
) -> (Disposition, bool) {
    let (started_tx, started_rx) = oneshot::channel();
    let saw_signal = AtomicBool::new(false);
    let saw = &saw_signal;
    let worker = f.worker("a");
    let handled = worker.handle(task, &(), |ctx| async move {
        started_tx.send(()).unwrap();
        tokio::select! {
            _ = ctx.lease_lost() => {
                saw.store(true, Ordering::SeqCst);
                Err(Failure::retryable("stopped: lease lost"))
            }
            _ = tokio::time::sleep(Duration::from_secs(3600)) => Ok(Response::from("too late")),
        }
    });
    let drive = async {
        started_rx.await.unwrap();
        meanwhile().await;
    };
    let (d, ()) = tokio::join!(handled, drive);
    (d.unwrap(), saw_signal.load(Ordering::SeqCst))
}

#[tokio::test(start_paused = true)]
async fn a_takeover_mid_work_signals_the_work_and_leaves_the_message() {
    let f = Fixture::new();
    let task = f.submit(policy()).await;
    let (d, saw) = lose_lease_mid_work(&f, task.id, async || {
        // Worker "a" is paused past its lease (store clock) and "b" takes over.
        f.clock.jump(LEASE + Duration::from_secs(1));
        let claim = f
            .store
            .claim(task.id, ClaimRequest::new("b", LEASE))
            .await
            .unwrap();
        assert!(claim.is_acquired());
    })
    .await;
    assert!(saw, "the work was not told the lease was lost");
    assert_eq!(
        d,
        Disposition::Leave(LeaveReason::LeaseLost(Some(Rejection::Superseded {
            current_version: 2
        })))
    );
    let task = f.task(task.id).await;
    assert_eq!(task.status, Status::Running, "b still holds it");
    assert_eq!(task.version, 2);
    assert_eq!(task.response, None);
}

#[tokio::test(start_paused = true)]
async fn a_lease_lost_to_a_completed_takeover_acks() {
    let f = Fixture::new();
    let task = f.submit(policy()).await;
    let (d, saw) = lose_lease_mid_work(&f, task.id, async || {
        f.clock.jump(LEASE + Duration::from_secs(1));
        let Claim::Acquired(lease) = f
            .store
            .claim(task.id, ClaimRequest::new("b", LEASE))
            .await
            .unwrap()
        else {
            panic!("takeover refused")
        };
        let saved = f.store.complete(lease, Response::from("from b")).await.unwrap();
        assert!(saved.is_accepted());
    })
    .await;
    assert!(saw);
    assert_eq!(d, Disposition::Ack(AckReason::CompletedElsewhere));
    assert_eq!(f.task(task.id).await.response, Some(Response::from("from b")));
}

#[tokio::test(start_paused = true)]
async fn a_cancellation_mid_work_signals_and_acks() {
    let f = Fixture::new();
    let task = f.submit(policy()).await;
    let (d, saw) = lose_lease_mid_work(&f, task.id, async || {
        assert!(
            f.store
                .cancel(task.id, "user closed the chat")
                .await
                .unwrap()
                .is_accepted()
        );
    })
    .await;
    assert!(saw);
    assert_eq!(d, Disposition::Ack(AckReason::Cancelled));
    assert_eq!(f.task(task.id).await.status, Status::Cancelled);
}

/// Sets a flag when dropped: proves a future was dropped, not left running.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn work_that_ignores_the_signal_is_dropped_after_the_grace() {
    let f = Fixture::new();
    let task = f.submit(policy()).await;
    let dropped = Arc::new(AtomicBool::new(false));
    let worker = f.worker_with(WorkerConfig::new("a", LEASE).stop_grace(Duration::from_secs(2)));
    let store = Arc::clone(&f.store);
    let clock = f.clock.clone();
    let flag = DropFlag(Arc::clone(&dropped));
    let handled = worker.handle(task.id, &(), |_ctx| async move {
        let _flag = flag;
        // Lose the lease, then keep working as if nothing happened.
        clock.jump(LEASE + Duration::from_secs(1));
        assert!(
            store
                .claim(task.id, ClaimRequest::new("b", LEASE))
                .await
                .unwrap()
                .is_acquired()
        );
        std::future::pending::<Result<Response, Failure>>().await
    });
    let d = handled.await.unwrap();
    assert!(
        matches!(d, Disposition::Leave(LeaveReason::LeaseLost(Some(_)))),
        "{d:?}"
    );
    assert!(dropped.load(Ordering::SeqCst), "the stubborn work is still alive");
}

#[tokio::test(start_paused = true)]
async fn a_save_after_the_lease_expired_is_refused_and_leaves_the_message() {
    let f = Fixture::new();
    let task = f.submit(policy()).await;
    let clock = f.clock.clone();
    let d = f
        .worker("a")
        .handle(task.id, &(), |_ctx| async move {
            // Paused past the lease between two renewals; nobody took over yet.
            clock.jump(LEASE + Duration::from_secs(1));
            Ok(Response::from("stale"))
        })
        .await
        .unwrap();
    assert_eq!(
        d,
        Disposition::Leave(LeaveReason::Rejected(Rejection::LeaseExpired))
    );
    assert_eq!(f.task(task.id).await.response, None);
}

/// Renewals fail with a storage error while `down` is set; every other call
/// passes through to the wrapped store.
#[derive(Default)]
struct RenewOutage {
    down: AtomicBool,
    renewals_tried: AtomicU32,
}

#[async_trait]
impl Intercept for RenewOutage {
    async fn renew(
        &self,
        inner: &dyn TaskStore,
        lease: &mut Lease,
        extend_by: Duration,
    ) -> taskfence::Result<Fenced<()>> {
        self.renewals_tried.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Err(Error::storage(std::io::Error::other("connection refused")));
        }
        inner.renew(lease, extend_by).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_store_unreachable_past_the_lease_expiry_counts_as_a_lost_lease() {
    let f = Fixture::new();
    let task = f.submit(policy()).await;
    let outage = Arc::new(Intercepted::new(Arc::clone(&f.store), RenewOutage::default()));
    let worker = Worker::new(outage.clone(), WorkerConfig::new("a", LEASE))
        .unwrap()
        .with_clock(f.clock.clone());
    let saw = AtomicBool::new(false);
    let (saw_ref, outage_ref) = (&saw, &outage);
    let d = worker
        .handle(task.id, &(), |ctx| async move {
            outage_ref.interceptor().down.store(true, Ordering::SeqCst);
            ctx.lease_lost().await;
            saw_ref.store(true, Ordering::SeqCst);
            Err(Failure::retryable("stopped"))
        })
        .await
        .unwrap();
    assert_eq!(d, Disposition::Leave(LeaveReason::LeaseLost(None)));
    assert!(saw.load(Ordering::SeqCst));
    assert_eq!(
        outage.interceptor().renewals_tried.load(Ordering::SeqCst),
        3,
        "renewals at 10, 20, 30 s fail; at 30 s the lease is past its expiry"
    );
}

#[tokio::test(start_paused = true)]
async fn record_operation_is_saved_on_the_attempt() {
    let f = Fixture::new();
    let task = f.submit(policy()).await;
    let d = f
        .worker("a")
        .handle(task.id, &(), |ctx| async move {
            let op = format!("op-{}-{}", ctx.task().id, ctx.lease().attempt());
            assert!(ctx.record_operation(&op).await.unwrap().is_accepted());
            Ok(Response::from(op))
        })
        .await
        .unwrap();
    assert_eq!(d, Disposition::Ack(AckReason::Completed));
    let attempts = f.store.attempts(task.id).await.unwrap();
    assert_eq!(
        attempts[0].operation_id.as_deref(),
        Some(format!("op-{}-1", task.id).as_str())
    );
}

#[tokio::test(start_paused = true)]
async fn invalid_config_is_a_typed_error_and_writes_nothing() {
    let f = Fixture::new();
    let bad = [
        WorkerConfig::new("", LEASE),
        WorkerConfig::new("a\0b", LEASE),
        WorkerConfig::new("a", Duration::ZERO),
        WorkerConfig::new("a", LEASE).renew_every(Duration::ZERO),
        WorkerConfig::new("a", LEASE).renew_every(LEASE),
    ];
    for config in bad {
        let err = Worker::new(Arc::clone(&f.store), config.clone()).unwrap_err();
        assert_eq!(config.validate(), Err(err));
    }
    assert_eq!(f.memory.record_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn an_invalid_failure_is_an_error_and_the_attempt_stays_running() {
    let f = Fixture::new();
    let task = f.submit(policy()).await;
    let err = f
        .worker("a")
        .handle(task.id, &(), |_ctx| async {
            Err(Failure::retryable("x".repeat(100_000)))
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err}");
    let task = f.task(task.id).await;
    assert_eq!(
        task.status,
        Status::Running,
        "nothing written; the lease will expire"
    );
    assert_eq!(task.last_error, None);
}

/// Counts single and batched claims on the way to the store.
#[derive(Default)]
struct ClaimCounter {
    single: AtomicU32,
    batches: AtomicU32,
}

#[async_trait]
impl Intercept for ClaimCounter {
    async fn claim(
        &self,
        inner: &dyn TaskStore,
        id: TaskId,
        request: ClaimRequest,
    ) -> taskfence::Result<Claim> {
        self.single.fetch_add(1, Ordering::SeqCst);
        inner.claim(id, request).await
    }
    async fn claim_many(
        &self,
        inner: &dyn TaskStore,
        ids: &[TaskId],
        request: ClaimRequest,
    ) -> taskfence::Result<Vec<Claim>> {
        self.batches.fetch_add(1, Ordering::SeqCst);
        inner.claim_many(ids, request).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_batch_is_claimed_at_once_and_each_delivery_answered_as_handle_would() {
    let f = Fixture::new();
    let done = f.submit(policy()).await;
    f.worker("first").handle(done.id, &(), answer).await.unwrap();
    let fresh = f.submit(policy()).await;
    let busy = f.submit(policy()).await;
    let _held = match f
        .store
        .claim(busy.id, ClaimRequest::new("other", LEASE))
        .await
        .unwrap()
    {
        Claim::Acquired(lease) => lease,
        other => panic!("{other:?}"),
    };
    let failing = f.submit(policy()).await;
    let unknown = TaskId::new();

    let counter = Arc::new(Intercepted::new(Arc::clone(&f.store), ClaimCounter::default()));
    let worker = Worker::new(counter.clone(), WorkerConfig::new("batch", LEASE))
        .unwrap()
        .with_clock(f.clock.clone());
    let called = Mutex::new(Vec::new());
    let ids = [done.id, fresh.id, busy.id, failing.id, unknown];
    let answers = worker
        .handle_batch(&ids, &(), |ctx| {
            called.lock().unwrap().push(ctx.task().id);
            let fails = ctx.task().id == failing.id;
            async move {
                if fails {
                    Err(Failure::retryable("503"))
                } else {
                    Ok(Response::from("batched"))
                }
            }
        })
        .await
        .unwrap();

    assert_eq!(answers[0], Disposition::Ack(AckReason::AlreadyCompleted));
    assert_eq!(answers[1], Disposition::Ack(AckReason::Completed));
    assert!(
        matches!(
            answers[2],
            Disposition::RetryAfter {
                reason: RetryReason::Busy,
                ..
            }
        ),
        "{:?}",
        answers[2]
    );
    assert!(
        matches!(
            answers[3],
            Disposition::RetryAfter {
                reason: RetryReason::Scheduled { attempts_left: 2 },
                ..
            }
        ),
        "{:?}",
        answers[3]
    );
    assert_eq!(answers[4], Disposition::Ack(AckReason::NotFound));
    let mut called = called.into_inner().unwrap();
    called.sort();
    let mut worked = vec![fresh.id, failing.id];
    worked.sort();
    assert_eq!(called, worked, "work runs only for the tasks this batch acquired");
    assert_eq!(f.task(fresh.id).await.response, Some(Response::from("batched")));
    let counts = counter.interceptor();
    assert_eq!(
        (
            counts.batches.load(Ordering::SeqCst),
            counts.single.load(Ordering::SeqCst)
        ),
        (1, 0),
        "one batched claim, no single ones"
    );
}

#[tokio::test(start_paused = true)]
async fn a_batch_saves_each_answer_as_it_finishes_and_renews_the_slow_ones() {
    let f = Fixture::new();
    let quick = f.submit(policy()).await;
    let slow = f.submit(policy()).await;
    let ids = [quick.id, slow.id];
    let answers = f
        .worker("batch")
        .handle_batch(&ids, &(), |ctx| {
            let (store, is_slow) = (Arc::clone(&f.store), ctx.task().id == slow.id);
            async move {
                if !is_slow {
                    return Ok(Response::from("quick"));
                }
                // The slow call outlives three leases (renewed meanwhile), and
                // the quick answer is saved before it ends: saving does not
                // wait for the rest of the batch.
                tokio::time::sleep(LEASE * 3).await;
                let quick_now = store.get(quick.id).await.unwrap().unwrap();
                assert_eq!(
                    quick_now.status,
                    Status::Completed,
                    "the quick answer was saved first"
                );
                Ok(Response::from("slow"))
            }
        })
        .await
        .unwrap();
    assert_eq!(answers, vec![Disposition::Ack(AckReason::Completed); 2]);
    assert_eq!(f.task(slow.id).await.response, Some(Response::from("slow")));
    assert_eq!(f.task(slow.id).await.attempts(), 1, "renewed, never taken over");
}

#[tokio::test(start_paused = true)]
async fn each_delivery_of_a_batch_is_answered_as_soon_as_it_settles() {
    let f = Fixture::new();
    let quick = f.submit(policy()).await;
    let slow = f.submit(policy()).await;
    let done = f.submit(policy()).await;
    f.worker("first").handle(done.id, &(), answer).await.unwrap();
    let start = Instant::now();
    let mut settled = Vec::new();
    f.worker("batch")
        .handle_batch_each(
            &[slow.id, quick.id, done.id],
            &(),
            |ctx| {
                let is_slow = ctx.task().id == slow.id;
                async move {
                    if is_slow {
                        tokio::time::sleep(LEASE * 3).await;
                    }
                    Ok(Response::from("answer"))
                }
            },
            |i, answer| settled.push((i, answer.unwrap(), Instant::now() - start)),
        )
        .await
        .unwrap();
    assert_eq!(settled.len(), 3, "every delivery answered once");
    let (order, waited): (Vec<usize>, Vec<Duration>) = settled.iter().map(|(i, _, t)| (*i, *t)).unzip();
    assert_eq!(order[2], 0, "the slow delivery settles last: {order:?}");
    assert!(
        waited[..2].iter().all(|t| *t < LEASE),
        "the others are answered before the slow one ends: {waited:?}"
    );
    assert!(waited[2] >= LEASE * 3);
    for (i, d, _) in &settled {
        let expected = if *i == 2 {
            Disposition::Ack(AckReason::AlreadyCompleted)
        } else {
            Disposition::Ack(AckReason::Completed)
        };
        assert_eq!(d, &expected, "delivery {i}");
    }
}

/// A provider's `429 Retry-After` on a task naming a rate bucket drains the
/// bucket for that long: the other tasks of the bucket are refused a token
/// (no attempt spent) until then, and claimed after it.
#[tokio::test(start_paused = true)]
async fn a_retry_after_drains_the_tasks_rate_bucket_for_every_worker() {
    use taskfence::inspect::Inspect;
    use taskfence::throttle::RateBucket;
    let f = Fixture::new();
    f.store
        .define_bucket(RateBucket::per_second("provider", 10).burst(10))
        .await
        .unwrap();
    let mut ids = Vec::new();
    for key in ["first", "second"] {
        let new = NewTask::new(RequestKey::new("user-1", "chat.reply", key), InputHash::of([key]))
            .policy(policy())
            .rate_bucket("provider");
        ids.push(f.store.submit(new).await.unwrap().into_task().id);
    }
    let worker = f.worker("a");
    let d = worker
        .handle(ids[0], &(), |_ctx| async {
            Err(Failure::retryable("429").retry_after(Duration::from_secs(20)))
        })
        .await
        .unwrap();
    assert!(
        matches!(d, Disposition::RetryAfter { delay, .. } if delay == Duration::from_secs(20)),
        "{d:?}"
    );
    let now = f.clock.now();
    let bucket = &f.memory.buckets().await.unwrap()[0];
    assert_eq!(bucket.available(now), 0, "drained");
    assert_eq!(
        bucket.available(now + time::Duration::seconds(19)),
        0,
        "none before Retry-After"
    );
    assert!(
        bucket.available(now + time::Duration::seconds(21)) >= 1,
        "tokens after it"
    );

    let other = worker
        .handle(ids[1], &(), |_ctx| async {
            panic!("claimed from a drained bucket")
        })
        .await
        .unwrap();
    assert!(
        matches!(other, Disposition::RetryAfter { reason: RetryReason::Throttled, delay } if delay >= Duration::from_secs(19)),
        "{other:?}"
    );
    assert_eq!(
        f.task(ids[1]).await.attempts(),
        0,
        "waiting for a token costs no attempt"
    );

    tokio::time::advance(Duration::from_secs(21)).await;
    assert_eq!(
        worker.handle(ids[1], &(), answer).await.unwrap(),
        Disposition::Ack(AckReason::Completed)
    );
}
