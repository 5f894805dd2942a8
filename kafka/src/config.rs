//! A reply worker service's Kafka side from its settings: [`WorkerConfig`],
//! with the defaults a production service starts from, and
//! [`WorkerConfig::start`], which runs the consumer and the outbox
//! dispatcher in the order a safe start-up needs. With the `clap` feature
//! it is also a set of command-line flags, each with its environment
//! variable (`#[command(flatten)]` it into a service's settings).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::error::KafkaError;
use taskfence::config::Renamed;
use taskfence::runtime::{ConsumerConfig, Stop, Stopped, WorkContext};
use taskfence::{Failure, PgStore, Response};

use crate::{Dispatcher, Handoffs, Journal, KafkaConfig, PgPositions, ReplyConsumer, Results, SpawnError};

/// After the grace, how long releasing the leases and the last saves may take.
pub const RELEASE_DEADLINE: Duration = Duration::from_secs(5);

/// Where partition positions live.
///
/// ```
/// assert_eq!(taskfence_kafka::WorkerConfig::new("kafka:9092").positions, taskfence_kafka::Positions::Group);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Positions {
    /// The consumer group's committed offsets.
    Group,
    /// A PostgreSQL table, saved in each completion's transaction
    /// ([`PgPositions`], [`ReplyConsumer::spawn_with_positions`]).
    Postgres,
}

