//! The model provider the worker calls: the trait, how its failures are
//! classified, and the place where a real HTTP provider plugs in. (The
//! simulated LLM the tests and the demo use lives in `sim`.)

use async_trait::async_trait;
use taskfence::{Failure, TaskId};

/// One call to the provider.
#[derive(Debug, Clone)]
pub struct ProviderRequest {
    /// The task the answer is for.
    pub task_id: TaskId,
    /// The attempt making the call (1-based; every claim is one attempt).
    pub attempt: u32,
    /// The idempotency key sent to the provider. It is the task id, the same
    /// for every attempt, so a provider that honours keys returns the first
    /// operation's result instead of generating (and billing) a second one.
    pub idempotency_key: String,
    /// The prompt (here: the task's payload).
    pub prompt: String,
}

/// How a provider call failed. The classification drives the retry policy:
/// do not call a timeout "transient" when the request may have been processed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// Nothing happened remotely (connection refused, 429, 503 before
    /// processing): retrying is safe.
    #[error("transient: {0}")]
    Transient(String),
    /// The request itself is wrong (400, content policy): retrying cannot help.
    #[error("permanent: {0}")]
    Permanent(String),
    /// The request may have reached the provider and no answer came back
    /// (timeout after sending, connection reset mid-response). The task's
    /// `on_ambiguous` policy decides whether to pay for a possible duplicate.
    #[error("ambiguous: {0}")]
    Ambiguous(String),
}

impl ProviderError {
    /// The failure reported to the task store.
    pub fn into_failure(self) -> Failure {
        match self {
            ProviderError::Transient(m) => Failure::retryable(m),
            ProviderError::Permanent(m) => Failure::permanent(m),
            ProviderError::Ambiguous(m) => Failure::ambiguous(m),
        }
    }
}

/// A model provider: one request in, one candidate answer out. The answer
/// becomes *the* reply only if the worker's completion is accepted.
#[async_trait]
pub trait Provider: Send + Sync {
    /// Generates a candidate answer.
    async fn generate(&self, request: &ProviderRequest) -> Result<String, ProviderError>;
}

/// Where a real provider goes. With `reqwest` it would be:
///
/// ```text
/// let response = self.http
///     .post(&self.url)
///     .bearer_auth(&self.api_key)
///     // Only worth sending if the provider documents what a repeated key does
///     // (returns the first result? for how long? with which payload rules?).
///     .header("Idempotency-Key", &request.idempotency_key)
///     .json(&json!({ "prompt": request.prompt }))
///     .timeout(Duration::from_secs(60))
///     .send()
///     .await;
/// match response {
///     Err(e) if e.is_connect() => Err(ProviderError::Transient(e.to_string())),
///     // Sent, no answer: it may have run (and been billed). Not "transient".
///     Err(e) => Err(ProviderError::Ambiguous(e.to_string())),
///     Ok(r) if r.status() == 429 || r.status() == 503 => Err(ProviderError::Transient(r.status().to_string())),
///     Ok(r) if r.status().is_client_error() => Err(ProviderError::Permanent(r.status().to_string())),
///     Ok(r) if !r.status().is_success() => Err(ProviderError::Ambiguous(r.status().to_string())),
///     Ok(r) => Ok(r.json::<Reply>().await.map_err(|e| ProviderError::Ambiguous(e.to_string()))?.text),
/// }
/// ```
///
/// If the provider assigns the operation id itself (an async job API), save
/// it with `WorkContext::record_operation` *as soon as it is returned*, and on
/// a later attempt look the operation up before starting a new one. If you
/// choose the id (an idempotency key), record it *before* the call, as
/// `worker::work` does. The example ships no HTTP client so that its build
/// stays small; the struct marks the spot.
#[derive(Debug, Clone)]
pub struct HttpProvider {
    /// The endpoint, e.g. `https://api.example.com/v1/generate`.
    pub url: String,
}

impl HttpProvider {
    /// The provider at `url`: build the HTTP client here (timeouts, API key
    /// from the environment or a secrets manager). The template refuses, so an
    /// unmodified deploy stops at start-up instead of failing every task.
    pub fn connect(url: impl Into<String>) -> Result<Self, crate::BoxError> {
        let url = url.into();
        Err(format!(
            "HttpProvider ({url}) is a template: plug an HTTP client into src/provider.rs \
             (or run with --provider simulated for a local try)"
        )
        .into())
    }
}

#[async_trait]
impl Provider for HttpProvider {
    async fn generate(&self, _request: &ProviderRequest) -> Result<String, ProviderError> {
        Err(ProviderError::Permanent(format!(
            "HttpProvider for {} is a template: plug an HTTP client in here",
            self.url
        )))
    }
}
