//! [`IdempotencyLayer`]: a tower layer that makes a handler which answers
//! synchronously idempotent under its `Idempotency-Key`, on any
//! [`TaskStore`], as the IETF draft (draft-ietf-httpapi-idempotency-key-header)
//! describes: the first request runs the handler and its response becomes
//! the key's one saved result; a retry gets that response again; a copy that
//! arrives while the first is still running gets a `409`.
//!
//! Each key is one taskfence task (scope, operation, key), bound to the
//! request's fingerprint. Running the handler is one attempt: the layer
//! submits, claims with a lease, runs the handler while renewing the lease,
//! then completes the task with the response. So the store's guarantees
//! carry over: one saved response per key, whatever runs concurrently, and
//! a crashed process's key is taken over when its lease expires.
//!
//! | request | the layer answers |
//! | --- | --- |
//! | no `Idempotency-Key` | `400` `idempotency-key-missing`; with [`optional`](IdempotencyLayer::optional), the handler runs unguarded |
//! | two keys, a malformed key | `400` `idempotency-key-malformed` |
//! | a new key | the handler runs; its response is sent and, when [saved](IdempotencyLayer::save_if), kept |
//! | the key again, same fingerprint, response saved | the saved response (status, [kept headers](IdempotencyLayer::replay_headers), body) with `Idempotent-Replayed: true`; the handler does not run |
//! | the key again while its first request runs | `409` `idempotency-key-in-flight`, `Retry-After: 1` |
//! | the key again, another method, path, query or body | `422` `idempotency-key-reused`, `existing_task_id` |
//! | the key again after a response that was not saved (5xx, 4xx, a panic) | the handler runs again |
//! | the key again after its runs ran out ([`max_attempts`](IdempotencyLayer::max_attempts)) or an operator cancelled its task | `410` `idempotency-key-exhausted`: send it under a new key |
//! | a body over [`body_limit`](IdempotencyLayer::body_limit) | `413` `body-too-large` |
//! | the store unreachable | `503` `unavailable` (the cause is logged) |
//!
//! # What is saved, and what a failure does
//!
//! - **A response below 400** (by default; [`save_if`](IdempotencyLayer::save_if)
//!   chooses) is saved: its status, the headers of
//!   [`replay_headers`](IdempotencyLayer::replay_headers) and its body.
//!   The client gets it as the handler made it (all headers).
//! - **Any other response** (a 4xx refusal, a 5xx) is sent but not saved:
//!   the layer *releases* the task, so a retry runs the handler at once. A
//!   handler that refuses has, as a rule, done nothing; one that failed
//!   should be safe to run again, or it would need its own effect-specific
//!   guard anyway. Each run counts as one of the key's
//!   [`max_attempts`](IdempotencyLayer::max_attempts).
//! - **A panicking handler**: the task is released, then the panic goes on
//!   unwinding as it would without the layer.
//! - **A dropped request** (the client went away, the server shut down):
//!   the task is released in the background.
//! - **A process that dies mid-handler** releases nothing: its lease
//!   (30 s by default, renewed every third of it while the handler runs)
//!   runs out, and until then a retry gets `409`. The first retry after the
//!   lease expired takes the task over (a new assignment version) and runs
//!   the handler again; had the dead process come back, its late save would
//!   be refused (fencing), so one response is kept.
//! - **A response the store refuses to save** (bigger than
//!   [`MAX_RESPONSE_LEN`](taskfence::limits::MAX_RESPONSE_LEN)) is sent, and
//!   the task fails permanently: retries get `410`, the handler never runs
//!   twice for the key. **A store failing during the save** is logged and the
//!   response sent; the lease expires and a retry runs the handler again.
//! - **A save that finds another response saved first** (this run's lease
//!   expired mid-handler and a retry took over and finished): the client
//!   gets the saved response, replayed, so every answer to a key is the same.
//!
//! The fingerprint is the method, the path and query, and the body — a JSON
//! body (`application/json`, `…+json`) as its [`canonical_json`](crate::canonical_json),
//! so a client that serializes its JSON again on retry is not refused; any
//! other body byte for byte.
//!
//! Put the layer on the routes it guards (`post(handler).layer(…)` or
//! `Router::route_layer`); it reads every request it sees, whatever its
//! method. It buffers the request and the response bodies: it is for
//! handlers that answer with one complete response, not streams. It needs a
//! tokio runtime with timers (axum's).

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;
use http::request::Parts;
use http::{HeaderName, HeaderValue, Request, StatusCode, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::{Deserialize, Serialize};
use taskfence::{
    Claim, ClaimRequest, Failure, Fenced, InputHash, Lease, NewTask, Rejection, RequestKey, RetryPolicy,
    Task, TaskStore,
};
use tower_layer::Layer;
use tower_service::Service;

use crate::key::{IDEMPOTENT_REPLAYED, IdempotencyKey, IdempotencyKeyRejection};
use crate::problem::{Problem, ProblemTypes};

/// Finds the scope of a request's key: the authenticated caller, tenant or
/// workspace. An `Err` is sent as it is (a `401`, say).
type ScopeFn = dyn Fn(&Parts) -> Result<String, Problem> + Send + Sync;

/// A tower [`Layer`] that makes the service it wraps idempotent under the
/// `Idempotency-Key` header, on any [`TaskStore`]: see the
/// [module documentation](self) for what it answers when.
///
/// ```
/// use axum::{Router, http::StatusCode, routing::post};
/// use taskfence::MemoryStore;
/// use taskfence_axum::IdempotencyLayer;
///
/// async fn charge(body: String) -> (StatusCode, String) {
///     (StatusCode::CREATED, format!("charged: {body}")) // runs once per key
/// }
///
/// let layer = IdempotencyLayer::new(MemoryStore::new())
///     .operation("payments.charge")
///     // Keys are per caller: the draft's "unique per client".
///     .scope(|parts| Ok(parts.headers.get("x-tenant").and_then(|v| v.to_str().ok()).unwrap_or("public").to_owned()));
/// let app: Router = Router::new().route("/charges", post(charge).layer(layer));
/// ```
///
/// Any store, as a trait object too:
///
/// ```
/// use std::sync::Arc;
/// use taskfence::{MemoryStore, TaskStore};
/// use taskfence_axum::IdempotencyLayer;
/// let store: Arc<dyn TaskStore> = Arc::new(MemoryStore::new());
/// let layer: IdempotencyLayer<dyn TaskStore> = IdempotencyLayer::from_arc(store);
/// ```
pub struct IdempotencyLayer<S: ?Sized> {
    store: Arc<S>,
    settings: Settings,
}

#[derive(Clone)]
struct Settings {
    operation: String,
    scope: Arc<ScopeFn>,
    required: bool,
    lease: Duration,
    retention: Duration,
    max_attempts: u32,
    body_limit: usize,
    replay_headers: Vec<HeaderName>,
    save_if: fn(StatusCode) -> bool,
    types: ProblemTypes,
    worker: String,
}

impl<S: TaskStore> IdempotencyLayer<S> {
    /// A layer on `store`, with the defaults: operation `http`, every key in
    /// one scope (`default`), the key required, a 30 s lease, keys kept
    /// 24 h, 10 runs per key, request bodies up to 2 MiB.
    ///
    /// ```
    /// let layer = taskfence_axum::IdempotencyLayer::new(taskfence::MemoryStore::new());
    /// ```
    pub fn new(store: S) -> Self {
        Self::from_arc(Arc::new(store))
    }
}

impl<S: TaskStore + ?Sized> IdempotencyLayer<S> {
    /// A layer on a shared store (`Arc<dyn TaskStore>` included).
    ///
    /// ```
    /// use std::sync::Arc;
    /// let layer = taskfence_axum::IdempotencyLayer::from_arc(Arc::new(taskfence::MemoryStore::new()));
    /// ```
    pub fn from_arc(store: Arc<S>) -> Self {
        Self {
            store,
            settings: Settings {
                operation: "http".to_owned(),
                scope: Arc::new(|_| Ok("default".to_owned())),
                required: true,
                lease: Duration::from_secs(30),
                retention: Duration::from_secs(24 * 3600),
                max_attempts: 10,
                body_limit: 2 * 1024 * 1024,
                replay_headers: [
                    header::CONTENT_TYPE,
                    header::CONTENT_LANGUAGE,
                    header::CONTENT_LOCATION,
                    header::LOCATION,
                    header::ETAG,
                ]
                .into(),
                save_if: |status| status.as_u16() < 400,
                types: ProblemTypes::default(),
                worker: format!("taskfence-axum:{}", std::process::id()),
            },
        }
    }

    /// The operation of the keys' tasks (`http` by default): one key space.
    /// Give each guarded endpoint its own when a key may be reused across
    /// them; otherwise the fingerprint (which holds the path) refuses that
    /// reuse with a `422`.
    ///
    /// ```
    /// let layer = taskfence_axum::IdempotencyLayer::new(taskfence::MemoryStore::new()).operation("orders.create");
    /// ```
    #[must_use]
    pub fn operation(mut self, operation: impl Into<String>) -> Self {
        self.settings.operation = operation.into();
        self
    }

    /// How to find the scope of a request's key: who the client is (the
    /// draft asks for keys unique per client). By default every request is in
    /// one scope, `default` — right only for a service with one client. An
    /// `Err` is sent as it is, and nothing is written.
    ///
    /// ```
    /// use http::StatusCode;
    /// use taskfence_axum::{IdempotencyLayer, Problem};
    /// let layer = IdempotencyLayer::new(taskfence::MemoryStore::new()).scope(|parts| {
    ///     parts.headers.get("x-user").and_then(|v| v.to_str().ok()).map(str::to_owned)
    ///         .ok_or_else(|| Problem::new(StatusCode::UNAUTHORIZED))
    /// });
    /// ```
    #[must_use]
    pub fn scope(
        mut self,
        scope: impl Fn(&Parts) -> Result<String, Problem> + Send + Sync + 'static,
    ) -> Self {
        self.settings.scope = Arc::new(scope);
        self
    }

    /// Makes the key optional: a request without the header runs the handler
    /// unguarded (not deduplicated). A malformed key is still a `400`.
    ///
    /// ```
    /// let layer = taskfence_axum::IdempotencyLayer::new(taskfence::MemoryStore::new()).optional();
    /// ```
    #[must_use]
    pub fn optional(mut self) -> Self {
        self.settings.required = false;
        self
    }

    /// The lease of a run (30 s by default), renewed every third of it while
    /// the handler runs. It bounds how long a key stays `409` after the
    /// process running it died.
    ///
    /// ```
    /// use std::time::Duration;
    /// let layer = taskfence_axum::IdempotencyLayer::new(taskfence::MemoryStore::new()).lease(Duration::from_secs(10));
    /// ```
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.settings.lease = lease;
        self
    }

    /// How long a key is remembered (24 h by default; the draft asks servers
    /// to publish it). After the store's `purge_expired` removes it, the key
    /// is new work.
    ///
    /// ```
    /// use std::time::Duration;
    /// let layer = taskfence_axum::IdempotencyLayer::new(taskfence::MemoryStore::new()).retention(Duration::from_secs(3600));
    /// ```
    #[must_use]
    pub fn retention(mut self, retention: Duration) -> Self {
        self.settings.retention = retention;
        self
    }

    /// How many times the handler may run for one key (10 by default): runs
    /// whose response was not saved, panics and takeovers after a crash
    /// count. Then the key answers `410`.
    ///
    /// ```
    /// let layer = taskfence_axum::IdempotencyLayer::new(taskfence::MemoryStore::new()).max_attempts(3);
    /// ```
    #[must_use]
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.settings.max_attempts = max_attempts;
        self
    }

    /// The largest request body read for the fingerprint (2 MiB by
    /// default, axum's own default limit); a bigger one is a `413`.
    ///
    /// ```
    /// let layer = taskfence_axum::IdempotencyLayer::new(taskfence::MemoryStore::new()).body_limit(64 * 1024);
    /// ```
    #[must_use]
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.settings.body_limit = bytes;
        self
    }

    /// The response headers kept with a saved response and sent on replays:
    /// by default `Content-Type`, `Content-Language`, `Content-Location`,
    /// `Location` and `ETag`. Never a `Set-Cookie` or anything else that is
    /// meant for one client session. Values that are not visible ASCII are
    /// not kept.
    ///
    /// ```
    /// use http::header;
    /// let layer = taskfence_axum::IdempotencyLayer::new(taskfence::MemoryStore::new())
    ///     .replay_headers([header::CONTENT_TYPE, header::LOCATION, header::HeaderName::from_static("x-order-id")]);
    /// ```
    #[must_use]
    pub fn replay_headers(mut self, headers: impl IntoIterator<Item = HeaderName>) -> Self {
        self.settings.replay_headers = headers.into_iter().collect();
        self
    }

    /// Which responses are saved and replayed (by default those below 400);
    /// any other is sent, not saved, and the next retry runs the handler.
    ///
    /// ```
    /// // Also keep the handler's 4xx refusals: a retry gets the same refusal.
    /// let layer = taskfence_axum::IdempotencyLayer::new(taskfence::MemoryStore::new())
    ///     .save_if(|status| !status.is_server_error());
    /// ```
    #[must_use]
    pub fn save_if(mut self, save: fn(StatusCode) -> bool) -> Self {
        self.settings.save_if = save;
        self
    }

    /// The problem types of the layer's own answers (`/problems/…` by
    /// default; an absolute base such as `https://api.example.com/problems/`
    /// is what RFC 9457 recommends).
    ///
    /// ```
    /// use taskfence_axum::{IdempotencyLayer, ProblemTypes};
    /// let layer = IdempotencyLayer::new(taskfence::MemoryStore::new())
    ///     .problem_types(ProblemTypes::new("https://api.example.com/problems/"));
    /// ```
    #[must_use]
    pub fn problem_types(mut self, types: ProblemTypes) -> Self {
        self.settings.types = types;
        self
    }

    /// The worker name of the layer's claims (`taskfence-axum:<pid>` by
    /// default), as attempts show it (`taskfence show`).
    ///
    /// ```
    /// let layer = taskfence_axum::IdempotencyLayer::new(taskfence::MemoryStore::new()).worker("api-7");
    /// ```
    #[must_use]
    pub fn worker(mut self, worker: impl Into<String>) -> Self {
        self.settings.worker = worker.into();
        self
    }
}

