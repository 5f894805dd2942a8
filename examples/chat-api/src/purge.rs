//! The retention sweep: removes finished reply tasks whose retention has
//! passed ([`TaskStore::purge_expired`]), so the idempotency keys expire as
//! `Config::key_retention` promises and taskfence's tables stop growing.
//!
//! It runs in every process that runs the worker, at start-up and then every
//! [`PurgeSettings::every`]; each sweep deletes up to
//! [`PurgeSettings::batch`] tasks per statement, statement after statement,
//! until fewer are left. Several processes sweeping at once only share the
//! work. The app's own rows (messages, replies) stay: a `GET /tasks/{id}`
//! of a purged task is a 404, and the key's next use is new work.

use taskfence::{PgStore, TaskStore};
use tokio::sync::watch;

use crate::config::PurgeSettings;
use crate::service::stopped;

/// Sweeps on `settings`' schedule until `stop` turns true (a statement in
/// progress finishes first). An interval of zero turns it off: another
/// process or a scheduled job (`taskfence purge`) does it instead.
///
/// ```no_run
/// # async fn f(store: taskfence::PgStore) {
/// let (stop, stopping) = tokio::sync::watch::channel(false);
/// let sweeper = tokio::spawn(chat_api::purge::run(store, chat_api::PurgeSettings::default(), stopping));
/// // … on shutdown:
/// let _ = stop.send(true);
/// sweeper.await.unwrap();
/// # }
/// ```
pub async fn run(store: PgStore, settings: PurgeSettings, mut stop: watch::Receiver<bool>) {
    if settings.every.is_zero() {
        tracing::info!("retention sweep off (purge interval 0)");
        return;
    }
    loop {
        match sweep(&store, settings.batch, &stop).await {
            Ok(0) => tracing::debug!("retention sweep: nothing expired"),
            Ok(purged) => tracing::info!(purged, "retention sweep: purged expired tasks"),
            Err(error) => tracing::warn!(%error, "retention sweep failed; trying again next interval"),
        }
        tokio::select! {
            () = tokio::time::sleep(settings.every) => {}
            () = stopped(&mut stop) => return,
        }
    }
}

/// One sweep: `purge_expired(batch)` until a statement removes fewer than
/// `batch` (nothing more is expired) or the service stops; the total.
///
/// ```no_run
/// # async fn f(store: taskfence::PgStore) -> taskfence::Result<()> {
/// let (_stop, stopping) = tokio::sync::watch::channel(false);
/// let purged = chat_api::purge::sweep(&store, 1000, &stopping).await?;
/// println!("purged {purged} expired tasks");
/// # Ok(()) }
/// ```
pub async fn sweep(store: &PgStore, batch: usize, stop: &watch::Receiver<bool>) -> taskfence::Result<u64> {
    let mut total = 0;
    loop {
        let purged = store.purge_expired(batch).await?;
        total += purged;
        if purged < batch as u64 || *stop.borrow() {
            return Ok(total);
        }
    }
}