/// How a reply worker reads the handoff topic, works, publishes and stops:
///
/// | field | flag / variable | default |
/// | --- | --- | --- |
/// | `bootstrap` | `--bootstrap` / `TASKFENCE_KAFKA_BOOTSTRAP` | required |
/// | `topic` | `--topic` / `TASKFENCE_KAFKA_TOPIC` | `taskfence-handoffs` |
/// | `results_topic` | `--results-topic` / `TASKFENCE_KAFKA_RESULTS_TOPIC` | none (not published) |
/// | `group` | `--group` / `TASKFENCE_KAFKA_GROUP` | `taskfence-reply-workers` |
/// | `positions` | `--positions` / `TASKFENCE_POSITIONS` | `group` |
/// | `concurrency` | `--concurrency` / `TASKFENCE_CONCURRENCY` | 16 |
/// | `retry_delay` | `--retry-delay` / `TASKFENCE_RETRY_DELAY` | 1 s |
/// | `session_timeout` | `--session-timeout` / `TASKFENCE_KAFKA_SESSION_TIMEOUT` | 45 s |
/// | `shutdown_grace` | `--shutdown-grace` / `TASKFENCE_SHUTDOWN_GRACE` | 20 s (then [`RELEASE_DEADLINE`]) |
/// | `dispatch` | `--dispatch` / `TASKFENCE_DISPATCH` | `true` |
/// | `dispatch_batch` | `--dispatch-batch` / `TASKFENCE_DISPATCH_BATCH` | 100 |
/// | `producer_batch_records` | `--producer-batch-records` / `TASKFENCE_KAFKA_PRODUCER_BATCH_RECORDS` | librdkafka's |
/// | `dispatch_idle` | `--dispatch-idle` / `TASKFENCE_DISPATCH_IDLE` | 500 ms |
///
/// With the `clap` feature, the former `--per-partition` /
/// `TASKFENCE_PER_PARTITION` is read until 0.3:
/// [`read_former_names`](Self::read_former_names) folds it into `concurrency`
/// (and, a private field then, it rules out a struct literal: start from
/// [`new`](Self::new) and set the fields).
///
/// ```
/// let config = taskfence_kafka::WorkerConfig::new("kafka-1:9092,kafka-2:9092");
/// assert_eq!((config.concurrency, config.shutdown_grace.as_secs()), (16, 20));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct WorkerConfig {
    /// Kafka `bootstrap.servers`.
    #[cfg_attr(feature = "clap", arg(long, env = "TASKFENCE_KAFKA_BOOTSTRAP"))]
    pub bootstrap: String,
    /// The handoff topic.
    #[cfg_attr(
        feature = "clap",
        arg(long, env = "TASKFENCE_KAFKA_TOPIC", default_value = "taskfence-handoffs")
    )]
    pub topic: String,
    /// The results topic: each saved response is published there, keyed by
    /// task id, with the task id and assignment version in the headers
    /// (unset: results are not published).
    #[cfg_attr(feature = "clap", arg(long, env = "TASKFENCE_KAFKA_RESULTS_TOPIC"))]
    pub results_topic: Option<String>,
    /// The consumer group: workers in one group share the partitions.
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            env = "TASKFENCE_KAFKA_GROUP",
            default_value = "taskfence-reply-workers"
        )
    )]
    pub group: String,
    /// Where partition positions live: the group's committed offsets, or a
    /// PostgreSQL table saved in each completion's transaction.
    #[cfg_attr(feature = "clap", arg(long, env = "TASKFENCE_POSITIONS", value_enum, default_value_t = Positions::Group))]
    pub positions: Positions,
    /// Tasks worked on at once (as many again are held claimed and ready).
    #[cfg_attr(
        feature = "clap",
        arg(long, env = "TASKFENCE_CONCURRENCY", default_value_t = 16)
    )]
    pub concurrency: usize,
    /// The former `--per-partition` / `TASKFENCE_PER_PARTITION` (records of
    /// one partition worked on at once), read as `--concurrency` until 0.3.
    #[cfg(feature = "clap")]
    #[arg(
        long = "per-partition",
        env = "TASKFENCE_PER_PARTITION",
        hide = true,
        conflicts_with = "concurrency"
    )]
    per_partition: Option<usize>,
    /// The shortest wait before a record is delivered again (its task busy,
    /// backing off, or its lease lost).
    #[cfg_attr(feature = "clap", arg(long, env = "TASKFENCE_RETRY_DELAY", default_value = "1s", value_parser = taskfence::config::parse_duration))]
    pub retry_delay: Duration,
    /// Kafka `session.timeout.ms`: how long the group waits for a silent member.
    #[cfg_attr(feature = "clap", arg(long, env = "TASKFENCE_KAFKA_SESSION_TIMEOUT", default_value = "45s", value_parser = taskfence::config::parse_duration))]
    pub session_timeout: Duration,
    /// After SIGTERM/SIGINT: how long in-flight tasks may take to finish
    /// before their leases are released (a second signal releases at once).
    /// Keep it under the platform's kill timeout (Kubernetes:
    /// terminationGracePeriodSeconds, 30 s by default) with the release
    /// deadline (5 s) and the final commit to spare.
    #[cfg_attr(feature = "clap", arg(long, env = "TASKFENCE_SHUTDOWN_GRACE", default_value = "20s", value_parser = taskfence::config::parse_duration))]
    pub shutdown_grace: Duration,
    /// Also publish the transactional outbox to the topic from this process
    /// (harmless with several workers: rounds skip each other's rows).
    #[cfg_attr(feature = "clap", arg(long, env = "TASKFENCE_DISPATCH", default_value_t = true, action = clap::ArgAction::Set))]
    pub dispatch: bool,
    /// Handoffs published per dispatch round.
    #[cfg_attr(
        feature = "clap",
        arg(long, env = "TASKFENCE_DISPATCH_BATCH", default_value_t = 100)
    )]
    pub dispatch_batch: usize,
    /// Records per produce batch of a partition (librdkafka
    /// `batch.num.messages`; unset: librdkafka's default). Kafka needs no
    /// limit; `1` is for test brokers that mishandle multi-record batches
    /// (tansu 0.6.0).
    #[cfg_attr(feature = "clap", arg(long, env = "TASKFENCE_KAFKA_PRODUCER_BATCH_RECORDS"))]
    pub producer_batch_records: Option<usize>,
    /// Pause after a dispatch round that found nothing to publish.
    #[cfg_attr(feature = "clap", arg(long, env = "TASKFENCE_DISPATCH_IDLE", default_value = "500ms", value_parser = taskfence::config::parse_duration))]
    pub dispatch_idle: Duration,
}

/// Why [`WorkerConfig::start`] failed: nothing was published, the
/// consumer (if it started) is stopped.
///
/// ```
/// let task = taskfence::TaskId::new();
/// let error = taskfence_kafka::config::StartError::from(taskfence::Error::NotFound(task));
/// assert!(error.to_string().contains("not found"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The positions table could not be created or read.
    #[error(transparent)]
    Store(#[from] taskfence::Error),
    /// A producer could not be created.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// The consumer could not start.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
}

