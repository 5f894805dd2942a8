//! What a [`Service`](crate::Service) runs and with which limits.
//!
//! [`Settings`] is the process's configuration: flags, each also read from an
//! environment variable (the usual way to configure a container). Most of
//! them are [`Config`]'s (what the service needs besides the pool, and what
//! tests build in-process with [`Config::new`]); the rest make the pool
//! (`main.rs`) and the traces. Each default is written once, on its flag.

use std::net::SocketAddr;
use std::time::Duration;

use taskfence::RetryPolicy;
use taskfence::config::{defaults, parse_duration};

/// Which halves of the service this process runs (`--mode`): `both` (the
/// default), `api` or `worker`. The API and the worker share nothing but
/// PostgreSQL.
pub use taskfence::config::Mode;

/// Input limits (`--max-body-bytes`, `--max-content-bytes`,
/// `--max-conversation-id-bytes`, `--max-wait`). Each broken limit is a 4xx
/// with a problem+json body, checked before anything is written.
///
/// ```
/// let limits: chat_api::Limits = taskfence::config::defaults();
/// assert_eq!(limits.max_body_bytes, 64 * 1024);
/// ```
#[derive(Debug, Clone, clap::Args)]
pub struct Limits {
    /// Largest request body, in bytes (413 beyond it).
    #[arg(long, default_value_t = 64 * 1024)]
    pub max_body_bytes: usize,
    /// Longest message content, in bytes (422 beyond it).
    #[arg(long, default_value_t = 16 * 1024)]
    pub max_content_bytes: usize,
    /// Longest conversation id, in bytes (400 beyond it).
    #[arg(long, default_value_t = 128)]
    pub max_conversation_id_bytes: usize,
    /// Longest `?wait=` of a long-poll (400 beyond it).
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    pub max_wait: Duration,
}

/// The in-process reply worker's flags (a `taskfence::runtime::Consumer`):
/// `--worker-concurrency`, `--lease`, `--poll-every`, `--stop-grace`.
pub type WorkerSettings = taskfence::config::WorkerArgs;

/// The retention sweep's flags ([`taskfence::runtime::purge_every`]):
/// `--purge-interval`, `--purge-batch`.
pub type PurgeSettings = taskfence::config::PurgeArgs;

/// Everything [`Service::start`](crate::Service::start) needs besides the
/// pool and the provider.
#[derive(Debug, Clone, clap::Args)]
pub struct Config {
    /// Which halves run in this process: `both`, `api` or `worker`.
    #[arg(long, env = "CHAT_API_MODE", value_enum, default_value = "both")]
    pub mode: Mode,
    /// Where the HTTP API listens (port 0: any free port, see
    /// [`Service::local_addr`](crate::Service::local_addr)).
    #[arg(long, env = "TASKFENCE_LISTEN", default_value = "127.0.0.1:3000")]
    pub listen: SocketAddr,
    /// The schema of taskfence's tables (its own migration history is kept there).
    #[arg(long, env = "TASKFENCE_SCHEMA", default_value = taskfence::postgres::DEFAULT_SCHEMA)]
    pub taskfence_schema: String,
    /// Bearer tokens as `token=user,token=user` (required unless `--mode
    /// worker`). A stand-in for real authentication: the user id is the scope
    /// of every idempotency key and task.
    #[arg(long, env = "CHAT_API_TOKENS", hide_env_values = true, value_parser = crate::sim::auth::parse_tokens, default_value = "")]
    pub tokens: crate::sim::auth::Tokens,
    /// Attempts per reply task before it fails for good: the reply task's
    /// retry budget, stored with each task (taskfence's `RetryPolicy::default`
    /// with this many attempts).
    #[arg(long = "max-attempts", value_parser = max_attempts, default_value = "5")]
    pub policy: RetryPolicy,
    /// How long an Idempotency-Key is remembered (the IETF draft asks servers
    /// to publish it). After it, the key is new work.
    #[arg(long, env = "CHAT_API_KEY_RETENTION", value_parser = parse_duration, default_value = "24h")]
    pub key_retention: Duration,
    /// The model provider's rate limit, in requests per minute, shared by
    /// every worker of every process (a taskfence rate bucket,
    /// [`PROVIDER_BUCKET`](crate::PROVIDER_BUCKET)), at an even pace: one
    /// request every minute ÷ this, never a burst above the provider's limit.
    #[arg(long, default_value_t = 500)]
    pub provider_rpm: u32,
    /// Input limits.
    #[command(flatten)]
    pub limits: Limits,
    /// The in-process worker.
    #[command(flatten)]
    pub worker: WorkerSettings,
    /// The retention sweep, run beside the worker.
    #[command(flatten)]
    pub purge: PurgeSettings,
    /// Where the worker POSTs a "reply ready" notification for each saved
    /// reply (`http://hooks.internal:8080/reply-ready`, see [`crate::notify`]),
    /// with an `Idempotency-Key` header. Unset: no notifications. Read by the
    /// worker's process only: its completions submit the notification tasks
    /// and its second consumer delivers them.
    #[arg(long, value_parser = http_url)]
    pub webhook_url: Option<reqwest::Url>,
    /// The longest a webhook delivery may take, connecting included; past it
    /// the outcome is unknown and the delivery is retried with the same key.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub webhook_timeout: Duration,
    /// Notifications delivered at once (a consumer of their own, so a slow
    /// receiver never holds up reply generation).
    #[arg(long, default_value_t = 4)]
    pub webhook_concurrency: usize,
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
/// assert_eq!(settings.service.tokens["alice-token"], "alice");
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

