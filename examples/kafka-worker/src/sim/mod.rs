//! Test scaffolding, not part of the template: a simulated LLM for runs
//! without a real provider (and its `--sim-*` flags), and the journal checker the tests prove the
//! commit discipline with. Copy nothing from here into a real worker.

use std::time::Duration;

use async_trait::async_trait;

use crate::provider::{Provider, ProviderError, ProviderRequest};

pub mod journal;
pub mod settings;

pub use journal::{Checked, MemoryJournal, Violation, check};
pub use settings::SimSettings;

/// How the simulated model treats a task, read from the start of its payload.
///
/// | payload starts with | behaviour |
/// | --- | --- |
/// | `flaky:` | a transient error on attempts 1 and 2, a reply from attempt 3 |
/// | `down:` | a transient error on every attempt (exhausts the budget) |
/// | `refuse:` | a permanent error (terminal at once) |
/// | `slow:` | a reply after the slow latency ([`SimulatedLlm::slow_latency`]) |
/// | `hang:` | no answer, ever (a provider call stuck until the worker gives up) |
/// | anything else | a reply |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Script {
    /// Always replies.
    Reply,
    /// Fails transiently on the first two attempts.
    Flaky,
    /// Always fails transiently.
    Down,
    /// Fails permanently.
    Refuse,
    /// Replies after the slow latency.
    Slow,
    /// Never answers.
    Hang,
}

impl Script {
    /// The script a payload asks for.
    ///
    /// ```
    /// use kafka_worker::sim::Script;
    /// assert_eq!(Script::of(b"flaky:hello"), Script::Flaky);
    /// assert_eq!(Script::of(b"hang:hello"), Script::Hang);
    /// assert_eq!(Script::of(b"hello"), Script::Reply);
    /// ```
    pub fn of(payload: &[u8]) -> Self {
        const PREFIXES: [(&[u8], Script); 5] = [
            (b"flaky:", Script::Flaky),
            (b"down:", Script::Down),
            (b"refuse:", Script::Refuse),
            (b"slow:", Script::Slow),
            (b"hang:", Script::Hang),
        ];
        PREFIXES
            .iter()
            .find(|(prefix, _)| payload.starts_with(prefix))
            .map_or(Script::Reply, |(_, script)| *script)
    }
}

/// A stand-in LLM: waits a latency derived from the task id and attempt (so
/// records of one partition finish out of order), then answers according to
/// the prompt's [`Script`].
#[derive(Debug, Clone)]
pub struct SimulatedLlm {
    min_latency: Duration,
    max_latency: Duration,
    slow_latency: Duration,
}

impl SimulatedLlm {
    /// A model answering in `min_latency..=max_latency` (`slow:` prompts: 10 s).
    pub fn new(min_latency: Duration, max_latency: Duration) -> Self {
        Self {
            min_latency,
            max_latency: max_latency.max(min_latency),
            slow_latency: Duration::from_secs(10),
        }
    }

    /// Sets how long a `slow:` prompt takes.
    pub fn slow_latency(mut self, latency: Duration) -> Self {
        self.slow_latency = latency;
        self
    }

    fn latency(&self, seed: u128) -> Duration {
        let span = (self.max_latency - self.min_latency).as_millis().max(1);
        // Mix the bits: UUID v7 ids share their high (time) bits.
        let mixed = (seed ^ (seed >> 64)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.min_latency + Duration::from_millis(((mixed >> 7) % span) as u64)
    }
}

#[async_trait]
impl Provider for SimulatedLlm {
    async fn generate(&self, request: &ProviderRequest) -> Result<String, ProviderError> {
        let script = Script::of(request.prompt.as_bytes());
        let latency = match script {
            Script::Slow => self.slow_latency,
            Script::Hang => return std::future::pending().await,
            _ => self.latency(request.task_id.as_uuid().as_u128() ^ u128::from(request.attempt)),
        };
        tokio::time::sleep(latency).await;
        match script {
            Script::Flaky if request.attempt <= 2 => {
                Err(ProviderError::Transient("model overloaded (503)".into()))
            }
            Script::Down => Err(ProviderError::Transient("model unavailable (503)".into())),
            Script::Refuse => Err(ProviderError::Permanent("prompt rejected (400)".into())),
            _ => Ok(format!(
                "reply to {} (attempt {})",
                request.prompt, request.attempt
            )),
        }
    }
}
