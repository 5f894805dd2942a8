//! Batches decide each task exactly as the single operation would: mixed
//! batches, racing batches, and bad input that writes nothing.

use super::*;
use crate::error::{Error, InvalidInput};
use crate::limits;
use crate::policy::{Failure, RetryPolicy};
use crate::store::{Fenced, Rejection, Submitted};
use crate::task::{InputHash, NewTask, RequestKey, Response, Status};
use crate::testing::{Fixture, forged_lease, race};

/// A mixed batch of claims — available, completed, busy, backing off,
/// failed, cancelled, unknown — gets, task by task and in order, the answer a
/// single claim gets; only the available task gains an attempt.
pub async fn claim_many_answers_each_task_as_claim_would(f: &dyn Fixture) {
    let store = f.store();
    let available = submit(&*store, new_task("available")).await;
    let completed = submit(&*store, new_task("completed")).await;
    let lease = acquire(&*store, completed.id, "w").await;
    assert!(
        store
            .complete(lease, Response::from("saved"))
            .await
            .unwrap()
            .is_accepted()
    );
    let busy = submit(&*store, new_task("busy")).await;
    let _held = acquire(&*store, busy.id, "holder").await;
    let backing_off = submit(&*store, new_task("backoff")).await;
    let lease = acquire(&*store, backing_off.id, "w").await;
    assert!(
        store
            .fail(lease, Failure::retryable("429"))
            .await
            .unwrap()
            .is_accepted()
    );
    let failed = submit(&*store, new_task("failed")).await;
    let lease = acquire(&*store, failed.id, "w").await;
    assert!(
        store
            .fail(lease, Failure::permanent("400"))
            .await
            .unwrap()
            .is_accepted()
    );
    let cancelled = submit(&*store, new_task("cancelled")).await;
    assert!(store.cancel(cancelled.id, "gone").await.unwrap().is_accepted());
    let unknown = TaskId::new();

    let ids = [
        available.id,
        completed.id,
        busy.id,
        backing_off.id,
        failed.id,
        cancelled.id,
        unknown,
    ];
    let claims = store
        .claim_many(&ids, request("batch"))
        .await
        .expect("claim_many");
    assert_eq!(claims.len(), ids.len(), "one answer per task, in order");
    match &claims[0] {
        Claim::Acquired(lease) => {
            assert_eq!(
                (lease.task_id(), lease.version(), lease.worker()),
                (available.id, 1, "batch")
            );
        }
        other => panic!("available: {other:?}"),
    }
    assert!(
        matches!(&claims[1], Claim::Completed(t) if t.response == Some(Response::from("saved"))),
        "completed: {:?}",
        claims[1]
    );
    assert!(matches!(claims[2], Claim::Busy { .. }), "busy: {:?}", claims[2]);
    assert!(
        matches!(claims[3], Claim::Backoff { .. }),
        "backoff: {:?}",
        claims[3]
    );
    assert!(
        matches!(&claims[4], Claim::Failed(t) if t.id == failed.id),
        "failed: {:?}",
        claims[4]
    );
    assert!(
        matches!(&claims[5], Claim::Cancelled(t) if t.id == cancelled.id),
        "cancelled: {:?}",
        claims[5]
    );
    assert!(matches!(claims[6], Claim::NotFound), "unknown: {:?}", claims[6]);

    for (id, attempts) in [
        (available.id, 1),
        (completed.id, 1),
        (busy.id, 1),
        (backing_off.id, 1),
        (failed.id, 1),
        (cancelled.id, 0),
    ] {
        assert_eq!(task(&*store, id).await.attempts(), attempts, "attempts of {id}");
    }
}

