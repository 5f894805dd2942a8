//! Shared by the Kafka tests: what `taskfence-test-support` does not have
//! because it needs rdkafka (reading a group's offsets and a topic's
//! records), a timed wait, and the setup the service tests have in common
//! (a broker, a schema, a topic and group of their own, submitted tasks, the
//! service binary as a child process).
#![allow(dead_code)]

use std::future::Future;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use taskfence::testing::{PgFixture, task_in};
use taskfence::{PgStore, Task, TaskId, TaskStore};
use taskfence_kafka::ensure_topic;
use taskfence_test_support::process::ChildProcess;

pub(crate) use taskfence_test_support::kafka::KafkaBroker;

/// Waits (bounded by `within`) until `check` holds, polling every 100 ms (the
/// checks read many tasks and ask the broker); returns how long it took, for
/// the figures.
pub(crate) async fn wait_until<Fut>(what: &str, within: Duration, mut check: impl FnMut() -> Fut) -> Duration
where
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    eprintln!("waiting (at most {within:?}) for {what}");
    taskfence_test_support::eventually_every(within, Duration::from_millis(100), || {
        let holds = check();
        async move { holds.await.then_some(()) }
    })
    .await;
    start.elapsed()
}

/// A topic and a consumer group of this run's own.
pub(crate) fn topic_and_group() -> (String, String) {
    let run = TaskId::new();
    (format!("handoffs-{run}"), format!("reply-workers-{run}"))
}

/// What the tests of the service binary start from: a broker, a fresh
/// schema, a topic and group of their own, and the tasks submitted before
/// the service starts (its dispatcher publishes them from the outbox).
pub(crate) struct ServiceRun {
    pub broker: KafkaBroker,
    pub fixture: PgFixture,
    pub topic: String,
    pub group: String,
    /// As submitted, in payload order.
    pub tasks: Vec<Task>,
}

impl ServiceRun {
    /// Creates the topic with `partitions` partitions and submits one task per payload.
    pub(crate) async fn start(partitions: i32, payloads: impl IntoIterator<Item = String>) -> Self {
        let broker = KafkaBroker::start();
        let fixture = taskfence_test_support::fixture().await;
        let (topic, group) = topic_and_group();
        ensure_topic(broker.bootstrap(), &topic, partitions)
            .await
            .expect("topic");
        let mut tasks = Vec::new();
        for (i, payload) in payloads.into_iter().enumerate() {
            let submitted = fixture
                .pg_store()
                .submit(task_in("user-1", &format!("req-{i}")).payload(payload))
                .await;
            tasks.push(submitted.expect("submit").into_task());
        }
        Self {
            broker,
            fixture,
            topic,
            group,
            tasks,
        }
    }

    /// The store the service works on.
    pub(crate) fn pg(&self) -> &PgStore {
        self.fixture.pg_store()
    }

    /// Starts the `kafka-worker` binary as `worker` on this run's database,
    /// schema, broker, topic and group, with the simulated provider, then
    /// `args`; `env` on top of an environment that leaks no settings in
    /// (`RUST_LOG` is passed through it: `tests/service.rs` checks it took
    /// effect). Logs to a temporary file, whose path it returns too.
    pub(crate) fn service(
        &self,
        worker: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> (ChildProcess, PathBuf) {
        let log_path = std::env::temp_dir().join(format!("kafka-worker-{worker}-{}.log", self.topic));
        eprintln!("{worker} log: {}", log_path.display());
        let log = std::fs::File::create(&log_path).expect("log file");
        #[rustfmt::skip]
        let shared = [
            "--database-url", self.fixture.url(), "--schema", self.fixture.schema(),
            "--bootstrap", self.broker.bootstrap(), "--topic", &self.topic, "--group", &self.group,
            "--worker-id", worker, "--provider", "simulated", "--dispatch-idle", "200ms",
            // tansu 0.6.0 mishandles multi-record produce batches.
            "--producer-batch-records", "1",
        ];
        let process = ChildProcess::spawn(
            worker,
            Command::new(env!("CARGO_BIN_EXE_kafka-worker"))
                .args(shared)
                .args(args)
                .env_remove("DATABASE_URL")
                .env_remove("TASKFENCE_KAFKA_BOOTSTRAP")
                .env("RUST_LOG", "info,kafka_worker=debug,taskfence_kafka=debug")
                .envs(env.iter().copied())
                .stdout(Stdio::from(log.try_clone().expect("log")))
                .stderr(Stdio::from(log)),
        );
        (process, log_path)
    }
}

/// Reads a group's committed offsets and the partitions' end offsets, without
/// joining the group.
pub(crate) struct GroupProbe {
    consumer: BaseConsumer,
    topic: String,
    partitions: i32,
}

impl GroupProbe {
    pub(crate) fn new(bootstrap: &str, group: &str, topic: &str, partitions: i32) -> Self {
        let consumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()
            .expect("probe consumer");
        Self {
            consumer,
            topic: topic.to_owned(),
            partitions,
        }
    }

    /// `(committed, end)` per partition; `committed` is `None` before any commit.
    pub(crate) fn positions(&self) -> Vec<(Option<i64>, i64)> {
        let mut tpl = TopicPartitionList::new();
        for p in 0..self.partitions {
            tpl.add_partition(&self.topic, p);
        }
        let committed = self
            .consumer
            .committed_offsets(tpl, Duration::from_secs(10))
            .expect("committed offsets");
        (0..self.partitions)
            .map(|p| {
                let c = match committed.find_partition(&self.topic, p).map(|e| e.offset()) {
                    Some(Offset::Offset(o)) => Some(o),
                    _ => None,
                };
                let (_low, high) = self
                    .consumer
                    .fetch_watermarks(&self.topic, p, Duration::from_secs(10))
                    .expect("watermarks");
                (c, high)
            })
            .collect()
    }
}

/// Every record of `topic` (partitions `0..partitions`) up to the current
/// end: `(partition, offset, payload)`. Reads without a group (manual
/// assignment), so it commits nothing and joins nothing.
pub(crate) fn read_topic(bootstrap: &str, topic: &str, partitions: i32) -> Vec<(i32, i64, Option<Vec<u8>>)> {
    use rdkafka::message::Message;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("{topic}-reader"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("reader consumer");
    let mut tpl = TopicPartitionList::new();
    let mut ends = Vec::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("partition");
        let (_low, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .expect("watermarks");
        ends.push(high);
    }
    consumer.assign(&tpl).expect("assign");
    let mut records = Vec::new();
    let mut next: Vec<i64> = vec![0; partitions as usize];
    let deadline = Instant::now() + Duration::from_secs(60);
    while next.iter().zip(&ends).any(|(n, end)| n < end) {
        assert!(
            Instant::now() < deadline,
            "reading {topic}: only at {next:?} of {ends:?}"
        );
        let Some(message) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let message = message.expect("fetch");
        let p = message.partition();
        next[p as usize] = message.offset() + 1;
        records.push((p, message.offset(), message.payload().map(<[u8]>::to_vec)));
    }
    records
}
