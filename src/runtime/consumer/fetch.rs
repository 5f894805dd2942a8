//! The fetch loop: waits for free slots, fetches deliveries, claims the
//! task ids among them in one request and starts a run per lease.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use super::shared::{Shared, give_back};
use super::task::run_task;
use crate::backend::rules::Work;
use crate::policy::Failure;
use crate::runtime::disposition::settled;
use crate::runtime::source::{Delivery, Source};
use crate::runtime::stop::{Phase, reached};
use crate::runtime::{AckReason, Disposition, LeaveReason, WorkContext};
use crate::store::Lease;
use crate::task::{Response, TaskId};

/// Fetches and starts work until a stop is requested.
pub(super) async fn fetch_loop<S, F, Fut>(shared: &Arc<Shared<S, F>>, runs: &mut JoinSet<()>)
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
            () = reached(&mut phase, Phase::Draining) => return,
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
            return;
        }
        // A fetch under way when a stop comes may finish within the grace;
        // past it (or on a second request) it is dropped, so a slow source
        // never holds the stop: what it took then waits for its own timer
        // (a lease, a message's visibility).
        let fetched = tokio::select! {
            fetched = shared.source.fetch(permits.len(), &claim) => fetched,
            () = reached(&mut phase, Phase::Now) => return,
            () = shared.stop.grace_over(config.grace) => return,
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
            tokio::select! {
                () = tokio::time::sleep(idle) => {}
                () = async { match &wake { Some(wake) => wake.woken().await, None => std::future::pending().await } } => {}
                () = reached(&mut phase, Phase::Draining) => return,
            }
            idle = (idle * 2).min(config.idle_max);
            continue;
        }
        idle = config.idle_min;
        let leased = tokio::select! {
            leased = acquire(shared, deliveries) => leased,
            () = reached(&mut phase, Phase::Now) => return,
            () = shared.stop.grace_over(config.grace) => return,
        };
        if shared.stop.phase() >= Phase::Draining {
            // Fetched as the stop began: give them back untouched (their
            // claims cost no attempt), together, within the release deadline.
            let giving_back = leased
                .into_iter()
                .map(|(lease, receipt)| give_back(shared, lease, receipt, Work::NotStarted));
            let all = futures_util::future::join_all(giving_back);
            if tokio::time::timeout(config.release_deadline, all).await.is_err() {
                tracing::warn!("giving back a fetch timed out; its leases expire on their own");
            }
            return;
        }
        for (lease, receipt) in leased {
            let permit = permits
                .pop()
                .expect("a fetch asks for no more than the free slots");
            runs.spawn(run_task(Arc::clone(shared), lease, receipt, permit));
        }
    }
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
