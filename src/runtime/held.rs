//! The leases a consumer holds while their work runs, and the loop that
//! renews them all in one request ([`TaskStore::renew_many`]) and tells a
//! work function when its lease is lost.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::source::Source;
use crate::clock::Clock;
use crate::limits;
use crate::store::{Fenced, Lease, Rejection, TaskStore};
use crate::task::TaskId;

/// One held lease: the lease as last renewed, the delivery's receipt, the
/// lost signal its work function watches, and why it was lost.
struct Entry<R> {
    lease: Lease,
    receipt: R,
    lost: watch::Sender<bool>,
    why: Option<Option<Rejection>>,
}

/// The held leases, by task.
pub(crate) struct HeldLeases<R> {
    entries: Mutex<HashMap<TaskId, Entry<R>>>,
}

impl<R: Clone> HeldLeases<R> {
    pub(crate) fn new() -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TaskId, Entry<R>>> {
        // Every critical section is a few map operations that cannot panic midway.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds `lease` (renewed from now on); the receiver says when it is lost.
    pub(crate) fn insert(&self, lease: Lease, receipt: R) -> watch::Receiver<bool> {
        let (lost, rx) = watch::channel(false);
        let entry = Entry {
            lease: lease.clone(),
            receipt,
            lost,
            why: None,
        };
        self.lock().insert(lease.task_id(), entry);
        rx
    }

    /// Stops holding the task's lease; its delivery's receipt.
    pub(crate) fn remove(&self, id: TaskId) -> Option<R> {
        self.lock().remove(&id).map(|entry| entry.receipt)
    }

    /// Why the task's lease was lost, if it was (`Some(None)`: the store
    /// stayed unreachable past the expiry).
    pub(crate) fn lost(&self, id: TaskId) -> Option<Option<Rejection>> {
        self.lock().get(&id).and_then(|e| e.why.clone())
    }

    /// Every held lease, as last renewed.
    fn leases(&self) -> Vec<Lease> {
        self.lock()
            .values()
            .filter(|e| e.why.is_none())
            .map(|e| e.lease.clone())
            .collect()
    }

    /// Records a renewal's answer for the task; the receipt when accepted.
    fn renewed(&self, lease: &Lease, answer: Fenced<()>) -> Option<R> {
        let mut entries = self.lock();
        let entry = entries.get_mut(&lease.task_id()).filter(|e| e.why.is_none())?;
        match answer {
            Fenced::Accepted(()) => {
                entry.lease = lease.clone();
                Some(entry.receipt.clone())
            }
            Fenced::Rejected(rejection) => {
                tracing::info!(task_id = %lease.task_id(), %rejection, "lease lost: renewal refused");
                lose(entry, Some(rejection));
                None
            }
        }
    }

    /// Marks every lease that expired by `now` (worker clock) as lost.
    fn expire(&self, now: time::OffsetDateTime) {
        for entry in self.lock().values_mut() {
            if entry.why.is_none() && entry.lease.expires_at() <= now {
                tracing::warn!(task_id = %entry.lease.task_id(), "lease lost: the store stayed unreachable past its expiry");
                lose(entry, None);
            }
        }
    }
}

fn lose<R>(entry: &mut Entry<R>, why: Option<Rejection>) {
    entry.why = Some(why);
    let _ = entry.lost.send(true);
}

/// How long a round of renewals may wait for the store: as long as the
/// leases it renews last (an answer that comes later than the period but
/// before the first of them expires still keeps them all, and tells the
/// source so), and at least the period.
fn answer_within(batch: &[Lease], now: time::OffsetDateTime, every: Duration) -> Duration {
    let earliest = batch.iter().map(Lease::expires_at).min();
    let left = earliest.map_or(Duration::ZERO, |at| {
        Duration::try_from(at - now).unwrap_or(Duration::ZERO)
    });
    left.max(every)
}

/// Renews every held lease each `every`, in batches of at most
/// [`limits::MAX_BATCH`], until dropped; tells the source which deliveries
/// it renewed. A refused renewal, or a lease the store could not renew
/// before it expired, is lost. A slow round delays the next one rather
/// than being cut short at the period: what it renews is still renewed.
pub(crate) async fn renew_loop<S: Source>(
    store: Arc<dyn TaskStore>,
    source: Arc<S>,
    held: Arc<HeldLeases<S::Receipt>>,
    clock: Arc<dyn Clock>,
    every: Duration,
    lease_duration: Duration,
) where
    S::Receipt: Clone,
{
    // On a fixed period, however long a renewal takes (a slow one delays
    // the next, never shifts them all).
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let all = held.leases();
        for chunk in all.chunks(limits::MAX_BATCH) {
            let mut batch = chunk.to_vec();
            let wait = answer_within(&batch, clock.now(), every);
            match tokio::time::timeout(wait, store.renew_many(&mut batch, lease_duration)).await {
                Ok(Ok(answers)) => {
                    let receipts: Vec<S::Receipt> = batch
                        .iter()
                        .zip(answers)
                        .filter_map(|(lease, answer)| held.renewed(lease, answer))
                        .collect();
                    if !receipts.is_empty() {
                        source.renewed(receipts.iter().collect(), lease_duration).await;
                    }
                }
                Ok(Err(error)) => tracing::warn!(%error, leases = batch.len(), "lease renewal failed"),
                Err(_) => tracing::warn!(leases = batch.len(), "lease renewal timed out"),
            }
        }
        held.expire(clock.now());
    }
}
