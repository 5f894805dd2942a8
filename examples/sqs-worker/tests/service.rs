//! The worker service binary against moto's SQS and PostgreSQL, as separate
//! processes: SIGTERM finishes or releases what a worker holds and exits 0;
//! SIGKILLed workers lose nothing.

mod support;

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use sqlx::Row;
use sqs_worker::sim::local_sqs_client;
use sqs_worker::{Dispatcher, SqsQueue};
use taskfence::store::AttemptOutcome;
use taskfence::testing::{Fixture, PgFixture};
use taskfence::{InputHash, NewTask, RequestKey, RetryPolicy, Status, TaskId};
use taskfence_test_support::{eventually_every, fixture};

use support::{Moto, start_service};

/// A fresh queue on moto, deleted when the test ends normally.
async fn new_queue(moto: &Moto, prefix: &str, visibility: Duration) -> SqsQueue {
    let client = local_sqs_client(&moto.endpoint).await;
    let name = format!("{prefix}-{}", uuid::Uuid::now_v7());
    SqsQueue::create(client, &name, visibility)
        .await
        .expect("create the queue")
}

/// Submits `n` tasks (each with its handoff in the outbox).
async fn submit(fixture: &PgFixture, n: usize, policy: RetryPolicy) -> Vec<TaskId> {
    let run = TaskId::new();
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let key = RequestKey::new("workspace-1", "chat.reply", format!("{run}-{i}"));
        let task = NewTask::new(key, InputHash::of([format!("message-{i}")]))
            .payload(format!("question #{i}"))
            .policy(policy);
        ids.push(fixture.store().submit(task).await.unwrap().into_task().id);
    }
    ids
}

/// Task ids of the attempts `worker` has running: all of them, or (with
/// `calling`) those whose provider call has started (the operation id is
/// recorded just before the call). A running attempt is its task's latest,
/// kept in the task row.
async fn running_attempts(fixture: &PgFixture, worker: &str, calling: bool) -> Vec<TaskId> {
    let sql = format!(
        "SELECT id FROM {}.tasks WHERE attempt_worker = $1 AND attempt_outcome = 'running' \
         AND (attempt_operation_id IS NOT NULL OR NOT $2)",
        fixture.schema()
    );
    sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
        .bind(worker)
        .bind(calling)
        .fetch_all(fixture.pg_store().pool())
        .await
        .unwrap()
        .iter()
        .map(|row| TaskId::from_uuid(row.get(0)))
        .collect()
}

