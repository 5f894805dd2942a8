#![doc = include_str!("../README.md")]
//!
//! # Modules
//!
//! | module | what it holds |
//! | --- | --- |
//! | [`key`] | [`IdempotencyKey`] (also as `Option<IdempotencyKey>`), [`IdempotencyKeyRejection`], [`IDEMPOTENCY_KEY`], [`IDEMPOTENT_REPLAYED`] |
//! | [`problem`] | [`Problem`], [`ProblemTypes`], [`PROBLEM_JSON`] |
//! | [`submit`] | [`SubmitResponse`], [`TaskBody`] |
//! | [`fingerprint`](mod@fingerprint) | [`fingerprint()`], [`canonical_json`] |
//! | [`layer`] | [`IdempotencyLayer`], [`KeyScope`], [`Idempotent`] |
//! | [`trace`] | [`trace::request_span`]: the HTTP server span a task's trace starts from |

mod b64;
pub mod fingerprint;
pub mod key;
pub mod layer;
pub mod problem;
pub mod submit;
pub mod trace;

pub use fingerprint::{canonical_json, fingerprint};
pub use key::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, IdempotencyKey, IdempotencyKeyRejection};
pub use layer::{IdempotencyLayer, Idempotent, KeyScope};
pub use problem::{PROBLEM_JSON, Problem, ProblemTypes};
pub use submit::{SubmitResponse, TaskBody};
