//! The "reply ready" notification: a webhook `POST` for each saved reply,
//! never for a reply that was not saved, once per reply even when workers
//! crash (with a receiver that honours `Idempotency-Key`).
//!
//! Two steps, each with its own guarantee:
//!
//! 1. **The reply's completion submits the notification.** [`SaveReply`]
//!    writes the reply row, completes the reply task and submits a
//!    `chat.notify` task ([`NOTIFY_OPERATION`], request key
//!    [`request_key`]`(user, reply task id)`) in **one transaction**: the
//!    notification task exists exactly when the reply is saved, and a reply
//!    has one notification task however often its completion is retried.
//! 2. **A consumer of its own delivers it through the effect journal.** For
//!    each `chat.notify` task: [`WorkContext::begin_effect`]`("reply-ready")`
//!    → `POST` the [`ReplyReady`] body with `Idempotency-Key: tf:<task id>:reply-ready`
//!    (the same on every attempt) → [`WorkContext::finish_effect`] with the
//!    receiver's delivery id. A later attempt that finds the effect done skips
//!    the call; one that finds an intent with no outcome (a worker died after
//!    the call, before recording it) calls again **with the same key**, and the
//!    journal counts it ([`Effect::ambiguous`](taskfence::effect::Effect)).
//!
//! What the receiver's answer means ([`Notifier::deliver`]):
//!
//! | answer | recorded | the task |
//! | --- | --- | --- |
//! | 2xx | done, with the body's `delivery_id` | completed |
//! | 429, 503 | failed (it did not act) | retried, after `Retry-After` if given |
//! | another 4xx but 408, 409 | failed | failed for good |
//! | timeout, lost connection, 408, 409, other 5xx | nothing: the outcome is unknown | retried (ambiguous): the next attempt calls with the same key |
//! | connection refused | failed (nothing was sent) | retried |
//!
//! [`SaveReply`]: crate::SaveReply

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::{HeaderMap, RETRY_AFTER};
use serde::{Deserialize, Serialize};
use taskfence::effect::{EffectOutcome, EffectStart};
use taskfence::error::InvalidInput;
use taskfence::runtime::{Consumer, ConsumerConfig, Stop, StoreQueue, Wake, WorkContext};
use taskfence::{
    Failure, Fenced, InputHash, NewTask, PgStore, RequestKey, Response, RetryPolicy, Task, TaskId,
};
use uuid::Uuid;

use crate::config::{WebhookSettings, WorkerSettings};
use crate::worker::ReplyPayload;

/// The operation of every notification task.
pub const NOTIFY_OPERATION: &str = "chat.notify";

/// The effect's name in the journal: its key is `tf:<notification task id>:reply-ready`.
pub const EFFECT: &str = "reply-ready";

/// The request key of the notification of reply task `reply_task`, owned by
/// `user`: one per reply (a Regenerate's reply is another reply task, so
/// another notification).
///
/// ```
/// let reply = taskfence::TaskId::new();
/// let key = chat_api::notify::request_key("alice", reply);
/// assert_eq!((key.operation.as_str(), key.key), ("chat.notify", reply.to_string()));
/// ```
pub fn request_key(user: &str, reply_task: TaskId) -> RequestKey {
    RequestKey::new(user, NOTIFY_OPERATION, reply_task.to_string())
}

/// What a notification task carries: the webhook body's fields.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NotifyPayload {
    /// The reply task whose reply was saved.
    pub reply_task_id: Uuid,
    /// The user's message it answers.
    pub message_id: Uuid,
    /// Whose reply it is.
    pub user_id: String,
}

/// The webhook's JSON body. Built from the task's payload alone, so every
/// attempt sends the same bytes under the same key (a receiver may refuse a
/// key reused with another body).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyReady {
    /// Always `reply.ready`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The reply task (`GET /tasks/{id}` shows the reply).
    pub task_id: String,
    /// The user's message it answers.
    pub message_id: String,
    /// Whose reply it is.
    pub user_id: String,
    /// Where to read it: `/tasks/{id}`.
    pub href: String,
}

impl From<&NotifyPayload> for ReplyReady {
    fn from(p: &NotifyPayload) -> Self {
        Self {
            kind: "reply.ready".to_owned(),
            task_id: p.reply_task_id.to_string(),
            message_id: p.message_id.to_string(),
            user_id: p.user_id.clone(),
            href: format!("/tasks/{}", p.reply_task_id),
        }
    }
}

