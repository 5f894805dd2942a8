//! The dispatcher: publishes the handoffs that `submit` wrote to PostgreSQL's
//! outbox in the same transaction as the task, one record per task, keyed by
//! task id, with the task's [`Stamp`] (id and assignment version as the
//! dispatcher read it) in the record headers.
//!
//! A handoff says only "go work on task X": the payload is the task id, the
//! work itself lives in the store. Keying by task id sends every copy of one
//! task's handoff to the same partition, so duplicates of a task are seen by
//! one consumer at a time; publishing a handoff twice is harmless by
//! construction (the claim settles it).

use std::sync::Arc;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use taskfence::runtime::Stop;
use taskfence::wire::Stamp;
use taskfence::{PgStore, TaskId};

use crate::journal::{Event, Journal};

/// Reads the task id out of a handoff record's payload.
///
/// ```
/// use taskfence_kafka::dispatcher::task_id;
/// let id = taskfence::TaskId::new();
/// assert_eq!(task_id(Some(id.to_string().as_bytes())), Some(id));
/// assert_eq!(task_id(Some(b"not a task")), None);
/// assert_eq!(task_id(None), None);
/// ```
pub fn task_id(payload: Option<&[u8]>) -> Option<TaskId> {
    std::str::from_utf8(payload?).ok()?.trim().parse().ok()
}

/// The record headers that carry `stamp` (`taskfence-task-id`, `taskfence-version`).
///
/// ```
/// use rdkafka::message::Headers;
/// use taskfence::wire::Stamp;
/// let stamp = Stamp::new(taskfence::TaskId::new(), 2);
/// let headers = taskfence_kafka::dispatcher::stamp_headers(&stamp);
/// let pairs = headers.iter().map(|h| (h.key, h.value.unwrap_or_default()));
/// assert_eq!(Stamp::from_headers(pairs), Ok(stamp));
/// ```
pub fn stamp_headers(stamp: &Stamp) -> OwnedHeaders {
    stamp
        .headers()
        .iter()
        .fold(OwnedHeaders::new_with_capacity(2), |headers, (key, value)| {
            headers.insert(Header {
                key,
                value: Some(value.as_bytes()),
            })
        })
}

/// Reads the [`Stamp`] out of a record's headers.
///
/// ```
/// use rdkafka::message::{Message, OwnedMessage, Timestamp};
/// use taskfence::wire::{Stamp, StampError};
/// let stamp = Stamp::new(taskfence::TaskId::new(), 3);
/// let headers = Some(taskfence_kafka::dispatcher::stamp_headers(&stamp));
/// let record = OwnedMessage::new(None, None, "t".into(), Timestamp::NotAvailable, 0, 0, headers);
/// assert_eq!(taskfence_kafka::dispatcher::stamp(&record), Ok(stamp));
/// let bare = OwnedMessage::new(None, None, "t".into(), Timestamp::NotAvailable, 0, 0, None);
/// assert!(matches!(taskfence_kafka::dispatcher::stamp(&bare), Err(StampError::Missing { .. })));
/// ```
pub fn stamp<M: rdkafka::message::Message>(record: &M) -> Result<Stamp, taskfence::wire::StampError> {
    use rdkafka::message::Headers;
    let headers = record.headers().into_iter().flat_map(|h| h.iter());
    Stamp::from_headers(headers.map(|h| (h.key, h.value.unwrap_or_default())))
}

/// Publishes handoff records to one topic.
pub struct Handoffs {
    producer: FutureProducer,
    topic: String,
    journal: Arc<dyn Journal>,
}

impl Handoffs {
    /// A producer for `topic` on the brokers at `bootstrap` (`acks=all`:
    /// a handoff counts as published once every in-sync replica has it).
    pub fn new(bootstrap: &str, topic: &str, journal: Arc<dyn Journal>) -> Result<Self, KafkaError> {
        Self::with_records_per_batch(bootstrap, topic, journal, None)
    }