impl<S: ?Sized> Clone for IdempotencyLayer<S> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            settings: self.settings.clone(),
        }
    }
}

impl<S: ?Sized> fmt::Debug for IdempotencyLayer<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("operation", &self.settings.operation)
            .field("required", &self.settings.required)
            .field("lease", &self.settings.lease)
            .field("retention", &self.settings.retention)
            .field("max_attempts", &self.settings.max_attempts)
            .finish_non_exhaustive()
    }
}

impl<S: TaskStore + ?Sized, I> Layer<I> for IdempotencyLayer<S> {
    type Service = Idempotent<S, I>;

    fn layer(&self, inner: I) -> Self::Service {
        Idempotent {
            inner,
            store: Arc::clone(&self.store),
            settings: Arc::new(self.settings.clone()),
        }
    }
}

/// The service [`IdempotencyLayer`] wraps around another: build it with the
/// layer (axum does, in `.layer(…)`).
///
/// ```
/// use axum::{Router, routing::post};
/// use tower_layer::Layer;
/// use taskfence::MemoryStore;
/// use taskfence_axum::{Idempotent, IdempotencyLayer};
///
/// let app: Router = Router::new().route("/jobs", post(|| async { "done" }));
/// // A `tower_service::Service<Request<Body>>`, for tower's own stacks.
/// let service: Idempotent<MemoryStore, Router> = IdempotencyLayer::new(MemoryStore::new()).layer(app);
/// ```
pub struct Idempotent<S: ?Sized, I> {
    inner: I,
    store: Arc<S>,
    settings: Arc<Settings>,
}

