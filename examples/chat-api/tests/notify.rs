//! The "reply ready" webhook: one notification per saved reply, through the
//! effect journal, at a local receiver that counts deliveries — also when the
//! worker dies after the call and before recording it.

mod support;

use std::time::Duration;

use chat_api::sim::webhook::{Keys, Received, WebhookReceiver};
use chat_api::{Config, Mode, notify};
use support::{ALICE, TestDb, TestService, config, ids};
use taskfence::effect::{Effect, EffectState};
use taskfence::policy::OnAmbiguous;
use taskfence::{Status, Task, TaskId, TaskStore};
use taskfence_test_support::eventually;

/// The test config with the webhook pointed at `receiver`.
fn with_webhook(db: &TestDb, mode: Mode, receiver: &WebhookReceiver) -> Config {
    let mut config = config(db, mode);
    config.webhook_url = Some(receiver.url());
    config
}

/// The notification task of reply task `reply`, once it is `status`.
async fn notification(db: &TestDb, reply: TaskId, status: Status) -> Task {
    let store = db.fixture.pg_store();
    let key = notify::request_key("alice", reply);
    eventually(Duration::from_secs(30), || async {
        store
            .find(&key)
            .await
            .unwrap()
            .filter(|task| task.status == status)
    })
    .await
}

async fn effects(db: &TestDb, task: TaskId) -> Vec<Effect> {
    db.fixture.pg_store().effects(task).await.unwrap()
}

