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
use taskfence::config::{Renamed, UnknownVars};

use taskfence_sqs::WorkerConfig;
/// A duration: `250ms`, `30s`, `5m`, `1h`, or a number of seconds (`1.5`).
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

/// The worker service's configuration.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "sqs-worker",
    version,
    about = "Consumes an SQS queue of taskfence task ids until SIGTERM or SIGINT.",
    long_about = "Consumes an SQS queue of taskfence task ids until SIGTERM or SIGINT, then \
        stops receiving, lets the messages in hand finish for --shutdown-grace, releases the \
        tasks still running (their messages become visible again) and exits 0, within \
        --shutdown-grace + --release-deadline; a second signal releases at once.\n\n\
        AWS: credentials from the default chain (environment, profile, SSO, web identity, \
        ECS task role, instance role), the region from AWS_REGION or the profile, and \
        AWS_ENDPOINT_URL_SQS (AWS_ENDPOINT_URL_DYNAMODB with --store dynamodb) for a local \
        endpoint such as moto."
)]
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

    /// Messages worked on at once.
    #[arg(long, env = "TASKFENCE_CONCURRENCY", default_value_t = 8)]
    pub concurrency: usize,

    /// Lease length, renewed every third of it. A crashed worker's task is
    /// taken over about this long (plus the slack) after the crash.
    #[arg(long, env = "TASKFENCE_LEASE", default_value = "30s", value_parser = parse_duration)]
    pub lease: Duration,

    /// Long-poll wait of each receive (at most 20s; a stop abandons it).
    #[arg(long, env = "TASKFENCE_POLL_WAIT", default_value = "5s", value_parser = parse_duration)]
    pub poll_wait: Duration,

    /// How long past the lease a held message stays hidden.
    #[arg(long, env = "TASKFENCE_VISIBILITY_SLACK", default_value = "5s", value_parser = parse_duration)]
    pub visibility_slack: Duration,

    /// After SIGTERM/SIGINT, how long the messages in hand may take to
    /// finish before their tasks are released. Keep it plus
    /// --release-deadline below your process manager's kill timeout
    /// (Kubernetes: terminationGracePeriodSeconds, 30s).
    #[arg(long, env = "TASKFENCE_SHUTDOWN_GRACE", default_value = "20s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,

    /// After the grace (or a second signal), how long releasing the tasks
    /// still held and the last store and SQS calls may take: the process
    /// exits within --shutdown-grace plus this, however slow SQS or the store.
    #[arg(long, env = "TASKFENCE_RELEASE_DEADLINE", default_value = "5s", value_parser = parse_duration)]
    pub release_deadline: Duration,

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

    /// The former name of --republish-interval (and of its variable), read
    /// as --republish-interval until 0.3 (see [`Settings::load`]).
    #[arg(
        long = "redispatch-interval",
        env = "TASKFENCE_REDISPATCH_INTERVAL",
        hide = true,
        value_parser = parse_duration,
        conflicts_with = "republish_interval"
    )]
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

    /// Simulated provider (local runs only): shortest answer time.
    #[arg(long, env = "TASKFENCE_SIM_MIN_LATENCY", default_value = "200ms", value_parser = parse_duration)]
    pub sim_min_latency: Duration,

    /// Simulated provider (local runs only): longest answer time.
    #[arg(long, env = "TASKFENCE_SIM_MAX_LATENCY", default_value = "800ms", value_parser = parse_duration)]
    pub sim_max_latency: Duration,

    /// The former `--sim-latency-min` / `TASKFENCE_SIM_LATENCY_MIN`, read as
    /// --sim-min-latency until 0.3 (see [`Settings::load`]).
    #[arg(
        long = "sim-latency-min",
        env = "TASKFENCE_SIM_LATENCY_MIN",
        hide = true,
        value_parser = parse_duration,
        conflicts_with = "sim_min_latency"
    )]
    sim_latency_min: Option<Duration>,

    /// The former `--sim-latency-max` / `TASKFENCE_SIM_LATENCY_MAX`, read as
    /// --sim-max-latency until 0.3 (see [`Settings::load`]).
    #[arg(
        long = "sim-latency-max",
        env = "TASKFENCE_SIM_LATENCY_MAX",
        hide = true,
        value_parser = parse_duration,
        conflicts_with = "sim_max_latency"
    )]
    sim_latency_max: Option<Duration>,

    /// Simulated provider (local runs only): fraction of calls failing transiently.
    #[arg(long, env = "TASKFENCE_SIM_TRANSIENT_RATE", default_value_t = 0.0)]
    pub sim_transient_rate: f64,

    /// Log filter, in `tracing_subscriber::EnvFilter` syntax
    /// (`info`, `sqs_worker=debug,taskfence=info`).
    #[arg(long = "log", env = "RUST_LOG", default_value = "info")]
    pub log: String,

    /// Former names found while parsing, each with its warning.
    #[arg(skip)]
    deprecations: Vec<Renamed>,
}