/// What [`SaveReply`](crate::SaveReply) needs to submit a notification task
/// with each saved reply: the task's budget and retention, and the
/// notification consumer's wake-up (rung after the commit).
#[derive(Debug, Clone)]
pub struct ReadyNotices {
    policy: RetryPolicy,
    retention: Duration,
    wake: Wake,
}

impl ReadyNotices {
    /// Notification tasks with this retry budget and retention, waking `wake`
    /// (the notification consumer's, `Consumer::source().waker()`).
    pub fn new(policy: RetryPolicy, retention: Duration, wake: Wake) -> Self {
        Self {
            policy,
            retention,
            wake,
        }
    }

    /// The notification task of `reply`, the reply task being completed.
    pub(crate) fn task_for(&self, reply: &Task) -> Result<NewTask, taskfence::Error> {
        let message: ReplyPayload =
            serde_json::from_slice(&reply.payload).map_err(taskfence::Error::storage)?;
        let payload = NotifyPayload {
            reply_task_id: reply.id.as_uuid(),
            message_id: message.message_id,
            user_id: reply.key.scope.clone(),
        };
        let new = NewTask::new(
            request_key(&reply.key.scope, reply.id),
            InputHash::of([reply.id.to_string()]),
        )
        .payload(serde_json::to_vec(&payload).map_err(taskfence::Error::storage)?)
        .policy(self.policy)
        .retention(self.retention)
        // The consumer claims from the store itself: no outbox row.
        .without_handoff();
        Ok(new)
    }

    /// After the commit: the notification starts at once, not at the next poll.
    pub(crate) fn wake(&self) {
        self.wake.wake();
    }
}

/// The webhook's client: delivers one notification task per call.
#[derive(Debug, Clone)]
pub struct Notifier {
    client: reqwest::Client,
    url: reqwest::Url,
}

/// What one `POST` came to.
enum Posted {
    /// 2xx: the receiver acted; its delivery id, if it gave one.
    Delivered(Option<String>),
    /// It did not act, for certain.
    Refused {
        message: String,
        retry: bool,
        retry_after: Option<Duration>,
    },
    /// It may or may not have acted.
    Unknown(String),
}

