//! [`Dashboard`]: what the pages read from and may change, and the
//! [`Router`] that serves them.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use taskfence::inspect::Inspect;

use crate::auth::Auth;
use crate::redispatch::Redispatch;
use crate::{assets, pages, request};

/// The shortest action token accepted: long enough that guessing it over
/// HTTP is hopeless.
pub const MIN_TOKEN_LEN: usize = 16;

/// The fewest distinct characters an action token must have: `aaaa…` or
/// `abababab…` is refused however long it is.
pub const MIN_TOKEN_DISTINCT: usize = 8;

/// The least estimated entropy of an action token, in bits: its length
/// times the Shannon entropy of its characters' frequencies. Sixteen
/// distinct characters (`0123456789abcdef`) give 64 bits; 20 random
/// characters of a base64 or hex alphabet give more.
pub const MIN_TOKEN_BITS: f64 = 64.0;

/// How long a sign-in lasts unless [`Dashboard::session_lifetime`] says otherwise.
pub const DEFAULT_SESSION_LIFETIME: Duration = Duration::from_secs(8 * 60 * 60);

/// The dashboard of one store: its settings, then [`router`](Self::router).
///
/// Read-only unless given an [action token](Self::action_token): without
/// one, reopen, cancel and redispatch are refused (403) whoever asks.
/// Task data — payloads, saved responses, request keys, errors — is shown
/// only to a browser signed in with that token, unless the dashboard opts
/// into [open reads](Self::open_reads); anyone who can reach it sees the
/// counts, statuses, scopes, operations and timings. Serve it on a loopback
/// address, or behind TLS and the application's own authentication (a
/// `tower` layer, a reverse proxy), and say so with
/// [`served_over_tls`](Self::served_over_tls).
///
/// ```
/// use std::sync::Arc;
/// use taskfence::MemoryStore;
/// use taskfence_web::Dashboard;
///
/// # fn main() -> Result<(), taskfence_web::ConfigError> {
/// let dashboard = Dashboard::new(Arc::new(MemoryStore::new()))
///     .action_token("a long random secret from the environment")?
///     .stranded_after(std::time::Duration::from_secs(600));
/// // Under `/ops` of the application's own router; links follow the prefix.
/// let app: axum::Router = axum::Router::new().nest("/ops", dashboard.router());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Dashboard {
    store: Arc<dyn Inspect>,
    redispatch: Option<Arc<dyn Redispatch>>,
    token: Option<String>,
    open_reads: bool,
    session_lifetime: Duration,
    tls: bool,
    stranded_after: Duration,
    refresh: Duration,
    concurrent_reads: usize,
    count_cap: u64,
}

impl std::fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dashboard")
            .field("redispatch", &self.redispatch.is_some())
            .field("actions", &self.token.is_some())
            .field("open_reads", &self.open_reads)
            .field("session_lifetime", &self.session_lifetime)
            .field("served_over_tls", &self.tls)
            .field("stranded_after", &self.stranded_after)
            .field("refresh", &self.refresh)
            .field("concurrent_reads", &self.concurrent_reads)
            .field("count_cap", &self.count_cap)
            .finish_non_exhaustive()
    }
}

impl Dashboard {
    /// A read-only dashboard of `store`: stranded means unclaimed for 15
    /// minutes, the overview refreshes every 10 seconds, no redispatch.
    ///
    /// ```
    /// let dashboard = taskfence_web::Dashboard::new(std::sync::Arc::new(taskfence::MemoryStore::new()));
    /// ```
    pub fn new(store: Arc<dyn Inspect>) -> Self {
        Self {
            store,
            redispatch: None,
            token: None,
            open_reads: false,
            session_lifetime: DEFAULT_SESSION_LIFETIME,
            tls: false,
            stranded_after: Duration::from_secs(15 * 60),
            refresh: Duration::from_secs(10),
            concurrent_reads: crate::gate::DEFAULT_CONCURRENT_READS,
            count_cap: DEFAULT_COUNT_CAP,
        }
    }

    /// How many pages may read the store at once (default 8; at least one).
    /// A page beyond that is answered `503 Service Unavailable` with
    /// `Retry-After` at once, not queued: a burst of requests, signed in or
    /// not, cannot pile reads onto the store.
    ///
    /// ```
    /// # let store = std::sync::Arc::new(taskfence::MemoryStore::new());
    /// let dashboard = taskfence_web::Dashboard::new(store).max_concurrent_reads(4);
    /// ```
    pub fn max_concurrent_reads(mut self, n: usize) -> Self {
        self.concurrent_reads = n.max(1);
        self
    }