impl Settings {
    /// Parses the command line and the environment (exiting with the usage
    /// message when they are invalid, like [`Parser::parse`]), reading the
    /// former names of renamed options into the current ones: see
    /// [`deprecations`](Self::deprecations).
    pub fn load() -> Self {
        Self::try_load_from(std::env::args_os()).unwrap_or_else(|error| error.exit())
    }

    /// [`load`](Self::load) from `args` (and the environment).
    pub fn try_load_from<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let mut settings = Self::try_parse_from(args)?;
        settings.read_former_names();
        Ok(settings)
    }

    /// The former names this configuration used, each with its deprecation
    /// warning (log them at start-up). They still work until 0.3.
    pub fn deprecations(&self) -> &[Renamed] {
        &self.deprecations
    }

    /// The `TASKFENCE_*` variables of this process that no option reads
    /// (log it at start-up): a misspelt or retired one would otherwise be
    /// silently ignored.
    pub fn unknown_env() -> Option<UnknownVars> {
        use clap::CommandFactory;
        let command = Self::command();
        let known: Vec<&str> = command
            .get_arguments()
            .filter_map(|arg| arg.get_env()?.to_str())
            .collect();
        taskfence::config::unknown_env(&known)
    }

    fn read_former_names(&mut self) {
        let renamed = |old: &str, new: &str| Renamed::new(old, new);
        if let Some(latency) = self.sim_latency_min.take() {
            self.sim_min_latency = latency;
            self.deprecations.push(renamed(
                "--sim-latency-min / TASKFENCE_SIM_LATENCY_MIN",
                "--sim-min-latency / TASKFENCE_SIM_MIN_LATENCY",
            ));
        }
        if let Some(latency) = self.sim_latency_max.take() {
            self.sim_max_latency = latency;
            self.deprecations.push(renamed(
                "--sim-latency-max / TASKFENCE_SIM_LATENCY_MAX",
                "--sim-max-latency / TASKFENCE_SIM_MAX_LATENCY",
            ));
        }
        if let Some(interval) = self.redispatch_interval.take() {
            self.republish_interval = interval;
            self.deprecations.push(renamed(
                "--redispatch-interval / TASKFENCE_REDISPATCH_INTERVAL",
                "--republish-interval / TASKFENCE_REPUBLISH_INTERVAL",
            ));
        }
    }

    /// The worker id: `--worker-id`, or `$HOSTNAME-<pid>`.
    pub fn worker_id(&self) -> String {
        self.worker_id.clone().unwrap_or_else(|| {
            let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "sqs-worker".into());
            format!("{host}-{}", std::process::id())
        })
    }

    /// How often to republish due tasks: --republish-interval, or its
    /// former name --redispatch-interval when that is given (also when the
    /// settings were parsed without [`load`](Self::load)).
    pub fn republish_every(&self) -> Duration {
        self.redispatch_interval.unwrap_or(self.republish_interval)
    }

    /// The worker's settings.
    pub fn worker_settings(&self) -> WorkerConfig {
        WorkerConfig {
            concurrency: self.concurrency,
            poll_wait: self.poll_wait,
            visibility_slack: self.visibility_slack,
            shutdown_grace: self.shutdown_grace,
            release_deadline: self.release_deadline,
        }
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
    fn former_names_set_the_new_options_with_a_deprecation_warning() {
        let base = [
            "sqs-worker",
            "--database-url",
            "postgres://db",
            "--queue-url",
            "http://q",
        ];
        let load = |extra: &[&str]| Settings::try_load_from(base.iter().chain(extra));
        let s = load(&[
            "--sim-latency-min=10ms",
            "--sim-latency-max=20ms",
            "--redispatch-interval=7s",
        ])
        .unwrap();
        assert_eq!(s.sim_min_latency, Duration::from_millis(10));
        assert_eq!(s.sim_max_latency, Duration::from_millis(20));
        assert_eq!(s.republish_interval, Duration::from_secs(7));
        assert_eq!(s.republish_every(), Duration::from_secs(7));
        let warnings: Vec<String> = s.deprecations().iter().map(|r| r.warning()).collect();
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        for (warning, new) in
            warnings
                .iter()
                .zip(["--sim-min-latency", "--sim-max-latency", "--republish-interval"])
        {
            assert!(warning.contains("removed in 0.3"), "{warning}");
            assert!(warning.contains(new), "{new} in {warning}");
        }
        assert!(load(&["--sim-latency-min=10ms", "--sim-min-latency=5ms"]).is_err());
        let s = load(&["--sim-min-latency=5ms"]).unwrap();
        assert_eq!(
            (s.sim_min_latency, s.deprecations().len()),
            (Duration::from_millis(5), 0)
        );
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