/// Receives every visible message and returns the task ids they carry.
async fn drain_visible(queue: &SqsQueue) -> Vec<TaskId> {
    let mut ids = Vec::new();
    loop {
        let got = queue
            .receive(10, Duration::from_secs(1), Duration::from_secs(5))
            .await
            .unwrap();
        if got.is_empty() {
            return ids;
        }
        ids.extend(got.iter().map(|d| d.task_id().expect("a task id")));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_or_releases_every_held_task_and_exits_zero() {
    let moto = Moto::start_or_env();
    let queue = new_queue(&moto, "taskfence-sigterm", Duration::from_secs(5)).await;
    let fixture = fixture().await;
    let tasks = 10;
    let ids = submit(&fixture, tasks, RetryPolicy::default()).await;
    let dispatcher = Dispatcher::new(fixture.pg_store().clone(), queue.clone(), 50);
    assert_eq!(dispatcher.round().await.unwrap().len(), tasks);

    let grace = Duration::from_secs(3);
    let mut service = start_service(
        "graceful-1",
        &moto,
        fixture.url(),
        fixture.schema(),
        queue.url(),
        &[
            "--provider",
            "simulated",
            // Spread so that some calls end within the grace and some cannot.
            "--sim-min-latency",
            "500ms",
            "--sim-max-latency",
            "12s",
            "--concurrency",
            "10",
            "--lease",
            "4s",
            "--visibility-slack",
            "1s",
            "--poll-wait",
            "1s",
            "--shutdown-grace",
            "3s",
        ],
    );

    // Every task claimed by the service (some may already be done).
    eventually_every(Duration::from_secs(60), Duration::from_millis(100), || async {
        let mut claimed = 0;
        for &id in &ids {
            claimed += usize::from(fixture.store().get(id).await.unwrap().unwrap().attempts() >= 1);
        }
        (claimed == tasks).then_some(())
    })
    .await;
    let held = running_attempts(&fixture, "graceful-1", false).await;
    assert!(!held.is_empty(), "no task held at SIGTERM");

    let signalled = Instant::now();
    service.signal("TERM");
    let status = service
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("the service did not exit after SIGTERM");
    let took = signalled.elapsed();
    assert!(status.success(), "the service exited with {status}");
    // The releases at the end of the grace take a store write and an SQS call
    // each: allow a little past it.
    assert!(
        took <= grace + Duration::from_secs(3),
        "exit took {took:?}, past the {grace:?} grace"
    );

    let (mut completed, mut released) = (BTreeSet::new(), BTreeSet::new());
    for &id in &ids {
        let task = fixture.store().get(id).await.unwrap().unwrap();
        let attempts = fixture.store().attempts(id).await.unwrap();
        match task.status {
            Status::Completed => {
                let saved = attempts
                    .iter()
                    .filter(|a| a.outcome == AttemptOutcome::Completed)
                    .count();
                assert_eq!(saved, 1, "{id}: one saved response");
                assert!(task.response.is_some());
                completed.insert(id);
            }
            Status::Pending => {
                // Released: pending again at once, the attempt counted and closed.
                assert_eq!(task.attempts(), 1, "{id}: the released attempt counts");
                assert_eq!(attempts.len(), 1);
                assert_eq!(attempts[0].outcome, AttemptOutcome::Released, "{id}");
                assert!(task.lease_until.is_none(), "{id}: no live lease");
                released.insert(id);
            }
            other => panic!("{id} is {other} after the shutdown: neither completed nor released"),
        }
    }
    println!(
        "held at SIGTERM {}, completed {}, released {}, exit 0 after {took:.1?}",
        held.len(),
        completed.len(),
        released.len()
    );
    assert!(!completed.is_empty(), "no call finished within the grace");
    assert!(!released.is_empty(), "no task had to be released");
    assert!(
        released.iter().all(|id| held.contains(id)),
        "released a task that was not held"
    );

    // Completed tasks' messages are gone; released tasks' messages are visible now.
    let depth = queue.depth().await.unwrap();
    assert_eq!(depth.in_flight, 0, "{depth:?}");
    let visible: BTreeSet<TaskId> = drain_visible(&queue).await.into_iter().collect();
    assert_eq!(
        visible, released,
        "the visible messages are exactly the released tasks'"
    );

    // A second worker finishes the released tasks on their second attempt.
    let mut second = start_service(
        "graceful-2",
        &moto,
        fixture.url(),
        fixture.schema(),
        queue.url(),
        &["--provider", "simulated", "--lease", "4s", "--poll-wait", "1s"],
    );
    eventually_every(Duration::from_secs(60), Duration::from_millis(200), || async {
        for &id in &released {
            if fixture.store().get(id).await.unwrap().unwrap().status != Status::Completed {
                return None;
            }
        }
        (queue.depth().await.unwrap().total() == 0).then_some(())
    })
    .await;
    for &id in &released {
        let attempts = fixture.store().attempts(id).await.unwrap();
        let outcomes: Vec<_> = attempts.iter().map(|a| a.outcome).collect();
        assert_eq!(
            outcomes,
            [AttemptOutcome::Released, AttemptOutcome::Completed],
            "{id}"
        );
    }
    second.signal("TERM");
    let status = second
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("the second service exits");
    assert!(status.success(), "{status}");

    queue.delete_queue().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_worker_processes_lose_nothing() {
    let moto = Moto::start_or_env();
    let queue = new_queue(&moto, "taskfence-kill", Duration::from_secs(5)).await;
    let fixture = fixture().await;
    let policy = RetryPolicy::default()
        .max_attempts(6)
        .initial_backoff(Duration::from_millis(500))
        .max_backoff(Duration::from_secs(2));
    let args = [
        "--provider",
        "simulated",
        "--sim-min-latency",
        "1s",
        "--sim-max-latency",
        "2500ms",
        "--sim-transient-rate",
        "0.1",
        "--concurrency",
        "4",
        "--lease",
        "3s",
        "--visibility-slack",
        "1s",
        "--poll-wait",
        "1s",
        "--shutdown-grace",
        "10s",
        // Every process also publishes the outbox.
        "--dispatch",
        "true",
    ];
    let start = |id: &str| start_service(id, &moto, fixture.url(), fixture.schema(), queue.url(), &args);
    let mut workers: HashMap<&str, _> = ["w0", "w1", "w2"].into_iter().map(|id| (id, start(id))).collect();

    let tasks = 40;
    let ids = submit(&fixture, tasks, policy).await;

    // SIGKILL w0, then w1, each while a provider call of theirs is in flight.
    let mut killed_mid_call = Vec::new();
    for victim in ["w0", "w1"] {
        let in_flight = eventually_every(Duration::from_secs(60), Duration::from_millis(50), || async {
            Some(running_attempts(&fixture, victim, true).await).filter(|calls| !calls.is_empty())
        })
        .await;
        let status = workers.get_mut(victim).unwrap().kill_hard().await;
        assert!(!status.success(), "{victim} was killed: {status}");
        killed_mid_call.extend(in_flight.into_iter().map(|id| (victim, id)));
    }
    // Like a process manager, start a replacement for one of them.
    workers.insert("w0-restarted", start("w0-restarted"));

    // Every task settles and the queue empties.
    let started = Instant::now();
    eventually_every(Duration::from_secs(180), Duration::from_millis(500), || async {
        for &id in &ids {
            if !fixture
                .store()
                .get(id)
                .await
                .unwrap()
                .unwrap()
                .status
                .is_terminal()
            {
                return None;
            }
        }
        (queue.depth().await.unwrap().total() == 0).then_some(())
    })
    .await;
    let settled = started.elapsed();
    for id in ["w2", "w0-restarted"] {
        let worker = workers.get_mut(id).unwrap();
        worker.signal("TERM");
        let status = worker
            .wait_exit(Duration::from_secs(30))
            .await
            .expect("exits after SIGTERM");
        assert!(status.success(), "{id}: {status}");
    }

    let (mut recovered, mut completed, mut failed, mut attempts_made) = (0, 0, 0, 0);
    for &id in &ids {
        let task = fixture.store().get(id).await.unwrap().unwrap();
        let attempts = fixture.store().attempts(id).await.unwrap();
        assert!(
            task.attempts() <= policy.max_attempts,
            "{id}: {} attempts",
            task.attempts()
        );
        assert_eq!(
            attempts.len() as u32,
            task.attempts(),
            "{id}: one record per claim"
        );
        attempts_made += attempts.len();
        assert!(
            attempts.iter().all(|a| a.outcome != AttemptOutcome::Running),
            "{id}: an attempt is still running: {attempts:?}"
        );
        match task.status {
            Status::Completed => {
                let saved: Vec<_> = attempts
                    .iter()
                    .filter(|a| a.outcome == AttemptOutcome::Completed)
                    .collect();
                assert_eq!(saved.len(), 1, "{id}: exactly one saved response");
                assert!(task.response.is_some(), "{id}");
                completed += 1;
                if killed_mid_call.iter().any(|&(worker, t)| {
                    t == id && saved[0].worker != worker && attempts.iter().any(|a| a.worker == worker)
                }) {
                    recovered += 1;
                }
            }
            Status::Failed => {
                assert!(task.response.is_none(), "{id}");
                assert!(task.last_error.is_some(), "{id}: a terminal failure says why");
                failed += 1;
            }
            other => panic!("{id} ended {other}"),
        }
    }
    println!(
        "tasks {tasks}: completed {completed}, failed {failed}, attempts {attempts_made}; \
         calls in flight when killed {}, recovered by another worker {recovered}; settled in {settled:.1?}",
        killed_mid_call.len()
    );
    // The killed workers' in-flight tasks were taken over and saved by another worker.
    assert!(!killed_mid_call.is_empty());
    assert!(
        recovered >= 1,
        "no task killed mid-call was recovered: {killed_mid_call:?}"
    );
    // Nothing lost on the way: the outbox is published and the queue is empty.
    let unpublished: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {}.handoffs WHERE published_at IS NULL",
        fixture.schema()
    )))
    .fetch_one(fixture.pg_store().pool())
    .await
    .unwrap();
    assert_eq!(unpublished, 0);
    assert_eq!(queue.depth().await.unwrap().total(), 0);

    queue.delete_queue().await.unwrap();
}
