//! Template: taskfence reply workers behind Apache Kafka, on `taskfence-kafka`.
//!
//! The Kafka side is the `taskfence-kafka` crate: the outbox publisher
//! (`Dispatcher`, `Handoffs`), the reply consumer (`ReplyConsumer`: offsets
//! committed only past durably settled records, rebalances, the position
//! modes), the publisher of saved results and the journal. What is here is
//! the service around it.
//!
//! What to copy: [`config`], [`provider`], [`worker`] and
//! `src/main.rs` (the service; its log lines in `taskfence::logs`' one shape). [`sim`] and `src/bin/demo.rs` are test
//! scaffolding (dev-only: do not copy). See the README for the why:
//! consumer positions versus per-message timers, and why committing an
//! offset does not delete the record.

pub mod config;
pub mod provider;
pub mod sim;
pub mod worker;

pub use config::Settings;
pub use provider::{HttpProvider, Provider, ProviderError, ProviderRequest};
pub use worker::{work, work_with};
