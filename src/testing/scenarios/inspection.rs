//! [`Inspect`]: listings, counts, a task's story and stranded tasks answer
//! the same on every backend. Run by [`inspection_suite!`](crate::testing::inspection_suite).

use std::collections::BTreeSet;
use std::time::Duration;

use super::*;
use crate::error::Error;
use crate::inspect::{
    CappedCounts, Count, Counts, Inspect, Order, QueueDepth, STATUSES, TaskQuery, TaskSummary,
};
use crate::limits;
use crate::policy::{Failure, RetryPolicy};
use crate::store::{AttemptOutcome, ReopenRequest};
use crate::task::{Response, Status};
use crate::testing::InspectFixture;

/// Every page of `query`, followed by cursor: the tasks' ids in order.
async fn all_pages(store: &dyn Inspect, query: TaskQuery) -> Vec<TaskId> {
    let mut query = query;
    let mut ids = Vec::new();
    loop {
        let page = store.list(&query).await.expect("list");
        assert!(page.tasks.len() <= query.limit, "a page never exceeds its limit");
        ids.extend(page.tasks.iter().map(|t| t.id));
        match page.next {
            Some(next) => {
                assert_eq!(page.tasks.len(), query.limit, "only a full page has a next one");
                assert_eq!(
                    Some(next.task_id()),
                    ids.last().copied(),
                    "the cursor is the page's last task"
                );
                query = query.after(next);
            }
            None => return ids,
        }
    }
}

/// Tasks in each state across two scopes and two operations: (ids by status, scope-b's ids).
async fn populate(f: &dyn InspectFixture) -> (Vec<(Status, TaskId)>, Vec<TaskId>) {
    let store = f.inspector();
    let mut made = Vec::new();
    let mut scope_b = Vec::new();
    for i in 0..5 {
        let t = submit(&*store, new_task(&format!("pending-{i}"))).await;
        made.push((Status::Pending, t.id));
    }
    for i in 0..3 {
        let key = RequestKey::new("scope-b", "index.document", format!("doc-{i}"));
        let t = submit(&*store, NewTask::new(key, InputHash::of([format!("{i}")]))).await;
        made.push((Status::Pending, t.id));
        scope_b.push(t.id);
    }
    let running = submit(&*store, new_task("running")).await;
    let _held = acquire(&*store, running.id, "a").await;
    let done = submit(&*store, new_task("done")).await;
    let lease = acquire(&*store, done.id, "a").await;
    assert!(
        store
            .complete(lease, Response::from("ok"))
            .await
            .unwrap()
            .is_accepted()
    );
    let failed = submit(&*store, new_task("failed")).await;
    let lease = acquire(&*store, failed.id, "a").await;
    assert!(
        store
            .fail(lease, Failure::permanent("bad input"))
            .await
            .unwrap()
            .is_accepted()
    );
    let cancelled = submit(&*store, new_task("cancelled")).await;
    assert!(
        store
            .cancel(cancelled.id, "user left")
            .await
            .unwrap()
            .is_accepted()
    );
    made.extend([
        (Status::Running, running.id),
        (Status::Completed, done.id),
        (Status::Failed, failed.id),
        (Status::Cancelled, cancelled.id),
    ]);
    (made, scope_b)
}