/// A claim batch whose tasks' budgets are spent turns them terminal, as a
/// single claim does, and takes over expired leases with a newer version.
pub async fn claim_many_exhausts_and_takes_over_as_claim_would(f: &dyn Fixture) {
    let store = f.store();
    let one_try = submit(
        &*store,
        new_task("one-try").policy(RetryPolicy::default().max_attempts(1)),
    )
    .await;
    let crashed = submit(&*store, new_task("crashed")).await;
    let _gone = acquire(&*store, one_try.id, "w").await;
    let old = acquire(&*store, crashed.id, "w").await;
    f.advance(PAST_LEASE).await;
    let claims = store
        .claim_many(&[one_try.id, crashed.id], request("batch"))
        .await
        .expect("claim_many");
    assert!(
        matches!(&claims[0], Claim::Failed(t) if t.status == Status::Failed),
        "{:?}",
        claims[0]
    );
    match &claims[1] {
        Claim::Acquired(lease) => assert_eq!(lease.version(), old.version() + 1, "a takeover"),
        other => panic!("expired lease: {other:?}"),
    }
    assert_eq!(
        store
            .complete(old, Response::from("late"))
            .await
            .unwrap()
            .rejection(),
        Some(&Rejection::Superseded { current_version: 2 })
    );
}

/// A mixed batch of completions — current, superseded, expired, already
/// completed, cancelled, a task that is gone — is fenced lease by lease: the
/// valid ones are saved, each refusal says why, nothing else changes.
pub async fn complete_many_fences_each_lease_on_its_own(f: &dyn Fixture) {
    let store = f.store();
    let expired_task = submit(&*store, new_task("expired")).await;
    let expired = acquire(&*store, expired_task.id, "w").await;
    let superseded_task = submit(&*store, new_task("superseded")).await;
    let superseded = acquire(&*store, superseded_task.id, "old").await;
    f.advance(PAST_LEASE).await;
    let _newer = acquire(&*store, superseded_task.id, "new").await;

    let valid_task = submit(&*store, new_task("valid")).await;
    let valid = acquire(&*store, valid_task.id, "w").await;
    let done_task = submit(&*store, new_task("done")).await;
    let done = acquire(&*store, done_task.id, "w").await;
    assert!(
        store
            .complete(done.clone(), Response::from("first"))
            .await
            .unwrap()
            .is_accepted()
    );
    let cancelled_task = submit(&*store, new_task("cancelled")).await;
    let cancelled = acquire(&*store, cancelled_task.id, "w").await;
    assert!(
        store
            .cancel(cancelled_task.id, "gone")
            .await
            .unwrap()
            .is_accepted()
    );
    let mut ghost = valid.task().clone();
    ghost.id = TaskId::new();
    let ghost = forged_lease(ghost, &valid);

    let results = store
        .complete_many(vec![
            (valid, Response::from("answer")),
            (superseded, Response::from("stale")),
            (expired, Response::from("late")),
            (done, Response::from("second")),
            (cancelled, Response::from("after cancel")),
            (ghost, Response::from("nobody")),
        ])
        .await
        .expect("complete_many");
    assert_eq!(results.len(), 6, "one answer per lease, in order");
    let fenced = |i: usize| results[i].as_ref().unwrap_or_else(|e| panic!("item {i}: {e}"));
    assert!(
        matches!(fenced(0), Fenced::Accepted(t) if t.response == Some(Response::from("answer"))),
        "valid: {:?}",
        fenced(0)
    );
    assert_eq!(
        fenced(1).rejection(),
        Some(&Rejection::Superseded { current_version: 2 })
    );
    assert_eq!(fenced(2).rejection(), Some(&Rejection::LeaseExpired));
    assert!(
        matches!(fenced(3).rejection(), Some(Rejection::AlreadyCompleted(t)) if t.response == Some(Response::from("first"))),
        "done: {:?}",
        fenced(3)
    );
    assert_eq!(
        fenced(4).rejection(),
        Some(&Rejection::NotRunning(Status::Cancelled))
    );
    assert!(
        matches!(results[5], Err(Error::NotFound(_))),
        "ghost: {:?}",
        results[5]
    );

    let saved = |id| {
        let store = store.clone();
        async move { task(&*store, id).await.response }
    };
    assert_eq!(saved(valid_task.id).await, Some(Response::from("answer")));
    assert_eq!(saved(done_task.id).await, Some(Response::from("first")));
    for id in [superseded_task.id, expired_task.id, cancelled_task.id] {
        assert_eq!(saved(id).await, None, "refused leases save nothing");
    }
}