    /// The overview counts each status up to this many tasks and shows
    /// `10000+` beyond ([`Inspect::counts_up_to`];
    /// default [`DEFAULT_COUNT_CAP`], within 1 to [`taskfence::limits::MAX_COUNT_CAP`]).
    ///
    /// ```
    /// # let store = std::sync::Arc::new(taskfence::MemoryStore::new());
    /// let dashboard = taskfence_web::Dashboard::new(store).count_cap(100_000);
    /// ```
    pub fn count_cap(mut self, cap: u64) -> Self {
        self.count_cap = cap.clamp(1, taskfence::limits::MAX_COUNT_CAP);
        self
    }

    /// Enables the actions for whoever signs in with `token` (and passes the
    /// CSRF check every action form carries), and shows them the task
    /// data. Checked by [`check_action_token`]: at least [`MIN_TOKEN_LEN`]
    /// characters, [`MIN_TOKEN_DISTINCT`] distinct ones and
    /// [`MIN_TOKEN_BITS`] of estimated entropy. Read it from the
    /// environment or a secret store, never from source code.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// let store = Arc::new(taskfence::MemoryStore::new());
    /// assert!(taskfence_web::Dashboard::new(store.clone()).action_token("short").is_err());
    /// assert!(taskfence_web::Dashboard::new(store.clone()).action_token("a".repeat(16)).is_err());
    /// assert!(taskfence_web::Dashboard::new(store).action_token("0123456789abcdef").is_ok());
    /// ```
    pub fn action_token(mut self, token: impl Into<String>) -> Result<Self, ConfigError> {
        let token = token.into();
        check_action_token(&token)?;
        self.token = Some(token);
        Ok(self)
    }

    /// Shows task data — payloads, saved responses, request keys, errors —
    /// to everyone who can reach the dashboard, signed in or not. Off by
    /// default: turn it on only where the network or a proxy in front
    /// already limits who that is.
    ///
    /// ```
    /// # let store = std::sync::Arc::new(taskfence::MemoryStore::new());
    /// // Behind the application's own authentication layer.
    /// let dashboard = taskfence_web::Dashboard::new(store).open_reads();
    /// ```
    pub fn open_reads(mut self) -> Self {
        self.open_reads = true;
        self
    }

    /// How long a sign-in lasts (default [`DEFAULT_SESSION_LIFETIME`], 8
    /// hours; at least a second, at most a year). Signing out ends it sooner.
    ///
    /// ```
    /// # let store = std::sync::Arc::new(taskfence::MemoryStore::new());
    /// let dashboard = taskfence_web::Dashboard::new(store).session_lifetime(std::time::Duration::from_secs(3600));
    /// ```
    pub fn session_lifetime(mut self, lifetime: Duration) -> Self {
        self.session_lifetime = lifetime.clamp(Duration::from_secs(1), Duration::from_secs(365 * 86_400));
        self
    }

    /// Says that browsers reach the dashboard over HTTPS (directly or
    /// through a TLS-terminating proxy): the session cookie is then
    /// `Secure` and named `__Host-taskfence_session` (so `Path=/`). The
    /// router cannot tell by itself — behind a proxy every request it sees
    /// is plain HTTP — so it is told. Do not set it for plain HTTP: the
    /// browser would drop the cookie and no one could sign in.
    ///
    /// ```
    /// # let store = std::sync::Arc::new(taskfence::MemoryStore::new());
    /// let dashboard = taskfence_web::Dashboard::new(store).served_over_tls(true);
    /// ```
    pub fn served_over_tls(mut self, tls: bool) -> Self {
        self.tls = tls;
        self
    }

    /// How the redispatch action hands tasks off again (PostgreSQL: the
    /// [`PgStore`](taskfence::PgStore) itself). Without it the stranded page
    /// lists the ids to publish and offers no action.
    ///
    /// ```
    /// # #[cfg(feature = "postgres")]
    /// # async fn f(pool: sqlx::PgPool) -> taskfence::Result<()> {
    /// use std::sync::Arc;
    /// let store = Arc::new(taskfence::PgStore::new(pool));
    /// let dashboard = taskfence_web::Dashboard::new(store.clone()).redispatch(store);
    /// # Ok(()) }
    /// ```
    pub fn redispatch(mut self, redispatch: Arc<dyn Redispatch>) -> Self {
        self.redispatch = Some(redispatch);
        self
    }

