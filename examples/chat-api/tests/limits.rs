//! Bad input: a clear 4xx with a problem+json body, and nothing written.

mod support;

use chat_api::Mode;
use reqwest::header::HeaderValue;
use support::{ALICE, TestDb, TestService, ids, read};

#[tokio::test]
async fn missing_or_malformed_idempotency_keys_are_400() {
    let db = TestDb::new().await;
    let service = TestService::start(&db, Mode::ApiOnly).await;
    let api = service.api();

    api.send(ALICE, "conv-1", None, "hi")
        .await
        .assert_problem(400, "idempotency-key-missing");

    let url = format!("{}/conversations/conv-1/messages", api.base);
    let post = |value: HeaderValue| {
        api.client
            .post(&url)
            .bearer_auth(ALICE)
            .header("Idempotency-Key", value)
            .json(&serde_json::json!({ "content": "hi" }))
    };
    let too_long = format!("\"{}\"", "k".repeat(taskfence::limits::MAX_KEY_LEN + 1));
    for bad in [
        "\"\"",            // empty
        "\"   \"",         // blank
        "\"unterminated",  // not a string
        "\"a\";expires=1", // parameters
        "\"a\\nb\"",       // invalid escape
        "two words",       // bare, with a space
        "a,b",             // a list
        too_long.as_str(), // over the limit
    ] {
        let reply = read(post(HeaderValue::from_str(bad).unwrap())).await;
        reply.assert_problem(400, "idempotency-key-malformed");
    }
    let non_ascii = read(post(HeaderValue::from_bytes(b"\"caf\xc3\xa9\"").unwrap())).await;
    non_ascii.assert_problem(400, "idempotency-key-malformed");
    let twice = read(
        api.client
            .post(&url)
            .bearer_auth(ALICE)
            .header("Idempotency-Key", "\"a\"")
            .header("Idempotency-Key", "\"b\"")
            .json(&serde_json::json!({ "content": "hi" })),
    )
    .await;
    twice.assert_problem(400, "idempotency-key-malformed");

    assert_eq!(db.counts().await, [0; 6], "nothing written");
    service.stop().await;
}

#[tokio::test]
async fn the_quoted_and_the_bare_spelling_are_the_same_key() {
    let db = TestDb::new().await;
    let service = TestService::start(&db, Mode::ApiOnly).await;
    let api = service.api();
    let url = format!("{}/conversations/conv-1/messages", api.base);
    let post = |value: &'static str| {
        api.client
            .post(&url)
            .bearer_auth(ALICE)
            .header("Idempotency-Key", value)
            .json(&serde_json::json!({ "content": "hi" }))
    };
    let quoted = read(post("\"8e03978e-40d5-43e8-bc93-6894a57f9324\"")).await;
    let bare = read(post("8e03978e-40d5-43e8-bc93-6894a57f9324")).await;
    assert_eq!((quoted.status, quoted.replayed()), (201, false));
    assert_eq!((bare.status, bare.replayed()), (201, true));
    assert_eq!(bare.body, quoted.body);
    assert_eq!(db.count("messages").await, 1);
    service.stop().await;
}

#[tokio::test]
async fn oversized_or_invalid_bodies_are_4xx_and_write_nothing() {
    let db = TestDb::new().await;
    let service = TestService::start(&db, Mode::ApiOnly).await;
    let api = service.api();
    let limits: chat_api::Limits = taskfence::config::defaults();

    // Over the body limit: 413.
    let huge = "x".repeat(limits.max_body_bytes + 1);
    api.send(ALICE, "conv-1", Some("k1"), &huge)
        .await
        .assert_problem(413, "body-too-large");
    // Within the body limit, over the content limit: 422.
    let long = "x".repeat(limits.max_content_bytes + 1);
    api.send(ALICE, "conv-1", Some("k2"), &long)
        .await
        .assert_problem(422, "invalid-content");
    api.send(ALICE, "conv-1", Some("k3"), "  ")
        .await
        .assert_problem(422, "invalid-content");
    api.send(ALICE, "conv-1", Some("k4"), "a\u{0}b")
        .await
        .assert_problem(422, "invalid-content");

    let url = format!("{}/conversations/conv-1/messages", api.base);
    let raw = |content_type: &'static str, body: &'static str| {
        api.client
            .post(&url)
            .bearer_auth(ALICE)
            .header("Idempotency-Key", "\"k5\"")
            .header("Content-Type", content_type)
            .body(body)
    };
    read(raw("application/json", "{not json"))
        .await
        .assert_problem(400, "invalid-body");
    read(raw("text/plain", "{\"content\":\"hi\"}"))
        .await
        .assert_problem(415, "unsupported-media-type");
    read(raw(
        "application/json",
        "{\"content\":\"hi\",\"role\":\"system\"}",
    ))
    .await
    .assert_problem(422, "invalid-body");

    let long_conversation = "c".repeat(limits.max_conversation_id_bytes + 1);
    api.send(ALICE, &long_conversation, Some("k6"), "hi")
        .await
        .assert_problem(400, "invalid-conversation-id");
    api.send(ALICE, "conv%20one", Some("k7"), "hi")
        .await
        .assert_problem(400, "invalid-conversation-id");

    assert_eq!(db.counts().await, [0; 6], "nothing written");

    // The keys of refused requests were not consumed.
    assert_eq!(
        api.send(ALICE, "conv-1", Some("k1"), "now it fits").await.status,
        201
    );
    service.stop().await;
}

#[tokio::test]
async fn bad_task_ids_and_waits_are_4xx() {
    let db = TestDb::new().await;
    let service = TestService::start(&db, Mode::ApiOnly).await;
    let api = service.api();
    let (task_id, _) = ids(&api.send(ALICE, "conv-1", Some("k1"), "hi").await);

    api.task(ALICE, "not-a-uuid", None)
        .await
        .assert_problem(404, "not-found");
    api.task(ALICE, "00000000-0000-0000-0000-000000000000", None)
        .await
        .assert_problem(404, "not-found");
    for wait in ["abc", "-1s", "1.5s", "61s", "99999999999999999999s"] {
        api.task(ALICE, &task_id, Some(wait))
            .await
            .assert_problem(400, "invalid-wait");
    }
    let unknown_parameter = read(
        api.client
            .get(format!("{}/tasks/{task_id}?wiat=1s", api.base))
            .bearer_auth(ALICE),
    )
    .await;
    unknown_parameter.assert_problem(400, "invalid-query");
    assert_eq!(api.task(ALICE, &task_id, Some("0s")).await.status, 200);
    service.stop().await;
}