impl<S: ?Sized, I: Clone> Clone for Idempotent<S, I> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            store: Arc::clone(&self.store),
            settings: Arc::clone(&self.settings),
        }
    }
}

impl<S: ?Sized, I: fmt::Debug> fmt::Debug for Idempotent<S, I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotent")
            .field("inner", &self.inner)
            .field("operation", &self.settings.operation)
            .finish_non_exhaustive()
    }
}

impl<S, I> Service<Request<Body>> for Idempotent<S, I>
where
    S: TaskStore + ?Sized + 'static,
    I: Service<Request<Body>, Response = Response> + Clone + Send + 'static,
    I::Future: Send + 'static,
    I::Error: Send + 'static,
{
    type Response = Response;
    type Error = I::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response, I::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        // The service that was polled ready runs this request; a clone waits for the next.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let run = Run {
            store: Arc::clone(&self.store),
            settings: Arc::clone(&self.settings),
        };
        Box::pin(run.handle(inner, request))
    }
}

/// One request's way through the layer.
struct Run<S: ?Sized> {
    store: Arc<S>,
    settings: Arc<Settings>,
}

impl<S: TaskStore + ?Sized + 'static> Run<S> {
    async fn handle<I>(self, mut inner: I, request: Request<Body>) -> Result<Response, I::Error>
    where
        I: Service<Request<Body>, Response = Response>,
    {
        let types = &self.settings.types;
        let (parts, body) = request.into_parts();
        let key = match IdempotencyKey::from_headers(&parts.headers) {
            Ok(Some(key)) => key,
            Ok(None) if !self.settings.required => {
                return inner.call(Request::from_parts(parts, body)).await;
            }
            Ok(None) => {
                return Ok(types
                    .key_rejection(&IdempotencyKeyRejection::Missing)
                    .into_response());
            }
            Err(rejection) => return Ok(types.key_rejection(&rejection).into_response()),
        };
        let scope = match (self.settings.scope)(&parts) {
            Ok(scope) => scope,
            Err(problem) => return Ok(problem.into_response()),
        };
        let bytes = match Limited::new(body, self.settings.body_limit).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(error) if error.downcast_ref::<LengthLimitError>().is_some() => {
                let detail = format!("the request body is over {} bytes", self.settings.body_limit);
                return Ok(types
                    .problem(StatusCode::PAYLOAD_TOO_LARGE, "body-too-large", detail)
                    .into_response());
            }
            Err(error) => {
                tracing::debug!(%error, "idempotency layer: the request body could not be read");
                let detail = "the request body could not be read";
                return Ok(types
                    .problem(StatusCode::BAD_REQUEST, "invalid-body", detail)
                    .into_response());
            }
        };
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let new = NewTask::new(
            RequestKey::new(scope, &self.settings.operation, key.as_str()),
            fingerprint(&parts, &bytes),
        )
        // What the request was, for an operator's `taskfence show`.
        .payload(format!("{} {target}", parts.method))
        .policy(RetryPolicy::default().max_attempts(self.settings.max_attempts))
        .retention(self.settings.retention)
        .without_handoff();
        let task = match self.store.submit(new).await {
            Ok(submitted) => submitted.into_task(),
            Err(error) => return Ok(types.error(&error).into_response()),
        };
        if task.response.is_some() {
            return Ok(self.replay(&task));
        }
        let claim = ClaimRequest::new(&self.settings.worker, self.settings.lease);
        let lease = match self.store.claim(task.id, claim).await {
            Ok(Claim::Acquired(lease)) => lease,
            Ok(Claim::Completed(task)) => return Ok(self.replay(&task)),
            Ok(Claim::Busy { .. } | Claim::Backoff { .. }) => return Ok(self.in_flight()),
            Ok(Claim::Failed(task) | Claim::Cancelled(task)) => return Ok(self.exhausted(&task)),
            Ok(Claim::NotFound) => return Ok(self.unavailable()),
            Err(error) => return Ok(types.error(&error).into_response()),
        };
        self.run(inner, Request::from_parts(parts, Body::from(bytes)), lease)
            .await
    }

    /// Runs the handler under `lease`, renewing it, and saves its response.
    async fn run<I>(&self, mut inner: I, request: Request<Body>, lease: Lease) -> Result<Response, I::Error>
    where
        I: Service<Request<Body>, Response = Response>,
    {
        let mut held = Held {
            store: Arc::clone(&self.store),
            lease: Some(lease),
        };
        let every = self.settings.lease / 3;
        let handler = AssertUnwindSafe(inner.call(request)).catch_unwind();
        let mut handler = std::pin::pin!(handler);
        let outcome = loop {
            tokio::select! {
                outcome = &mut handler => break outcome,
                () = tokio::time::sleep(every) => held.renew(self.settings.lease).await,
            }
        };
        let response = match outcome {
            Err(panic) => {
                held.release("the handler panicked").await;
                std::panic::resume_unwind(panic);
            }
            Ok(Err(error)) => {
                held.release("the service failed").await;
                return Err(error);
            }
            Ok(Ok(response)) => response,
        };
        if !(self.settings.save_if)(response.status()) {
            held.release("the response is not one to save").await;
            return Ok(response);
        }
        let (head, body) = response.into_parts();
        let body = match body.collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(error) => {
                tracing::error!(%error, "idempotency layer: the handler's response body failed");
                held.release("the response body failed").await;
                return Ok(self.internal());
            }
        };
        let saved =
            SavedResponse::of(head.status, &head.headers, &body, &self.settings.replay_headers).encode();
        let Some(lease) = held.lease.take() else {
            return Ok(Response::from_parts(head, Body::from(body)));
        };
        if let Err(invalid) = taskfence::limits::check_response(&saved) {
            tracing::error!(task_id = %lease.task_id(), %invalid, "idempotency layer: the response is too big to save; the key is closed");
            let failure = Failure::permanent("the response is too big to save");
            if let Err(error) = self.store.fail(lease, failure).await {
                tracing::error!(%error, "idempotency layer: could not close the key");
            }
            return Ok(Response::from_parts(head, Body::from(body)));
        }
        let task_id = lease.task_id();
        match self.store.complete(lease, saved).await {
            Ok(Fenced::Accepted(_)) => Ok(Response::from_parts(head, Body::from(body))),
            // This run's lease ran out and a retry saved first: that one is the answer.
            Ok(Fenced::Rejected(Rejection::AlreadyCompleted(task))) => Ok(self.replay(&task)),
            Ok(Fenced::Rejected(rejection)) => {
                tracing::warn!(%task_id, %rejection, "idempotency layer: the response was not saved (the lease was lost)");
                Ok(Response::from_parts(head, Body::from(body)))
            }
            Err(error) => {
                tracing::error!(%task_id, %error, "idempotency layer: the response was not saved; a retry after the lease runs the handler again");
                Ok(Response::from_parts(head, Body::from(body)))
            }
        }
    }

    /// The saved response, marked as a replay.
    fn replay(&self, task: &Task) -> Response {
        let saved = task
            .response
            .as_ref()
            .and_then(|r| SavedResponse::decode(r.as_bytes()));
        match saved.and_then(SavedResponse::into_response) {
            Some(mut response) => {
                let headers = response.headers_mut();
                headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
                response
            }
            None => {
                tracing::error!(task_id = %task.id, "idempotency layer: the saved response is not one this layer wrote");
                self.internal()
            }
        }
    }

    fn in_flight(&self) -> Response {
        self.settings
            .types
            .problem(
                StatusCode::CONFLICT,
                "idempotency-key-in-flight",
                "a request with this Idempotency-Key is still being processed; retry it later",
            )
            .with_header(header::RETRY_AFTER, HeaderValue::from_static("1"))
            .into_response()
    }

    fn exhausted(&self, task: &Task) -> Response {
        let detail = format!(
            "the request with this Idempotency-Key ran {} times without a response to keep, \
             or was cancelled; send it under a new key",
            task.attempts()
        );
        self.settings
            .types
            .problem(StatusCode::GONE, "idempotency-key-exhausted", detail)
            .with_extension("existing_task_id", task.id.to_string())
            .into_response()
    }

    fn unavailable(&self) -> Response {
        self.settings
            .types
            .problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the request could not be completed now; retry it with the same Idempotency-Key",
            )
            .into_response()
    }

    fn internal(&self) -> Response {
        self.settings
            .types
            .problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the response could not be rendered",
            )
            .into_response()
    }
}

