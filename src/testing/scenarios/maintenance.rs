//! Guarantee 10 and re-dispatch: `due` and `purge_expired`.

use std::time::Duration;

use super::*;
use crate::policy::{Failure, RetryPolicy};
use crate::task::Response;
use crate::testing::Fixture;

/// `due` lists expired leases and passed backoffs, nothing else.
pub async fn due_lists_expired_leases_and_passed_backoffs(f: &dyn Fixture) {
    let store = f.store();
    let policy = RetryPolicy::default()
        .jitter(0.0)
        .initial_backoff(Duration::from_secs(10));
    let crashed = submit(&*store, new_task("crashed")).await;
    let backing_off = submit(&*store, new_task("backing-off").policy(policy)).await;
    let live = submit(&*store, new_task("live")).await;
    let done = submit(&*store, new_task("done")).await;
    let _fresh = submit(&*store, new_task("fresh")).await; // never claimed: its handoff covers it

    let _c = acquire(&*store, crashed.id, "a").await;
    let b = acquire(&*store, backing_off.id, "a").await;
    assert!(
        store
            .fail(b, Failure::retryable("busy"))
            .await
            .unwrap()
            .is_accepted()
    );
    let d = acquire(&*store, done.id, "a").await;
    assert!(
        store
            .complete(d, Response::from("ok"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert!(store.due(100).await.unwrap().is_empty(), "nothing is due yet");

    f.advance(Duration::from_secs(11)).await;
    assert_eq!(
        store.due(100).await.unwrap(),
        [backing_off.id],
        "the passed backoff"
    );
    f.advance(Duration::from_secs(10)).await;
    let mut live_lease = acquire(&*store, live.id, "b").await;
    f.advance(Duration::from_secs(10)).await;
    assert!(store.renew(&mut live_lease, LEASE).await.unwrap().is_accepted());
    let mut due = store.due(100).await.unwrap();
    due.sort();
    let mut expected = vec![crashed.id, backing_off.id];
    expected.sort();
    assert_eq!(
        due, expected,
        "the expired lease and the passed backoff, not the live one"
    );
    assert_eq!(store.due(1).await.unwrap().len(), 1, "the limit holds");
}

/// Guarantee 10: purge removes only expired terminal records; after it a replay is new work.
pub async fn purge_removes_only_expired_records(f: &dyn Fixture) {
    let store = f.store();
    let day = Duration::from_secs(24 * 3600);
    let short = submit(&*store, new_task("short").retention(day)).await;
    let long = submit(&*store, new_task("long").retention(30 * day)).await;
    let pending = submit(&*store, new_task("pending").retention(day)).await;
    for t in [&short, &long] {
        let lease = acquire(&*store, t.id, "a").await;
        assert!(
            store
                .complete(lease, Response::from("done"))
                .await
                .unwrap()
                .is_accepted()
        );
    }
    assert_eq!(store.purge_expired(100).await.unwrap(), 0, "nothing expired yet");
    f.advance(day + Duration::from_secs(1)).await;
    assert_eq!(
        store.purge_expired(100).await.unwrap(),
        1,
        "only the expired, terminal record"
    );
    assert!(store.get(short.id).await.unwrap().is_none());
    assert!(store.find(&key("short")).await.unwrap().is_none());
    assert!(store.attempts(short.id).await.unwrap().is_empty());
    assert!(
        store.get(long.id).await.unwrap().is_some(),
        "unexpired records stay"
    );
    assert!(
        store.get(pending.id).await.unwrap().is_some(),
        "live work is never purged"
    );
    // Documented, not accidental: a replay after purge is new work.
    let replay = store.submit(new_task("short")).await.unwrap();
    assert!(replay.is_created());
    assert_ne!(replay.task().id, short.id);
    assert_eq!(store.purge_expired(100).await.unwrap(), 0);
}
