//! Fencing on the real server: takeovers, renewals, and the completion guard
//! evaluated after the row lock is held (a locking transaction's decision, in one statement).

use crate::common;

use std::time::Duration;

use sqlx::Row;
use taskfence::store::AttemptOutcome;
use taskfence::testing::{Fixture, PgFixture};
use taskfence::{Claim, ClaimRequest, Fenced, Lease, Rejection, Response, Status, TaskId, TaskStore};

const LEASE: Duration = Duration::from_secs(30);

use common::new_task;

/// The kit's `acquire` with a lease length of the test's choosing (these tests expire leases).
async fn acquire(store: &dyn TaskStore, id: TaskId, worker: &str, lease: Duration) -> Lease {
    match store.claim(id, ClaimRequest::new(worker, lease)).await.unwrap() {
        Claim::Acquired(lease) => lease,
        other => panic!("{worker}: expected Acquired, got {other:?}"),
    }
}

/// Holds the task's row lock in an open transaction, as a takeover or renewal in flight would.
async fn lock_row(f: &PgFixture, id: TaskId) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = f.pg_store().pool().begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT 1 FROM \"{}\".tasks WHERE id = $1 FOR UPDATE",
        f.schema()
    )))
    .bind(id.as_uuid())
    .execute(&mut *tx)
    .await
    .unwrap();
    tx
}

/// The store clock, read on the server.
async fn store_clock(f: &PgFixture) -> time::OffsetDateTime {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT \"{}\".store_clock()",
        f.schema()
    )))
    .fetch_one(f.pg_store().pool())
    .await
    .unwrap()
    .get(0)
}

