//! The service's settings: every option is a command-line flag and an
//! environment variable (the flag wins), with defaults for production.
//! `sqs-worker --help` lists them.
//!
//! AWS itself is configured the standard way, not here: credentials from the
//! default chain, `AWS_REGION`, and `AWS_ENDPOINT_URL_SQS` (and
//! `AWS_ENDPOINT_URL_DYNAMODB`) for a local endpoint (see
//! [`crate::aws::aws_config()`]).

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use taskfence_sqs::WorkerConfig;
pub use taskfence_sqs::config::parse_duration;

/// Where the tasks (and the outbox of handoffs) are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StoreKind {
    /// PostgreSQL (`PgStore`, `--database-url`), with its built-in outbox.
    Postgres,
    /// DynamoDB (`DynamoStore`, `--dynamodb-table`), with the template's
    /// outbox in the same table: an all-AWS stack.
    Dynamodb,
}

/// Which model provider the service calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProviderKind {
    /// `HttpProvider`: the production choice, once a client is plugged into it.
    Http,
    /// The simulated LLM (`sim`), with the `--sim-*` latency and failure
    /// rate: for local runs and tests only.
    Simulated,
}

/// Consumes an SQS queue of taskfence task ids until SIGTERM or SIGINT.
///
/// Then stops receiving, lets the messages in hand finish for
/// --shutdown-grace, releases the tasks still running (their messages become
/// visible again) and exits 0, within --shutdown-grace + --release-deadline;
/// a second signal releases at once.
///
/// AWS: credentials from the default chain (environment, profile, SSO, web
/// identity, ECS task role, instance role), the region from AWS_REGION or the
/// profile, and AWS_ENDPOINT_URL_SQS (AWS_ENDPOINT_URL_DYNAMODB with --store
/// dynamodb) for a local endpoint such as moto.
#[derive(Debug, Clone, Parser)]
#[command(name = "sqs-worker", version)]
pub struct Settings {
    /// Where tasks are stored: PostgreSQL (needs --database-url) or DynamoDB
    /// (needs --dynamodb-table).
    #[arg(long, env = "TASKFENCE_STORE", value_enum, default_value_t = StoreKind::Postgres)]
    pub store: StoreKind,

