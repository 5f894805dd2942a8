//! One SQS queue and the few calls taskfence makes on it ([`SqsQueue`]):
//! publish task ids with their [`Stamp`] as message attributes (one, or ten
//! per `SendMessageBatch`), long-poll, delete and change visibility (ten per
//! batch request), and the queue's depth.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, MessageAttributeValue,
    QueueAttributeName, SendMessageBatchRequestEntry,
};
use taskfence::TaskId;
use taskfence::wire::Stamp;

use crate::error::{Error, Result};

/// The most messages one batch request (and one `ReceiveMessage`) takes.
///
/// ```
/// assert_eq!(taskfence_sqs::MAX_BATCH, 10);
/// ```
pub const MAX_BATCH: usize = 10;

/// The longest visibility timeout SQS accepts (12 hours): longer ones are capped.
///
/// ```
/// assert_eq!(taskfence_sqs::MAX_VISIBILITY.as_secs(), 43_200);
/// ```
pub const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 3600);

/// One received message.
///
/// ```
/// let message = taskfence_sqs::Message {
///     id: "m-1".into(),
///     body: taskfence::TaskId::new().to_string(),
///     receipt: "r-1".into(),
/// };
/// assert!(message.task_id().is_some());
/// ```
#[derive(Debug, Clone)]
pub struct Message {
    /// SQS's id of the message: the same on every delivery of it.
    pub id: String,
    /// The body; a valid one is a task id.
    pub body: String,
    /// The handle to delete it or change its visibility: new on every receive.
    pub receipt: String,
}

impl Message {
    /// The task id, if the body is one (a message is only ever "work on task X").
    ///
    /// ```
    /// let message = taskfence_sqs::Message { id: "m".into(), body: "hello".into(), receipt: "r".into() };
    /// assert_eq!(message.task_id(), None);
    /// ```
    pub fn task_id(&self) -> Option<TaskId> {
        self.body.trim().parse().ok()
    }
}

/// What one `SendMessageBatch` did: SQS answers per entry.
///
/// ```
/// let batch = taskfence_sqs::SentBatch::default();
/// assert!(batch.failed.is_empty());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SentBatch {
    /// Messages that reached the queue.
    pub sent: usize,
    /// Entries SQS refused: the task (if SQS named a known entry) and why.
    pub failed: Vec<(Option<TaskId>, String)>,
}

/// Messages waiting, in flight and delayed, as SQS approximates them: what
/// a test or an operator checks to see the queue drained.
///
/// ```
/// let depth = taskfence_sqs::Depth { visible: 1, in_flight: 2, delayed: 3 };
/// assert_eq!(depth.total(), 6);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Depth {
    /// Visible, ready to receive.
    pub visible: u64,
    /// Received and not deleted, hidden by their visibility timeout.
    pub in_flight: u64,
    /// Sent with a delay that has not passed.
    pub delayed: u64,
}

impl Depth {
    /// All messages still in the queue.
    ///
    /// ```
    /// assert_eq!(taskfence_sqs::Depth::default().total(), 0);
    /// ```
    pub fn total(&self) -> u64 {
        self.visible + self.in_flight + self.delayed
    }
}

/// One SQS queue: the client and the queue's URL. Cheap to clone.
///
/// Every message names one task: its body is the task id, and the task's
/// [`Stamp`] goes along as message attributes (`taskfence-task-id`,
/// `taskfence-version`, both `String`). Everything else lives in the task
/// record, so every copy of a message means the same.
///
/// ```no_run
/// # async fn f(client: aws_sdk_sqs::Client) -> taskfence_sqs::Result<()> {
/// let queue = taskfence_sqs::SqsQueue::new(client, "https://sqs.eu-west-1.amazonaws.com/123/work");
/// println!("{} messages waiting", queue.depth().await?.visible);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqsQueue {
    client: Client,
    url: String,
}

