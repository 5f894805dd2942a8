//! Saving a reply and hearing about it.
//!
//! - [`SaveReply`] is what the worker's completions write besides the task,
//!   through taskfence's [`CompleteWith`]: the reply into the app's
//!   `replies` table, completed with the task ([`PgStore::on`]`(&mut tx).complete(…)`, fenced)
//!   and announced with `pg_notify` — **one transaction**. So the reply row exists
//!   exactly when the task is completed, a refused completion writes no row,
//!   and the notification is delivered only once both are committed. With a
//!   webhook configured, the same transaction submits the reply's "reply
//!   ready" notification task ([`crate::notify::follow_up`]): it exists
//!   exactly when the reply does. [`ReplyStore`] is [`PgStore`] wrapped with it.
//! - The API's side is [`taskfence::postgres::listen_saved`]: one `LISTEN`
//!   connection per process, fanned out to every long-polling request.

use async_trait::async_trait;
use sqlx::PgConnection;
use taskfence::intercept::Intercepted;
use taskfence::postgres::{CompleteWith, CompletionWrites, FollowUp};
use taskfence::{Error, PgStore, Result, Task};

/// The store the worker runs on: [`PgStore`], whose `complete` also saves the
/// reply and notifies, atomically. Every other call is [`PgStore`]'s own.
pub type ReplyStore = Intercepted<PgStore, CompleteWith<(SaveReply, Option<FollowUp>)>>;

/// Wraps `store`; saved replies are announced on `channel` and, with
/// `ready`, by a notification task submitted with each ([`crate::notify::follow_up`]).
///
/// ```no_run
/// # fn f(store: taskfence::PgStore) {
/// let replies = chat_api::reply_store(store, "taskfence_reply_saved", None);
/// # }
/// ```
pub fn reply_store(store: PgStore, channel: impl Into<String>, ready: Option<FollowUp>) -> ReplyStore {
    CompleteWith::new(store, (SaveReply, ready))
        .notify(channel)
        .into_store()
}

/// What a reply's completion writes besides the task: the reply row.
#[derive(Debug, Clone)]
pub struct SaveReply;

#[async_trait]
impl CompletionWrites for SaveReply {
    async fn write(&self, _store: &PgStore, tx: &mut PgConnection, task: &Task, attempt: u32) -> Result<()> {
        let content = task.response.as_ref().and_then(|r| r.as_str());
        let content = content.ok_or_else(|| Error::storage(NotText))?;
        sqlx::query("INSERT INTO replies (task_id, content, attempt) VALUES ($1, $2, $3)")
            .bind(task.id.as_uuid())
            .bind(content)
            .bind(i32::try_from(attempt).unwrap_or(i32::MAX))
            .execute(tx)
            .await
            .map_err(Error::storage)?;
        Ok(())
    }
}

/// The provider's answer was not UTF-8 text.
#[derive(Debug, thiserror::Error)]
#[error("a chat reply must be UTF-8 text")]
struct NotText;