impl WorkerConfig {
    /// The defaults of the table above, reading from `bootstrap`.
    ///
    /// ```
    /// assert!(taskfence_kafka::WorkerConfig::new("kafka:9092").dispatch);
    /// ```
    pub fn new(bootstrap: impl Into<String>) -> Self {
        Self {
            bootstrap: bootstrap.into(),
            topic: "taskfence-handoffs".into(),
            results_topic: None,
            group: "taskfence-reply-workers".into(),
            positions: Positions::Group,
            concurrency: 16,
            #[cfg(feature = "clap")]
            per_partition: None,
            retry_delay: Duration::from_secs(1),
            session_timeout: Duration::from_secs(45),
            shutdown_grace: Duration::from_secs(20),
            dispatch: true,
            dispatch_batch: 100,
            producer_batch_records: None,
            dispatch_idle: Duration::from_millis(500),
        }
    }

    /// Reads the former `--per-partition N` into `concurrency`, returning
    /// its deprecation to log at start-up (`None`: not given).
    ///
    /// The old limit was per assigned partition, the consumer's is per
    /// process: the number of partitions a process holds changes with every
    /// rebalance, so no exact mapping exists. One partition's limit is the
    /// conservative one (never more work at once than before on any
    /// partition).
    ///
    /// ```
    /// assert!(taskfence_kafka::WorkerConfig::new("kafka:9092").read_former_names().is_none());
    /// ```
    pub fn read_former_names(&mut self) -> Option<Renamed> {
        #[cfg(feature = "clap")]
        if let Some(per_partition) = self.per_partition.take() {
            self.concurrency = per_partition;
            let renamed = Renamed::new(
                "--per-partition / TASKFENCE_PER_PARTITION",
                "--concurrency / TASKFENCE_CONCURRENCY",
            );
            return Some(renamed.note(format!(
                "it limited the records of each partition worked on at once, the consumer \
                 limits the whole process: read as --concurrency {per_partition}; with P \
                 partitions per process, set --concurrency {per_partition}×P for the old total"
            )));
        }
        None
    }

    /// Starts the worker `worker_id` on `store` (migrated), its work
    /// function `work`, each step journaled to `journal`, in the order a
    /// safe start-up needs: the positions table (with
    /// [`Positions::Postgres`]: created under a lock, so workers starting
    /// at once run it one after another), the producers, the consumer
    /// (leases of `lease`, stopping within `shutdown_grace` plus
    /// [`RELEASE_DEADLINE`]), and only then, with `dispatch`, the outbox
    /// dispatcher: a worker whose start fails has published nothing.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore, work: fn(taskfence::runtime::WorkContext) -> std::future::Ready<Result<taskfence::Response, taskfence::Failure>>) -> Result<(), taskfence_kafka::config::StartError> {
    /// use std::{sync::Arc, time::Duration};
    /// let config = taskfence_kafka::WorkerConfig::new("kafka:9092");
    /// let journal = Arc::new(taskfence_kafka::TracingJournal);
    /// let worker = config.start(&store, "worker-1", Duration::from_secs(30), journal, work).await?;
    /// worker.stop().request();
    /// let stopped = worker.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub async fn start<F, Fut>(
        &self,
        store: &PgStore,
        worker_id: &str,
        lease: Duration,
        journal: Arc<dyn Journal>,
        work: F,
    ) -> Result<Worker, StartError>
    where
        F: Fn(WorkContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Response, Failure>> + Send + 'static,
    {
        let positions = match self.positions {
            Positions::Group => None,
            Positions::Postgres => Some(Arc::new(PgPositions::new(store, &self.group).await?)),
        };
        let (bootstrap, records) = (&self.bootstrap, self.producer_batch_records);
        let handoffs = match self.dispatch {
            true => Some(Handoffs::with_records_per_batch(
                bootstrap,
                &self.topic,
                Arc::clone(&journal),
                records,
            )?),
            false => None,
        };
        let mut kafka = KafkaConfig::new(bootstrap, &self.group, &self.topic, worker_id);
        kafka.session_timeout = self.session_timeout;
        if let Some(topic) = &self.results_topic {
            kafka = kafka.publish_results(Arc::new(Results::new(bootstrap, topic, records)?));
        }
        let config = ConsumerConfig::new(worker_id, lease)
            .concurrency(self.concurrency)
            .min_retry_delay(self.retry_delay)
            .stop_after(self.shutdown_grace, RELEASE_DEADLINE);
        let tasks = Arc::new(store.clone());
        let consumer = match positions {
            None => ReplyConsumer::spawn(kafka, tasks, config, journal, work)?,
            Some(positions) => {
                ReplyConsumer::spawn_with_positions(kafka, config, tasks, positions, journal, work)?
            }
        };
        let stop = consumer.stop().clone();
        let dispatcher = handoffs.map(|handoffs| {
            let dispatcher = Dispatcher::new(store.clone(), Arc::new(handoffs), self.dispatch_batch);
            tokio::spawn(dispatcher.run(stop, self.dispatch_idle))
        });
        Ok(Worker { consumer, dispatcher })
    }
}

