#![doc = include_str!("../README.md")]
//!
//! # Modules
//!
//! | module | what it holds |
//! | --- | --- |
//! | [`queue`] | [`SqsQueue`] and its calls, [`Message`], [`SentBatch`], [`Depth`], [`MAX_BATCH`], [`MAX_VISIBILITY`] |
//! | [`source`] | [`SqsSource`] (the runtime's `Source`), [`Receipt`], [`Stats`], [`source::Calls`] |
//! | [`worker`] | [`SqsWorker`]: the consumer on the source, with a bounded stop |
//! | [`config`] | [`WorkerConfig`], [`DispatchConfig`] and their defaults, [`config::Publishing`] |
//! | `store` | `StoreConfig`, `StoreKind`: the PostgreSQL or DynamoDB store a service opens (feature `stores`) |
//! | [`dispatcher`] | [`Dispatcher`]: the outbox and republish publishers |
//! | [`error`] | [`Error`], [`Result`] |

pub mod config;
pub mod dispatcher;
pub mod error;
pub mod queue;
pub mod source;
#[cfg(feature = "stores")]
#[cfg_attr(docsrs, doc(cfg(feature = "stores")))]
pub mod store;
pub mod worker;

pub use config::{DispatchConfig, WorkerConfig};
pub use dispatcher::Dispatcher;
pub use error::{Error, Result};
pub use queue::{Depth, MAX_BATCH, MAX_VISIBILITY, Message, SentBatch, SqsQueue};
pub use source::{Receipt, SqsSource, Stats};
#[cfg(feature = "stores")]
pub use store::{StoreConfig, StoreKind};
pub use worker::SqsWorker;
