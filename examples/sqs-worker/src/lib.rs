//! An SQS worker service built on taskfence and `taskfence-sqs`: a template to copy.
//!
//! The queue delivers "work on task X" at least once; taskfence decides who
//! may work on X, whether X is done, and which answer becomes *the* answer.
//! The SQS side (the consumer's source, the outbox publisher) is the
//! `taskfence-sqs` crate; what is here is the service around it.
//! See the README for the walk-through and for which files to take.
//!
//! The template (copy these):
//! - [`config`]: the service's settings (command line and environment);
//!   the store's, the worker's and the dispatcher's are `taskfence_sqs`'s.
//! - [`aws`]: the AWS configuration the clients are built from.
//! - [`worker`]: the work function.
//! - [`provider`]: the model provider trait and the spot for a real one.
//!
//! Scaffolding (leave it): [`sim`], the simulated LLM and its `--sim-*`
//! flags, the injected faults and the scenario the demo binary and the tests run.

pub mod aws;
pub mod config;
pub mod provider;
pub mod sim;
pub mod worker;

pub use provider::{HttpProvider, Provider, ProviderError, ProviderRequest};
pub use taskfence_sqs::{Dispatcher, SqsQueue, SqsWorker, Stats, WorkerConfig};
pub use {config::Settings, worker::work};

/// A boxed error: the service reports every error with its full context.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
