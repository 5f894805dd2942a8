//! The SQS side: the client's AWS configuration, and the calls the service
//! makes: publish task ids with their [`Stamp`] as message attributes (one,
//! or ten per `SendMessageBatch`), long-poll,
//! delete and change visibility (ten per batch request), queue depth.

use std::collections::HashMap;
use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::SharedHttpClient;
use aws_sdk_sqs::error::DisplayErrorContext;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, MessageAttributeValue,
    QueueAttributeName, SendMessageBatchRequestEntry,
};
use taskfence::TaskId;
use taskfence::wire::Stamp;

/// A boxed error: the example reports SDK errors with their full context.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The most messages one batch request (and one `ReceiveMessage`) takes.
pub const MAX_BATCH: usize = 10;

/// The longest visibility timeout SQS accepts (12 hours).
pub const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 3600);

/// The HTTP client the AWS SDK runs on: hyper with rustls on ring. It also
/// speaks plain HTTP, which the instance metadata service, the ECS credential
/// endpoint and local endpoints such as moto need.
pub fn http_client() -> SharedHttpClient {
    use aws_smithy_http_client::{Builder, tls};
    Builder::new()
        .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring))
        .build_https()
}

/// The standard AWS configuration on [`http_client`], for the SQS client
/// and, with `--store dynamodb`, the DynamoDB one: credentials from the
/// default chain (environment, profile with SSO or `credential_process`, web
/// identity, ECS task role, instance role), the region from `AWS_REGION` or
/// the profile, `AWS_ENDPOINT_URL_SQS` / `AWS_ENDPOINT_URL_DYNAMODB` for a
/// local endpoint such as moto.
pub async fn aws_config() -> aws_config::SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .http_client(http_client())
        .load()
        .await
}

/// One received message.
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
    /// The task id, if the body is one.
    pub fn task_id(&self) -> Option<TaskId> {
        self.body.trim().parse().ok()
    }
}

/// What one `SendMessageBatch` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SentBatch {
    /// Messages that reached the queue.
    pub sent: usize,
    /// Entries SQS refused: the task (if SQS named a known entry) and why.
    pub failed: Vec<(Option<TaskId>, String)>,
}

/// Messages waiting, in flight and delayed, as SQS approximates them.
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
    pub fn total(&self) -> u64 {
        self.visible + self.in_flight + self.delayed
    }
}

/// One SQS queue.
#[derive(Debug, Clone)]
pub struct SqsQueue {
    client: Client,
    url: String,
}

fn sdk<E: std::error::Error + Send + Sync + 'static>(e: E) -> BoxError {
    DisplayErrorContext(e).to_string().into()
}

/// Whole seconds for SQS, rounded up, capped at [`MAX_VISIBILITY`].
fn seconds(d: Duration) -> i32 {
    let d = d.min(MAX_VISIBILITY);
    (d.as_secs() + u64::from(d.subsec_nanos() > 0)) as i32
}

/// The stamp as message attributes (`taskfence-task-id`,
/// `taskfence-version`, both of type `String`): a consumer reads the
/// assignment version without parsing the body.
fn stamp_attributes(stamp: &Stamp) -> Result<HashMap<String, MessageAttributeValue>, BoxError> {
    stamp
        .headers()
        .into_iter()
        .map(|(name, value)| {
            let value = MessageAttributeValue::builder()
                .data_type("String")
                .string_value(value)
                .build()
                .map_err(sdk)?;
            Ok((name.to_owned(), value))
        })
        .collect()
}

/// The positions of a batch request's failed entries (their ids are positions).
fn failed_entries<'a>(ids: impl Iterator<Item = &'a str>) -> Vec<usize> {
    ids.filter_map(|id| id.parse().ok()).collect()
}

impl SqsQueue {
    /// The queue at `url`.
    pub fn new(client: Client, url: impl Into<String>) -> Self {
        Self {
            client,
            url: url.into(),
        }
    }

    /// Creates (or opens) the queue `name` with a default visibility timeout.
    pub async fn create(client: Client, name: &str, visibility: Duration) -> Result<Self, BoxError> {
        let out = client
            .create_queue()
            .queue_name(name)
            .attributes(
                QueueAttributeName::VisibilityTimeout,
                seconds(visibility).to_string(),
            )
            .send()
            .await
            .map_err(sdk)?;
        let url = out.queue_url().ok_or("CreateQueue returned no queue URL")?;
        Ok(Self::new(client, url))
    }

