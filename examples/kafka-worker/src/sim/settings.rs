//! The simulated provider's flags (`--provider simulated`): pretend model
//! latency for local runs and tests. Scaffolding: not part of the template.

use std::sync::Arc;
use std::time::Duration;

use taskfence::config::parse_duration;

use super::SimulatedLlm;
use crate::provider::Provider;

/// The simulated provider's settings, flattened into the service's.
#[derive(Debug, Clone, clap::Args)]
pub struct SimSettings {
    /// Simulated provider (local runs): shortest answer time.
    #[arg(long, env = "TASKFENCE_SIM_MIN_LATENCY", default_value = "200ms", value_parser = parse_duration)]
    pub sim_min_latency: Duration,

    /// Simulated provider (local runs): longest answer time.
    #[arg(long, env = "TASKFENCE_SIM_MAX_LATENCY", default_value = "800ms", value_parser = parse_duration)]
    pub sim_max_latency: Duration,

    /// Simulated provider (local runs): answer time of `slow:` prompts.
    #[arg(long, env = "TASKFENCE_SIM_SLOW_LATENCY", default_value = "10s", value_parser = parse_duration)]
    pub sim_slow_latency: Duration,
}

impl SimSettings {
    /// The simulated LLM these settings describe, announced with a warning.
    pub fn provider(&self) -> Arc<dyn Provider> {
        tracing::warn!("using the simulated provider: for local runs and tests only");
        let llm = SimulatedLlm::new(self.sim_min_latency, self.sim_max_latency);
        Arc::new(llm.slow_latency(self.sim_slow_latency))
    }
}
