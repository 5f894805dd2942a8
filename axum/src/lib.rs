#![doc = include_str!("../README.md")]
//!
//! # Modules
//!
//! | module | what it holds |
//! | --- | --- |
//! | [`key`] | [`IdempotencyKey`] (also as `Option<IdempotencyKey>`), [`IdempotencyKeyRejection`], [`IDEMPOTENCY_KEY`], [`IDEMPOTENT_REPLAYED`] |
//! | [`problem`] | [`Problem`], [`ProblemTypes`], [`PROBLEM_JSON`] |
//! | [`submit`] | [`SubmitResponse`], [`TaskBody`], [`json_response()`], [`health()`] |
//! | [`fingerprint`](mod@fingerprint) | [`fingerprint()`], [`canonical_json`] |
//! | [`layer`] | [`IdempotencyLayer`], [`KeyScope`], [`Idempotent`] |
//! | [`trace`] | [`trace::request_span`]: the HTTP server span a task's trace starts from |
//! | `webhook` | `webhook::Webhook`: a `POST` to a receiver through the effect journal (feature `webhook`) |

mod b64;
pub mod fingerprint;
pub mod key;
pub mod layer;
pub mod problem;
#[cfg(feature = "serve")]
#[cfg_attr(docsrs, doc(cfg(feature = "serve")))]
mod serve;
pub mod submit;
#[cfg(feature = "otlp")]
#[cfg_attr(docsrs, doc(cfg(feature = "otlp")))]
pub mod telemetry;
pub mod trace;
#[cfg(feature = "webhook")]
#[cfg_attr(docsrs, doc(cfg(feature = "webhook")))]
pub mod webhook;

pub use fingerprint::{canonical_json, fingerprint};
pub use key::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, IdempotencyKey, IdempotencyKeyRejection};
pub use layer::{IdempotencyLayer, Idempotent, KeyScope};
pub use problem::{PROBLEM_JSON, Problem, ProblemTypes};
#[cfg(feature = "serve")]
pub use serve::serve;
pub use submit::{SubmitResponse, TaskBody, TaskStatus, health, json_response};
