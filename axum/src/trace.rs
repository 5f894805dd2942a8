//! [`request_span`]: each request in an OpenTelemetry HTTP server span named
//! after its route. It is the span a task's trace starts from: with
//! taskfence's `opentelemetry` feature the submission stores this span's
//! trace context with the task, and the worker's `process` span joins it,
//! so one request is one trace from the handler to the worker.

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

/// Middleware: runs the request in an `http.request` span exported as
/// `{method} {route}` (`POST /conversations/{id}/messages`, `otel.kind =
/// "server"`), with the HTTP semantic conventions' `http.request.method`,
/// `http.route` and, once answered, `http.response.status_code`. Add it with
/// `route_layer`, where every request has a matched route.
///
/// ```
/// use axum::{Router, routing::post};
///
/// let app: Router = Router::new()
///     .route("/messages", post(|| async { "sent" }))
///     .route_layer(axum::middleware::from_fn(taskfence_axum::trace::request_span));
/// ```
pub async fn request_span(route: MatchedPath, request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let span = tracing::info_span!(
        "http.request",
        otel.name = %format_args!("{method} {}", route.as_str()),
        otel.kind = "server",
        http.request.method = %method,
        http.route = route.as_str(),
        http.response.status_code = tracing::field::Empty,
    );
    let response = next.run(request).instrument(span.clone()).await;
    span.record("http.response.status_code", response.status().as_u16());
    response
}
