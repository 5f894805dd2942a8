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
//! Everything here is test code except [`replay`], the trace replay, which
//! the chaos run's test uses too: outside `cargo test` the crate holds only it.

pub mod replay;

#[cfg(test)]
mod checker;
#[cfg(test)]
mod configs;
#[cfg(test)]
mod consumer;
#[cfg(test)]
mod planted;
#[cfg(test)]
mod props;
#[cfg(test)]
mod runs;
#[cfg(test)]
mod seam;
#[cfg(test)]
mod step;
#[cfg(test)]
mod traces;
#[cfg(test)]
mod world;