    /// The schema of the app's tables and its `_sqlx_migrations` (created if
    /// missing). Unset: the connection's default `search_path` (`public`).
    #[arg(long, env = "CHAT_API_SCHEMA")]
    pub app_schema: Option<String>,

    /// Largest number of PostgreSQL connections in the pool.
    #[arg(long, env = "CHAT_API_MAX_CONNECTIONS", default_value_t = 32)]
    pub max_connections: u32,

    /// An OTLP/HTTP collector (`http://127.0.0.1:4318`): the traces go there,
    /// one per request, from the handler through the reply task's worker.
    /// Unset: no traces are exported (logs only).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    /// What the service runs with.
    #[command(flatten)]
    pub service: Config,
}

impl Settings {
    /// Checks what clap cannot: the API needs at least one token, the purge
    /// a batch, the webhook a timeout.
    pub fn validate(&self) -> Result<(), String> {
        let service = &self.service;
        if service.mode.runs_api() && service.tokens.is_empty() {
            return Err("CHAT_API_TOKENS is empty: set it to token=user,token=user".into());
        }
        taskfence::limits::check_scan_limit(service.purge.batch)
            .map_err(|e| format!("--purge-batch (CHAT_API_PURGE_BATCH): {e}"))?;
        if service.webhook_timeout.is_zero() {
            return Err("--webhook-timeout (CHAT_API_WEBHOOK_TIMEOUT) must be more than 0".into());
        }
        Ok(())
    }
}

/// `--max-attempts`: taskfence's default policy with `n` attempts.
fn max_attempts(n: &str) -> Result<RetryPolicy, std::num::ParseIntError> {
    Ok(RetryPolicy::default().max_attempts(n.parse()?))
}

/// `--webhook-url`: an `http://` URL. reqwest is built without a TLS stack
/// here: add its `rustls-tls` feature (Cargo.toml) to deliver to an https
/// receiver, and drop this check.
fn http_url(text: &str) -> Result<reqwest::Url, String> {
    let url: reqwest::Url = text.parse().map_err(|e| format!("{e}"))?;
    match url.scheme() {
        "http" => Ok(url),
        _ => Err(format!(
            "{url} is not an http:// URL (this build has no TLS client)"
        )),
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
        let (from_flags, defaults) = (
            settings.service.clone(),
            Config::new(settings.service.tokens.clone()),
        );
        assert_eq!(from_flags.mode, Mode::Both);
        assert_eq!(from_flags.taskfence_schema, defaults.taskfence_schema);
        assert_eq!(from_flags.key_retention, defaults.key_retention);
        assert_eq!(from_flags.policy, defaults.policy);
        assert_eq!(
            from_flags.policy,
            RetryPolicy::default(),
            "taskfence's budget unless asked"
        );
        assert_eq!(from_flags.limits.max_wait, defaults.limits.max_wait);
        assert_eq!(from_flags.worker.lease, defaults.worker.lease);
        assert_eq!(from_flags.worker.poll_every, defaults.worker.poll_every);
        assert_eq!(from_flags.worker.concurrency, defaults.worker.concurrency);
        assert_eq!(from_flags.worker.grace, defaults.worker.grace);
        assert_eq!(from_flags.purge.every, defaults.purge.every);
        assert_eq!(from_flags.purge.batch, defaults.purge.batch);
        assert_eq!(from_flags.listen.to_string(), "127.0.0.1:3000");
        assert_eq!(settings.app_schema, None);
        assert!(from_flags.webhook_url.is_none(), "no notifications unless asked");
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
        let config = settings.service;
        let url = config.webhook_url.expect("configured");
        assert_eq!(url.as_str(), "http://127.0.0.1:3001/reply-ready");
        assert_eq!(config.webhook_timeout, Duration::from_secs(2));
        assert!(parse(&["--webhook-url", "not a url"]).is_err());
        let https = parse(&["--tokens", "t=u", "--webhook-url", "https://example.com/hook"]).unwrap_err();
        assert!(https.to_string().contains("--webhook-url"), "{https}");
        let no_time = parse(&["--tokens", "t=u", "--webhook-timeout", "0s"]).unwrap();
        assert!(no_time.validate().unwrap_err().contains("--webhook-timeout"));
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
        let config = settings.service;
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
