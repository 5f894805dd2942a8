//! The dispatcher: publishes one handoff record per task, keyed by task id.
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
use taskfence::TaskId;

use crate::journal::{Event, Journal};

/// Reads the task id out of a handoff record's payload.
///
/// ```
/// use kafka_worker::handoff::task_id;
/// let id = taskfence::TaskId::new();
/// assert_eq!(task_id(Some(id.to_string().as_bytes())), Some(id));
/// assert_eq!(task_id(Some(b"not a task")), None);
/// assert_eq!(task_id(None), None);
/// ```
pub fn task_id(payload: Option<&[u8]>) -> Option<TaskId> {
    std::str::from_utf8(payload?).ok()?.trim().parse().ok()
}

/// Publishes handoffs to one topic.
pub struct Dispatcher {
    producer: FutureProducer,
    topic: String,
    journal: Arc<dyn Journal>,
}

impl Dispatcher {
    /// A dispatcher for `topic` on the brokers at `bootstrap` (`acks=all`:
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

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

/// Creates `topic` with `partitions` partitions (replication 1) unless it exists.
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
