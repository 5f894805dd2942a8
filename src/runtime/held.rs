//! The leases a consumer holds — ready (claimed, work not started yet) or
//! running — and the loop that renews them in batched requests
//! ([`TaskStore::renew_many`]) and tells a work function when its lease is
//! lost.
//!
//! A ready lease is held short (the consumer's `ready_lease`) and renewed
//! to that length each round, so a crash delays a task nobody started by
//! that much only; once its work starts, the next round lengthens it to the
//! full lease, in the same batched request as the other running leases
//! that are due: starting work costs no round trip of its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::source::Source;
use crate::clock::Clock;
use crate::limits;
use crate::store::{Fenced, Lease, Rejection, TaskStore};
use crate::task::TaskId;

/// One held lease: the lease as last renewed, the delivery's receipt, the
/// lost signal its work function watches, why it was lost, and how it is
/// held: ready or started, and when it was last renewed to the full lease.
struct Entry<R> {
    lease: Lease,
    receipt: R,
    lost: watch::Sender<bool>,
    why: Option<Option<Rejection>>,
    started: bool,
    /// When the lease was last renewed to the full length (`None`: never,
    /// it is still on the claim's ready lease).
    full_since: Option<Instant>,
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
            started: false,
            full_since: None,
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

    /// The task's work starts: the next round of renewals lengthens its
    /// lease to the full length.
    pub(crate) fn start(&self, id: TaskId) {
        if let Some(entry) = self.lock().get_mut(&id) {
            entry.started = true;
        }
    }

    /// The leases a round renews, as last renewed: every ready one (for the
    /// ready length), and every started one not renewed to the full length
    /// within `full_every` (just started, or due) — started ones first.
    fn due(&self, now: Instant, full_every: Duration) -> (Vec<Lease>, Vec<Lease>) {
        let (mut full, mut ready) = (Vec::new(), Vec::new());
        for entry in self.lock().values().filter(|e| e.why.is_none()) {
            if !entry.started {
                ready.push(entry.lease.clone());
            } else if entry
                .full_since
                .is_none_or(|since| now.saturating_duration_since(since) >= full_every)
            {
                full.push(entry.lease.clone());
            }
        }
        (full, ready)
    }

    /// Records a renewal's answer for the task (renewed to the full length
    /// when `full`); the receipt when accepted.
    fn renewed(&self, lease: &Lease, answer: Fenced<()>, full: bool, at: Instant) -> Option<R> {
        let mut entries = self.lock();
        let entry = entries.get_mut(&lease.task_id()).filter(|e| e.why.is_none())?;
        match answer {
            Fenced::Accepted(()) => {
                entry.lease = lease.clone();
                if full {
                    entry.full_since = Some(at);
                }
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

/// How the held leases are renewed: the full lease and how often running
/// work's leases are renewed to it, the ready lease (renewed each round)
/// and the period of a round.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Renewals {
    /// The lease running work is held on, and asked for at each renewal.
    pub(crate) lease_duration: Duration,
    /// How often a running lease is renewed to `lease_duration`.
    pub(crate) renew_every: Duration,
    /// The lease a task is held on until its work starts.
    pub(crate) ready_lease: Duration,
}

impl Renewals {
    /// The period of a round: `renew_every`, shorter while ready leases are
    /// shorter than the full one (a third of the ready lease), so a ready
    /// lease is renewed, and a started one lengthened, well within the
    /// ready lease.
    pub(crate) fn period(&self) -> Duration {
        if self.ready_lease < self.lease_duration {
            self.renew_every
                .min(self.ready_lease / 3)
                .max(Duration::from_millis(1))
        } else {
            self.renew_every
        }
    }
}

/// Renews the held leases each round, in batches of at most
/// [`limits::MAX_BATCH`], until dropped; tells the source which deliveries
/// it renewed and for how long. Started work's leases go to the full lease
/// (the first round after the start, then every `renew_every`); ready ones
/// to the ready lease, every round. A refused renewal, or a lease the store
/// could not renew before it expired, is lost. A slow round delays the next
/// one rather than being cut short at the period: what it renews is still
/// renewed.
pub(crate) async fn renew_loop<S: Source>(
    store: Arc<dyn TaskStore>,
    source: Arc<S>,
    held: Arc<HeldLeases<S::Receipt>>,
    clock: Arc<dyn Clock>,
    renewals: Renewals,
) where
    S::Receipt: Clone,
{
    let every = renewals.period();
    // On a fixed period, however long a renewal takes (a slow one delays
    // the next, never shifts them all).
    let mut ticks = tokio::time::interval_at(Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A running lease renewed a little less than `renew_every` ago is due
    // this round rather than a whole round late.
    let full_every = renewals.renew_every.saturating_sub(every / 2);
    loop {
        ticks.tick().await;
        let (full, ready) = held.due(Instant::now(), full_every);
        // The round's requests side by side: a slow answer to one never
        // delays the other past its leases.
        let batches = full
            .chunks(limits::MAX_BATCH)
            .map(|chunk| (chunk, renewals.lease_duration, true))
            .chain(
                ready
                    .chunks(limits::MAX_BATCH)
                    .map(|chunk| (chunk, renewals.ready_lease, false)),
            )
            .map(|(chunk, extend_by, is_full)| {
                renew_batch(
                    &*store, &*source, &held, &*clock, chunk, extend_by, is_full, every,
                )
            });
        futures_util::future::join_all(batches).await;
        held.expire(clock.now());
    }
}

/// One `renew_many` of `chunk` for `extend_by`, its answers recorded and the
/// source told.
#[allow(clippy::too_many_arguments)] // the loop's state, passed through once
async fn renew_batch<S: Source>(
    store: &dyn TaskStore,
    source: &S,
    held: &HeldLeases<S::Receipt>,
    clock: &dyn Clock,
    chunk: &[Lease],
    extend_by: Duration,
    full: bool,
    every: Duration,
) where
    S::Receipt: Clone,
{
    let mut batch = chunk.to_vec();
    let wait = answer_within(&batch, clock.now(), every);
    let sent = Instant::now();
    match tokio::time::timeout(wait, store.renew_many(&mut batch, extend_by)).await {
        Ok(Ok(answers)) => {
            let receipts: Vec<S::Receipt> = batch
                .iter()
                .zip(answers)
                .filter_map(|(lease, answer)| held.renewed(lease, answer, full, sent))
                .collect();
            if !receipts.is_empty() {
                source.renewed(receipts.iter().collect(), extend_by).await;
            }
        }
        Ok(Err(error)) => tracing::warn!(%error, leases = batch.len(), "lease renewal failed"),
        Err(_) => tracing::warn!(leases = batch.len(), "lease renewal timed out"),
    }
}
