//! The work function: what the worker does with each task it acquired
//! (the queue, the claims, the leases and the stop are `taskfence_sqs`'s).

use std::sync::Arc;

use taskfence::runtime::WorkContext;
use taskfence::{Failure, Fenced, Response};

use crate::provider::{Provider, ProviderError, ProviderRequest};

/// The work: record the operation id, call the provider, stop if the lease is lost.
pub async fn work(ctx: WorkContext, provider: Arc<dyn Provider>) -> Result<Response, Failure> {
    let task = ctx.task();
    let request = ProviderRequest {
        task_id: task.id,
        attempt: ctx.lease().attempt(),
        idempotency_key: task.id.to_string(),
        prompt: String::from_utf8_lossy(&task.payload).into_owned(),
    };
    // Save the operation id *before* the call: if this worker dies after the
    // provider accepted the request, the next attempt can find it in
    // `attempts()` and look the operation up (or reuse the key) instead of
    // paying twice. A refusal here means the lease is gone: do not call at all.
    match ctx.record_operation(&request.idempotency_key).await {
        Ok(Fenced::Accepted(())) => {}
        Ok(Fenced::Rejected(rejection)) => {
            return Err(Failure::retryable(format!(
                "not calling the provider: {rejection}"
            )));
        }
        Err(error) => {
            return Err(Failure::retryable(format!(
                "could not record the operation: {error}"
            )));
        }
    }
    tokio::select! {
        answer = provider.generate(&request) => answer.map(Response::from).map_err(ProviderError::into_failure),
        // Another worker owns the task now; our answer could not be saved anyway.
        _ = ctx.lease_lost() => Err(Failure::retryable("lease lost during the provider call")),
    }
}
