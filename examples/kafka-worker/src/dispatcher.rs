//! The dispatcher: publishes the handoffs that `submit` wrote to PostgreSQL's
//! outbox in the same transaction as the task, one record per task, keyed by
//! task id.
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
use rdkafka::producer::{FutureProducer, FutureRecord};
use taskfence::{PgStore, TaskId};
use tokio::sync::watch;

use crate::journal::{Event, Journal};

/// Reads the task id out of a handoff record's payload.
///
/// ```
/// use kafka_worker::dispatcher::task_id;
/// let id = taskfence::TaskId::new();
/// assert_eq!(task_id(Some(id.to_string().as_bytes())), Some(id));
/// assert_eq!(task_id(Some(b"not a task")), None);
/// assert_eq!(task_id(None), None);
/// ```
pub fn task_id(payload: Option<&[u8]>) -> Option<TaskId> {
    std::str::from_utf8(payload?).ok()?.trim().parse().ok()
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
        let producer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("acks", "all")
            .set("message.timeout.ms", "30000")
            .create()?;
        Ok(Self {
            producer,
            topic: topic.to_owned(),
            journal,
        })
    }

    /// Publishes the handoff for `task` and waits for the broker's
    /// acknowledgement; returns where it landed.
    pub async fn publish(&self, task: TaskId) -> Result<(i32, i64), KafkaError> {
        let id = task.to_string();
        let record = FutureRecord::to(&self.topic).key(&id).payload(&id);
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
/// Each round claims up to `batch` handoffs with `FOR UPDATE SKIP LOCKED` (so
/// several dispatchers share the outbox), publishes one record per task, and
/// marks them published in the same transaction. A publish whose
/// acknowledgement is lost, or a crash after publishing and before the commit,
/// publishes them again next round: every copy names the same task, and the
/// claim makes them harmless.
#[derive(Debug, Clone)]
pub struct Dispatcher {
    store: PgStore,
    handoffs: Arc<Handoffs>,
    batch: usize,
}

impl Dispatcher {
    /// A dispatcher from `store`'s outbox to `handoffs`, `batch` per round.
    pub fn new(store: PgStore, handoffs: Arc<Handoffs>, batch: usize) -> Self {
        Self {
            store,
            handoffs,
            batch,
        }
    }

    /// One round; returns the tasks published and marked. A failed publish
    /// ends the round early; that handoff stays pending for the next one.
    pub async fn round(&self) -> taskfence::Result<Vec<TaskId>> {
        let handoffs = &self.handoffs;
        let round = self
            .store
            .dispatch(self.batch, |task| async move {
                handoffs.publish(task).await.map(|_| ())
            })
            .await?;
        if let Some((task, error)) = round.failed {
            tracing::warn!(%task, %error, "publishing a handoff failed; the next round retries it");
        }
        Ok(round.published)
    }

    /// Runs rounds until `shutdown` turns true, waiting `idle` after a round
    /// that found nothing to publish.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>, idle: Duration) {
        while !*shutdown.borrow() {
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
                _ = shutdown.wait_for(|stop| *stop) => break,
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