/// `list` filters by status, scope and operation, runs newest or oldest first
/// by id, and its cursor visits every matching task exactly once.
pub async fn list_filters_orders_and_pages(f: &dyn InspectFixture) {
    let store = f.inspector();
    let (made, scope_b) = populate(f).await;
    let mut all: Vec<TaskId> = made.iter().map(|(_, id)| *id).collect();
    all.sort();
    let newest_first: Vec<TaskId> = all.iter().rev().copied().collect();

    let page = store.list(&TaskQuery::new()).await.unwrap();
    assert_eq!(page.tasks.iter().map(|t| t.id).collect::<Vec<_>>(), newest_first);
    assert_eq!(page.next, None, "everything fits in one default page");
    for limit in [1, 2, 3, 5] {
        assert_eq!(
            all_pages(&*store, TaskQuery::new().limit(limit)).await,
            newest_first,
            "limit {limit}"
        );
        assert_eq!(
            all_pages(&*store, TaskQuery::new().limit(limit).order(Order::OldestFirst)).await,
            all,
            "oldest first, limit {limit}"
        );
    }

    for status in [
        Status::Pending,
        Status::Running,
        Status::Completed,
        Status::Failed,
        Status::Cancelled,
    ] {
        let expected: BTreeSet<TaskId> = made
            .iter()
            .filter(|(s, _)| *s == status)
            .map(|(_, id)| *id)
            .collect();
        let listed = all_pages(&*store, TaskQuery::new().status(status).limit(2)).await;
        assert_eq!(
            listed.iter().copied().collect::<BTreeSet<_>>(),
            expected,
            "{status}"
        );
        assert_eq!(listed.len(), expected.len(), "{status}: each task once");
        let page = store.list(&TaskQuery::new().status(status)).await.unwrap();
        assert!(
            page.tasks.iter().all(|t| t.status == status),
            "{status}: full tasks of that status"
        );
    }

    let in_b = all_pages(
        &*store,
        TaskQuery::new()
            .scope("scope-b")
            .order(Order::OldestFirst)
            .limit(2),
    )
    .await;
    assert_eq!(in_b, scope_b);
    let by_operation = all_pages(&*store, TaskQuery::new().operation("index.document").limit(2)).await;
    assert_eq!(by_operation.len(), 3);
    let combined = TaskQuery::new()
        .scope("scope-a")
        .operation("chat.reply")
        .status(Status::Pending);
    assert_eq!(all_pages(&*store, combined).await.len(), 5);
    assert!(
        all_pages(&*store, TaskQuery::new().scope("nobody"))
            .await
            .is_empty()
    );
    assert!(
        all_pages(&*store, TaskQuery::new().scope("scope-b").operation("chat.reply"))
            .await
            .is_empty()
    );
}

/// `created_before` / `created_after` split tasks by the store's submission time.
pub async fn list_filters_by_age(f: &dyn InspectFixture) {
    let store = f.inspector();
    let old = submit(&*store, new_task("old")).await;
    f.advance(Duration::from_secs(600)).await;
    let new = submit(&*store, new_task("new")).await;
    assert!(new.created_at > old.created_at);
    let split = old.created_at + Duration::from_secs(300);
    let before = store.list(&TaskQuery::new().created_before(split)).await.unwrap();
    assert_eq!(before.tasks.iter().map(|t| t.id).collect::<Vec<_>>(), [old.id]);
    let after = store.list(&TaskQuery::new().created_after(split)).await.unwrap();
    assert_eq!(after.tasks.iter().map(|t| t.id).collect::<Vec<_>>(), [new.id]);
    let at = store
        .list(&TaskQuery::new().created_after(new.created_at))
        .await
        .unwrap();
    assert_eq!(at.tasks.len(), 1, "created_after includes its instant");
}

/// `counts` counts each status, in all scopes or one.
pub async fn counts_by_status_and_scope(f: &dyn InspectFixture) {
    let store = f.inspector();
    assert_eq!(store.counts(None).await.unwrap(), Counts::default());
    let (made, _) = populate(f).await;
    let counts = store.counts(None).await.unwrap();
    for status in [
        Status::Pending,
        Status::Running,
        Status::Completed,
        Status::Failed,
        Status::Cancelled,
    ] {
        let expected = made.iter().filter(|(s, _)| *s == status).count() as u64;
        assert_eq!(counts.get(status), expected, "{status}");
    }
    assert_eq!(counts.total(), made.len() as u64);
    let b = store.counts(Some("scope-b")).await.unwrap();
    assert_eq!((b.pending, b.total()), (3, 3));
    let a = store.counts(Some("scope-a")).await.unwrap();
    assert_eq!(a.total(), counts.total() - 3);
    assert_eq!(store.counts(Some("nobody")).await.unwrap(), Counts::default());
}

