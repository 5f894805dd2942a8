//! Template: taskfence reply workers behind Apache Kafka.
//!
//! A dispatcher publishes one handoff record per task, keyed by task id
//! ([`handoff`]). Reply consumers in one group read them, run each task
//! through the taskfence worker runtime (claim, renew, call the provider,
//! save one response), and commit a partition's offset only after every
//! record before it is durably handled ([`consumer`], on
//! [`taskfence::OffsetTracker`]). Every step goes to a [`journal`], whose
//! checks prove the commit discipline after a run.
//!
//! See the README for the why: consumer positions versus per-message timers,
//! and why committing an offset does not delete the record.
#![forbid(unsafe_code)]
#![warn(missing_docs, rust_2018_idioms)]

pub mod consumer;
pub mod handoff;
pub mod journal;
pub mod positions;
pub mod provider;

pub use consumer::{ConsumerConfig, ReplyConsumer};
pub use handoff::{Dispatcher, ensure_topic};
pub use journal::{Event, Handled, Journal, MemoryJournal, TracingJournal};
pub use positions::PgPositions;
pub use provider::{Provider, SimulatedLlm};
