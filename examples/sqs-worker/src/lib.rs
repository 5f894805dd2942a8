//! An SQS worker built on taskfence: a template to copy.
//!
//! The queue delivers "work on task X" at least once; taskfence decides who
//! may work on X, whether X is done, and which answer becomes *the* answer.
//! See the README for the walk-through.
//!
//! - [`dispatcher`]: the outbox → queue publisher.
//! - [`queue`]: the few SQS calls (publish, long-poll, delete, change visibility).
//! - [`worker`]: the consumer loop and the message dispositions.
//! - [`provider`]: the model provider trait, a simulated LLM, an HTTP stub.
//! - [`fleet`]: a supervisor that restarts killed workers.
//! - [`scenario`]: a whole run (submit, publish, drain, report), for the binary and the tests.

pub mod dispatcher;
pub mod fleet;
pub mod provider;
pub mod queue;
pub mod scenario;
pub mod worker;

pub use dispatcher::Dispatcher;
pub use fleet::Fleet;
pub use provider::{KillSwitch, Provider, ProviderError, ProviderRequest, SimulatedConfig, SimulatedLlm};
pub use queue::{BoxError, Delivery, Depth, SqsQueue, SqsSettings};
pub use worker::{SqsWorker, Stats, WorkerSettings};
