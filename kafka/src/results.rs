//! Saved results on a topic: after the fenced completion, the consumer
//! publishes each saved response, keyed by task id, with the [`Stamp`] of
//! the assignment that saved it in the headers ([`Results`]); and what a
//! downstream consumer of that topic does ([`Downstream`]).
//!
//! A result is published only once its completion is durable, and before
//! the handoff record's offset may move past it: a crash or a failed publish
//! leaves the record unfinished, it is delivered again, its claim finds the
//! task completed, and the saved result goes out again. At least once: the
//! topic may hold copies of one result (same task, same version), and, after
//! an operator's `reopen`, results of several assignments of one task in any
//! order. [`Downstream`] keeps only the newest assignment of each task.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use taskfence::Task;
use taskfence::wire::{NewestPerTask, Stamp, StampError};

use crate::dispatcher::{stamp, stamp_headers};

/// Publishes saved results to one topic.
pub struct Results {
    producer: FutureProducer,
    topic: String,
}

impl Results {
    /// A producer for `topic` on the brokers at `bootstrap` (`acks=all`),
    /// with at most `records` records per produce batch of a partition
    /// (`None`: librdkafka's default; see
    /// [`Handoffs::with_records_per_batch`](crate::Handoffs::with_records_per_batch)).
    pub fn new(bootstrap: &str, topic: &str, records: Option<usize>) -> Result<Self, KafkaError> {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", bootstrap)
            .set("acks", "all")
            .set("message.timeout.ms", "30000");
        if let Some(records) = records {
            config.set("batch.num.messages", records.max(1).to_string());
        }
        Ok(Self {
            producer: config.create()?,
            topic: topic.to_owned(),
        })
    }

    /// The topic results go to.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Publishes `task`'s saved response (the record's payload; empty if it
    /// has none), keyed by task id, stamped with the task's version (the
    /// assignment that saved it), and waits for the broker's
    /// acknowledgement; returns where it landed.
    pub async fn publish(&self, task: &Task) -> Result<(i32, i64), KafkaError> {
        let id = task.id.to_string();
        let payload = task.response.as_ref().map_or(&[][..], |r| r.as_bytes());
        let record = FutureRecord::to(&self.topic)
            .key(&id)
            .payload(payload)
            .headers(stamp_headers(&Stamp::from(task)));
        let delivery = self
            .producer
            .send(record, Duration::from_secs(30))
            .await
            .map_err(|(error, _message)| error)?;
        Ok((delivery.partition, delivery.offset))
    }
}

impl std::fmt::Debug for Results {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Results")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

/// What a downstream consumer of the results topic does with each record:
/// reads its [`Stamp`] and keeps it only if no newer assignment of its task
/// came before ([`NewestPerTask`]). Copies of the same assignment are kept:
/// apply them idempotently (by task id and version).
///
/// ```
/// use taskfence_kafka::results::{Downstream, Verdict};
/// use rdkafka::message::{OwnedMessage, Timestamp};
/// use taskfence::wire::Stamp;
/// let id = taskfence::TaskId::new();
/// let record = |version| {
///     let headers = taskfence_kafka::dispatcher::stamp_headers(&Stamp::new(id, version));
///     OwnedMessage::new(None, None, "results".into(), Timestamp::NotAvailable, 0, 0, Some(headers))
/// };
/// let mut downstream = Downstream::new(100_000);
/// assert_eq!(downstream.judge(&record(3)), Verdict::Keep(Stamp::new(id, 3)));
/// assert_eq!(downstream.judge(&record(2)), Verdict::Stale(Stamp::new(id, 2)));
/// ```
#[derive(Debug, Clone)]
pub struct Downstream {
    newest: NewestPerTask,
}

/// What [`Downstream::judge`] decided about one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The newest assignment of its task seen so far (or a copy of it): apply it.
    Keep(Stamp),
    /// An older assignment than one already seen: skip it.
    Stale(Stamp),
    /// No valid stamp (not from this template): skip it, or dead-letter it.
    Unstamped(StampError),
}

impl Downstream {
    /// Remembers the newest version of up to `tasks` tasks (the least
    /// recently seen forgotten first).
    pub fn new(tasks: usize) -> Self {
        Self {
            newest: NewestPerTask::with_capacity(tasks),
        }
    }

    /// Judges one record of the results topic.
    pub fn judge<M: Message>(&mut self, record: &M) -> Verdict {
        match stamp(record) {
            Ok(stamp) if self.newest.observe(stamp) => Verdict::Keep(stamp),
            Ok(stamp) => Verdict::Stale(stamp),
            Err(error) => Verdict::Unstamped(error),
        }
    }
}
