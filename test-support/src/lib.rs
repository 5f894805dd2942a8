//! What taskfence's tests, templates and harnesses share, once: where the
//! PostgreSQL test server is (and fixtures on it), a wire proxy that counts
//! round trips and loses replies on purpose, temporary schemas and databases
//! that drop themselves, row counts, and waiting on a condition.
//!
//! Not published: a backend author outside this workspace uses the public
//! conformance suite (`taskfence::testing`) instead.

use std::time::Duration;

pub mod dynamo;
pub mod faults;
pub mod kafka;
pub mod private_server;
pub mod process;
mod server;
pub mod wire;

pub use private_server::PrivateServer;
pub use process::{ChildProcess, free_port, signal_pid};
pub use server::{
    TempDatabase, database_url, fixture, fixture_with, pooled_fixture, row_count, shared_pool,
    shared_runtime, wait_until_blocked,
};
pub use taskfence::testing::TempSchema;
pub use wire::{Wire, WireProxy};

/// Polls `check` every 20 ms until it returns `Some`, for at most `within`.
pub async fn eventually<T, Fut>(within: Duration, check: impl FnMut() -> Fut) -> T
where
    Fut: std::future::Future<Output = Option<T>>,
{
    eventually_every(within, Duration::from_millis(20), check).await
}

/// Polls `check` every `every` until it returns `Some`, for at most `within`:
/// [`eventually`] for checks too costly to run every 20 ms
/// (a scan of many rows, a call to another service).
pub async fn eventually_every<T, Fut>(within: Duration, every: Duration, mut check: impl FnMut() -> Fut) -> T
where
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not met within {within:?}"
        );
        tokio::time::sleep(every).await;
    }
}
