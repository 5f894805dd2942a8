//! Effects beyond the saved response: the effect journal (a stable key per
//! effect, intent and outcome fenced by the lease, an intent without an
//! outcome decided by the task's ambiguous-outcome policy) and the
//! application's own writes fenced by the lease ([`FencedWritesFixture`]).

use std::time::Duration;

use super::*;
use crate::effect::{Effect, EffectKey, EffectOutcome, EffectStart, EffectState};
use crate::error::{Error, InvalidInput};
use crate::policy::{OnAmbiguous, RetryPolicy};
use crate::store::{Fenced, Rejection, Retry};
use crate::task::{Response, Status};
use crate::testing::{FencedWritesFixture, Fixture};

const NOTIFY: &str = "notify-user";

async fn begin(store: &dyn TaskStore, lease: &Lease, name: &str) -> EffectStart {
    store
        .begin_effect(lease, name)
        .await
        .expect("begin_effect")
        .into_result()
        .expect("the lease is current")
}

async fn finish(store: &dyn TaskStore, lease: &Lease, name: &str, outcome: EffectOutcome) -> Effect {
    store
        .finish_effect(lease, name, outcome)
        .await
        .expect("finish_effect")
        .into_result()
        .expect("the lease is current")
}

async fn only_effect(store: &dyn TaskStore, id: TaskId) -> Effect {
    let mut effects = store.effects(id).await.expect("effects");
    assert_eq!(effects.len(), 1, "one record per effect name: {effects:?}");
    effects.remove(0)
}

/// Every attempt of a task gets the same effect key, and a certain failure
/// lets the next attempt call again without counting it ambiguous.
pub async fn every_attempt_gets_the_same_effect_key(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, new_task("send-1")).await;
    let first = acquire(&*store, t.id, "a").await;
    let EffectStart::Call { key, ambiguous: None } = begin(&*store, &first, NOTIFY).await else {
        panic!("a first intent calls, not ambiguous");
    };
    assert_eq!(key, EffectKey::new(t.id, NOTIFY));
    let refused = finish(
        &*store,
        &first,
        NOTIFY,
        EffectOutcome::failed("503 from the provider, refused"),
    )
    .await;
    assert_eq!(
        (refused.state, refused.error.as_deref()),
        (EffectState::Failed, Some("503 from the provider, refused"))
    );
    f.advance(PAST_LEASE).await;
    let second = acquire(&*store, t.id, "b").await;
    let EffectStart::Call {
        key: again,
        ambiguous: None,
    } = begin(&*store, &second, NOTIFY).await
    else {
        panic!("after a certain failure the next attempt calls again, not ambiguous");
    };
    assert_eq!(again, key, "the same key on every attempt");
    let record = only_effect(&*store, t.id).await;
    assert_eq!(
        (record.state, record.version, record.attempt, record.ambiguous),
        (EffectState::Intended, 2, 2, 0)
    );
    assert_eq!(
        record.created_at, refused.created_at,
        "the first intent's time stays"
    );
    let other = begin(&*store, &second, "charge-card").await;
    assert!(
        matches!(&other, EffectStart::Call { key, .. } if *key != again),
        "another effect of the task has its own key: {other:?}"
    );
}

/// An effect recorded done is not repeated: a later attempt is told to skip
/// the call and gets the provider's reference.
pub async fn a_done_effect_is_skipped_by_later_attempts(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, new_task("send-1")).await;
    let first = acquire(&*store, t.id, "a").await;
    begin(&*store, &first, NOTIFY).await;
    let done = finish(&*store, &first, NOTIFY, EffectOutcome::done("msg-1")).await;
    assert_eq!(
        (done.state, done.reference.as_deref()),
        (EffectState::Done, Some("msg-1"))
    );
    assert!(done.settled_at.is_some());
    f.advance(PAST_LEASE).await;
    let second = acquire(&*store, t.id, "b").await;
    let EffectStart::Done(earlier) = begin(&*store, &second, NOTIFY).await else {
        panic!("a done effect is skipped");
    };
    assert_eq!(
        (earlier.reference.as_deref(), earlier.attempt),
        (Some("msg-1"), 1)
    );
    assert_eq!(only_effect(&*store, t.id).await, done, "skipping writes nothing");
}

