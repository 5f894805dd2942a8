//! The demo's pieces, a library so that its tests drive the same code as
//! `cargo run -p demo`.
//!
//! [`plan`] draws the workload and its faults from the seed, [`queue`] is the
//! at-least-once queue, [`sim`] runs the API, the workers and the simulated
//! LLM, [`report`] checks the store's records and prints, and [`timebase`]
//! maps simulated time onto the store's clock.

pub mod plan;
pub mod queue;
pub mod report;
pub mod sim;
pub mod timebase;
