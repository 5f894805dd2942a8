//! Guarantee 10 and republishing: `due`, `republish_due` and `purge_expired`.

use std::time::Duration;

use super::*;
use crate::policy::{Failure, RetryPolicy};
use crate::republish::republish_due;
use crate::task::Response;
use crate::testing::Fixture;
use crate::wire::Stamp;

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

/// A publish callback that records each stamp it is handed and accepts it.
fn recording(
    sent: &std::sync::Mutex<Vec<Stamp>>,
) -> impl FnMut(Stamp) -> std::future::Ready<Result<(), std::io::Error>> + Send + '_ {
    move |stamp| {
        sent.lock().expect("sent").push(stamp);
        std::future::ready(Ok(()))
    }
}

/// `republish_due` publishes a task whose lease expired (its worker
/// crashed), not one whose lease is live, nor one taken over since.
pub async fn expired_leases_are_republished_live_ones_are_not(f: &dyn Fixture) {
    let store = f.store();
    let crashed = submit(&*store, new_task("crashed")).await.id;
    let live = submit(&*store, new_task("live")).await.id;
    for id in [crashed, live] {
        acquire(&*store, id, "w").await;
    }
    let sent = std::sync::Mutex::default();
    let round = republish_due(&*store, 10, recording(&sent)).await.unwrap();
    assert!(round.published.is_empty());
    assert!(
        sent.lock().unwrap().is_empty(),
        "nothing due while leases are live"
    );
    f.advance(PAST_LEASE).await;
    acquire(&*store, live, "w2").await; // expired: taken over
    let sent = std::sync::Mutex::default();
    let round = republish_due(&*store, 10, recording(&sent)).await.unwrap();
    assert_eq!(round.published, [crashed]);
    let sent: Vec<TaskId> = sent.into_inner().unwrap().iter().map(|s| s.task_id).collect();
    assert_eq!(sent, [crashed]);
}

/// Every task `republish_due` publishes comes with its stamp: the task's
/// id and its assignment version as the round read it; the claim the
/// message leads to gets a higher version.
pub async fn republished_tasks_carry_their_id_and_version(f: &dyn Fixture) {
    let store = f.store();
    let a = submit(&*store, new_task("a")).await.id;
    let b = submit(&*store, new_task("b")).await.id;
    // `a` is claimed twice (a takeover after its first lease ran out), `b` once.
    acquire(&*store, a, "w").await;
    f.advance(PAST_LEASE).await;
    acquire(&*store, a, "w").await;
    acquire(&*store, b, "w").await;
    f.advance(PAST_LEASE).await;

    let sent = std::sync::Mutex::default();
    let round = republish_due(&*store, 10, recording(&sent)).await.unwrap();
    let mut published = round.published.clone();
    published.sort();
    let mut both = vec![a, b];
    both.sort();
    assert_eq!(published, both);
    let mut sent = sent.into_inner().unwrap();
    sent.sort_by_key(|stamp| stamp.task_id);
    let mut expected = vec![Stamp::new(a, 2), Stamp::new(b, 1)];
    expected.sort_by_key(|stamp| stamp.task_id);
    assert_eq!(sent, expected, "each task's id and its version as read");
    for stamp in &sent {
        assert_eq!(*stamp, Stamp::from(&task(&*store, stamp.task_id).await));
    }
    let lease = acquire(&*store, b, "w").await;
    assert!(
        lease.version() > expected.iter().find(|s| s.task_id == b).unwrap().version,
        "the claim the message leads to gets a higher version"
    );
}