/// `story` tells the whole life: attempts, a takeover, the reopening with who,
/// why and when, and the task as it stands now.
pub async fn story_tells_attempts_and_reopenings(f: &dyn InspectFixture) {
    let store = f.inspector();
    assert_eq!(store.story(TaskId::new()).await.unwrap(), None);
    let t = submit(
        &*store,
        new_task("send-1").policy(RetryPolicy::default().max_attempts(2)),
    )
    .await;
    let _crashed = acquire(&*store, t.id, "crashes").await;
    f.advance(PAST_LEASE).await;
    let second = acquire(&*store, t.id, "takes-over").await;
    assert!(
        store
            .fail(second, Failure::permanent("refused"))
            .await
            .unwrap()
            .is_accepted()
    );
    let reopened = store
        .reopen(t.id, ReopenRequest::new("ops@example", "refusal fixed upstream"))
        .await
        .unwrap()
        .accepted()
        .unwrap();

    let story = store.story(t.id).await.unwrap().expect("known task");
    assert_eq!(story.task, reopened);
    let outcomes: Vec<_> = story
        .attempts
        .iter()
        .map(|a| (a.number, a.worker.as_str(), a.outcome))
        .collect();
    assert_eq!(
        outcomes,
        [
            (1, "crashes", AttemptOutcome::Expired),
            (
                2,
                "takes-over",
                AttemptOutcome::Failed(crate::policy::FailureKind::Permanent)
            ),
        ]
    );
    assert_eq!(story.reopenings.len(), 1);
    let r = &story.reopenings[0];
    assert_eq!(
        (r.task_id, r.number, r.version, r.from),
        (t.id, 1, 2, Status::Failed)
    );
    assert_eq!(
        (r.by.as_str(), r.reason.as_str()),
        ("ops@example", "refusal fixed upstream")
    );
    assert_eq!(
        r.at, reopened.budget_started_at,
        "recorded at the reopening's instant"
    );

    // A second reopening is numbered on.
    let lease = acquire(&*store, t.id, "third").await;
    assert!(
        store
            .cancel(t.id, "superseded by a new request")
            .await
            .unwrap()
            .is_accepted()
    );
    drop(lease);
    assert!(
        store
            .reopen(t.id, ReopenRequest::new("bob", ""))
            .await
            .unwrap()
            .is_accepted()
    );
    let story = store.story(t.id).await.unwrap().unwrap();
    let numbers: Vec<_> = story
        .reopenings
        .iter()
        .map(|r| (r.number, r.from, r.version))
        .collect();
    assert_eq!(numbers, [(1, Status::Failed, 2), (2, Status::Cancelled, 3)]);
    assert_eq!(story.attempts.len(), 3, "the journal keeps every attempt");
}

/// `stranded` lists pending tasks nobody ever claimed, once they are older
/// than the threshold: not claimed, backing-off, young or terminal ones.
pub async fn stranded_lists_unclaimed_pending_tasks(f: &dyn InspectFixture) {
    let store = f.inspector();
    let threshold = Duration::from_secs(600);
    let lost_1 = submit(&*store, new_task("lost-1")).await;
    let lost_2 = submit(&*store, new_task("lost-2")).await;
    let claimed = submit(&*store, new_task("claimed")).await;
    let _held = acquire(&*store, claimed.id, "a").await;
    let backing_off = submit(&*store, new_task("backing-off")).await;
    let lease = acquire(&*store, backing_off.id, "a").await;
    assert!(
        store
            .fail(lease, Failure::retryable("busy"))
            .await
            .unwrap()
            .is_accepted()
    );
    let cancelled = submit(&*store, new_task("cancelled")).await;
    assert!(store.cancel(cancelled.id, "no").await.unwrap().is_accepted());
    assert!(
        store.stranded(threshold, 100).await.unwrap().is_empty(),
        "nothing is old enough yet"
    );

    f.advance(threshold + Duration::from_secs(1)).await;
    let _young = submit(&*store, new_task("young")).await;
    let stranded: Vec<TaskId> = store
        .stranded(threshold, 100)
        .await
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(
        stranded,
        [lost_1.id, lost_2.id],
        "oldest first, only the never-claimed old ones"
    );
    let first: Vec<TaskId> = store
        .stranded(threshold, 1)
        .await
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(first, [lost_1.id], "the limit holds");

    // Claimed at last: no longer stranded.
    let lease = acquire(&*store, lost_1.id, "b").await;
    let stranded: Vec<TaskId> = store
        .stranded(threshold, 100)
        .await
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(stranded, [lost_2.id]);
    drop(lease);
}