impl Notifier {
    /// A client for `settings` (its timeout covers connecting too).
    pub fn new(settings: &WebhookSettings) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .timeout(settings.timeout)
            .connect_timeout(settings.timeout.min(Duration::from_secs(5)))
            .build()?;
        Ok(Self {
            client,
            url: settings.url.clone(),
        })
    }

    /// The work function of a notification task: begin the effect, `POST`,
    /// record the outcome. See the [module](self) for what each answer means.
    pub async fn deliver(&self, ctx: WorkContext) -> Result<Response, Failure> {
        let payload: NotifyPayload = serde_json::from_slice(&ctx.task().payload)
            .map_err(|e| Failure::permanent(format!("unreadable notification payload: {e}")))?;
        let start = ctx
            .begin_effect(EFFECT)
            .await
            .map_err(|e| Failure::retryable(format!("effect journal: {e}")))?;
        let key = match start {
            Fenced::Rejected(_) => return Err(Failure::retryable("lease lost before the notification")),
            Fenced::Accepted(EffectStart::Call { key, ambiguous }) => {
                if let Some(earlier) = ambiguous {
                    tracing::warn!(
                        %key,
                        earlier_attempt = earlier.attempt,
                        "notifying again: an earlier attempt's call has no known outcome (same key)"
                    );
                }
                key
            }
            // An earlier attempt delivered it: nothing to send.
            Fenced::Accepted(EffectStart::Done(effect)) => {
                return Ok(Response::from(
                    effect.reference.unwrap_or_else(|| "delivered".to_owned()),
                ));
            }
            // An earlier attempt's call has no known outcome and the policy says stop.
            Fenced::Accepted(EffectStart::Stop(effect)) => return Err(effect.ambiguous_failure()),
            Fenced::Accepted(_) => {
                return Err(Failure::retryable("an effect start this worker does not know"));
            }
        };
        let body = ReplyReady::from(&payload);
        let posted = tokio::select! {
            posted = self.post(key.as_str(), &body) => posted,
            // Another worker may own the task now; this call's outcome stays unknown.
            () = ctx.lease_lost() => return Err(Failure::ambiguous("lease lost during the webhook call")),
        };
        let (outcome, result) = match posted {
            Posted::Delivered(reference) => {
                let outcome = match reference {
                    Some(r) if EffectOutcome::done(r.clone()).validate().is_ok() => EffectOutcome::done(r),
                    _ => EffectOutcome::done_without_reference(),
                };
                let response = match &outcome {
                    EffectOutcome::Done { reference: Some(r) } => Response::from(r.clone()),
                    _ => Response::from("delivered"),
                };
                (outcome, Ok(response))
            }
            Posted::Refused {
                message,
                retry,
                retry_after,
            } => {
                let failure = match (retry, retry_after) {
                    (false, _) => Failure::permanent(message.clone()),
                    (true, Some(after)) => Failure::retryable(message.clone()).retry_after(after),
                    (true, None) => Failure::retryable(message.clone()),
                };
                (EffectOutcome::failed(message), Err(failure))
            }
            // Record nothing: the next attempt finds the intent and calls
            // again with the same key (counted as ambiguous).
            Posted::Unknown(message) => return Err(Failure::ambiguous(message)),
        };
        match ctx.finish_effect(EFFECT, outcome).await {
            Ok(Fenced::Accepted(_)) => result,
            // The intent stays without an outcome: the next attempt calls
            // again with the same key, which the receiver recognises.
            Ok(Fenced::Rejected(_)) => Err(Failure::retryable("lease lost before the delivery was recorded")),
            Err(e) => Err(Failure::retryable(format!("recording the delivery: {e}"))),
        }
    }

    async fn post(&self, key: &str, body: &ReplyReady) -> Posted {
        let sent = self
            .client
            .post(self.url.clone())
            .header("Idempotency-Key", key)
            .json(body)
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            // Nothing reached the receiver.
            Err(e) if e.is_connect() => {
                return Posted::Refused {
                    message: format!("webhook unreachable: {e}"),
                    retry: true,
                    retry_after: None,
                };
            }
            Err(e) => return Posted::Unknown(format!("webhook call without an answer: {e}")),
        };
        let status = response.status();
        let retry_after = retry_after(response.headers());
        if status.is_success() {
            // The receiver acted; an unreadable body only loses its id.
            let reference = response.json::<serde_json::Value>().await.ok().and_then(|v| {
                v.get("delivery_id")
                    .and_then(serde_json::Value::as_str)
                    .map(str::to_owned)
            });
            return Posted::Delivered(reference);
        }
        let message = format!("webhook answered {status}");
        match status {
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => Posted::Refused {
                message,
                retry: true,
                retry_after,
            },
            StatusCode::REQUEST_TIMEOUT | StatusCode::CONFLICT => Posted::Unknown(message),
            s if s.is_client_error() => Posted::Refused {
                message,
                retry: false,
                retry_after: None,
            },
            _ => Posted::Unknown(message),
        }
    }
}

/// `Retry-After` in seconds (the HTTP-date form is ignored: the backoff applies).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let seconds = headers
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(Duration::from_secs(seconds.min(3600)))
}

/// The notification consumer: `chat.notify` tasks straight from the store,
/// stopped with the reply consumer (`stop`).
pub(crate) fn consumer(
    store: PgStore,
    worker: &WorkerSettings,
    webhook: &WebhookSettings,
    stop: Stop,
) -> Result<Consumer<StoreQueue>, InvalidInput> {
    let worker_id = format!(
        "chat-notify-{}-{}",
        std::process::id(),
        &Uuid::now_v7().simple().to_string()[20..]
    );
    let mut config = ConsumerConfig::new(worker_id, worker.lease)
        .concurrency(webhook.concurrency)
        // None held in reserve: behind a slow receiver, a waiting notification
        // stays claimable by any other process.
        .prefetch(0);
    config.idle_min = config.idle_min.min(worker.poll_every);
    config.idle_max = worker.poll_every;
    config.grace = worker.grace;
    Ok(StoreQueue::new(Arc::new(store))
        .operation(NOTIFY_OPERATION)
        .consumer(config)?
        .with_stop(stop))
}

/// Runs `consumer` until its stop switch is pulled and the stop is over.
pub(crate) async fn run(consumer: Consumer<StoreQueue>, notifier: Notifier) {
    let notifier = Arc::new(notifier);
    match consumer
        .run(move |ctx| {
            let notifier = Arc::clone(&notifier);
            async move { notifier.deliver(ctx).await }
        })
        .await
    {
        Ok(stopped) => tracing::info!(?stopped, "notification worker stopped"),
        Err(error) => tracing::error!(%error, "the notification worker could not start"),
    }
}
