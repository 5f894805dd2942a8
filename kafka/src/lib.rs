#![doc = include_str!("../README.md")]
//!
//! # Modules
//!
//! | module | what it holds |
//! | --- | --- |
//! | [`config`] | [`WorkerConfig`] (a worker service's settings, flags with the `clap` feature) and [`WorkerConfig::start`], [`Positions`] |
//! | [`consumer`] | [`ReplyConsumer`] (the runtime's consumer on a Kafka source), [`KafkaConfig`], [`SpawnError`] |
//! | [`positions`] | [`PgPositions`]: consumer positions in PostgreSQL, saved in the completion's transaction |
//! | [`offsets`] | [`OffsetTracker`](offsets::OffsetTracker): the safe commit position of records that finish out of order |
//! | [`dispatcher`] | [`Dispatcher`] (the outbox → topic publisher), [`Handoffs`], [`ensure_topic`], the stamp in headers |
//! | [`results`] | [`Results`] (saved results published with their version), [`Downstream`] (newest per task) |
//! | [`journal`] | [`Journal`], [`Event`], [`Handled`], [`TracingJournal`]: what a consumer did, step by step |

pub mod config;
pub mod consumer;
pub mod dispatcher;
pub mod journal;
pub mod offsets;
pub mod positions;
pub mod results;

pub use config::{Positions, WorkerConfig};
pub use consumer::{KafkaConfig, ReplyConsumer, SpawnError};
pub use dispatcher::{Dispatcher, Handoffs, ensure_topic};
pub use journal::{Event, Handled, Journal, TracingJournal};
pub use positions::PgPositions;
pub use results::{Downstream, Results, Verdict};