    /// The queue's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The SQS client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Deletes the queue.
    pub async fn delete_queue(&self) -> Result<(), BoxError> {
        self.client
            .delete_queue()
            .queue_url(&self.url)
            .send()
            .await
            .map_err(sdk)?;
        Ok(())
    }

    /// Publishes "work on `stamp.task_id`". The body is only the id:
    /// everything else lives in the task record, so every copy of the
    /// message means the same. The stamp goes along as message attributes.
    pub async fn publish(&self, stamp: Stamp) -> Result<(), BoxError> {
        self.client
            .send_message()
            .queue_url(&self.url)
            .message_body(stamp.task_id.to_string())
            .set_message_attributes(Some(stamp_attributes(&stamp)?))
            .send()
            .await
            .map_err(sdk)?;
        Ok(())
    }

    /// Publishes "work on `task`", stamped, for every stamp of `tasks` (at
    /// most [`MAX_BATCH`]) in one `SendMessageBatch`. SQS answers per entry:
    /// an `Ok` can still carry failed entries ([`SentBatch::failed`]), and
    /// the others did reach the queue.
    pub async fn publish_batch(&self, tasks: &[Stamp]) -> Result<SentBatch, BoxError> {
        if tasks.is_empty() || tasks.len() > MAX_BATCH {
            return Err(format!(
                "a SendMessageBatch takes 1 to {MAX_BATCH} messages, not {}",
                tasks.len()
            )
            .into());
        }
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
                    .map_err(sdk)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let out = self
            .client
            .send_message_batch()
            .queue_url(&self.url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(sdk)?;
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

    /// Long-polls for up to `max` (1..=10) messages, waiting up to `wait`;
    /// the messages received stay hidden for `hide_for` (rounded up to whole
    /// seconds).
    pub async fn receive(
        &self,
        max: usize,
        wait: Duration,
        hide_for: Duration,
    ) -> Result<Vec<Message>, BoxError> {
        let out = self
            .client
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(max.clamp(1, MAX_BATCH) as i32)
            .wait_time_seconds(seconds(wait).min(20))
            .visibility_timeout(seconds(hide_for))
            .send()
            .await
            .map_err(sdk)?;
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

    /// Deletes up to [`MAX_BATCH`] messages in one `DeleteMessageBatch`;
    /// returns the positions of those SQS refused. Call it only once the
    /// store durably settled the task: a delete before the save loses the
    /// work on a crash.
    pub async fn delete_batch(&self, receipts: &[&str]) -> Result<Vec<usize>, BoxError> {
        let entries = receipts
            .iter()
            .enumerate()
            .map(|(i, receipt)| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(*receipt)
                    .build()
                    .map_err(sdk)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let out = self
            .client
            .delete_message_batch()
            .queue_url(&self.url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(sdk)?;
        Ok(failed_entries(out.failed().iter().map(|e| e.id())))
    }

    /// Hides each of up to [`MAX_BATCH`] messages for its duration from now
    /// (0: visible at once) in one `ChangeMessageVisibilityBatch`; returns
    /// the positions of those SQS refused.
    pub async fn change_visibility(&self, messages: &[(&str, Duration)]) -> Result<Vec<usize>, BoxError> {
        let entries = messages
            .iter()
            .enumerate()
            .map(|(i, (receipt, hide_for))| {
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(*receipt)
                    .visibility_timeout(seconds(*hide_for))
                    .build()
                    .map_err(sdk)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let out = self
            .client
            .change_message_visibility_batch()
            .queue_url(&self.url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(sdk)?;
        Ok(failed_entries(out.failed().iter().map(|e| e.id())))
    }

    /// How many messages the queue holds.
    pub async fn depth(&self) -> Result<Depth, BoxError> {
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(&self.url)
            .attribute_names(QueueAttributeName::All)
            .send()
            .await
            .map_err(sdk)?;
        let attrs = out
            .attributes()
            .ok_or("GetQueueAttributes returned no attributes")?;
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
}
