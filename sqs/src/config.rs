//! How an SQS worker receives, hides and stops: [`WorkerConfig`], with
//! the defaults a production service starts from. With the `clap` feature
//! it is also a set of command-line flags, each with its environment
//! variable (`#[command(flatten)]` it into a service's settings), durations
//! read by [`parse_duration`].

use std::time::Duration;

/// How one [`SqsWorker`](crate::SqsWorker) receives, hides and stops.
///
/// | field | default | what |
/// | --- | --- | --- |
/// | `concurrency` | 8 | tasks worked on at once |
/// | `poll_wait` | 5 s | long-poll wait of each receive (SQS' maximum is 20 s) |
/// | `visibility_slack` | 5 s | how long past the lease a held message stays hidden |
/// | `shutdown_grace` | 20 s | after a stop request, how long the work in hand may take |
/// | `release_deadline` | 5 s | after the grace, how long the releases and the last calls may take |
///
/// A received message is hidden for the lease plus the slack; each lease
/// renewal (every third of the lease) extends it by as much. So a worker
/// that dies leaves its message hidden until about when its lease has
/// expired, and the next delivery's claim takes the task over.
///
/// ```
/// use std::time::Duration;
/// let config = taskfence_sqs::WorkerConfig {
///     concurrency: 32,
///     ..taskfence_sqs::WorkerConfig::default()
/// };
/// assert_eq!(config.stop_within(), Duration::from_secs(25));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct WorkerConfig {
    /// Tasks worked on at once.
    #[cfg_attr(
        feature = "clap",
        arg(long, env = "TASKFENCE_CONCURRENCY", default_value_t = 8)
    )]
    pub concurrency: usize,
    /// Long-poll wait of each receive (at most 20 s). A stop abandons a
    /// receive in flight: the messages it took come back after
    /// `lease + visibility_slack`.
    #[cfg_attr(feature = "clap", arg(long, env = "TASKFENCE_POLL_WAIT", default_value = "5s", value_parser = parse_duration))]
    pub poll_wait: Duration,
    /// How long past the lease a held message stays hidden.
    #[cfg_attr(feature = "clap", arg(long, env = "TASKFENCE_VISIBILITY_SLACK", default_value = "5s", value_parser = parse_duration))]
    pub visibility_slack: Duration,
    /// After a stop request, how long the work in hand may take to finish.
    /// The tasks still being worked on then are released (pending again, the
    /// attempt counted) and their messages made visible at once.
    #[cfg_attr(feature = "clap", arg(long, env = "TASKFENCE_SHUTDOWN_GRACE", default_value = "20s", value_parser = parse_duration))]
    pub shutdown_grace: Duration,
    /// After the grace, how long releasing and the last store and SQS calls
    /// may take: a stop never takes longer than grace + this.
    #[cfg_attr(feature = "clap", arg(long, env = "TASKFENCE_RELEASE_DEADLINE", default_value = "5s", value_parser = parse_duration))]
    pub release_deadline: Duration,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            concurrency: 8,
            poll_wait: Duration::from_secs(5),
            visibility_slack: Duration::from_secs(5),
            shutdown_grace: Duration::from_secs(20),
            release_deadline: Duration::from_secs(5),
        }
    }
}

impl WorkerConfig {
    /// The longest a stop takes: the grace plus the release deadline. Keep
    /// it below your process manager's kill timeout (Kubernetes'
    /// `terminationGracePeriodSeconds`, 30 s by default).
    ///
    /// ```
    /// assert_eq!(taskfence_sqs::WorkerConfig::default().stop_within().as_secs(), 25);
    /// ```
    pub fn stop_within(&self) -> Duration {
        self.shutdown_grace + self.release_deadline
    }
}

/// A duration as a flag or a variable gives it: `250ms`, `30s`, `5m`, `1h`,
/// or a number of seconds (`1.5`).
///
/// ```
/// use std::time::Duration;
/// use taskfence_sqs::config::parse_duration;
/// assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
/// assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
/// assert!(parse_duration("3d").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (like 250ms, 30s, 5m)"))?;
    let seconds = match unit.trim() {
        "ms" => number / 1000.0,
        "" | "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        other => return Err(format!("unknown unit {other:?} in {text:?} (ms, s, m, h)")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}
