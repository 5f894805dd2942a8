//! `SqliteStore` on a real database file per test (SQLite is embedded: no
//! server to start): every suite and every concern, one test binary.

mod conformance;
mod dispatch;
mod effects;
mod inspection;
mod model;