    /// Like [`new`](Self::new), with at most `records` records in one
    /// produce batch of a partition (librdkafka's `batch.num.messages`;
    /// `None`: librdkafka's default). Kafka needs no limit. `Some(1)` is for
    /// brokers that mishandle multi-record batches: tansu 0.6.0, which the
    /// tests run on, reports a partition's end as the last batch's base
    /// offset + 1 and returns nothing to a fetch starting inside a batch.
    pub fn with_records_per_batch(
        bootstrap: &str,
        topic: &str,
        journal: Arc<dyn Journal>,
        records: Option<usize>,
    ) -> Result<Self, KafkaError> {
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
            journal,
        })
    }

    /// Publishes the handoff for `stamp`'s task (the stamp in its headers)
    /// and waits for the broker's acknowledgement; returns where it landed.
    pub async fn publish(&self, stamp: Stamp) -> Result<(i32, i64), KafkaError> {
        let (task, id) = (stamp.task_id, stamp.task_id.to_string());
        let record = FutureRecord::to(&self.topic)
            .key(&id)
            .payload(&id)
            .headers(stamp_headers(&stamp));
        let delivery = self
            .producer
            .send(record, Duration::from_secs(30))
            .await
            .map_err(|(error, _message)| error)?;
        self.journal.record(Event::Produced {
            partition: delivery.partition,
            offset: delivery.offset,
            task,
        });
        Ok((delivery.partition, delivery.offset))
    }

    /// Publishes one handoff per task, all queued at once, then waits for
    /// every delivery report; returns where each landed, in order. `Ok` only
    /// once the broker acknowledged all of them. On an error the reports of
    /// the records already queued are still awaited (the ones that landed are
    /// journaled), then the first error is returned: the caller publishes the
    /// whole batch again, and the extra copies are harmless.
    pub async fn publish_batch(&self, tasks: &[Stamp]) -> Result<Vec<(i32, i64)>, KafkaError> {
        let mut queued = Vec::with_capacity(tasks.len());
        let mut failed = None;
        for stamp in tasks {
            let (task, id) = (stamp.task_id, stamp.task_id.to_string());
            let record = FutureRecord::to(&self.topic)
                .key(&id)
                .payload(&id)
                .headers(stamp_headers(stamp));
            match self.producer.send_result(record) {
                Ok(delivery) => queued.push((task, delivery)),
                Err((error, _record)) => {
                    failed = Some(error);
                    break;
                }
            }
        }
        let mut landed = Vec::with_capacity(queued.len());
        for (task, delivery) in queued {
            match delivery.await {
                Ok(Ok(delivery)) => {
                    self.journal.record(Event::Produced {
                        partition: delivery.partition,
                        offset: delivery.offset,
                        task,
                    });
                    landed.push((delivery.partition, delivery.offset));
                }
                Ok(Err((error, _message))) => {
                    failed.get_or_insert(error);
                }
                Err(_canceled) => {
                    failed.get_or_insert(KafkaError::Canceled);
                }
            }
        }
        match failed {
            Some(error) => Err(error),
            None => Ok(landed),
        }
    }
}

impl std::fmt::Debug for Handoffs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handoffs")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

/// Moves pending handoffs from the outbox to the topic.
///
/// Each round claims up to `limit` handoffs with `FOR UPDATE SKIP LOCKED` (so
/// several dispatchers share the outbox) and publishes them
/// [`publish_batch`](Self::publish_batch) at a time through
/// [`PgStore::dispatch_batches`]: every record of a batch is queued at once and
/// the batch counts only once the broker acknowledged all of them; the
/// published ones are marked in the same transaction. A failed batch stays
/// pending whole and ends the round. A publish whose acknowledgement is lost,
/// or a crash after publishing and before the commit, publishes them again
/// next round: every copy names the same task, and the claim makes them
/// harmless.
#[derive(Debug, Clone)]
pub struct Dispatcher {
    store: PgStore,
    handoffs: Arc<Handoffs>,
    limit: usize,
    batch: usize,
}

impl Dispatcher {
    /// Handoffs produced per publish call unless [`publish_batch`](Self::publish_batch) says otherwise.
    pub const PUBLISH_BATCH: usize = 100;

    /// A dispatcher from `store`'s outbox to `handoffs`, `limit` per round,
    /// published [`PUBLISH_BATCH`](Self::PUBLISH_BATCH) at a time.
    pub fn new(store: PgStore, handoffs: Arc<Handoffs>, limit: usize) -> Self {
        Self {
            store,
            handoffs,
            limit,
            batch: Self::PUBLISH_BATCH,
        }
    }

    /// Publishes `batch` handoffs per call (at least 1, at most
    /// [`taskfence::limits::MAX_BATCH`]).
    pub fn publish_batch(mut self, batch: usize) -> Self {
        self.batch = batch.clamp(1, taskfence::limits::MAX_BATCH);
        self
    }

    /// One round; returns the tasks published and marked. A failed batch
    /// ends the round early; it stays pending, whole, for the next one.
    pub async fn round(&self) -> taskfence::Result<Vec<TaskId>> {
        let handoffs = &self.handoffs;
        let round = self
            .store
            .dispatch_batches(self.limit, self.batch, |tasks| async move {
                handoffs.publish_batch(&tasks).await.map(|_| ())
            })
            .await?;
        if let Some((task, error)) = round.failed {
            tracing::warn!(first = %task, %error, "publishing a batch of handoffs failed; the next round retries it");
        }
        Ok(round.published)
    }

    /// Runs rounds until `stop` is requested, waiting `idle` after a round
    /// that found nothing to publish.
    pub async fn run(self, stop: Stop, idle: Duration) {
        while !stop.is_requested() {
            let wait = match self.round().await {
                Ok(published) if !published.is_empty() => Duration::ZERO,
                Ok(_) => idle,
                Err(error) => {
                    tracing::warn!(%error, "dispatch round failed");
                    idle
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                () = stop.requested() => break,
            }
        }
    }
}

/// Creates `topic` with `partitions` partitions (replication 1) unless it
/// exists: for local runs and tests; production topics are provisioned.
pub async fn ensure_topic(bootstrap: &str, topic: &str, partitions: i32) -> Result<(), KafkaError> {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", bootstrap).create()?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for result in admin.create_topics([&new], &options).await? {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => return Err(KafkaError::AdminOp(code)),
        }
    }
    Ok(())
}
