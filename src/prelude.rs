//! What a service or its tests use, in one import:
//! `use taskfence::prelude::*;`.
//!
//! The store contract and its answers, the task and its key, the retry
//! policy and failures, the errors; the inspection trait; and, with their
//! features, the backends and the worker runtime's main types. Only names
//! an application writes; a backend author also imports
//! [`backend`](crate::backend).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
//! use std::time::Duration;
//! use taskfence::prelude::*;
//!
//! let store = MemoryStore::new();
//! let key = RequestKey::new("user-42", "chat.reply", "send-1");
//! let new = NewTask::new(key, InputHash::of(["conversation-7", "hello"]))
//!     .policy(RetryPolicy::default().max_attempts(3));
//! let task = store.submit(new).await?.into_task();
//! let Claim::Acquired(lease) = store.claim(task.id, ClaimRequest::new("w", Duration::from_secs(30))).await? else {
//!     unreachable!("a new task is free")
//! };
//! assert!(store.complete(lease, Response::from("hi")).await?.is_accepted());
//! assert_eq!(store.get(task.id).await?.map(|t| t.status), Some(Status::Completed));
//! # Ok(()) }
//! ```

pub use crate::error::{Error, Result};
pub use crate::inspect::Inspect;
pub use crate::memory::MemoryStore;
pub use crate::policy::{AcceptanceRule, Failure, FailureKind, RetryPolicy};
pub use crate::store::{
    Claim, ClaimNext, ClaimRequest, Fenced, Lease, Rejection, Retry, Submitted, TaskStore,
};
pub use crate::task::{InputHash, NewTask, RequestKey, Response, Status, Task, TaskId};

#[cfg(feature = "dynamodb")]
pub use crate::dynamodb::DynamoStore;
#[cfg(feature = "postgres")]
pub use crate::postgres::PgStore;
#[cfg(feature = "runtime")]
pub use crate::runtime::{
    Consumer, ConsumerConfig, Disposition, StoreQueue, WorkContext, Worker, WorkerConfig,
};
#[cfg(feature = "sqlite")]
pub use crate::sqlite::{SqliteStore, SqliteStoreBuilder};
