//! Scaffolding, not for copying: a simulated model provider for the binary's
//! demo run and the tests. Replace it with your provider's client (an
//! implementation of [`ReplyProvider`]). And [`webhook`]: a local receiver of
//! the "reply ready" notifications, standing in for yours; [`auth`]: bearer
//! tokens standing in for your authentication.

pub mod auth;
pub mod webhook;

use std::time::Duration;

use async_trait::async_trait;
use taskfence::Failure;

use crate::worker::ReplyProvider;

/// A stand-in for the LLM provider: answers after a fixed latency with
/// deterministic text, so tests can say which attempt produced a reply. A
/// latency longer than the lease makes a worker that "hangs" mid-call.
#[derive(Debug, Clone)]
pub struct SimulatedLlm {
    latency: Duration,
}

impl SimulatedLlm {
    /// A provider that takes `latency` per call.
    pub fn new(latency: Duration) -> Self {
        Self { latency }
    }

    /// One provider call: `"Reply to: {prompt} (attempt {n})"`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let llm = chat_api::sim::SimulatedLlm::new(std::time::Duration::ZERO);
    /// assert_eq!(llm.complete("hi", 2).await, "Reply to: hi (attempt 2)");
    /// # }
    /// ```
    pub async fn complete(&self, prompt: &str, attempt: u32) -> String {
        tokio::time::sleep(self.latency).await;
        format!("Reply to: {prompt} (attempt {attempt})")
    }
}

#[async_trait]
impl ReplyProvider for SimulatedLlm {
    async fn reply(&self, prompt: &str, attempt: u32) -> Result<String, Failure> {
        Ok(self.complete(prompt, attempt).await)
    }
}