/// Batches racing over the same tasks still give each task one assignment
/// and one saved response.
pub async fn racing_batches_claim_and_complete_each_task_once(f: &dyn Fixture) {
    let store = f.store();
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(submit(&*store, new_task(&format!("send-{i}"))).await.id);
    }
    let claims = race(8, |i| {
        let (store, ids) = (store.clone(), ids.clone());
        async move {
            // Each racer asks in its own order, so their batches overlap in every way.
            let mut mine = ids;
            mine.rotate_left(i);
            store
                .claim_many(&mine, request(&format!("w{i}")))
                .await
                .expect("claim_many")
        }
    })
    .await;
    let leases: Vec<Lease> = claims
        .into_iter()
        .flatten()
        .filter_map(|c| match c {
            Claim::Acquired(lease) => Some(lease),
            _ => None,
        })
        .collect();
    let mut won: Vec<TaskId> = leases.iter().map(Lease::task_id).collect();
    won.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(
        won, expected,
        "each task acquired exactly once across the batches"
    );

    // Two racers each complete every lease.
    let results = race(2, |i| {
        let (store, batch) = (store.clone(), leases.clone());
        async move {
            let batch = batch
                .into_iter()
                .map(|l| (l, Response::from(format!("racer {i}"))))
                .collect();
            store.complete_many(batch).await.expect("complete_many")
        }
    })
    .await;
    let accepted = results
        .iter()
        .flatten()
        .filter(|r| matches!(r, Ok(f) if f.is_accepted()))
        .count();
    assert_eq!(accepted, ids.len(), "one completion accepted per task");
    for id in ids {
        assert!(task(&*store, id).await.response.is_some());
    }
}

/// Bad batches — a task twice, too many tasks, a bad claim request, an
/// oversized response — are typed errors that write nothing; an empty batch
/// is an empty answer.
pub async fn bad_batches_are_refused_and_write_nothing(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, new_task("send-1")).await;
    let before = f.record_count().await;

    let twice = store.claim_many(&[t.id, t.id], request("w")).await;
    assert!(
        matches!(twice, Err(Error::InvalidInput(InvalidInput::DuplicateInBatch { task })) if task == t.id),
        "{twice:?}"
    );
    let too_many: Vec<TaskId> = (0..=limits::MAX_BATCH).map(|_| TaskId::new()).collect();
    assert!(matches!(
        store.claim_many(&too_many, request("w")).await,
        Err(Error::InvalidInput(InvalidInput::OutOfRange { .. }))
    ));
    assert!(matches!(
        store.claim_many(&[t.id], ClaimRequest::new("", LEASE)).await,
        Err(Error::InvalidInput(_))
    ));
    assert_eq!(
        f.record_count().await,
        before,
        "refused claim batches wrote nothing"
    );
    assert_eq!(task(&*store, t.id).await.attempts(), 0);

    let lease = acquire(&*store, t.id, "w").await;
    let before = f.record_count().await;
    let oversized = Response::new(vec![b'x'; limits::MAX_RESPONSE_LEN + 1]);
    assert!(matches!(
        store.complete_many(vec![(lease.clone(), oversized)]).await,
        Err(Error::InvalidInput(_))
    ));
    let same_twice = vec![
        (lease.clone(), Response::from("a")),
        (lease.clone(), Response::from("b")),
    ];
    assert!(matches!(
        store.complete_many(same_twice).await,
        Err(Error::InvalidInput(InvalidInput::DuplicateInBatch { .. }))
    ));
    assert_eq!(
        f.record_count().await,
        before,
        "refused completion batches wrote nothing"
    );
    assert_eq!(task(&*store, t.id).await.response, None);

    assert!(store.claim_many(&[], request("w")).await.unwrap().is_empty());
    assert!(store.complete_many(Vec::new()).await.unwrap().is_empty());
}

