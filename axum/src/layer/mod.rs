//! [`IdempotencyLayer`]: a tower layer that makes a handler which answers
//! synchronously idempotent under its `Idempotency-Key`, on any
//! [`TaskStore`](taskfence::TaskStore), as the IETF draft
//! (draft-ietf-httpapi-idempotency-key-header) describes: the first request
//! runs the handler and its response becomes the key's one saved result; a
//! retry gets that response again; a copy that arrives while the first is
//! still running gets a `409`.
//!
//! Each key is one taskfence task (scope, operation, key), bound to the
//! request's fingerprint. Running the handler is one attempt: the layer
//! submits, claims with a lease, runs the handler and reads its response
//! while renewing the lease, then completes the task with the response. So
//! the store's guarantees carry over: one saved response per key, whatever
//! runs concurrently, and a crashed process's key is taken over when its
//! lease expires.
//!
//! | request | the layer answers |
//! | --- | --- |
//! | no `Idempotency-Key` | `400` `idempotency-key-missing`; with [`optional`](IdempotencyLayer::optional), the handler runs unguarded |
//! | two keys, a malformed key | `400` `idempotency-key-malformed` |
//! | no caller the [`KeyScope`] recognizes | the scope's own problem (a `401`, say); nothing is read or written |
//! | a new key | the handler runs; its response is sent and, when [saved](IdempotencyLayer::save_if), kept |
//! | the key again, same fingerprint, response saved | the saved response (status, [kept headers](IdempotencyLayer::replay_headers), body) with `Idempotent-Replayed: true`; the handler does not run |
//! | the key again while its first request runs | `409` `idempotency-key-in-flight`, `Retry-After: 1` |
//! | the key again, another method, path, query or body | `422` `idempotency-key-reused` (no task id, nothing of the first request) |
//! | the key again after a response that was not saved (5xx, 4xx, a panic) | the handler runs again |
//! | the key again after its runs ran out ([`max_attempts`](IdempotencyLayer::max_attempts)) or an operator cancelled its task | `410` `idempotency-key-exhausted`: send it under a new key |
//! | a request body over [`body_limit`](IdempotencyLayer::body_limit) | `413` `body-too-large` |
//! | a response body over [`response_limit`](IdempotencyLayer::response_limit) | `500` `response-too-large`; the rest of the body is never read, and the key is closed (`410` after) |
//! | the store unreachable | `503` `unavailable` (the cause is logged) |
//!
//! # Whose keys: the scope
//!
//! The draft asks for keys unique *per client*. A key is looked up within its
//! [`KeyScope`], which the layer cannot be built without: either
//! [`KeyScope::per_caller`], a function of the request's parts that names the
//! authenticated caller (read from what your authentication put in the
//! request's extensions, or from a verified credential), or
//! [`KeyScope::single_tenant`], one scope for every request, for a service
//! whose only client is one party. Under a shared scope, a client that sends
//! another client's key with the same body gets that client's saved
//! response; per caller, it gets its own run.
//!
//! The layer's refusals describe the request, never the task behind the
//! key: a `422` or `410` carries no task id and nothing of the first
//! request, so even under a shared scope a refusal tells a client nothing
//! of another.
//!
//! # What the layer keeps, and for how long
//!
//! For each key, one task in the store (`taskfence show` reads it):
//!
//! - **the scope, the operation and the key** as the request key;
//! - **the fingerprint**: a SHA-256 over the method, the path and query, and
//!   the body (a JSON body as its [`canonical_json`](crate::canonical_json),
//!   so a client that serializes its JSON again on retry is not refused; any
//!   other body byte for byte). The body itself is not kept;
//! - **the payload**: `METHOD /path`, for an operator. The query string is
//!   not kept (it may hold a token) unless [`record_query`](IdempotencyLayer::record_query)
//!   asks for it;
//! - **the saved response**: its status, the headers of the allow-list
//!   [`replay_headers`](IdempotencyLayer::replay_headers) (never `Set-Cookie`
//!   unless you list it) and its **whole body**, up to
//!   [`response_limit`](IdempotencyLayer::response_limit). Only responses
//!   [`save_if`](IdempotencyLayer::save_if) accepts (below 400 by default);
//! - **the attempts**: the worker name ([`worker`](IdempotencyLayer::worker))
//!   and the times of each run.
//!
//! All of it is kept for [`retention`](IdempotencyLayer::retention) (24 h
//! by default) from the key's first request, then removed by the store's
//! `purge_expired` (`taskfence purge`; run it on a schedule). Nothing is
//! deleted before: a task past its retention stays until a purge. After
//! the purge, the key is new work.
//!
//! # What is saved, and what a failure does
//!
//! - **A response below 400** (by default; [`save_if`](IdempotencyLayer::save_if)
//!   chooses) is saved. The client gets it as the handler made it (all
//!   headers).
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
//!   (30 s by default, renewed every third of it while the handler runs and
//!   its response body is read, until the response is saved) runs out, and
//!   until then a retry gets `409`. The first retry after the lease expired
//!   takes the task over (a new assignment version) and runs the handler
//!   again; had the dead process come back, its late save would be refused
//!   (fencing), so one response is kept.
//! - **A response body over [`response_limit`](IdempotencyLayer::response_limit)**
//!   is not read past the limit: the client gets a `500`
//!   `response-too-large` and the task fails permanently (retries get `410`):
//!   the handler ran, so running it again could repeat its effect. **A
//!   response the store refuses to save** (its saved form is bigger than
//!   [`MAX_RESPONSE_LEN`](taskfence::limits::MAX_RESPONSE_LEN)) is sent,
//!   and the task fails permanently too. **A store failing during the
//!   save** is logged and the response sent; the lease expires and a retry
//!   runs the handler again.
//! - **A save that finds another response saved first** (this run's lease
//!   expired mid-handler and a retry took over and finished): the client
//!   gets the saved response, replayed, so every answer to a key is the same.
//!
//! # Deploying it
//!
//! Put the layer on the routes it guards (`post(handler).layer(…)` or
//! `Router::route_layer`) *inside* your authentication, so that the scope
//! reads a caller that was verified. It reads every request it sees,
//! whatever its method. It buffers the request body (up to
//! [`body_limit`](IdempotencyLayer::body_limit)) and the response body (up
//! to [`response_limit`](IdempotencyLayer::response_limit)): it is for
//! handlers that answer with one complete response, not long streams. It
//! needs a tokio runtime with timers (axum's).
//!
//! | module | its job |
//! | --- | --- |
//! | `config` | [`IdempotencyLayer`], its settings and builder, [`KeyScope`] |
//! | `service` | [`Idempotent`], one request's way through the layer |
//! | `lease` | the lease of a running handler: renewed while it runs, released when it ends unsaved |
//! | `limits` | the bounded reads of the request and the response bodies |
//! | `request` | what the layer records of a request: fingerprint and payload |
//! | `replay` | a response as the key's saved result, and back |
//! | `answers` | the layer's own problem responses |

mod answers;
mod config;
mod lease;
mod limits;
mod replay;
mod request;
mod service;

pub use config::{IdempotencyLayer, KeyScope};
pub use service::Idempotent;
