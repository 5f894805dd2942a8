//! The worker's settings: every option is a flag and an environment
//! variable, with defaults meant for production (`kafka-worker --help`).

use std::time::Duration;

use clap::{Parser, ValueEnum};
use taskfence::config::{Renamed, UnknownVars};

/// Settings of the `kafka-worker` service.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "kafka-worker",
    version,
    about = "Consumes taskfence handoffs from Kafka and runs each task once: claim, call the provider, save one reply."
)]
pub struct Settings {
    /// PostgreSQL URL; TLS via `?sslmode=verify-full&sslrootcert=…`.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,

    /// Schema of the taskfence tables (migrated at start).
    #[arg(long, env = "TASKFENCE_SCHEMA", default_value = "taskfence")]
    pub schema: String,

    /// Maximum PostgreSQL connections of this process.
    #[arg(long, env = "TASKFENCE_DB_MAX_CONNECTIONS", default_value_t = 10)]
    pub db_max_connections: u32,

    /// Kafka `bootstrap.servers`.
    #[arg(long, env = "TASKFENCE_KAFKA_BOOTSTRAP")]
    pub bootstrap: String,

    /// The handoff topic.
    #[arg(long, env = "TASKFENCE_KAFKA_TOPIC", default_value = "taskfence-handoffs")]
    pub topic: String,

    /// The results topic: each saved response is published there, keyed by
    /// task id, with the task id and assignment version in the headers
    /// (unset: results are not published).
    #[arg(long, env = "TASKFENCE_KAFKA_RESULTS_TOPIC")]
    pub results_topic: Option<String>,

    /// The consumer group: workers in one group share the partitions.
    #[arg(
        long,
        env = "TASKFENCE_KAFKA_GROUP",
        default_value = "taskfence-reply-workers"
    )]
    pub group: String,

    /// This worker's id: recorded with every attempt, and the Kafka `client.id`.
    /// Default: `$HOSTNAME` (the pod name on Kubernetes), else `kafka-worker-<pid>`.
    #[arg(long, env = "TASKFENCE_WORKER_ID", default_value_t = default_worker_id())]
    pub worker_id: String,

    /// Where partition positions live: the group's committed offsets, or a
    /// PostgreSQL table saved in each completion's transaction.
    #[arg(long, env = "TASKFENCE_POSITIONS", value_enum, default_value_t = Positions::Group)]
    pub positions: Positions,

    /// Tasks worked on at once (as many again are held claimed and ready).
    #[arg(long, env = "TASKFENCE_CONCURRENCY", default_value_t = 16)]
    pub concurrency: usize,

    /// The former `--per-partition` / `TASKFENCE_PER_PARTITION` (records of
    /// one partition worked on at once), read as `--concurrency` until 0.3:
    /// see [`Settings::deprecations`].
    #[arg(
        long = "per-partition",
        env = "TASKFENCE_PER_PARTITION",
        hide = true,
        conflicts_with = "concurrency"
    )]
    per_partition: Option<usize>,

    /// Lease length (store clock), renewed every third of it while the provider runs.
    #[arg(long, env = "TASKFENCE_LEASE", default_value = "30s", value_parser = parse_duration)]
    pub lease: Duration,

    /// The shortest wait before a record is delivered again (its task busy,
    /// backing off, or its lease lost).
    #[arg(long, env = "TASKFENCE_RETRY_DELAY", default_value = "1s", value_parser = parse_duration)]
    pub retry_delay: Duration,

    /// Kafka `session.timeout.ms`: how long the group waits for a silent member.
    #[arg(long, env = "TASKFENCE_KAFKA_SESSION_TIMEOUT", default_value = "45s", value_parser = parse_duration)]
    pub session_timeout: Duration,

    /// After SIGTERM/SIGINT: how long in-flight tasks may take to finish
    /// before their leases are released (a second signal releases at once).
    /// Keep it under the platform's kill timeout (Kubernetes:
    /// terminationGracePeriodSeconds, 30 s by default) with the release
    /// deadline (5 s) and the final commit to spare.
    #[arg(long, env = "TASKFENCE_SHUTDOWN_GRACE", default_value = "20s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,

    /// Also publish the transactional outbox to the topic from this process
    /// (harmless with several workers: rounds skip each other's rows).
    #[arg(long, env = "TASKFENCE_DISPATCH", default_value_t = true, action = clap::ArgAction::Set)]
    pub dispatch: bool,

    /// Handoffs published per dispatch round.
    #[arg(long, env = "TASKFENCE_DISPATCH_BATCH", default_value_t = 100)]
    pub dispatch_batch: usize,

    /// Records per produce batch of a partition (librdkafka
    /// `batch.num.messages`; unset: librdkafka's default). Kafka needs no
    /// limit; `1` is for test brokers that mishandle multi-record batches
    /// (tansu 0.6.0).
    #[arg(long, env = "TASKFENCE_KAFKA_PRODUCER_BATCH_RECORDS")]
    pub producer_batch_records: Option<usize>,

    /// Pause after a dispatch round that found nothing to publish.
    #[arg(long, env = "TASKFENCE_DISPATCH_IDLE", default_value = "500ms", value_parser = parse_duration)]
    pub dispatch_idle: Duration,

    /// The model provider. `simulated` is for local runs and tests only.
    #[arg(long, env = "TASKFENCE_PROVIDER", value_enum, default_value_t = ProviderKind::Http)]
    pub provider: ProviderKind,

    /// The provider's endpoint (required with `--provider http`).
    #[arg(long, env = "TASKFENCE_PROVIDER_URL")]
    pub provider_url: Option<String>,

    /// Simulated provider (local runs): shortest answer time.
    #[arg(long, env = "TASKFENCE_SIM_MIN_LATENCY", default_value = "200ms", value_parser = parse_duration)]
    pub sim_min_latency: Duration,

    /// Simulated provider (local runs): longest answer time.
    #[arg(long, env = "TASKFENCE_SIM_MAX_LATENCY", default_value = "800ms", value_parser = parse_duration)]
    pub sim_max_latency: Duration,

    /// Simulated provider (local runs): answer time of `slow:` prompts.
    #[arg(long, env = "TASKFENCE_SIM_SLOW_LATENCY", default_value = "10s", value_parser = parse_duration)]
    pub sim_slow_latency: Duration,

    /// Log filter (`tracing_subscriber::EnvFilter` syntax, e.g. `info,kafka_worker=debug`).
    #[arg(long = "log", env = "RUST_LOG", default_value = "info")]
    pub log: String,

    /// Former names found while parsing, each with its warning.
    #[arg(skip)]
    deprecations: Vec<Renamed>,
}