/// The lease of a running handler. Dropped while still held (the request
/// was dropped), it releases the task in the background, so a retry need
/// not wait for the lease to run out.
struct Held<S: TaskStore + ?Sized + 'static> {
    store: Arc<S>,
    lease: Option<Lease>,
}

impl<S: TaskStore + ?Sized + 'static> Held<S> {
    async fn renew(&mut self, extend_by: Duration) {
        let Some(lease) = self.lease.as_mut() else {
            return;
        };
        match self.store.renew(lease, extend_by).await {
            Ok(Fenced::Accepted(())) => {}
            // Keep running: the save will be refused if the lease is really gone.
            Ok(Fenced::Rejected(rejection)) => {
                tracing::warn!(task_id = %lease.task_id(), %rejection, "idempotency layer: lease renewal refused");
            }
            Err(error) => {
                tracing::warn!(task_id = %lease.task_id(), %error, "idempotency layer: lease renewal failed");
            }
        }
    }

    async fn release(&mut self, why: &str) {
        if let Some(lease) = self.lease.take() {
            let task_id = lease.task_id();
            tracing::debug!(%task_id, why, "idempotency layer: releasing the key for a retry");
            if let Err(error) = self.store.release(lease).await {
                tracing::warn!(%task_id, %error, "idempotency layer: release failed; the key is free when its lease expires");
            }
        }
    }
}

