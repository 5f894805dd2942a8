//! Group commit: the completions of a consumer's work functions, saved by
//! one batched write ([`TaskStore::complete_many`]), each still fenced on
//! its own; each caller hears its own answer once the batch is durable.
//! Up to [`LANES`] batches are written at once, so a batch gathers while the
//! one before it waits for its commit. A batch waits (up to its window) for
//! the completions still on their way: each work function is [`Expected`]
//! from its start until its completion is queued or it ends otherwise.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::error::{Error, Result};
use crate::store::{Fenced, Lease, TaskStore};
use crate::task::{Response, Task};

/// Batches written at once.
const LANES: usize = 4;

/// One completion waiting for its batch.
struct Pending {
    lease: Lease,
    response: Response,
    answer: oneshot::Sender<Result<Fenced<Task>>>,
}

/// A batch that failed as a whole: every completion in it hears this.
#[derive(Debug, thiserror::Error)]
#[error("the batched completion failed: {0}")]
struct BatchFailed(String);

/// The handle work functions complete through; the batching loop runs
/// until every handle is dropped.
#[derive(Clone)]
pub(crate) struct Committer {
    queue: mpsc::UnboundedSender<Pending>,
    /// Completions that may still come: see [`Expected`].
    expected: Arc<AtomicUsize>,
}

impl Committer {
    /// Starts the loop on `store`: a batch is what is queued when the
    /// previous one is done, up to `max`; while a completion is still
    /// [`Expected`], it waits up to `window` for more.
    pub(crate) fn start(
        store: Arc<dyn TaskStore>,
        max: usize,
        window: Duration,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (queue, rx) = mpsc::unbounded_channel();
        let expected = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(batches(store, rx, max, window, Arc::clone(&expected)));
        (Self { queue, expected }, task)
    }

    /// Counts a work function that has started: until it is done, a batch
    /// waits for it rather than closing without its completion.
    pub(crate) fn expect(&self) -> Expected {
        self.expected.fetch_add(1, Ordering::AcqRel);
        Expected {
            count: Arc::clone(&self.expected),
            counted: true,
        }
    }

    /// Saves `response` for `lease` in the next batch; resolves once that
    /// batch is durable (or failed). `expected` is done once it is queued.
    pub(crate) async fn complete(
        &self,
        lease: Lease,
        response: Response,
        mut expected: Expected,
    ) -> Result<Fenced<Task>> {
        let (answer, heard) = oneshot::channel();
        let pending = Pending {
            lease,
            response,
            answer,
        };
        let queued = self.queue.send(pending);
        expected.done();
        if queued.is_err() {
            return Err(Error::storage(BatchFailed("the committer stopped".into())));
        }
        heard
            .await
            .unwrap_or_else(|_| Err(Error::storage(BatchFailed("the committer stopped".into()))))
    }
}

/// A work function whose completion may still come, from its start until
/// its completion is queued or it ends another way ([`done`](Self::done),
/// or dropped): a batch waits for these. Counting only the functions still
/// running would let a batch close between a function's end and its
/// completion's arrival, leaving that completion a batch of its own.
pub(crate) struct Expected {
    count: Arc<AtomicUsize>,
    counted: bool,
}

impl Expected {
    /// No completion will come from this one (or it is queued).
    pub(crate) fn done(&mut self) {
        if std::mem::take(&mut self.counted) {
            self.count.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Expected {
    fn drop(&mut self) {
        self.done();
    }
}

async fn batches(
    store: Arc<dyn TaskStore>,
    mut rx: mpsc::UnboundedReceiver<Pending>,
    max: usize,
    window: Duration,
    expected: Arc<AtomicUsize>,
) {
    let lanes = Arc::new(tokio::sync::Semaphore::new(LANES));
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + window;
        loop {
            while batch.len() < max {
                match rx.try_recv() {
                    Ok(next) => batch.push(next),
                    Err(_) => break,
                }
            }
            // More may come soon: work functions are still running.
            let more_coming = expected.load(Ordering::Acquire) > 0;
            if batch.len() >= max || !more_coming || window.is_zero() {
                break;
            }
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(next)) => batch.push(next),
                Ok(None) | Err(_) => break,
            }
        }
        let lane = Arc::clone(&lanes)
            .acquire_owned()
            .await
            .expect("the lanes are never closed");
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            commit(&*store, batch).await;
            drop(lane);
        });
    }
    // Every handle is gone: wait for the batches still being written.
    let _all = lanes.acquire_many(LANES as u32).await;
}

