#![doc = include_str!("../README.md")]
//!
//! # Modules
//!
//! | module | what it holds |
//! | --- | --- |
//! | [`key`] | [`IdempotencyKey`], [`IdempotencyKeyRejection`], [`IDEMPOTENCY_KEY`] |
//! | [`problem`] | [`Problem`], [`ProblemTypes`], [`PROBLEM_JSON`] |
//! | [`submit`] | [`SubmitResponse`], [`TaskBody`] |

pub mod key;
pub mod problem;
pub mod submit;

pub use key::{IDEMPOTENCY_KEY, IdempotencyKey, IdempotencyKeyRejection};
pub use problem::{PROBLEM_JSON, Problem, ProblemTypes};
pub use submit::{SubmitResponse, TaskBody};
