#![doc = include_str!("../README.md")]
//!
//! # Crate overview
//!
//! | module | what it holds |
//! | --- | --- |
//! | [`task`] | [`TaskId`], [`Task`], [`Status`], [`Response`], [`InputHash`], [`NewTask`] |
//! | [`policy`] | [`RetryPolicy`], backoff and jitter, [`Failure`] |
//! | [`store`] | the [`TaskStore`] trait, [`Claim`], [`Lease`], [`Fenced`], [`Rejection`] |
//! | [`rules`] | the decisions every backend makes, as pure functions |
//! | [`inspect`] | [`Inspect`](inspect::Inspect): list, count and trace tasks; find stranded ones |
//! | [`intercept`] | wrap a store: forward every call except the ones you change |
//! | [`memory`] | [`MemoryStore`], the embedded backend |
//! | `postgres` | `PgStore`, migrations, the handoff dispatcher (feature `postgres`) |
//! | `dynamodb` | `DynamoStore`, the table definition (feature `dynamodb`) |
//! | `runtime` | the queue-agnostic worker runtime (feature `runtime`) |
//! | `testing` | the backend conformance suite (feature `testing`) |
//! | `metrics` | `Observed`: a store wrapper recording metrics and spans per call (feature `metrics`) |
//! | [`offsets`] | [`OffsetTracker`]: the safe commit position for Kafka-style consumers |
//! | [`limits`] | input limits every backend enforces |
//! | `serialize` | `serde` for the public data types (feature `serde`) |
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod clock;
pub mod error;
pub mod inspect;
pub mod intercept;
pub mod limits;
pub mod memory;
pub mod offsets;
pub mod policy;
pub mod rules;
pub mod store;
pub mod task;
mod trace;

#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub mod serialize;

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

#[cfg(feature = "dynamodb")]
#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
pub mod dynamodb;
#[cfg(feature = "dynamodb")]
pub use dynamodb::{DynamoStore, DynamoStoreBuilder};

#[cfg(feature = "runtime")]
#[cfg_attr(docsrs, doc(cfg(feature = "runtime")))]
pub mod runtime;

#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;

pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{Error, InvalidInput};
pub use inspect::Inspect;
pub use memory::MemoryStore;
pub use offsets::OffsetTracker;
pub use policy::{
    AcceptanceRule, Failure, FailureKind, OnAmbiguous, Plan, RetryPolicy, StopReason, jitter_unit,
};
#[cfg(feature = "postgres")]
pub use postgres::PgStore;
#[cfg(feature = "runtime")]
pub use runtime::{
    AckReason, Disposition, LeaseHooks, LeaveReason, RetryReason, WorkContext, Worker, WorkerConfig,
};
pub use store::{
    Attempt, AttemptOutcome, Claim, ClaimRequest, Fenced, Lease, Rejection, Reopening, Result, Retry,
    RetryRequest, Submitted, TaskStore,
};
pub use task::{AttemptId, InputHash, NewTask, RequestKey, Response, Status, Task, TaskId, UnknownStatus};