impl<S: TaskStore + ?Sized + 'static> Drop for Held<S> {
    fn drop(&mut self) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        let store = Arc::clone(&self.store);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = store.release(lease).await;
            });
        }
    }
}

/// The fingerprint a key is bound to: method, path and query, and the body
/// (canonical when it is JSON).
fn fingerprint(parts: &Parts, body: &Bytes) -> InputHash {
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let canonical = is_json(parts)
        .then(|| serde_json::from_slice::<serde_json::Value>(body).ok())
        .flatten()
        .and_then(|value| crate::fingerprint::canonical_json(&value).ok());
    let (kind, body) = match &canonical {
        Some(json) => ("json", json.as_slice()),
        None => ("bytes", body.as_ref()),
    };
    InputHash::of([
        b"http".as_slice(),
        parts.method.as_str().as_bytes(),
        target.as_bytes(),
        kind.as_bytes(),
        body,
    ])
}

fn is_json(parts: &Parts) -> bool {
    let Some(media) = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
    else {
        return false;
    };
    let media = media.trim().to_ascii_lowercase();
    media == "application/json" || (media.starts_with("application/") && media.ends_with("+json"))
}

/// A response as the task's saved result: JSON, so an operator reads it
/// (`taskfence show`); the body as text when it is UTF-8, else base64.
#[derive(Debug, Serialize, Deserialize)]
struct SavedResponse {
    status: u16,
    headers: Vec<(String, String)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body_base64: Option<String>,
}

