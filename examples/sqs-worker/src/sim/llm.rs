//! A simulated LLM with the failures a real one has: latency, transient,
//! ambiguous and permanent errors, "answer, then crash the worker" and
//! "answer, then stall past the lease".

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use taskfence::TaskId;

use crate::provider::{Provider, ProviderError, ProviderRequest};
use crate::sim::chaos::{KillSwitch, Stalls};

/// The failures the simulated LLM injects. Rates are fractions in `0.0..=1.0`,
/// decided by a hash of (seed, prompt, attempt), so the same prompts meet
/// the same faults on every run.
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
    /// Calls that answer, then the worker stalls for `stall_for` before it
    /// saves: past its lease, so another worker takes over and the late save
    /// is refused.
    pub stall_after_answer_rate: f64,
    /// How long a stall lasts.
    pub stall_for: Duration,
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
            stall_after_answer_rate: 0.0,
            stall_for: Duration::from_secs(10),
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
    /// Produced an answer, then the worker stalled past its lease before saving it.
    AnsweredThenStalled,
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

/// A simulated LLM: configurable latency, transient, ambiguous and permanent
/// errors, "answer, then crash the worker" and "answer, then stall past the
/// lease". Clones share the call log.
#[derive(Debug, Clone)]
pub struct SimulatedLlm {
    config: SimulatedConfig,
    calls: Arc<Mutex<Vec<Call>>>,
    kill: Option<KillSwitch>,
    stalls: Option<Stalls>,
}

impl SimulatedLlm {
    /// A provider with this behaviour.
    pub fn new(config: SimulatedConfig) -> Self {
        Self {
            config,
            calls: Arc::default(),
            kill: None,
            stalls: None,
        }
    }

    /// The same provider (same log) for one worker: `kill` stops the worker,
    /// `stalls` freezes its store calls for one task.
    pub fn for_worker(&self, kill: KillSwitch, stalls: Stalls) -> Self {
        Self {
            kill: Some(kill),
            stalls: Some(stalls),
            ..self.clone()
        }
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// A reproducible draw in `0.0..1.0` for this prompt, attempt and purpose.
    fn draw(&self, prompt: &str, attempt: u32, purpose: u64) -> f64 {
        let mut x = self.config.seed ^ purpose.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        for byte in prompt.bytes() {
            x = splitmix64(x ^ u64::from(byte));
        }
        x = splitmix64(x ^ u64::from(attempt));
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
        let (prompt, attempt) = (request.prompt.as_str(), request.attempt);
        let task = request.task_id;
        if self.draw(prompt, 0, 1) < c.permanent_rate {
            self.record(request, CallOutcome::Permanent, None);
            return Err(ProviderError::Permanent(
                "content policy refused the prompt".into(),
            ));
        }
        if self.draw(prompt, attempt, 2) < c.transient_rate {
            self.record(request, CallOutcome::Transient, None);
            return Err(ProviderError::Transient("503 service unavailable".into()));
        }
        let spread = c.max_latency.saturating_sub(c.min_latency);
        tokio::time::sleep(c.min_latency + spread.mul_f64(self.draw(prompt, attempt, 3))).await;
        let answer = format!("answer to {task} by attempt {attempt}: {}", request.prompt);
        if self.draw(prompt, attempt, 4) < c.ambiguous_rate {
            self.record(request, CallOutcome::Ambiguous, Some(answer.clone()));
            return Err(ProviderError::Ambiguous("timed out reading the response".into()));
        }
        if let Some(kill) = self
            .kill
            .as_ref()
            .filter(|_| self.draw(prompt, attempt, 5) < c.crash_after_answer_rate)
        {
            // The model answered (and billed); the worker dies before saving it.
            self.record(request, CallOutcome::AnsweredThenCrashed, Some(answer));
            kill.pull();
            // The supervisor drops this worker now; this future never resumes.
            return std::future::pending().await;
        }
        if let Some(stalls) = self
            .stalls
            .as_ref()
            .filter(|_| self.draw(prompt, attempt, 6) < c.stall_after_answer_rate)
        {
            // The answer is back; the worker freezes before it can save it.
            self.record(request, CallOutcome::AnsweredThenStalled, Some(answer.clone()));
            stalls.stall(task, c.stall_for);
            return Ok(answer);
        }
        self.record(request, CallOutcome::Answered, Some(answer.clone()));
        Ok(answer)
    }
}
