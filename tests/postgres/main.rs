//! `PgStore` on a real PostgreSQL server (`DATABASE_URL`, or the local
//! server `scripts/test` finds or starts): every suite and every concern, one
//! test binary, each test in a fresh schema of its own so they run in parallel.

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod bounded_reads;
mod complete_with;
mod conformance;
mod dispatch;
mod effects;
mod fencing;
mod inspection;
mod lease_expiry;
mod limits;
mod lost_ack;
mod migrations;
mod model;
mod notify;
mod on_transaction;
mod plans;
mod purge;
mod races;
mod round_trips;
mod stranded;
mod transactions;
mod worker_crashes;