/// `submit_many` decides each submission as `submit` would, in input order,
/// one answer each: new work is created (with its handoff), a repeated
/// submission is the existing task, a reused key with other inputs is that
/// entry's `KeyConflict`, bad input that entry's `InvalidInput`; a refused
/// entry writes nothing and never blocks the others.
pub async fn submit_many_answers_each_task_as_submit_would(f: &dyn Fixture) {
    let store = f.store();
    let empty = f.record_count().await;
    let earlier = submit(&*store, new_task("earlier")).await;
    let records = f.record_count().await;
    let per_task = records - empty;
    let other_inputs = NewTask::new(
        key("earlier"),
        InputHash::of(["conversation-1", "another question"]),
    );
    let bad = NewTask::new(RequestKey::new("s", "op", ""), InputHash::of(["x"]));
    let answers = store
        .submit_many(vec![
            new_task("new-1"),
            new_task("earlier"),
            other_inputs,
            bad,
            new_task("new-2"),
        ])
        .await
        .expect("submit_many");
    assert_eq!(answers.len(), 5, "one answer per submission");
    let created: Vec<Task> = [&answers[0], &answers[4]]
        .into_iter()
        .map(|answer| match answer {
            Ok(Submitted::Created(task)) => task.clone(),
            other => panic!("expected Created, got {other:?}"),
        })
        .collect();
    assert_eq!(
        (created[0].key.key.as_str(), created[1].key.key.as_str()),
        ("new-1", "new-2"),
        "answers in input order"
    );
    match &answers[1] {
        Ok(Submitted::Existing(task)) => assert_eq!(task, &earlier, "the existing task"),
        other => panic!("expected Existing, got {other:?}"),
    }
    match &answers[2] {
        Err(Error::KeyConflict { existing }) => assert_eq!(*existing, earlier.id),
        other => panic!("expected KeyConflict, got {other:?}"),
    }
    assert!(
        matches!(answers[3], Err(Error::InvalidInput(_))),
        "bad input: {:?}",
        answers[3]
    );
    for new in &created {
        assert_eq!(&task(&*store, new.id).await, new, "stored as answered");
    }
    assert_eq!(
        f.record_count().await,
        records + 2 * per_task,
        "the two new tasks wrote what a submit writes; the refused entries nothing"
    );
}

/// The same key twice in one batch is decided as two submits in input
/// order would be: the first creates the task, a later one with the same
/// inputs is that task, a later one with other inputs is a `KeyConflict`
/// naming it.
pub async fn submit_many_decides_a_repeated_key_in_input_order(f: &dyn Fixture) {
    let store = f.store();
    let other_inputs = NewTask::new(
        key("send-1"),
        InputHash::of(["conversation-1", "another question"]),
    );
    let answers = store
        .submit_many(vec![new_task("send-1"), new_task("send-1"), other_inputs])
        .await
        .expect("submit_many");
    let Ok(Submitted::Created(first)) = &answers[0] else {
        panic!("the first creates the task: {:?}", answers[0]);
    };
    match &answers[1] {
        Ok(Submitted::Existing(task)) => assert_eq!(task.id, first.id, "the same task"),
        other => panic!("expected Existing, got {other:?}"),
    }
    match &answers[2] {
        Err(Error::KeyConflict { existing }) => assert_eq!(*existing, first.id),
        other => panic!("expected KeyConflict, got {other:?}"),
    }
    assert_eq!(
        store.find(&key("send-1")).await.unwrap().map(|t| t.id),
        Some(first.id),
        "one task for the key"
    );
}

/// A batch over the limit is refused whole with a typed error, writing
/// nothing; an empty batch answers nothing.
pub async fn bad_submit_many_batches_are_refused_and_write_nothing(f: &dyn Fixture) {
    let store = f.store();
    let too_many: Vec<NewTask> = (0..=limits::MAX_BATCH)
        .map(|i| new_task(&format!("k-{i}")))
        .collect();
    let records = f.record_count().await;
    assert!(
        matches!(store.submit_many(too_many).await, Err(Error::InvalidInput(_))),
        "more than MAX_BATCH"
    );
    assert_eq!(f.record_count().await, records, "nothing written");
    assert!(
        store.submit_many(Vec::new()).await.unwrap().is_empty(),
        "empty batch"
    );
}
