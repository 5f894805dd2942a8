//! How an SQS worker receives, hides and stops ([`WorkerConfig`]) and
//! publishes its outbox ([`DispatchConfig`]), with the defaults a
//! production service starts from. With the `clap` feature each is also a
//! set of command-line flags, each with its environment variable
//! (`#[command(flatten)]` it into a service's settings), durations read by
//! [`parse_duration`].

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
/// or a number of seconds (`1.5`); taskfence's own, re-exported here.
///
/// ```
/// use std::time::Duration;
/// use taskfence_sqs::config::parse_duration;
/// assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
/// ```
pub use taskfence::config::parse_duration;

/// Whether and how a service publishes its transactional outbox (and
/// republishes due tasks) to the queue, with the defaults a production
/// service starts from:
///
/// | field | flag / variable | default | what |
/// | --- | --- | --- | --- |
/// | `dispatch` | `--dispatch` / `TASKFENCE_DISPATCH` | `false` | publish from this process (it needs `sqs:SendMessage`) |
/// | `dispatch_batch` | `--dispatch-batch` / `TASKFENCE_DISPATCH_BATCH` | 100 | handoffs per round |
/// | `dispatch_idle` | `--dispatch-idle` / `TASKFENCE_DISPATCH_IDLE` | 500 ms | wait after a round that found nothing |
/// | `republish_interval` | `--republish-interval` / `TASKFENCE_REPUBLISH_INTERVAL` | 30 s | how often due tasks are published again |
///
/// With the `clap` feature, `--redispatch-interval` /
/// `TASKFENCE_REDISPATCH_INTERVAL`, the former name of the last one, is
/// read until 0.3: [`read_former_names`](Self::read_former_names) folds it in
/// (and, a private field then, it rules out a struct literal: start from
/// [`Default`] and set the fields).
///
/// ```
/// let mut config = taskfence_sqs::DispatchConfig::default();
/// config.dispatch = true;
/// assert_eq!(config.republish_interval.as_secs(), 30);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct DispatchConfig {
    /// Also publish the transactional outbox to the queue from this process
    /// (`--dispatch true`; several processes may: on PostgreSQL they share
    /// the outbox, on DynamoDB they may send a handoff twice, which is
    /// harmless). Off by default: it needs `sqs:SendMessage` too.
    #[cfg_attr(feature = "clap", arg(long, env = "TASKFENCE_DISPATCH", default_value_t = false, action = clap::ArgAction::Set))]
    pub dispatch: bool,
    /// Handoffs per dispatcher round.
    #[cfg_attr(
        feature = "clap",
        arg(long, env = "TASKFENCE_DISPATCH_BATCH", default_value_t = 100)
    )]
    pub dispatch_batch: usize,
    /// How long the dispatcher waits after a round that found nothing: the
    /// delay from a commit to its message when the outbox is idle.
    #[cfg_attr(feature = "clap", arg(long, env = "TASKFENCE_DISPATCH_IDLE", default_value = "500ms", value_parser = parse_duration))]
    pub dispatch_idle: Duration,
    /// With --dispatch: how often to publish again the tasks that are due
    /// (a backoff that passed, an expired lease, an operator's reopening)
    /// for which the queue may hold no message any more.
    #[cfg_attr(feature = "clap", arg(long, env = "TASKFENCE_REPUBLISH_INTERVAL", default_value = "30s", value_parser = parse_duration))]
    pub republish_interval: Duration,
    /// The former name of --republish-interval (and of its variable).
    #[cfg(feature = "clap")]
    #[arg(
        long = "redispatch-interval",
        env = "TASKFENCE_REDISPATCH_INTERVAL",
        hide = true,
        value_parser = parse_duration,
        conflicts_with = "republish_interval"
    )]
    redispatch_interval: Option<Duration>,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        Self {
            dispatch: false,
            dispatch_batch: 100,
            dispatch_idle: Duration::from_millis(500),
            republish_interval: Duration::from_secs(30),
            #[cfg(feature = "clap")]
            redispatch_interval: None,
        }
    }
}

impl DispatchConfig {
    /// Reads the former `--redispatch-interval` into `republish_interval`,
    /// returning its deprecation to log at start-up (`None`: not given).
    ///
    /// ```
    /// let mut config = taskfence_sqs::DispatchConfig::default();
    /// assert!(config.read_former_names().is_none());
    /// ```
    pub fn read_former_names(&mut self) -> Option<taskfence::config::Renamed> {
        #[cfg(feature = "clap")]
        if let Some(interval) = self.redispatch_interval.take() {
            self.republish_interval = interval;
            return Some(taskfence::config::Renamed::new(
                "--redispatch-interval / TASKFENCE_REDISPATCH_INTERVAL",
                "--republish-interval / TASKFENCE_REPUBLISH_INTERVAL",
            ));
        }
        None
    }

