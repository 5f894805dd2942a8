//! What a [`Service`](crate::Service) runs and with which limits.
//!
//! [`Settings`] is the process's configuration: flags, each also read from an
//! environment variable (the usual way to configure a container). Most of
//! them are [`Config`]'s (what the service needs besides the pool, and what
//! tests build in-process with [`Config::new`]); the rest make the pool
//! ([`Settings::connect`]). Each default is written once, on its flag.

use std::net::SocketAddr;
use std::time::Duration;

use sqlx::PgPool;
use taskfence::RetryPolicy;
use taskfence::config::{defaults, parse_duration};

/// Which halves of the service this process runs (`--mode`): `both` (the
/// default), `api` or `worker`. The API and the worker share nothing but
/// PostgreSQL.
pub use taskfence::config::Mode;

/// Input limits. Each broken limit is a 4xx with a problem+json body, checked
/// before anything is written.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request body, in bytes (413 beyond it).
    pub max_body_bytes: usize,
    /// Longest message content, in bytes (422 beyond it).
    pub max_content_bytes: usize,
    /// Longest conversation id, in bytes (400 beyond it).
    pub max_conversation_id_bytes: usize,
    /// Longest `?wait=` of a long-poll (400 beyond it).
    pub max_wait: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: 64 * 1024,
            max_content_bytes: 16 * 1024,
            max_conversation_id_bytes: 128,
            max_wait: Duration::from_secs(60),
        }
    }
}

/// The in-process reply worker's flags (a `taskfence::runtime::Consumer`):
/// `--worker-concurrency`, `--lease`, `--poll-every`, `--stop-grace`.
pub type WorkerSettings = taskfence::config::WorkerArgs;

/// The retention sweep's flags ([`taskfence::runtime::purge_every`]):
/// `--purge-interval`, `--purge-batch`.
pub type PurgeSettings = taskfence::config::PurgeArgs;

/// The "reply ready" webhook ([`crate::notify`]): where the worker announces
/// each saved reply, once.
///
/// ```
/// let webhook = chat_api::WebhookSettings::new("http://127.0.0.1:3001/reply-ready".parse().unwrap());
/// assert_eq!(webhook.timeout, std::time::Duration::from_secs(10));
/// ```
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    /// The receiver's URL; each notification is a `POST` of JSON to it.
    pub url: reqwest::Url,
    /// The longest a delivery may take, connecting included. A call that
    /// times out has an unknown outcome: it is retried with the same
    /// `Idempotency-Key`.
    pub timeout: Duration,
    /// Notifications delivered at once (a consumer of their own, so a slow
    /// receiver never holds up reply generation).
    pub concurrency: usize,
}

impl WebhookSettings {
    /// `url` with the defaults: a 10 s timeout, 4 deliveries at once.
    pub fn new(url: reqwest::Url) -> Self {
        Self {
            url,
            timeout: Duration::from_secs(10),
            concurrency: 4,
        }
    }
}

/// Everything [`Service::start`](crate::Service::start) needs besides the
/// pool and the provider.
#[derive(Debug, Clone, clap::Args)]
pub struct Config {
    /// Which halves run in this process: `both`, `api` or `worker`.
    #[arg(long, env = "CHAT_API_MODE", value_enum, default_value = "both")]
    pub mode: Mode,
    /// The schema of taskfence's tables (its own migration history is kept there).
    #[arg(long, env = "TASKFENCE_SCHEMA", default_value = taskfence::postgres::DEFAULT_SCHEMA)]
    pub taskfence_schema: String,
    /// Bearer tokens as `token=user,token=user` (required unless `--mode
    /// worker`). A stand-in for real authentication: the user id is the scope
    /// of every idempotency key and task.
    #[arg(long, env = "CHAT_API_TOKENS", hide_env_values = true, value_parser = crate::sim::auth::parse_tokens, default_value = "")]
    pub tokens: crate::sim::auth::Tokens,
    /// The reply task's retry budget, stored with each task (`--max-attempts`).
    #[arg(skip)]
    pub policy: RetryPolicy,
    /// How long an Idempotency-Key is remembered (the IETF draft asks servers
    /// to publish it). After it, the key is new work.
    #[arg(long, env = "CHAT_API_KEY_RETENTION", value_parser = parse_duration, default_value = "24h")]
    pub key_retention: Duration,
    /// Input limits.
    #[arg(skip)]
    pub limits: Limits,
    /// The in-process worker.
    #[command(flatten)]
    pub worker: WorkerSettings,
    /// The retention sweep, run beside the worker.
    #[command(flatten)]
    pub purge: PurgeSettings,
    /// The "reply ready" webhook; `None` (the default): no notifications.
    /// Read by the worker's process only: its completions submit the
    /// notification tasks and its second consumer delivers them.
    #[arg(skip)]
    pub webhook: Option<WebhookSettings>,
}

