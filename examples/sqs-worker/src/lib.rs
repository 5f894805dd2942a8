//! An SQS worker service built on taskfence: a template to copy.
//!
//! The queue delivers "work on task X" at least once; taskfence decides who
//! may work on X, whether X is done, and which answer becomes *the* answer.
//! See the README for the walk-through and for which files to take.
//!
//! The template (copy these):
//! - [`config`]: the service's settings (command line and environment).
//! - [`store`]: the PostgreSQL pool and the task store.
//! - [`dynamo`]: the DynamoDB store and its transactional outbox (`--store dynamodb`).
//! - [`queue`]: the AWS configuration and the few SQS calls.
//! - [`dispatcher`]: the outbox → queue publisher.
//! - [`worker`]: the queue as taskfence's consumer source, the work function.
//! - [`provider`]: the model provider trait and the spot for a real one.
//! - [`logs`]: the log lines, one shape inside and outside the work.
//!
//! Scaffolding (leave it): [`sim`], the simulated LLM, the injected faults and
//! the scenario the demo binary and the tests run.

pub mod config;
pub mod dispatcher;
pub mod dynamo;
pub mod logs;
pub mod provider;
pub mod queue;
pub mod sim;
pub mod store;
pub mod worker;

pub use config::Settings;
pub use dispatcher::Dispatcher;
pub use provider::{HttpProvider, Provider, ProviderError, ProviderRequest};
pub use queue::{BoxError, Depth, Message, SentBatch, SqsQueue};
pub use worker::{SqsSource, SqsWorker, Stats, WorkerSettings};
