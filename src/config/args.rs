//! The flags every service on taskfence reads the same way (feature `clap`):
//! [`Mode`], [`WorkerArgs`], [`PurgeArgs`], flattened into the service's own
//! `clap::Parser`, and [`env_from_flags`], which gives each of them (and
//! the service's own flags) an environment variable under the service's prefix.

use std::time::Duration;

use super::parse_duration;

/// Which halves of a service this process runs (`--mode`): its HTTP API,
/// its worker, or both.
///
/// The API and the worker share nothing but the store, so a service can run
/// them in one process (the default) or separately (`--mode api` /
/// `--mode worker`) and scale each on its own.
///
/// ```
/// use clap::ValueEnum;
/// use taskfence::config::Mode;
///
/// let mode = Mode::from_str("worker", false).unwrap();
/// assert_eq!(mode, Mode::WorkerOnly);
/// assert!(mode.runs_worker() && !mode.runs_api());
/// assert!(Mode::Both.runs_api() && Mode::Both.runs_worker());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// The HTTP API and the worker (default).
    #[value(name = "both")]
    Both,
    /// Only the HTTP API: the work is done by worker processes.
    #[value(name = "api")]
    ApiOnly,
    /// Only the worker: no HTTP listener.
    #[value(name = "worker")]
    WorkerOnly,
}

impl Mode {
    /// `true` when this process serves HTTP.
    ///
    /// ```
    /// assert!(!taskfence::config::Mode::WorkerOnly.runs_api());
    /// ```
    pub fn runs_api(self) -> bool {
        self != Mode::WorkerOnly
    }

    /// `true` when this process runs the worker.
    ///
    /// ```
    /// assert!(!taskfence::config::Mode::ApiOnly.runs_worker());
    /// ```
    pub fn runs_worker(self) -> bool {
        self != Mode::ApiOnly
    }
}

/// A service's worker flags: `--worker-concurrency`, `--lease`,
/// `--poll-every`, `--stop-grace`. Every service with a consumer reads these
/// four the same way; flatten them into its settings
/// (`#[command(flatten)]`) and build its `runtime::ConsumerConfig` from them.
///
/// ```
/// use std::time::Duration;
/// use clap::Parser;
///
/// #[derive(clap::Parser)]
/// struct Settings {
///     #[command(flatten)]
///     worker: taskfence::config::WorkerArgs,
/// }
/// let settings = Settings::try_parse_from(["svc", "--lease", "5m", "--stop-grace", "3s"]).unwrap();
/// assert_eq!(settings.worker.lease, Duration::from_secs(300));
/// assert_eq!(settings.worker.grace, Duration::from_secs(3));
/// assert_eq!(settings.worker.concurrency, 8);
/// ```
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// Tasks worked on at once by this process's worker.
    #[arg(long = "worker-concurrency", default_value_t = 8)]
    pub concurrency: usize,
    /// Lease per claim, renewed in the background while the work runs
    /// (`30s`, `500ms`, `5m`).
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub lease: Duration,
    /// The longest wait between two looks for work nothing woke the worker
    /// for: a submission in another process, a retry past its backoff, an
    /// expired lease. A submission in the same process wakes it at once.
    #[arg(long, value_parser = parse_duration, default_value = "200ms")]
    pub poll_every: Duration,
    /// On SIGTERM, how long the work in flight may take to finish; the rest
    /// is released for another process (a second SIGTERM releases at once).
    /// The stop takes at most this plus 5 s: the default fits within
    /// Kubernetes' default 30 s between SIGTERM and SIGKILL.
    #[arg(long = "stop-grace", value_parser = parse_duration, default_value = "20s")]
    pub grace: Duration,
}

impl WorkerArgs {
    /// The consumer these flags describe: named
    /// [`ConsumerConfig::unique_id`]`(name)` (one id per process and start),
    /// with their lease, concurrency, poll interval and stop grace, the
    /// consumer's defaults otherwise (prefetch among them: set it after).
    ///
    /// ```
    /// use std::time::Duration;
    /// let worker = taskfence::config::WorkerArgs { lease: Duration::from_secs(60), ..Default::default() };
    /// let config = worker.consumer_config("chat-worker").prefetch(0);
    /// assert_eq!((config.lease_duration, config.concurrency, config.prefetch), (Duration::from_secs(60), 8, 0));
    /// assert!(config.worker_id.starts_with("chat-worker-"));
    /// ```
    ///
    /// [`ConsumerConfig::unique_id`]: crate::runtime::ConsumerConfig::unique_id
    #[cfg(feature = "runtime")]
    #[cfg_attr(docsrs, doc(cfg(feature = "runtime")))]
    pub fn consumer_config(&self, name: &str) -> crate::runtime::ConsumerConfig {
        use crate::runtime::ConsumerConfig;
        ConsumerConfig::new(ConsumerConfig::unique_id(name), self.lease)
            .concurrency(self.concurrency)
            .poll_every(self.poll_every)
            .grace(self.grace)
    }
}

impl Default for WorkerArgs {
    /// The flags' defaults.
    ///
    /// ```
    /// let worker = taskfence::config::WorkerArgs::default();
    /// assert_eq!(worker.poll_every, std::time::Duration::from_millis(200));
    /// ```
    fn default() -> Self {
        super::defaults()
    }
}

