//! The whole conformance suite against `PgStore` on a real PostgreSQL server,
//! each test in a fresh schema of its own (so they run in parallel).

mod common;

taskfence::conformance_suite!(common::fixture());
