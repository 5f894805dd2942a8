//! The "reply ready" notification: a webhook `POST` for each saved reply,
//! never for a reply that was not saved, once per reply even when workers
//! crash (with a receiver that honours `Idempotency-Key`).
//!
//! Two steps, each with its own guarantee:
//!
//! 1. **The reply's completion submits the notification.** [`follow_up`]
//!    is a taskfence [`FollowUp`]: the completion that writes the reply row
//!    ([`SaveReply`]) submits a `chat.notify` task ([`NOTIFY_OPERATION`],
//!    request key [`request_key`]`(user, reply task id)`) in **one
//!    transaction**: the notification task exists exactly when the reply is
//!    saved, and a reply has one notification task however often its
//!    completion is retried.
//! 2. **A consumer of its own delivers it through the effect journal**
//!    (`taskfence_axum::webhook::Webhook`). For each `chat.notify` task:
//!    [`WorkContext::begin_effect`]`("reply-ready")` → `POST` the
//!    [`ReplyReady`] body with `Idempotency-Key: tf:<task id>:reply-ready`
//!    (the same on every attempt) → [`WorkContext::finish_effect`] with the
//!    receiver's `delivery_id`. A later attempt that finds the effect done skips
//!    the call; one that finds an intent with no outcome (a worker died after
//!    the call, before recording it) calls again **with the same key**, and the
//!    journal counts it ([`Effect::ambiguous`](taskfence::effect::Effect)).
//!
//! What the receiver's answer means (`Webhook::deliver`, after
//! [`EffectCall::from_http_status`](taskfence::effect::EffectCall::from_http_status)):
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
//! [`WorkContext::begin_effect`]: taskfence::runtime::WorkContext::begin_effect
//! [`WorkContext::finish_effect`]: taskfence::runtime::WorkContext::finish_effect

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use taskfence::postgres::FollowUp;
use taskfence::runtime::{Consumer, Stop, StoreQueue, Wake};
use taskfence::{PgStore, RequestKey, Result, RetryPolicy, Task, TaskId};

use crate::config::Config;
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

/// The notification task submitted with each saved reply (its request key
/// is [`request_key`]), with this retry budget and retention, waking `wake`
/// (the notification consumer's, `Consumer::source().waker()`) after the commit.
pub fn follow_up(policy: RetryPolicy, retention: std::time::Duration, wake: Wake) -> FollowUp {
    FollowUp::new(NOTIFY_OPERATION, |reply: &Task| {
        let message: ReplyPayload =
            serde_json::from_slice(&reply.payload).map_err(taskfence::Error::storage)?;
        let payload = ReplyReady {
            kind: "reply.ready".to_owned(),
            task_id: reply.id.to_string(),
            message_id: message.message_id.to_string(),
            user_id: reply.key.scope.clone(),
            href: format!("/tasks/{}", reply.id),
        };
        serde_json::to_vec(&payload).map_err(taskfence::Error::storage)
    })
    .policy(policy)
    .retention(retention)
    // The consumer claims from the store itself: no outbox row.
    .without_handoff()
    .after_commit(move || wake.wake())
}

/// The notification consumer: `chat.notify` tasks straight from the store,
/// `config.webhook_concurrency` at once, stopped with the reply consumer (`stop`).
pub(crate) fn consumer(store: PgStore, config: &Config, stop: Stop) -> Result<Consumer<StoreQueue>> {
    let settings = consumer_config("chat-notify", &config.worker, config.webhook_concurrency);
    let queue = StoreQueue::new(Arc::new(store)).operation(NOTIFY_OPERATION);
    Ok(queue.consumer(settings)?.with_stop(stop))
}
