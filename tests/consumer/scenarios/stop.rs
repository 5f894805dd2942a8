//! The stop: running work finishes within the grace, then everything
//! held is given back, within a deadline a hung store cannot stretch.

use super::*;

/// A stop lets running work finish (its responses saved) and fetches
/// nothing more: a task submitted after the stop stays pending.
pub(crate) async fn a_stop_lets_running_work_finish_and_fetches_no_more(store: Arc<dyn TaskStore>) {
    let ids = submit_all(&*store, (0..4).map(|i| format!("w-{i}"))).await;
    let consumer = StoreQueue::new(store.clone())
        .consumer(config().concurrency(4))
        .unwrap();
    let stop = consumer.stop().clone();
    let (running, started) = start_counted(consumer, 4, Duration::from_millis(500)).await;
    stop.request();
    let late = submit_one(&*store, "after-the-stop").await;
    let stopped = running.await.unwrap().unwrap();

    assert_eq!(stopped.completed, 4, "nothing was cut short");
    for &id in &ids {
        assert_eq!(task(&*store, id).await.status, Status::Completed);
    }
    // No fetch starts after the stop; one already in flight (the consumer
    // fetches ahead while work runs) may return the late task, which is
    // then given back untouched: never started, pending and due, its claim
    // refunded.
    assert_eq!(started.load(Ordering::SeqCst), 4, "the late task never started");
    let attempts = store.attempts(late.id).await.unwrap();
    assert_eq!(stopped.released as usize, attempts.len());
    assert_eq!(stopped.returned_unstarted, stopped.released);
    assert!(
        attempts
            .iter()
            .all(|a| a.outcome == AttemptOutcome::ReturnedUnstarted),
        "{attempts:?}"
    );
    let late = task(&*store, late.id).await;
    assert_eq!((late.status, late.attempts_in_budget()), (Status::Pending, 0));
}

/// Work that outlives the grace is dropped and its lease released: the task
/// is pending and due at once, its attempt recorded as released, and another
/// consumer takes it immediately. The stop took the grace, not the lease.
pub(crate) async fn work_past_the_grace_is_released_for_another_process(store: Arc<dyn TaskStore>) {
    let ids = submit_all(&*store, (0..3).map(|i| format!("long-{i}"))).await;
    let grace = Duration::from_millis(300);
    let config = config().concurrency(3).stop_after(grace, Duration::from_secs(5));
    let consumer = StoreQueue::new(store.clone()).consumer(config).unwrap();
    let stop = consumer.stop().clone();
    let (running, _) = start_counted(consumer, 3, Duration::from_secs(3600)).await;
    let asked = Instant::now();
    stop.request();
    let stopped = running.await.unwrap().unwrap();
    let took = asked.elapsed();

    assert_eq!(stopped.released, 3);
    assert!(took >= grace, "the work had its grace ({took:?})");
    assert!(
        took < grace + Duration::from_secs(5),
        "bounded by grace + release deadline ({took:?})"
    );
    for &id in &ids {
        let t = task(&*store, id).await;
        assert_eq!((t.status, t.attempts()), (Status::Pending, 1));
        let attempts = store.attempts(id).await.unwrap();
        assert_eq!(attempts[0].outcome, AttemptOutcome::Released);
    }
    let next = store
        .claim_next(ClaimNext::new("consumer-2", LEASE, 10))
        .await
        .unwrap();
    assert_eq!(
        next.len(),
        3,
        "another process takes them at once, not after the lease"
    );
}

/// A second stop request does not wait for the grace: the work is dropped
/// and its lease released at once.
pub(crate) async fn a_second_stop_request_releases_at_once(store: Arc<dyn TaskStore>) {
    let t = submit_one(&*store, "stuck").await;
    let config = config().stop_after(Duration::from_secs(3600), Duration::from_secs(5));
    let (stop, running) = working_forever(store.clone(), &*store, t.id, config).await;
    stop.request();
    stop.request();
    let stopped = tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the second request does not wait for the hour of grace")
        .unwrap()
        .unwrap();
    // The started task's lease; a fetch under way at the stop may have
    // claimed the task again once released, and gave it back unstarted.
    assert_eq!(stopped.released - stopped.returned_unstarted, 1, "{stopped:?}");
    assert_eq!(task(&*store, t.id).await.status, Status::Pending);
}

