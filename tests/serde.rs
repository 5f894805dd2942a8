//! The `serde` feature: the public data types survive a JSON round trip
//! exactly, read well in JSON, and malformed values are refused.

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use taskfence::clock::ManualClock;
use taskfence::policy::{AcceptanceRule, OnAmbiguous};
use taskfence::store::{Attempt, AttemptOutcome};
use taskfence::testing::acquire;
use taskfence::{
    Failure, InputHash, MemoryStore, NewTask, RequestKey, Response, RetryPolicy, Status, Task, TaskId,
    TaskStore,
};

fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(value: &T) -> serde_json::Value {
    let json = serde_json::to_string(value).expect("serialize");
    let back: T = serde_json::from_str(&json).expect("deserialize");
    assert_eq!(&back, value, "{json}");
    serde_json::from_str(&json).expect("valid JSON")
}

#[tokio::test]
async fn a_completed_task_and_its_attempts_round_trip() {
    let store = MemoryStore::with_clock(ManualClock::default());
    let policy = RetryPolicy::default()
        .max_attempts(4)
        .deadline(Duration::from_secs(600))
        .on_ambiguous(OnAmbiguous::Stop);
    let new = NewTask::new(
        RequestKey::new("user-1", "chat.reply", "req-1"),
        InputHash::of(["m-1"]),
    )
    .payload("What are the key decisions?")
    .policy(policy)
    .acceptance(AcceptanceRule::FirstValidAnswer);
    let id = store.submit(new).await.unwrap().into_task().id;
    let lease = acquire(&store, id, "worker-1").await;
    assert!(
        store
            .record_operation(&lease, "op-7")
            .await
            .unwrap()
            .is_accepted()
    );
    let done = store
        .complete(lease, Response::from("Ship in March."))
        .await
        .unwrap()
        .accepted()
        .expect("accepted");

    let json = round_trip(&done);
    assert_eq!(json["status"], "completed");
    assert_eq!(json["response"], "Ship in March.");
    assert_eq!(json["acceptance"], "first_valid_answer");
    assert_eq!(json["policy"]["on_ambiguous"], "stop");
    assert_eq!(json["id"], id.to_string());
    assert_eq!(json["input_hash"], InputHash::of(["m-1"]).to_string());
    assert!(
        json["created_at"].as_str().is_some_and(|t| t.contains('T')),
        "RFC 3339 times: {json}"
    );

    let attempts: Vec<Attempt> = store.attempts(id).await.unwrap();
    let json = round_trip(&attempts);
    assert_eq!(json[0]["outcome"], "completed");
    assert_eq!(json[0]["operation_id"], "op-7");
}

#[tokio::test]
async fn a_retrying_task_with_its_backoff_and_error_round_trips() {
    let store = MemoryStore::with_clock(ManualClock::default());
    let new = NewTask::new(
        RequestKey::new("user-1", "chat.reply", "req-2"),
        InputHash::of(["m-2"]),
    );
    let id = store.submit(new).await.unwrap().into_task().id;
    let lease = acquire(&store, id, "worker-1").await;
    assert!(
        store
            .fail(lease, Failure::retryable("429"))
            .await
            .unwrap()
            .is_accepted()
    );
    let task: Task = store.get(id).await.unwrap().expect("task");
    assert!(task.not_before.is_some() && task.last_error.is_some());
    let json = round_trip(&task);
    assert_eq!(json["status"], "pending");
    assert!(json["lease_until"].is_null());
    let attempts = store.attempts(id).await.unwrap();
    assert_eq!(round_trip(&attempts)[0]["outcome"], "failed_retryable");
    round_trip(&Failure::ambiguous("connection reset after sending"));
    round_trip(&RetryPolicy::default());
}

#[test]
fn responses_are_text_when_they_can_be_and_bytes_otherwise() {
    assert_eq!(round_trip(&Response::from("héllo")), "héllo");
    let binary = Response::new(vec![0xff, 0x00, 0x7f]);
    assert_eq!(round_trip(&binary), serde_json::json!([255, 0, 127]));
}

#[test]
fn enums_use_their_storage_names() {
    for status in [
        Status::Pending,
        Status::Running,
        Status::Completed,
        Status::Failed,
        Status::Cancelled,
    ] {
        assert_eq!(round_trip(&status), status.as_str());
    }
    for outcome in [
        AttemptOutcome::Running,
        AttemptOutcome::Expired,
        AttemptOutcome::Overtaken,
        AttemptOutcome::Failed(taskfence::policy::FailureKind::Ambiguous),
    ] {
        assert_eq!(round_trip(&outcome), outcome.as_str());
    }
    assert_eq!(
        round_trip(&AcceptanceRule::CurrentAssignment),
        "current_assignment"
    );
}

#[test]
fn malformed_values_are_refused() {
    assert!(serde_json::from_str::<Status>(r#""done""#).is_err());
    assert!(serde_json::from_str::<AttemptOutcome>(r#""lost""#).is_err());
    assert!(serde_json::from_str::<AcceptanceRule>(r#""any""#).is_err());
    assert!(serde_json::from_str::<InputHash>(r#""abc""#).is_err());
    let not_hex = format!("\"{}\"", "zz".repeat(32));
    assert!(serde_json::from_str::<InputHash>(&not_hex).is_err());
    assert!(serde_json::from_str::<TaskId>(r#""not-a-uuid""#).is_err());
    assert!(
        serde_json::from_str::<Response>("[256]").is_err(),
        "bytes are 0-255"
    );
}

#[test]
fn a_trace_context_round_trips_in_its_header_form_and_a_malformed_one_is_refused() {
    use taskfence::trace::TraceContext;
    let cx = TraceContext::new(
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "congo=t61rcWkgMzE",
    )
    .unwrap();
    let json = round_trip(&cx);
    assert_eq!(
        json,
        serde_json::json!("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01;congo=t61rcWkgMzE")
    );
    for bad in [
        "\"00-00000000000000000000000000000000-00f067aa0ba902b7-01\"",
        "\"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\"",
        "\"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01\"",
        "\"traceparent\"",
    ] {
        assert!(serde_json::from_str::<TraceContext>(bad).is_err(), "{bad}");
    }
}
