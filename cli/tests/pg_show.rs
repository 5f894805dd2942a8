//! `show` for people (payload and response as text, else hex; the budget
//! left) and `--json` for scripts (RFC 3339 instants, durations as strings,
//! bytes with their encoding named), against the real PostgreSQL.

mod common;

use std::time::Duration;

use common::{fixture, pg};
use taskfence::effect::EffectOutcome;
use taskfence::testing::{Fixture, acquire};
use taskfence::{InputHash, NewTask, RequestKey, Response, RetryPolicy};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_prints_bytes_readably_and_the_budget_left() {
    let f = fixture().await;
    let store = f.store();
    let policy = RetryPolicy::default()
        .max_attempts(3)
        .deadline(Duration::from_secs(3600));
    let text = store
        .submit(
            NewTask::new(RequestKey::new("t", "chat.reply", "text"), InputHash::of(["1"]))
                .payload(r#"{"message":"hello"}"#)
                .policy(policy),
        )
        .await
        .unwrap()
        .into_task();
    let lease = acquire(&*store, text.id, "worker-1").await;
    assert!(
        store
            .begin_effect(&lease, "notify-user")
            .await
            .unwrap()
            .is_accepted()
    );
    let _ = store
        .finish_effect(&lease, "notify-user", EffectOutcome::done("delivery-7"))
        .await
        .unwrap();
    let _ = store
        .complete(lease, Response::from("The key decisions are …"))
        .await
        .unwrap();
    let binary = store
        .submit(
            NewTask::new(RequestKey::new("t", "blob", "bin"), InputHash::of(["2"]))
                .payload(vec![0x00, 0xff, 0x10, 0x80]),
        )
        .await
        .unwrap()
        .into_task();

    let shown = pg(&f, &["show", &text.id.to_string()]);
    let out = shown.ok();
    for expected in [
        r#"19 bytes of text: {"message":"hello"}"#,
        "bytes of text: The key decisions are …",
        "budget left  2 attempts, deadline in 59m",
        "effect notify-user intended",
        "effect notify-user done",
        "reference delivery-7",
        &format!("tf:{}:notify-user", text.id),
    ] {
        assert!(out.contains(expected), "missing {expected:?} in\n{out}");
    }
    let shown = pg(&f, &["show", &binary.id.to_string()]);
    let out = shown.ok();
    assert!(out.contains("4 bytes, hex: 00ff1080"), "{out}");
    assert!(out.contains("5 attempts, no deadline"), "{out}");

    let json = pg(&f, &["--json", "show", &text.id.to_string()]).json();
    let task = &json["task"];
    assert_eq!(
        task["payload"],
        serde_json::json!({ "encoding": "utf-8", "data": r#"{"message":"hello"}"# })
    );
    assert_eq!(
        task["response"],
        serde_json::json!({ "encoding": "utf-8", "data": "The key decisions are …" })
    );
    assert_eq!(task["policy"]["initial_backoff"], "1s");
    assert_eq!(task["policy"]["max_backoff"], "5m");
    assert_eq!(task["policy"]["deadline"], "1h");
    assert_eq!(task["budget"]["attempts_left"], 2);
    let effect = &json["effects"][0];
    assert_eq!(
        (
            &effect["name"],
            &effect["state"],
            &effect["reference"],
            &effect["ambiguous"]
        ),
        (
            &serde_json::json!("notify-user"),
            &serde_json::json!("done"),
            &serde_json::json!("delivery-7"),
            &serde_json::json!(0)
        )
    );
    assert_eq!(effect["key"], format!("tf:{}:notify-user", text.id));
    for instant in [
        &task["created_at"],
        &task["budget"]["deadline_at"],
        &task["finished_at"],
        &json["attempts"][0]["started_at"],
        &json["effects"][0]["settled_at"],
    ] {
        let s = instant.as_str().unwrap_or_else(|| panic!("a string: {instant}"));
        OffsetDateTime::parse(s, &Rfc3339).unwrap_or_else(|e| panic!("{s}: {e}"));
    }

    let json = pg(&f, &["--json", "show", &binary.id.to_string()]).json();
    assert_eq!(
        json["task"]["payload"],
        serde_json::json!({ "encoding": "base64", "data": "AP8QgA==" })
    );
    assert!(json["task"]["response"].is_null());
    assert!(json["task"]["policy"]["deadline"].is_null());

    // Listings carry the task without its payload and response (a page
    // never loads them); `show` reads them.
    let page = pg(&f, &["--json", "list", "--operation", "blob"]).json();
    assert_eq!(page["tasks"][0]["id"], binary.id.to_string());
    assert!(page["tasks"][0].get("payload").is_none(), "{page}");
    assert!(page["tasks"][0].get("response").is_none(), "{page}");
}
