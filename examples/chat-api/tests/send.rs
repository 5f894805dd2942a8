//! Send: one press of Send is one message, one task, one reply, however often
//! the browser retries it; a key reused for other content is refused.

mod support;

use chat_api::Mode;
use support::{ALICE, TestDb, TestService, ids};
use tokio::task::JoinSet;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_concurrent_retries_of_one_send_make_one_message_one_task_one_reply() {
    let db = TestDb::new().await;
    let service = TestService::start(&db, Mode::Both).await;
    let api = service.api().clone();

    let mut presses = JoinSet::new();
    for _ in 0..10 {
        let api = api.clone();
        presses.spawn(async move {
            api.send(ALICE, "conv-1", Some("send-7f3a"), "What did we decide?")
                .await
        });
    }
    let replies: Vec<_> = presses.join_all().await;

    for reply in &replies {
        assert_eq!(reply.status, 201, "{}", String::from_utf8_lossy(&reply.body));
        assert_eq!(
            reply.body, replies[0].body,
            "every retry gets the first response, byte for byte"
        );
    }
    let first = replies.iter().filter(|r| !r.replayed()).count();
    assert_eq!(
        first, 1,
        "exactly one request created the message; nine replayed it"
    );

    let (task_id, message_id) = ids(&replies[0]);
    let view = api.wait_for_reply(ALICE, &task_id).await;
    assert_eq!(view["status"], "completed");
    assert_eq!(view["message_id"], message_id.as_str());
    assert_eq!(
        view["reply"]["content"],
        "Reply to: What did we decide? (attempt 1)"
    );
    assert_eq!(view["attempts"], 1, "one claim, so one provider call");

    // A retry after the reply was saved still replays the same response.
    let late = api
        .send(ALICE, "conv-1", Some("send-7f3a"), "What did we decide?")
        .await;
    assert_eq!((late.status, late.replayed()), (201, true));
    assert_eq!(late.body, replies[0].body);

    service.stop().await;
    assert_eq!(db.count("messages").await, 1);
    assert_eq!(db.count("reply_tasks").await, 1);
    assert_eq!(db.count("tasks").await, 1);
    assert_eq!(
        db.count("handoffs").await,
        0,
        "the worker claims from the store: no outbox row"
    );
    assert_eq!(db.count("replies").await, 1);
}

#[tokio::test]
async fn the_same_key_with_another_body_is_422_and_writes_nothing() {
    let db = TestDb::new().await;
    // API only: nothing else writes while the rows are counted.
    let service = TestService::start(&db, Mode::ApiOnly).await;
    let api = service.api();

    let first = api
        .send(ALICE, "conv-1", Some("send-1"), "Summarize the doc")
        .await;
    assert_eq!(first.status, 201);
    let before = db.counts().await;
    assert_eq!(
        before,
        [1, 1, 0, 1, 0, 0],
        "messages, reply_tasks, replies, tasks, attempts, handoffs (none: the store is the queue)"
    );

    let other_text = api
        .send(ALICE, "conv-1", Some("send-1"), "Summarize the other doc")
        .await;
    other_text.assert_problem(422, "idempotency-key-reused");
    let other_conversation = api
        .send(ALICE, "conv-2", Some("send-1"), "Summarize the doc")
        .await;
    other_conversation.assert_problem(422, "idempotency-key-reused");
    assert_eq!(db.counts().await, before, "a refused request writes nothing");

    // The key still names the first request.
    let again = api
        .send(ALICE, "conv-1", Some("send-1"), "Summarize the doc")
        .await;
    assert_eq!((again.status, again.replayed()), (201, true));
    assert_eq!(again.body, first.body);

    service.stop().await;
}

#[tokio::test]
async fn a_new_key_with_the_same_text_is_new_work() {
    let db = TestDb::new().await;
    let service = TestService::start(&db, Mode::ApiOnly).await;
    let api = service.api();

    let a = api.send(ALICE, "conv-1", Some("press-1"), "hello").await;
    let b = api.send(ALICE, "conv-1", Some("press-2"), "hello").await;
    assert_eq!((a.status, b.status), (201, 201));
    assert!(!b.replayed());
    assert_ne!(ids(&a), ids(&b), "two presses of Send: two messages, two tasks");
    assert_eq!(db.count("messages").await, 2);
    assert_eq!(db.count("tasks").await, 2);

    service.stop().await;
}