impl Config {
    /// Defaults for everything but the tokens.
    pub fn new(tokens: crate::sim::auth::Tokens) -> Self {
        Self { tokens, ..defaults() }
    }

    /// The NOTIFY channel on which saved replies are announced. Derived from
    /// the taskfence schema, so two deployments (or two tests) sharing one
    /// database never hear each other.
    pub fn reply_channel(&self) -> String {
        format!("{}_reply_saved", self.taskfence_schema)
    }
}

/// The process's configuration: every option is a flag and an environment
/// variable (the flag wins), `CHAT_API_{FLAG}` unless it names another. `chat-api --help` lists them.
///
/// ```
/// use clap::Parser;
/// let settings = chat_api::Settings::try_parse_from([
///     "chat-api",
///     "--database-url", "postgres://app@db.example.com/chat?sslmode=verify-full&sslrootcert=/etc/rds-ca.pem",
///     "--tokens", "alice-token=alice",
///     "--mode", "api",
/// ])
/// .unwrap();
/// assert_eq!(settings.config().tokens["alice-token"], "alice");
/// ```
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "chat-api",
    version,
    about = "A chat API whose replies go through taskfence.",
    // A flag without an `env` of its own is read from `CHAT_API_{FLAG}` too.
    mut_args(taskfence::config::env_from_flags("CHAT_API_"))
)]
pub struct Settings {
    /// PostgreSQL URL. TLS: add `?sslmode=verify-full&sslrootcert=/path/ca.pem`
    /// (as RDS needs) or `?sslmode=require`.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,

    /// Where the HTTP API listens.
    #[arg(long, env = "TASKFENCE_LISTEN", default_value = "127.0.0.1:3000")]
    pub listen: SocketAddr,

    /// The schema of the app's tables and its `_sqlx_migrations` (created if
    /// missing). Unset: the connection's default `search_path` (`public`).
    #[arg(long, env = "CHAT_API_SCHEMA")]
    pub app_schema: Option<String>,

    /// Largest number of PostgreSQL connections in the pool.
    #[arg(long, env = "CHAT_API_MAX_CONNECTIONS", default_value_t = 32)]
    pub max_connections: u32,

    /// Attempts per reply task before it fails for good (unset: taskfence's default).
    #[arg(long, env = "CHAT_API_MAX_ATTEMPTS")]
    pub max_attempts: Option<u32>,

    /// An OTLP/HTTP collector (`http://127.0.0.1:4318`): the traces go there,
    /// one per request, from the handler through the reply task's worker.
    /// Unset: no traces are exported (logs only).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    /// Where the worker POSTs a "reply ready" notification for each saved
    /// reply (`http://hooks.internal:8080/reply-ready`), with an
    /// `Idempotency-Key` header. Unset: no notifications.
    #[arg(long, env = "CHAT_API_WEBHOOK_URL")]
    pub webhook_url: Option<reqwest::Url>,

    /// The longest a webhook delivery may take; past it the outcome is
    /// unknown and the delivery is retried with the same key.
    #[arg(long, env = "CHAT_API_WEBHOOK_TIMEOUT", value_parser = parse_duration, default_value = "10s")]
    pub webhook_timeout: Duration,

    /// What the service runs with.
    #[command(flatten)]
    pub service: Config,
}

impl Settings {
    /// The service's [`Config`]: the flags' and the webhook's.
    pub fn config(&self) -> Config {
        let mut config = self.service.clone();
        if let Some(n) = self.max_attempts {
            config.policy = config.policy.max_attempts(n);
        }
        config.webhook = self.webhook_url.clone().map(|url| WebhookSettings {
            timeout: self.webhook_timeout,
            ..WebhookSettings::new(url)
        });
        config
    }

    /// Checks what clap cannot: the API needs at least one token.
    pub fn validate(&self) -> Result<(), String> {
        if self.service.mode.runs_api() && self.service.tokens.is_empty() {
            return Err("CHAT_API_TOKENS is empty: set it to token=user,token=user".into());
        }
        taskfence::limits::check_scan_limit(self.service.purge.batch)
            .map_err(|e| format!("--purge-batch (CHAT_API_PURGE_BATCH): {e}"))?;
        if let Some(url) = &self.webhook_url {
            // reqwest is built without a TLS stack here: add its `rustls-tls`
            // feature (Cargo.toml) to deliver to an https receiver.
            if url.scheme() != "http" {
                return Err(format!(
                    "--webhook-url (CHAT_API_WEBHOOK_URL): {url} is not an http:// URL (this build has no TLS client)"
                ));
            }
            if self.webhook_timeout.is_zero() {
                return Err("--webhook-timeout (CHAT_API_WEBHOOK_TIMEOUT) must be more than 0".into());
            }
        }
        Ok(())
    }

