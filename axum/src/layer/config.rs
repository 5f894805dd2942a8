//! [`IdempotencyLayer`]: the layer, its settings and their builder;
//! [`KeyScope`]: whose keys a request's key is among.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::{HeaderName, StatusCode, header};
use taskfence::TaskStore;
use tower_layer::Layer;

use super::service::Idempotent;
use crate::problem::{Problem, ProblemTypes};

/// Finds the scope of a request's key from its parts.
type ScopeFn = dyn Fn(&Parts) -> Result<String, Problem> + Send + Sync;

/// The scope of the single-tenant key space: the one every key was in
/// before a scope had to be chosen, so a single-tenant service keeps the
/// keys it already holds.
const SINGLE_TENANT: &str = "default";

/// Whose keys a request's key is among. The draft asks for keys unique per
/// client: under [`per_caller`](Self::per_caller) a key one caller sent is a
/// different key for every other caller, so nobody is answered with
/// another's saved response. [`IdempotencyLayer`] cannot be built without
/// one.
///
/// ```
/// use http::StatusCode;
/// use taskfence_axum::{KeyScope, Problem};
///
/// /// What the authentication middleware puts in a request it verified.
/// #[derive(Clone)]
/// struct Caller(String);
///
/// let scope = KeyScope::per_caller(|parts| {
///     parts.extensions.get::<Caller>().map(|caller| caller.0.clone())
///         .ok_or_else(|| Problem::new(StatusCode::UNAUTHORIZED).with_detail("sign in first"))
/// });
/// ```
#[derive(Clone)]
pub struct KeyScope {
    find: Arc<ScopeFn>,
    shared: bool,
}

impl KeyScope {
    /// Keys per authenticated caller: `find` names the caller of a request
    /// (a user, tenant or API client id), from what your authentication put
    /// in the request's extensions or from a credential it verified — never
    /// from something a client may claim unchecked. An `Err` is sent as it
    /// is (a `401`, say), before the body is read or anything written; a
    /// layer placed outside the authentication finds no caller and refuses
    /// every request, which is the safe mistake.
    ///
    /// ```
    /// use http::StatusCode;
    /// use taskfence_axum::{KeyScope, Problem};
    /// # #[derive(Clone)] struct Caller(String);
    /// let scope = KeyScope::per_caller(|parts| {
    ///     parts.extensions.get::<Caller>().map(|c| c.0.clone())
    ///         .ok_or_else(|| Problem::new(StatusCode::UNAUTHORIZED))
    /// });
    /// ```
    pub fn per_caller(find: impl Fn(&Parts) -> Result<String, Problem> + Send + Sync + 'static) -> Self {
        Self {
            find: Arc::new(find),
            shared: false,
        }
    }

    /// One key space for every request (scope `default`): for a service
    /// with one client (another service of yours, a single-tenant
    /// deployment). Any client that sends a key another client sent, with
    /// the same request, gets that client's saved response; so use it only
    /// where all clients are one party.
    ///
    /// ```
    /// let scope = taskfence_axum::KeyScope::single_tenant();
    /// ```
    pub fn single_tenant() -> Self {
        Self {
            find: Arc::new(|_| Ok(SINGLE_TENANT.to_owned())),
            shared: true,
        }
    }

    /// The scope of a request's key, or the problem to answer with.
    pub(super) fn of(&self, parts: &Parts) -> Result<String, Problem> {
        (self.find)(parts)
    }
}

impl fmt::Debug for KeyScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.shared {
            "KeyScope::single_tenant"
        } else {
            "KeyScope::per_caller"
        })
    }
}

/// A tower [`Layer`] that makes the service it wraps idempotent under the
/// `Idempotency-Key` header, on any [`TaskStore`]: see the
/// [module documentation](super) for what it answers when, and what it keeps.
///
/// ```
/// use axum::{Router, http::StatusCode, routing::post};
/// use taskfence::MemoryStore;
/// use taskfence_axum::{IdempotencyLayer, KeyScope, Problem};
///
/// #[derive(Clone)]
/// struct Caller(String); // put in the request's extensions by your authentication
///
/// async fn charge(body: String) -> (StatusCode, String) {
///     (StatusCode::CREATED, format!("charged: {body}")) // runs once per caller and key
/// }
///
/// let scope = KeyScope::per_caller(|parts| {
///     parts.extensions.get::<Caller>().map(|c| c.0.clone())
///         .ok_or_else(|| Problem::new(StatusCode::UNAUTHORIZED))
/// });
/// let layer = IdempotencyLayer::new(MemoryStore::new(), scope).operation("payments.charge");
/// // Inside the authentication: `.route_layer(auth)` after this `.layer(layer)`.
/// let app: Router = Router::new().route("/charges", post(charge).layer(layer));
/// ```
///
/// Any store, as a trait object too:
///
/// ```
/// use std::sync::Arc;
/// use taskfence::{MemoryStore, TaskStore};
/// use taskfence_axum::{IdempotencyLayer, KeyScope};
/// let store: Arc<dyn TaskStore> = Arc::new(MemoryStore::new());
/// let layer: IdempotencyLayer<dyn TaskStore> = IdempotencyLayer::from_arc(store, KeyScope::single_tenant());
/// ```
pub struct IdempotencyLayer<S: ?Sized> {
    pub(super) store: Arc<S>,
    pub(super) settings: Settings,
}

