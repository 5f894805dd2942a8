//! The work function: one provider call per claimed attempt, dropped when
//! the lease is lost (another worker owns the task: this answer could not be
//! saved anyway). The records, offsets, leases and the stop are
//! `taskfence_kafka`'s.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use taskfence::runtime::WorkContext;
use taskfence::{Failure, Response};
use taskfence_kafka::{Event, Journal};

use crate::provider::{Provider, ProviderError, ProviderRequest};

/// What one task's work returns.
pub type WorkFuture = Pin<Box<dyn Future<Output = Result<Response, Failure>> + Send>>;

/// The work: the provider's answer for the task's prompt, the call journaled.
pub async fn work(
    provider: Arc<dyn Provider>,
    journal: Arc<dyn Journal>,
    worker: String,
    ctx: WorkContext,
) -> Result<Response, Failure> {
    let request = ProviderRequest::for_attempt(&ctx);
    let version = ctx.lease().version();
    journal.record(Event::ProviderCall {
        worker,
        task: request.task_id,
        version,
    });
    tokio::select! {
        answer = provider.generate(&request) => answer.map(Response::from).map_err(ProviderError::into_failure),
        () = ctx.lease_lost() => Err(Failure::retryable("lease lost during the provider call")),
    }
}

/// [`work`] as the consumer's work function, for the worker named `worker`.
pub fn work_with(
    provider: Arc<dyn Provider>,
    journal: Arc<dyn Journal>,
    worker: impl Into<String>,
) -> impl Fn(WorkContext) -> WorkFuture + Send + Sync + 'static {
    let worker = worker.into();
    move |ctx| {
        Box::pin(work(
            Arc::clone(&provider),
            Arc::clone(&journal),
            worker.clone(),
            ctx,
        ))
    }
}