/// A claim already on its way to the store when the stop comes is made
/// even if its caller gives up on it (a statement sent to a server runs
/// on). The stop waits for that fetch, within the release deadline, and
/// gives back what it took: here the very task a run of the stop just
/// released, which must end pending, not leased to a consumer that is gone.
pub(crate) async fn a_claim_on_its_way_at_the_stop_is_given_back(store: Arc<dyn TaskStore>) {
    let t = submit_one(&*store, "stuck").await;
    let late = LateClaims::new(store.clone());
    let observed: Arc<dyn TaskStore> = Arc::new(Intercepted::new(store.clone(), late.clone()));
    let config = config().stop_after(Duration::from_secs(3600), Duration::from_secs(30));
    let (stop, running) = working_forever(observed, &*store, t.id, config).await;
    // The consumer polls every 100 ms at most: its next fetch is held on its way.
    late.hold.store(true, Ordering::SeqCst);
    eventually(WITHIN, || async {
        (late.held.load(Ordering::SeqCst) > 0).then_some(())
    })
    .await;
    stop.request();
    stop.request();
    // The run releases its task while the fetch is still on its way...
    eventually(WITHIN, || async {
        (task(&*store, t.id).await.status == Status::Pending).then_some(())
    })
    .await;
    // ...and then the fetch arrives, and claims it.
    late.gate.notify_one();
    eventually(WITHIN, || async {
        (late.made.load(Ordering::SeqCst) > 0).then_some(())
    })
    .await;
    let stopped = tokio::time::timeout(WITHIN, running)
        .await
        .expect("the stop ended")
        .unwrap()
        .unwrap();
    let after = task(&*store, t.id).await;
    assert_eq!(after.status, Status::Pending, "the late claim was given back");
    assert_eq!(stopped.returned_unstarted, 1, "given back unstarted: {stopped:?}");
    assert_eq!(after.attempts(), 2, "the run's claim and the late one");
    assert_eq!(after.attempts_in_budget(), 1, "only the run that started counts");
}

/// Holds each fetch made once `hold` is set until `gate` opens, then makes
/// its claim on a task of its own, so the claim is made even if the
/// fetch's caller has gone; `made` counts the claims made that way.
#[derive(Clone)]
struct LateClaims {
    store: Arc<dyn TaskStore>,
    hold: Arc<AtomicBool>,
    held: Arc<AtomicUsize>,
    made: Arc<AtomicUsize>,
    gate: Arc<tokio::sync::Notify>,
}

impl LateClaims {
    fn new(store: Arc<dyn TaskStore>) -> Self {
        Self {
            store,
            hold: Arc::default(),
            held: Arc::default(),
            made: Arc::default(),
            gate: Arc::default(),
        }
    }
}

#[async_trait]
impl Intercept for LateClaims {
    async fn claim_next(&self, inner: &dyn TaskStore, request: ClaimNext) -> Result<Vec<Lease>> {
        if !self.hold.swap(false, Ordering::SeqCst) {
            return inner.claim_next(request).await;
        }
        self.held.fetch_add(1, Ordering::SeqCst);
        let late = self.clone();
        let claim = tokio::spawn(async move {
            late.gate.notified().await;
            let leases = late.store.claim_next(request).await;
            late.made.fetch_add(1, Ordering::SeqCst);
            leases
        });
        claim.await.expect("the late claim's task")
    }
}

/// A store that stops answering (every fetch and write hangs) cannot hold
/// the stop: a fetch under way is dropped when the grace is over, releasing
/// and the last saves get the release deadline, and the consumer returns.
pub(crate) async fn a_store_that_stops_answering_never_holds_the_stop_past_its_deadline(
    store: Arc<dyn TaskStore>,
) {
    let t = submit_one(&*store, "hung").await;
    let hang = Arc::new(AtomicBool::new(false));
    let fetches_hung = Arc::new(AtomicUsize::new(0));
    let hangs = Hangs(hang.clone(), fetches_hung.clone());
    let hanging: Arc<dyn TaskStore> = Arc::new(Intercepted::new(store.clone(), hangs));
    let grace = Duration::from_millis(200);
    let deadline = Duration::from_millis(500);
    let config = config().stop_after(grace, deadline);
    let (stop, running) = working_forever(hanging, &*store, t.id, config).await;
    hang.store(true, Ordering::SeqCst);
    // The consumer polls every 100 ms at most: wait for its next fetch to hang.
    eventually(WITHIN, || async {
        (fetches_hung.load(Ordering::SeqCst) > 0).then_some(())
    })
    .await;
    let asked = Instant::now();
    stop.request();
    tokio::time::timeout(grace + deadline + Duration::from_secs(10), running)
        .await
        .expect("the stop ended")
        .unwrap()
        .unwrap();
    let took = asked.elapsed();
    assert!(
        took < grace + deadline + Duration::from_secs(2),
        "a store that never answers held the stop for {took:?}"
    );
}

/// Every fetch and write hangs once `hang` is set; the second field counts
/// the fetches that hung.
struct Hangs(Arc<AtomicBool>, Arc<AtomicUsize>);

