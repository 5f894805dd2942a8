//! The effect journal on DynamoDB, between its read and its write: a
//! takeover is a rejection that wrote nothing, another write of the same
//! record is read and decided again; a conflicting snapshot read is
//! retried; the story lists the journal and a purge removes it
//! (`taskfence_test_support::faults` between the store and moto).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use taskfence::effect::{EffectKey, EffectOutcome, EffectStart, EffectState};
use taskfence::inspect::Inspect;
use taskfence::testing::{Fixture, LEASE, acquire, new_task};
use taskfence::{Lease, NewTask, Rejection, Response, TaskStore};
use taskfence_test_support::dynamo;
use taskfence_test_support::faults::{Action, Faults, Fired, hook};

use crate::faults::faulty;

const NOTIFY: &str = "notify-user";
/// The effect item's sort key as it appears in a request body: the rule
/// that matches it fires on the journal's write, not on the read.
const NOTIFY_ITEM: &str = "\"E#notify-user\"";

/// Counts the store's snapshot reads (`TransactGetItems`), changing nothing.
fn count_reads(faults: &Faults) -> Fired {
    faults.on(
        "TransactGetItems",
        &[],
        usize::MAX,
        Action::Before(hook(|| async {})),
    )
}

/// A worker's lease is taken over after `begin_effect` read the task and
/// before its transaction: the fence refuses the write, the answer is
/// `Superseded`, and no intent is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_between_the_read_and_the_write_is_superseded_and_records_nothing() {
    let f = dynamo::fixture().await;
    let plain = f.dynamo_store().clone();
    let faults = Faults::new();
    let slow = faulty(&f, &faults);
    let task = plain.submit(new_task("send-1")).await.unwrap().into_task();
    let lease = acquire(&slow, task.id, "slow").await;

    let taken: Arc<Mutex<Option<Lease>>> = Arc::default();
    let (other, clock, id, seen) = (plain.clone(), f.clock().clone(), task.id, taken.clone());
    let write = faults.on(
        "TransactWriteItems",
        &[NOTIFY_ITEM],
        1,
        Action::Before(hook(move || {
            let (other, clock, seen) = (other.clone(), clock.clone(), seen.clone());
            async move {
                clock.advance(LEASE + Duration::from_secs(1));
                let fast = acquire(&other, id, "fast").await;
                *seen.lock().unwrap() = Some(fast);
            }
        })),
    );
    let reads = count_reads(&faults);
    let answer = slow.begin_effect(&lease, NOTIFY).await.unwrap();
    assert_eq!(
        write.count(),
        1,
        "the takeover came between the read and the write"
    );
    assert_eq!(
        reads.count(),
        1,
        "classified from the refused check's image: no second read"
    );
    assert_eq!(
        answer.rejection(),
        Some(&Rejection::Superseded { current_version: 2 })
    );
    assert_eq!(f.count("E#").await, 0, "no effect item was written");
    assert!(plain.effects(task.id).await.unwrap().is_empty());

    // The new holder's intent is the first: nothing ambiguous was left behind.
    let fast = taken.lock().unwrap().take().expect("the takeover ran");
    let start = plain
        .begin_effect(&fast, NOTIFY)
        .await
        .unwrap()
        .into_result()
        .expect("the new lease is current");
    assert_eq!(
        start,
        EffectStart::Call {
            key: EffectKey::new(task.id, NOTIFY),
            ambiguous: None
        }
    );
}

/// Another `finish_effect` of the same assignment lands between this one's
/// read and its write: the record is no longer the one read, so the write
/// is refused, the record read again and the call decided on it (the first
/// outcome stands), one record in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_recorded_between_the_read_and_the_write_is_decided_again() {
    let f = dynamo::fixture().await;
    let plain = f.dynamo_store().clone();
    let faults = Faults::new();
    let worker = faulty(&f, &faults);
    let task = plain.submit(new_task("send-1")).await.unwrap().into_task();
    let lease = acquire(&plain, task.id, "w").await;
    assert!(plain.begin_effect(&lease, NOTIFY).await.unwrap().is_accepted());

    let (other, same) = (plain.clone(), lease.clone());
    let write = faults.on(
        "TransactWriteItems",
        &[NOTIFY_ITEM],
        1,
        Action::Before(hook(move || {
            let (other, same) = (other.clone(), same.clone());
            async move {
                let first = other
                    .finish_effect(&same, NOTIFY, EffectOutcome::failed("402: card declined"))
                    .await
                    .unwrap();
                assert!(first.is_accepted(), "{first:?}");
            }
        })),
    );
    let reads = count_reads(&faults);
    let answer = worker
        .finish_effect(&lease, NOTIFY, EffectOutcome::done("msg-1"))
        .await
        .unwrap()
        .into_result()
        .expect("the lease is current");
    assert_eq!(
        write.count(),
        1,
        "the other outcome came between the read and the write"
    );
    assert_eq!(
        reads.count(),
        2,
        "the refused write was followed by a second read"
    );
    assert_eq!(
        (answer.state, answer.reference.as_deref(), answer.error.as_deref()),
        (EffectState::Failed, None, Some("402: card declined")),
        "decided again on the record as it is: the first outcome stands"
    );
    assert_eq!(plain.effects(task.id).await.unwrap(), [answer]);
    assert_eq!(f.count("E#").await, 1, "one record");
}