/// Bad queries get a typed error.
pub async fn bad_queries_are_refused(f: &dyn InspectFixture) {
    let store = f.inspector();
    submit(&*store, new_task("a")).await;
    let bad = [
        TaskQuery::new().limit(0),
        TaskQuery::new().limit(limits::MAX_PAGE + 1),
        TaskQuery::new().scope(" "),
        TaskQuery::new().operation("a\0b"),
        TaskQuery::new().scope("x".repeat(limits::MAX_SCOPE_LEN + 1)),
    ];
    for query in bad {
        let result = store.list(&query).await;
        assert!(
            matches!(result, Err(Error::InvalidInput(_))),
            "{query:?}: {result:?}"
        );
    }
    assert!(matches!(
        store.counts(Some("")).await,
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        store.stranded(Duration::ZERO, 10).await,
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        store.stranded(Duration::from_secs(60), 0).await,
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        store
            .stranded(Duration::from_secs(60), limits::MAX_PAGE + 1)
            .await,
        Err(Error::InvalidInput(_))
    ));
}

/// A task reopened before its first claim was handed off at its reopening:
/// it is stranded only once it has waited that long since then.
pub async fn stranded_counts_from_the_latest_reopening(f: &dyn InspectFixture) {
    let store = f.inspector();
    let threshold = Duration::from_secs(600);
    let t = submit(&*store, new_task("reopened")).await;
    assert!(store.cancel(t.id, "not now").await.unwrap().is_accepted());
    f.advance(Duration::from_secs(7200)).await;
    assert!(
        store
            .reopen(t.id, ReopenRequest::new("ops", "now"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert!(
        store.stranded(threshold, 100).await.unwrap().is_empty(),
        "reopened a moment ago: not stranded, though submitted two hours ago"
    );
    assert_eq!(store.due(100).await.unwrap(), [t.id], "re-dispatch finds it");
    f.advance(threshold + Duration::from_secs(1)).await;
    let stranded: Vec<TaskId> = store
        .stranded(threshold, 100)
        .await
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(stranded, [t.id], "unclaimed since its reopening: stranded now");
}

/// Each queue as (operation, due, scheduled, running).
fn depth_counts(queues: &[QueueDepth]) -> Vec<(&str, u64, u64, u64)> {
    queues
        .iter()
        .map(|q| (q.operation.as_str(), q.due, q.scheduled, q.running))
        .collect()
}

/// [`Inspect::depth`] reports each operation's queue on the store's clock:
/// due (never claimed, released, a lease expired), scheduled (backing off),
/// running (a live lease), the oldest due one's time; finished tasks never
/// count, and an operation with no live task has no queue.
pub async fn depth_counts_each_operations_queue(f: &dyn InspectFixture) {
    let store = f.inspector();
    assert!(
        store.depth().await.unwrap().is_empty(),
        "an empty store has no queue"
    );
    let index = |key: &str| {
        NewTask::new(
            RequestKey::new(crate::testing::SCOPE, "index.document", key),
            InputHash::of([key]),
        )
    };
    let slow = RetryPolicy::default()
        .jitter(0.0)
        .initial_backoff(Duration::from_secs(300));
    let first = submit(&*store, new_task("first")).await;
    let _second = submit(&*store, new_task("second")).await;
    let released = submit(&*store, new_task("released")).await;
    let lease = acquire(&*store, released.id, "a").await;
    assert!(store.release(lease).await.unwrap().is_accepted());
    let backing_off = submit(&*store, new_task("backing-off").policy(slow)).await;
    let lease = acquire(&*store, backing_off.id, "a").await;
    let failed = store.fail(lease, Failure::retryable("busy")).await.unwrap();
    assert!(failed.is_accepted());
    let crashed = submit(&*store, new_task("crashed")).await;
    let _crashed = acquire(&*store, crashed.id, "a").await;
    let done = submit(&*store, new_task("done")).await;
    let lease = acquire(&*store, done.id, "a").await;
    assert!(
        store
            .complete(lease, Response::from("ok"))
            .await
            .unwrap()
            .is_accepted()
    );
    let cancelled = submit(&*store, index("cancelled")).await;
    assert!(store.cancel(cancelled.id, "no").await.unwrap().is_accepted());
    let indexing = submit(&*store, index("doc-1")).await;
    let _indexing = acquire(&*store, indexing.id, "b").await;

    let queues = store.depth().await.unwrap();
    assert_eq!(
        depth_counts(&queues),
        [("chat.reply", 3, 1, 1), ("index.document", 0, 0, 1)],
        "by operation: due (two never claimed, one released), backing off, running; done and cancelled never"
    );
    let first = store.get(first.id).await.unwrap().unwrap();
    assert_eq!(
        queues[0].oldest_due_at,
        Some(first.created_at),
        "the oldest due task is the first submitted, due since its submission"
    );
    assert_eq!(queues[1].oldest_due_at, None, "nothing due there");

    // The crashed worker's lease expires: its task is due again.
    f.advance(PAST_LEASE).await;
    let _fresh = submit(&*store, index("doc-2")).await;
    assert_eq!(
        depth_counts(&store.depth().await.unwrap()),
        [("chat.reply", 4, 1, 0), ("index.document", 2, 0, 0)],
        "expired leases are due, backing off is still scheduled"
    );
}

/// Every task that needs a worker and has none is on a rescue path — `due`
/// or `stranded` — and `claim_next` hands each out; a task with a live lease
/// or a saved response is on neither.
pub async fn every_task_needing_a_worker_is_found(f: &dyn InspectFixture) {
    let store = f.inspector();
    let threshold = Duration::from_secs(60);
    let quick = RetryPolicy::default()
        .jitter(0.0)
        .initial_backoff(Duration::from_secs(1));
    let never = submit(&*store, new_task("never-claimed")).await;
    let released = submit(&*store, new_task("released")).await;
    let lease = acquire(&*store, released.id, "a").await;
    assert!(store.release(lease).await.unwrap().is_accepted());
    let backing_off = submit(&*store, new_task("backing-off").policy(quick)).await;
    let lease = acquire(&*store, backing_off.id, "a").await;
    assert!(
        store
            .fail(lease, Failure::retryable("busy"))
            .await
            .unwrap()
            .is_accepted()
    );
    let crashed = submit(&*store, new_task("crashed")).await;
    let _crashed = acquire(&*store, crashed.id, "a").await;
    let failed = submit(&*store, new_task("failed").policy(quick.max_attempts(1))).await;
    let lease = acquire(&*store, failed.id, "a").await;
    assert!(
        store
            .fail(lease, Failure::permanent("no"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert!(
        store
            .reopen(failed.id, ReopenRequest::new("ops", "again"))
            .await
            .unwrap()
            .is_accepted()
    );
    let cancelled = submit(&*store, new_task("cancelled-unclaimed")).await;
    assert!(store.cancel(cancelled.id, "no").await.unwrap().is_accepted());
    assert!(
        store
            .reopen(cancelled.id, ReopenRequest::new("ops", "yes"))
            .await
            .unwrap()
            .is_accepted()
    );
    let done = submit(&*store, new_task("done")).await;
    let lease = acquire(&*store, done.id, "a").await;
    assert!(
        store
            .complete(lease, Response::from("ok"))
            .await
            .unwrap()
            .is_accepted()
    );

    f.advance(PAST_LEASE + threshold).await;
    let live = submit(&*store, new_task("live")).await;
    let _live = acquire(&*store, live.id, "b").await;

    let mut found: BTreeSet<TaskId> = store.due(100).await.unwrap().into_iter().collect();
    found.extend(store.stranded(threshold, 100).await.unwrap().iter().map(|t| t.id));
    let needing: BTreeSet<TaskId> = [
        never.id,
        released.id,
        backing_off.id,
        crashed.id,
        failed.id,
        cancelled.id,
    ]
    .into_iter()
    .collect();
    assert_eq!(
        found, needing,
        "due and stranded together find every one, nothing else"
    );

    let taken: BTreeSet<TaskId> = store
        .claim_next(crate::store::ClaimNext::new("c", LEASE, 100))
        .await
        .unwrap()
        .iter()
        .map(|lease| lease.task_id())
        .collect();
    assert_eq!(taken, needing, "claim_next hands out each of them");
}

/// A listing's rows are summaries of the tasks as they stand — every field
/// but the payload and the response — however large those are.
pub async fn list_rows_are_summaries_without_payload_or_response(f: &dyn InspectFixture) {
    let store = f.inspector();
    let big = vec![7u8; 64 * 1024];
    let task = submit(&*store, new_task("big").payload(big.clone())).await;
    let lease = acquire(&*store, task.id, "a").await;
    let saved = store
        .complete(lease, Response::new(big.clone()))
        .await
        .unwrap()
        .accepted()
        .expect("the only lease saves");
    assert_eq!(
        (saved.payload.len(), saved.response.as_ref().map(Response::len)),
        (big.len(), Some(big.len()))
    );
    populate(f).await;
    let page = store.list(&TaskQuery::new()).await.unwrap();
    assert_eq!(page.tasks.len(), 13);
    for row in &page.tasks {
        let whole = store.get(row.id).await.unwrap().expect("listed tasks exist");
        assert_eq!(*row, TaskSummary::from(&whole), "{}", row.id);
    }
    let done = store
        .list(&TaskQuery::new().status(Status::Completed).operation("chat.reply"))
        .await
        .unwrap();
    assert!(done.tasks.contains(&TaskSummary::from(saved)));
}

/// `counts_up_to` is exact below its cap and says "at least" from it on;
/// a cap of 0 or beyond the limit is refused.
pub async fn counts_up_to_stop_at_the_cap(f: &dyn InspectFixture) {
    let store = f.inspector();
    for cap in [0, limits::MAX_COUNT_CAP + 1] {
        let refused = store.counts_up_to(None, cap).await;
        assert!(
            matches!(refused, Err(Error::InvalidInput(_))),
            "cap {cap}: {refused:?}"
        );
    }
    assert_eq!(
        store.counts_up_to(None, 10).await.unwrap(),
        CappedCounts::default()
    );
    populate(f).await;
    let exact = store.counts(None).await.unwrap();
    let b = store.counts(Some("scope-b")).await.unwrap();
    // Below the cap: every count exact, in all scopes and in one.
    for (scope, expected) in [
        (None, exact),
        (Some("scope-b"), b),
        (Some("nobody"), Counts::default()),
    ] {
        let counts = store.counts_up_to(scope, 100).await.unwrap();
        for status in STATUSES {
            assert_eq!(
                counts.get(status),
                Count::Exact(expected.get(status)),
                "{scope:?} {status}"
            );
        }
        assert_eq!(counts.total(), Count::Exact(expected.total()));
    }
    // 8 pending tasks, one of each other status: a cap of 3 stops the pending count.
    let capped = store.counts_up_to(None, 3).await.unwrap();
    assert_eq!(capped.get(Status::Pending), Count::AtLeast(3));
    for status in [
        Status::Running,
        Status::Completed,
        Status::Failed,
        Status::Cancelled,
    ] {
        assert_eq!(capped.get(status), Count::Exact(1), "{status}");
    }
    assert_eq!(capped.total(), Count::AtLeast(7));
    // One scope under a small cap: never more than there is, never exact
    // where the cap was reached.
    for (scope, expected) in [(Some("scope-b"), b), (None, exact)] {
        let counts = store.counts_up_to(scope, 2).await.unwrap();
        for status in STATUSES {
            let actual = expected.get(status);
            match counts.get(status) {
                Count::Exact(n) => assert_eq!(n, actual, "{scope:?} {status}: an exact count is exact"),
                Count::AtLeast(n) => assert!(n <= actual, "{scope:?} {status}: at least {n} of {actual}"),
            }
            if actual >= 2 {
                assert!(
                    !counts.get(status).is_exact(),
                    "{scope:?} {status}: {actual} reach the cap"
                );
            }
        }
    }
}
