//! The chaos harness: real `chaos-worker` processes run taskfence tasks from a
//! PostgreSQL-backed queue against a real PostgreSQL server while the `chaos`
//! orchestrator injects real faults (`SIGKILL` mid-call, `SIGSTOP` past the
//! lease, `pg_terminate_backend`, a server restart); then a checker reads the
//! database and counts what must be zero.
//!
//! Modules: [`queue`] (the harness's own tables: the at-least-once queue and
//! the simulated provider's log), [`checker`] (the final counts), [`trace`]
//! (the workers' histories, recorded and merged for the trace replay), [`args`]
//! (flag parsing). The private PostgreSQL cluster the harness may restart is
//! `taskfence_test_support::PrivateServer`, shared with the benchmark.

pub mod args;
pub mod checker;
pub mod queue;
pub mod trace;

/// Every request key of a chaos run lives in this scope.
pub const SCOPE: &str = "chaos";
/// The operation of every chaos task.
pub const OPERATION: &str = "chaos.reply";
/// Workers set `application_name` to this prefix plus their id, so the
/// orchestrator can find (and terminate) exactly their connections.
pub const APP_PREFIX: &str = "chaos-worker-";
