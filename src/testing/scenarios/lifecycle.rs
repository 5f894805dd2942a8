//! The rest of a task's life: release, cancel, operation ids, unknown ids, stored text.

use super::*;
use crate::error::Error;
use crate::store::{AttemptOutcome, Fenced, Rejection};
use crate::task::{InputHash, NewTask, RequestKey, Response, Status, TaskId};
use crate::testing::Fixture;

/// Release gives the task back at once; the attempt stays counted and the old lease is dead.
pub async fn release_gives_task_back_and_keeps_attempt(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, new_task("send-1")).await;
    let lease = acquire(&*store, t.id, "shutting-down").await;
    let kept = lease.clone();
    assert!(store.release(lease).await.unwrap().is_accepted());
    let released = task(&*store, t.id).await;
    assert_eq!((released.status, released.attempts()), (Status::Pending, 1));
    assert_eq!(
        store
            .complete(kept, Response::from("after release"))
            .await
            .unwrap()
            .rejection(),
        Some(&Rejection::NotRunning(Status::Pending))
    );
    let next = acquire(&*store, t.id, "next").await;
    assert_eq!(next.attempt(), 2, "no wait after a release, and it counted");
    assert_eq!(
        store.attempts(t.id).await.unwrap()[0].outcome,
        AttemptOutcome::Released
    );
}

/// Cancel is terminal; a worker still running the task is rejected with `NotRunning`.
pub async fn cancel_stops_running_worker(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, new_task("send-1")).await;
    let mut lease = acquire(&*store, t.id, "a").await;
    let cancelled = store
        .cancel(t.id, "user deleted the message")
        .await
        .unwrap()
        .accepted()
        .expect("accepted");
    assert_eq!(cancelled.status, Status::Cancelled);
    assert_eq!(cancelled.last_error.as_deref(), Some("user deleted the message"));
    let not_running = Rejection::NotRunning(Status::Cancelled);
    assert_eq!(
        store.renew(&mut lease, LEASE).await.unwrap().rejection(),
        Some(&not_running)
    );
    assert_eq!(
        store
            .complete(lease, Response::from("too late"))
            .await
            .unwrap()
            .rejection(),
        Some(&not_running)
    );
    assert!(matches!(
        store.claim(t.id, request("b")).await.unwrap(),
        Claim::Cancelled(_)
    ));
    assert!(
        store.cancel(t.id, "again").await.unwrap().is_accepted(),
        "cancel is idempotent"
    );

    let done = submit(&*store, new_task("send-2")).await;
    let lease = acquire(&*store, done.id, "a").await;
    assert!(
        store
            .complete(lease, Response::from("kept"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert!(matches!(
        store.cancel(done.id, "late").await.unwrap(),
        Fenced::Rejected(Rejection::AlreadyCompleted(_))
    ));
    assert_eq!(
        task(&*store, done.id).await.response,
        Some(Response::from("kept"))
    );
    assert!(matches!(
        store.cancel(TaskId::new(), "x").await,
        Err(Error::NotFound(_))
    ));
}

/// `record_operation` is durable and shows in `attempts`.
pub async fn record_operation_is_visible_in_attempts(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, new_task("send-1")).await;
    let lease = acquire(&*store, t.id, "a").await;
    assert!(
        store
            .record_operation(&lease, "provider-op-123")
            .await
            .unwrap()
            .is_accepted()
    );
    let attempts = store.attempts(t.id).await.unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].operation_id.as_deref(), Some("provider-op-123"));
    assert_eq!(attempts[0].id, lease.attempt_id());
}

/// Unknown ids: claim answers `NotFound`, fenced writes and cancel fail with `Error::NotFound`.
pub async fn unknown_task_is_not_found(f: &dyn Fixture) {
    let store = f.store();
    let unknown = TaskId::new();
    assert!(matches!(
        store.claim(unknown, request("a")).await.unwrap(),
        Claim::NotFound
    ));
    assert!(store.get(unknown).await.unwrap().is_none());
    assert!(store.attempts(unknown).await.unwrap().is_empty());
    // A lease from another store: its task does not exist here.
    let other = crate::testing::MemoryFixture::new();
    let foreign_task = submit(&*other.store(), new_task("elsewhere")).await;
    let foreign = acquire(&*other.store(), foreign_task.id, "a").await;
    let records = f.record_count().await;
    assert!(
        matches!(store.complete(foreign, Response::from("x")).await, Err(Error::NotFound(id)) if id == foreign_task.id)
    );
    assert_eq!(f.record_count().await, records);
}

/// Quotes, SQL metacharacters, backslashes and non-ASCII text are data, stored verbatim.
pub async fn strings_are_stored_verbatim(f: &dyn Fixture) {
    let store = f.store();
    let nasty = "'; DROP TABLE tasks; -- \\ \" % _ $1 ∂ 日本 🚀";
    let k = RequestKey::new(nasty, nasty, nasty);
    let t = submit(
        &*store,
        NewTask::new(k.clone(), InputHash::of([nasty])).payload(nasty.as_bytes().to_vec()),
    )
    .await;
    let found = store.find(&k).await.unwrap().expect("found by the same strings");
    assert_eq!(found.key, k);
    assert_eq!(found.payload, nasty.as_bytes());
    let lease = acquire(&*store, t.id, nasty).await;
    assert!(store.record_operation(&lease, nasty).await.unwrap().is_accepted());
    let response = Response::new(vec![0u8, 159, 146, 150, 255]); // not UTF-8: bytes are bytes
    assert!(
        store
            .complete(lease, response.clone())
            .await
            .unwrap()
            .is_accepted()
    );
    let done = task(&*store, t.id).await;
    assert_eq!(done.response, Some(response));
    let attempt = &store.attempts(t.id).await.unwrap()[0];
    assert_eq!(
        (attempt.worker.as_str(), attempt.operation_id.as_deref()),
        (nasty, Some(nasty))
    );
}

/// The submitter's trace context is stored with the task and read back
/// everywhere the task is: the submission's answer, `get`, a lease.
pub async fn trace_context_is_stored_with_the_task(f: &dyn Fixture) {
    use crate::trace::TraceContext;
    let store = f.store();
    let cx = TraceContext::new(
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7",
    )
    .expect("a valid context");
    let traced = submit(&*store, new_task("traced").trace_context(cx.clone())).await;
    assert_eq!(traced.trace_context.as_ref(), Some(&cx));
    assert_eq!(task(&*store, traced.id).await.trace_context.as_ref(), Some(&cx));
    let lease = acquire(&*store, traced.id, "w").await;
    assert_eq!(
        lease.task().trace_context.as_ref(),
        Some(&cx),
        "the worker gets it"
    );

    let untraced = submit(&*store, new_task("untraced")).await;
    assert_eq!(task(&*store, untraced.id).await.trace_context, None);
}
