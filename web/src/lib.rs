#![doc = include_str!("../README.md")]
//!
//! # Modules
//!
//! | module | what it holds |
//! | --- | --- |
//! | [`age`] | ages such as `15m` or `2d` for filters, bounded so date arithmetic cannot overflow (the command line reads them here too) |
//! | [`dashboard`] | [`Dashboard`], the builder of the [`Router`](axum::Router), and [`ConfigError`] |
//! | [`redispatch`] | [`Redispatch`]: how the redispatch action hands tasks off again |
//!
//! Everything else is private: the pages, the sign-in and CSRF values, the
//! embedded stylesheet and script.
#![forbid(unsafe_code)]

pub mod age;
mod assets;
mod auth;
pub mod dashboard;
mod error;
mod gate;
mod html;
mod pages;
pub mod redispatch;
mod request;

pub use dashboard::{ConfigError, Dashboard};
pub use redispatch::Redispatch;
