//! The inspection suite (listings, counts, stories, stranded tasks) against
//! `PgStore` on a real PostgreSQL server, each test in a fresh schema.

mod common;

taskfence::inspection_suite!(common::fixture());
