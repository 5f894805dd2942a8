//! The limits mode's checker bites: on a run's tables written by hand (on
//! the shared test server, `DATABASE_URL`), calls of a key over its limit,
//! limit-1 tasks called out of submission order and a bucket's claims over
//! its bound are each counted; calls that only touch are not an overlap;
//! and the fenced call log refuses a call its lease does not cover.

use std::time::Duration;

use chaos::checker::check_limits;
use chaos::queue::{self, Queue};
use sqlx::postgres::PgPoolOptions;
use taskfence::throttle::{ConcurrencyKey, RateBucket};
use taskfence::{Claim, ClaimRequest, InputHash, NewTask, PgStore, RequestKey, TaskStore};
use taskfence_test_support::{TempSchema, database_url};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limits_checker_counts_every_kind_of_violation() {
    let url = database_url().await;
    let temp = TempSchema::new(&url, "taskfence_chaos_check_").await;
    let schema = temp.name().to_owned();
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&url)
        .await
        .expect("connect");
    let store = PgStore::builder(pool.clone())
        .schema(&schema)
        .build()
        .expect("a valid schema");
    store.migrate().await.expect("migrate");
    queue::setup(&pool, &schema).await.expect("the harness's tables");
    let queue = Queue::new(pool.clone(), &schema);

    // The store is given generous limits, the harness's record strict ones:
    // the checker judges by the record, so what the store allows here is a
    // violation there.
    store
        .define_bucket(RateBucket::per_second("provider", 1000).burst(100))
        .await
        .expect("define the bucket");
    queue
        .record_bucket(&RateBucket::per_second("provider", 2).burst(1))
        .await
        .expect("record the bucket");
    let mut leases = Vec::new();
    for (i, (key, recorded)) in [
        ("conversation-0", 1),
        ("conversation-0", 1),
        ("conversation-0", 1),
        ("tenant-0", 2),
        ("tenant-0", 2),
    ]
    .into_iter()
    .enumerate()
    {
        let request_key = format!("req-{i}");
        queue
            .record_limits(
                &request_key,
                i as i64,
                &ConcurrencyKey::new(key, recorded),
                "provider",
            )
            .await
            .expect("record the limits");
        let task = store
            .submit(
                NewTask::new(
                    RequestKey::new("chaos", "chaos.reply", request_key),
                    InputHash::of([[i as u8]]),
                )
                .concurrency(ConcurrencyKey::new(key, 10))
                .rate_bucket("provider"),
            )
            .await
            .expect("submit")
            .into_task();
        let claim = store
            .claim(task.id, ClaimRequest::new("w", Duration::from_secs(30)))
            .await
            .expect("claim");
        let Claim::Acquired(lease) = claim else {
            panic!("the store's generous limits allow the claim: {claim:?}")
        };
        leases.push(lease);
    }

    // The fence: a call longer than the lease, or under another assignment, is not made.
    let (first, version) = (leases[0].task_id().as_uuid(), leases[0].version());
    assert!(
        !queue
            .call_started_fenced(first, version, "w", Duration::from_secs(31))
            .await
            .expect("log")
    );
    assert!(
        !queue
            .call_started_fenced(first, version + 1, "w", Duration::from_millis(10))
            .await
            .expect("log")
    );

    // conversation-0 (limit 1): the three tasks called at once, the youngest first.
    for lease in leases[..3].iter().rev() {
        assert!(
            queue
                .call_started_fenced(
                    lease.task_id().as_uuid(),
                    lease.version(),
                    "w",
                    Duration::from_secs(5)
                )
                .await
                .expect("log"),
            "the lease covers the call"
        );
    }
    // tenant-0 (limit 2): two calls in flight at once, within the limit.
    for lease in &leases[3..] {
        assert!(
            queue
                .call_started_fenced(
                    lease.task_id().as_uuid(),
                    lease.version(),
                    "w",
                    Duration::from_secs(5)
                )
                .await
                .expect("log")
        );
    }

    let report = check_limits(&pool, &schema).await.expect("check");
    println!("{}", report.table());
    let conversation = &report.keys[0];
    assert_eq!(conversation.key, "conversation-0");
    assert_eq!(
        (conversation.limit, conversation.tasks, conversation.calls),
        (1, 3, 3)
    );
    assert_eq!(conversation.max_in_flight, 3);
    assert_eq!(
        conversation.out_of_order, 2,
        "two tasks called before an older one"
    );
    let tenant = &report.keys[1];
    assert_eq!(
        (tenant.key.as_str(), tenant.limit, tenant.max_in_flight),
        ("tenant-0", 2, 2)
    );
    assert_eq!(tenant.out_of_order, 0, "order is limit 1's promise only");
    let bucket = &report.buckets[0];
    assert_eq!((bucket.claims, bucket.bound), (5, 3));
    assert_eq!(bucket.max_claims_per_window, 5, "five claims within a second");
    let span = bucket.tightest_bound_span_us.expect("three claims or more");
    assert!(
        (0..1_000_000).contains(&span),
        "three claims within less than a second: {span} µs"
    );
    assert_eq!(report.refused_calls, 2);
    assert_eq!(
        report.must_be_zero().map(|(_, n)| n),
        [1, 2, 1],
        "one key over its limit, two tasks out of order, one bucket over its bound"
    );

    // Calls that only touch do not overlap: tenant-0's second call moved to
    // begin where its first ends keeps it at one call in flight.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {s}.provider_calls AS c SET started_at = f.ends_at, ends_at = f.ends_at + interval '1 second'
         FROM (SELECT min(id) AS first, max(id) AS last FROM {s}.provider_calls WHERE concurrency_key = 'tenant-0') AS m,
              {s}.provider_calls AS f
         WHERE f.id = m.first AND c.id = m.last",
        s = queue::quote(&schema)
    )))
    .execute(&pool)
    .await
    .expect("move the call");
    let report = check_limits(&pool, &schema).await.expect("check");
    assert_eq!(report.keys[1].max_in_flight, 1, "touching calls do not overlap");
    pool.close().await;
}