/// One `complete_many` for the batch (duplicates of one task go alone, as
/// the batch forbids them), each answer to its caller.
async fn commit(store: &dyn TaskStore, batch: Vec<Pending>) {
    let mut seen = std::collections::HashSet::with_capacity(batch.len());
    let (batch, repeats): (Vec<_>, Vec<_>) = batch.into_iter().partition(|p| seen.insert(p.lease.task_id()));
    let mut answers = Vec::with_capacity(batch.len());
    let mut completions = Vec::with_capacity(batch.len());
    for Pending {
        lease,
        response,
        answer,
    } in batch
    {
        completions.push((lease, response));
        answers.push(answer);
    }
    match store.complete_many(completions).await {
        Ok(results) => {
            for (answer, result) in answers.into_iter().zip(results) {
                let _ = answer.send(result);
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "batched completion failed");
            let message = e.to_string();
            for answer in answers {
                let _ = answer.send(Err(Error::storage(BatchFailed(message.clone()))));
            }
        }
    }
    for Pending {
        lease,
        response,
        answer,
    } in repeats
    {
        let _ = answer.send(store.complete(lease, response).await);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use async_trait::async_trait;

    use std::sync::atomic::Ordering;

    use super::Committer;
    use crate::error::Result;
    use crate::intercept::{Intercept, Intercepted};
    use crate::store::{Claim, ClaimRequest, Fenced, Lease, TaskStore};
    use crate::task::{InputHash, NewTask, RequestKey, Response, Task};
    use crate::{MemoryStore, Submitted};

    /// Records the size of every `complete_many` the committer makes.
    struct Batches(Arc<Mutex<Vec<usize>>>);

    #[async_trait]
    impl Intercept for Batches {
        async fn complete_many(
            &self,
            inner: &dyn TaskStore,
            completions: Vec<(Lease, Response)>,
        ) -> Result<Vec<Result<Fenced<Task>>>> {
            self.0.lock().unwrap().push(completions.len());
            inner.complete_many(completions).await
        }
    }

    /// A store recording its batches, and `n` leases claimed on it.
    async fn leased(n: usize) -> (Arc<dyn TaskStore>, Arc<Mutex<Vec<usize>>>, Vec<Lease>) {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let store: Arc<dyn TaskStore> = Arc::new(Intercepted::new(
            Arc::new(MemoryStore::new()),
            Batches(sizes.clone()),
        ));
        let mut leases = Vec::new();
        for i in 0..n {
            let new = NewTask::new(RequestKey::new("u", "op", format!("k{i}")), InputHash::of(["x"]));
            let Submitted::Created(task) = store.submit(new).await.unwrap() else {
                panic!("a new key")
            };
            let request = ClaimRequest::new("w", Duration::from_secs(30));
            let Claim::Acquired(lease) = store.claim(task.id, request).await.unwrap() else {
                panic!("a pending task")
            };
            leases.push(lease);
        }
        (store, sizes, leases)
    }

    #[tokio::test]
    async fn a_batch_waits_for_a_completion_still_expected() {
        let (store, sizes, leases) = leased(2).await;
        let (committer, _batches) = Committer::start(store, 64, Duration::from_secs(30));
        let (first, second) = (committer.expect(), committer.expect());
        let early = {
            let (committer, lease) = (committer.clone(), leases[0].clone());
            tokio::spawn(async move { committer.complete(lease, Response::from("a"), first).await })
        };
        // Once the first completion is queued (only the second is still
        // expected), its batch is waiting; the second work function still runs.
        while committer.expected.load(Ordering::Acquire) != 1 {
            tokio::task::yield_now().await;
        }
        let late = committer
            .complete(leases[1].clone(), Response::from("b"), second)
            .await
            .unwrap();
        assert!(late.is_accepted());
        assert!(early.await.unwrap().unwrap().is_accepted());
        assert_eq!(*sizes.lock().unwrap(), vec![2], "one batch for both");
    }

    #[tokio::test]
    async fn a_batch_does_not_wait_for_work_that_ended_without_a_response() {
        let (store, sizes, leases) = leased(1).await;
        let (committer, _batches) = Committer::start(store, 64, Duration::from_secs(30));
        let (first, mut second) = (committer.expect(), committer.expect());
        // The second work function failed: no completion will come from it.
        second.done();
        let saved = tokio::time::timeout(
            Duration::from_secs(10),
            committer.complete(leases[0].clone(), Response::from("a"), first),
        )
        .await
        .expect("the batch closed without waiting out its 30 s window")
        .unwrap();
        assert!(saved.is_accepted());
        assert_eq!(*sizes.lock().unwrap(), vec![1]);
    }
}
