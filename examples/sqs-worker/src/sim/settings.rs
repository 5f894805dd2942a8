//! The simulated provider's flags (`--provider simulated`): pretend model
//! latency and transient failures for local runs and tests, with the
//! former names of two of them. Scaffolding: not part of the template.

use std::sync::Arc;
use std::time::Duration;

use taskfence::config::{Renamed, parse_duration};

use super::{SimulatedConfig, SimulatedLlm};
use crate::provider::Provider;

/// The simulated provider's settings, flattened into the service's.
#[derive(Debug, Clone, clap::Args)]
pub struct SimSettings {
    /// Simulated provider (local runs only): shortest answer time.
    #[arg(long, env = "TASKFENCE_SIM_MIN_LATENCY", default_value = "200ms", value_parser = parse_duration)]
    pub sim_min_latency: Duration,

    /// Simulated provider (local runs only): longest answer time.
    #[arg(long, env = "TASKFENCE_SIM_MAX_LATENCY", default_value = "800ms", value_parser = parse_duration)]
    pub sim_max_latency: Duration,

    /// The former `--sim-latency-min` / `TASKFENCE_SIM_LATENCY_MIN`, read as
    /// --sim-min-latency until 0.3 (see [`SimSettings::read_former_names`]).
    #[arg(
        long = "sim-latency-min",
        env = "TASKFENCE_SIM_LATENCY_MIN",
        hide = true,
        value_parser = parse_duration,
        conflicts_with = "sim_min_latency"
    )]
    sim_latency_min: Option<Duration>,

    /// The former `--sim-latency-max` / `TASKFENCE_SIM_LATENCY_MAX`, read as
    /// --sim-max-latency until 0.3 (see [`SimSettings::read_former_names`]).
    #[arg(
        long = "sim-latency-max",
        env = "TASKFENCE_SIM_LATENCY_MAX",
        hide = true,
        value_parser = parse_duration,
        conflicts_with = "sim_max_latency"
    )]
    sim_latency_max: Option<Duration>,

    /// Simulated provider (local runs only): fraction of calls failing transiently.
    #[arg(long, env = "TASKFENCE_SIM_TRANSIENT_RATE", default_value_t = 0.0)]
    pub sim_transient_rate: f64,
}

impl SimSettings {
    /// Reads the former names into the current settings, returning a
    /// deprecation for each one given.
    pub fn read_former_names(&mut self) -> Vec<Renamed> {
        let mut renamed = Vec::new();
        if let Some(latency) = self.sim_latency_min.take() {
            self.sim_min_latency = latency;
            renamed.push(Renamed::new(
                "--sim-latency-min / TASKFENCE_SIM_LATENCY_MIN",
                "--sim-min-latency / TASKFENCE_SIM_MIN_LATENCY",
            ));
        }
        if let Some(latency) = self.sim_latency_max.take() {
            self.sim_max_latency = latency;
            renamed.push(Renamed::new(
                "--sim-latency-max / TASKFENCE_SIM_LATENCY_MAX",
                "--sim-max-latency / TASKFENCE_SIM_MAX_LATENCY",
            ));
        }
        renamed
    }

    /// The simulated LLM these settings describe.
    pub fn provider(&self) -> Arc<dyn Provider> {
        Arc::new(SimulatedLlm::new(SimulatedConfig {
            min_latency: self.sim_min_latency,
            max_latency: self.sim_max_latency.max(self.sim_min_latency),
            transient_rate: self.sim_transient_rate,
            ..SimulatedConfig::default()
        }))
    }
}
