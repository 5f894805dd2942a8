//! Model-based property test: random interleavings of every operation across
//! several workers, against `MemoryStore`, checked after every step against
//! the reference model in `taskfence::testing::model`.

taskfence::testing::model_suite!(
    async { taskfence::testing::MemoryFixture::new() },
    cases = 3000,
    steps = 60
);