/// Whether the store clock has passed `until`.
async fn store_clock_passed(f: &PgFixture, until: time::OffsetDateTime) -> bool {
    store_clock(f).await > until
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_worker_returns_after_takeover_is_superseded_and_the_new_answer_stands() {
    let f = common::fixture().await;
    let store = f.store();
    let task = store.submit(new_task("k")).await.unwrap().into_task();
    let paused = acquire(&*store, task.id, "paused", LEASE).await;
    f.advance(LEASE + Duration::from_secs(1)).await; // the worker is stuck past its lease
    let fresh = acquire(&*store, task.id, "fresh", LEASE).await;
    assert!(
        store
            .complete(fresh, Response::from("fresh"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert_eq!(
        store
            .complete(paused, Response::from("stale"))
            .await
            .unwrap()
            .rejection(),
        Some(&Rejection::AlreadyCompleted(Box::new(
            store.get(task.id).await.unwrap().unwrap()
        ))),
        "a completed task reports itself first, with the saved answer"
    );
    // The same return before the new worker saved: Superseded.
    let task = store.submit(new_task("k2")).await.unwrap().into_task();
    let paused = acquire(&*store, task.id, "paused", LEASE).await;
    f.advance(LEASE + Duration::from_secs(1)).await;
    let fresh = acquire(&*store, task.id, "fresh", LEASE).await;
    assert_eq!(
        store
            .complete(paused, Response::from("stale"))
            .await
            .unwrap()
            .rejection(),
        Some(&Rejection::Superseded { current_version: 2 })
    );
    assert!(
        store
            .complete(fresh, Response::from("fresh"))
            .await
            .unwrap()
            .is_accepted()
    );
    let saved = store.get(task.id).await.unwrap().unwrap();
    assert_eq!(
        saved.response,
        Some(Response::from("fresh")),
        "the new worker's answer stands"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_keep_a_long_call_alive_and_renew_after_takeover_fails() {
    let f = common::fixture().await;
    let store = f.store();
    let task = store.submit(new_task("k")).await.unwrap().into_task();
    let mut lease = acquire(&*store, task.id, "long", LEASE).await;
    let first_expiry = lease.expires_at();
    for _ in 0..4 {
        f.advance(Duration::from_secs(20)).await;
        assert!(store.renew(&mut lease, LEASE).await.unwrap().is_accepted());
        assert!(matches!(
            store
                .claim(task.id, ClaimRequest::new("other", LEASE))
                .await
                .unwrap(),
            Claim::Busy { .. }
        ));
    }
    assert!(lease.expires_at() >= first_expiry + Duration::from_secs(80));
    assert!(
        store
            .complete(lease, Response::from("long answer"))
            .await
            .unwrap()
            .is_accepted()
    );

    let task = store.submit(new_task("k2")).await.unwrap().into_task();
    let mut lapsed = acquire(&*store, task.id, "lapsed", LEASE).await;
    f.advance(LEASE + Duration::from_secs(1)).await;
    let _taker = acquire(&*store, task.id, "taker", LEASE).await;
    assert_eq!(
        store.renew(&mut lapsed, LEASE).await.unwrap().rejection(),
        Some(&Rejection::Superseded { current_version: 2 })
    );
}

/// The row lock comes first, then the lease is checked against
/// `clock_timestamp()`. A completion that starts while its lease is live but
/// must wait for the row lock until the lease has passed is refused: the
/// guard reads the clock after the wait, not when the statement started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_waiting_for_the_row_lock_checks_the_lease_after_the_wait() {
    let f = common::fixture().await;
    let store = f.pg_store().clone();
    let task = store.submit(new_task("k")).await.unwrap().into_task();
    let lease = acquire(&store, task.id, "w", Duration::from_secs(3)).await;
    let holder = lock_row(&f, task.id).await;
    let until = lease.expires_at();
    let completion = tokio::spawn({
        let store = store.clone();
        async move { store.complete(lease, Response::from("late")).await.unwrap() }
    });
    common::wait_until_blocked(&f, "SELECT 'completed'").await;
    assert!(
        !store_clock_passed(&f, until).await,
        "the completion started while its lease was live"
    );
    common::eventually(Duration::from_secs(10), || async {
        store_clock_passed(&f, until).await.then_some(())
    })
    .await;
    holder.commit().await.unwrap();
    assert_eq!(
        completion.await.unwrap().rejection(),
        Some(&Rejection::LeaseExpired)
    );
    let after = store.get(task.id).await.unwrap().unwrap();
    assert_eq!(
        (after.status, after.response),
        (Status::Running, None),
        "nothing saved"
    );
}

/// A completion that waits for the lock of a takeover in flight re-evaluates
/// its guard against the row the takeover committed (EvalPlanQual), and is
/// refused as superseded; the new assignment then saves its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_waiting_behind_a_takeover_is_superseded() {
    let f = common::fixture().await;
    let store = f.pg_store().clone();
    let task = store.submit(new_task("k")).await.unwrap().into_task();
    let lease = acquire(&store, task.id, "paused", Duration::from_secs(3)).await;
    let until = lease.expires_at();
    let mut takeover = lock_row(&f, task.id).await;
    let completion = tokio::spawn({
        let store = store.clone();
        async move { store.complete(lease, Response::from("stale")).await.unwrap() }
    });
    common::wait_until_blocked(&f, "SELECT 'completed'").await;
    assert!(!store_clock_passed(&f, until).await, "started while live");
    common::eventually(Duration::from_secs(10), || async {
        store_clock_passed(&f, until).await.then_some(())
    })
    .await;
    let Claim::Acquired(fresh) = store
        .on(&mut takeover)
        .claim(task.id, ClaimRequest::new("fresh", LEASE))
        .await
        .unwrap()
    else {
        panic!("the lease has expired: the takeover acquires")
    };
    takeover.commit().await.unwrap();
    assert_eq!(
        completion.await.unwrap().rejection(),
        Some(&Rejection::Superseded { current_version: 2 })
    );
    assert!(
        store
            .complete(fresh, Response::from("fresh"))
            .await
            .unwrap()
            .is_accepted()
    );
    let outcomes: Vec<_> = store
        .attempts(task.id)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.outcome)
        .collect();
    assert_eq!(outcomes, [AttemptOutcome::Expired, AttemptOutcome::Completed]);
}

/// Completions racing takeovers, many times over: whatever the interleaving,
/// at most one answer is saved and it belongs to the assignment that was
/// current when it was saved.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn completions_racing_takeovers_save_one_answer_from_a_current_assignment() {
    let f = common::fixture_with(8).await;
    let store = f.pg_store().clone();
    for round in 0..20 {
        let task = store
            .submit(new_task(&format!("k{round}")))
            .await
            .unwrap()
            .into_task();
        let old = acquire(&store, task.id, "old", Duration::from_millis(200)).await;
        // Wait (store clock) until the old lease is over, then race its
        // completion against a takeover and the takeover's completion.
        let until = old.expires_at();
        common::eventually(Duration::from_secs(10), || async {
            store_clock_passed(&f, until).await.then_some(())
        })
        .await;
        let late = tokio::spawn({
            let store = store.clone();
            async move { store.complete(old, Response::from("old")).await.unwrap() }
        });
        let takeover = tokio::spawn({
            let store = store.clone();
            async move {
                match store
                    .claim(task.id, ClaimRequest::new("new", LEASE))
                    .await
                    .unwrap()
                {
                    Claim::Acquired(lease) => store.complete(lease, Response::from("new")).await.unwrap(),
                    other => panic!("takeover after expiry must acquire: {other:?}"),
                }
            }
        });
        let (late, new) = (late.await.unwrap(), takeover.await.unwrap());
        assert!(!late.is_accepted(), "round {round}: an expired lease never saves");
        assert!(
            matches!(new, Fenced::Accepted(_)),
            "round {round}: the current assignment saves"
        );
        let saved = store.get(task.id).await.unwrap().unwrap();
        assert_eq!(saved.response, Some(Response::from("new")), "round {round}");
    }
}

/// A task's first claim is a bare guarded `UPDATE` (no lock step first): it
/// waits behind a competitor's claim in an open transaction like any
/// `UPDATE`, and once that commits, re-evaluates its guard on the row the
/// competitor wrote (EvalPlanQual). It answers `Busy`; the one lease is the
/// competitor's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_claim_waiting_behind_a_competing_claim_answers_busy() {
    let f = common::fixture().await;
    let store = f.pg_store().clone();
    let task = store.submit(new_task("k")).await.unwrap().into_task();
    let mut competitor = store.pool().begin().await.unwrap();
    let Claim::Acquired(held) = store
        .on(&mut competitor)
        .claim(task.id, ClaimRequest::new("competitor", LEASE))
        .await
        .unwrap()
    else {
        panic!("the first claim of a pending task acquires")
    };
    let waiting = tokio::spawn({
        let store = store.clone();
        async move {
            store
                .claim(task.id, ClaimRequest::new("late", LEASE))
                .await
                .unwrap()
        }
    });
    common::wait_until_blocked(&f, "SET (version, status").await;
    competitor.commit().await.unwrap();
    match waiting.await.unwrap() {
        Claim::Busy { until, .. } => assert_eq!(until, held.expires_at()),
        other => panic!("expected Busy behind the competitor's lease, got {other:?}"),
    }
    assert!(
        store
            .complete(held, Response::from("answer"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert_eq!(store.attempts(task.id).await.unwrap().len(), 1, "one attempt");
}

/// Behind a holder that only locked the row (no new row version, so no
/// recheck), the waiting first claim takes the task once the lock is gone,
/// decided and dated when its guard was evaluated: the wait counts against
/// the lease, never beyond it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_claim_waiting_behind_a_lock_only_holder_counts_the_wait_against_its_lease() {
    let f = common::fixture().await;
    let store = f.pg_store().clone();
    let task = store.submit(new_task("k")).await.unwrap().into_task();
    let holder = lock_row(&f, task.id).await;
    let waiting = tokio::spawn({
        let store = store.clone();
        async move { store.claim(task.id, ClaimRequest::new("w", LEASE)).await.unwrap() }
    });
    common::wait_until_blocked(&f, "SET (version, status").await;
    f.advance(Duration::from_secs(10)).await;
    let released = store_clock(&f).await;
    holder.commit().await.unwrap();
    let Claim::Acquired(lease) = waiting.await.unwrap() else {
        panic!("a lock that changed nothing leaves the task available")
    };
    assert!(
        lease.expires_at() > released && lease.expires_at() + Duration::from_secs(10) <= released + LEASE,
        "lease until {} for a lock released at {released}",
        lease.expires_at()
    );
    assert_eq!(
        (lease.version(), store.attempts(task.id).await.unwrap().len()),
        (1, 1)
    );
}

/// `PgStore::on(&mut tx).fence(&lease)`: the caller's own rows, written in
/// the fenced transaction, commit under a current lease; once the lease is
/// superseded the fence refuses and the worker's writes are rolled back; and
/// while the fenced transaction is open, a takeover waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_callers_own_writes_commit_only_under_a_current_lease() {
    let f = common::fixture().await;
    let pg = f.pg_store().clone();
    let progress = format!("\"{}\".progress", f.schema());
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {progress} (task_id uuid NOT NULL, worker text NOT NULL, step int NOT NULL)"
    )))
    .execute(pg.pool())
    .await
    .unwrap();
    let rows = || {
        let (pool, progress) = (pg.pool().clone(), progress.clone());
        async move {
            sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(format!(
                "SELECT worker || ':' || step FROM {progress} ORDER BY worker, step"
            )))
            .fetch_all(&pool)
            .await
            .unwrap()
        }
    };
    let task = pg.submit(new_task("k")).await.unwrap().into_task();
    let paused = acquire(&pg, task.id, "paused", LEASE).await;

    // A current lease: the write commits.
    let mut tx = pg.pool().begin().await.unwrap();
    assert!(pg.on(&mut tx).fence(&paused).await.unwrap().is_accepted());
    write(&mut tx, &progress, "paused", 1, task.id).await;
    tx.commit().await.unwrap();

    // Held: with the fence taken, a takeover (the lease has run out meanwhile) waits for the commit.
    let mut tx = pg.pool().begin().await.unwrap();
    assert!(pg.on(&mut tx).fence(&paused).await.unwrap().is_accepted());
    f.advance(LEASE + Duration::from_secs(1)).await;
    let taker = {
        let pg = pg.clone();
        tokio::spawn(async move { acquire(&pg, task.id, "fresh", LEASE).await })
    };
    common::wait_until_blocked(&f, "FOR NO KEY UPDATE").await;
    write(&mut tx, &progress, "paused", 2, task.id).await;
    tx.commit().await.unwrap();
    let fresh = taker.await.unwrap();
    assert_eq!(fresh.version(), 2, "the takeover went ahead after the commit");

    // Superseded: the paused worker's next write is refused and rolled back.
    let mut tx = pg.pool().begin().await.unwrap();
    write(&mut tx, &progress, "paused", 3, task.id).await; // written before it checked …
    assert_eq!(
        pg.on(&mut tx).fence(&paused).await.unwrap().rejection(),
        Some(&Rejection::Superseded { current_version: 2 })
    );
    tx.rollback().await.unwrap(); // … and gone with the transaction
    let mut tx = pg.pool().begin().await.unwrap();
    assert!(pg.on(&mut tx).fence(&fresh).await.unwrap().is_accepted());
    write(&mut tx, &progress, "fresh", 1, task.id).await;
    tx.commit().await.unwrap();
    assert_eq!(rows().await, ["fresh:1", "paused:1", "paused:2"]);

    // Expired with nobody taking over, and after the save: refused as well.
    assert!(
        pg.complete(fresh.clone(), Response::from("done"))
            .await
            .unwrap()
            .is_accepted()
    );
    let mut tx = pg.pool().begin().await.unwrap();
    assert!(matches!(
        pg.on(&mut tx).fence(&fresh).await.unwrap().rejection(),
        Some(Rejection::AlreadyCompleted(_))
    ));
}

