//! Saving a reply and hearing about it.
//!
//! - [`SaveReply`] is the one change the worker's store makes to [`PgStore`],
//!   as an [`Intercept`]: its `complete` writes the reply into the app's
//!   `replies` table, completes the task ([`PgStore::on`]`(&mut tx).complete(…)`, fenced)
//!   and sends `pg_notify` — **one transaction**. So the reply row exists
//!   exactly when the task is completed, a refused completion writes no row,
//!   and the notification is delivered only once both are committed. With a
//!   webhook configured, the same transaction submits the reply's "reply
//!   ready" notification task ([`crate::notify`]): it exists exactly when the
//!   reply does.
//!   [`ReplyStore`] is [`PgStore`] wrapped with it.
//! - [`listen`] is the API's side: one `LISTEN` connection per process,
//!   fanned out to every long-polling request by [`SavedEvents`]. A
//!   notification is only a hint to read the store again; a lost one
//!   (reconnect) wakes every waiter.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::PgListener;
use taskfence::intercept::{Intercept, Intercepted};
use taskfence::runtime::{SavedEvents, Stop};
use taskfence::{Error, Fenced, Lease, PgStore, Response, Result, Task, TaskId, TaskStore};

use crate::notify::ReadyNotices;

/// The store the worker runs on: [`PgStore`], whose `complete` also saves the
/// reply and notifies, atomically. Every other call is [`PgStore`]'s own.
///
/// Why a wrapper: [`taskfence::runtime::Consumer`] completes through
/// [`TaskStore::complete_many`], which an [`Intercepted`] store turns into one
/// `complete` per task. Wrapping the store keeps the whole runtime (claim,
/// lease renewal, retry budget, graceful stop) and changes only what a
/// completion writes.
pub type ReplyStore = Intercepted<PgStore, SaveReply>;

/// Wraps `store`; saved replies are announced on `channel` and, with
/// `ready`, by a notification task submitted with each ([`crate::notify`]).
///
/// ```no_run
/// # fn f(store: taskfence::PgStore) {
/// let replies = chat_api::reply_store(store, "taskfence_reply_saved", None);
/// # }
/// ```
pub fn reply_store(store: PgStore, channel: impl Into<String>, ready: Option<ReadyNotices>) -> ReplyStore {
    Intercepted::new(
        Arc::new(store.clone()),
        SaveReply {
            store,
            channel: channel.into(),
            ready,
        },
    )
}

/// The [`Intercept`] behind [`ReplyStore`]: only `complete` is changed.
#[derive(Debug, Clone)]
pub struct SaveReply {
    // The concrete store, for `on(&mut tx).complete` on our own transaction: the
    // `&dyn TaskStore` an intercept is handed has no transactional variant.
    store: PgStore,
    channel: String,
    /// The "reply ready" notification task to submit with each reply (a webhook is configured).
    ready: Option<ReadyNotices>,
}

#[async_trait]
impl Intercept for SaveReply {
    async fn complete(
        &self,
        _inner: &dyn TaskStore,
        lease: Lease,
        response: Response,
    ) -> Result<Fenced<Task>> {
        let Some(content) = response.as_str().map(str::to_owned) else {
            return Err(Error::storage(NotText));
        };
        let (task_id, attempt) = (lease.task_id(), lease.attempt());
        let notice = match &self.ready {
            Some(ready) => Some(ready.task_for(lease.task())?),
            None => None,
        };
        let mut tx = self.store.pool().begin().await.map_err(Error::storage)?;
        let outcome = self.store.on(&mut tx).complete(lease, response).await?;
        if outcome.is_accepted() {
            // The task row stays locked until the commit: nothing can take the
            // task over between the fenced check and these writes.
            sqlx::query("INSERT INTO replies (task_id, content, attempt) VALUES ($1, $2, $3)")
                .bind(task_id.as_uuid())
                .bind(&content)
                .bind(i32::try_from(attempt).unwrap_or(i32::MAX))
                .execute(&mut *tx)
                .await
                .map_err(Error::storage)?;
            // The reply's notification: submitted with the reply, so it never
            // announces one that was not saved, and one per reply (its request
            // key is the reply task's id; a repeat is `Existing`).
            if let Some(notice) = notice {
                self.store.on(&mut tx).submit(notice).await?;
            }
            // Queued by the server and delivered on COMMIT, never before.
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(&self.channel)
                .bind(task_id.to_string())
                .execute(&mut *tx)
                .await
                .map_err(Error::storage)?;
            tx.commit().await.map_err(Error::storage)?;
            if let Some(ready) = &self.ready {
                ready.wake();
            }
        }
        // Rejected: dropping `tx` rolls back; the completion wrote nothing either.
        Ok(outcome)
    }
}

/// The provider's answer was not UTF-8 text.
#[derive(Debug, thiserror::Error)]
#[error("a chat reply must be UTF-8 text")]
struct NotText;

/// The API's side: one `LISTEN` connection per process, fanned out to every
/// long-polling request ([`SavedEvents`]). Returns once it listens on
/// `channel` (no reply committed after that is missed), forwarding until
/// `stop`; with the listening task.
pub async fn listen(
    pool: &sqlx::PgPool,
    channel: &str,
    stop: Stop,
) -> Result<(SavedEvents, tokio::task::JoinHandle<()>), sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(channel).await?;
    let events = SavedEvents::new();
    let announce = events.clone();
    let task = tokio::spawn(async move {
        loop {
            tokio::select! {
                () = stop.requested() => break,
                received = listener.try_recv() => match received {
                    Ok(Some(n)) => match n.payload().parse::<TaskId>() {
                        Ok(id) => announce.saved(id),
                        Err(_) => tracing::warn!(payload = n.payload(), "ignored a malformed notification"),
                    },
                    // The connection dropped; the next try_recv reconnects and re-LISTENs.
                    Ok(None) => announce.resync(),
                    Err(error) => {
                        tracing::warn!(%error, "LISTEN connection failed; retrying");
                        announce.resync();
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                },
            }
        }
    });
    Ok((events, task))
}
