//! Shared by the Kafka tests: what `taskfence-test-support` does not have
//! because it needs rdkafka (reading a group's offsets), plus a timed wait.
#![allow(dead_code)]

use std::future::Future;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

pub use taskfence_test_support::kafka::KafkaBroker;

/// Waits (bounded by `within`) until `check` holds; returns how long it took,
/// for the figures.
pub async fn wait_until<Fut>(what: &str, within: Duration, mut check: impl FnMut() -> Fut) -> Duration
where
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    eprintln!("waiting (at most {within:?}) for {what}");
    taskfence_test_support::eventually(within, || {
        let holds = check();
        async move { holds.await.then_some(()) }
    })
    .await;
    start.elapsed()
}

/// Reads a group's committed offsets and the partitions' end offsets, without
/// joining the group.
pub struct GroupProbe {
    consumer: BaseConsumer,
    topic: String,
    partitions: i32,
}

impl GroupProbe {
    pub fn new(bootstrap: &str, group: &str, topic: &str, partitions: i32) -> Self {
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
    pub fn positions(&self) -> Vec<(Option<i64>, i64)> {
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
pub fn read_topic(bootstrap: &str, topic: &str, partitions: i32) -> Vec<(i32, i64, Option<Vec<u8>>)> {
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