/// What every request through one layer shares.
#[derive(Clone)]
pub(super) struct Settings {
    pub(super) operation: String,
    pub(super) scope: KeyScope,
    pub(super) required: bool,
    pub(super) lease_duration: Duration,
    pub(super) retention: Duration,
    pub(super) max_attempts: u32,
    pub(super) body_limit: usize,
    pub(super) response_limit: usize,
    pub(super) record_query: bool,
    pub(super) replay_headers: Vec<HeaderName>,
    pub(super) save_if: fn(StatusCode) -> bool,
    pub(super) types: ProblemTypes,
    pub(super) worker: String,
}

impl<S: TaskStore> IdempotencyLayer<S> {
    /// A layer on `store` with keys in `scope`, and the defaults: operation
    /// `http`, the key required, a 30 s lease, keys kept 24 h, 10 runs per
    /// key, request bodies up to 2 MiB, response bodies up to
    /// [`MAX_RESPONSE_LEN`](taskfence::limits::MAX_RESPONSE_LEN), no query
    /// string recorded.
    ///
    /// ```
    /// use taskfence_axum::{IdempotencyLayer, KeyScope};
    /// let layer = IdempotencyLayer::new(taskfence::MemoryStore::new(), KeyScope::single_tenant());
    /// ```
    pub fn new(store: S, scope: KeyScope) -> Self {
        Self::from_arc(Arc::new(store), scope)
    }
}

