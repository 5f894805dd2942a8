//! The fetch loop: waits for free slots, fetches deliveries, claims the
//! task ids among them in one request and starts a run per lease.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::shared::{Shared, give_back};
use super::task::run_task;
use crate::backend::rules::Work;
use crate::policy::Failure;
use crate::runtime::disposition::settled;
use crate::runtime::source::{Delivery, Source, Wake};
use crate::runtime::stop::{Phase, reached};
use crate::runtime::{AckReason, Disposition, LeaveReason, WorkContext};
use crate::store::Lease;
use crate::task::{Response, TaskId};

/// Fetches and starts work until a stop is requested. Returns the release
/// deadline when the stop found a fetch under way past the grace (see
/// [`within_stop`]): the rest of the stop keeps to it.
pub(super) async fn fetch_loop<S, F, Fut>(
    shared: &Arc<Shared<S, F>>,
    runs: &mut JoinSet<()>,
) -> Option<Instant>
where
    S: Source,
    S::Receipt: Clone,
    F: Fn(WorkContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = std::result::Result<Response, Failure>> + Send + 'static,
{
    let config = &shared.config;
    let claim = config.claim();
    // A slot per task held: running, or ready to run.
    let slots = Arc::new(Semaphore::new(config.concurrency + config.prefetch));
    let wake = shared.source.wake();
    let mut phase = shared.stop.watch();
    let mut idle = config.idle_min;
    // Whether the last fetch came back full: more is likely waiting.
    let mut backlog = false;
    loop {
        while runs.try_join_next().is_some() {}
        let first = tokio::select! {
            permit = Arc::clone(&slots).acquire_owned() => permit.expect("the semaphore is never closed"),
            () = reached(&mut phase, Phase::Draining) => return None,
        };
        let mut permits = vec![first];
        while permits.len() < config.fetch {
            match Arc::clone(&slots).try_acquire_owned() {
                Ok(permit) => permits.push(permit),
                Err(_) => break,
            }
        }
        // Under a backlog (the last fetch came back full), wait a moment
        // for every slot: work that ends within the wait gives its slot to
        // this fetch, so one fetch and one commit serve them all instead
        // of the slots splitting into halves that fetch in turn. Without a
        // backlog, fetch at once: waiting would only delay the pickup.
        let refill = (config.concurrency + config.prefetch).clamp(1, config.fetch);
        if backlog
            && permits.len() < refill
            && let Ok(Ok(more)) = tokio::time::timeout(
                REFILL_WAIT,
                Arc::clone(&slots)
                    .acquire_many_owned(u32::try_from(refill - permits.len()).unwrap_or(u32::MAX)),
            )
            .await
        {
            permits.extend(split(more));
        }
        if shared.stop.phase() >= Phase::Draining {
            return None;
        }
        let mut releasing = None;
        let fetch = shared.source.fetch(permits.len(), &claim);
        let Some(fetched) = within_stop(shared, &mut phase, &mut releasing, fetch).await else {
            return releasing;
        };
        let deliveries = match fetched {
            Ok(deliveries) if !deliveries.is_empty() => deliveries,
            Ok(_) => Vec::new(),
            Err(error) => {
                tracing::warn!(%error, "fetch failed");
                Vec::new()
            }
        };
        backlog = deliveries.len() >= permits.len();
        if deliveries.is_empty() {
            drop(permits);
            if idle_wait(idle, wake.as_ref(), &mut phase).await {
                return releasing;
            }
            idle = (idle * 2).min(config.idle_max);
            continue;
        }
        idle = config.idle_min;
        // A short fetch from a source it drained: nothing more is there
        // now, so the next look waits as after an empty one (not doubling).
        let drained = !backlog && shared.source.short_fetch_drains();
        let claimed = acquire(shared, deliveries);
        let Some(leased) = within_stop(shared, &mut phase, &mut releasing, claimed).await else {
            return releasing;
        };
        if shared.stop.phase() >= Phase::Draining {
            // Fetched as the stop began: give them back untouched (their
            // claims cost no attempt), together, within the release deadline.
            let giving_back = leased
                .into_iter()
                .map(|(lease, receipt)| give_back(shared, lease, receipt, Work::NotStarted));
            let all = futures_util::future::join_all(giving_back);
            let until = releasing.unwrap_or_else(|| Instant::now() + config.release_deadline);
            if tokio::time::timeout_at(until, all).await.is_err() {
                tracing::warn!("giving back a fetch timed out; its leases expire on their own");
            }
            return releasing;
        }
        for (lease, receipt) in leased {
            let permit = permits
                .pop()
                .expect("a fetch asks for no more than the free slots");
            runs.spawn(run_task(Arc::clone(shared), lease, receipt, permit));
        }
        drop(permits);
        if drained && idle_wait(idle, wake.as_ref(), &mut phase).await {
            return releasing;
        }
    }
}

/// Waits `idle` for work to arrive, ended early by the source's wake-up.
/// True when the stop reached [`Phase::Draining`] meanwhile.
async fn idle_wait(idle: Duration, wake: Option<&Wake>, phase: &mut watch::Receiver<Phase>) -> bool {
    tokio::select! {
        () = tokio::time::sleep(idle) => false,
        () = async { match wake { Some(wake) => wake.woken().await, None => std::future::pending().await } } => false,
        () = reached(phase, Phase::Draining) => true,
    }
}

/// `step` (a fetch, or the claims of its deliveries) to its end, unless
/// the stop passes its grace or is asked for twice and `step` then does
/// not end within the release deadline (`None`: it is dropped, so a slow
/// source never holds the stop, and what it took waits for its own timer,
/// a lease or a message's visibility). Past the grace the stop becomes
/// [`Phase::Now`] for every run at once, and `releasing` holds the release
/// deadline the stop keeps to from then on.
///
/// A step under way is waited for rather than dropped at once: a claim
/// already on its way to the store may be made even if its caller is
/// gone, and would then leave its task unreachable until its lease runs
/// out, where a finished step's leases are given back at once.
async fn within_stop<S, F, T>(
    shared: &Shared<S, F>,
    phase: &mut watch::Receiver<Phase>,
    releasing: &mut Option<Instant>,
    step: impl Future<Output = T>,
) -> Option<T>
where
    S: Source,
{
    tokio::pin!(step);
    let until = match *releasing {
        Some(until) => until,
        None => {
            tokio::select! {
                done = &mut step => return Some(done),
                () = reached(phase, Phase::Now) => {}
                () = shared.stop.grace_over(shared.config.grace) => shared.stop.now(),
            }
            *releasing.insert(Instant::now() + shared.config.release_deadline)
        }
    };
    tokio::time::timeout_at(until, step).await.ok()
}

/// The leases of a fetch: the source's own, and those its task ids got in
/// one `claim_many`; every other delivery is settled here (done, busy,
/// backing off, a duplicate in the fetch, or a claim that failed).
async fn acquire<S, F>(
    shared: &Shared<S, F>,
    deliveries: Vec<Delivery<S::Receipt>>,
) -> Vec<(Lease, S::Receipt)>
where
    S: Source,
{
    let mut leased = Vec::with_capacity(deliveries.len());
    let mut ids: Vec<TaskId> = Vec::new();
    let mut receipts = Vec::new();
    for delivery in deliveries {
        match delivery {
            Delivery::Leased(lease, receipt) => leased.push((lease, receipt)),
            Delivery::Task(id, receipt) if ids.contains(&id) => {
                // The same task twice in one fetch: the first delivery stands for both.
                shared
                    .settle(receipt, Disposition::Ack(AckReason::AlreadyCompleted))
                    .await;
            }
            Delivery::Task(id, receipt) => {
                ids.push(id);
                receipts.push(receipt);
            }
        }
    }
    if ids.is_empty() {
        return leased;
    }
    match shared.store.claim_many(&ids, shared.config.claim()).await {
        Ok(claims) => {
            for (claim, receipt) in claims.into_iter().zip(receipts) {
                match settled(claim, |at, reason| shared.retry_at(at, reason)) {
                    Err(lease) => leased.push((lease, receipt)),
                    Ok(disposition) => shared.settle(receipt, disposition).await,
                }
            }
        }
        Err(error) => {
            tracing::warn!(%error, "claiming a fetch failed; its messages come back on their own");
            for receipt in receipts {
                shared
                    .settle(receipt, Disposition::Leave(LeaveReason::StoreFailed))
                    .await;
            }
        }
    }
    leased
}

/// How long a fetch under a backlog waits for the slots of work still
/// running to come back.
const REFILL_WAIT: Duration = Duration::from_millis(2);

/// One permit of several as one permit each.
fn split(mut permits: OwnedSemaphorePermit) -> Vec<OwnedSemaphorePermit> {
    let mut out = Vec::with_capacity(permits.num_permits());
    while permits.num_permits() > 1 {
        out.push(permits.split(1).expect("more than one permit is held"));
    }
    out.push(permits);
    out
}
