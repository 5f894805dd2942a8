//! The inspection suite (listings, counts, stories, stranded tasks) against
//! `PgStore` on a real PostgreSQL server, each test in a fresh schema.

use crate::common;

taskfence::testing::inspection_suite!(common::fixture());
