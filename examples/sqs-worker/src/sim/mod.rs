//! Test and demo scaffolding, not part of the template: the simulated LLM,
//! the injected faults, a supervisor that restarts killed workers, and the
//! scenario driver with its report, and the simulated provider's flags
//! (`--sim-*`). Copy the other modules; leave this one.

pub mod chaos;
pub mod fleet;
pub mod llm;
pub mod scenario;
pub mod settings;

pub use chaos::{KillSwitch, StallingStore, Stalls};
pub use fleet::Fleet;
pub use llm::{Call, CallOutcome, SimulatedConfig, SimulatedLlm};
pub use settings::SimSettings;

use taskfence::inspect::Inspect;
use taskfence::{DynamoStore, TaskId};

use aws_config::BehaviorVersion;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::{Credentials, Region};

/// An SQS client for a local endpoint such as moto, with a fixed region and
/// dummy credentials, whatever the environment says. For in-process tests and
/// the demo; a deployed worker uses [`crate::aws::aws_config`].
pub async fn local_sqs_client(endpoint: &str) -> Client {
    let config = aws_config::defaults(BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "sqs-worker-sim"))
        .http_client(crate::aws::http_client())
        .load()
        .await;
    Client::new(&config)
}

/// How many handoffs of `tasks` are not published yet (one consistent
/// `Query` of each task's partition): what a test checks to see the
/// DynamoDB outbox drained.
pub async fn unpublished(store: &DynamoStore, tasks: &[TaskId]) -> Result<usize, crate::BoxError> {
    let mut pending = 0;
    for &id in tasks {
        if let Some(story) = store.story(id).await? {
            pending += story.handoffs.iter().filter(|h| h.published_at.is_none()).count();
        }
    }
    Ok(pending)
}