/// `n` requests have reached the receiver.
async fn requests(receiver: &WebhookReceiver, n: usize) -> Vec<Received> {
    eventually(Duration::from_secs(30), || async {
        let got = receiver.requests();
        (got.len() >= n).then_some(got)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_reply_is_announced_once_with_the_effect_key() {
    let db = TestDb::new().await;
    let receiver = WebhookReceiver::start(Keys::Honour).await.unwrap();
    let service = TestService::start_with(&db, with_webhook(&db, Mode::Both, &receiver)).await;
    let api = service.api().clone();

    let (task_id, message_id) = ids(&api.send(ALICE, "conv-1", Some("send-1"), "Anyone there?").await);
    let view = api.wait_for_reply(ALICE, &task_id).await;
    assert_eq!(view["status"], "completed");
    let reply: TaskId = task_id.parse().unwrap();
    let task = notification(&db, reply, Status::Completed).await;
    service.stop().await;

    let got = receiver.requests();
    assert_eq!(got.len(), 1, "one delivery: {got:?}");
    assert_eq!(receiver.effects(), 1);
    let delivery = &got[0];
    let expected_key = format!("tf:{}:reply-ready", task.id);
    assert_eq!(delivery.key.as_deref(), Some(expected_key.as_str()));
    assert!(!delivery.replayed);
    assert_eq!(delivery.body["type"], "reply.ready");
    assert_eq!(delivery.body["task_id"], task_id.as_str());
    assert_eq!(delivery.body["message_id"], message_id.as_str());
    assert_eq!(delivery.body["href"], format!("/tasks/{task_id}"));

    let journal = effects(&db, task.id).await;
    assert_eq!(journal.len(), 1, "{journal:?}");
    let effect = &journal[0];
    assert_eq!(
        (effect.name.as_str(), effect.state),
        (notify::EFFECT, EffectState::Done)
    );
    assert_eq!(effect.key.as_str(), expected_key);
    assert_eq!(effect.reference.as_deref(), Some(delivery.delivery_id.as_str()));
    assert_eq!(effect.ambiguous, 0);
    assert_eq!(
        task.response.as_ref().and_then(|r| r.as_str()),
        Some(delivery.delivery_id.as_str())
    );
    assert_eq!(db.count("replies").await, 1);
}

/// A worker whose receiver applies the delivery and never answers dies
/// (its pool closed: it records nothing, releases nothing); after its lease
/// another worker takes the notification over. Returns the receiver, the
/// notification task id once it is `settled`, and the first delivery.
async fn killed_after_the_call(
    keys: Keys,
    on_ambiguous: OnAmbiguous,
    settled: Status,
) -> (TestDb, WebhookReceiver, Task, Received) {
    let db = TestDb::new().await;
    let receiver = WebhookReceiver::start(keys).await.unwrap();
    receiver.hold_answers(1);
    let api_service = TestService::start(&db, Mode::ApiOnly).await;
    let api = api_service.api().clone();

    let mut doomed = with_webhook(&db, Mode::WorkerOnly, &receiver);
    doomed.worker.lease = Duration::from_secs(1);
    doomed.policy = doomed.policy.on_ambiguous(on_ambiguous);
    let doomed = TestService::start_with(&db, doomed).await;

    let (task_id, _) = ids(&api
        .send(ALICE, "conv-1", Some("send-1"), "Ping me when done")
        .await);
    // The reply is saved, the notification applied, its answer withheld.
    let first = requests(&receiver, 1).await.remove(0);
    assert_eq!(receiver.effects(), 1);
    let view = api.task(ALICE, &task_id, None).await.json();
    assert!(!view["reply"].is_null(), "announced only once saved: {view}");

    // The worker dies between the call and finish_effect.
    doomed.crash().await;
    let reply: TaskId = task_id.parse().unwrap();
    let task = db
        .fixture
        .pg_store()
        .find(&notify::request_key("alice", reply))
        .await
        .unwrap()
        .unwrap();
    let journal = effects(&db, task.id).await;
    assert_eq!(
        journal[0].state,
        EffectState::Intended,
        "no outcome recorded: {journal:?}"
    );

    let healthy = TestService::start_with(&db, with_webhook(&db, Mode::WorkerOnly, &receiver)).await;
    let task = notification(&db, reply, settled).await;
    healthy.stop().await;
    api_service.stop().await;
    assert_eq!(db.count("replies").await, 1);
    assert_eq!(task.attempts(), 2, "the takeover is the second attempt");
    (db, receiver, task, first)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_after_the_call_is_taken_over_and_the_receiver_applies_it_once() {
    let (db, receiver, task, first) =
        killed_after_the_call(Keys::Honour, OnAmbiguous::Retry, Status::Completed).await;

    // The takeover called again with the same key; the receiver recognised it.
    let got = receiver.requests();
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(receiver.effects(), 1, "applied once");
    let key = format!("tf:{}:reply-ready", task.id);
    assert!(
        got.iter().all(|r| r.key.as_deref() == Some(key.as_str())),
        "{got:?}"
    );
    assert!(got[1].replayed);
    assert_eq!(got[1].delivery_id, first.delivery_id);
    assert_eq!(got[1].body, first.body, "the same body under the same key");

    let journal = effects(&db, task.id).await;
    assert_eq!(journal.len(), 1, "{journal:?}");
    let effect = &journal[0];
    assert_eq!(effect.state, EffectState::Done);
    assert_eq!(effect.ambiguous, 1, "the repeated call is counted");
    assert_eq!(effect.attempt, 2);
    assert_eq!(effect.reference.as_deref(), Some(first.delivery_id.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_without_idempotency_keys_applies_it_twice_and_the_journal_counts_it() {
    let (db, receiver, task, first) =
        killed_after_the_call(Keys::Ignore, OnAmbiguous::Retry, Status::Completed).await;

    // What a provider without keys does with the repeated call: a second effect.
    let got = receiver.requests();
    assert_eq!((got.len(), receiver.effects()), (2, 2), "{got:?}");
    assert_eq!(got[0].key, got[1].key, "the key was sent both times");
    // Never silent: the journal says the provider may have seen it twice.
    let effect = &effects(&db, task.id).await[0];
    assert_eq!((effect.state, effect.ambiguous), (EffectState::Done, 1));
    assert_eq!(effect.reference.as_deref(), Some(got[1].delivery_id.as_str()));
    assert_ne!(got[1].delivery_id, first.delivery_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_stop_policy_the_takeover_does_not_call_again() {
    let (db, receiver, task, _) =
        killed_after_the_call(Keys::Honour, OnAmbiguous::Stop, Status::Failed).await;

    assert_eq!(receiver.requests().len(), 1, "no second call");
    let error = task.last_error.as_deref().unwrap_or_default();
    assert!(error.contains(notify::EFFECT), "{error}");
    let effect = &effects(&db, task.id).await[0];
    assert_eq!(
        (effect.state, effect.ambiguous, effect.attempt),
        (EffectState::Intended, 0, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_webhook_url_nothing_is_sent() {
    let db = TestDb::new().await;
    let receiver = WebhookReceiver::start(Keys::Honour).await.unwrap();
    let service = TestService::start(&db, Mode::Both).await;
    let api = service.api().clone();

    let (task_id, _) = ids(&api.send(ALICE, "conv-1", Some("send-1"), "Quietly, please").await);
    api.wait_for_reply(ALICE, &task_id).await;
    service.stop().await;

    let reply: TaskId = task_id.parse().unwrap();
    let store = db.fixture.pg_store();
    assert!(
        store
            .find(&notify::request_key("alice", reply))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(db.count("tasks").await, 1, "only the reply task");
    assert!(receiver.requests().is_empty());
}