    /// With `dispatch`, runs `dispatcher` (its idle wait set to
    /// `dispatch_idle`) and its republish loop (every `republish_interval`)
    /// in tasks of their own until [`Publishing::stop`]; without, nothing.
    ///
    /// ```no_run
    /// # async fn f(dispatcher: taskfence_sqs::Dispatcher) {
    /// let mut config = taskfence_sqs::DispatchConfig::default();
    /// config.dispatch = true;
    /// let publishing = config.start(dispatcher);
    /// // … serve until a stop is requested, then:
    /// let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    /// publishing.stop(deadline).await;
    /// # }
    /// ```
    pub fn start(&self, dispatcher: crate::Dispatcher) -> Publishing {
        let (shutdown, stopping) = tokio::sync::watch::channel(false);
        let mut loops = Vec::new();
        if self.dispatch {
            let outbox = dispatcher.idle(self.dispatch_idle);
            let every = self.redispatch_interval_or_current();
            loops.push(tokio::spawn(
                outbox.clone().run_republish(every, stopping.clone()),
            ));
            loops.push(tokio::spawn(outbox.run(stopping)));
        }
        Publishing { shutdown, loops }
    }

    fn redispatch_interval_or_current(&self) -> Duration {
        #[cfg(feature = "clap")]
        if let Some(interval) = self.redispatch_interval {
            return interval;
        }
        self.republish_interval
    }
}

/// The publishing loops [`DispatchConfig::start`] started (none without
/// `dispatch`).
///
/// ```no_run
/// # async fn f(publishing: taskfence_sqs::config::Publishing) {
/// println!("{} loops", publishing.loops());
/// # }
/// ```
#[derive(Debug)]
pub struct Publishing {
    shutdown: tokio::sync::watch::Sender<bool>,
    loops: Vec<tokio::task::JoinHandle<()>>,
}

impl Publishing {
    /// How many loops run: 2 with `dispatch` (the outbox, the republish), else 0.
    ///
    /// ```no_run
    /// # fn f(publishing: taskfence_sqs::config::Publishing) {
    /// assert!(publishing.loops() <= 2);
    /// # }
    /// ```
    pub fn loops(&self) -> usize {
        self.loops.len()
    }

    /// Stops the loops and waits for them until `deadline`, abandoning (with
    /// a warning) one that has not stopped by then: a round cut short only
    /// means its handoffs are sent again later.
    ///
    /// ```no_run
    /// # async fn f(publishing: taskfence_sqs::config::Publishing) {
    /// publishing.stop(tokio::time::Instant::now()).await;
    /// # }
    /// ```
    pub async fn stop(self, deadline: tokio::time::Instant) {
        let _ = self.shutdown.send(true);
        for task in self.loops {
            if tokio::time::timeout_at(deadline, task).await.is_err() {
                tracing::warn!("a dispatcher did not stop in time; abandoning it");
            }
        }
    }
}

#[cfg(all(test, feature = "clap"))]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Service {
        #[command(flatten)]
        dispatch: DispatchConfig,
    }

    #[test]
    fn the_former_republish_flag_still_sets_the_interval_with_a_warning() {
        let parse = |extra: &[&str]| {
            Service::try_parse_from(std::iter::once(&"service").chain(extra)).map(|mut s| {
                let renamed = s.dispatch.read_former_names();
                (s.dispatch.republish_interval, renamed.map(|r| r.warning()))
            })
        };
        assert_eq!(parse(&[]).unwrap(), (Duration::from_secs(30), None));
        assert_eq!(
            parse(&["--republish-interval", "5s"]).unwrap(),
            (Duration::from_secs(5), None)
        );
        let (interval, warning) = parse(&["--redispatch-interval", "7s"]).unwrap();
        assert_eq!(interval, Duration::from_secs(7));
        let warning = warning.expect("a deprecation");
        assert!(warning.contains("removed in 0.3") && warning.contains("--republish-interval"));
        assert!(parse(&["--republish-interval", "5s", "--redispatch-interval", "7s"]).is_err());
    }

    #[test]
    fn the_former_name_counts_also_when_not_read_in() {
        let s = Service::try_parse_from(["service", "--redispatch-interval", "7s"]).unwrap();
        assert_eq!(
            s.dispatch.redispatch_interval_or_current(),
            Duration::from_secs(7)
        );
    }
}
