//! What taskfence's tests, templates and harnesses share, once: where the
//! PostgreSQL test server is (and fixtures on it), a wire proxy that counts
//! round trips and loses replies on purpose, temporary schemas and databases
//! that drop themselves, row counts, and waiting on a condition.
//!
//! Not published: a backend author outside this workspace uses the public
//! conformance suite (`taskfence::testing`) instead.

use std::time::Duration;

pub mod kafka;
pub mod process;
mod server;
pub mod wire;

pub use process::{ChildProcess, eventually_every, free_port, signal_pid};
pub use server::{
    TempDatabase, database_url, fixture, fixture_with, row_count, shared_pool, shared_runtime,
    wait_until_blocked,
};
pub use taskfence::testing::TempSchema;
pub use wire::{Wire, WireProxy};

/// Polls `check` until it returns `Some`, for at most `within`.
pub async fn eventually<T, Fut>(within: Duration, mut check: impl FnMut() -> Fut) -> T
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
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
