//! The service's settings: every option is a command-line flag and an
//! environment variable (the flag wins), with defaults for production.
//! `sqs-worker --help` lists them. The store's, the worker's and the
//! dispatcher's options are `taskfence_sqs`'s ([`StoreConfig`],
//! [`WorkerConfig`], [`DispatchConfig`]), with their documented defaults.
//!
//! AWS itself is configured the standard way, not here: credentials from the
//! default chain, `AWS_REGION`, and `AWS_ENDPOINT_URL_SQS` (and
//! `AWS_ENDPOINT_URL_DYNAMODB`) for a local endpoint (see
//! [`crate::aws::aws_config()`]).

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use taskfence::config::{Renamed, parse_duration};
use taskfence_sqs::{DispatchConfig, StoreConfig, WorkerConfig};

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
    /// The store: `--store`, `--database-url`, `--dynamodb-table`, `--schema`…
    #[command(flatten)]
    pub store: StoreConfig,

    /// The queue to consume (and, with --dispatch, to publish to).
    #[arg(long, env = "TASKFENCE_SQS_QUEUE_URL")]
    pub queue_url: String,

    /// This worker's id, recorded with every attempt it makes. Default:
    /// `$HOSTNAME-<pid>`, unique per process.
    #[arg(long, env = "TASKFENCE_WORKER_ID")]
    pub worker_id: Option<String>,

    /// Lease length, renewed every third of it. A crashed worker's task is
    /// taken over about this long (plus the slack) after the crash.
    #[arg(long, env = "TASKFENCE_LEASE", default_value = "30s", value_parser = parse_duration)]
    pub lease: Duration,

    /// How the worker receives and stops: `--concurrency`, `--poll-wait`,
    /// `--visibility-slack`, `--shutdown-grace`, `--release-deadline`.
    #[command(flatten)]
    pub worker: WorkerConfig,

    /// Publishing the outbox: `--dispatch`, `--dispatch-batch`,
    /// `--dispatch-idle`, `--republish-interval`.
    #[command(flatten)]
    pub dispatch: DispatchConfig,

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

    /// The simulated provider's `--sim-*` options (delete with `sim`).
    #[command(flatten)]
    pub sim: crate::sim::SimSettings,

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
    /// message when they are invalid), reading former names into the
    /// current options: see [`deprecations`](Self::deprecations).
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
        settings.deprecations = settings.sim.read_former_names();
        settings
            .deprecations
            .extend(settings.dispatch.read_former_names());
        Ok(settings)
    }

    /// The former names this configuration used, each with its deprecation
    /// warning (log them at start-up). They still work until 0.3.
    pub fn deprecations(&self) -> &[Renamed] {
        &self.deprecations
    }

    /// The worker id: `--worker-id`, or `$HOSTNAME-<pid>`.
    pub fn worker_id(&self) -> String {
        self.worker_id.clone().unwrap_or_else(|| {
            let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "sqs-worker".into());
            format!("{host}-{}", std::process::id())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(s.sim.sim_min_latency, Duration::from_millis(10));
        assert_eq!(s.sim.sim_max_latency, Duration::from_millis(20));
        assert_eq!(s.dispatch.republish_interval, Duration::from_secs(7));
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
        assert!(load(&["--republish-interval=5s", "--redispatch-interval=7s"]).is_err());
        let s = load(&["--sim-min-latency=5ms"]).unwrap();
        assert_eq!(
            (s.sim.sim_min_latency, s.deprecations().len()),
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

    #[test]
    fn the_store_needs_its_url_or_table() {
        let base = ["sqs-worker", "--queue-url", "http://q"];
        let dynamo = base.iter().chain(&["--store", "dynamodb"]);
        assert!(Settings::try_load_from(dynamo).is_err(), "DynamoDB: a table");
        let dynamo = base
            .iter()
            .chain(&["--store", "dynamodb", "--dynamodb-table", "t"]);
        assert!(Settings::try_load_from(dynamo).is_ok());
    }
}
