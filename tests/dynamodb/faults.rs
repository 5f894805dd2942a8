//! DynamoDB misbehaving on purpose: throttled and conflicting transactions,
//! unprocessed batch keys, stale index reads, writes that land between a read
//! and its conditional write, lost answers (`taskfence_test_support::faults`
//! between the store and moto). Each test drives one retry path or one
//! interleaving and asserts the invariant it protects.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use taskfence::inspect::{Inspect, TaskQuery};
use taskfence::store::ReopenRequest;
use taskfence::testing::{DynamoFixture, Fixture, acquire, new_task};
use taskfence::{
    Claim, ClaimRequest, DynamoStore, Error, Failure, NewTask, Rejection, Response, RetryPolicy, Status,
    TaskId, TaskStore,
};
use taskfence_test_support::dynamo;
use taskfence_test_support::faults::{Action, Faults, hook};

const LEASE: Duration = Duration::from_secs(30);

/// A second store on the fixture's table and clock, talking through `faults`.
pub(crate) fn faulty(f: &DynamoFixture, faults: &Faults) -> DynamoStore {
    DynamoStore::builder(dynamo::faulty_client(faults), f.table())
        .clock(f.clock().clone())
        .build()
        .expect("the fixture's table name is valid")
}

/// `n` fresh tasks (`send-0`, `send-1`, …), their ids in order.
async fn submit_many(store: &DynamoStore, n: usize) -> Vec<TaskId> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        ids.push(
            store
                .submit(new_task(&format!("send-{i}")))
                .await
                .unwrap()
                .into_task()
                .id,
        );
    }
    ids
}