impl Settings {
    /// Parses the command line and environment, exiting with the usage
    /// message when they are invalid (like [`Parser::parse`]).
    pub fn load() -> Self {
        Self::try_load_from(std::env::args_os()).unwrap_or_else(|error| error.exit())
    }

    /// Parses `args` (and the environment) and checks what clap cannot: the
    /// HTTP provider needs its URL, also when `--provider` was left at its default.
    pub fn try_load_from<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let mut settings = Self::try_parse_from(args)?;
        settings.read_former_names();
        if settings.provider == ProviderKind::Http && settings.provider_url.is_none() {
            use clap::CommandFactory;
            return Err(Self::command().error(
                clap::error::ErrorKind::MissingRequiredArgument,
                "--provider-url (TASKFENCE_PROVIDER_URL) is required with --provider http",
            ));
        }
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

    /// Folds the former names into the current settings.
    fn read_former_names(&mut self) {
        if let Some(per_partition) = self.per_partition.take() {
            // The old limit was per assigned partition, the consumer's is per
            // process: the number of partitions a process holds changes with
            // every rebalance, so no exact mapping exists. One partition's
            // limit is the conservative one (never more work at once than
            // before on any partition).
            self.concurrency = per_partition;
            self.deprecations.push(
                Renamed::new(
                    "--per-partition / TASKFENCE_PER_PARTITION",
                    "--concurrency / TASKFENCE_CONCURRENCY",
                )
                .note(format!(
                    "it limited the records of each partition worked on at once, the consumer \
                     limits the whole process: read as --concurrency {per_partition}; with P \
                     partitions per process, set --concurrency {per_partition}×P for the old total"
                )),
            );
        }
    }
}

/// Where partition positions live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Positions {
    /// The consumer group's committed offsets.
    Group,
    /// A PostgreSQL table, saved in each completion's transaction.
    Postgres,
}

/// Which model provider the worker calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProviderKind {
    /// `HttpProvider`: plug your HTTP client in `src/provider.rs`.
    Http,
    /// The simulated LLM (`sim::SimulatedLlm`): local runs and tests only.
    Simulated,
}

