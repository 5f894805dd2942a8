//! [`Idempotent`]: the service the layer wraps around a handler, and one
//! request's way through it.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;
use http::Request;
use taskfence::{
    Claim, ClaimRequest, Failure, Fenced, Lease, NewTask, Rejection, RequestKey, RetryPolicy, Task, TaskStore,
};
use tower_service::Service;

use super::answers;
use super::config::Settings;
use super::lease::HandlerLease;
use super::limits::{BodyReadError, read_bounded};
use super::replay::{SavedResponse, replay};
use super::request;
use crate::key::{IdempotencyKey, IdempotencyKeyRejection};

/// The service [`IdempotencyLayer`](super::IdempotencyLayer) wraps around
/// another: build it with the layer (axum does, in `.layer(…)`).
///
/// ```
/// use axum::{Router, routing::post};
/// use tower_layer::Layer;
/// use taskfence::MemoryStore;
/// use taskfence_axum::{Idempotent, IdempotencyLayer, KeyScope};
///
/// let app: Router = Router::new().route("/jobs", post(|| async { "done" }));
/// // A `tower_service::Service<Request<Body>>`, for tower's own stacks.
/// let service: Idempotent<MemoryStore, Router> =
///     IdempotencyLayer::new(MemoryStore::new(), KeyScope::single_tenant()).layer(app);
/// ```
pub struct Idempotent<S: ?Sized, I> {
    inner: I,
    store: Arc<S>,
    settings: Arc<Settings>,
}

impl<S: ?Sized, I> Idempotent<S, I> {
    pub(super) fn new(inner: I, store: Arc<S>, settings: Arc<Settings>) -> Self {
        Self {
            inner,
            store,
            settings,
        }
    }
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
        let scope = match self.settings.scope.of(&parts) {
            Ok(scope) => scope,
            Err(problem) => return Ok(problem.into_response()),
        };
        let bytes = match read_bounded(body, self.settings.body_limit).await {
            Ok(bytes) => bytes,
            Err(BodyReadError::TooLarge { limit }) => return Ok(answers::request_too_large(types, limit)),
            Err(error) => {
                tracing::debug!(%error, "idempotency layer: the request body could not be read");
                return Ok(answers::request_unreadable(types));
            }
        };
        let new = NewTask::new(
            RequestKey::new(scope, &self.settings.operation, key.as_str()),
            request::fingerprint(&parts, &bytes),
        )
        .payload(request::payload(&parts, self.settings.record_query))
        .policy(RetryPolicy::default().max_attempts(self.settings.max_attempts))
        .retention(self.settings.retention)
        .without_handoff();
        let task = match self.store.submit(new).await {
            Ok(submitted) => submitted.into_task(),
            Err(error) => return Ok(answers::store_error(types, &error)),
        };
        if task.response.is_some() {
            return Ok(self.replay(&task));
        }
        let claim = ClaimRequest::new(&self.settings.worker, self.settings.lease_duration);
        let lease = match self.store.claim(task.id, claim).await {
            Ok(Claim::Acquired(lease)) => lease,
            Ok(Claim::Completed(task)) => return Ok(self.replay(&task)),
            Ok(Claim::Busy { .. } | Claim::Backoff { .. } | Claim::Throttled(_)) => {
                return Ok(answers::in_flight(types));
            }
            Ok(Claim::Failed(_) | Claim::Cancelled(_)) => return Ok(answers::exhausted(types)),
            Ok(Claim::NotFound) => return Ok(answers::unavailable(types)),
            Err(error) => return Ok(answers::store_error(types, &error)),
        };
        self.run(
            inner,
            Request::from_parts(parts, axum::body::Body::from(bytes)),
            lease,
        )
        .await
    }

    /// Runs the handler under `lease` and reads its response, renewing the
    /// lease throughout, then saves the response.
    async fn run<I>(&self, mut inner: I, request: Request<Body>, lease: Lease) -> Result<Response, I::Error>
    where
        I: Service<Request<Body>, Response = Response>,
    {
        let types = &self.settings.types;
        let mut lease = HandlerLease::new(Arc::clone(&self.store), lease, self.settings.lease_duration);
        let handler = AssertUnwindSafe(inner.call(request)).catch_unwind();
        let response = match lease.renewing(handler).await {
            Err(panic) => {
                lease.release("the handler panicked").await;
                std::panic::resume_unwind(panic);
            }
            Ok(Err(error)) => {
                lease.release("the service failed").await;
                return Err(error);
            }
            Ok(Ok(response)) => response,
        };
        if !(self.settings.save_if)(response.status()) {
            lease.release("the response is not one to save").await;
            return Ok(response);
        }
        let (head, body) = response.into_parts();
        // Still under the lease: a body that streams past it must not let a
        // retry take the key over and run the handler again.
        let body = match lease
            .renewing(read_bounded(body, self.settings.response_limit))
            .await
        {
            Ok(body) => body,
            Err(BodyReadError::TooLarge { limit }) => {
                // The handler ran: closing the key, not releasing it, keeps a
                // retry from running it again.
                if let Some(lease) = lease.take() {
                    self.close(lease, "the response is over the layer's response_limit")
                        .await;
                }
                return Ok(answers::response_too_large(types, limit));
            }
            Err(error) => {
                tracing::error!(%error, "idempotency layer: the handler's response body failed");
                lease.release("the response body failed").await;
                return Ok(answers::internal(types));
            }
        };
        let saved =
            SavedResponse::of(head.status, &head.headers, &body, &self.settings.replay_headers).encode();
        let Some(lease) = lease.take() else {
            return Ok(Response::from_parts(head, Body::from(body)));
        };
        if let Err(invalid) = taskfence::limits::check_response(&saved) {
            tracing::error!(task_id = %lease.task_id(), %invalid, "idempotency layer: the response is too big to save");
            self.close(lease, "the response is too big to save").await;
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

    /// Fails the key permanently: its handler ran, but there is no response
    /// to keep. Retries get `410`.
    async fn close(&self, lease: Lease, why: &'static str) {
        let task_id = lease.task_id();
        tracing::error!(%task_id, why, "idempotency layer: the key is closed");
        if let Err(error) = self.store.fail(lease, Failure::permanent(why)).await {
            tracing::error!(%task_id, %error, "idempotency layer: could not close the key");
        }
    }

    /// The saved response, marked as a replay.
    fn replay(&self, task: &Task) -> Response {
        replay(task).unwrap_or_else(|| {
            tracing::error!(task_id = %task.id, "idempotency layer: the saved response is not one this layer wrote");
            answers::internal(&self.settings.types)
        })
    }
}
