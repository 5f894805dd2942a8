//! `SqliteStore` on a real database file per test (SQLite is embedded: no
//! server to start): every suite and every concern, one test binary.

mod child;
mod conformance;
mod crash;
mod dispatch;
mod effects;
mod faults;
mod group;
mod inspection;
mod invariants;
mod limits;
mod model;
mod prelude;
mod processes;
mod transactions;