fn default_worker_id() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.trim().is_empty())
        .unwrap_or_else(|| format!("kafka-worker-{}", std::process::id()))
}

/// Parses `250ms`, `30s`, `5m`, `1h`, or a bare number of seconds.
///
/// ```
/// use std::time::Duration;
/// use kafka_worker::config::parse_duration;
/// assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
/// assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
/// assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
/// assert!(parse_duration("soon").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (e.g. 500ms, 30s, 5m)"))?;
    match unit.trim() {
        "ms" => Ok(Duration::from_millis(n)),
        "" | "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        "h" => Ok(Duration::from_secs(n * 3600)),
        other => Err(format!("unknown unit {other:?} in {text:?} (ms, s, m, h)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_suit_production_and_flags_override_them() {
        let s = Settings::try_load_from([
            "kafka-worker",
            "--database-url",
            "postgres://db/app",
            "--bootstrap",
            "kafka:9092",
            "--provider-url",
            "https://llm.example/v1",
        ])
        .unwrap();
        assert_eq!(s.positions, Positions::Group);
        assert_eq!(s.provider, ProviderKind::Http);
        assert_eq!(s.lease, Duration::from_secs(30));
        assert_eq!(s.shutdown_grace, Duration::from_secs(20));
        assert!(s.dispatch);
        assert_eq!(s.results_topic, None);
        let s = Settings::try_load_from([
            "kafka-worker",
            "--database-url=postgres://db/app",
            "--bootstrap=kafka:9092",
            "--provider=simulated",
            "--dispatch=false",
            "--shutdown-grace=3s",
            "--results-topic=replies",
        ])
        .unwrap();
        assert!(!s.dispatch);
        assert_eq!(s.results_topic.as_deref(), Some("replies"));
        assert_eq!(s.shutdown_grace, Duration::from_secs(3));
    }

    #[test]
    fn the_former_per_partition_flag_sets_the_concurrency_with_a_warning() {
        let base = [
            "kafka-worker",
            "--database-url=postgres://db/app",
            "--bootstrap=kafka:9092",
            "--provider=simulated",
        ];
        let s = Settings::try_load_from(base.iter().chain(&["--per-partition", "4"])).unwrap();
        assert_eq!(s.concurrency, 4);
        let [renamed] = s.deprecations() else {
            panic!("one deprecation: {:?}", s.deprecations());
        };
        let warning = renamed.warning();
        for part in [
            "--per-partition",
            "--concurrency",
            "removed in 0.3",
            "read as --concurrency 4",
        ] {
            assert!(warning.contains(part), "{part:?} in {warning}");
        }
        // Given with the new name too, it is a usage error: which one is meant?
        let both = Settings::try_load_from(base.iter().chain(&["--per-partition=4", "--concurrency=8"]));
        assert!(both.is_err());
        // The new name alone: no warning.
        let s = Settings::try_load_from(base.iter().chain(&["--concurrency=8"])).unwrap();
        assert_eq!((s.concurrency, s.deprecations().len()), (8, 0));
    }

    #[test]
    fn the_former_variable_belongs_to_the_alias_so_it_is_not_reported_unknown() {
        use clap::CommandFactory;
        // The variable is what an env-configured deployment sets: the option reads it.
        let command = Settings::command();
        let arg = command
            .get_arguments()
            .find(|arg| arg.get_id() == "per_partition")
            .expect("the alias");
        assert_eq!(
            arg.get_env().and_then(|e| e.to_str()),
            Some("TASKFENCE_PER_PARTITION")
        );
        // And it is known, so it is not also reported as unknown.
        let known: Vec<&str> = command
            .get_arguments()
            .filter_map(|arg| arg.get_env()?.to_str())
            .collect();
        assert!(taskfence::config::unknown_env_among(["TASKFENCE_PER_PARTITION"], &known).is_none());
        let unknown = taskfence::config::unknown_env_among(["TASKFENCE_CONCURENCY"], &known).unwrap();
        assert_eq!(unknown.vars()[0].suggestion(), Some("TASKFENCE_CONCURRENCY"));
    }

    #[test]
    fn the_http_provider_needs_its_url() {
        let err = Settings::try_load_from([
            "kafka-worker",
            "--database-url=postgres://db/app",
            "--bootstrap=kafka:9092",
        ])
        .unwrap_err();
        assert!(err.to_string().contains("--provider-url"), "{err}");
    }
}
