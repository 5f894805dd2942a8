//! The acceptance rule: stored with the task for its whole life; under
//! `FirstValidAnswer` an earlier attempt may still save, and everything else
//! of guarantees 1 and 5 holds unchanged.

use super::*;
use crate::policy::{AcceptanceRule, RetryPolicy};
use crate::store::{AttemptOutcome, Fenced, Rejection};
use crate::task::{Response, Status};
use crate::testing::{Fixture, forged_lease, race};

fn first_valid(k: &str) -> NewTask {
    new_task(k).acceptance(AcceptanceRule::FirstValidAnswer)
}

async fn outcomes(store: &dyn TaskStore, id: TaskId) -> Vec<AttemptOutcome> {
    store
        .attempts(id)
        .await
        .expect("attempts")
        .into_iter()
        .map(|a| a.outcome)
        .collect()
}

/// The rule is chosen at submission and stored with the task: the default is
/// `CurrentAssignment`, a repeated submission returns the task with the rule
/// it was created with, and claims and completions never change it.
pub async fn acceptance_rule_is_stored_with_the_task(f: &dyn Fixture) {
    let store = f.store();
    let default = submit(&*store, new_task("send-1")).await;
    assert_eq!(default.acceptance, AcceptanceRule::CurrentAssignment);
    let chosen = submit(&*store, first_valid("send-2")).await;
    assert_eq!(chosen.acceptance, AcceptanceRule::FirstValidAnswer);

    let replay = store.submit(new_task("send-2")).await.expect("replay");
    assert!(!replay.is_created());
    assert_eq!(
        replay.task().acceptance,
        AcceptanceRule::FirstValidAnswer,
        "a replay never changes the rule"
    );
    let lease = acquire(&*store, chosen.id, "w").await;
    assert_eq!(lease.task().acceptance, AcceptanceRule::FirstValidAnswer);
    assert!(
        store
            .complete(lease, Response::from("done"))
            .await
            .unwrap()
            .is_accepted()
    );
    let found = store.find(&chosen.key).await.unwrap().expect("found");
    assert_eq!(found.acceptance, AcceptanceRule::FirstValidAnswer);
    assert_eq!(
        task(&*store, default.id).await.acceptance,
        AcceptanceRule::CurrentAssignment
    );
}

/// The paused worker under `FirstValidAnswer`: it returns after a takeover
/// with an answer and that answer is saved; the newer assignment's own answer
/// is then refused with the saved one, and its attempt ends `Overtaken`.
/// (Under the default rule the same story is
/// [`paused_worker_after_takeover_is_rejected`].)
pub async fn first_valid_answer_saves_paused_worker_after_takeover(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, first_valid("send-1")).await;
    let paused = acquire(&*store, t.id, "paused").await;
    f.advance(PAST_LEASE).await;
    let fresh = acquire(&*store, t.id, "fresh").await;
    assert_eq!(fresh.version(), 2, "the takeover gets a newer version");

    let saved = store
        .complete(paused, Response::from("paused answer"))
        .await
        .unwrap()
        .accepted()
        .expect("an attempt that held a lease may save first");
    assert_eq!(
        (saved.status, saved.response.clone()),
        (Status::Completed, Some(Response::from("paused answer")))
    );
    let late = store
        .complete(fresh, Response::from("fresh answer"))
        .await
        .unwrap();
    assert!(
        matches!(late.rejection(), Some(Rejection::AlreadyCompleted(done))
            if done.response == Some(Response::from("paused answer"))),
        "the second answer is refused with the first: {late:?}"
    );
    assert_eq!(
        task(&*store, t.id).await.response,
        Some(Response::from("paused answer"))
    );
    assert_eq!(
        outcomes(&*store, t.id).await,
        [AttemptOutcome::Completed, AttemptOutcome::Overtaken]
    );
    assert!(matches!(
        store.claim(t.id, request("again")).await.unwrap(),
        Claim::Completed(_)
    ));
}

