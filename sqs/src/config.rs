//! How an SQS worker receives, hides and stops: [`WorkerConfig`], with
//! the defaults a production service starts from.

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
pub struct WorkerConfig {
    /// Tasks worked on at once.
    pub concurrency: usize,
    /// Long-poll wait of each receive (at most 20 s). A stop abandons a
    /// receive in flight: the messages it took come back after
    /// `lease + visibility_slack`.
    pub poll_wait: Duration,
    /// How long past the lease a held message stays hidden.
    pub visibility_slack: Duration,
    /// After a stop request, how long the work in hand may take to finish.
    /// The tasks still being worked on then are released (pending again, the
    /// attempt counted) and their messages made visible at once.
    pub shutdown_grace: Duration,
    /// After the grace, how long releasing and the last store and SQS calls
    /// may take: a stop never takes longer than grace + this.
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