/// Whole seconds for SQS, rounded up, capped at [`MAX_VISIBILITY`].
pub(crate) fn seconds(d: Duration) -> i32 {
    let d = d.min(MAX_VISIBILITY);
    (d.as_secs() + u64::from(d.subsec_nanos() > 0)) as i32
}

/// The stamp as message attributes: a consumer reads the assignment
/// version without parsing the body.
fn stamp_attributes(stamp: &Stamp) -> Result<HashMap<String, MessageAttributeValue>> {
    stamp
        .headers()
        .into_iter()
        .map(|(name, value)| {
            let value = MessageAttributeValue::builder()
                .data_type("String")
                .string_value(value)
                .build()
                .map_err(Error::sdk("SendMessage"))?;
            Ok((name.to_owned(), value))
        })
        .collect()
}

/// The positions of a batch request's failed entries (their ids are positions).
fn failed_entries<'a>(ids: impl Iterator<Item = &'a str>) -> Vec<usize> {
    ids.filter_map(|id| id.parse().ok()).collect()
}

fn check_batch(operation: &'static str, len: usize) -> Result<()> {
    if len == 0 || len > MAX_BATCH {
        return Err(Error::BatchSize { operation, len });
    }
    Ok(())
}

impl SqsQueue {
    /// The queue at `url`.
    ///
    /// ```no_run
    /// # async fn f() {
    /// let aws = aws_config::load_from_env().await;
    /// let queue = taskfence_sqs::SqsQueue::new(aws_sdk_sqs::Client::new(&aws), "https://sqs…/work");
    /// # }
    /// ```
    pub fn new(client: Client, url: impl Into<String>) -> Self {
        Self {
            client,
            url: url.into(),
        }
    }

