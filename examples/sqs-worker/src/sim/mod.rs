//! Test and demo scaffolding, not part of the template: the simulated LLM,
//! the injected faults, a supervisor that restarts killed workers, and the
//! scenario driver with its report. Copy the other modules; leave this one.

pub mod chaos;
pub mod fleet;
pub mod llm;
pub mod scenario;

pub use chaos::{KillSwitch, StallingStore, Stalls};
pub use fleet::Fleet;
pub use llm::{Call, CallOutcome, SimulatedConfig, SimulatedLlm};

use aws_config::BehaviorVersion;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::{Credentials, Region};

/// An SQS client for a local endpoint such as moto, with a fixed region and
/// dummy credentials, whatever the environment says. For in-process tests and
/// the demo; a deployed worker uses [`crate::queue::aws_config`].
pub async fn local_sqs_client(endpoint: &str) -> Client {
    let config = aws_config::defaults(BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "sqs-worker-sim"))
        .http_client(crate::queue::http_client())
        .load()
        .await;
    Client::new(&config)
}