    /// How long a pending task may wait unclaimed after its handoff before
    /// the overview counts it as stranded (default 15 minutes; at least a
    /// second, at most [`MAX_AGE`](crate::age::MAX_AGE)).
    ///
    /// ```
    /// # let store = std::sync::Arc::new(taskfence::MemoryStore::new());
    /// let dashboard = taskfence_web::Dashboard::new(store).stranded_after(std::time::Duration::from_secs(300));
    /// ```
    pub fn stranded_after(mut self, after: Duration) -> Self {
        self.stranded_after = after.clamp(Duration::from_secs(1), crate::age::MAX_AGE);
        self
    }

    /// How often the overview reloads itself (default 10 seconds; at least a second).
    ///
    /// ```
    /// # let store = std::sync::Arc::new(taskfence::MemoryStore::new());
    /// let dashboard = taskfence_web::Dashboard::new(store).refresh_every(std::time::Duration::from_secs(30));
    /// ```
    pub fn refresh_every(mut self, every: Duration) -> Self {
        self.refresh = every.max(Duration::from_secs(1));
        self
    }

    /// The pages, the actions, `/health` and the embedded assets, for any
    /// application state `S` (mount it with `Router::nest` or `merge`).
    ///
    /// | route | what |
    /// | --- | --- |
    /// | `GET /` | overview: counts by status and scope, oldest pending, stranded, recent failures |
    /// | `GET /tasks` | task list: status, scope, operation, age, order, keyset pages |
    /// | `GET /find?q=` | a task by id or by `scope/operation/key` |
    /// | `GET /tasks/{id}` | one task: its timeline, saved response, payload, budget |
    /// | `GET /stranded` | tasks whose queue message was likely lost |
    /// | `GET /limits` | the rate buckets (tokens available now) and, with `?key=`, a concurrency key's slots |
    /// | `GET`/`POST /tasks/{id}/reopen`, `/tasks/{id}/cancel`, `/redispatch` | the actions: confirm, then do |
    /// | `GET`/`POST /login`, `POST /logout` | signing in with the action token |
    /// | `GET /health` | `200 ok`, or `503` when the store does not answer |
    ///
    /// ```
    /// # let store = std::sync::Arc::new(taskfence::MemoryStore::new());
    /// #[derive(Clone)]
    /// struct AppState;
    /// let app: axum::Router<AppState> = axum::Router::new()
    ///     .nest("/ops", taskfence_web::Dashboard::new(store).router());
    /// ```
    pub fn router<S>(self) -> Router<S>
    where
        S: Clone + Send + Sync + 'static,
    {
        let shared = Arc::new(Shared {
            store: self.store,
            redispatch: self.redispatch,
            auth: self.token.as_deref().map(|t| Auth::new(t, self.session_lifetime)),
            open_reads: self.open_reads,
            tls: self.tls,
            stranded_after: self.stranded_after,
            refresh: self.refresh,
            reads: crate::gate::ReadGate::new(self.concurrent_reads),
            count_cap: self.count_cap,
        });
        Router::new()
            .route("/", get(pages::overview::show))
            .route("/tasks", get(pages::list::show))
            .route("/find", get(pages::list::find))
            .route("/tasks/{id}", get(pages::task::show))
            .route(
                "/tasks/{id}/reopen",
                get(pages::actions::confirm_reopen).post(pages::actions::reopen),
            )
            .route(
                "/tasks/{id}/cancel",
                get(pages::actions::confirm_cancel).post(pages::actions::cancel),
            )
            .route(
                "/redispatch",
                get(pages::actions::confirm_redispatch).post(pages::actions::redispatch),
            )
            .route("/stranded", get(pages::stranded::show))
            .route("/limits", get(pages::limits::show))
            .route("/login", get(pages::login::show).post(pages::login::sign_in))
            .route("/logout", post(pages::login::sign_out))
            .route("/health", get(pages::health))
            .route("/assets/{name}", get(assets::serve))
            .fallback(pages::not_found)
            .layer(axum::middleware::from_fn_with_state(
                shared.clone(),
                request::context,
            ))
            .with_state(shared)
    }
}

/// The overview's default count cap ([`Dashboard::count_cap`]): ten
/// thousand index entries per status, a few milliseconds on any table.
///
/// ```
/// assert_eq!(taskfence_web::dashboard::DEFAULT_COUNT_CAP, 10_000);
/// ```
pub const DEFAULT_COUNT_CAP: u64 = 10_000;

