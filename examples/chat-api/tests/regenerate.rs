//! Regenerate: a new reply task for the same prompt; the first reply stays.

mod support;

use chat_api::Mode;
use support::{ALICE, TestDb, TestService, ids};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regenerate_makes_a_second_task_and_reply_and_leaves_the_first_unchanged() {
    let db = TestDb::new().await;
    let service = TestService::start(&db, Mode::Both).await;
    let api = service.api();

    let sent = api
        .send(ALICE, "conv-1", Some("send-1"), "Name three risks")
        .await;
    assert_eq!(sent.status, 201);
    let (first_task, message_id) = ids(&sent);
    let first_view = api.wait_for_reply(ALICE, &first_task).await;

    let regenerated = api.regenerate(ALICE, &message_id, "regen-1").await;
    assert_eq!(
        regenerated.status,
        201,
        "{}",
        String::from_utf8_lossy(&regenerated.body)
    );
    assert!(!regenerated.replayed());
    let (second_task, same_message) = ids(&regenerated);
    assert_ne!(
        second_task, first_task,
        "Regenerate is new work, even for an identical prompt"
    );
    assert_eq!(same_message, message_id, "…for the same message");

    // Retrying the Regenerate press replays it: still two tasks.
    let retried = api.regenerate(ALICE, &message_id, "regen-1").await;
    assert_eq!((retried.status, retried.replayed()), (201, true));
    assert_eq!(retried.body, regenerated.body);

    let second_view = api.wait_for_reply(ALICE, &second_task).await;
    assert_eq!(second_view["status"], "completed");
    assert_eq!(second_view["message_id"], message_id.as_str());
    assert_eq!(
        second_view["reply"]["content"],
        "Reply to: Name three risks (attempt 1)"
    );

    let first_again = api.task(ALICE, &first_task, None).await;
    assert_eq!(first_again.json(), first_view, "the first reply is unchanged");

    service.stop().await;
    assert_eq!(db.count("messages").await, 1);
    assert_eq!(db.count("reply_tasks").await, 2);
    assert_eq!(db.count("tasks").await, 2);
    assert_eq!(db.count("replies").await, 2);
}

#[tokio::test]
async fn regenerate_with_the_sends_key_or_another_message_is_422() {
    let db = TestDb::new().await;
    let service = TestService::start(&db, Mode::ApiOnly).await;
    let api = service.api();

    let (_, first_message) = ids(&api.send(ALICE, "conv-1", Some("send-1"), "one").await);
    let (_, second_message) = ids(&api.send(ALICE, "conv-1", Some("send-2"), "two").await);
    assert_eq!(api.regenerate(ALICE, &first_message, "regen-1").await.status, 201);
    let before = db.counts().await;

    // One key names one reply task, whichever endpoint it was sent to.
    api.regenerate(ALICE, &first_message, "send-1")
        .await
        .assert_problem(422, "idempotency-key-reused");
    api.regenerate(ALICE, &second_message, "regen-1")
        .await
        .assert_problem(422, "idempotency-key-reused");
    assert_eq!(db.counts().await, before, "a refused request writes nothing");

    api.regenerate(ALICE, "00000000-0000-0000-0000-000000000000", "regen-9")
        .await
        .assert_problem(404, "not-found");
    api.regenerate(ALICE, "not-a-uuid", "regen-9")
        .await
        .assert_problem(404, "not-found");
    assert_eq!(db.counts().await, before);

    service.stop().await;
}
