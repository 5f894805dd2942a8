//! `webhook::Webhook` against a real receiver on 127.0.0.1:0: the header it
//! sends, and how each answer is read (done with its reference, refused and
//! retried after `Retry-After`, refused for good, unknown), plus a receiver
//! that is not there.
#![cfg(feature = "webhook")]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use taskfence::TaskId;
use taskfence::effect::{EffectCall, EffectKey};
use taskfence::policy::FailureKind;
use taskfence_axum::webhook::Webhook;

/// What the receiver saw: each request's `Idempotency-Key` and body.
type Seen = Arc<Mutex<Vec<(String, String)>>>;

async fn receive(State(seen): State<Seen>, headers: HeaderMap, body: String) -> axum::response::Response {
    let key = headers["idempotency-key"].to_str().unwrap().to_owned();
    let json = headers["content-type"] == "application/json";
    seen.lock().unwrap().push((key, body.clone()));
    match body.as_str() {
        _ if !json => StatusCode::UNSUPPORTED_MEDIA_TYPE.into_response(),
        "busy" => (StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "3")]).into_response(),
        "bad" => StatusCode::BAD_REQUEST.into_response(),
        "boom" => StatusCode::BAD_GATEWAY.into_response(),
        _ => (StatusCode::OK, r#"{"delivery_id":"d-1"}"#).into_response(),
    }
}

async fn receiver() -> (reqwest::Url, Seen) {
    let seen = Seen::default();
    let app = Router::new()
        .route("/hook", post(receive))
        .with_state(Arc::clone(&seen));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/hook").parse().unwrap(), seen)
}

#[tokio::test]
async fn each_answer_is_read_as_the_effect_journal_needs() {
    let (url, seen) = receiver().await;
    let hook = Webhook::new(url.clone(), Duration::from_secs(5)).unwrap();
    let key = EffectKey::new(TaskId::new(), "ready");

    let plain = hook.post(key.clone(), b"{}".to_vec()).await;
    assert_eq!(plain, EffectCall::Done(None), "no reference member asked for");
    let with_reference = hook.clone().reference("delivery_id");
    assert_eq!(
        with_reference.post(key.clone(), b"{}".to_vec()).await,
        EffectCall::Done(Some("d-1".into()))
    );
    let EffectCall::Refused(busy) = hook.post(key.clone(), b"busy".to_vec()).await else {
        panic!("503 is a refusal")
    };
    assert_eq!(
        (busy.kind, busy.retry_after),
        (FailureKind::Retryable, Some(Duration::from_secs(3)))
    );
    let EffectCall::Refused(bad) = hook.post(key.clone(), b"bad".to_vec()).await else {
        panic!("400 is a refusal")
    };
    assert_eq!(bad.kind, FailureKind::Permanent);
    assert!(matches!(
        hook.post(key.clone(), b"boom".to_vec()).await,
        EffectCall::Unknown(_)
    ));

    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 5);
    assert!(
        seen.iter().all(|(k, _)| k == key.as_str()),
        "the effect's key on every call"
    );
}

#[tokio::test]
async fn a_receiver_that_is_not_there_is_a_retryable_refusal() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    drop(listener);
    let hook = Webhook::new(url.parse().unwrap(), Duration::from_secs(5)).unwrap();
    let EffectCall::Refused(failure) = hook
        .post(EffectKey::new(TaskId::new(), "ready"), Vec::new())
        .await
    else {
        panic!("nothing was sent")
    };
    assert_eq!(failure.kind, FailureKind::Retryable);
}