/// Under `FirstValidAnswer` only completion is relaxed: an earlier
/// assignment can never renew, fail, release or record an operation.
pub async fn first_valid_answer_still_fences_everything_but_completion(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, first_valid("send-1")).await;
    let old = acquire(&*store, t.id, "old").await;
    f.advance(PAST_LEASE).await;
    let _new = acquire(&*store, t.id, "new").await;
    assert_superseded_writes(&*store, &old, 2).await;
    let now = task(&*store, t.id).await;
    assert_eq!(
        (now.status, now.version, now.response),
        (Status::Running, 2, None),
        "nothing changed"
    );
}

/// Under `FirstValidAnswer` a cancelled or terminally failed task never
/// saves, and neither does a lease the store never granted.
pub async fn first_valid_answer_never_saves_terminal_tasks_or_ungranted_leases(f: &dyn Fixture) {
    let store = f.store();

    let cancelled = submit(&*store, first_valid("cancelled")).await;
    let lease = acquire(&*store, cancelled.id, "w").await;
    assert!(
        store
            .cancel(cancelled.id, "user left")
            .await
            .unwrap()
            .is_accepted()
    );
    assert_eq!(
        store
            .complete(lease, Response::from("late"))
            .await
            .unwrap()
            .rejection(),
        Some(&Rejection::NotRunning(Status::Cancelled)),
        "cancelled"
    );

    let one_try = first_valid("failed").policy(RetryPolicy::default().max_attempts(1));
    let failed = submit(&*store, one_try).await;
    let lease = acquire(&*store, failed.id, "w").await;
    f.advance(PAST_LEASE).await;
    assert!(matches!(
        store.claim(failed.id, request("w2")).await.unwrap(),
        Claim::Failed(_)
    ));
    assert_eq!(
        store
            .complete(lease, Response::from("late"))
            .await
            .unwrap()
            .rejection(),
        Some(&Rejection::NotRunning(Status::Failed)),
        "terminally failed"
    );

    let live = submit(&*store, first_valid("live")).await;
    let granted = acquire(&*store, live.id, "w").await;
    for forged_version in [0, 2] {
        let mut forged_task = granted.task().clone();
        forged_task.version = forged_version;
        let forged = forged_lease(forged_task, &granted);
        assert_eq!(
            store
                .complete(forged, Response::from("forged"))
                .await
                .unwrap()
                .rejection(),
            Some(&Rejection::Superseded { current_version: 1 }),
            "version {forged_version} was never granted"
        );
    }
    for id in [cancelled.id, failed.id, live.id] {
        assert_eq!(task(&*store, id).await.response, None, "nothing saved");
    }
    assert!(
        store
            .complete(granted, Response::from("real"))
            .await
            .unwrap()
            .is_accepted()
    );
}

/// Under `FirstValidAnswer`, completions racing from every assignment the
/// task ever had still save exactly one response.
pub async fn first_valid_answer_racing_completions_save_once(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, first_valid("send-1")).await;
    let mut leases = Vec::new();
    for worker in ["a", "b", "c"] {
        leases.push(acquire(&*store, t.id, worker).await);
        f.advance(PAST_LEASE).await;
    }
    let results = race(RACERS, |i| {
        let (store, lease) = (store.clone(), leases[i % leases.len()].clone());
        async move {
            (
                i,
                store
                    .complete(lease, Response::from(format!("answer {i}")))
                    .await
                    .expect("complete"),
            )
        }
    })
    .await;
    let winners: Vec<usize> = results
        .iter()
        .filter(|(_, r)| r.is_accepted())
        .map(|(i, _)| *i)
        .collect();
    assert_eq!(winners.len(), 1, "exactly one of {RACERS} completes is accepted");
    let expected = Response::from(format!("answer {}", winners[0]));
    for (_, r) in &results {
        if let Fenced::Rejected(rejection) = r {
            assert!(
                matches!(rejection, Rejection::AlreadyCompleted(t) if t.response.as_ref() == Some(&expected)),
                "losers see the winner's response: {rejection:?}"
            );
        }
    }
    assert_eq!(task(&*store, t.id).await.response, Some(expected));
    let completed = outcomes(&*store, t.id)
        .await
        .into_iter()
        .filter(|o| *o == AttemptOutcome::Completed)
        .count();
    assert_eq!(completed, 1, "one attempt is recorded as the one saved");
}
