//! One statement, one round trip per happy-path operation — counted on the
//! wire by a proxy that parses the PostgreSQL protocol (the server here has no
//! `pg_stat_statements` in `shared_preload_libraries`).
//!
//! A pooled operation is followed by sqlx's own liveness ping when the
//! connection goes back to the pool (a lone `Sync`, no statement, after the
//! operation has returned); `PgStore::on` on a held connection shows the
//! operation alone.

use crate::common;

use std::time::Duration;

use common::{Wire, WireProxy};
use taskfence::effect::EffectOutcome;
use taskfence::testing::{Fixture, prompt_retry};
use taskfence::{Claim, ClaimRequest, Failure, PgStore, Response, TaskStore};

const LEASE: Duration = Duration::from_secs(30);

/// A claim that replaces an earlier attempt (here a retry after a failure):
/// the first-claim statement leaves the row, a read finds it available, and
/// the full statement moves the attempt to the journal — three statements, on
/// a path that waited out a backoff or a lease anyway.
const RETRY_CLAIM: &str = "claim (a retry)";

/// Statements (and round trips) of each operation of [`every_operation`].
fn statements(op: &str) -> u64 {
    match op {
        RETRY_CLAIM => 3,
        // The effect's record read under the fence, then one fenced conditional write.
        "begin_effect" | "finish_effect" => 2,
        _ => 1,
    }
}

