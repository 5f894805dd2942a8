//! The model provider the worker calls, and a simulated LLM for runs without one.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use taskfence::runtime::WorkContext;
use taskfence::{Failure, Response};

use crate::journal::{Event, Journal};

/// The expensive, non-idempotent call a task stands for (an LLM reply).
///
/// It runs outside any transaction and may run more than once per task (a
/// retry after a failure, a takeover after a crash); taskfence saves one result.
#[async_trait]
pub trait Provider: Send + Sync {
    /// Produces the reply for the task in `ctx`, or a failure for its retry policy.
    async fn reply(&self, ctx: &WorkContext) -> Result<Response, Failure>;
}

/// How the simulated model treats a task, read from the start of its payload.
///
/// | payload starts with | behaviour |
/// | --- | --- |
/// | `flaky:` | a retryable error on attempts 1 and 2, a reply from attempt 3 |
/// | `down:` | a retryable error on every attempt (exhausts the budget) |
/// | `refuse:` | a permanent error (terminal at once) |
/// | anything else | a reply |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Script {
    /// Always replies.
    Reply,
    /// Fails retryably on the first two attempts.
    Flaky,
    /// Always fails retryably.
    Down,
    /// Fails permanently.
    Refuse,
}

impl Script {
    /// The script a payload asks for.
    ///
    /// ```
    /// use kafka_worker::provider::Script;
    /// assert_eq!(Script::of(b"flaky:hello"), Script::Flaky);
    /// assert_eq!(Script::of(b"hello"), Script::Reply);
    /// ```
    pub fn of(payload: &[u8]) -> Self {
        if payload.starts_with(b"flaky:") {
            Script::Flaky
        } else if payload.starts_with(b"down:") {
            Script::Down
        } else if payload.starts_with(b"refuse:") {
            Script::Refuse
        } else {
            Script::Reply
        }
    }
}

/// A stand-in LLM: waits a latency derived from the task id (so records of one
/// partition finish out of order), then answers according to the payload's
/// [`Script`]. Every call is recorded in the journal as it starts.
pub struct SimulatedLlm {
    journal: Arc<dyn Journal>,
    min_latency: Duration,
    max_latency: Duration,
}

impl SimulatedLlm {
    /// A model answering in `min_latency..=max_latency`.
    pub fn new(journal: Arc<dyn Journal>, min_latency: Duration, max_latency: Duration) -> Self {
        Self {
            journal,
            min_latency,
            max_latency: max_latency.max(min_latency),
        }
    }

    fn latency(&self, seed: u128) -> Duration {
        let span = (self.max_latency - self.min_latency).as_millis().max(1);
        // Mix the bits: UUID v7 ids share their high (time) bits.
        let mixed = (seed ^ (seed >> 64)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.min_latency + Duration::from_millis(((mixed >> 7) % span) as u64)
    }
}

impl std::fmt::Debug for SimulatedLlm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatedLlm")
            .field("min_latency", &self.min_latency)
            .field("max_latency", &self.max_latency)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Provider for SimulatedLlm {
    async fn reply(&self, ctx: &WorkContext) -> Result<Response, Failure> {
        let lease = ctx.lease();
        let task = ctx.task();
        self.journal.record(Event::ProviderCall {
            worker: lease.worker().to_owned(),
            task: task.id,
            version: lease.version(),
        });
        tokio::time::sleep(self.latency(task.id.as_uuid().as_u128() ^ u128::from(lease.version()))).await;
        let prompt = String::from_utf8_lossy(&task.payload);
        match Script::of(&task.payload) {
            Script::Flaky if lease.attempt() <= 2 => Err(Failure::retryable("model overloaded (503)")),
            Script::Down => Err(Failure::retryable("model unavailable (503)")),
            Script::Refuse => Err(Failure::permanent("prompt rejected (400)")),
            _ => Ok(Response::from(format!(
                "reply to {prompt} (attempt {})",
                lease.attempt()
            ))),
        }
    }
}