/// Two `begin_effect`s of one assignment race for the first intent: the
/// loser's put finds the record there, reads it, and is told to call with
/// the same key; one intent is recorded, not counted ambiguous.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intent_recorded_between_the_read_and_the_write_is_decided_again() {
    let f = dynamo::fixture().await;
    let plain = f.dynamo_store().clone();
    let faults = Faults::new();
    let worker = faulty(&f, &faults);
    let task = plain.submit(new_task("send-1")).await.unwrap().into_task();
    let lease = acquire(&plain, task.id, "w").await;

    let (other, same) = (plain.clone(), lease.clone());
    let write = faults.on(
        "TransactWriteItems",
        &[NOTIFY_ITEM],
        1,
        Action::Before(hook(move || {
            let (other, same) = (other.clone(), same.clone());
            async move {
                assert!(other.begin_effect(&same, NOTIFY).await.unwrap().is_accepted());
            }
        })),
    );
    let reads = count_reads(&faults);
    let start = worker
        .begin_effect(&lease, NOTIFY)
        .await
        .unwrap()
        .into_result()
        .expect("the lease is current");
    assert_eq!(
        write.count(),
        1,
        "the other intent came between the read and the write"
    );
    assert_eq!(reads.count(), 2, "the refused put was followed by a second read");
    assert_eq!(
        start,
        EffectStart::Call {
            key: EffectKey::new(task.id, NOTIFY),
            ambiguous: None
        }
    );
    let effects = plain.effects(task.id).await.unwrap();
    assert_eq!(effects.len(), 1, "{effects:?}");
    assert_eq!(
        (effects[0].state, effects[0].version, effects[0].ambiguous),
        (EffectState::Intended, 1, 0)
    );
}

/// The snapshot read meets another transaction on the task (or
/// throttling): it is asked again after a pause, and the intent recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_read_cancelled_by_a_conflict_is_retried() {
    let f = dynamo::fixture().await;
    let faults = Faults::new();
    let store = faulty(&f, &faults);
    let task = store.submit(new_task("send-1")).await.unwrap().into_task();
    let lease = acquire(&store, task.id, "w").await;
    let conflicts = faults.on("TransactGetItems", &[], 2, Action::Cancel("TransactionConflict"));
    let throttled = faults.on("TransactGetItems", &[], 1, Action::Cancel("ThrottlingError"));
    let start = store.begin_effect(&lease, NOTIFY).await.unwrap();
    assert!(matches!(
        start.into_result(),
        Ok(EffectStart::Call { ambiguous: None, .. })
    ));
    assert_eq!((conflicts.count(), throttled.count()), (2, 1));
    assert_eq!(f.count("E#").await, 1, "the intent is recorded once");
}

/// The story lists the journal by name; a purge deletes it with the task,
/// down to the last item.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_story_lists_the_journal_and_a_purge_deletes_it() {
    let f = dynamo::fixture().await;
    let store = f.dynamo_store();
    let task = store.submit(new_task("send-1")).await.unwrap().into_task();
    let lease = acquire(store, task.id, "w").await;
    for name in [NOTIFY, "charge-card"] {
        assert!(store.begin_effect(&lease, name).await.unwrap().is_accepted());
    }
    let done = store
        .finish_effect(&lease, NOTIFY, EffectOutcome::done("msg-1"))
        .await
        .unwrap()
        .into_result()
        .unwrap();
    let story = store.story(task.id).await.unwrap().expect("the task exists");
    let names: Vec<&str> = story.effects.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["charge-card", NOTIFY], "by name");
    assert_eq!(story.effects[1], done);
    assert_eq!(story.effects, store.effects(task.id).await.unwrap());

    assert!(
        store
            .complete(lease, Response::from("ok"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert_eq!(f.count("E#").await, 2);
    f.advance(NewTask::DEFAULT_RETENTION).await;
    assert_eq!(store.purge_expired(100).await.unwrap(), 1);
    assert_eq!(f.count("E#").await, 0, "the effect items went with the task");
    assert_eq!(f.record_count().await, 0, "and everything else");
}