    /// The pool, with the app schema (if any) created and first in every
    /// connection's `search_path`. See [`crate::db::connect`].
    pub async fn connect(&self) -> Result<PgPool, taskfence::config::ConnectError> {
        let schema = self.app_schema.as_deref();
        crate::db::connect(&self.database_url, schema, self.max_connections).await
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn parse(args: &[&str]) -> Result<Settings, clap::Error> {
        let base = ["chat-api", "--database-url", "postgres://localhost/test"];
        Settings::try_parse_from(base.iter().chain(args))
    }

    #[test]
    fn defaults_match_config_new() {
        let settings = parse(&["--tokens", "t=u"]).unwrap();
        let (from_flags, defaults) = (settings.config(), Config::new(settings.service.tokens.clone()));
        assert_eq!(from_flags.mode, Mode::Both);
        assert_eq!(from_flags.taskfence_schema, defaults.taskfence_schema);
        assert_eq!(from_flags.key_retention, defaults.key_retention);
        assert_eq!(from_flags.policy, defaults.policy);
        assert_eq!(from_flags.worker.lease, defaults.worker.lease);
        assert_eq!(from_flags.worker.poll_every, defaults.worker.poll_every);
        assert_eq!(from_flags.worker.concurrency, defaults.worker.concurrency);
        assert_eq!(from_flags.worker.grace, defaults.worker.grace);
        assert_eq!(from_flags.purge.every, defaults.purge.every);
        assert_eq!(from_flags.purge.batch, defaults.purge.batch);
        assert_eq!(settings.listen.to_string(), "127.0.0.1:3000");
        assert_eq!(settings.app_schema, None);
        assert!(from_flags.webhook.is_none(), "no notifications unless asked");
    }

    #[test]
    fn webhook_flags() {
        let settings = parse(&[
            "--tokens",
            "t=u",
            "--webhook-url",
            "http://127.0.0.1:3001/reply-ready",
            "--webhook-timeout",
            "2s",
        ])
        .unwrap();
        settings.validate().unwrap();
        let webhook = settings.config().webhook.expect("configured");
        assert_eq!(webhook.url.as_str(), "http://127.0.0.1:3001/reply-ready");
        assert_eq!(webhook.timeout, Duration::from_secs(2));
        assert!(parse(&["--webhook-url", "not a url"]).is_err());
        let https = parse(&["--tokens", "t=u", "--webhook-url", "https://example.com/hook"]).unwrap();
        assert!(https.validate().unwrap_err().contains("--webhook-url"));
    }

    #[test]
    fn flags_reach_the_config() {
        let settings = parse(&[
            "--mode",
            "worker",
            "--lease",
            "5m",
            "--poll-every",
            "50ms",
            "--stop-grace",
            "3s",
            "--max-attempts",
            "3",
            "--taskfence-schema",
            "tf",
            "--app-schema",
            "chat",
            "--purge-interval",
            "0",
            "--purge-batch",
            "50",
        ])
        .unwrap();
        settings.validate().expect("a worker needs no tokens");
        let config = settings.config();
        assert_eq!(config.mode, Mode::WorkerOnly);
        assert_eq!(config.worker.lease, Duration::from_secs(300));
        assert_eq!(config.worker.poll_every, Duration::from_millis(50));
        assert_eq!(config.worker.grace, Duration::from_secs(3));
        assert_eq!(config.policy.max_attempts, 3);
        assert_eq!(config.reply_channel(), "tf_reply_saved");
        assert_eq!(settings.app_schema.as_deref(), Some("chat"));
        assert_eq!(config.purge.every, Duration::ZERO);
        assert_eq!(config.purge.batch, 50);
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(parse(&["--tokens", "just-a-token"]).is_err());
        assert!(parse(&["--lease", "soon"]).is_err());
        assert!(parse(&["--mode", "sideways"]).is_err());
        assert!(parse(&["--listen", "not an address"]).is_err());
        let no_tokens = parse(&["--mode", "api"]).unwrap();
        assert!(no_tokens.validate().is_err(), "the API needs a token");
        let no_batch = parse(&["--tokens", "t=u", "--purge-batch", "0"]).unwrap();
        assert!(no_batch.validate().unwrap_err().contains("--purge-batch"));
        assert!(parse(&["--purge-batch", "-1"]).is_err());
    }
}