impl SavedResponse {
    fn of(status: StatusCode, headers: &http::HeaderMap, body: &Bytes, keep: &[HeaderName]) -> Self {
        let headers = keep
            .iter()
            .flat_map(|name| {
                headers
                    .get_all(name)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .map(|v| (name.as_str().to_owned(), v.to_owned()))
            })
            .collect();
        let (body, body_base64) = match std::str::from_utf8(body) {
            Ok(text) => (Some(text.to_owned()), None),
            Err(_) => (None, Some(crate::b64::encode(body))),
        };
        Self {
            status: status.as_u16(),
            headers,
            body,
            body_base64,
        }
    }

    fn encode(&self) -> taskfence::Response {
        // Strings and numbers only: serializing cannot fail.
        taskfence::Response::new(serde_json::to_vec(self).unwrap_or_default())
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        serde_json::from_slice(bytes).ok()
    }

    fn into_response(self) -> Option<Response> {
        let body = match (self.body, self.body_base64) {
            (Some(text), None) => text.into_bytes(),
            (None, Some(encoded)) => crate::b64::decode(&encoded)?,
            (None, None) => Vec::new(),
            (Some(_), Some(_)) => return None,
        };
        let mut response = Response::new(Body::from(body));
        *response.status_mut() = StatusCode::from_u16(self.status).ok()?;
        let headers = response.headers_mut();
        for (name, value) in self.headers {
            headers.append(
                HeaderName::try_from(name).ok()?,
                HeaderValue::try_from(value).ok()?,
            );
        }
        Some(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_response_comes_back_with_its_kept_headers_only() {
        let mut headers = http::HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(header::SET_COOKIE, HeaderValue::from_static("session=secret"));
        headers.append(header::ETAG, HeaderValue::from_static("\"v1\""));
        let body = Bytes::from_static(b"{\"id\":7}");
        let keep = [header::CONTENT_TYPE, header::ETAG];
        let saved = SavedResponse::of(StatusCode::CREATED, &headers, &body, &keep).encode();
        let text = saved.as_str().unwrap();
        assert!(!text.contains("secret"), "{text}");
        let back = SavedResponse::decode(saved.as_bytes())
            .unwrap()
            .into_response()
            .unwrap();
        assert_eq!(back.status(), StatusCode::CREATED);
        assert_eq!(back.headers()["content-type"], "application/json");
        assert_eq!(back.headers()["etag"], "\"v1\"");
        assert!(back.headers().get("set-cookie").is_none());
    }

    #[test]
    fn a_binary_body_is_saved_as_base64() {
        let body = Bytes::from_static(&[0xff, 0x00, 0xfe]);
        let saved = SavedResponse::of(StatusCode::OK, &http::HeaderMap::new(), &body, &[]).encode();
        assert_eq!(
            saved.as_str(),
            Some(r#"{"status":200,"headers":[],"body_base64":"/wD+"}"#)
        );
        let back = SavedResponse::decode(saved.as_bytes()).unwrap();
        assert_eq!(
            back.body_base64.as_deref().and_then(crate::b64::decode),
            Some(body.to_vec())
        );
    }

    #[test]
    fn json_bodies_are_fingerprinted_by_value_others_by_bytes() {
        let parts = |content_type: &str, uri: &str| {
            let (parts, ()) = Request::post(uri)
                .header(header::CONTENT_TYPE, content_type)
                .body(())
                .unwrap()
                .into_parts();
            parts
        };
        let json = parts("application/json; charset=utf-8", "/orders");
        let a = fingerprint(&json, &Bytes::from_static(br#"{"a":1,"b":2}"#));
        let b = fingerprint(&json, &Bytes::from_static(b"{ \"b\": 2, \"a\": 1.0 }"));
        assert_eq!(a, b);
        assert_ne!(a, fingerprint(&json, &Bytes::from_static(br#"{"a":1,"b":3}"#)));
        assert_ne!(
            a,
            fingerprint(
                &parts("application/json", "/orders?x=1"),
                &Bytes::from_static(br#"{"a":1,"b":2}"#)
            )
        );
        let problem = parts("application/problem+json", "/orders");
        assert_eq!(
            fingerprint(&problem, &Bytes::from_static(br#"{"a":1}"#)),
            fingerprint(&problem, &Bytes::from_static(br#"{ "a" : 1 }"#))
        );
        let text = parts("text/plain", "/orders");
        assert_ne!(
            fingerprint(&text, &Bytes::from_static(br#"{"a":1}"#)),
            fingerprint(&text, &Bytes::from_static(br#"{ "a" : 1 }"#))
        );
    }
}
