//! The protocol, model-checked: every interleaving of a small world, with
//! the store deciding through `taskfence::backend::rules`, the code every
//! backend runs. See docs/RELIABILITY.md ("The protocol, model-checked").
//!
//! `cargo test -p model-check` runs the bounded configurations, the
//! planted bugs and the trace replay of the conformance scenarios' histories
//! on `MemoryStore`, PostgreSQL (`DATABASE_URL`) and, every eighth scenario,
//! DynamoDB (all of them with `TASKFENCE_TRACE_DYNAMODB=1`);
//! `TASKFENCE_CHECK_DEEP=1 cargo test -p model-check deep`
//! runs the deep configuration.
//!
//! Everything here is test code: the crate builds empty outside `cargo test`.
#![cfg(test)]

mod checker;
mod configs;
mod consumer;
mod planted;
mod props;
mod replay;
mod runs;
mod seam;
mod step;
mod traces;
mod world;
