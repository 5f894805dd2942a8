#![doc = include_str!("../README.md")]
//!
//! # Crate overview
//!
//! The crate root holds what an application uses; each module holds one
//! concept with its supporting types.
//!
//! | module | what it holds |
//! | --- | --- |
//! | [`task`] | [`TaskId`], [`Task`], [`Status`], [`Response`], [`InputHash`], [`NewTask`], [`RequestKey`], `AttemptId` |
//! | [`policy`] | [`RetryPolicy`], [`Failure`] and its kind, the ambiguous-outcome and acceptance rules |
//! | [`store`] | the [`TaskStore`] contract: [`Claim`], [`ClaimNext`], [`Lease`], [`Fenced`], [`Rejection`], [`Retry`], reopening, attempts |
//! | [`error`] | [`Error`], [`Result`], `InvalidInput` |
//! | [`inspect`] | [`Inspect`](inspect::Inspect): list, count and trace tasks; find stranded ones |
//! | [`intercept`] | wrap a store: forward every call except the ones you change, observe them all |
//! | [`dispatch`] | the outbox dispatcher: [`Outbox`] publishes the handoffs written with each task, and redispatches stranded ones |
//! | [`republish`] | publish again the tasks that need a worker again, on any store |
//! | [`effect`] | the effect journal: an idempotency key per external effect, its intent and outcome fenced by the lease |
//! | [`memory`] | [`MemoryStore`], the embedded backend |
//! | [`prelude`] | what a service or its tests use, in one `use taskfence::prelude::*` |
//! | `postgres` | [`PgStore`], its transaction handle, migrations, its outbox (feature `postgres`) |
//! | `sqlite` | [`SqliteStore`], its transaction handle, migrations, its outbox: a durable store in one file (feature `sqlite`) |
//! | `dynamodb` | [`DynamoStore`], the table definition (feature `dynamodb`) |
//! | `runtime` | the worker runtime (feature `runtime`): `Consumer` on the store or a broker, `Worker` for one delivery |
//! | `metrics` | a store wrapper recording metrics and spans per call (feature `metrics`) |
//! | `logs` | one shape for a service's log lines, inside the work or not (feature `logs`) |
//! | `testing` | the backend conformance suite and the test kit (feature `testing`) |
//! | [`clock`] | the store clock of the embedded backends, and a manual one for tests |
//! | [`limits`] | input limits every backend enforces |
//! | [`config`] | a binary's settings: unknown `TASKFENCE_*` variables reported, former names read with a warning |
//! | [`wire`] | versions on the wire: the task id and assignment version a message carries, and keeping only the newest per task |
//! | [`backend`] | for implementing a store: the backend trait and the shared decision rules |
//! | `serialize` | `serde` for the public data types (feature `serde`) |
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backend;
pub mod clock;
pub mod config;
pub mod dispatch;
pub mod effect;
pub mod error;
mod id;
pub mod inspect;
pub mod intercept;
mod lease;
pub mod limits;
pub mod memory;
pub mod policy;
pub mod prelude;
pub mod republish;
mod response;
pub mod store;
pub mod task;
pub mod throttle;
pub mod trace;
mod trace_context;
pub mod wire;

#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub mod serialize;

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;

#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;

#[cfg(feature = "dynamodb")]
#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
pub mod dynamodb;

#[cfg(feature = "runtime")]
#[cfg_attr(docsrs, doc(cfg(feature = "runtime")))]
pub mod runtime;

#[cfg(feature = "logs")]
#[cfg_attr(docsrs, doc(cfg(feature = "logs")))]
pub mod logs;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;

#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

pub use dispatch::Outbox;
pub use error::{Error, Result};
pub use memory::MemoryStore;
pub use policy::{Failure, RetryPolicy};
pub use store::{Claim, ClaimNext, ClaimRequest, Fenced, Lease, Rejection, Retry, Submitted, TaskStore};
pub use task::{InputHash, NewTask, RequestKey, Response, Status, Task, TaskId};

#[cfg(feature = "dynamodb")]
pub use dynamodb::DynamoStore;
#[cfg(feature = "postgres")]
pub use postgres::PgStore;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;
