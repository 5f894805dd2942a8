//! Requests per operation, counted on the wire (an SDK interceptor on the
//! client, by `X-Amz-Target`) and asserted: what `docs/DYNAMODB.md` states.

use std::collections::BTreeMap;
use std::time::Duration;

use taskfence::policy::AcceptanceRule;
use taskfence::store::ReopenRequest;
use taskfence::testing::{DynamoFixture, Fixture};
use taskfence::testing::{acquire, new_task};
use taskfence::{Claim, ClaimRequest, Error, Failure, InputHash, NewTask, Response, RetryPolicy, TaskStore};
use taskfence_test_support::dynamo::{self, RequestCounter};

const LEASE: Duration = Duration::from_secs(30);

fn requests(counter: &RequestCounter) -> BTreeMap<String, u32> {
    counter.take()
}

fn expect(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_happy_path_write_but_claim_and_cancel_is_one_request() {
    let counter = RequestCounter::new();
    let f: DynamoFixture = DynamoFixture::new(dynamo::counted_client(&counter)).await;
    let store = f.store();
    let n = requests(&counter); // table creation
    assert!(n.contains_key("CreateTable"));
    let tx = |k: u32| ("TransactWriteItems", k);

    let task = store.submit(new_task("send-1")).await.unwrap().into_task();
    assert_eq!(requests(&counter), expect(&[tx(1)]), "submit");
    assert!(!store.submit(new_task("send-1")).await.unwrap().is_created());
    assert_eq!(
        requests(&counter),
        expect(&[("GetItem", 1), tx(1)]),
        "repeated submit: refused, then the task"
    );
    let conflict = store
        .submit(NewTask::new(
            taskfence::testing::key("send-1"),
            InputHash::of(["other"]),
        ))
        .await;
    assert!(matches!(conflict, Err(Error::KeyConflict { .. })));
    assert_eq!(
        requests(&counter),
        expect(&[tx(1)]),
        "key conflict: read from the refused record"
    );
    store.get(task.id).await.unwrap();
    assert_eq!(requests(&counter), expect(&[("GetItem", 1)]), "get");
    store.find(&task.key).await.unwrap();
    assert_eq!(
        requests(&counter),
        expect(&[("GetItem", 2)]),
        "find: the record, then the task"
    );

    let mut lease = acquire(&*store, task.id, "w").await;
    assert_eq!(requests(&counter), expect(&[("GetItem", 1), tx(1)]), "claim");
    assert!(store.renew(&mut lease, LEASE).await.unwrap().is_accepted());
    assert_eq!(requests(&counter), expect(&[("UpdateItem", 1)]), "renew");
    assert!(
        store
            .record_operation(&lease, "op-1")
            .await
            .unwrap()
            .is_accepted()
    );
    assert_eq!(requests(&counter), expect(&[tx(1)]), "record_operation");
    assert!(
        store
            .complete(lease.clone(), Response::from("hi"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert_eq!(requests(&counter), expect(&[tx(1)]), "complete");
    assert!(
        !store
            .complete(lease, Response::from("again"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert_eq!(
        requests(&counter),
        expect(&[tx(1)]),
        "refused complete: classified from ALL_OLD, no read"
    );
    assert!(matches!(
        store.claim(task.id, ClaimRequest::new("w", LEASE)).await.unwrap(),
        Claim::Completed(_)
    ));
    assert_eq!(
        requests(&counter),
        expect(&[("GetItem", 1)]),
        "claim of a completed task: read only"
    );

    let retried = store
        .submit(new_task("send-2").policy(RetryPolicy::default().jitter(0.0)))
        .await
        .unwrap()
        .into_task();
    let lease = acquire(&*store, retried.id, "w").await;
    requests(&counter);
    assert!(
        store
            .fail(lease, Failure::retryable("429"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert_eq!(requests(&counter), expect(&[tx(1)]), "fail");
    f.advance(Duration::from_secs(2)).await;
    let lease = acquire(&*store, retried.id, "w").await;
    requests(&counter);
    assert!(store.release(lease).await.unwrap().is_accepted());
    assert_eq!(requests(&counter), expect(&[tx(1)]), "release");
    assert!(store.cancel(retried.id, "stop").await.unwrap().is_accepted());
    assert_eq!(requests(&counter), expect(&[("GetItem", 1), tx(1)]), "cancel");
    assert_eq!(store.attempts(retried.id).await.unwrap().len(), 2);
    assert_eq!(requests(&counter), expect(&[("Query", 1)]), "attempts");
    store.due(100).await.unwrap();
    assert_eq!(requests(&counter), expect(&[("Query", 1)]), "due");

    // An earlier attempt's answer under FirstValidAnswer: the refused try's
    // image says what the current attempt is; the second try saves.
    let first_valid = store
        .submit(new_task("send-3").acceptance(AcceptanceRule::FirstValidAnswer))
        .await
        .unwrap()
        .into_task();
    let early = acquire(&*store, first_valid.id, "w").await;
    f.advance(LEASE + Duration::from_secs(1)).await;
    let _late = acquire(&*store, first_valid.id, "w").await;
    requests(&counter);
    assert!(
        store
            .complete(early, Response::from("early"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert_eq!(requests(&counter), expect(&[tx(2)]), "overtaking completion");

    // Purge: the index, then per task its claim on the task, its record, its
    // attempts, their delete, the task.
    f.advance(NewTask::DEFAULT_RETENTION).await;
    assert_eq!(store.purge_expired(100).await.unwrap(), 3);
    assert_eq!(
        requests(&counter),
        expect(&[
            ("BatchWriteItem", 3),
            ("DeleteItem", 6),
            ("Query", 4),
            ("UpdateItem", 3)
        ]),
        "purge of 3 tasks"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopen_is_a_read_and_one_transaction() {
    let counter = RequestCounter::new();
    let f: DynamoFixture = DynamoFixture::new(dynamo::counted_client(&counter)).await;
    let store = f.store();
    let task = store.submit(new_task("send-1")).await.unwrap().into_task();
    assert!(store.cancel(task.id, "stop").await.unwrap().is_accepted());
    requests(&counter);

    let request = ReopenRequest::new("ops", "fixed");
    assert!(
        store
            .reopen(task.id, request.clone())
            .await
            .unwrap()
            .is_accepted()
    );
    assert_eq!(
        requests(&counter),
        expect(&[("GetItem", 1), ("TransactWriteItems", 1)]),
        "reopen: the task, then task + record + reopening + handoff in one transaction"
    );
    assert!(!store.reopen(task.id, request).await.unwrap().is_accepted());
    assert_eq!(
        requests(&counter),
        expect(&[("GetItem", 1)]),
        "a refused reopening only reads"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_round_is_a_query_a_read_and_one_update_per_handoff() {
    let counter = RequestCounter::new();
    let f: DynamoFixture = DynamoFixture::new(dynamo::counted_client(&counter)).await;
    let store = f.dynamo_store();
    requests(&counter); // table creation
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(
            store
                .submit(new_task(&format!("send-{i}")))
                .await
                .unwrap()
                .into_task()
                .id,
        );
    }
    assert_eq!(
        requests(&counter),
        expect(&[("TransactWriteItems", 3)]),
        "submit: the handoff is in the task's transaction"
    );
    let round = store
        .dispatch_batches(10, 10, |_| std::future::ready(Ok::<(), std::io::Error>(())))
        .await
        .unwrap();
    let mut published = round.published.clone();
    published.sort();
    let mut all = ids.clone();
    all.sort();
    assert_eq!(published, all, "one clock instant: any order");
    assert_eq!(
        requests(&counter),
        expect(&[("BatchGetItem", 1), ("Query", 1), ("UpdateItem", 3)]),
        "dispatch: the index, the handoffs read again, one mark each"
    );
    store
        .dispatch(10, |_| std::future::ready(Ok::<(), std::io::Error>(())))
        .await
        .unwrap();
    assert_eq!(requests(&counter), expect(&[("Query", 1)]), "an empty round");
    assert_eq!(store.redispatch(&ids[..2]).await.unwrap(), 2);
    assert_eq!(
        requests(&counter),
        expect(&[("TransactWriteItems", 2)]),
        "redispatch: one transaction per task"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspection_reads_indexes_and_never_scans() {
    use taskfence::Status;
    use taskfence::inspect::{Inspect, TaskQuery};

    let counter = RequestCounter::new();
    let f: DynamoFixture = DynamoFixture::new(dynamo::counted_client(&counter)).await;
    let store = f.dynamo_store();
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(
            store
                .submit(new_task(&format!("send-{i}")))
                .await
                .unwrap()
                .into_task()
                .id,
        );
    }
    let lease = acquire(store, ids[0], "w").await;
    requests(&counter);

    let page = store
        .list(&TaskQuery::new().status(Status::Pending).limit(2))
        .await
        .unwrap();
    assert_eq!((page.tasks.len(), page.next.is_some()), (2, true));
    assert_eq!(
        requests(&counter),
        expect(&[("BatchGetItem", 1), ("Query", 1)]),
        "list of one status: the index, then the page's tasks"
    );
    assert_eq!(store.list(&TaskQuery::new()).await.unwrap().tasks.len(), 4);
    assert_eq!(
        requests(&counter),
        expect(&[("BatchGetItem", 1), ("Query", 5)]),
        "list of every status: one query per status, merged"
    );
    let counts = store.counts(None).await.unwrap();
    assert_eq!((counts.pending, counts.running), (3, 1));
    assert_eq!(
        requests(&counter),
        expect(&[("Query", 5)]),
        "counts: one COUNT query per status"
    );
    let story = store.story(ids[0]).await.unwrap().unwrap();
    assert_eq!(story.attempts.len(), 1);
    assert_eq!(
        requests(&counter),
        expect(&[("Query", 1)]),
        "story: the task's partition"
    );
    f.advance(Duration::from_secs(3600)).await;
    assert_eq!(
        store.stranded(Duration::from_secs(60), 10).await.unwrap().len(),
        3
    );
    assert_eq!(
        requests(&counter),
        expect(&[("BatchGetItem", 1), ("Query", 1)]),
        "stranded: the unclaimed index, then the tasks"
    );
    drop(lease);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_ten_reads_once_and_writes_each_task_on_its_own() {
    let counter = RequestCounter::new();
    let f: DynamoFixture = DynamoFixture::new(dynamo::counted_client(&counter)).await;
    let store = f.store();
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(
            store
                .submit(new_task(&format!("send-{i}")))
                .await
                .unwrap()
                .into_task()
                .id,
        );
    }
    requests(&counter);

    let claims = store
        .claim_many(&ids, ClaimRequest::new("w", LEASE))
        .await
        .unwrap();
    assert!(claims.iter().all(Claim::is_acquired));
    assert_eq!(
        requests(&counter),
        expect(&[("BatchGetItem", 1), ("TransactWriteItems", 10)]),
        "claim_many of 10: one read, one transaction per task"
    );
    let completions = claims
        .into_iter()
        .map(|c| match c {
            Claim::Acquired(lease) => (lease, Response::from("ok")),
            other => panic!("{other:?}"),
        })
        .collect();
    let saved = store.complete_many(completions).await.unwrap();
    assert!(saved.iter().all(|s| s.as_ref().is_ok_and(|f| f.is_accepted())));
    assert_eq!(
        requests(&counter),
        expect(&[("TransactWriteItems", 10)]),
        "complete_many of 10: one transaction per task, no read"
    );
    let again = store
        .claim_many(&ids, ClaimRequest::new("w", LEASE))
        .await
        .unwrap();
    assert!(again.iter().all(|c| matches!(c, Claim::Completed(_))));
    assert_eq!(
        requests(&counter),
        expect(&[("BatchGetItem", 1)]),
        "claim_many of done tasks: the read only"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_effect_step_is_a_snapshot_read_and_at_most_one_transaction() {
    use taskfence::effect::EffectOutcome;
    use taskfence::inspect::Inspect;

    let counter = RequestCounter::new();
    let f: DynamoFixture = DynamoFixture::new(dynamo::counted_client(&counter)).await;
    let store = f.dynamo_store();
    let task = store.submit(new_task("send-1")).await.unwrap().into_task();
    let lease = acquire(store, task.id, "w").await;
    requests(&counter);
    let read = ("TransactGetItems", 1);

    assert!(store.begin_effect(&lease, "notify").await.unwrap().is_accepted());
    assert_eq!(
        requests(&counter),
        expect(&[read, ("TransactWriteItems", 1)]),
        "begin_effect: task and effect read as of one instant, then fence check + put"
    );
    assert!(store.begin_effect(&lease, "notify").await.unwrap().is_accepted());
    assert_eq!(
        requests(&counter),
        expect(&[read]),
        "begin_effect of this assignment's own intent: the read only"
    );
    let done = EffectOutcome::done("m-1");
    assert!(
        store
            .finish_effect(&lease, "notify", done.clone())
            .await
            .unwrap()
            .is_accepted()
    );
    assert_eq!(
        requests(&counter),
        expect(&[read, ("TransactWriteItems", 1)]),
        "finish_effect"
    );
    assert!(
        store
            .finish_effect(&lease, "notify", done)
            .await
            .unwrap()
            .is_accepted()
    );
    assert_eq!(
        requests(&counter),
        expect(&[read]),
        "a repeated finish_effect: the read only"
    );
    assert_eq!(store.effects(task.id).await.unwrap().len(), 1);
    assert_eq!(requests(&counter), expect(&[("Query", 1)]), "effects");
    assert_eq!(store.story(task.id).await.unwrap().unwrap().effects.len(), 1);
    assert_eq!(
        requests(&counter),
        expect(&[("Query", 1)]),
        "story: still the task's partition"
    );

    f.advance(LEASE + Duration::from_secs(1)).await;
    assert!(!store.begin_effect(&lease, "other").await.unwrap().is_accepted());
    assert_eq!(
        requests(&counter),
        expect(&[read]),
        "an expired lease's begin_effect: rejected from the read, nothing sent"
    );
}

/// What limits add to a submission and a claim, as `docs/DYNAMODB.md`
/// ("Concurrency keys and rate buckets") states it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_add_their_reads_to_submit_and_claim() {
    use taskfence::throttle::{ConcurrencyKey, RateBucket};
    let counter = RequestCounter::new();
    let f: DynamoFixture = DynamoFixture::new(dynamo::counted_client(&counter)).await;
    let store = f.store();
    requests(&counter); // table creation
    let tx = |k: u32| ("TransactWriteItems", k);

    store
        .define_bucket(RateBucket::per_minute("provider", 60).burst(2))
        .await
        .unwrap();
    assert_eq!(requests(&counter), expect(&[("UpdateItem", 1)]), "define_bucket");
    let in_order = ConcurrencyKey::new("conversation-7", 1);
    let first = store
        .submit(
            new_task("m1")
                .concurrency(in_order.clone())
                .rate_bucket("provider"),
        )
        .await
        .unwrap()
        .into_task();
    assert_eq!(
        requests(&counter),
        expect(&[("GetItem", 1), ("TransactGetItems", 1), tx(1)]),
        "submit naming a bucket (is it defined?) and a key (its next place)"
    );
    let second = store
        .submit(new_task("m2").concurrency(in_order))
        .await
        .unwrap()
        .into_task();
    requests(&counter);

    let lease = acquire(&*store, first.id, "w").await;
    assert_eq!(
        requests(&counter),
        expect(&[
            ("GetItem", 1),
            ("TransactGetItems", 1),
            ("Query", 1),
            ("BatchGetItem", 1),
            tx(1)
        ]),
        "claim: the task, the key and bucket items, the walk of a limit-1 key, the transaction"
    );
    let refused = store
        .claim(second.id, ClaimRequest::new("w", LEASE))
        .await
        .unwrap();
    assert!(matches!(refused, Claim::Throttled(_)));
    assert_eq!(
        requests(&counter),
        expect(&[
            ("GetItem", 1),
            ("TransactGetItems", 1),
            ("BatchGetItem", 2),
            ("Query", 1)
        ]),
        "refused: the reads only (the holders' tasks, the walk), nothing written"
    );
    assert!(
        store
            .complete(lease, Response::from("1"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert_eq!(
        requests(&counter),
        expect(&[tx(1)]),
        "a completion touches no limit item"
    );
    store
        .drain_bucket("provider", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(
        requests(&counter),
        expect(&[("GetItem", 1), tx(1)]),
        "drain_bucket: the bucket, then its schedule on condition"
    );
}