impl Hangs {
    async fn maybe_hang(&self) {
        if self.0.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }
}

#[async_trait]
impl Intercept for Hangs {
    async fn claim_next(&self, inner: &dyn TaskStore, request: ClaimNext) -> Result<Vec<Lease>> {
        if self.0.load(Ordering::SeqCst) {
            // Counted: a fetch is hanging now.
            self.1.fetch_add(1, Ordering::SeqCst);
        }
        self.maybe_hang().await;
        inner.claim_next(request).await
    }
    async fn release(&self, inner: &dyn TaskStore, lease: Lease) -> Result<Fenced<()>> {
        self.maybe_hang().await;
        inner.release(lease).await
    }
    async fn release_unstarted(&self, inner: &dyn TaskStore, lease: Lease) -> Result<Fenced<()>> {
        self.maybe_hang().await;
        inner.release_unstarted(lease).await
    }
    async fn renew_many(
        &self,
        inner: &dyn TaskStore,
        leases: &mut [Lease],
        extend_by: Duration,
    ) -> Result<Vec<Fenced<()>>> {
        self.maybe_hang().await;
        inner.renew_many(leases, extend_by).await
    }
    async fn complete_many(
        &self,
        inner: &dyn TaskStore,
        completions: Vec<(Lease, Response)>,
    ) -> Result<Vec<Result<Fenced<Task>>>> {
        self.maybe_hang().await;
        inner.complete_many(completions).await
    }
}

/// A deploy loop: a consumer started and stopped twenty times over a queue
/// of `max_attempts(2)` tasks, each stop coming while tasks are held ready
/// (prefetched, never started). Every stop gives those back unstarted, so
/// however often a task is prefetched and given back, it runs: every task
/// completes, none fails for its budget — though some were given back more
/// often than their budget allows attempts (which would have failed them
/// had those claims counted).
pub(crate) async fn a_deploy_loop_spends_no_budget_on_prefetched_tasks(store: Arc<dyn TaskStore>) {
    const ROUNDS: usize = 20;
    let twice = RetryPolicy::default().max_attempts(2);
    let mut ids = Vec::new();
    for i in 0..40 {
        let new = task_in("tenant-1", &format!("deploy-{i}"))
            .policy(twice)
            .without_handoff();
        ids.push(store.submit(new).await.unwrap().into_task().id);
    }
    let mut given_back = Vec::new();
    for round in 1..=ROUNDS {
        // Two running, four held ready: the first fetch takes six.
        let config = config().concurrency(2).prefetch(4);
        let consumer = StoreQueue::new(store.clone()).consumer(config).unwrap();
        let stop = consumer.stop().clone();
        let started = Arc::new(AtomicUsize::new(0));
        let seen = started.clone();
        let running = tokio::spawn(consumer.run(move |ctx| {
            seen.fetch_add(1, Ordering::SeqCst);
            async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok(Response::from(format!("reply to {}", ctx.task().key.key)))
            }
        }));
        if round < ROUNDS {
            // A deploy: the stop comes once work is running, with the next
            // tasks held ready.
            eventually(WITHIN, || async {
                (started.load(Ordering::SeqCst) >= 2).then_some(())
            })
            .await;
        } else {
            // The last process stays until the queue is drained.
            all_reach(&*store, &ids, Status::Completed).await;
        }
        stop.request();
        let stopped = running.await.unwrap().unwrap();
        given_back.push(stopped.returned_unstarted);
    }

    let mut returned = HashMap::new();
    for &id in &ids {
        let t = task(&*store, id).await;
        assert_eq!(t.status, Status::Completed, "{t:?}");
        assert!(t.attempts_in_budget() <= 2, "{t:?}");
        let attempts = store.attempts(id).await.unwrap();
        let unstarted = attempts
            .iter()
            .filter(|a| a.outcome == AttemptOutcome::ReturnedUnstarted)
            .count();
        assert_eq!(
            attempts.iter().filter(|a| a.outcome.counts()).count() as u32,
            t.attempts_in_budget(),
            "{attempts:?}"
        );
        returned.insert(id, unstarted);
    }
    let total: usize = returned.values().sum();
    assert_eq!(
        total as u64,
        given_back.iter().sum::<u64>(),
        "the journal records every claim the consumers gave back unstarted"
    );
    assert!(
        given_back[..ROUNDS - 1].iter().filter(|&&n| n > 0).count() >= ROUNDS / 2,
        "most stops came with tasks held ready: {given_back:?}"
    );
    assert!(
        returned.values().any(|&n| n >= 2),
        "some task was given back at least as often as its budget allows attempts: {returned:?}"
    );
}