/// An intent with no outcome is ambiguous: under `OnAmbiguous::Retry` the
/// next attempt calls again with the same key, told about the earlier
/// intent, and the record counts it.
pub async fn an_intent_without_outcome_is_retried_under_the_retry_policy(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, new_task("send-1")).await;
    assert_eq!(t.policy.on_ambiguous, OnAmbiguous::Retry, "the default policy");
    let crashed = acquire(&*store, t.id, "crashed").await;
    begin(&*store, &crashed, NOTIFY).await;
    f.advance(PAST_LEASE).await;
    let next = acquire(&*store, t.id, "next").await;
    let EffectStart::Call {
        key,
        ambiguous: Some(earlier),
    } = begin(&*store, &next, NOTIFY).await
    else {
        panic!("an intent with no outcome is ambiguous");
    };
    assert_eq!(
        key,
        EffectKey::new(t.id, NOTIFY),
        "called again with the same key"
    );
    assert_eq!((earlier.state, earlier.attempt), (EffectState::Intended, 1));
    let record = only_effect(&*store, t.id).await;
    assert_eq!((record.version, record.attempt, record.ambiguous), (2, 2, 1));
    let settled = finish(&*store, &next, NOTIFY, EffectOutcome::done("msg-1")).await;
    assert_eq!(
        (settled.state, settled.ambiguous),
        (EffectState::Done, 1),
        "the count stays"
    );
}

/// Under `OnAmbiguous::Stop` the next attempt is told to stop, nothing is
/// written, and failing the task with the effect's ambiguous failure ends it.
pub async fn an_intent_without_outcome_stops_under_the_stop_policy(f: &dyn Fixture) {
    let store = f.store();
    let policy = RetryPolicy::default().on_ambiguous(OnAmbiguous::Stop);
    let t = submit(&*store, new_task("charge-1").policy(policy)).await;
    let crashed = acquire(&*store, t.id, "crashed").await;
    begin(&*store, &crashed, "charge-card").await;
    let before = only_effect(&*store, t.id).await;
    f.advance(PAST_LEASE).await;
    let next = acquire(&*store, t.id, "next").await;
    let EffectStart::Stop(earlier) = begin(&*store, &next, "charge-card").await else {
        panic!("the policy stops on an ambiguous effect");
    };
    assert_eq!(*earlier, before);
    assert_eq!(
        only_effect(&*store, t.id).await,
        before,
        "stopping writes nothing"
    );
    let failed = store.fail(next, earlier.ambiguous_failure()).await.unwrap();
    let Fenced::Accepted(Retry::Exhausted(task)) = failed else {
        panic!("an ambiguous failure under Stop is terminal: {failed:?}");
    };
    assert_eq!(task.status, Status::Failed);
    assert!(
        task.last_error
            .as_deref()
            .is_some_and(|e| e.contains("charge-card"))
    );
}

/// A superseded, an expired or a finished lease records neither intent nor outcome.
pub async fn only_a_current_lease_records_an_effect(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, new_task("send-1")).await;
    let paused = acquire(&*store, t.id, "paused").await;
    begin(&*store, &paused, NOTIFY).await;
    f.advance(PAST_LEASE).await;
    let expired = store
        .finish_effect(&paused, NOTIFY, EffectOutcome::done("late"))
        .await
        .unwrap();
    assert_eq!(expired.rejection(), Some(&Rejection::LeaseExpired));
    let fresh = acquire(&*store, t.id, "fresh").await;
    let superseded = Rejection::Superseded { current_version: 2 };
    let late = store
        .finish_effect(&paused, NOTIFY, EffectOutcome::done("late"))
        .await
        .unwrap();
    assert_eq!(
        late.rejection(),
        Some(&superseded),
        "a superseded lease cannot record an outcome"
    );
    let other = store.begin_effect(&paused, "charge-card").await.unwrap();
    assert_eq!(other.rejection(), Some(&superseded), "nor an intent");
    let record = only_effect(&*store, t.id).await;
    assert_eq!(
        (record.state, record.version, record.reference),
        (EffectState::Intended, 1, None)
    );
    assert!(
        store
            .complete(fresh.clone(), Response::from("done"))
            .await
            .unwrap()
            .is_accepted()
    );
    let after = store.begin_effect(&fresh, NOTIFY).await.unwrap();
    assert!(
        matches!(after.rejection(), Some(Rejection::AlreadyCompleted(_))),
        "a completed task takes no new effects: {after:?}"
    );
}

