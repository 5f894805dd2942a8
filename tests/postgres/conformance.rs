//! The whole conformance suite against `PgStore` on a real PostgreSQL server,
//! each test in a fresh schema of its own (so they run in parallel).

use crate::common;

taskfence::testing::conformance_suite!(common::fixture());