    /// Creates (or opens) the queue `name` with a default visibility
    /// timeout: for tests and local runs (a deployment's queue comes from
    /// its infrastructure code).
    ///
    /// ```no_run
    /// # async fn f(client: aws_sdk_sqs::Client) -> taskfence_sqs::Result<()> {
    /// let queue = taskfence_sqs::SqsQueue::create(client, "work", std::time::Duration::from_secs(30)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn create(client: Client, name: &str, visibility: Duration) -> Result<Self> {
        let out = client
            .create_queue()
            .queue_name(name)
            .attributes(
                QueueAttributeName::VisibilityTimeout,
                seconds(visibility).to_string(),
            )
            .send()
            .await
            .map_err(Error::sdk("CreateQueue"))?;
        let url = out.queue_url().ok_or(Error::Incomplete {
            operation: "CreateQueue",
            missing: "a queue URL",
        })?;
        Ok(Self::new(client, url))
    }

    /// The queue's URL.
    ///
    /// ```no_run
    /// # fn f(queue: taskfence_sqs::SqsQueue) {
    /// println!("consuming {}", queue.url());
    /// # }
    /// ```
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The SQS client, for calls this type does not make.
    ///
    /// ```no_run
    /// # async fn f(queue: taskfence_sqs::SqsQueue) {
    /// let _ = queue.client().purge_queue().queue_url(queue.url()).send().await;
    /// # }
    /// ```
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Deletes the queue (tests clean up with it).
    ///
    /// ```no_run
    /// # async fn f(queue: taskfence_sqs::SqsQueue) -> taskfence_sqs::Result<()> {
    /// queue.delete_queue().await?;
    /// # Ok(()) }
    /// ```
    pub async fn delete_queue(&self) -> Result<()> {
        self.client
            .delete_queue()
            .queue_url(&self.url)
            .send()
            .await
            .map_err(Error::sdk("DeleteQueue"))?;
        Ok(())
    }

    /// Publishes "work on `stamp.task_id`", the stamp as message attributes.
    ///
    /// ```no_run
    /// # async fn f(queue: taskfence_sqs::SqsQueue, task: taskfence::Task) -> taskfence_sqs::Result<()> {
    /// queue.publish(taskfence::wire::Stamp::from(&task)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn publish(&self, stamp: Stamp) -> Result<()> {
        self.client
            .send_message()
            .queue_url(&self.url)
            .message_body(stamp.task_id.to_string())
            .set_message_attributes(Some(stamp_attributes(&stamp)?))
            .send()
            .await
            .map_err(Error::sdk("SendMessage"))?;
        Ok(())
    }

    /// Publishes "work on the task" for every stamp of `tasks` (1 to
    /// [`MAX_BATCH`]) in one `SendMessageBatch`. SQS answers per entry: an
    /// `Ok` can still carry failed entries ([`SentBatch::failed`]), and the
    /// others did reach the queue.
    ///
    /// ```no_run
    /// # async fn f(queue: taskfence_sqs::SqsQueue, stamps: Vec<taskfence::wire::Stamp>) -> taskfence_sqs::Result<()> {
    /// let batch = queue.publish_batch(&stamps[..stamps.len().min(10)]).await?;
    /// assert!(batch.failed.is_empty(), "refused: {:?}", batch.failed);
    /// # Ok(()) }
    /// ```
    pub async fn publish_batch(&self, tasks: &[Stamp]) -> Result<SentBatch> {
        check_batch("SendMessageBatch", tasks.len())?;
        // Entry ids only need to be unique within the request: the position.
        let entries = tasks
            .iter()
            .enumerate()
            .map(|(i, stamp)| {
                SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(stamp.task_id.to_string())
                    .set_message_attributes(Some(stamp_attributes(stamp)?))
                    .build()
                    .map_err(Error::sdk("SendMessageBatch"))
            })
            .collect::<Result<Vec<_>>>()?;
        let out = self
            .client
            .send_message_batch()
            .queue_url(&self.url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(Error::sdk("SendMessageBatch"))?;
        let failed = out
            .failed()
            .iter()
            .map(|entry| {
                let task = entry
                    .id()
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| tasks.get(i))
                    .map(|stamp| stamp.task_id);
                let why = format!("{}: {}", entry.code(), entry.message().unwrap_or("no message"));
                (task, why)
            })
            .collect();
        Ok(SentBatch {
            sent: out.successful().len(),
            failed,
        })
    }

    /// Long-polls for up to `max` (1..=10) messages, waiting up to `wait`
    /// (at most 20 s); the messages received stay hidden for `hide_for`
    /// (rounded up to whole seconds, at most [`MAX_VISIBILITY`]).
    ///
    /// ```no_run
    /// # async fn f(queue: taskfence_sqs::SqsQueue) -> taskfence_sqs::Result<()> {
    /// use std::time::Duration;
    /// for message in queue.receive(10, Duration::from_secs(5), Duration::from_secs(35)).await? {
    ///     println!("work on {:?}", message.task_id());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn receive(&self, max: usize, wait: Duration, hide_for: Duration) -> Result<Vec<Message>> {
        let out = self
            .client
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(max.clamp(1, MAX_BATCH) as i32)
            .wait_time_seconds(seconds(wait).min(20))
            .visibility_timeout(seconds(hide_for))
            .send()
            .await
            .map_err(Error::sdk("ReceiveMessage"))?;
        Ok(out
            .messages()
            .iter()
            .filter_map(|m| {
                Some(Message {
                    id: m.message_id()?.to_owned(),
                    body: m.body().unwrap_or_default().to_owned(),
                    receipt: m.receipt_handle()?.to_owned(),
                })
            })
            .collect())
    }

    /// Deletes 1 to [`MAX_BATCH`] messages in one `DeleteMessageBatch`;
    /// returns the positions of those SQS refused. Call it only once the
    /// store durably settled the task: a delete before the save loses the
    /// work on a crash.
    ///
    /// ```no_run
    /// # async fn f(queue: taskfence_sqs::SqsQueue, message: taskfence_sqs::Message) -> taskfence_sqs::Result<()> {
    /// let refused = queue.delete_batch(&[message.receipt.as_str()]).await?;
    /// # Ok(()) }
    /// ```
    pub async fn delete_batch(&self, receipts: &[&str]) -> Result<Vec<usize>> {
        check_batch("DeleteMessageBatch", receipts.len())?;
        let entries = receipts
            .iter()
            .enumerate()
            .map(|(i, receipt)| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(*receipt)
                    .build()
                    .map_err(Error::sdk("DeleteMessageBatch"))
            })
            .collect::<Result<Vec<_>>>()?;
        let out = self
            .client
            .delete_message_batch()
            .queue_url(&self.url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(Error::sdk("DeleteMessageBatch"))?;
        Ok(failed_entries(out.failed().iter().map(|e| e.id())))
    }

    /// Hides each of 1 to [`MAX_BATCH`] messages for its duration from now
    /// (0: visible at once) in one `ChangeMessageVisibilityBatch`; returns
    /// the positions of those SQS refused.
    ///
    /// ```no_run
    /// # async fn f(queue: taskfence_sqs::SqsQueue, message: taskfence_sqs::Message) -> taskfence_sqs::Result<()> {
    /// // Visible again at once, for another worker.
    /// queue.change_visibility(&[(message.receipt.as_str(), std::time::Duration::ZERO)]).await?;
    /// # Ok(()) }
    /// ```
    pub async fn change_visibility(&self, messages: &[(&str, Duration)]) -> Result<Vec<usize>> {
        check_batch("ChangeMessageVisibilityBatch", messages.len())?;
        let entries = messages
            .iter()
            .enumerate()
            .map(|(i, (receipt, hide_for))| {
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(*receipt)
                    .visibility_timeout(seconds(*hide_for))
                    .build()
                    .map_err(Error::sdk("ChangeMessageVisibilityBatch"))
            })
            .collect::<Result<Vec<_>>>()?;
        let out = self
            .client
            .change_message_visibility_batch()
            .queue_url(&self.url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(Error::sdk("ChangeMessageVisibilityBatch"))?;
        Ok(failed_entries(out.failed().iter().map(|e| e.id())))
    }

    /// How many messages the queue holds. A service calls it at start-up,
    /// so wrong credentials, region or URL stop it at once.
    ///
    /// ```no_run
    /// # async fn f(queue: taskfence_sqs::SqsQueue) -> taskfence_sqs::Result<()> {
    /// let depth = queue.depth().await?;
    /// println!("{} visible, {} in flight", depth.visible, depth.in_flight);
    /// # Ok(()) }
    /// ```
    pub async fn depth(&self) -> Result<Depth> {
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(&self.url)
            .attribute_names(QueueAttributeName::All)
            .send()
            .await
            .map_err(Error::sdk("GetQueueAttributes"))?;
        let attrs = out.attributes().ok_or(Error::Incomplete {
            operation: "GetQueueAttributes",
            missing: "the attributes",
        })?;
        let get =
            |name: QueueAttributeName| -> u64 { attrs.get(&name).and_then(|v| v.parse().ok()).unwrap_or(0) };
        Ok(Depth {
            visible: get(QueueAttributeName::ApproximateNumberOfMessages),
            in_flight: get(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
            delayed: get(QueueAttributeName::ApproximateNumberOfMessagesDelayed),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visibility_rounds_up_and_caps() {
        assert_eq!(seconds(Duration::from_millis(1)), 1);
        assert_eq!(seconds(Duration::from_secs(5)), 5);
        assert_eq!(seconds(Duration::from_millis(5001)), 6);
        assert_eq!(seconds(Duration::from_secs(24 * 3600)), 43_200);
    }

    #[test]
    fn batches_take_one_to_ten_entries() {
        assert!(matches!(
            check_batch("X", 0),
            Err(Error::BatchSize { len: 0, .. })
        ));
        assert!(check_batch("X", 1).is_ok());
        assert!(check_batch("X", 10).is_ok());
        assert!(matches!(
            check_batch("X", 11),
            Err(Error::BatchSize { len: 11, .. })
        ));
    }
}