/// Whether [`Dashboard::action_token`] would take `token`: a tool can check
/// its configuration before it connects to a store.
///
/// The checks, in order: at least [`MIN_TOKEN_LEN`] characters, no control
/// characters, at least [`MIN_TOKEN_DISTINCT`] distinct characters, and at
/// least [`MIN_TOKEN_BITS`] of estimated entropy ([`token_bits`]). They
/// catch a placeholder or a pattern, not a well-chosen word: draw the
/// token at random (`openssl rand -base64 32`).
///
/// ```
/// use taskfence_web::ConfigError;
/// use taskfence_web::dashboard::check_action_token;
/// assert!(check_action_token("0123456789abcdef").is_ok());
/// assert!(check_action_token("0123456789abcdef\n").is_err());
/// assert!(matches!(check_action_token("aaaaaaaaaaaaaaaa"), Err(ConfigError::TokenTooPredictable { .. })));
/// ```
pub fn check_action_token(token: &str) -> Result<(), ConfigError> {
    if token.chars().count() < MIN_TOKEN_LEN {
        return Err(ConfigError::TokenTooShort { min: MIN_TOKEN_LEN });
    }
    if token.chars().any(char::is_control) {
        return Err(ConfigError::TokenNotPrintable);
    }
    let mut distinct: Vec<char> = token.chars().collect();
    distinct.sort_unstable();
    distinct.dedup();
    let bits = token_bits(token);
    if distinct.len() < MIN_TOKEN_DISTINCT || bits < MIN_TOKEN_BITS {
        return Err(ConfigError::TokenTooPredictable {
            distinct: distinct.len(),
            bits: bits.floor() as u32,
        });
    }
    Ok(())
}

/// A token's estimated entropy in bits: its length times the Shannon
/// entropy of its characters' frequencies. An upper bound for a pattern or
/// a word, a fair estimate for random characters.
///
/// ```
/// use taskfence_web::dashboard::token_bits;
/// assert_eq!(token_bits("aaaaaaaaaaaaaaaa"), 0.0);
/// assert_eq!(token_bits("0123456789abcdef"), 64.0);
/// ```
pub fn token_bits(token: &str) -> f64 {
    let mut counts = std::collections::HashMap::<char, usize>::new();
    for c in token.chars() {
        *counts.entry(c).or_default() += 1;
    }
    let len = token.chars().count() as f64;
    let per_char: f64 = counts
        .values()
        .map(|&n| {
            let p = n as f64 / len;
            -p * p.log2()
        })
        .sum();
    (per_char * len).max(0.0)
}

/// What every handler reads: the store, the optional redispatcher and
/// action token, the settings.
pub(crate) struct Shared {
    pub(crate) store: Arc<dyn Inspect>,
    pub(crate) redispatch: Option<Arc<dyn Redispatch>>,
    pub(crate) auth: Option<Auth>,
    /// Task data shown to everyone, signed in or not.
    pub(crate) open_reads: bool,
    /// Browsers reach the dashboard over HTTPS.
    pub(crate) tls: bool,
    pub(crate) stranded_after: Duration,
    pub(crate) refresh: Duration,
    /// The permits of the pages that read the store.
    pub(crate) reads: crate::gate::ReadGate,
    /// The overview's count cap.
    pub(crate) count_cap: u64,
}

impl Shared {
    /// The session cookie's name: `__Host-` prefixed over TLS.
    pub(crate) fn cookie_name(&self) -> &'static str {
        if self.tls {
            crate::auth::TLS_COOKIE
        } else {
            crate::auth::COOKIE
        }
    }
}

/// A setting the dashboard refuses.
///
/// ```
/// # let store = std::sync::Arc::new(taskfence::MemoryStore::new());
/// let err = taskfence_web::Dashboard::new(store).action_token("1234").unwrap_err();
/// assert!(matches!(err, taskfence_web::ConfigError::TokenTooShort { min: 16 }));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The action token is shorter than `min` characters: too easy to guess.
    #[error("the action token must be at least {min} characters long")]
    TokenTooShort {
        /// The minimum length ([`MIN_TOKEN_LEN`]).
        min: usize,
    },
    /// The action token contains control characters (a newline from a file, say).
    #[error("the action token must not contain control characters (a trailing newline?)")]
    TokenNotPrintable,
    /// The action token is a pattern, not a secret: fewer than
    /// [`MIN_TOKEN_DISTINCT`] distinct characters or less than
    /// [`MIN_TOKEN_BITS`] of estimated entropy.
    #[error(
        "the action token is too predictable ({distinct} distinct characters, about {bits} bits; \
         at least {MIN_TOKEN_DISTINCT} and {MIN_TOKEN_BITS} bits needed): draw it at random, e.g. openssl rand -base64 32"
    )]
    TokenTooPredictable {
        /// How many distinct characters it has.
        distinct: usize,
        /// Its estimated entropy in whole bits ([`token_bits`]).
        bits: u32,
    },
}
