#![doc = include_str!("../README.md")]
//!
//! # Modules
//!
//! | module | what it holds |
//! | --- | --- |
//! | [`queue`] | [`SqsQueue`] and its calls, [`Message`], [`SentBatch`], [`Depth`], [`MAX_BATCH`], [`MAX_VISIBILITY`] |
//! | [`source`] | [`SqsSource`] (the runtime's `Source`), [`Receipt`], [`Stats`], [`source::Calls`] |
//! | [`worker`] | [`SqsWorker`]: the consumer on the source, with a bounded stop |
//! | [`config`] | [`WorkerConfig`] and its defaults |
//! | [`dispatcher`] | [`Dispatcher`]: the outbox and republish publishers |
//! | [`error`] | [`Error`], [`Result`] |

pub mod config;
pub mod dispatcher;
pub mod error;
pub mod queue;
pub mod source;
pub mod worker;

pub use config::WorkerConfig;
pub use dispatcher::Dispatcher;
pub use error::{Error, Result};
pub use queue::{Depth, MAX_BATCH, MAX_VISIBILITY, Message, SentBatch, SqsQueue};
pub use source::{Receipt, SqsSource, Stats};
pub use worker::SqsWorker;
