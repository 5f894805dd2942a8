//! Model-based property test against `SqliteStore`: the same random
//! interleavings and reference model as the `MemoryStore` one, fewer cases
//! (each gets a fresh file). Time moves through the store's own clock
//! (`SqliteFixture::advance` moves its manual clock).

taskfence::testing::model_suite!(taskfence::testing::SqliteFixture::new(), cases = 200, steps = 40);
