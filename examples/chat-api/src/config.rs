//! What a [`Service`](crate::Service) runs and with which limits.

use std::collections::HashMap;
use std::time::Duration;

use taskfence::RetryPolicy;

/// Which halves of the service this process runs.
///
/// The API and the worker share nothing but PostgreSQL, so they can run in one
/// process (the default) or separately (`--no-worker` / `--worker-only`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The HTTP API and the reply worker (default).
    Both,
    /// Only the HTTP API (`--no-worker`): replies are written by worker processes.
    ApiOnly,
    /// Only the reply worker (`--worker-only`): no HTTP listener.
    WorkerOnly,
}

impl Mode {
    /// `true` when this process serves HTTP.
    pub fn runs_api(self) -> bool {
        self != Mode::WorkerOnly
    }

    /// `true` when this process runs the reply worker.
    pub fn runs_worker(self) -> bool {
        self != Mode::ApiOnly
    }
}

/// Input limits. Each broken limit is a 4xx with a problem+json body, checked
/// before anything is written.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request body, in bytes (413 beyond it).
    pub max_body_bytes: usize,
    /// Longest message content, in bytes (422 beyond it).
    pub max_content_bytes: usize,
    /// Longest conversation id, in bytes (400 beyond it).
    pub max_conversation_id_bytes: usize,
    /// Longest `?wait=` of a long-poll (400 beyond it).
    pub max_wait: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: 64 * 1024,
            max_content_bytes: 16 * 1024,
            max_conversation_id_bytes: 128,
            max_wait: Duration::from_secs(60),
        }
    }
}

/// The in-process reply worker.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// Replies generated at once.
    pub concurrency: usize,
    /// Lease per claim (renewed in the background while the provider runs).
    pub lease: Duration,
    /// How often the outbox and the due tasks are polled when nothing wakes the
    /// worker earlier (a Send in the same process wakes it at once).
    pub poll_every: Duration,
    /// How long the simulated provider takes to answer.
    pub provider_latency: Duration,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        Self {
            concurrency: 8,
            lease: Duration::from_secs(30),
            poll_every: Duration::from_millis(200),
            provider_latency: Duration::from_millis(50),
        }
    }
}

/// Everything [`Service::start`](crate::Service::start) needs besides the pool.
#[derive(Debug, Clone)]
pub struct Config {
    /// API, worker or both.
    pub mode: Mode,
    /// The schema of taskfence's tables (default `taskfence`).
    pub taskfence_schema: String,
    /// Bearer token → user id. A stand-in for real authentication: the user id
    /// is the scope of every idempotency key and task.
    pub tokens: HashMap<String, String>,
    /// The reply task's retry budget, stored with each task.
    pub policy: RetryPolicy,
    /// How long an idempotency key is remembered (the IETF draft asks servers
    /// to publish it). After it, the key is new work.
    pub key_retention: Duration,
    /// Input limits.
    pub limits: Limits,
    /// The in-process worker.
    pub worker: WorkerSettings,
}

impl Config {
    /// Defaults for everything but the tokens.
    pub fn new(tokens: HashMap<String, String>) -> Self {
        Self {
            mode: Mode::Both,
            taskfence_schema: taskfence::postgres::DEFAULT_SCHEMA.to_owned(),
            tokens,
            policy: RetryPolicy::default(),
            key_retention: Duration::from_secs(24 * 3600),
            limits: Limits::default(),
            worker: WorkerSettings::default(),
        }
    }

    /// The NOTIFY channel on which saved replies are announced. Derived from
    /// the taskfence schema, so two deployments (or two tests) sharing one
    /// database never hear each other.
    pub fn reply_channel(&self) -> String {
        format!("{}_reply_saved", self.taskfence_schema)
    }
}
