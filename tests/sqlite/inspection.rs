//! The inspection suite (listings, counts, stories, stranded tasks) against
//! `SqliteStore`, each test in a fresh file.

taskfence::testing::inspection_suite!(taskfence::testing::SqliteFixture::new());
