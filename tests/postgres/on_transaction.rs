//! `PgStore::on(&mut tx)` is a whole store: the conformance and inspection
//! suites pass against the store on one open transaction (`PgTxFixture`),
//! and what takes a store — a `&dyn TaskStore`, an interceptor,
//! `metrics::observe` — runs inside the caller's transaction and rolls back
//! with it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use taskfence::effect::{EffectOutcome, EffectStart, EffectState};
use taskfence::inspect::Inspect;
use taskfence::intercept::{Call, Intercept, Intercepted, Outcome, Pending};
use taskfence::testing::PgTxFixture;
use taskfence::{Response, Status, TaskStore};

use crate::common::{self, new_task};

async fn fixture() -> PgTxFixture {
    PgTxFixture::new(common::fixture().await).await
}

taskfence::testing::conformance_suite!(fixture());

mod inspection {
    taskfence::testing::inspection_suite!(super::fixture());
}

/// Claims rolled back to a savepoint of the handle's transaction.
mod rollback {
    taskfence::testing::rollback_suite!(super::fixture());
}

/// Counts the calls it sees, then runs them.
#[derive(Default)]
struct Counting(AtomicUsize);

#[async_trait::async_trait]
impl Intercept for Counting {
    async fn around<'a, T: Outcome + Send + 'a>(
        &'a self,
        _: Call,
        run: Pending<'a, T>,
    ) -> taskfence::Result<T> {
        self.0.fetch_add(1, Ordering::SeqCst);
        run.await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interceptor_around_the_handle_runs_in_the_callers_transaction() {
    let f = common::fixture().await;
    let store = f.pg_store();
    let mut tx = store.pool().begin().await.unwrap();
    let (task, calls) = {
        let wrapped = Intercepted::new(Arc::new(store.on(&mut tx)), Counting::default());
        let task = wrapped.submit(new_task("k1")).await.unwrap().into_task();
        let lease = common::acquire(&wrapped, task.id, "w").await;
        let done = wrapped.complete(lease, Response::from("answer")).await.unwrap();
        assert!(done.is_accepted(), "completed inside the transaction");
        let inside = wrapped.get(task.id).await.unwrap().expect("visible inside");
        assert_eq!(inside.status, Status::Completed);
        assert_eq!(
            wrapped.counts(None).await.unwrap().completed,
            1,
            "Inspect is forwarded too"
        );
        (task, wrapped.interceptor().0.load(Ordering::SeqCst))
    };
    assert_eq!(
        calls, 5,
        "submit, claim, complete, get and counts went through the interceptor"
    );
    assert!(
        store.get(task.id).await.unwrap().is_none(),
        "nothing seen before the commit"
    );
    tx.rollback().await.unwrap();
    assert!(
        store.get(task.id).await.unwrap().is_none(),
        "the rollback undid the submission"
    );
    assert_eq!(
        f.count("tasks").await + f.count("attempts").await + f.count("handoffs").await,
        0
    );
    assert!(
        store.submit(new_task("k1")).await.unwrap().is_created(),
        "the key is free again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_observe_around_the_handle_commits_with_the_callers_transaction() {
    let f = common::fixture().await;
    let store = f.pg_store();
    let task = store.submit(new_task("k1")).await.unwrap().into_task();
    let lease = common::acquire(store, task.id, "w").await;
    let mut tx = store.pool().begin().await.unwrap();
    {
        let observed = taskfence::metrics::observe(store.on(&mut tx));
        let done = observed.complete(lease, Response::from("answer")).await.unwrap();
        assert!(done.is_accepted());
    }
    assert_eq!(
        store.get(task.id).await.unwrap().unwrap().status,
        Status::Running,
        "not completed for others before the commit"
    );
    tx.commit().await.unwrap();
    let saved = store.get(task.id).await.unwrap().unwrap();
    assert_eq!(
        (saved.status, saved.response),
        (Status::Completed, Some(Response::from("answer")))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_written_against_any_store_runs_in_the_callers_transaction() {
    async fn enqueue(store: &dyn TaskStore, key: &str) -> taskfence::TaskId {
        store.submit(new_task(key)).await.unwrap().into_task().id
    }
    let f = common::fixture().await;
    let store = f.pg_store();
    let mut tx = store.pool().begin().await.unwrap();
    let rolled_back = enqueue(&store.on(&mut tx), "k1").await;
    tx.rollback().await.unwrap();
    let mut tx = store.pool().begin().await.unwrap();
    let committed = enqueue(&store.on(&mut tx), "k2").await;
    tx.commit().await.unwrap();
    assert!(store.get(rolled_back).await.unwrap().is_none());
    assert_eq!(
        store.get(committed).await.unwrap().unwrap().status,
        Status::Pending
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn effect_records_commit_or_roll_back_with_the_callers_transaction() {
    let f = common::fixture().await;
    let store = f.pg_store();
    let task = store.submit(new_task("k1")).await.unwrap().into_task();
    let lease = common::acquire(store, task.id, "w").await;

    // An intent recorded in a transaction that rolls back leaves nothing.
    let mut tx = store.pool().begin().await.unwrap();
    {
        let on = store.on(&mut tx);
        let start = on
            .begin_effect(&lease, "notify")
            .await
            .unwrap()
            .into_result()
            .unwrap();
        assert!(
            matches!(start, EffectStart::Call { ambiguous: None, .. }),
            "{start:?}"
        );
        assert_eq!(
            on.effects(task.id).await.unwrap().len(),
            1,
            "the intent, seen inside"
        );
    }
    assert!(
        store.effects(task.id).await.unwrap().is_empty(),
        "not seen outside before the commit"
    );
    tx.rollback().await.unwrap();
    assert!(
        store.effects(task.id).await.unwrap().is_empty(),
        "the rollback undid the intent"
    );

    // Intent and outcome in one committed transaction: done, once.
    let mut tx = store.pool().begin().await.unwrap();
    {
        let on = store.on(&mut tx);
        let start = on
            .begin_effect(&lease, "notify")
            .await
            .unwrap()
            .into_result()
            .unwrap();
        assert!(
            matches!(start, EffectStart::Call { ambiguous: None, .. }),
            "a rolled-back intent is no ambiguity: {start:?}"
        );
        let done = on
            .finish_effect(&lease, "notify", EffectOutcome::done("msg-1"))
            .await
            .unwrap();
        assert!(done.is_accepted());
    }
    tx.commit().await.unwrap();
    let effects = store.effects(task.id).await.unwrap();
    assert_eq!(effects.len(), 1);
    assert_eq!(
        (effects[0].state, effects[0].reference.as_deref()),
        (EffectState::Done, Some("msg-1"))
    );
}