/// Every operation once, on one connection: submit, claim, renew,
/// record_operation, begin_effect, finish_effect, complete; submit, claim, fail; a retry's claim, release.
async fn every_operation(store: &PgStore, fixture: &impl Fixture, key: &str, mut seen: impl FnMut(&str)) {
    let task = store
        .submit(common::new_task(key).policy(prompt_retry()))
        .await
        .unwrap()
        .into_task();
    seen("submit");
    let mut lease = common::acquire(store, task.id, "w").await;
    seen("claim");
    assert!(store.renew(&mut lease, LEASE).await.unwrap().is_accepted());
    seen("renew");
    assert!(
        store
            .record_operation(&lease, "op-1")
            .await
            .unwrap()
            .is_accepted()
    );
    seen("record_operation");
    assert!(
        store
            .begin_effect(&lease, "notify-user")
            .await
            .unwrap()
            .is_accepted()
    );
    seen("begin_effect");
    let outcome = EffectOutcome::done("delivery-1");
    assert!(
        store
            .finish_effect(&lease, "notify-user", outcome)
            .await
            .unwrap()
            .is_accepted()
    );
    seen("finish_effect");
    assert!(
        store
            .complete(lease, Response::from("answer"))
            .await
            .unwrap()
            .is_accepted()
    );
    seen("complete");

    let other = store
        .submit(common::new_task(&format!("{key}-b")).policy(prompt_retry()))
        .await
        .unwrap()
        .into_task();
    seen("submit");
    let lease = common::acquire(store, other.id, "w").await;
    seen("claim");
    assert!(
        store
            .fail(lease, Failure::retryable("429"))
            .await
            .unwrap()
            .is_accepted()
    );
    seen("fail");
    fixture.advance(Duration::from_secs(2)).await; // the fixture's own connection: not counted
    let lease = common::acquire(store, other.id, "w").await;
    seen(RETRY_CLAIM);
    assert!(store.release(lease).await.unwrap().is_accepted());
    seen("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_happy_path_operation_is_one_statement_in_one_round_trip() {
    let f = common::fixture().await;
    let proxy = WireProxy::start(f.url()).await;
    let store = proxy.store(&f, 1).await;

    // First use on a connection: sqlx prepares the statement (Parse/Describe,
    // one extra round trip) and caches it for the connection's life.
    proxy.take();
    let mut cold = Vec::new();
    every_operation(&store, &f, "cold", |op| cold.push((op.to_owned(), proxy.take()))).await;

    let mut warm = Vec::new();
    every_operation(&store, &f, "warm", |op| warm.push((op.to_owned(), proxy.take()))).await;
    for (op, wire) in &cold {
        println!("cold {op:<17} {wire:?}");
    }
    for (op, wire) in &warm {
        println!("warm {op:<17} {wire:?}");
        let statements = statements(op);
        assert_eq!(
            (wire.simple_queries, wire.parses, wire.executes, wire.requests),
            (0, 0, statements, statements),
            "{op}: {statements} statement(s), as many round trips"
        );
    }
    // sqlx pings each connection it takes back, in the background after the
    // operation returned, so a ping lands in whichever window is open then
    // (the last cold operation's may land in the first warm window).
    let pings: u64 = warm.iter().map(|(_, w)| w.pings).sum::<u64>() + proxy.take().pings;
    assert!(
        pings <= warm.len() as u64 + 1,
        "at most one release ping per pooled operation: {pings}"
    );
    for (i, (op, wire)) in cold.iter().enumerate() {
        // The store's first operation reads the schema's migration version
        // once before it (a store on an old or missing schema answers
        // `Error::NotMigrated`); no later one does.
        let check = u64::from(i == 0);
        let statements = statements(op) + check;
        assert_eq!(
            wire.statements(),
            statements,
            "{op}: as many statements on first use"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_the_callers_connection_each_operation_is_exactly_one_request() {
    let f = common::fixture().await;
    let proxy = WireProxy::start(f.url()).await;
    let store = proxy.store(&f, 1).await;
    every_operation(&store, &f, "warm", |_| {}).await; // prepare every statement
    let mut conn = store.pool().acquire().await.unwrap();
    let exactly_one = Wire {
        simple_queries: 0,
        parses: 0,
        executes: 1,
        requests: 1,
        pings: 0,
    };
    proxy.take();
    let task = store
        .on(&mut conn)
        .submit(common::new_task("k").policy(prompt_retry()))
        .await
        .unwrap()
        .into_task();
    assert_eq!(proxy.take(), exactly_one, "on(conn).submit");
    let Claim::Acquired(lease) = store
        .on(&mut conn)
        .claim(task.id, ClaimRequest::new("w", LEASE))
        .await
        .unwrap()
    else {
        panic!("fresh task")
    };
    assert_eq!(proxy.take(), exactly_one, "on(conn).claim");
    assert!(
        store
            .on(&mut conn)
            .complete(lease, Response::from("a"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert_eq!(proxy.take(), exactly_one, "on(conn).complete");
    let other = store
        .on(&mut conn)
        .submit(common::new_task("k2").policy(prompt_retry()))
        .await
        .unwrap()
        .into_task();
    let Claim::Acquired(lease) = store
        .on(&mut conn)
        .claim(other.id, ClaimRequest::new("w", LEASE))
        .await
        .unwrap()
    else {
        panic!("fresh task")
    };
    proxy.take();
    assert!(
        store
            .on(&mut conn)
            .fail(lease, Failure::retryable("429"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert_eq!(proxy.take(), exactly_one, "on(conn).fail");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resubmits_are_one_round_trip_and_duplicate_deliveries_and_rejections_two() {
    let f = common::fixture().await;
    let proxy = WireProxy::start(f.url()).await;
    let store = proxy.store(&f, 1).await;
    every_operation(&store, &f, "warm", |_| {}).await; // prepare every statement

    let task = store
        .submit(common::new_task("k").policy(prompt_retry()))
        .await
        .unwrap()
        .into_task();
    let lease = common::acquire(&store, task.id, "w").await;
    let copy = lease.clone();
    assert!(
        store
            .complete(lease, Response::from("a"))
            .await
            .unwrap()
            .is_accepted()
    );
    // Prepare the classifying read too.
    assert!(
        !store
            .complete(copy.clone(), Response::from("b"))
            .await
            .unwrap()
            .is_accepted()
    );
    proxy.take();

    assert!(
        !store
            .submit(common::new_task("k").policy(prompt_retry()))
            .await
            .unwrap()
            .is_created()
    );
    assert_eq!(proxy.take().round_trips(), 1, "a repeated submit: one round trip");
    assert!(matches!(
        store
            .claim(task.id, ClaimRequest::new("w2", LEASE))
            .await
            .unwrap(),
        Claim::Completed(_)
    ));
    // A duplicate delivery: the first-claim statement writes nothing and
    // returns nothing, then a read (no row lock) answers.
    let wire = proxy.take();
    assert_eq!(
        (wire.statements(), wire.round_trips()),
        (2, 2),
        "a duplicate delivery: {wire:?}"
    );

    // A refused write: the write, then one read to classify it.
    let _ = store
        .complete(copy, Response::from("b"))
        .await
        .unwrap()
        .rejection()
        .cloned()
        .unwrap();
    let wire = proxy.take();
    assert_eq!(
        (wire.statements(), wire.round_trips()),
        (2, 2),
        "a rejection: {wire:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_ten_is_one_round_trip_to_claim_and_one_to_complete() {
    let f = common::fixture().await;
    let proxy = WireProxy::start(f.url()).await;
    let store = proxy.store(&f, 1).await;
    let mut conn = store.pool().acquire().await.unwrap();
    let mut batches = Vec::new();
    for round in 0..2 {
        let mut ids = Vec::new();
        for i in 0..10 {
            let key = format!("batch-{round}-{i}");
            ids.push(
                store
                    .on(&mut conn)
                    .submit(common::new_task(&key).policy(prompt_retry()))
                    .await
                    .unwrap()
                    .into_task()
                    .id,
            );
        }
        batches.push(ids);
    }
    drop(conn);
    let request = ClaimRequest::new("w", LEASE);

    // The first batch prepares both statements; the second is counted.
    let mut counted = Vec::new();
    for ids in &batches {
        proxy.take();
        let claims = store.claim_many(ids, request.clone()).await.unwrap();
        let claimed = proxy.take();
        let leases: Vec<_> = claims
            .into_iter()
            .map(|c| match c {
                Claim::Acquired(lease) => (lease, Response::from("answer")),
                other => panic!("fresh task: {other:?}"),
            })
            .collect();
        let saved = store.complete_many(leases).await.unwrap();
        let completed = proxy.take();
        assert!(saved.iter().all(|r| matches!(r, Ok(f) if f.is_accepted())));
        counted.push((claimed, completed));
    }
    let (claimed, completed) = counted[1];
    println!("claim_many of 10 {claimed:?}; complete_many of 10 {completed:?}");
    for (op, wire) in [("claim_many", claimed), ("complete_many", completed)] {
        assert_eq!(
            (wire.simple_queries, wire.parses, wire.executes, wire.requests),
            (0, 0, 1, 1),
            "{op} of 10 tasks: one statement, one round trip"
        );
    }
}

/// `submit_many` of a hundred new tasks is one statement in one round trip,
/// and so is a hundred resubmissions of them (the batch dedups in the same
/// statement).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_a_hundred_submissions_is_one_round_trip() {
    let f = common::fixture().await;
    let proxy = WireProxy::start(f.url()).await;
    let store = proxy.store(&f, 1).await;
    let batch = |round: usize| -> Vec<_> {
        (0..100)
            .map(|i| common::new_task(&format!("bulk-{round}-{i}")))
            .collect()
    };
    // The first batch prepares the statement; the next two are counted.
    store.submit_many(batch(0)).await.unwrap();
    proxy.take();
    let created = store.submit_many(batch(1)).await.unwrap();
    let first = proxy.take();
    let again = store.submit_many(batch(1)).await.unwrap();
    let resubmitted = proxy.take();
    assert!(created.iter().all(|a| a.as_ref().is_ok_and(|s| s.is_created())));
    assert!(again.iter().all(|a| a.as_ref().is_ok_and(|s| !s.is_created())));
    for (what, wire) in [("new", first), ("resubmitted", resubmitted)] {
        assert_eq!(
            (wire.simple_queries, wire.parses, wire.executes, wire.requests),
            (0, 0, 1, 1),
            "submit_many of 100 {what} tasks: one statement, one round trip"
        );
    }
}