impl<S: TaskStore + ?Sized> IdempotencyLayer<S> {
    /// A layer on a shared store (`Arc<dyn TaskStore>` included).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use taskfence_axum::{IdempotencyLayer, KeyScope};
    /// let layer = IdempotencyLayer::from_arc(Arc::new(taskfence::MemoryStore::new()), KeyScope::single_tenant());
    /// ```
    pub fn from_arc(store: Arc<S>, scope: KeyScope) -> Self {
        Self {
            store,
            settings: Settings {
                operation: "http".to_owned(),
                scope,
                required: true,
                lease_duration: Duration::from_secs(30),
                retention: Duration::from_secs(24 * 3600),
                max_attempts: 10,
                body_limit: 2 * 1024 * 1024,
                response_limit: taskfence::limits::MAX_RESPONSE_LEN,
                record_query: false,
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
    /// # use taskfence_axum::{IdempotencyLayer, KeyScope};
    /// # let scope = KeyScope::single_tenant();
    /// let layer = IdempotencyLayer::new(taskfence::MemoryStore::new(), scope).operation("orders.create");
    /// ```
    #[must_use]
    pub fn operation(mut self, operation: impl Into<String>) -> Self {
        self.settings.operation = operation.into();
        self
    }

    /// Makes the key optional: a request without the header runs the handler
    /// unguarded (not deduplicated). A malformed key is still a `400`.
    ///
    /// ```
    /// # use taskfence_axum::{IdempotencyLayer, KeyScope};
    /// # let scope = KeyScope::single_tenant();
    /// let layer = IdempotencyLayer::new(taskfence::MemoryStore::new(), scope).optional();
    /// ```
    #[must_use]
    pub fn optional(mut self) -> Self {
        self.settings.required = false;
        self
    }

    /// The lease of a run (30 s by default), renewed every third of it while
    /// the handler runs and its response is read, until the response is
    /// saved. It bounds how long a key stays `409` after the process running
    /// it died.
    ///
    /// ```
    /// use std::time::Duration;
    /// # use taskfence_axum::{IdempotencyLayer, KeyScope};
    /// # let scope = KeyScope::single_tenant();
    /// let layer = IdempotencyLayer::new(taskfence::MemoryStore::new(), scope).lease_duration(Duration::from_secs(10));
    /// ```
    #[must_use]
    pub fn lease_duration(mut self, lease_duration: Duration) -> Self {
        self.settings.lease_duration = lease_duration;
        self
    }

    /// How long a key and what the layer keeps of it are remembered (24 h by
    /// default, from the key's first request; the draft asks servers to
    /// publish it). After the store's `purge_expired` removes it, the key is
    /// new work.
    ///
    /// ```
    /// use std::time::Duration;
    /// # use taskfence_axum::{IdempotencyLayer, KeyScope};
    /// # let scope = KeyScope::single_tenant();
    /// let layer = IdempotencyLayer::new(taskfence::MemoryStore::new(), scope).retention(Duration::from_secs(3600));
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
    /// # use taskfence_axum::{IdempotencyLayer, KeyScope};
    /// # let scope = KeyScope::single_tenant();
    /// let layer = IdempotencyLayer::new(taskfence::MemoryStore::new(), scope).max_attempts(3);
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
    /// # use taskfence_axum::{IdempotencyLayer, KeyScope};
    /// # let scope = KeyScope::single_tenant();
    /// let layer = IdempotencyLayer::new(taskfence::MemoryStore::new(), scope).body_limit(64 * 1024);
    /// ```
    #[must_use]
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.settings.body_limit = bytes;
        self
    }

    /// The largest response body read to be saved
    /// ([`MAX_RESPONSE_LEN`](taskfence::limits::MAX_RESPONSE_LEN) by default,
    /// the most a store keeps). The layer stops reading a longer body at the
    /// limit and answers `500` `response-too-large`; the key is closed,
    /// since the handler ran.
    ///
    /// ```
    /// # use taskfence_axum::{IdempotencyLayer, KeyScope};
    /// # let scope = KeyScope::single_tenant();
    /// let layer = IdempotencyLayer::new(taskfence::MemoryStore::new(), scope).response_limit(64 * 1024);
    /// ```
    #[must_use]
    pub fn response_limit(mut self, bytes: usize) -> Self {
        self.settings.response_limit = bytes;
        self
    }

    /// Records the query string in the key's task payload (`POST
    /// /orders?src=app` rather than `POST /orders`), for an operator's
    /// `taskfence show`. Off by default: a query string may carry a token,
    /// and the payload is kept for the whole retention. The query is part
    /// of the fingerprint (a hash) either way.
    ///
    /// ```
    /// # use taskfence_axum::{IdempotencyLayer, KeyScope};
    /// # let scope = KeyScope::single_tenant();
    /// let layer = IdempotencyLayer::new(taskfence::MemoryStore::new(), scope).record_query();
    /// ```
    #[must_use]
    pub fn record_query(mut self) -> Self {
        self.settings.record_query = true;
        self
    }

    /// The response headers kept with a saved response and sent on replays
    /// (an allow-list): by default `Content-Type`, `Content-Language`,
    /// `Content-Location`, `Location` and `ETag`. Never a `Set-Cookie` or
    /// anything else that is meant for one client session. Values that are
    /// not visible ASCII are not kept.
    ///
    /// ```
    /// use http::header;
    /// # use taskfence_axum::{IdempotencyLayer, KeyScope};
    /// # let scope = KeyScope::single_tenant();
    /// let layer = IdempotencyLayer::new(taskfence::MemoryStore::new(), scope)
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
    /// # use taskfence_axum::{IdempotencyLayer, KeyScope};
    /// # let scope = KeyScope::single_tenant();
    /// // Also keep the handler's 4xx refusals: a retry gets the same refusal.
    /// let layer = IdempotencyLayer::new(taskfence::MemoryStore::new(), scope)
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
    /// use taskfence_axum::{IdempotencyLayer, KeyScope, ProblemTypes};
    /// # let scope = KeyScope::single_tenant();
    /// let layer = IdempotencyLayer::new(taskfence::MemoryStore::new(), scope)
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
    /// # use taskfence_axum::{IdempotencyLayer, KeyScope};
    /// # let scope = KeyScope::single_tenant();
    /// let layer = IdempotencyLayer::new(taskfence::MemoryStore::new(), scope).worker("api-7");
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
            .field("scope", &self.settings.scope)
            .field("required", &self.settings.required)
            .field("lease_duration", &self.settings.lease_duration)
            .field("retention", &self.settings.retention)
            .field("max_attempts", &self.settings.max_attempts)
            .field("body_limit", &self.settings.body_limit)
            .field("response_limit", &self.settings.response_limit)
            .field("record_query", &self.settings.record_query)
            .finish_non_exhaustive()
    }
}

impl<S: TaskStore + ?Sized, I> Layer<I> for IdempotencyLayer<S> {
    type Service = Idempotent<S, I>;

    fn layer(&self, inner: I) -> Self::Service {
        Idempotent::new(inner, Arc::clone(&self.store), Arc::new(self.settings.clone()))
    }
}
