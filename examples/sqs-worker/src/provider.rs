//! The model provider the worker calls: a trait, a simulated LLM with the
//! failures a real one has, and the place where a real HTTP provider plugs in.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use taskfence::{Failure, TaskId};
use tokio::sync::Notify;

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

#[async_trait]
impl Provider for HttpProvider {
    async fn generate(&self, _request: &ProviderRequest) -> Result<String, ProviderError> {
        Err(ProviderError::Permanent(format!(
            "HttpProvider for {} is a template: plug an HTTP client in here",
            self.url
        )))
    }
}

/// The failures the simulated LLM injects. Rates are fractions in `0.0..=1.0`,
/// decided by a hash of (seed, task, attempt) so a run is reproducible.
#[derive(Debug, Clone, PartialEq)]
pub struct SimulatedConfig {
    /// Shortest time to answer.
    pub min_latency: Duration,
    /// Longest time to answer.
    pub max_latency: Duration,
    /// Calls that fail before reaching the model (retry is safe).
    pub transient_rate: f64,
    /// Calls that time out after the model ran (answer lost).
    pub ambiguous_rate: f64,
    /// Tasks the model always refuses (same decision on every attempt).
    pub permanent_rate: f64,
    /// Calls that answer, then the worker dies before saving the answer.
    pub crash_after_answer_rate: f64,
    /// Seed of every decision.
    pub seed: u64,
}

impl Default for SimulatedConfig {
    fn default() -> Self {
        Self {
            min_latency: Duration::from_millis(200),
            max_latency: Duration::from_millis(800),
            transient_rate: 0.0,
            ambiguous_rate: 0.0,
            permanent_rate: 0.0,
            crash_after_answer_rate: 0.0,
            seed: 7,
        }
    }
}

/// What a simulated call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallOutcome {
    /// Returned an answer.
    Answered,
    /// Produced an answer, then the worker was killed before it could save it.
    AnsweredThenCrashed,
    /// Failed before doing any work.
    Transient,
    /// The model ran, the answer was lost on the way back.
    Ambiguous,
    /// Refused for good.
    Permanent,
}

/// One call as the simulated provider saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The task.
    pub task_id: TaskId,
    /// The attempt that called.
    pub attempt: u32,
    /// What happened.
    pub outcome: CallOutcome,
    /// The answer produced, if the model ran to the end.
    pub answer: Option<String>,
}

/// Kills one worker the hard way. The supervisor waits on it; the simulated
/// provider pulls it.
#[derive(Debug, Clone, Default)]
pub struct KillSwitch(Arc<Notify>);

impl KillSwitch {
    /// A switch not yet pulled.
    pub fn new() -> Self {
        Self::default()
    }
    /// Pulls the switch.
    pub fn pull(&self) {
        self.0.notify_one();
    }
    /// Resolves once the switch is pulled.
    pub async fn pulled(&self) {
        self.0.notified().await;
    }
}

/// A simulated LLM: configurable latency, transient, ambiguous and permanent
/// errors, and "answer, then crash the worker". Clones share the call log.
#[derive(Debug, Clone)]
pub struct SimulatedLlm {
    config: SimulatedConfig,
    calls: Arc<Mutex<Vec<Call>>>,
    kill: Option<KillSwitch>,
}

impl SimulatedLlm {
    /// A provider with this behaviour.
    pub fn new(config: SimulatedConfig) -> Self {
        Self {
            config,
            calls: Arc::default(),
            kill: None,
        }
    }

    /// The same provider (same log) for one worker, which `kill` stops.
    pub fn for_worker(&self, kill: KillSwitch) -> Self {
        Self {
            kill: Some(kill),
            ..self.clone()
        }
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// A reproducible draw in `0.0..1.0` for this task, attempt and purpose.
    fn draw(&self, task: TaskId, attempt: u32, purpose: u64) -> f64 {
        let id = task.as_uuid().as_u128();
        let mut x = self.config.seed ^ purpose.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        for part in [(id >> 64) as u64, id as u64, u64::from(attempt)] {
            x = splitmix64(x ^ part);
        }
        (x >> 11) as f64 / (1u64 << 53) as f64
    }

    fn record(&self, request: &ProviderRequest, outcome: CallOutcome, answer: Option<String>) {
        self.calls.lock().unwrap().push(Call {
            task_id: request.task_id,
            attempt: request.attempt,
            outcome,
            answer,
        });
    }
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[async_trait]
impl Provider for SimulatedLlm {
    async fn generate(&self, request: &ProviderRequest) -> Result<String, ProviderError> {
        let c = &self.config;
        let (task, attempt) = (request.task_id, request.attempt);
        if self.draw(task, 0, 1) < c.permanent_rate {
            self.record(request, CallOutcome::Permanent, None);
            return Err(ProviderError::Permanent(
                "content policy refused the prompt".into(),
            ));
        }
        if self.draw(task, attempt, 2) < c.transient_rate {
            self.record(request, CallOutcome::Transient, None);
            return Err(ProviderError::Transient("503 service unavailable".into()));
        }
        let spread = c.max_latency.saturating_sub(c.min_latency);
        tokio::time::sleep(c.min_latency + spread.mul_f64(self.draw(task, attempt, 3))).await;
        let answer = format!("answer to {task} by attempt {attempt}: {}", request.prompt);
        if self.draw(task, attempt, 4) < c.ambiguous_rate {
            self.record(request, CallOutcome::Ambiguous, Some(answer.clone()));
            return Err(ProviderError::Ambiguous("timed out reading the response".into()));
        }
        if let Some(kill) = self
            .kill
            .as_ref()
            .filter(|_| self.draw(task, attempt, 5) < c.crash_after_answer_rate)
        {
            // The model answered (and billed); the worker dies before saving it.
            self.record(request, CallOutcome::AnsweredThenCrashed, Some(answer));
            kill.pull();
            // The supervisor drops this worker now; this future never resumes.
            return std::future::pending().await;
        }
        self.record(request, CallOutcome::Answered, Some(answer.clone()));
        Ok(answer)
    }
}