fn id(task: TaskId) -> String {
    task.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttled_and_conflicting_transactions_are_retried_until_they_pass() {
    let f = dynamo::fixture().await;
    let faults = Faults::new();
    let store = faulty(&f, &faults);
    for code in [
        "ThrottlingError",
        "ProvisionedThroughputExceeded",
        "TransactionConflict",
    ] {
        let fired = faults.on("TransactWriteItems", &[], 6, Action::Cancel(code));
        let task = store.submit(new_task(code)).await.unwrap().into_task();
        let lease = acquire(&store, task.id, "w").await;
        let saved = store.complete(lease, Response::from("ok")).await.unwrap();
        assert!(saved.is_accepted(), "{code}: saved after the pauses");
        assert_eq!(fired.count(), 6, "{code}: every cancellation was met and retried");
        let task = store.get(task.id).await.unwrap().unwrap();
        assert_eq!(
            (task.status, task.version),
            (Status::Completed, 1),
            "{code}: one claim, one save"
        );
        assert_eq!(store.attempts(task.id).await.unwrap().len(), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_past_the_retries_is_a_retryable_error_that_wrote_nothing() {
    let f = dynamo::fixture().await;
    let faults = Faults::new();
    let store = faulty(&f, &faults);
    let task = store.submit(new_task("send-1")).await.unwrap().into_task();
    let lease = acquire(&store, task.id, "w").await;
    let before = f.record_count().await;
    let fired = faults.on("TransactWriteItems", &[], 100, Action::Cancel("ThrottlingError"));
    let err = store
        .complete(lease.clone(), Response::from("ok"))
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert_eq!(fired.count(), 11, "the first try and ten retries");
    assert_eq!(f.record_count().await, before);
    assert_eq!(store.get(task.id).await.unwrap().unwrap().status, Status::Running);
    faults.clear();
    assert!(
        store
            .complete(lease, Response::from("ok"))
            .await
            .unwrap()
            .is_accepted()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_meeting_a_transaction_is_retried() {
    let f = dynamo::fixture().await;
    let faults = Faults::new();
    let store = faulty(&f, &faults);
    let task = store.submit(new_task("send-1")).await.unwrap().into_task();
    let mut lease = acquire(&store, task.id, "w").await;
    let fired = faults.on(
        "UpdateItem",
        &[],
        3,
        Action::Error(400, "TransactionConflictException"),
    );
    f.advance(Duration::from_secs(20)).await;
    assert!(store.renew(&mut lease, LEASE).await.unwrap().is_accepted());
    assert_eq!(fired.count(), 3);
    let stored = store.get(task.id).await.unwrap().unwrap();
    assert_eq!(
        stored.lease_until,
        Some(lease.expires_at()),
        "the lease was extended"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unprocessed_keys_and_items_are_asked_again() {
    let f = dynamo::fixture().await;
    let faults = Faults::new();
    let store = faulty(&f, &faults);
    let ids = submit_many(&store, 3).await;
    let reads = faults.on("BatchGetItem", &[], 2, Action::Unprocessed);
    let claims = store
        .claim_many(&ids, ClaimRequest::new("w", LEASE))
        .await
        .unwrap();
    assert_eq!(reads.count(), 2);
    assert!(
        claims.iter().all(|c| matches!(c, Claim::Acquired(_))),
        "{claims:?}"
    );
    for claim in claims {
        let Claim::Acquired(lease) = claim else {
            unreachable!()
        };
        assert!(
            store
                .complete(lease, Response::from("ok"))
                .await
                .unwrap()
                .is_accepted()
        );
    }

    f.advance(NewTask::DEFAULT_RETENTION).await;
    let deletes = faults.on("BatchWriteItem", &[], 2, Action::Unprocessed);
    assert_eq!(store.purge_expired(100).await.unwrap(), 3);
    assert_eq!(deletes.count(), 2);
    assert_eq!(f.record_count().await, 0, "every item went, attempts too");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_task_that_cannot_be_purged_does_not_stop_the_rest() {
    let f = dynamo::fixture().await;
    let faults = Faults::new();
    let store = faulty(&f, &faults);
    let mut tasks = Vec::new();
    for key in ["keep-a", "stuck-b", "keep-c"] {
        let task = store.submit(new_task(key)).await.unwrap().into_task();
        assert!(store.cancel(task.id, "done").await.unwrap().is_accepted());
        tasks.push(task);
    }
    f.advance(NewTask::DEFAULT_RETENTION).await;
    // Every attempt to delete the second task's dedup record fails.
    let stuck = faults.on(
        "DeleteItem",
        &["stuck-b"],
        100,
        Action::Error(500, "InternalServerError"),
    );
    assert_eq!(
        store.purge_expired(100).await.unwrap(),
        2,
        "the other two are purged"
    );
    assert!(stuck.count() >= 1);
    assert!(store.get(tasks[0].id).await.unwrap().is_none());
    assert!(
        store.get(tasks[1].id).await.unwrap().is_some(),
        "left for the next purge"
    );
    assert!(store.get(tasks[2].id).await.unwrap().is_none());

    faults.clear();
    assert_eq!(
        store.purge_expired(100).await.unwrap(),
        1,
        "the next purge finishes it"
    );
    assert_eq!(f.record_count().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_many_that_fails_part_way_gives_back_the_leases_it_took() {
    let f = dynamo::fixture().await;
    let faults = Faults::new();
    let store = faulty(&f, &faults);
    let ids = submit_many(&store, 4).await;
    // The third task's claim is throttled past every retry.
    faults.on(
        "TransactWriteItems",
        &[&id(ids[2])],
        100,
        Action::Cancel("ThrottlingError"),
    );
    let err = store
        .claim_many(&ids, ClaimRequest::new("w", LEASE))
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    faults.clear();
    for task in &ids {
        let task = store.get(*task).await.unwrap().unwrap();
        assert_eq!(task.status, Status::Pending, "no lease is left behind");
    }
    // Given back, they need no lease to expire: another worker takes them now.
    let again = store
        .claim_many(&ids, ClaimRequest::new("v", LEASE))
        .await
        .unwrap();
    assert!(again.iter().all(|c| matches!(c, Claim::Acquired(_))), "{again:?}");
}

/// The purge index is read, then an operator reopens the task before the
/// purge acts on what it read: the purge must leave the task, its dedup
/// record and its history alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_working_from_a_stale_index_never_deletes_a_reopened_task() {
    let f = dynamo::fixture().await;
    let plain = f.dynamo_store().clone();
    let task = plain
        .submit(new_task("send-1").policy(RetryPolicy::default().max_attempts(1)))
        .await
        .unwrap()
        .into_task();
    let lease = acquire(&plain, task.id, "w").await;
    assert!(
        plain
            .fail(lease, Failure::permanent("no"))
            .await
            .unwrap()
            .is_accepted()
    );
    f.advance(NewTask::DEFAULT_RETENTION).await;

    let faults = Faults::new();
    let purger = faulty(&f, &faults);
    let reopener = plain.clone();
    let id = task.id;
    let stale = faults.on(
        "Query",
        &["\"IndexName\":\"purge\""],
        1,
        Action::After(hook(move || {
            let reopener = reopener.clone();
            async move {
                let reopened = reopener
                    .reopen(id, ReopenRequest::new("ops", "again"))
                    .await
                    .unwrap();
                assert!(reopened.is_accepted());
            }
        })),
    );
    assert_eq!(
        purger.purge_expired(100).await.unwrap(),
        0,
        "nothing expired any more"
    );
    assert_eq!(stale.count(), 1);

    let again = plain.submit(new_task("send-1")).await.unwrap();
    assert!(!again.is_created(), "the dedup record still names the task");
    assert_eq!(again.into_task().id, task.id);
    let lease = acquire(&plain, task.id, "w").await;
    assert!(
        plain
            .complete(lease, Response::from("ok"))
            .await
            .unwrap()
            .is_accepted()
    );
    let attempts = plain.attempts(task.id).await.unwrap();
    assert_eq!(
        attempts.iter().map(|a| a.number).collect::<Vec<_>>(),
        [1, 2],
        "history intact"
    );
}

/// A reopening that comes while a purge is deleting is refused: the task
/// is gone for it, and the purge finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopening_during_a_purge_is_refused_and_the_purge_finishes() {
    let f = dynamo::fixture().await;
    let plain = f.dynamo_store().clone();
    let task = plain.submit(new_task("send-1")).await.unwrap().into_task();
    assert!(plain.cancel(task.id, "stop").await.unwrap().is_accepted());
    f.advance(NewTask::DEFAULT_RETENTION).await;

    let faults = Faults::new();
    let purger = faulty(&f, &faults);
    let answer = Arc::new(Mutex::new(None));
    let (reopener, seen, id) = (plain.clone(), answer.clone(), task.id);
    faults.on(
        "DeleteItem",
        &[],
        1,
        Action::Before(hook(move || {
            let (reopener, seen) = (reopener.clone(), seen.clone());
            async move {
                let got = reopener.reopen(id, ReopenRequest::new("ops", "again")).await;
                *seen.lock().unwrap() = Some(got);
            }
        })),
    );
    assert_eq!(purger.purge_expired(100).await.unwrap(), 1);
    let got = answer
        .lock()
        .unwrap()
        .take()
        .expect("the reopening ran mid-purge");
    assert!(
        matches!(got, Err(Error::NotFound(found)) if found == task.id),
        "{got:?}"
    );
    assert_eq!(f.record_count().await, 0, "nothing left");
    assert!(
        plain.submit(new_task("send-1")).await.unwrap().is_created(),
        "the key is new work"
    );
}

/// A purge that stops half-way (its deletes keep failing) leaves the task
/// claimed: a reopening is refused, and the next purge finishes the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_purge_is_resumed_by_the_next() {
    let f = dynamo::fixture().await;
    let plain = f.dynamo_store().clone();
    let task = plain.submit(new_task("send-1")).await.unwrap().into_task();
    let lease = acquire(&plain, task.id, "w").await;
    assert!(
        plain
            .complete(lease, Response::from("ok"))
            .await
            .unwrap()
            .is_accepted()
    );
    f.advance(NewTask::DEFAULT_RETENTION).await;

    let faults = Faults::new();
    let purger = faulty(&f, &faults);
    faults.on(
        "BatchWriteItem",
        &[],
        100,
        Action::Error(500, "InternalServerError"),
    );
    assert!(
        purger.purge_expired(100).await.is_err(),
        "nothing purged: the error"
    );
    assert!(
        matches!(
            plain.reopen(task.id, ReopenRequest::new("ops", "x")).await,
            Err(Error::NotFound(_))
        ),
        "claimed by the purge"
    );
    faults.clear();
    assert_eq!(purger.purge_expired(100).await.unwrap(), 1);
    assert_eq!(f.record_count().await, 0);
}

/// A replica whose clock runs 2 s ahead sees the last attempt's lease
/// expired and the budget spent; before its write, the worker renews. The
/// budget-ending claim must not fail the task under the renewed lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_ending_claim_never_ends_a_lease_renewed_meanwhile() {
    let f = dynamo::fixture().await;
    let worker = f.dynamo_store().clone();
    let task = worker
        .submit(new_task("send-1").policy(RetryPolicy::default().max_attempts(1)))
        .await
        .unwrap()
        .into_task();
    let lease = Arc::new(tokio::sync::Mutex::new(acquire(&worker, task.id, "w").await));
    f.advance(Duration::from_secs(29)).await;
    let ahead =
        taskfence::clock::ManualClock::new(taskfence::clock::Clock::now(f.clock()) + Duration::from_secs(2));

    let faults = Faults::new();
    let replica = DynamoStore::builder(dynamo::faulty_client(&faults), f.table())
        .clock(ahead)
        .build()
        .unwrap();
    let (renewer, held) = (worker.clone(), lease.clone());
    let renewed = faults.on(
        "TransactWriteItems",
        &[],
        1,
        Action::Before(hook(move || {
            let (renewer, held) = (renewer.clone(), held.clone());
            async move {
                let mut lease = held.lock().await;
                assert!(renewer.renew(&mut lease, LEASE).await.unwrap().is_accepted());
            }
        })),
    );
    let claim = replica
        .claim(task.id, ClaimRequest::new("r", LEASE))
        .await
        .unwrap();
    assert_eq!(
        renewed.count(),
        1,
        "the renewal landed between the read and the write"
    );
    assert!(
        matches!(claim, Claim::Busy { .. }),
        "the renewed lease stands: {claim:?}"
    );
    let lease = lease.lock().await.clone();
    assert!(
        worker
            .complete(lease, Response::from("ok"))
            .await
            .unwrap()
            .is_accepted()
    );
}

/// A task changes status between `list`'s per-status queries: it is listed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_changing_status_during_a_listing_is_listed_once() {
    let f = dynamo::fixture().await;
    let plain = f.dynamo_store().clone();
    let task = plain.submit(new_task("send-1")).await.unwrap().into_task();
    let faults = Faults::new();
    let lister = faulty(&f, &faults);
    let moved = Arc::new(tokio::sync::Notify::new());
    let (claimer, signal, id) = (plain.clone(), moved.clone(), task.id);
    // The pending query sees it pending; then it is claimed; only then may
    // the running query run, and see it running.
    faults.on(
        "Query",
        &["\"IndexName\":\"status\"", "{\"S\":\"pending\"}"],
        1,
        Action::After(hook(move || {
            let (claimer, signal) = (claimer.clone(), signal.clone());
            async move {
                let claim = claimer.claim(id, ClaimRequest::new("w", LEASE)).await.unwrap();
                assert!(matches!(claim, Claim::Acquired(_)));
                signal.notify_one();
            }
        })),
    );
    let wait = moved.clone();
    faults.on(
        "Query",
        &["\"IndexName\":\"status\"", "{\"S\":\"running\"}"],
        1,
        Action::Before(hook(move || {
            let wait = wait.clone();
            async move {
                tokio::time::timeout(Duration::from_secs(30), wait.notified())
                    .await
                    .expect("the pending query ran");
            }
        })),
    );
    let page = lister.list(&TaskQuery::new()).await.unwrap();
    let ids: Vec<TaskId> = page.tasks.iter().map(|t| t.id).collect();
    assert_eq!(ids, [task.id], "once, as the table has it");
    assert_eq!(page.tasks[0].status, Status::Running);
}

/// The save took effect but its answer was lost: the worker sees an error;
/// the task says done, a claim returns the saved response, and the worker's
/// retry of the save is answered with that same response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn save_succeeded_but_its_answer_was_lost() {
    let f = dynamo::fixture().await;
    let faults = Faults::new();
    let store = faulty(&f, &faults);
    let task = store.submit(new_task("send-1")).await.unwrap().into_task();
    let lease = acquire(&store, task.id, "w").await;
    let lost = faults.on("TransactWriteItems", &[], 1, Action::LoseAnswer);
    let err = store
        .complete(lease.clone(), Response::from("the reply"))
        .await
        .unwrap_err();
    assert_eq!(lost.count(), 1);
    assert!(err.is_retryable(), "a lost answer is worth retrying: {err:?}");

    let durable = store.get(task.id).await.unwrap().unwrap();
    assert_eq!(durable.status, Status::Completed);
    assert_eq!(durable.response, Some(Response::from("the reply")));
    match store.claim(task.id, ClaimRequest::new("v", LEASE)).await.unwrap() {
        Claim::Completed(done) => assert_eq!(done.response, Some(Response::from("the reply"))),
        other => panic!("expected the saved response, got {other:?}"),
    }
    match store
        .complete(lease, Response::from("the reply"))
        .await
        .unwrap()
        .rejection()
    {
        Some(Rejection::AlreadyCompleted(done)) => {
            assert_eq!(
                done.response,
                Some(Response::from("the reply")),
                "its own answer, saved once"
            );
        }
        other => panic!("expected AlreadyCompleted, got {other:?}"),
    }
    assert_eq!(store.attempts(task.id).await.unwrap().len(), 1);
}

/// DynamoDB's TTL removed a purged-late task's record and newer work took
/// the key: the purge removes the old task and leaves the newer record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_leaves_a_record_that_names_newer_work() {
    let f = dynamo::fixture().await;
    let store = f.dynamo_store().clone();
    let old = store.submit(new_task("send-1")).await.unwrap().into_task();
    assert!(store.cancel(old.id, "stop").await.unwrap().is_accepted());
    f.advance(NewTask::DEFAULT_RETENTION).await;
    f.expire_dedup_record(&old.key).await;
    let newer = store.submit(new_task("send-1")).await.unwrap();
    assert!(newer.is_created());
    let newer = newer.into_task();

    assert_eq!(store.purge_expired(100).await.unwrap(), 1);
    assert!(store.get(old.id).await.unwrap().is_none());
    assert_eq!(
        store.find(&old.key).await.unwrap().map(|t| t.id),
        Some(newer.id),
        "the newer record stays"
    );
}