/// Settling an effect this assignment never began is a typed error, bad
/// names and outcomes are refused, and none of them writes; settling twice
/// answers the first outcome.
pub async fn bad_effect_calls_are_refused_and_write_nothing(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, new_task("send-1")).await;
    let lease = acquire(&*store, t.id, "a").await;
    let before = f.record_count().await;
    let never_begun = store
        .finish_effect(&lease, NOTIFY, EffectOutcome::done("m"))
        .await;
    assert!(
        matches!(never_begun, Err(Error::InvalidInput(InvalidInput::EffectNotBegun { ref effect })) if effect == NOTIFY),
        "{never_begun:?}"
    );
    let long = "n".repeat(crate::limits::MAX_EFFECT_NAME_LEN + 1);
    for name in ["", "notify user", "notify\0user", long.as_str(), "tf:other"] {
        let refused = store.begin_effect(&lease, name).await;
        assert!(
            matches!(refused, Err(Error::InvalidInput(_))),
            "{name:?}: {refused:?}"
        );
    }
    assert!(matches!(
        store.finish_effect(&lease, NOTIFY, EffectOutcome::done("")).await,
        Err(Error::InvalidInput(InvalidInput::Blank { .. }))
    ));
    let huge = "x".repeat(crate::limits::MAX_MESSAGE_LEN + 1);
    assert!(matches!(
        store
            .finish_effect(&lease, NOTIFY, EffectOutcome::failed(huge))
            .await,
        Err(Error::InvalidInput(InvalidInput::TooLong { .. }))
    ));
    assert!(store.effects(t.id).await.unwrap().is_empty());
    assert_eq!(f.record_count().await, before, "nothing written");
    begin(&*store, &lease, NOTIFY).await;
    let first = finish(&*store, &lease, NOTIFY, EffectOutcome::done("m-1")).await;
    let again = finish(&*store, &lease, NOTIFY, EffectOutcome::failed("a second answer")).await;
    assert_eq!(again, first, "the first outcome stands");
}

/// Purging a task removes its effect journal with it.
pub async fn effects_are_purged_with_their_task(f: &dyn Fixture) {
    let store = f.store();
    let day = Duration::from_secs(24 * 3600);
    let t = submit(&*store, new_task("send-1").retention(day)).await;
    let lease = acquire(&*store, t.id, "a").await;
    begin(&*store, &lease, NOTIFY).await;
    finish(&*store, &lease, NOTIFY, EffectOutcome::done("m-1")).await;
    assert!(
        store
            .complete(lease, Response::from("done"))
            .await
            .unwrap()
            .is_accepted()
    );
    f.advance(day + Duration::from_secs(1)).await;
    assert_eq!(store.purge_expired(100).await.unwrap(), 1);
    assert!(
        store.effects(t.id).await.unwrap().is_empty(),
        "the journal went with the task"
    );
}

/// Workers killed between the provider call and the completion (a
/// [chaos run](crate::testing::chaos)): with a provider that honours the
/// effect key, every task's effect applied once; with one that ignores it,
/// every repeated application reported as ambiguous, none silent.
pub async fn killed_workers_cause_no_silent_duplicate_effects(f: &dyn Fixture) {
    use crate::testing::chaos::{Chaos, Provider, run};

    for provider in [Provider::Idempotent, Provider::IgnoresKeys] {
        let chaos = Chaos {
            tasks: 40,
            ..Chaos::new(provider)
        };
        let report = run(f, chaos).await;
        println!("chaos {provider:?}: {report:?}");
        report.assert_contract(&chaos);
    }
}

/// The application's own write, made with the store's fence in one
/// transaction, commits under the current lease and is refused — and rolled
/// back — under an expired or superseded one.
pub async fn own_writes_commit_only_under_a_current_lease(f: &dyn FencedWritesFixture) {
    let store = f.store();
    let t = submit(&*store, new_task("index-1")).await;
    let first = acquire(&*store, t.id, "a").await;
    assert!(
        f.write_fenced(&first, "by-a-1")
            .await
            .expect("write")
            .is_accepted()
    );
    f.advance(PAST_LEASE).await;
    assert_eq!(
        f.write_fenced(&first, "by-a-expired")
            .await
            .expect("write")
            .rejection(),
        Some(&Rejection::LeaseExpired)
    );
    let second = acquire(&*store, t.id, "b").await;
    assert_eq!(
        f.write_fenced(&first, "by-a-superseded")
            .await
            .expect("write")
            .rejection(),
        Some(&Rejection::Superseded { current_version: 2 })
    );
    assert!(
        f.write_fenced(&second, "by-b")
            .await
            .expect("write")
            .is_accepted()
    );
    assert!(
        store
            .complete(second.clone(), Response::from("done"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert!(
        matches!(
            f.write_fenced(&second, "by-b-after")
                .await
                .expect("write")
                .rejection(),
            Some(Rejection::AlreadyCompleted(_))
        ),
        "a finished task takes no more writes"
    );
    let mut rows = f.rows().await;
    rows.sort();
    assert_eq!(
        rows,
        ["by-a-1", "by-b"],
        "only the writes under a current lease committed"
    );
}
