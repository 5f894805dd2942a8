//! Scaffolding, not for copying: a local webhook receiver standing in for
//! whatever consumes the "reply ready" notifications, for the tests and
//! `cargo run -p chat-api --bin webhook-receiver`.
//!
//! It counts what it receives — every request, and the **effects** it
//! applied — and, like a payment or messaging provider, honours
//! `Idempotency-Key`: a repeated key is answered with the first delivery's id
//! and applies nothing (a key reused with another body is a `422`). With
//! [`Keys::Ignore`] it behaves as a provider without idempotency keys: every
//! request is a new effect, which is what a duplicate call costs there.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> std::io::Result<()> {
//! use chat_api::sim::webhook::{Keys, WebhookReceiver};
//! let receiver = WebhookReceiver::start(Keys::Honour).await?;
//! let client = reqwest::Client::new();
//! for _ in 0..2 {
//!     let r = client.post(receiver.url()).header("Idempotency-Key", "k-1").json(&serde_json::json!({"a": 1})).send().await.unwrap();
//!     assert_eq!(r.json::<serde_json::Value>().await.unwrap()["delivery_id"], "dlv-1");
//! }
//! assert_eq!((receiver.requests().len(), receiver.effects()), (2, 1));
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// The path notifications are `POST`ed to.
pub const PATH: &str = "/reply-ready";

/// Whether the receiver honours `Idempotency-Key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keys {
    /// A repeated key returns the first delivery and applies nothing.
    Honour,
    /// Every request is a new effect (a provider without idempotency keys).
    Ignore,
}

/// One request the receiver got.
#[derive(Debug, Clone, Serialize)]
pub struct Received {
    /// Its `Idempotency-Key` (surrounding quotes of the Structured Field
    /// form removed), if any.
    pub key: Option<String>,
    /// The delivery id it was answered with (the first one's, when replayed).
    pub delivery_id: String,
    /// `true` when it applied nothing: a repeated key.
    pub replayed: bool,
    /// Its JSON body.
    pub body: serde_json::Value,
}

/// What the receiver holds: shared by the handler and the test.
#[derive(Debug)]
struct Inner {
    keys: Keys,
    received: Vec<Received>,
    /// Key → (delivery id, body) of the first request with it.
    first: HashMap<String, (String, serde_json::Value)>,
    applied: usize,
    /// Applied deliveries still to be left without an answer.
    hold: usize,
}

/// The receiver's state, for [`router`].
#[derive(Debug, Clone)]
pub struct Receiver(Arc<Mutex<Inner>>);

impl Receiver {
    /// An empty receiver.
    pub fn new(keys: Keys) -> Self {
        Self(Arc::new(Mutex::new(Inner {
            keys,
            received: Vec::new(),
            first: HashMap::new(),
            applied: 0,
            hold: 0,
        })))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Received> {
        self.lock().received.clone()
    }

    /// The effects applied: distinct keys with [`Keys::Honour`] (a request
    /// without a key counts as its own), every request with [`Keys::Ignore`].
    pub fn effects(&self) -> usize {
        self.lock().applied
    }

    /// The next `n` effects are applied and then never answered: a receiver
    /// that did the work and whose answer the caller never got (a worker
    /// that died after the call, a connection lost on the way back).
    pub fn hold_answers(&self, n: usize) {
        self.lock().hold = n;
    }
}

/// The routes: `POST /reply-ready` and `GET /stats` (the counts as JSON).
pub fn router(receiver: Receiver) -> Router {
    Router::new()
        .route(PATH, post(receive))
        .route("/stats", get(stats))
        .with_state(receiver)
}

async fn receive(State(receiver): State<Receiver>, headers: HeaderMap, body: Bytes) -> Response {
    let Ok(body) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "the body is not JSON").into_response();
    };
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim())
        .map(|v| {
            v.strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(v)
                .to_owned()
        });
    let (received, hold) = {
        let mut inner = receiver.lock();
        let earlier = match (inner.keys, &key) {
            (Keys::Honour, Some(key)) => inner.first.get(key).cloned(),
            _ => None,
        };
        match earlier {
            Some((_, first_body)) if first_body != body => {
                return (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "this Idempotency-Key was used with another body",
                )
                    .into_response();
            }
            Some((delivery_id, _)) => {
                let received = Received {
                    key,
                    delivery_id,
                    replayed: true,
                    body,
                };
                inner.received.push(received.clone());
                (received, false)
            }
            None => {
                inner.applied += 1;
                let delivery_id = format!("dlv-{}", inner.applied);
                if let (Keys::Honour, Some(key)) = (inner.keys, &key) {
                    inner
                        .first
                        .insert(key.clone(), (delivery_id.clone(), body.clone()));
                }
                let hold = inner.hold > 0;
                inner.hold = inner.hold.saturating_sub(1);
                let received = Received {
                    key,
                    delivery_id,
                    replayed: false,
                    body,
                };
                inner.received.push(received.clone());
                (received, hold)
            }
        }
    };
    tracing::info!(key = ?received.key, delivery_id = %received.delivery_id, replayed = received.replayed, "webhook delivery");
    if hold {
        // Applied, and the answer never leaves.
        std::future::pending::<()>().await;
    }
    let status = match received.replayed {
        true => StatusCode::OK,
        false => StatusCode::CREATED,
    };
    let answer = serde_json::json!({ "delivery_id": received.delivery_id, "replayed": received.replayed });
    (status, Json(answer)).into_response()
}

async fn stats(State(receiver): State<Receiver>) -> Json<serde_json::Value> {
    let inner = receiver.lock();
    Json(serde_json::json!({
        "requests": inner.received.len(),
        "effects": inner.applied,
        "honours_keys": inner.keys == Keys::Honour,
    }))
}

/// A receiver serving on a loopback port of its own; stops when dropped.
#[derive(Debug)]
pub struct WebhookReceiver {
    addr: SocketAddr,
    receiver: Receiver,
    serving: JoinHandle<()>,
}

impl WebhookReceiver {
    /// Serves on `127.0.0.1:0`.
    pub async fn start(keys: Keys) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let receiver = Receiver::new(keys);
        let app = router(receiver.clone());
        let serving = tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                tracing::error!(%error, "webhook receiver failed");
            }
        });
        Ok(Self {
            addr,
            receiver,
            serving,
        })
    }

    /// Where to `POST`: `http://127.0.0.1:<port>/reply-ready`.
    pub fn url(&self) -> reqwest::Url {
        format!("http://{}{PATH}", self.addr)
            .parse()
            .expect("a loopback URL parses")
    }

    /// The receiver's state and counts.
    pub fn receiver(&self) -> &Receiver {
        &self.receiver
    }

    /// Every request so far ([`Receiver::requests`]).
    pub fn requests(&self) -> Vec<Received> {
        self.receiver.requests()
    }

    /// The effects applied ([`Receiver::effects`]).
    pub fn effects(&self) -> usize {
        self.receiver.effects()
    }

    /// See [`Receiver::hold_answers`].
    pub fn hold_answers(&self, n: usize) {
        self.receiver.hold_answers(n);
    }
}

impl Drop for WebhookReceiver {
    fn drop(&mut self) {
        self.serving.abort();
    }
}
