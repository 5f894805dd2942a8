//! The worker's settings: every option is a flag and an environment
//! variable, with defaults meant for production (`kafka-worker --help`).
//! The Kafka side's (topic, group, positions, concurrency, grace,
//! dispatch…) are `taskfence_kafka`'s [`WorkerConfig`], with their
//! documented defaults.

use std::time::Duration;

use clap::{Parser, ValueEnum};
use taskfence::config::{Renamed, parse_duration};
use taskfence_kafka::WorkerConfig;

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

    /// This worker's id: recorded with every attempt, and the Kafka `client.id`.
    /// Default: `$HOSTNAME` (the pod name on Kubernetes), else `kafka-worker-<pid>`.
    #[arg(long, env = "TASKFENCE_WORKER_ID", default_value_t = default_worker_id())]
    pub worker_id: String,

    /// Lease length (store clock), renewed every third of it while the provider runs.
    #[arg(long, env = "TASKFENCE_LEASE", default_value = "30s", value_parser = parse_duration)]
    pub lease: Duration,

    /// The Kafka side: `--bootstrap`, `--topic`, `--group`, `--positions`,
    /// `--concurrency`, `--shutdown-grace`, `--dispatch`…
    #[command(flatten)]
    pub worker: WorkerConfig,

    /// The model provider. `simulated` is for local runs and tests only.
    #[arg(long, env = "TASKFENCE_PROVIDER", value_enum, default_value_t = ProviderKind::Http)]
    pub provider: ProviderKind,

    /// The provider's endpoint (required with `--provider http`).
    #[arg(long, env = "TASKFENCE_PROVIDER_URL")]
    pub provider_url: Option<String>,

    /// The simulated provider's `--sim-*` options (delete with `sim`).
    #[command(flatten)]
    pub sim: crate::sim::SimSettings,

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
        settings.deprecations.extend(settings.worker.read_former_names());
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

#[cfg(test)]
mod tests {
    use super::*;
    use taskfence_kafka::Positions;

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
        assert_eq!(s.worker.positions, Positions::Group);
        assert_eq!(s.provider, ProviderKind::Http);
        assert_eq!(s.lease, Duration::from_secs(30));
        assert_eq!(s.worker.shutdown_grace, Duration::from_secs(20));
        assert!(s.worker.dispatch);
        assert_eq!(s.worker.results_topic, None);
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
        assert!(!s.worker.dispatch);
        assert_eq!(s.worker.results_topic.as_deref(), Some("replies"));
        assert_eq!(s.worker.shutdown_grace, Duration::from_secs(3));
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
        assert_eq!(s.worker.concurrency, 4);
        let [renamed] = s.deprecations() else {
            panic!("one deprecation: {:?}", s.deprecations());
        };
        assert!(renamed.warning().contains("read as --concurrency 4"));
        let both = Settings::try_load_from(base.iter().chain(&["--per-partition=4", "--concurrency=8"]));
        assert!(both.is_err());
        let s = Settings::try_load_from(base.iter().chain(&["--concurrency=8"])).unwrap();
        assert_eq!((s.worker.concurrency, s.deprecations().len()), (8, 0));
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
