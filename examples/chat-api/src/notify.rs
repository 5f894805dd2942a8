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
use reqwest::header::{CONTENT_TYPE, HeaderMap, RETRY_AFTER};
use serde::{Deserialize, Serialize};
use taskfence::effect::{EffectCall, EffectKey};
use taskfence::error::InvalidInput;
use taskfence::runtime::{Consumer, Stop, StoreQueue, Wake, WorkContext};
use taskfence::{Failure, InputHash, NewTask, PgStore, RequestKey, Response, RetryPolicy, Task, TaskId};

use crate::config::{WebhookSettings, WorkerSettings};
use crate::worker::{ReplyPayload, consumer_config};

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

/// The webhook's JSON body, and the notification task's payload as it is:
/// every attempt sends the same bytes under the same key (a receiver may
/// refuse a key reused with another body).
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
        let payload = ReplyReady {
            kind: "reply.ready".to_owned(),
            task_id: reply.id.to_string(),
            message_id: message.message_id.to_string(),
            user_id: reply.key.scope.clone(),
            href: format!("/tasks/{}", reply.id),
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

    /// The work function of a notification task: the `POST`, run through the
    /// effect journal by [`WorkContext::effect`]. See the [module](self) for
    /// what each answer means.
    pub async fn deliver(self, ctx: WorkContext) -> Result<Response, Failure> {
        let body = ctx.task().payload.clone();
        ctx.effect(EFFECT, |key| self.post(key, body)).await
    }

    async fn post(&self, key: EffectKey, body: Vec<u8>) -> EffectCall {
        let sent = self
            .client
            .post(self.url.clone())
            .header("Idempotency-Key", key.as_str())
            .header(CONTENT_TYPE, "application/json");
        let response = match sent.body(body).send().await {
            Ok(response) => response,
            // Nothing reached the receiver.
            Err(e) if e.is_connect() => {
                return EffectCall::Refused(Failure::retryable(format!("webhook unreachable: {e}")));
            }
            Err(e) => return EffectCall::Unknown(format!("webhook call without an answer: {e}")),
        };
        let status = response.status();
        let message = format!("webhook answered {status}");
        match status {
            // The receiver acted; an unreadable body only loses its delivery id.
            s if s.is_success() => {
                let body = response.json::<serde_json::Value>().await.ok();
                let id = body.as_ref().and_then(|v| v.get("delivery_id")?.as_str());
                EffectCall::Done(id.map(str::to_owned))
            }
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => {
                let failure = Failure::retryable(message);
                EffectCall::Refused(match retry_after(response.headers()) {
                    Some(after) => failure.retry_after(after),
                    None => failure,
                })
            }
            StatusCode::REQUEST_TIMEOUT | StatusCode::CONFLICT => EffectCall::Unknown(message),
            s if s.is_client_error() => EffectCall::Refused(Failure::permanent(message)),
            _ => EffectCall::Unknown(message),
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
    let config = consumer_config("chat-notify", worker, webhook.concurrency);
    let queue = StoreQueue::new(Arc::new(store)).operation(NOTIFY_OPERATION);
    Ok(queue.consumer(config)?.with_stop(stop))
}