/// A worker [`WorkerConfig::start`] started: the consumer and, with
/// `dispatch`, the outbox dispatcher beside it.
///
/// ```no_run
/// # async fn f(worker: taskfence_kafka::config::Worker) {
/// worker.stop().request(); // what a SIGTERM handler does
/// let stopped = worker.shutdown().await;
/// println!("{} completed, {} released", stopped.completed, stopped.released);
/// # }
/// ```
pub struct Worker {
    consumer: ReplyConsumer,
    dispatcher: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("assigned", &self.assigned())
            .field("dispatching", &self.dispatcher.is_some())
            .finish()
    }
}

impl Worker {
    /// The stop switch: the first request drains (the grace), a second
    /// releases at once. The dispatcher stops at the first.
    ///
    /// ```no_run
    /// # fn f(worker: &taskfence_kafka::config::Worker) {
    /// let stop = worker.stop().clone();
    /// # }
    /// ```
    pub fn stop(&self) -> &Stop {
        self.consumer.stop()
    }

    /// Partitions the consumer owns now.
    ///
    /// ```no_run
    /// # fn f(worker: &taskfence_kafka::config::Worker) {
    /// println!("{:?}", worker.assigned());
    /// # }
    /// ```
    pub fn assigned(&self) -> Vec<i32> {
        self.consumer.assigned()
    }

    /// Stops (draining), waits for the consumer to leave the group (its
    /// revoke commits the safe positions) and for the dispatcher; returns
    /// what the consumer did.
    ///
    /// ```no_run
    /// # async fn f(worker: taskfence_kafka::config::Worker) {
    /// let stopped = worker.shutdown().await;
    /// # }
    /// ```
    pub async fn shutdown(self) -> Stopped {
        let stopped = self.consumer.shutdown().await;
        if let Some(dispatcher) = self.dispatcher {
            let _ = dispatcher.await;
        }
        stopped
    }
}

#[cfg(all(test, feature = "clap"))]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Service {
        #[command(flatten)]
        worker: WorkerConfig,
    }

    fn parse(args: &[&str]) -> Result<Service, clap::Error> {
        Service::try_parse_from(["service", "--bootstrap=kafka:9092"].iter().chain(args))
    }

    #[test]
    fn the_flags_default_to_the_documented_values() {
        let mut flags = parse(&[]).unwrap().worker;
        assert_eq!(flags.read_former_names(), None);
        assert_eq!(flags, WorkerConfig::new("kafka:9092"));
        let flags = parse(&[
            "--dispatch=false",
            "--shutdown-grace=3s",
            "--results-topic=replies",
        ]);
        let flags = flags.unwrap().worker;
        assert!(!flags.dispatch);
        assert_eq!(flags.results_topic.as_deref(), Some("replies"));
        assert_eq!(flags.shutdown_grace, Duration::from_secs(3));
    }

    #[test]
    fn the_former_per_partition_flag_sets_the_concurrency_with_a_warning() {
        let mut flags = parse(&["--per-partition", "4"]).unwrap().worker;
        let renamed = flags.read_former_names().expect("a deprecation");
        assert_eq!(flags.concurrency, 4);
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
        assert!(parse(&["--per-partition=4", "--concurrency=8"]).is_err());
        let mut flags = parse(&["--concurrency=8"]).unwrap().worker;
        assert_eq!((flags.read_former_names(), flags.concurrency), (None, 8));
    }
}