    /// PostgreSQL URL (with --store postgres). For TLS add
    /// `?sslmode=require`, or `?sslmode=verify-full&sslrootcert=/path/ca.pem` (RDS).
    #[arg(
        long,
        env = "DATABASE_URL",
        hide_env_values = true,
        required_if_eq("store", "postgres")
    )]
    pub database_url: Option<String>,

    /// The DynamoDB table of tasks and handoffs (with --store dynamodb). The
    /// service does not create it (see docs/DYNAMODB.md).
    #[arg(long, env = "TASKFENCE_DYNAMODB_TABLE", required_if_eq("store", "dynamodb"))]
    pub dynamodb_table: Option<String>,

    /// The schema holding taskfence's tables.
    #[arg(long, env = "TASKFENCE_SCHEMA", default_value = "taskfence")]
    pub schema: String,

    /// Size of the PostgreSQL pool: cover --concurrency, the lease renewals
    /// and the dispatcher.
    #[arg(long, env = "TASKFENCE_DB_MAX_CONNECTIONS", default_value_t = 20)]
    pub db_max_connections: u32,

    /// Do not apply the embedded migrations at start-up (when a deploy step
    /// applies them instead).
    #[arg(long, env = "TASKFENCE_SKIP_MIGRATIONS")]
    pub skip_migrations: bool,

    /// The queue to consume (and, with --dispatch, to publish to).
    #[arg(long, env = "TASKFENCE_SQS_QUEUE_URL")]
    pub queue_url: String,

    /// This worker's id, recorded with every attempt it makes. Default:
    /// `$HOSTNAME-<pid>`, unique per process.
    #[arg(long, env = "TASKFENCE_WORKER_ID")]
    pub worker_id: Option<String>,

    /// How the worker receives, hides and stops: `--concurrency` (8),
    /// `--poll-wait` (5s), `--visibility-slack` (5s), `--shutdown-grace`
    /// (20s), `--release-deadline` (5s), each with its `TASKFENCE_…`
    /// variable (see `taskfence_sqs::WorkerConfig`).
    #[command(flatten)]
    pub worker: WorkerConfig,

    /// Lease length, renewed every third of it. A crashed worker's task is
    /// taken over about this long (plus the slack) after the crash.
    #[arg(long, env = "TASKFENCE_LEASE", default_value = "30s", value_parser = parse_duration)]
    pub lease: Duration,

    /// Also publish the transactional outbox to the queue from this process
    /// (`--dispatch true`; several processes may: on PostgreSQL they share
    /// the outbox, on DynamoDB they may send a handoff twice, which is
    /// harmless). Off by default: it needs `sqs:SendMessage` too.
    #[arg(long, env = "TASKFENCE_DISPATCH", default_value_t = false, action = clap::ArgAction::Set)]
    pub dispatch: bool,

    /// Handoffs per dispatcher round.
    #[arg(long, env = "TASKFENCE_DISPATCH_BATCH", default_value_t = 100)]
    pub dispatch_batch: usize,

    /// How long the dispatcher waits after a round that found nothing: the
    /// delay from a commit to its message when the outbox is idle.
    #[arg(long, env = "TASKFENCE_DISPATCH_IDLE", default_value = "500ms", value_parser = parse_duration)]
    pub dispatch_idle: Duration,

    /// With --dispatch: how often to publish again the tasks that are due
    /// (a backoff that passed, an expired lease, an operator's reopening)
    /// for which the queue may hold no message any more.
    #[arg(long, env = "TASKFENCE_REPUBLISH_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub republish_interval: Duration,

    /// The former name of --republish-interval (and of its variable), still
    /// read so an older deployment keeps its setting: see
    /// [`republish_every`](Self::republish_every).
    #[arg(long = "redispatch-interval", env = "TASKFENCE_REDISPATCH_INTERVAL", hide = true,
          value_parser = parse_duration, conflicts_with = "republish_interval")]
    redispatch_interval: Option<Duration>,

    /// Serve Prometheus metrics (`taskfence_operations_total`, latencies,
    /// terminal failures…) at `http://<addr>/metrics`. Off by default; use
    /// `0.0.0.0:9464` in a container for the scraper to reach it.
    #[arg(long, env = "TASKFENCE_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,

    /// The model provider.
    #[arg(long, env = "TASKFENCE_PROVIDER", value_enum, default_value_t = ProviderKind::Http)]
    pub provider: ProviderKind,

    /// The HTTP provider's endpoint (with --provider http).
    #[arg(long, env = "TASKFENCE_PROVIDER_URL")]
    pub provider_url: Option<String>,

    /// The simulated provider's `--sim-*` options (local runs and tests only).
    #[command(flatten)]
    pub sim: crate::sim::SimArgs,

    /// Log filter, in `tracing_subscriber::EnvFilter` syntax
    /// (`info`, `sqs_worker=debug,taskfence=info`).
    #[arg(long = "log", env = "RUST_LOG", default_value = "info")]
    pub log: String,
}

impl Settings {
    /// The worker id: `--worker-id`, or `$HOSTNAME-<pid>`.
    pub fn worker_id(&self) -> String {
        self.worker_id.clone().unwrap_or_else(|| {
            let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "sqs-worker".into());
            format!("{host}-{}", std::process::id())
        })
    }

    /// How often to republish due tasks: --republish-interval, or its
    /// former name --redispatch-interval when that is given.
    pub fn republish_every(&self) -> Duration {
        self.redispatch_interval.unwrap_or(self.republish_interval)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("3d").is_err());
    }

    #[test]
    fn the_former_republish_flag_still_sets_the_interval() {
        use clap::Parser;
        let base = [
            "sqs-worker",
            "--database-url",
            "postgres://db",
            "--queue-url",
            "http://q",
        ];
        let parse =
            |extra: &[&str]| Settings::try_parse_from(base.iter().chain(extra)).map(|s| s.republish_every());
        assert_eq!(parse(&[]).unwrap(), Duration::from_secs(30));
        assert_eq!(
            parse(&["--republish-interval", "5s"]).unwrap(),
            Duration::from_secs(5)
        );
        assert_eq!(
            parse(&["--redispatch-interval", "7s"]).unwrap(),
            Duration::from_secs(7)
        );
        assert!(parse(&["--republish-interval", "5s", "--redispatch-interval", "7s"]).is_err());
    }

    #[test]
    fn every_option_reads_its_environment_variable() {
        // clap checks the definition (duplicate names, bad defaults) here.
        use clap::CommandFactory;
        Settings::command().debug_assert();
        for arg in Settings::command().get_arguments() {
            let id = arg.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            assert!(arg.get_env().is_some(), "--{id} has no environment variable");
        }
    }
}