/// One row of the application's own, written in the caller's transaction.
async fn write(tx: &mut sqlx::PgConnection, progress: &str, worker: &str, step: i32, id: TaskId) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {progress} (task_id, worker, step) VALUES ($1, $2, $3)"
    )))
    .bind(id.as_uuid())
    .bind(worker)
    .bind(step)
    .execute(tx)
    .await
    .unwrap();
}

/// A fence, or an effect's fenced write, that has to wait for a cancel
/// holding the task's row checks the row the cancel wrote, not the older
/// snapshot its statement started from: refused, and nothing recorded.
#[tokio::test]
async fn a_fence_waiting_behind_a_cancel_checks_the_row_the_cancel_wrote() {
    let f = common::fixture().await;
    let pg = f.pg_store().clone();
    for (n, check) in ["fence", "begin_effect"].into_iter().enumerate() {
        let task = pg.submit(new_task(&format!("k{n}"))).await.unwrap().into_task();
        let lease = acquire(&pg, task.id, "worker", LEASE).await;
        let mut cancelling = pg.pool().begin().await.unwrap();
        assert!(
            pg.on(&mut cancelling)
                .cancel(task.id, "operator")
                .await
                .unwrap()
                .is_accepted()
        );
        let checking = {
            let (pg, lease) = (pg.clone(), lease.clone());
            tokio::spawn(async move {
                if check == "fence" {
                    let mut tx = pg.pool().begin().await.unwrap();
                    pg.on(&mut tx).fence(&lease).await.unwrap()
                } else {
                    pg.begin_effect(&lease, "notify-user").await.unwrap().map(|_| ())
                }
            })
        };
        common::wait_until_blocked(&f, "FOR SHARE").await;
        cancelling.commit().await.unwrap();
        assert_eq!(
            checking.await.unwrap().rejection(),
            Some(&Rejection::NotRunning(Status::Cancelled)),
            "{check}"
        );
        assert!(
            pg.effects(task.id).await.unwrap().is_empty(),
            "{check}: nothing recorded"
        );
    }
}
