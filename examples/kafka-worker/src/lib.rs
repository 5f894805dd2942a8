//! Template: taskfence reply workers behind Apache Kafka.
//!
//! A [`Dispatcher`] publishes the transactional outbox, one handoff record per
//! task, keyed by task id ([`dispatcher`]). Reply consumers in one group read
//! them with taskfence's `Consumer` over a Kafka source (claim, renew, call
//! the [`Provider`], save one response), and commit a partition's offset only
//! after every record before it is durably handled ([`consumer`], on
//! [`taskfence::offsets::OffsetTracker`]); on shutdown they finish or release
//! what they hold within a grace period. Every step goes to a [`journal`].
//! Handoffs carry the task's id and assignment version in their headers, and
//! each saved result is published with the version that saved it
//! ([`results`]), so a downstream consumer keeps the newest per task.
//!
//! What to copy: [`config`], [`store`], [`provider`], [`dispatcher`],
//! [`consumer`], [`results`], [`positions`], [`journal`], [`logs`] and `src/main.rs` (the service).
//! [`sim`] and `src/bin/demo.rs` are test scaffolding. See the README for the
//! why: consumer positions versus per-message timers, and why committing an
//! offset does not delete the record.

pub mod config;
pub mod consumer;
pub mod dispatcher;
pub mod journal;
pub mod logs;
pub mod positions;
pub mod provider;
pub mod results;
pub mod sim;
pub mod store;

pub use config::Settings;
pub use consumer::{KafkaConfig, ReplyConsumer, SpawnError};
pub use dispatcher::{Dispatcher, Handoffs, ensure_topic};
pub use journal::{Event, Handled, Journal, TracingJournal};
pub use positions::PgPositions;
pub use provider::{HttpProvider, Provider, ProviderError, ProviderRequest};
pub use results::{Downstream, Results, Verdict};