/// A service's retention sweep flags (`runtime::purge_every`):
/// `--purge-interval` and `--purge-batch`.
///
/// ```
/// use clap::Parser;
///
/// #[derive(clap::Parser)]
/// struct Settings {
///     #[command(flatten)]
///     purge: taskfence::config::PurgeArgs,
/// }
/// let settings = Settings::try_parse_from(["svc", "--purge-interval", "0"]).unwrap();
/// assert!(settings.purge.every.is_zero(), "0 turns the sweep off");
/// assert_eq!(settings.purge.batch, 1000);
/// ```
#[derive(Debug, Clone, clap::Args)]
pub struct PurgeArgs {
    /// How often the worker's process purges the tasks past their retention
    /// (`0` turns it off, e.g. when a scheduled `taskfence purge` does it).
    #[arg(long = "purge-interval", value_parser = parse_duration, default_value = "10m")]
    pub every: Duration,
    /// Tasks removed per purge statement (1 to
    /// `taskfence::limits::MAX_SCAN_LIMIT`); a sweep repeats it until fewer are left.
    #[arg(long = "purge-batch", default_value_t = 1000)]
    pub batch: usize,
}

impl Default for PurgeArgs {
    /// The flags' defaults.
    ///
    /// ```
    /// let purge = taskfence::config::PurgeArgs::default();
    /// assert_eq!(purge.every, std::time::Duration::from_secs(600));
    /// ```
    fn default() -> Self {
        super::defaults()
    }
}

/// For `Command::mut_args`: gives every flag that has no environment
/// variable one named after it under `prefix` (`--worker-concurrency` →
/// `{prefix}WORKER_CONCURRENCY`); a flag with its own `env` keeps it.
///
/// The shared flags ([`WorkerArgs`], [`PurgeArgs`]) carry no variable of
/// their own: each service reads them under its own prefix, as it reads its
/// own flags, so two services on one host never read each other's settings.
///
/// ```
/// use clap::CommandFactory;
///
/// #[derive(clap::Parser)]
/// #[command(mut_args(taskfence::config::env_from_flags("CHAT_API_")))]
/// struct Settings {
///     #[arg(long, env = "DATABASE_URL")]
///     database_url: String,
///     #[command(flatten)]
///     worker: taskfence::config::WorkerArgs,
/// }
/// let command = Settings::command();
/// let env = |id: &str| {
///     let arg = command.get_arguments().find(|a| a.get_id() == id).unwrap();
///     arg.get_env().unwrap().to_str().unwrap().to_owned()
/// };
/// assert_eq!(env("concurrency"), "CHAT_API_WORKER_CONCURRENCY");
/// assert_eq!(env("grace"), "CHAT_API_STOP_GRACE");
/// assert_eq!(env("database_url"), "DATABASE_URL");
/// ```
pub fn env_from_flags(prefix: &str) -> impl FnMut(clap::Arg) -> clap::Arg {
    let prefix = prefix.to_owned();
    move |arg| {
        let named = arg
            .get_long()
            .filter(|_| arg.get_env().is_none() && takes_a_value(&arg));
        match named.map(|long| format!("{prefix}{}", long.replace('-', "_").to_uppercase())) {
            Some(env) => arg.env(env),
            None => arg,
        }
    }
}

/// `true` for a flag with a value (`--lease 5m`), not `--help` or a switch.
fn takes_a_value(arg: &clap::Arg) -> bool {
    !matches!(
        arg.get_action(),
        clap::ArgAction::Help
            | clap::ArgAction::HelpShort
            | clap::ArgAction::HelpLong
            | clap::ArgAction::Version
    )
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[derive(Debug, clap::Parser)]
    #[command(mut_args(env_from_flags("SVC_")))]
    struct Settings {
        #[arg(long, value_enum, default_value = "both")]
        mode: Mode,
        #[arg(long, env = "TASKFENCE_SCHEMA", default_value = "taskfence")]
        schema: String,
        #[command(flatten)]
        worker: WorkerArgs,
        #[command(flatten)]
        purge: PurgeArgs,
    }

    #[test]
    fn every_flag_gets_a_variable_under_the_prefix_but_its_own() {
        let command = Settings::command();
        let mut env: Vec<(String, String)> = command
            .get_arguments()
            .filter_map(|a| Some((a.get_long()?.to_owned(), a.get_env()?.to_str()?.to_owned())))
            .collect();
        env.sort();
        let expected = [
            ("lease", "SVC_LEASE"),
            ("mode", "SVC_MODE"),
            ("poll-every", "SVC_POLL_EVERY"),
            ("purge-batch", "SVC_PURGE_BATCH"),
            ("purge-interval", "SVC_PURGE_INTERVAL"),
            ("schema", "TASKFENCE_SCHEMA"),
            ("stop-grace", "SVC_STOP_GRACE"),
            ("worker-concurrency", "SVC_WORKER_CONCURRENCY"),
        ];
        let expected: Vec<_> = expected
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect();
        assert_eq!(env, expected);
    }

    #[test]
    fn defaults_and_flags() {
        let settings = Settings::try_parse_from(["svc", "--mode", "api", "--purge-batch", "50"]).unwrap();
        assert_eq!(settings.mode, Mode::ApiOnly);
        assert_eq!(settings.purge.batch, 50);
        assert_eq!(settings.worker.lease, WorkerArgs::default().lease);
        assert!(Settings::try_parse_from(["svc", "--lease", "soon"]).is_err());
        assert!(Settings::try_parse_from(["svc", "--mode", "sideways"]).is_err());
    }
}
