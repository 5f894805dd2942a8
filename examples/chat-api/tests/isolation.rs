//! Keys and tasks are scoped to the authenticated caller.

mod support;

use chat_api::Mode;
use support::{ALICE, BOB, TestDb, TestService, ids, read};

#[tokio::test]
async fn another_user_cannot_read_or_reuse_the_first_users_keys_or_tasks() {
    let db = TestDb::new().await;
    let service = TestService::start(&db, Mode::ApiOnly).await;
    let api = service.api();

    let alices = api
        .send(ALICE, "conv-1", Some("shared-key"), "alice's question")
        .await;
    assert_eq!(alices.status, 201);
    let (alice_task, alice_message) = ids(&alices);

    // Bob cannot see Alice's task, wait on it, or regenerate her message:
    // the same 404 as for a task that does not exist.
    api.task(BOB, &alice_task, None)
        .await
        .assert_problem(404, "not-found");
    api.task(BOB, &alice_task, Some("1s"))
        .await
        .assert_problem(404, "not-found");
    api.regenerate(BOB, &alice_message, "bob-regen")
        .await
        .assert_problem(404, "not-found");

    // Alice's key means nothing in Bob's scope: other text is not a 422 (that
    // would reveal Alice used it), and the same text is Bob's own new work,
    // never a replay of Alice's response.
    let bobs = api
        .send(BOB, "conv-1", Some("shared-key"), "bob's question")
        .await;
    assert_eq!((bobs.status, bobs.replayed()), (201, false));
    let (bob_task, bob_message) = ids(&bobs);
    assert_ne!(bob_task, alice_task);
    assert_ne!(bob_message, alice_message);
    let copycat = api
        .send(BOB, "conv-1", Some("shared-key-2"), "alice's question")
        .await;
    assert_eq!((copycat.status, copycat.replayed()), (201, false));
    assert_ne!(ids(&copycat).0, alice_task);

    // And the other way round.
    api.task(ALICE, &bob_task, None)
        .await
        .assert_problem(404, "not-found");
    assert_eq!(api.task(ALICE, &alice_task, None).await.status, 200);
    assert_eq!(api.task(BOB, &bob_task, None).await.status, 200);

    assert_eq!(db.count("tasks").await, 3);
    assert_eq!(db.count("messages").await, 3);
    service.stop().await;
}

#[tokio::test]
async fn requests_without_a_known_bearer_token_are_401_and_write_nothing() {
    let db = TestDb::new().await;
    let service = TestService::start(&db, Mode::ApiOnly).await;
    let api = service.api();
    let url = format!("{}/conversations/conv-1/messages", api.base);
    let body = serde_json::json!({ "content": "hi" });

    let anonymous = read(
        api.client
            .post(&url)
            .header("Idempotency-Key", "\"k\"")
            .json(&body),
    )
    .await;
    anonymous.assert_problem(401, "unauthenticated");
    assert_eq!(anonymous.header("www-authenticate"), Some("Bearer"));
    let unknown = read(
        api.client
            .post(&url)
            .bearer_auth("mallory-token")
            .header("Idempotency-Key", "\"k\"")
            .json(&body),
    )
    .await;
    unknown.assert_problem(401, "unauthenticated");
    assert_eq!(db.counts().await, [0; 6]);
    service.stop().await;
}
